//! [`Limiter`] and [`Permit`]: acquire, wait, settle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::bucket::{Available, Buckets, Cost, Decision};
use crate::error::Error;
use crate::rate::Limits;
use crate::store::{AnyStore, Store};

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
    /// Held by the waiter at the head of the queue; tokio's mutex is fair (FIFO).
    queue: tokio::sync::Mutex<()>,
    waiters: AtomicUsize,
    /// Counts calls, so that the registry can tell a key that went quiet without a clock read
    /// on the hot path.
    uses: AtomicU64,
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
}

/// Keeps the waiter count right however the wait ends, including when the future is dropped.
struct WaiterSlot<'a>(&'a AtomicUsize);

impl Drop for WaiterSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
        let key = key.into();
        if limits.is_empty() {
            return Err(Error::NoLimits { key });
        }
        Ok(Limiter {
            inner: Arc::new(Inner {
                key,
                limits,
                store,
                policy,
                queue: tokio::sync::Mutex::new(()),
                waiters: AtomicUsize::new(0),
                uses: AtomicU64::new(0),
            }),
        })
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
