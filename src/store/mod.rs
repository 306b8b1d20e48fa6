//! Where the buckets of every key live, updated all-or-nothing.
//!
//! [`Store`] is the one trait; [`MemoryStore`] is the default, in-process backend. The limiter is
//! generic over the store, and [`AnyStore`] is the store the process-wide registry holds: the
//! memory store without any boxing, or any other store behind a trait object.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::bucket::{Available, Cost, Decision};
use crate::error::Error;
use crate::rate::Limits;

mod memory;
#[cfg(feature = "redis")]
pub mod redis;

pub use memory::MemoryStore;

/// A place where buckets live.
///
/// Every method acts on all the windows of one key at once. Implementations must be
/// all-or-nothing (a refused call charges no window) and must reject a key that already holds
/// state under different limits with [`Error::ConflictingLimits`].
pub trait Store: Send + Sync + 'static {
    /// Charges `cost` to every window of `key` if every window can pay now, or charges nothing
    /// and answers [`Decision::NotYet`] with the exact time until they could.
    fn try_acquire(
        &self,
        key: &str,
        limits: &Limits,
        cost: Cost,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Adds `delta` tokens to every token window of `key`: a refund when positive (never above
    /// capacity), a charge when negative (which may leave the windows in debt).
    fn adjust(
        &self,
        key: &str,
        limits: &Limits,
        delta: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Empties every window of `key`.
    fn drain(&self, key: &str, limits: &Limits) -> impl Future<Output = Result<(), Error>> + Send;

    /// Empties every window of `key` and admits nothing on it for `pause` (the provider said
    /// 429 with a Retry-After); a longer pause already in force wins.
    fn penalize(
        &self,
        key: &str,
        limits: &Limits,
        pause: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// What every window of `key` holds now.
    fn snapshot(
        &self,
        key: &str,
        limits: &Limits,
    ) -> impl Future<Output = Result<Vec<Available>, Error>> + Send;
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Store`] in a form that can be a trait object (each call boxes its future). Implemented for
/// every [`Store`]; wrap one in [`AnyStore::custom`] to use it where the store is chosen at run
/// time.
pub trait DynStore: Send + Sync + 'static {
    /// See [`Store::try_acquire`].
    fn try_acquire_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
        cost: Cost,
    ) -> BoxFuture<'a, Result<Decision, Error>>;
    /// See [`Store::adjust`].
    fn adjust_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
        delta: i64,
    ) -> BoxFuture<'a, Result<(), Error>>;
    /// See [`Store::drain`].
    fn drain_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
    ) -> BoxFuture<'a, Result<(), Error>>;
    /// See [`Store::penalize`].
    fn penalize_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
        pause: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;
    /// See [`Store::snapshot`].
    fn snapshot_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
    ) -> BoxFuture<'a, Result<Vec<Available>, Error>>;
}

impl<S: Store> DynStore for S {
    fn try_acquire_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
        cost: Cost,
    ) -> BoxFuture<'a, Result<Decision, Error>> {
        Box::pin(self.try_acquire(key, limits, cost))
    }
    fn adjust_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
        delta: i64,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.adjust(key, limits, delta))
    }
    fn drain_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.drain(key, limits))
    }
    fn penalize_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
        pause: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.penalize(key, limits, pause))
    }
    fn snapshot_dyn<'a>(
        &'a self,
        key: &'a str,
        limits: &'a Limits,
    ) -> BoxFuture<'a, Result<Vec<Available>, Error>> {
        Box::pin(self.snapshot(key, limits))
    }
}

/// A store chosen at run time: what the process-wide registry holds.
///
/// The memory store is called directly (no allocation per call); any other store goes through
/// [`DynStore`].
#[derive(Clone)]
pub enum AnyStore {
    /// The in-process store.
    Memory(MemoryStore),
    /// Any other store.
    Custom(Arc<dyn DynStore>),
}

impl AnyStore {
    /// Wraps any store.
    pub fn custom(store: impl Store) -> AnyStore {
        AnyStore::Custom(Arc::new(store))
    }
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyStore::Memory(store) => f.debug_tuple("Memory").field(store).finish(),
            AnyStore::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl Default for AnyStore {
    fn default() -> AnyStore {
        AnyStore::Memory(MemoryStore::new())
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> AnyStore {
        AnyStore::Memory(store)
    }
}

impl Store for AnyStore {
    async fn try_acquire(&self, key: &str, limits: &Limits, cost: Cost) -> Result<Decision, Error> {
        match self {
            AnyStore::Memory(store) => store.try_acquire_now(key, limits, cost),
            AnyStore::Custom(store) => store.try_acquire_dyn(key, limits, cost).await,
        }
    }

    async fn adjust(&self, key: &str, limits: &Limits, delta: i64) -> Result<(), Error> {
        match self {
            AnyStore::Memory(store) => store.adjust_now(key, limits, delta),
            AnyStore::Custom(store) => store.adjust_dyn(key, limits, delta).await,
        }
    }

    async fn drain(&self, key: &str, limits: &Limits) -> Result<(), Error> {
        match self {
            AnyStore::Memory(store) => store.drain_now(key, limits),
            AnyStore::Custom(store) => store.drain_dyn(key, limits).await,
        }
    }

    async fn penalize(&self, key: &str, limits: &Limits, pause: Duration) -> Result<(), Error> {
        match self {
            AnyStore::Memory(store) => store.penalize_now(key, limits, pause),
            AnyStore::Custom(store) => store.penalize_dyn(key, limits, pause).await,
        }
    }

    async fn snapshot(&self, key: &str, limits: &Limits) -> Result<Vec<Available>, Error> {
        match self {
            AnyStore::Memory(store) => store.snapshot_now(key, limits),
            AnyStore::Custom(store) => store.snapshot_dyn(key, limits).await,
        }
    }
}
