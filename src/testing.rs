//! Entry points for tests, of tollgate and of programs that use it: what a test needs and a
//! program should not (feature `testing`, which brings `redis`).
//!
//! - [`redis_apply_at`] runs the Redis script at an explicit time (so that its decisions can
//!   be compared with the memory store's on the same trace) and answers the server time an
//!   operation used (so that a test can check the window bound on the server's clock).
//! - [`Recording`] is a Redis store that keeps the server time of every admission.
//! - [`redis_names`] gives the names a key has in Redis.
//!
//! A [`MemoryStore`](crate::MemoryStore) on a [`ManualClock`](crate::ManualClock) needs none
//! of this: it moves only when told to, and [`Store::apply_now`](crate::Store::apply_now) runs
//! one operation on it at once, without a runtime.
//!
//! Nothing here is needed to use tollgate; it may change more freely than the rest.

use std::sync::{Arc, Mutex, PoisonError};

use crate::error::Error;
use crate::rate::Limits;
use crate::store::redis::{RedisKey, RedisStore};
use crate::store::{Op, Outcome, Store};

/// Runs `op` on `key` at `now_ms` milliseconds (`None`: the server's `TIME`), answering the
/// outcome and the time in milliseconds the script used.
pub async fn redis_apply_at(
    store: &RedisStore,
    key: &RedisKey,
    op: Op,
    now_ms: Option<u64>,
) -> Result<(Outcome, u64), Error> {
    store.apply_at(key, op, now_ms).await
}

/// The Lua script the Redis store runs, as sent to the server (its constants filled in).
pub fn redis_script() -> &'static str {
    crate::store::redis::script_text()
}

/// The names of `key`'s hash and of its queue in Redis.
pub fn redis_names(store: &RedisStore, key: &str) -> (String, String) {
    store.names(key)
}

/// A Redis store that records the server time (in milliseconds) of every admission, so that
/// a test or an example can check the window bound on Redis's own clock.
#[derive(Debug, Clone)]
pub struct Recording {
    store: RedisStore,
    admitted_at: Arc<Mutex<Vec<u64>>>,
}

impl Recording {
    /// Records the admissions made through `store`.
    pub fn new(store: RedisStore) -> Recording {
        Recording {
            store,
            admitted_at: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Where the server times are recorded, to read after the store has moved into a limiter.
    pub fn log(&self) -> Arc<Mutex<Vec<u64>>> {
        Arc::clone(&self.admitted_at)
    }

    /// The server times (ms) of the admissions so far.
    pub fn admitted_at(&self) -> Vec<u64> {
        self.admitted_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Store for Recording {
    type Key = RedisKey;

    fn bind(&self, key: &str, limits: &Limits) -> Result<RedisKey, Error> {
        self.store.bind(key, limits)
    }

    async fn apply(&self, key: &RedisKey, op: Op) -> Result<Outcome, Error> {
        let (outcome, now_ms) = self.store.apply_at(key, op, None).await?;
        if outcome == Outcome::Admitted {
            self.admitted_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(now_ms);
        }
        Ok(outcome)
    }

    fn health_interval(&self) -> Option<std::time::Duration> {
        self.store.health_interval()
    }
}
