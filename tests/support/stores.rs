//! One operation at a time on a store, in the words the tests speak: try a cost now (or, on
//! Redis, at an explicit time), read the windows, settle, penalize.

#![allow(dead_code)]

use std::time::Duration;

use tollgate::store::{Op, Outcome};
use tollgate::{Available, Cost, Error, Limits, MemoryStore, Store};

/// The answer to a request that may not wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Every window paid.
    Admitted,
    /// Nothing was charged; every window could pay after this long.
    NotYet(Duration),
}

impl Decision {
    pub fn is_admitted(&self) -> bool {
        matches!(self, Decision::Admitted)
    }
}

pub const fn try_op(cost: Cost) -> Op {
    Op::Acquire {
        cost,
        max_wait: Some(Duration::ZERO),
    }
}

pub fn decision(outcome: Outcome) -> Decision {
    match outcome {
        Outcome::Admitted => Decision::Admitted,
        Outcome::NotYet(wait) => Decision::NotYet(wait),
        other => panic!("not an answer to a try: {other:?}"),
    }
}

fn now(store: &MemoryStore, key: &str, limits: &Limits, op: Op) -> Result<Outcome, Error> {
    let key = store.bind(key, limits)?;
    store
        .apply_now(&key, op)
        .expect("the memory store answers at once")
}

/// Tries `cost` on `key` of the memory store, at its clock's time.
pub fn try_now(
    store: &MemoryStore,
    key: &str,
    limits: &Limits,
    cost: Cost,
) -> Result<Decision, Error> {
    now(store, key, limits, try_op(cost)).map(decision)
}

pub fn snapshot_now(
    store: &MemoryStore,
    key: &str,
    limits: &Limits,
) -> Result<Vec<Available>, Error> {
    match now(store, key, limits, Op::Snapshot)? {
        Outcome::Snapshot(levels) => Ok(levels),
        other => panic!("not a snapshot: {other:?}"),
    }
}

pub fn adjust_now(
    store: &MemoryStore,
    key: &str,
    limits: &Limits,
    tokens: i64,
) -> Result<(), Error> {
    let op = Op::Adjust {
        requests: 0,
        tokens,
        output_tokens: 0,
    };
    now(store, key, limits, op).map(|_| ())
}

pub fn penalize_now(
    store: &MemoryStore,
    key: &str,
    limits: &Limits,
    pause: Duration,
) -> Result<(), Error> {
    now(store, key, limits, Op::Penalize { pause }).map(|_| ())
}

#[cfg(feature = "redis")]
pub mod redis {
    use super::*;
    use tollgate::store::redis::RedisStore;
    use tollgate::testing;

    pub async fn at(
        store: &RedisStore,
        key: &str,
        limits: &Limits,
        op: Op,
        now_ms: Option<u64>,
    ) -> Result<(Outcome, u64), Error> {
        let key = store.bind(key, limits)?;
        testing::redis_apply_at(store, &key, op, now_ms).await
    }

    /// Tries `cost` at `now_ms` (`None`: the server's time), answering the time used too.
    pub async fn try_at(
        store: &RedisStore,
        key: &str,
        limits: &Limits,
        cost: Cost,
        now_ms: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        let (outcome, at) = at(store, key, limits, try_op(cost), now_ms).await?;
        Ok((decision(outcome), at))
    }

    pub async fn snapshot_at(
        store: &RedisStore,
        key: &str,
        limits: &Limits,
        now_ms: Option<u64>,
    ) -> Result<Vec<Available>, Error> {
        match at(store, key, limits, Op::Snapshot, now_ms).await?.0 {
            Outcome::Snapshot(levels) => Ok(levels),
            other => panic!("not a snapshot: {other:?}"),
        }
    }

    pub async fn adjust_at(
        store: &RedisStore,
        key: &str,
        limits: &Limits,
        tokens: i64,
        now_ms: Option<u64>,
    ) -> Result<(), Error> {
        let op = Op::Adjust {
            requests: 0,
            tokens,
            output_tokens: 0,
        };
        at(store, key, limits, op, now_ms).await.map(|_| ())
    }

    pub async fn penalize_at(
        store: &RedisStore,
        key: &str,
        limits: &Limits,
        pause: Duration,
        now_ms: Option<u64>,
    ) -> Result<(), Error> {
        at(store, key, limits, Op::Penalize { pause }, now_ms)
            .await
            .map(|_| ())
    }
}
