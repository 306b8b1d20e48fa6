//! One operation at a time on a Redis store at an explicit time (or the server's), in the
//! words the tests speak.

use std::time::Duration;

use tollgate::store::Op;
use tollgate::store::Outcome;
use tollgate::store::redis::RedisStore;
use tollgate::testing;
use tollgate::{Available, Cost, Error, Limits, Store};
use tollgate_testkit::stores::{Decision, decision, try_op};

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
        delta: tollgate::PerCurrency::from([0, tokens, 0, 0]),
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
    at(
        store,
        key,
        limits,
        Op::Penalize {
            pause,
            spent: tollgate::Currencies::ALL,
            refusal: None,
        },
        now_ms,
    )
    .await
    .map(|_| ())
}
