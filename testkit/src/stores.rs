//! One operation at a time on a store, in the words the tests speak: try a cost now (or, on
//! Redis, at an explicit time), read the windows, settle, penalize.

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
        fly: false,
        share: None,
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
        delta: tollgate::PerCurrency::from([0, tokens, 0, 0]),
    };
    now(store, key, limits, op).map(|_| ())
}

pub fn penalize_now(
    store: &MemoryStore,
    key: &str,
    limits: &Limits,
    pause: Duration,
) -> Result<(), Error> {
    now(
        store,
        key,
        limits,
        Op::Penalize {
            pause,
            spent: tollgate::Currencies::ALL,
            refusal: None,
        },
    )
    .map(|_| ())
}
