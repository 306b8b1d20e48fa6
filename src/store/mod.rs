//! Where the windows of every key live, updated all-or-nothing.
//!
//! [`Store`] is the one trait, with one state transition: [`Store::apply`] takes an [`Op`] on a
//! key and answers an [`Outcome`]. [`MemoryStore`] is the default, in-process backend;
//! [`redis::RedisStore`] (feature `redis`) shares keys between processes. [`AnyStore`] is the
//! store the process-wide registry holds: the memory store without any boxing, or any other store
//! behind a trait object.
//!
//! # Writing a store
//!
//! A store of your own writes two methods. [`Store::bind`] checks limits it can keep (and, if
//! it can tell without I/O, that the key isn't held under other limits). [`Store::apply`] runs
//! every [`Op`] on a key's state all or nothing, as the rule book does: admission (`Acquire`,
//! `Admit`, `Cancel`, `Adjust`, `Snapshot`, `Ping`) for any limiter, and the provider ledger
//! (`Penalize`, `Lower`, `Sync`, `Settle`) that `tollgate::http` and
//! [`Limiter::penalize`](crate::Limiter::penalize) send. The rule book is exact integer
//! arithmetic over nanoseconds: `testing::RuleBook` (feature `testing`) is it, one key at
//! explicit times, so a store that wraps another (counting, logging, routing keys between
//! stores) delegates, and a new backend checks its answers against the rule book's on the same
//! operations, as the Redis store's Lua script is checked by `tests/redis/differential.rs`.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use crate::bucket::{Refusal, SyncArgs, Synced};
use crate::error::Error;
use crate::rate::Limits;

pub(crate) mod memory;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

pub use crate::bucket::op::{Op, Outcome, Share, Ticket};
pub use memory::{MemoryKey, MemoryStore};

/// A place where the windows of keys live.
///
/// A limiter first [`bind`](Store::bind)s its key, once, then sends every operation on it
/// through [`apply`](Store::apply). Implementations must be all-or-nothing (a refused call
/// charges no window), serve tickets in the order they were issued, and refuse a key that holds
/// state under different limits with [`Error::ConflictingLimits`].
pub trait Store: Send + Sync + 'static {
    /// What a limiter keeps of its key: enough to find its state fast.
    type Key: Send + Sync + 'static;

    /// Prepares `key` with `limits`: refuses limits this store can't keep exactly
    /// ([`Error::UnsupportedLimits`]) and, where it can tell without I/O, a key held with
    /// other limits ([`Error::ConflictingLimits`]).
    fn bind(&self, key: &str, limits: &Limits) -> Result<Self::Key, Error>;

    /// Applies `op` to the key, all or nothing.
    fn apply(&self, key: &Self::Key, op: Op)
    -> impl Future<Output = Result<Outcome, Error>> + Send;

    /// The same as [`apply`](Store::apply), answered at once by a store that never waits (the
    /// memory store), or `None`. A limiter then needs no task of its own to finish an operation
    /// whose caller went away.
    fn apply_now(&self, key: &Self::Key, op: Op) -> Option<Result<Outcome, Error>> {
        let _ = (key, op);
        None
    }

    /// How often a limiter whose calls wait on this store looks at whether it still answers:
    /// after two of these without an answer it asks, so that every waiter learns of a failure
    /// soon (remote stores). `None` when the store can't fail.
    fn health_interval(&self) -> Option<Duration> {
        None
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
type AnyKeyBox = Box<dyn Any + Send + Sync>;

/// [`Store`] as a trait object: what [`AnyStore::custom`] holds.
trait DynStore: Send + Sync + 'static {
    fn bind_dyn(&self, key: &str, limits: &Limits) -> Result<AnyKeyBox, Error>;
    fn apply_dyn<'a>(&'a self, key: &'a AnyKeyBox, op: Op)
    -> BoxFuture<'a, Result<Outcome, Error>>;
    fn health_interval_dyn(&self) -> Option<Duration>;
}

impl<S: Store> DynStore for S {
    fn bind_dyn(&self, key: &str, limits: &Limits) -> Result<AnyKeyBox, Error> {
        Ok(Box::new(self.bind(key, limits)?))
    }

    fn apply_dyn<'a>(
        &'a self,
        key: &'a AnyKeyBox,
        op: Op,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        match key.downcast_ref::<S::Key>() {
            Some(key) => Box::pin(self.apply(key, op)),
            // Keys are made by `bind_dyn` of the same store, so this can't happen; if it ever
            // did, it is an error rather than a panic.
            None => Box::pin(std::future::ready(Err(Error::store(
                "a key bound by another store was used",
                None,
            )))),
        }
    }

    fn health_interval_dyn(&self) -> Option<Duration> {
        self.health_interval()
    }
}

/// A store chosen at run time: what the process-wide registry holds.
///
/// The memory store is called directly (no allocation per call); any other store goes through a
/// trait object, one boxed future per call.
#[derive(Clone)]
pub struct AnyStore(Backend);

#[derive(Clone)]
enum Backend {
    Memory(MemoryStore),
    Custom(Arc<dyn DynStore>),
}

/// The key of an [`AnyStore`].
#[derive(Debug)]
pub struct AnyKey(KeyBackend);

enum KeyBackend {
    Memory(MemoryKey),
    Custom(AnyKeyBox),
}

impl std::fmt::Debug for KeyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyBackend::Memory(key) => key.fmt(f),
            KeyBackend::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl AnyStore {
    /// Wraps any store.
    pub fn custom(store: impl Store) -> AnyStore {
        AnyStore(Backend::Custom(Arc::new(store)))
    }

    /// The memory store inside, if this is one.
    pub fn as_memory(&self) -> Option<&MemoryStore> {
        match &self.0 {
            Backend::Memory(store) => Some(store),
            Backend::Custom(_) => None,
        }
    }
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Backend::Memory(store) => f.debug_tuple("AnyStore").field(store).finish(),
            Backend::Custom(_) => f.write_str("AnyStore(Custom(..))"),
        }
    }
}

impl Default for AnyStore {
    fn default() -> AnyStore {
        AnyStore::from(MemoryStore::new())
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> AnyStore {
        AnyStore(Backend::Memory(store))
    }
}

impl Store for AnyStore {
    type Key = AnyKey;

    fn bind(&self, key: &str, limits: &Limits) -> Result<AnyKey, Error> {
        Ok(AnyKey(match &self.0 {
            Backend::Memory(store) => KeyBackend::Memory(store.bind(key, limits)?),
            Backend::Custom(store) => KeyBackend::Custom(store.bind_dyn(key, limits)?),
        }))
    }

    async fn apply(&self, key: &AnyKey, op: Op) -> Result<Outcome, Error> {
        match (&self.0, &key.0) {
            (Backend::Memory(store), KeyBackend::Memory(key)) => store.run(key, op),
            (Backend::Custom(store), KeyBackend::Custom(key)) => store.apply_dyn(key, op).await,
            _ => Err(Error::store("a key bound by another store was used", None)),
        }
    }

    fn apply_now(&self, key: &AnyKey, op: Op) -> Option<Result<Outcome, Error>> {
        match (&self.0, &key.0) {
            (Backend::Memory(store), KeyBackend::Memory(key)) => Some(store.run(key, op)),
            _ => None,
        }
    }

    fn health_interval(&self) -> Option<Duration> {
        match &self.0 {
            Backend::Memory(_) => None,
            Backend::Custom(store) => store.health_interval_dyn(),
        }
    }
}
