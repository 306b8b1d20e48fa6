//! [`Limiter`]: one key on a store, with the way its calls wait and the estimator that prices
//! them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tollgate_estimators::{Estimate, Estimator};
use tracing::Instrument;

use crate::bucket::Available;
use crate::cost::Cost;
use crate::error::Error;
use crate::rate::Limits;
use crate::store::{AnyStore, Op, Outcome, Store};

mod builder;
mod health;
mod line;
mod permit;
mod wait;

pub use builder::{LimiterBuilder, WaitPolicy};
pub use permit::{Attempt, Permit, Settled};

/// One key's limits on a store, and the way its calls wait: `acquire(cost)` → [`Permit`].
///
/// Cloning is cheap and clones share everything. Calls on one key are admitted in the order they
/// reached the store, from every limiter and every process that shares it, so a large call is
/// not starved by a stream of small ones. Limiters for the same key on the same store share the
/// windows (and the store refuses a second set of limits for a live key with
/// [`Error::ConflictingLimits`]); get them from the [`Registry`](crate::Registry) to share one
/// limiter per key in the process.
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

struct Inner<S: Store> {
    key: String,
    limits: Limits,
    store: S,
    bound: S::Key,
    policy: WaitPolicy,
    /// Chosen when the limiter is built, or the default on first use (so that a limiter that
    /// never estimates never loads a vocabulary).
    estimator: OnceLock<Arc<dyn Estimator>>,
    /// Calls holding a ticket on this limiter.
    waiters: AtomicUsize,
    /// Metric handles, registered once at first use (so increments never allocate).
    meters: OnceLock<Meters>,
    /// For stores that can fail: how waiters learn of a failure together.
    health: OnceLock<health::Health>,
    /// Waiters behind calls of this limiter that have yet to pass.
    line: line::Line,
    /// How many 429 penalties this process applied to the key: a permit admitted before one
    /// was counted by the provider's refusal, so its shortfall is not charged again.
    penalties: std::sync::atomic::AtomicU64,
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

/// The estimator a limiter uses when none is given: `openai` (o200k_base) with the `tiktoken`
/// feature, else `words`.
pub(crate) fn default_estimator() -> Arc<dyn Estimator> {
    static DEFAULT: OnceLock<Arc<dyn Estimator>> = OnceLock::new();
    Arc::clone(DEFAULT.get_or_init(|| {
        crate::counting::count(crate::counting::OFF_WORKER_ABOVE, || {
            tollgate_estimators::estimator("openai")
                .unwrap_or_else(|_| Arc::new(tollgate_estimators::Words))
        })
    }))
}

/// A limiter the registry remembers without keeping it alive.
pub(crate) struct WeakLimiter(Weak<Inner<AnyStore>>);

impl WeakLimiter {
    pub(crate) fn upgrade(&self) -> Option<Limiter> {
        self.0.upgrade().map(|inner| Limiter { inner })
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.0.strong_count() == 0
    }
}

impl std::fmt::Debug for WeakLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakLimiter(..)")
    }
}

