//! [`Limiter`]: one key on a store, with the way its calls wait and the estimator that prices
//! them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tollgate_estimators::{Estimate, Estimator};
use tracing::Instrument;

use crate::bucket::Snapshot;
use crate::cost::Cost;
use crate::error::Error;
use crate::rate::{Currency, Limits, PerCurrency};
use crate::store::{AnyStore, Op, Outcome, Share, Store};

mod builder;
mod health;
mod line;
mod permit;
mod provider;

use crate::bucket::flights::Cover;
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
    /// The `key` label of its metrics, when not the key.
    label: Option<String>,
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
    meters: OnceLock<KeyMetrics>,
    /// For stores that can fail: how waiters learn of a failure together.
    health: OnceLock<health::Health>,
    /// Waiters behind calls of this limiter that have yet to pass.
    line: line::Line,
    /// How many 429 penalties this process applied to the key.
    penalties: std::sync::atomic::AtomicU64,
    /// What the last penalty emptied: permits admitted before it (counted by the provider's
    /// refusal) may settle a shortfall against it instead of charging it again, never more.
    cover: std::sync::Mutex<Cover>,
    /// Calls in flight that will settle (the HTTP gate's): refunds may still come, so a wait
    /// that looks longer than the deadline is not certain.
    unsettled: AtomicUsize,
    /// The provider's 429s on this key in a row, in this process, since an answer that was not
    /// one: each one's pause is longer (see [`Limiter::refused`]).
    strikes: std::sync::atomic::AtomicU32,
    /// How many calls this limiter admitted, when the last strike was counted: a refused call
    /// admitted before it was refused in the same episode (calls in flight together, counted
    /// by the same refusal), and adds no strike.
    strike_mark: std::sync::atomic::AtomicU64,
    /// How many calls this limiter admitted: each permit's number.
    admissions: std::sync::atomic::AtomicU64,
    /// What this limiter admitted since it was made, per currency: a refused call's permit
    /// reads what went out after it from the difference.
    admitted_total: PerCurrency<std::sync::atomic::AtomicU64>,
    /// Texts of at least this many bytes are counted off the async worker.
    off_worker_above: usize,
}

/// The metrics of one key, through the `metrics` facade. Without an installed recorder these
/// are no-ops; install the recorder before the first limited call, since a limiter registers
/// its handles once.
pub(crate) struct KeyMetrics {
    admitted: metrics::Counter,
    tokens: metrics::Counter,
    waited: metrics::Histogram,
    timeouts: metrics::Counter,
    penalties: metrics::Counter,
    settlements: metrics::Counter,
    /// Tokens charged when calls settled above their estimate.
    settled_charged: metrics::Counter,
    /// Tokens given back when calls settled below their estimate.
    refunded: metrics::Counter,
    /// Tokens a header sync took off to reach the provider's count.
    pub(crate) lowered: metrics::Counter,
    /// Micro-dollars charged at admission (the estimated price of calls).
    spend_charged: metrics::Counter,
    /// Micro-dollars charged when calls settled above their estimated price.
    spend_settled: metrics::Counter,
    /// Micro-dollars given back when calls settled below their estimated price.
    spend_refunded: metrics::Counter,
    /// The provider's 429s, by kind.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) transient_429s: metrics::Counter,
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) permanent_429s: metrics::Counter,
    /// Usages cut to what their request could have produced.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) clamped: metrics::Counter,
    /// The modelled rate of spending elsewhere, in tokens a second.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) elsewhere_rate: metrics::Gauge,
}

impl KeyMetrics {
    fn new(key: &str) -> KeyMetrics {
        let key = key.to_owned();
        let with_key = |name: &'static str| metrics::counter!(name, "key" => key.clone());
        KeyMetrics {
            admitted: with_key("tollgate_calls_admitted_total"),
            tokens: with_key("tollgate_tokens_charged_total"),
            waited: metrics::histogram!("tollgate_wait_seconds", "key" => key.clone()),
            timeouts: with_key("tollgate_timeouts_total"),
            penalties: with_key("tollgate_penalties_total"),
            settlements: with_key("tollgate_settlements_total"),
            settled_charged: with_key("tollgate_tokens_settled_total"),
            refunded: with_key("tollgate_tokens_refunded_total"),
            lowered: with_key("tollgate_tokens_lowered_total"),
            spend_charged: with_key("tollgate_spend_charged_micros_total"),
            spend_settled: with_key("tollgate_spend_settled_micros_total"),
            spend_refunded: with_key("tollgate_spend_refunded_micros_total"),
            transient_429s: metrics::counter!("tollgate_provider_429s_total", "key" => key.clone(), "kind" => "transient"),
            permanent_429s: metrics::counter!("tollgate_provider_429s_total", "key" => key.clone(), "kind" => "permanent"),
            clamped: with_key("tollgate_usage_clamped_total"),
            elsewhere_rate: metrics::gauge!("tollgate_elsewhere_tokens_per_second", "key" => key),
        }
    }

