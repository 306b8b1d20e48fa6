//! [`Limiter`] and [`Permit`]: acquire, wait, settle.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tollgate_estimators::{Estimate, Estimator};
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::bucket::{Available, Buckets, Cost, Decision};
use crate::error::Error;
use crate::rate::Limits;
use crate::store::{AnyStore, MemoryStore, Store};

/// How a limiter waits: the backoff between attempts, the default deadline, and how many calls
/// may wait on the key at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// The sleep between attempts. Default: [`Backoff::default`].
    pub backoff: Backoff,
    /// How long [`Limiter::acquire`] waits at most; `None` waits as long as it takes. Default
    /// 60 s.
    pub timeout: Option<Duration>,
    /// How many calls may wait on the key at once before [`Error::QueueFull`]. Default 10,000.
    pub max_waiters: usize,
}

impl Default for WaitPolicy {
    fn default() -> WaitPolicy {
        WaitPolicy {
            backoff: Backoff::default(),
            timeout: Some(Duration::from_secs(60)),
            max_waiters: 10_000,
        }
    }
}

/// One key's limits on a store, and the way its calls wait: `acquire(cost)` → [`Permit`].
///
/// Cloning is cheap and clones share everything, including the queue of waiters: waiters on
/// one limiter are served in arrival order, so a large call is not starved by a stream of small
/// ones. Limiters for the same key on the same store share the buckets (and the store refuses
/// a second set of limits for a key with [`Error::ConflictingLimits`]); to share the queue too,
/// get limiters from the [`Registry`](crate::Registry).
///
/// ```
/// use tollgate::{Cost, Limiter, Limits, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// let limits = Limits::parse("500/m", "200000/m")?;
/// let limiter = Limiter::new("openai", limits, MemoryStore::new())?;
/// let permit = limiter.acquire(Cost::call(1_200)).await?;
/// assert_eq!(permit.cost(), Cost::call(1_200));
/// # Ok(())
/// # }
/// ```
pub struct Limiter<S: Store = AnyStore> {
    inner: Arc<Inner<S>>,
}

struct Inner<S> {
    key: String,
    limits: Limits,
    store: S,
    policy: WaitPolicy,
    /// Chosen when the limiter is built, or the default on first use (so that a limiter that
    /// never estimates never loads a vocabulary).
    estimator: OnceLock<Arc<dyn Estimator>>,
    /// Held by the waiter at the head of the queue; tokio's mutex is fair (FIFO).
    queue: tokio::sync::Mutex<()>,
    waiters: AtomicUsize,
    /// Counts calls, so that the registry can tell a key that went quiet without a clock read
    /// on the hot path.
    uses: AtomicU64,
    /// Metric handles, registered once at first use (so increments never allocate).
    meters: OnceLock<Meters>,
}

/// The metrics of one key, through the `metrics` facade. Without an installed recorder these
/// are no-ops; install the recorder before the first limited call, since a limiter registers
/// its handles once.
struct Meters {
    admitted: metrics::Counter,
    tokens: metrics::Counter,
    waited: metrics::Histogram,
    timeouts: metrics::Counter,
    penalties: metrics::Counter,
    settlements: metrics::Counter,
}

impl Meters {
    fn new(key: &str) -> Meters {
        let key = key.to_owned();
        Meters {
            admitted: metrics::counter!("tollgate_calls_admitted_total", "key" => key.clone()),
            tokens: metrics::counter!("tollgate_tokens_charged_total", "key" => key.clone()),
            waited: metrics::histogram!("tollgate_wait_seconds", "key" => key.clone()),
            timeouts: metrics::counter!("tollgate_timeouts_total", "key" => key.clone()),
            penalties: metrics::counter!("tollgate_penalties_total", "key" => key.clone()),
            settlements: metrics::counter!("tollgate_settlements_total", "key" => key),
        }
    }
}

