//! The process-wide map from key to limiter.

use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock, PoisonError, RwLock};

use tokio::time::Instant;

use crate::error::Error;
use crate::limiter::{Limiter, WaitPolicy};
use crate::rate::Limits;
use crate::store::{AnyStore, MemoryStore};

/// Swept for idle keys once the map has doubled since the last sweep, never below this size.
const MIN_SWEEP: usize = 1024;

/// Maps each key to one [`Limiter`], so that every task and every `#[tollgate::limit]`
/// function that names a key shares its buckets and its queue of waiters.
///
/// Asking for a key that is live with different limits is [`Error::ConflictingLimits`]. Keys
/// that nobody holds and that have been quiet long enough for their buckets to be full again
/// are dropped, so a registry fed an unbounded stream of distinct keys (one per tenant, per
/// host) stays bounded in memory.
///
/// ```
/// use tollgate::{Cost, Limits, Registry, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// let registry = Registry::new(MemoryStore::new());
/// let limits = Limits::parse("60/m", "")?;
/// let a = registry.limiter("search", &limits)?;
/// let b = registry.limiter("search", &limits)?;
/// a.acquire(Cost::call(0)).await?;
/// // `b` is the same limiter: the call above was charged to it too.
/// assert_eq!(b.snapshot().await?[0].tokens.whole(), 59);
///
/// let err = registry.limiter("search", &Limits::parse("100/m", "")?).unwrap_err();
/// assert!(matches!(err, tollgate::Error::ConflictingLimits { .. }));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Registry {
    store: AnyStore,
    policy: WaitPolicy,
    state: RwLock<State>,
}

#[derive(Debug, Default)]
struct State {
    limiters: HashMap<String, Entry>,
    sweep_at: usize,
}

#[derive(Debug)]
struct Entry {
    limiter: Limiter,
    /// The limiter's call count at the last sweep, and when that sweep saw it change.
    seen_uses: u64,
    seen_at: Instant,
}

static GLOBAL_STORE: OnceLock<AnyStore> = OnceLock::new();
static GLOBAL: LazyLock<Registry> = LazyLock::new(|| {
    Registry::new(
        GLOBAL_STORE
            .get_or_init(|| AnyStore::Memory(MemoryStore::new()))
            .clone(),
    )
});

/// Chooses the store of the process-wide registry, once, before its first use.
///
/// The registry uses an in-memory store unless this is called first; call it at startup,
/// before any `#[tollgate::limit]` function runs. Calling it twice, or after the registry is in
/// use, is an error and changes nothing.
///
/// ```
/// use tollgate::{install_store, MemoryStore};
///
/// install_store(MemoryStore::new())?;
/// assert!(install_store(MemoryStore::new()).is_err());
/// # Ok::<(), tollgate::Error>(())
/// ```
pub fn install_store(store: impl Into<AnyStore>) -> Result<(), Error> {
    let mut store = Some(store.into());
    GLOBAL_STORE.get_or_init(|| store.take().expect("initialised once"));
    match store {
        None => Ok(()),
        Some(_) => Err(Error::Store {
            message: "the process-wide store is already chosen (install_store must be called once, before the first limited call)".to_owned(),
            source: None,
        }),
    }
}

impl Registry {
    /// A registry of its own on `store` (most programs use [`Registry::global`]).
    pub fn new(store: impl Into<AnyStore>) -> Registry {
        Registry::with_policy(store, WaitPolicy::default())
    }

    /// A registry whose new limiters wait by `policy`.
    pub fn with_policy(store: impl Into<AnyStore>, policy: WaitPolicy) -> Registry {
        Registry {
            store: store.into(),
            policy,
            state: RwLock::new(State {
                limiters: HashMap::new(),
                sweep_at: MIN_SWEEP,
            }),
        }
    }

    /// The process-wide registry, on the store chosen by [`install_store`] (in memory by
    /// default).
    pub fn global() -> &'static Registry {
        &GLOBAL
    }

    /// The store this registry's limiters use.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// The limiter of `key`, made with `limits` if the key is new.
    ///
    /// Fails with [`Error::ConflictingLimits`] when the key is live with other limits, and
    /// with [`Error::NoLimits`] when `limits` is empty.
    pub fn limiter(&self, key: &str, limits: &Limits) -> Result<Limiter, Error> {
        {
            let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = state.limiters.get(key) {
                return same_limits(&entry.limiter, limits).map(|()| entry.limiter.clone());
            }
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = state.limiters.get(key) {
            return same_limits(&entry.limiter, limits).map(|()| entry.limiter.clone());
        }
        let limiter = Limiter::with_policy(key, limits.clone(), self.store.clone(), self.policy)?;
        let now = Instant::now();
        state.sweep(now);
        state.limiters.insert(
            key.to_owned(),
            Entry {
                limiter: limiter.clone(),
                seen_uses: 0,
                seen_at: now,
            },
        );
        Ok(limiter)
    }

    /// Penalizes `key` (see [`Limiter::penalize`]) if it is live here; answers whether it was.
    pub async fn penalize(
        &self,
        key: &str,
        retry_after: std::time::Duration,
    ) -> Result<bool, Error> {
        let limiter = self
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .limiters
            .get(key)
            .map(|entry| entry.limiter.clone());
        match limiter {
            Some(limiter) => limiter.penalize(retry_after).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// How many keys the registry holds.
    pub fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .limiters
            .len()
    }

    /// True when the registry holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key that nobody holds and that has been quiet for as long as its buckets
    /// take to fill (done on its own as the registry grows).
    pub fn sweep(&self) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.sweep_at = 0;
        state.sweep(Instant::now());
    }
}

impl State {
    fn sweep(&mut self, now: Instant) {
        if self.limiters.len() < self.sweep_at {
            return;
        }
        self.limiters.retain(|_, entry| {
            let uses = entry.limiter.uses();
            if uses != entry.seen_uses {
                entry.seen_uses = uses;
                entry.seen_at = now;
                return true;
            }
            let quiet = now.saturating_duration_since(entry.seen_at);
            entry.limiter.is_shared()
                || entry.limiter.waiters() > 0
                || quiet < entry.limiter.limits().time_to_fill()
        });
        self.sweep_at = (self.limiters.len() * 2).max(MIN_SWEEP);
    }
}

fn same_limits(limiter: &Limiter, limits: &Limits) -> Result<(), Error> {
    if limiter.limits() == limits {
        Ok(())
    } else {
        Err(Error::ConflictingLimits {
            key: limiter.key().to_owned(),
            existing: limiter.limits().clone(),
            requested: limits.clone(),
        })
    }
}
