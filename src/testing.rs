//! Entry points for tests, of tollgate and of programs that use it: what a test needs and a
//! program should not.
//!
//! - A [`MemoryStore`](crate::MemoryStore) on a [`ManualClock`](crate::ManualClock) moves only
//!   when told to; [`Store::apply_now`](crate::Store::apply_now) runs one operation on it at
//!   once, without a runtime.
//! - With the `redis` feature, [`redis_apply_at`] runs the Redis script at an explicit time (so
//!   that its decisions can be compared with the memory store's on the same trace) and answers
//!   the server time an operation used (so that a test can check the window bound on the
//!   server's clock), and [`redis_names`] gives the names a key has in Redis.
//!
//! Nothing here is needed to use tollgate; it may change more freely than the rest.

#[cfg(feature = "redis")]
use crate::error::Error;
#[cfg(feature = "redis")]
use crate::store::redis::{RedisKey, RedisStore};
#[cfg(feature = "redis")]
use crate::store::{Op, Outcome};

/// Runs `op` on `key` at `now_ms` milliseconds (`None`: the server's `TIME`), answering the
/// outcome and the time in milliseconds the script used.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub async fn redis_apply_at(
    store: &RedisStore,
    key: &RedisKey,
    op: Op,
    now_ms: Option<u64>,
) -> Result<(Outcome, u64), Error> {
    store.apply_at(key, op, now_ms).await
}

/// The names of `key`'s hash and of its queue in Redis.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub fn redis_names(store: &RedisStore, key: &str) -> (String, String) {
    store.names(key)
}