impl<S: Store> Clone for Limiter<S> {
    fn clone(&self) -> Self {
        Limiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: Store> std::fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("key", &self.inner.key)
            .field("limits", &self.inner.limits)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// The answer of [`Limiter::try_acquire`]: admitted, or the time until the call could be.
#[derive(Debug)]
#[must_use]
pub enum Attempt<S: Store = AnyStore> {
    /// Every window paid.
    Admitted(Permit<S>),
    /// Nothing was charged; the call could pass after this long if nothing else is charged
    /// meanwhile.
    NotYet(Duration),
}

impl<S: Store> Attempt<S> {
    /// The permit, if admitted.
    pub fn permit(self) -> Option<Permit<S>> {
        match self {
            Attempt::Admitted(permit) => Some(permit),
            Attempt::NotYet(_) => None,
        }
    }

    /// True when admitted.
    pub fn is_admitted(&self) -> bool {
        matches!(self, Attempt::Admitted(_))
    }
}

/// Proof that a call paid its toll.
#[derive(Debug)]
pub struct Permit<S: Store = AnyStore> {
    limiter: Limiter<S>,
    cost: Cost,
    waited: Duration,
}

impl<S: Store> Permit<S> {
    /// What the call paid.
    pub fn cost(&self) -> Cost {
        self.cost
    }

    /// How long the call waited for admission.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The limiter that admitted the call.
    pub fn limiter(&self) -> &Limiter<S> {
        &self.limiter
    }

    /// Settles the estimate against the tokens the response says were used: a call that used
    /// more is charged the difference (the token windows may go into debt, so later calls pay
    /// for the underestimate); one that used less is refunded it (never above capacity).
    /// Answers the adjustment made: positive for a refund, negative for a charge.
    ///
    /// ```
    /// use tollgate::{Cost, Limiter, Limits};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// let limiter = Limiter::builder("k", Limits::parse("", "1000/d")?).build()?;
    /// let permit = limiter.acquire(Cost::call(300)).await?;
    /// // The response reported 420 tokens: 120 more are charged.
    /// assert_eq!(permit.settle(420).await?, -120);
    /// assert_eq!(limiter.snapshot().await?[0].tokens.whole(), 580);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn settle(self, actual_tokens: u64) -> Result<i64, Error> {
        let inner = &self.limiter.inner;
        let delta = i128::from(self.cost.tokens) - i128::from(actual_tokens);
        if delta == 0 || inner.limits.tokens().is_empty() {
            return Ok(0);
        }
        let delta = i64::try_from(delta).unwrap_or(if delta > 0 { i64::MAX } else { i64::MIN });
        inner.store.adjust(&inner.key, &inner.limits, delta).await?;
        self.limiter.meters().settlements.increment(1);
        Ok(delta)
    }
}

/// Keeps the waiter count right however the wait ends, including when the future is dropped.
struct WaiterSlot<'a>(&'a AtomicUsize);

impl Drop for WaiterSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The estimator a limiter uses when none is given: `openai` (o200k_base) with the `tiktoken`
/// feature, else `words`.
pub fn default_estimator() -> Arc<dyn Estimator> {
    static DEFAULT: OnceLock<Arc<dyn Estimator>> = OnceLock::new();
    Arc::clone(DEFAULT.get_or_init(|| {
        tollgate_estimators::estimator("openai")
            .unwrap_or_else(|_| Arc::new(tollgate_estimators::Words))
    }))
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
pub struct LimiterBuilder<S: Store = MemoryStore> {
    key: String,
    limits: Limits,
    store: S,
    policy: WaitPolicy,
    estimator: Option<Arc<dyn Estimator>>,
}

impl<S: Store> LimiterBuilder<S> {
    /// The store (default: a new [`MemoryStore`]).
    pub fn store<T: Store>(self, store: T) -> LimiterBuilder<T> {
        LimiterBuilder {
            key: self.key,
            limits: self.limits,
            store,
            policy: self.policy,
            estimator: self.estimator,
        }
    }

    /// The whole wait policy.
    pub fn policy(mut self, policy: WaitPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long [`Limiter::acquire`] waits at most (`None`: as long as it takes).
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.policy.timeout = timeout;
        self
    }

    /// The sleep between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.policy.backoff = backoff;
        self
    }

    /// How many calls may wait at once.
    pub fn max_waiters(mut self, max_waiters: usize) -> Self {
        self.policy.max_waiters = max_waiters;
        self
    }

    /// The estimator that turns arguments into tokens (default: [`default_estimator`]).
    pub fn estimator(mut self, estimator: Arc<dyn Estimator>) -> Self {
        self.estimator = Some(estimator);
        self
    }

    /// The estimator called `name` (`openai`, `openai:gpt-4`, `voyageai`, `hf:path`, `words`).
    pub fn estimator_named(self, name: &str) -> Result<Self, Error> {
        Ok(self.estimator(tollgate_estimators::estimator(name)?))
    }

    /// The limiter. Fails with [`Error::NoLimits`] when the limits have no window.
    pub fn build(self) -> Result<Limiter<S>, Error> {
        if self.limits.is_empty() {
            return Err(Error::NoLimits { key: self.key });
        }
        let estimator = OnceLock::new();
        if let Some(chosen) = self.estimator {
            let _ = estimator.set(chosen);
        }
        Ok(Limiter {
            inner: Arc::new(Inner {
                key: self.key,
                limits: self.limits,
                store: self.store,
                policy: self.policy,
                estimator,
                queue: tokio::sync::Mutex::new(()),
                waiters: AtomicUsize::new(0),
                uses: AtomicU64::new(0),
                meters: OnceLock::new(),
            }),
        })
    }
}