impl Limiter {
    /// A builder for `key` with `limits`, on a new in-memory store until
    /// [`store`](LimiterBuilder::store) says otherwise.
    ///
    /// ```
    /// use tollgate::{Limiter, Limits};
    ///
    /// let limiter: Limiter = Limiter::builder("k", Limits::parse("5/s", "")?).build()?;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn builder(key: impl Into<String>, limits: Limits) -> LimiterBuilder {
        LimiterBuilder::new(key.into(), limits)
    }

    pub(crate) fn downgrade(&self) -> WeakLimiter {
        WeakLimiter(Arc::downgrade(&self.inner))
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter for `key` with `limits` on `store`, waiting by the default [`WaitPolicy`].
    ///
    /// Fails with [`Error::NoLimits`] when `limits` has no window, and with the store's refusal
    /// of the limits ([`Error::UnsupportedLimits`], [`Error::ConflictingLimits`]).
    pub fn new(key: impl Into<String>, limits: Limits, store: S) -> Result<Limiter<S>, Error> {
        Limiter::builder(key, limits).store(store).build()
    }

    /// A limiter with an explicit wait policy.
    pub fn with_policy(
        key: impl Into<String>,
        limits: Limits,
        store: S,
        policy: WaitPolicy,
    ) -> Result<Limiter<S>, Error> {
        Limiter::builder(key, limits)
            .store(store)
            .policy(policy)
            .build()
    }

    /// The estimator this limiter counts arguments with.
    pub fn estimator(&self) -> &Arc<dyn Estimator> {
        self.inner.estimator.get_or_init(default_estimator)
    }

    /// The tokens `args` will cost, by this limiter's estimator (see
    /// [`tollgate_estimators::estimate`] for what counts). Arguments with more than
    /// [`OFF_WORKER_ABOVE`](crate::OFF_WORKER_ABOVE) bytes of text are counted off the async
    /// worker on a multi-threaded runtime.
    pub fn estimate<T: Serialize + ?Sized>(&self, args: &T) -> Result<Estimate, Error> {
        let estimator = self.estimator();
        crate::counting::count(tollgate_estimators::text_len(args), || {
            Ok(tollgate_estimators::estimate(&**estimator, args)?)
        })
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

    /// How many calls on this limiter are waiting for their turn now.
    pub fn waiters(&self) -> usize {
        self.inner.waiters.load(Ordering::Acquire)
    }

    /// Tokens came back: the first waiter asks now rather than at its due time.
    pub(crate) fn refunded(&self) {
        self.inner.line.refunded();
    }

    /// True when a penalty came after `penalties` were counted.
    pub(crate) fn penalized_since(&self, penalties: u64) -> bool {
        self.inner.penalties.load(Ordering::Acquire) != penalties
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
        self.call_bounded(Op::Penalize { pause: retry_after })
            .await?;
        self.inner.penalties.fetch_add(1, Ordering::Release);
        self.meters().penalties.increment(1);
        tracing::warn!(key = %self.inner.key, ?retry_after, "the provider refused a call; pausing the key");
        Ok(())
    }

    /// Lowers what the windows of `currency` hold to at most `remaining` (what a provider's
    /// `remaining` header says is left); never raises them, since calls in flight are charged
    /// here and not yet counted there. Answers how many whole tokens the window closest to
    /// `remaining` held above it (what was taken off), or, negative, below it.
    pub async fn lower(&self, currency: crate::Currency, remaining: u64) -> Result<i64, Error> {
        match self
            .call_bounded(Op::Lower {
                currency,
                remaining,
            })
            .await?
        {
            Outcome::Lowered(tokens) => Ok(tokens),
            other => Err(unexpected(&other)),
        }
    }

    /// Takes `tokens` from every window of `currency` (into debt if need be), for spending
    /// this process did not make but knows of (another program on the same quota).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) async fn charge(&self, currency: crate::Currency, tokens: u64) -> Result<(), Error> {
        let amount = -i64::try_from(tokens).unwrap_or(i64::MAX);
        let (mut requests, mut token_part, mut output_tokens) = (0, 0, 0);
        match currency {
            crate::Currency::Requests => requests = amount,
            crate::Currency::Tokens => token_part = amount,
            crate::Currency::OutputTokens => output_tokens = amount,
        }
        self.call_bounded(Op::Adjust {
            requests,
            tokens: token_part,
            output_tokens,
        })
        .await
        .map(|_| ())
    }

    fn permit(&self, cost: Cost, start: Instant) -> Permit<S> {
        self.admitted(cost, Instant::now().saturating_duration_since(start))
    }

    fn admitted(&self, cost: Cost, waited: Duration) -> Permit<S> {
        let meters = self.meters();
        meters.admitted.increment(1);
        meters.tokens.increment(cost.tokens);
        meters.waited.record(waited.as_secs_f64());
        let penalties = self.inner.penalties.load(Ordering::Acquire);
        Permit::new(self.clone(), cost, waited, penalties)
    }

    /// Admits `cost` now if every window can pay for it (on top of every call waiting), without
    /// waiting; otherwise charges nothing and answers how long until it could.
    ///
    /// It never passes ahead of calls waiting in [`acquire`](Limiter::acquire): the hint counts
    /// them. Fails at once for a cost no window can take ([`Error::CostExceedsCapacity`],
    /// [`Error::InvalidCost`]) and for store errors.
    pub async fn try_acquire(&self, cost: Cost) -> Result<Attempt<S>, Error> {
        let op = Op::Acquire {
            cost,
            max_wait: Some(Duration::ZERO),
        };
        // The store checks the cost; a call that never waits reads no clock of its own. A
        // store that answers at once (memory) never builds the bounded call: boxed, it keeps
        // this future a few words long instead of the few hundred bytes of a timer and a
        // store call, which every admission would otherwise move.
        let outcome = match self.inner.store.apply_now(&self.inner.bound, op) {
            Some(answer) => answer?,
            None => Box::pin(self.call_bounded(op)).await?,
        };
        match outcome {
            Outcome::Admitted => Ok(Attempt::Admitted(self.admitted(cost, Duration::ZERO))),
            Outcome::NotYet(hint) => Ok(Attempt::NotYet(hint)),
            other => Err(unexpected(&other)),
        }
    }

    /// Waits until every window can pay `cost`, then charges it, within the policy's timeout.
    ///
    /// See [`acquire_until`](Limiter::acquire_until) for how it waits and fails.
    pub async fn acquire(&self, cost: Cost) -> Result<Permit<S>, Error> {
        self.acquire_timeout(cost, self.inner.policy.timeout())
            .await
    }

    /// Like [`acquire`](Limiter::acquire) with an explicit timeout (`None`: no deadline).
    pub async fn acquire_timeout(
        &self,
        cost: Cost,
        timeout: Option<Duration>,
    ) -> Result<Permit<S>, Error> {
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        self.instrumented(cost, start, deadline).await
    }

    /// Waits until every window can pay `cost`, or until `deadline`.
    ///
    /// Calls are admitted in the order they reached the store. One that can't pass at once
    /// takes its place in the key's queue and sleeps until it is due (when the key can pay for
    /// it after every call ahead of it), then asks to pass; if it still can't (a call ahead was
    /// late, a penalty came in), it sleeps the store's hint plus a jitter that grows each time
    /// (see [`Backoff`](crate::Backoff)). When its turn would come after the deadline, the answer
    /// is [`Error::Timeout`] at once, with the time the call would have needed; no call returns
    /// later than its deadline, store calls included.
    ///
    /// Cancel-safe: a dropped future gives its place up and has consumed nothing.
    pub async fn acquire_until(
        &self,
        cost: Cost,
        deadline: Option<Instant>,
    ) -> Result<Permit<S>, Error> {
        self.instrumented(cost, Instant::now(), deadline).await
    }

    async fn instrumented(
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
        self.wait(cost, start, deadline).instrument(span).await
    }

    /// What every window of the key holds now.
    pub async fn snapshot(&self) -> Result<Vec<Available>, Error> {
        match self.call_bounded(Op::Snapshot).await? {
            Outcome::Snapshot(levels) => Ok(levels),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(outcome: &Outcome) -> Error {
    Error::store(
        format!("the store answered {outcome:?}, which does not answer the operation"),
        None,
    )
}
