//! The process-wide map from key to limiter.

use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock, PoisonError, RwLock};

use crate::error::Error;
use crate::limiter::{Limiter, WaitPolicy, WeakLimiter};
use crate::rate::Limits;
use crate::store::{AnyStore, MemoryStore};

/// Swept for keys nobody holds once the map has doubled since the last sweep, never below this
/// size.
const MIN_SWEEP: usize = 1024;

/// Maps each key to one [`Limiter`], so that every task and every `#[tollgate::limit]`
/// function that names a key shares its windows and its waiters.
///
/// The registry remembers a limiter only while something holds it (a task, a permit, a waiting
/// call, a cached literal key); the windows themselves live in the store, which keeps a key's
/// state only while it says something (a window below capacity, a pause, calls waiting). So a
/// registry fed an unbounded stream of distinct keys (one per tenant, per host) stays bounded in
/// memory. Asking for a key that is live with different limits is
/// [`Error::ConflictingLimits`].
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
/// assert_eq!(b.snapshot().await?.windows()[0].tokens.whole(), 59);
///
/// let err = registry.limiter("search", &Limits::parse("100/m", "")?).unwrap_err();
/// assert!(matches!(err, tollgate::Error::ConflictingLimits { .. }));
/// # Ok(())
/// # }
/// ```
pub struct Registry {
    store: AnyStore,
    policy: WaitPolicy,
    state: RwLock<State>,
    label: Option<Box<LabelFn>>,
}

/// How a key's metrics are labelled (see [`Registry::label_keys`]).
type LabelFn = dyn Fn(&str) -> String + Send + Sync;

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("store", &self.store)
            .field("policy", &self.policy)
            .field("labelled", &self.label.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    limiters: HashMap<Box<str>, WeakLimiter>,
    sweep_at: usize,
}

static GLOBAL_STORE: OnceLock<AnyStore> = OnceLock::new();
// The process-wide store follows tokio's clock: tests that pause it and tests that don't share
// it, in whatever order they first touch it.
static GLOBAL: LazyLock<Registry> = LazyLock::new(|| {
    Registry::new(
        GLOBAL_STORE
            .get_or_init(|| AnyStore::from(MemoryStore::on_tokio_clock()))
            .clone(),
    )
});

/// Chooses the store of the process-wide registry, once, before its first use.
///
/// The registry uses an in-memory store unless this is called first; call it at startup,
/// before any `#[tollgate::limit]` function runs. Calling it twice, or after the registry is in
/// use, is [`Error::StoreAlreadyInstalled`] and changes nothing.
///
/// ```
/// use tollgate::{install_store, MemoryStore};
///
/// install_store(MemoryStore::new())?;
/// assert!(matches!(
///     install_store(MemoryStore::new()),
///     Err(tollgate::Error::StoreAlreadyInstalled)
/// ));
/// # Ok::<(), tollgate::Error>(())
/// ```
pub fn install_store(store: impl Into<AnyStore>) -> Result<(), Error> {
    let mut store = Some(store.into());
    GLOBAL_STORE.get_or_init(|| store.take().expect("initialised once"));
    match store {
        None => Ok(()),
        Some(_) => Err(Error::StoreAlreadyInstalled),
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
            label: None,
        }
    }

    /// Labels the metrics of each new limiter with `label(key)` instead of its key, so that
    /// keys callers invent (one per tenant, per API key) share a few series:
    ///
    /// ```
    /// use tollgate::{MemoryStore, Registry};
    ///
    /// let registry = Registry::new(MemoryStore::new()).label_keys(|key| {
    ///     if key.contains(":tenant:") { "tenants".to_owned() } else { key.to_owned() }
    /// });
    /// # let _ = registry;
    /// ```
    pub fn label_keys(
        mut self,
        label: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Registry {
        self.label = Some(Box::new(label));
        self
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

    /// The limiter of `key`, made with `limits` if no live limiter has the key.
    ///
    /// Fails with [`Error::ConflictingLimits`] when the key is live with other limits, with
    /// [`Error::NoLimits`] when `limits` is empty, and with the store's refusal of the limits.
    pub fn limiter(&self, key: &str, limits: &Limits) -> Result<Limiter, Error> {
        if let Some(live) = self.live(key) {
            return same_limits(live, limits);
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(live) = state.limiters.get(key).and_then(WeakLimiter::upgrade) {
            return same_limits(live, limits);
        }
        let mut builder = Limiter::builder(key, limits.clone())
            .store(self.store.clone())
            .policy(self.policy);
        if let Some(label) = &self.label {
            builder = builder.metrics_label(label(key));
        }
        let limiter = builder.build()?;
        state.sweep();
        state.limiters.insert(key.into(), limiter.downgrade());
        Ok(limiter)
    }

    fn live(&self, key: &str) -> Option<Limiter> {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .limiters
            .get(key)
            .and_then(WeakLimiter::upgrade)
    }

    /// Penalizes `key` (see [`Limiter::penalize`]) if it is live here; answers whether it was.
    pub async fn penalize(
        &self,
        key: &str,
        retry_after: std::time::Duration,
    ) -> Result<bool, Error> {
        match self.live(key) {
            Some(limiter) => limiter.penalize(retry_after).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// How many keys have a live limiter here.
    pub fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .limiters
            .values()
            .filter(|weak| !weak.is_dead())
            .count()
    }

    /// True when no key has a live limiter.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every key whose limiter nobody holds any more (done on its own as the registry
    /// grows).
    pub fn sweep(&self) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.sweep_at = 0;
        state.sweep();
    }
}

impl State {
    fn sweep(&mut self) {
        if self.limiters.len() < self.sweep_at {
            return;
        }
        self.limiters.retain(|_, weak| !weak.is_dead());
        self.sweep_at = (self.limiters.len() * 2).max(MIN_SWEEP);
        if self.limiters.capacity() > 4 * self.sweep_at {
            self.limiters.shrink_to(self.sweep_at);
        }
    }
}

fn same_limits(limiter: Limiter, limits: &Limits) -> Result<Limiter, Error> {
    if limiter.limits().same(limits) {
        Ok(limiter)
    } else {
        Err(Error::ConflictingLimits {
            key: limiter.key().to_owned(),
            existing: limiter.limits().clone(),
            requested: limits.clone(),
        })
    }
}