impl Limiter<MemoryStore> {
    /// A builder for `key` with `limits`, on a new in-memory store until
    /// [`store`](LimiterBuilder::store) says otherwise.
    pub fn builder(key: impl Into<String>, limits: Limits) -> LimiterBuilder<MemoryStore> {
        LimiterBuilder {
            key: key.into(),
            limits,
            store: MemoryStore::new(),
            policy: WaitPolicy::default(),
            estimator: None,
        }
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter for `key` with `limits` on `store`, waiting by the default [`WaitPolicy`].
    ///
    /// Fails with [`Error::NoLimits`] when `limits` has no window.
    pub fn new(key: impl Into<String>, limits: Limits, store: S) -> Result<Limiter<S>, Error> {
        Limiter::with_policy(key, limits, store, WaitPolicy::default())
    }

    /// A limiter with an explicit wait policy.
    pub fn with_policy(
        key: impl Into<String>,
        limits: Limits,
        store: S,
        policy: WaitPolicy,
    ) -> Result<Limiter<S>, Error> {
        LimiterBuilder {
            key: key.into(),
            limits,
            store,
            policy,
            estimator: None,
        }
        .build()
    }

    /// The estimator this limiter counts arguments with.
    pub fn estimator(&self) -> &Arc<dyn Estimator> {
        self.inner.estimator.get_or_init(default_estimator)
    }

    /// The tokens `args` will cost, by this limiter's estimator (see
    /// [`tollgate_estimators::estimate`] for what counts).
    pub fn estimate<T: Serialize + ?Sized>(&self, args: &T) -> Result<Estimate, Error> {
        Ok(tollgate_estimators::estimate(&**self.estimator(), args)?)
    }

    /// Waits for one request plus the estimated input tokens of `args`, like
    /// [`acquire`](Limiter::acquire). Limits without token windows skip the estimate.
    ///
    /// ```
    /// use serde_json::json;
    /// use tollgate::{Limiter, Limits};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// let limiter = Limiter::builder("openai", Limits::parse("500/m", "30000/m")?)
    ///     .estimator_named("words")?
    ///     .build()?;
    /// let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]});
    /// let permit = limiter.acquire_for(&body).await?;
    /// // 3 framing + "user" + "Hi" + 3 priming, by the words rule.
    /// assert_eq!(permit.cost().tokens, 8);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_for<T: Serialize + ?Sized>(&self, args: &T) -> Result<Permit<S>, Error> {
        let tokens = if self.inner.limits.tokens().is_empty() {
            0
        } else {
            self.estimate(args)?.input_tokens
        };
        self.acquire(Cost::call(tokens)).await
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The wait policy.
    pub fn policy(&self) -> &WaitPolicy {
        &self.inner.policy
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// How many calls are waiting now.
    pub fn waiters(&self) -> usize {
        self.inner.waiters.load(Ordering::Acquire)
    }

    fn meters(&self) -> &Meters {
        self.inner
            .meters
            .get_or_init(|| Meters::new(&self.inner.key))
    }

    /// What a provider's 429 means for this key: empties its windows and admits nothing on it
    /// for `retry_after`, for every waiter (and, on a shared store, every process). A longer
    /// pause already in force wins. See [`parse_retry_after`](crate::parse_retry_after) for the
    /// header.
    pub async fn penalize(&self, retry_after: Duration) -> Result<(), Error> {
        self.inner
            .store
            .penalize(&self.inner.key, &self.inner.limits, retry_after)
            .await?;
        self.meters().penalties.increment(1);
        tracing::warn!(key = %self.inner.key, ?retry_after, "the provider refused a call; pausing the key");
        Ok(())
    }

    pub(crate) fn uses(&self) -> u64 {
        self.inner.uses.load(Ordering::Relaxed)
    }

    pub(crate) fn is_shared(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    fn validate(&self, cost: Cost) -> Result<(), Error> {
        Buckets::validate(&self.inner.limits, cost)
            .map_err(|e| Error::from_bucket(&self.inner.key, cost, e))
    }

    async fn attempt(&self, cost: Cost) -> Result<Decision, Error> {
        self.inner.uses.fetch_add(1, Ordering::Relaxed);
        self.inner
            .store
            .try_acquire(&self.inner.key, &self.inner.limits, cost)
            .await
    }

    fn permit(&self, cost: Cost, waited: Duration) -> Permit<S> {
        let meters = self.meters();
        meters.admitted.increment(1);
        meters.tokens.increment(cost.tokens);
        meters.waited.record(waited.as_secs_f64());
        Permit {
            limiter: self.clone(),
            cost,
            waited,
        }
    }

    /// Admits `cost` now if every window can pay, without waiting; otherwise charges nothing and
    /// answers how long until it could.
    ///
    /// It does not queue, so it may pass ahead of calls waiting in [`acquire`](Limiter::acquire).
    /// Fails at once for a cost no window can take ([`Error::CostExceedsCapacity`],
    /// [`Error::InvalidCost`]) and for store errors.
    pub async fn try_acquire(&self, cost: Cost) -> Result<Attempt<S>, Error> {
        self.validate(cost)?;
        Ok(match self.attempt(cost).await? {
            Decision::Admitted => Attempt::Admitted(self.permit(cost, Duration::ZERO)),
            Decision::NotYet(hint) => Attempt::NotYet(hint),
        })
    }

    /// Waits until every window can pay `cost`, then charges it, within the policy's timeout.
    ///
    /// See [`acquire_until`](Limiter::acquire_until) for how it waits and fails.
    pub async fn acquire(&self, cost: Cost) -> Result<Permit<S>, Error> {
        self.acquire_timeout(cost, self.inner.policy.timeout).await
    }

    /// Like [`acquire`](Limiter::acquire) with an explicit timeout (`None`: no deadline).
    pub async fn acquire_timeout(
        &self,
        cost: Cost,
        timeout: Option<Duration>,
    ) -> Result<Permit<S>, Error> {
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        self.wait(cost, start, deadline).await
    }

    /// Waits until every window can pay `cost`, or until `deadline`.
    ///
    /// Waiters are served in arrival order. Each sleeps at least the store's hint (it never
    /// wakes before its tokens can exist) plus a jitter that grows each time it wakes and still
    /// can't pass (see [`Backoff`]). When the hint alone already passes the deadline the answer
    /// is [`Error::Timeout`] at once, with the time the call would have needed.
    ///
    /// Cancel-safe: a dropped future holds no place in the queue and has consumed nothing.
    pub async fn acquire_until(
        &self,
        cost: Cost,
        deadline: Option<Instant>,
    ) -> Result<Permit<S>, Error> {
        self.wait(cost, Instant::now(), deadline).await
    }

    fn timeout(&self, start: Instant, needed: Option<Duration>) -> Error {
        self.meters().timeouts.increment(1);
        Error::Timeout {
            key: self.inner.key.clone(),
            waited: Instant::now().saturating_duration_since(start),
            needed,
        }
    }

    async fn wait(
        &self,
        cost: Cost,
        start: Instant,
        deadline: Option<Instant>,
    ) -> Result<Permit<S>, Error> {
        let span = tracing::debug_span!(
            "tollgate.acquire",
            key = %self.inner.key,
            requests = cost.requests,
            tokens = cost.tokens
        );
        self.wait_inner(cost, start, deadline)
            .instrument(span)
            .await
    }

    async fn wait_inner(
        &self,
        cost: Cost,
        start: Instant,
        deadline: Option<Instant>,
    ) -> Result<Permit<S>, Error> {
        self.validate(cost)?;
        let passes_deadline = |hint: Duration| {
            deadline.is_some_and(|d| Instant::now().checked_add(hint).is_none_or(|t| t > d))
        };
        // Nobody queued: try at once, without touching the queue.
        if self.inner.waiters.load(Ordering::Acquire) == 0 {
            match self.attempt(cost).await? {
                Decision::Admitted => return Ok(self.permit(cost, Duration::ZERO)),
                Decision::NotYet(hint) if passes_deadline(hint) => {
                    return Err(self.timeout(start, Some(hint)));
                }
                Decision::NotYet(_) => {}
            }
        }
        let limit = self.inner.policy.max_waiters;
        if self.inner.waiters.fetch_add(1, Ordering::AcqRel) >= limit {
            self.inner.waiters.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::QueueFull {
                key: self.inner.key.clone(),
                limit,
            });
        }
        let _slot = WaiterSlot(&self.inner.waiters);
        let _turn = match deadline {
            Some(d) => tokio::time::timeout_at(d, self.inner.queue.lock())
                .await
                .map_err(|_| self.timeout(start, None))?,
            None => self.inner.queue.lock().await,
        };
        let mut attempt = 0u32;
        loop {
            match self.attempt(cost).await? {
                Decision::Admitted => {
                    let waited = Instant::now().saturating_duration_since(start);
                    return Ok(self.permit(cost, waited));
                }
                Decision::NotYet(hint) if passes_deadline(hint) => {
                    return Err(self.timeout(start, Some(hint)));
                }
                Decision::NotYet(hint) => {
                    let sleep = self.inner.policy.backoff.sleep_for(hint, attempt);
                    let wake = Instant::now() + sleep;
                    let wake = deadline.map_or(wake, |d| wake.min(d));
                    tokio::time::sleep_until(wake).await;
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }

    /// What every window of the key holds now.
    pub async fn snapshot(&self) -> Result<Vec<Available>, Error> {
        self.inner
            .store
            .snapshot(&self.inner.key, &self.inner.limits)
            .await
    }
}