    /// Counts what a settlement changed: refunds and charges, in tokens of the token
    /// currencies, and spend in micro-dollars.
    fn settled(&self, delta: PerCurrency<i64>) {
        self.settlements.increment(1);
        let spend = delta[Currency::Spend];
        if spend > 0 {
            self.spend_refunded.increment(spend.unsigned_abs());
        } else if spend < 0 {
            self.spend_settled.increment(spend.unsigned_abs());
        }
        for d in [delta[Currency::Tokens], delta[Currency::OutputTokens]] {
            if d > 0 {
                self.refunded.increment(d.unsigned_abs());
            } else if d < 0 {
                self.settled_charged.increment(d.unsigned_abs());
            }
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
        crate::counting::count(0, usize::MAX, || {
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

    /// Texts of at least this many bytes are counted off the async worker.
    pub(crate) fn off_worker_above(&self) -> usize {
        self.inner.off_worker_above
    }

    /// The estimator this limiter counts arguments with.
    pub fn estimator(&self) -> &Arc<dyn Estimator> {
        self.inner.estimator.get_or_init(default_estimator)
    }

    /// The tokens `args` will cost, by this limiter's estimator (see
    /// [`tollgate_estimators::estimate`] for what counts). Long arguments are counted off the
    /// async worker on a multi-threaded runtime (see
    /// [`LimiterBuilder::count_off_worker_above`](crate::LimiterBuilder::count_off_worker_above)).
    pub fn estimate<T: Serialize + ?Sized>(&self, args: &T) -> Result<Estimate, Error> {
        let estimator = self.estimator();
        crate::counting::count(
            self.off_worker_above(),
            tollgate_estimators::text_len(args),
            || Ok(tollgate_estimators::estimate(&**estimator, args)?),
        )
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

    /// Tokens came back: the line is planned again from the first waiter on (see `Line`).
    pub(crate) fn refunded(&self) {
        self.inner.line.replan();
    }

    pub(crate) fn meters(&self) -> &KeyMetrics {
        self.inner
            .meters
            .get_or_init(|| KeyMetrics::new(self.inner.label.as_deref().unwrap_or(&self.inner.key)))
    }

    fn admitted(&self, cost: Cost, waited: Duration, flight: Option<u64>) -> Permit<S> {
        let meters = self.meters();
        meters.admitted.increment(1);
        meters.tokens.increment(cost.tokens);
        if cost.spend > 0 {
            meters.spend_charged.increment(cost.spend);
        }
        meters.waited.record(waited.as_secs_f64());
        let penalties = self.inner.penalties.load(Ordering::Acquire);
        if flight.is_some() {
            self.inner.unsettled.fetch_add(1, Ordering::AcqRel);
        }
        let mut total = PerCurrency::splat(0u64);
        for (c, amount) in cost.per_currency().iter() {
            if *amount > 0 {
                total[c] = self.inner.admitted_total[c]
                    .fetch_add(*amount, Ordering::AcqRel)
                    .wrapping_add(*amount);
            }
        }
        let number = self.inner.admissions.fetch_add(1, Ordering::AcqRel) + 1;
        Permit::new(self.clone(), cost, waited, penalties, flight, total, number)
    }

    /// Admits `cost` now if every window can pay for it (on top of every call waiting), without
    /// waiting; otherwise charges nothing and answers how long until it could.
    ///
    /// It never passes ahead of calls waiting in [`acquire`](Limiter::acquire): the hint counts
    /// them. Fails at once for a cost no window can take ([`Error::CostExceedsCapacity`],
    /// [`Error::InvalidCost`]) and for store errors.
    pub async fn try_acquire(&self, cost: Cost) -> Result<Attempt<S>, Error> {
        let op = || Op::Acquire {
            cost,
            max_wait: Some(Duration::ZERO),
            fly: false,
            share: None,
        };
        // The store checks the cost; a call that never waits reads no clock of its own. A
        // store that answers at once (memory) returns before any `.await`, so that nothing of
        // its answer is kept in this future; the bounded call is boxed: it keeps the future a
        // few words long instead of the few hundred bytes of a timer and a store call, which
        // every admission would otherwise move.
        if let Some(answer) = self.inner.store.apply_now(&self.inner.bound, op()) {
            return self.attempt(cost, answer?);
        }
        let outcome = Box::pin(self.call_bounded(op())).await?;
        self.attempt(cost, outcome)
    }

    /// What a store's answer to a call that never waits means for the caller.
    fn attempt(&self, cost: Cost, outcome: Outcome) -> Result<Attempt<S>, Error> {
        match outcome {
            Outcome::Admitted => Ok(Attempt::Admitted(self.admitted(cost, Duration::ZERO, None))),
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
        self.instrumented(cost, start, deadline, false, None).await
    }

    /// Waits until every window can pay `cost`, or until `deadline`.
    ///
    /// Calls are admitted in the order they reached the store (tenants sharing a key through
    /// [`acquire_as`](Limiter::acquire_as) in fair order, each in its own arrival order). One that can't pass at once
    /// takes its place in the key's queue and sleeps until it is due (when the key can pay for
    /// it after every call ahead of it), then asks to pass: a promised ticket (see
    /// [`Op::Admit`]) was charged at that time and passes without the store's transitions; if
    /// it still can't (a call ahead was late, a penalty came in), it sleeps the store's hint
    /// plus a jitter that grows each time (see [`Backoff`](crate::Backoff)). When its turn would come after the deadline, the answer
    /// is [`Error::Timeout`] at once, with the time the call would have needed; no call returns
    /// later than its deadline, store calls included.
    ///
    /// Cancel-safe: a dropped future gives its place up and has consumed nothing.
    pub async fn acquire_until(
        &self,
        cost: Cost,
        deadline: Option<Instant>,
    ) -> Result<Permit<S>, Error> {
        self.instrumented(cost, Instant::now(), deadline, false, None)
            .await
    }

    /// Like [`acquire`](Limiter::acquire), for a tenant at a key tenants share: while calls
    /// of several tenants wait, the key's capacity goes to them in proportion to their
    /// weights, by cost, and within a tenant in arrival order (see [`Share`]). A tenant alone
    /// gets everything, exactly as [`acquire`](Limiter::acquire) would.
    ///
    /// A ticket's wait is bounded by the weights and the costs ahead of it: a call of cost
    /// `c` (in microseconds of the key's refill) of a tenant of weight `w`, finding its
    /// tenant with nothing waiting, waits at most for the tickets before it in line, the
    /// calls of each other tenant `j` of total cost up to `w_j · c / w` plus one call (and the
    /// one first in line), whoever arrives after it.
    ///
    /// ```
    /// # async fn demo() -> Result<(), tollgate::Error> {
    /// use tollgate::store::Share;
    /// use tollgate::{Cost, Limiter, Limits, MemoryStore};
    ///
    /// let org = Limiter::new("org", Limits::parse("60/10s", "20000/10s")?, MemoryStore::new())?;
    /// let quiet = Share::new("quiet", 1);
    /// let permit = org.acquire_as(&quiet, Cost::call(300)).await?;
    /// assert_eq!(permit.cost(), Cost::call(300));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn acquire_as(&self, share: &Share, cost: Cost) -> Result<Permit<S>, Error> {
        let start = Instant::now();
        let deadline = self
            .inner
            .policy
            .timeout()
            .and_then(|t| start.checked_add(t));
        self.instrumented(cost, start, deadline, false, Some(share))
            .await
    }

    /// Like [`acquire_as`](Limiter::acquire_as), until `deadline` (`None`: no deadline), as
    /// [`acquire_until`](Limiter::acquire_until) is to [`acquire`](Limiter::acquire).
    pub async fn acquire_as_until(
        &self,
        share: &Share,
        cost: Cost,
        deadline: Option<Instant>,
    ) -> Result<Permit<S>, Error> {
        self.instrumented(cost, Instant::now(), deadline, false, Some(share))
            .await
    }

    /// Waits for `cost` inside the acquire span; `fly`: remember the call as in flight.
    async fn instrumented(
        &self,
        cost: Cost,
        start: Instant,
        deadline: Option<Instant>,
        fly: bool,
        share: Option<&Share>,
    ) -> Result<Permit<S>, Error> {
        let span = tracing::debug_span!(
            "tollgate.acquire",
            key = %self.inner.key,
            requests = cost.requests,
            tokens = cost.tokens
        );
        self.wait(cost, start, deadline, fly, share)
            .instrument(span)
            .await
    }

    /// What every window of the key holds now, by currency.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        match self.call_bounded(Op::Snapshot).await? {
            Outcome::Snapshot(levels) => Ok(Snapshot::new(levels)),
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
