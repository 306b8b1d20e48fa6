//! Building a [`Limiter`]: its store, its wait policy and its estimator.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tollgate_estimators::Estimator;

use super::{Inner, Limiter};
use crate::backoff::Backoff;
use crate::error::Error;
use crate::rate::Limits;
use crate::store::{AnyStore, Store};

/// How a limiter waits: the backoff between attempts, the default deadline, and how many calls
/// may wait on the key at once.
///
/// ```
/// use std::time::Duration;
/// use tollgate::WaitPolicy;
///
/// let policy = WaitPolicy::default()
///     .with_timeout(Some(Duration::from_secs(5)))
///     .with_max_waiters(100);
/// assert_eq!(policy.timeout(), Some(Duration::from_secs(5)));
/// assert_eq!(policy.max_waiters(), 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    backoff: Backoff,
    timeout: Option<Duration>,
    max_waiters: usize,
}

impl Default for WaitPolicy {
    /// The default backoff, a 60 s timeout and at most 10,000 waiting calls.
    fn default() -> WaitPolicy {
        WaitPolicy {
            backoff: Backoff::default(),
            timeout: Some(Duration::from_secs(60)),
            max_waiters: 10_000,
        }
    }
}

impl WaitPolicy {
    /// The sleep between attempts that fail.
    pub fn with_backoff(self, backoff: Backoff) -> WaitPolicy {
        WaitPolicy { backoff, ..self }
    }

    /// How long [`Limiter::acquire`] waits at most; `None` waits as long as it takes.
    pub fn with_timeout(self, timeout: Option<Duration>) -> WaitPolicy {
        WaitPolicy { timeout, ..self }
    }

    /// How many calls may wait on the key at once before [`Error::QueueFull`].
    pub fn with_max_waiters(self, max_waiters: usize) -> WaitPolicy {
        WaitPolicy {
            max_waiters,
            ..self
        }
    }

    /// The sleep between attempts that fail.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// How long [`Limiter::acquire`] waits at most.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// How many calls may wait at once.
    pub fn max_waiters(&self) -> usize {
        self.max_waiters
    }
}

/// Builds a [`Limiter`]: the store, the wait policy and the estimator, each with a default.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, Limits, MemoryStore};
///
/// let limiter = Limiter::builder("voyage", Limits::parse("300/m", "1000000/m")?)
///     .store(MemoryStore::new())
///     .timeout(Some(Duration::from_secs(5)))
///     .estimator_named("voyageai")?
///     .build()?;
/// assert_eq!(limiter.key(), "voyage");
/// # Ok::<(), tollgate::Error>(())
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct LimiterBuilder<S: Store = AnyStore> {
    key: String,
    limits: Limits,
    store: S,
    policy: WaitPolicy,
    estimator: Option<Arc<dyn Estimator>>,
    off_worker_above: usize,
    label: Option<String>,
}

impl<S: Store> std::fmt::Debug for LimiterBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("key", &self.key)
            .field("limits", &self.limits)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl LimiterBuilder {
    pub(super) fn new(key: String, limits: Limits) -> LimiterBuilder {
        LimiterBuilder {
            key,
            limits,
            store: AnyStore::default(),
            policy: WaitPolicy::default(),
            estimator: None,
            off_worker_above: crate::counting::DEFAULT_OFF_WORKER_ABOVE,
            label: None,
        }
    }
}

impl<S: Store> LimiterBuilder<S> {
    /// The store (default: a new in-memory store).
    pub fn store<T: Store>(self, store: T) -> LimiterBuilder<T> {
        LimiterBuilder {
            key: self.key,
            limits: self.limits,
            store,
            policy: self.policy,
            estimator: self.estimator,
            off_worker_above: self.off_worker_above,
            label: self.label,
        }
    }

    /// The `key` label of this limiter's metrics (default: the key itself). Keys that callers
    /// invent (one per tenant, per API key) each make a series of every metric; giving them
    /// one shared label keeps a metrics backend's memory bounded.
    pub fn metrics_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The whole wait policy.
    pub fn policy(mut self, policy: WaitPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long [`Limiter::acquire`] waits at most (`None`: as long as it takes).
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.policy = self.policy.with_timeout(timeout);
        self
    }

    /// The sleep between attempts that fail.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.policy = self.policy.with_backoff(backoff);
        self
    }

    /// How many calls may wait at once.
    pub fn max_waiters(mut self, max_waiters: usize) -> Self {
        self.policy = self.policy.with_max_waiters(max_waiters);
        self
    }

    /// The estimator that turns arguments into tokens (default: `openai` with the `tiktoken`
    /// feature, else `words`).
    pub fn estimator(mut self, estimator: Arc<dyn Estimator>) -> Self {
        self.estimator = Some(estimator);
        self
    }

    /// Arguments with at least this many bytes of text are counted off the async worker, on a
    /// multi-threaded tokio runtime (default 256 KB, about 60,000 tokens, or 6 ms of counting):
    /// the worker's other tasks move to another thread first, so a long count doesn't stall
    /// them. `usize::MAX` counts everything where it is.
    pub fn count_off_worker_above(mut self, bytes: usize) -> Self {
        self.off_worker_above = bytes;
        self
    }

    /// The estimator called `name` (`openai`, `openai:gpt-4`, `voyageai`, `hf:path`, `words`).
    pub fn estimator_named(self, name: &str) -> Result<Self, Error> {
        Ok(self.estimator(crate::counting::estimator_named(name)?))
    }

    /// The limiter. Fails with [`Error::NoLimits`] when the limits have no window, and with the
    /// store's refusal of them ([`Error::UnsupportedLimits`] on Redis for limits outside its
    /// exact range, [`Error::ConflictingLimits`] for a live key with other limits).
    pub fn build(self) -> Result<Limiter<S>, Error> {
        if self.limits.is_empty() {
            return Err(Error::NoLimits { key: self.key });
        }
        let bound = self.store.bind(&self.key, &self.limits)?;
        let estimator = OnceLock::new();
        if let Some(chosen) = self.estimator {
            let _ = estimator.set(chosen);
        }
        Ok(Limiter {
            inner: Arc::new(Inner {
                label: self.label,
                key: self.key,
                limits: self.limits,
                store: self.store,
                bound,
                policy: self.policy,
                estimator,
                waiters: AtomicUsize::new(0),
                meters: OnceLock::new(),
                health: OnceLock::new(),
                line: super::line::Line::default(),
                penalties: std::sync::atomic::AtomicU64::new(0),
                cover: std::sync::Mutex::default(),
                unsettled: AtomicUsize::new(0),
                strikes: std::sync::atomic::AtomicU32::new(0),
                strike_mark: std::sync::atomic::AtomicU64::new(0),
                admissions: std::sync::atomic::AtomicU64::new(0),
                admitted_total: crate::rate::PerCurrency::from_fn(|_| {
                    std::sync::atomic::AtomicU64::new(0)
                }),
                off_worker_above: self.off_worker_above,
            }),
        })
    }
}
