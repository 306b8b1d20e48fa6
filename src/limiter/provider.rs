//! What a provider's answers do to a limiter: its 429s (a pause, and the windows they say are
//! spent), its `remaining` counts and header syncs, and the calls in flight that the HTTP gate
//! settles once the provider has counted them. A limiter used without a provider's answers
//! never needs any of it; `tollgate::http` uses all of it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Limiter, Permit, unexpected};
use crate::bucket::SyncArgs;
use crate::bucket::flights::Cover;
use crate::cost::Cost;
use crate::error::Error;
use crate::rate::{Currencies, Currency, PerCurrency};
use crate::store::{Op, Outcome, Store};

impl<S: Store> Limiter<S> {
    /// What a provider's 429 means for this key: empties its windows (every currency a
    /// provider counts; a spend budget is counted here alone, and a refusal spends none of it)
    /// and admits nothing on it for `retry_after`, for every waiter (and, on a shared store,
    /// every process). A longer pause already in force wins. See
    /// [`parse_retry_after`](crate::parse_retry_after) for the header.
    pub async fn penalize(&self, retry_after: Duration) -> Result<(), Error> {
        self.penalize_spent(retry_after, Currencies::PROVIDER).await
    }

    /// Like [`penalize`](Limiter::penalize), but empties only the windows of the `spent`
    /// currencies: a 429 whose headers say requests are left while tokens are not must not
    /// throw the requests away. Nothing passes during the pause either way.
    ///
    /// Calls admitted before the penalty were counted by the provider's refusal: one that
    /// later settles above its estimate draws on what the penalty emptied before it is charged
    /// (never more than that), so that it is not counted twice.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Cost, Currencies, Currency, Limiter, Limits};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// let limiter = Limiter::builder("k", Limits::parse("100/m", "10000/m")?).build()?;
    /// limiter.acquire(Cost::call(9_000)).await?;
    /// let tokens = Currencies::NONE.with(Currency::Tokens);
    /// limiter.penalize_spent(Duration::from_secs(1), tokens).await?;
    /// let snapshot = limiter.snapshot().await?;
    /// assert_eq!(snapshot.tokens().unwrap().whole(), 0);
    /// assert_eq!(snapshot.requests().unwrap().whole(), 99);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn penalize_spent(
        &self,
        retry_after: Duration,
        spent: Currencies,
    ) -> Result<(), Error> {
        self.penalty(retry_after, spent, None).await
    }

    /// A 429 on the call `refusal` describes (or, `None`, on a call nobody knows): the key is
    /// paused, the windows of the `spent` currencies come down to where the provider's are
    /// (see [`Op::Penalize`]), and the pause is answered.
    ///
    /// The pause is `base` (the provider's own, where it gave one) for the first 429 in a row
    /// on this key in this process; each further one before an answer that is not a 429
    /// ([`answered`](Limiter::answered)) doubles it, with jitter (0.8 to 1.2 of it, never below
    /// `base`), up to a minute (or `base`, if longer). A base of nothing (`retry-after: 0`)
    /// grows from the limiter's backoff base instead. Consecutive 429s mean the key's picture
    /// of the provider is wrong in a way its counts can't fix (another program spending, a
    /// provider slower to refill than it says): growing pauses bound what that costs.
    ///
    /// A strike is an episode, not an answer: the refusal of a call admitted (permit `number`)
    /// before the last strike was counted belongs to it (calls in flight together, refused
    /// together, are one mistake the first refusal corrected), and pauses as long as it did.
    pub(crate) async fn refused(
        &self,
        base: Duration,
        spent: Currencies,
        refusal: Option<crate::store::Refusal>,
        number: u64,
    ) -> Result<Duration, Error> {
        let same_episode = number > 0 && number <= self.inner.strike_mark.load(Ordering::Acquire);
        let strikes = if same_episode {
            self.inner.strikes.load(Ordering::Acquire).saturating_sub(1)
        } else {
            let admitted = self.inner.admissions.load(Ordering::Acquire);
            self.inner.strike_mark.fetch_max(admitted, Ordering::AcqRel);
            self.inner.strikes.fetch_add(1, Ordering::AcqRel)
        };
        let base = if strikes > 0 {
            base.max(self.policy().backoff().base())
        } else {
            base
        };
        let pause = backed_off(base, strikes, rand::Rng::random::<f64>(&mut rand::rng()));
        self.penalty(pause, spent, refusal).await?;
        Ok(pause)
    }

    /// The provider answered a call of this key with something other than a 429: the next
    /// 429 starts the backoff of [`refused`](Limiter::refused) again from the provider's hint.
    pub(crate) fn answered(&self) {
        self.inner.strikes.store(0, Ordering::Release);
    }

    /// What this limiter admitted since it was made, per currency.
    pub(crate) fn admitted_total(&self) -> PerCurrency<u64> {
        PerCurrency::from_fn(|c| self.inner.admitted_total[c].load(Ordering::Acquire))
    }

    async fn penalty(
        &self,
        retry_after: Duration,
        spent: Currencies,
        refusal: Option<crate::store::Refusal>,
    ) -> Result<(), Error> {
        let emptied = match self
            .call_bounded(Op::Penalize {
                pause: retry_after,
                spent,
                refusal,
            })
            .await?
        {
            Outcome::Emptied(emptied) => emptied,
            // A custom store that empties without counting what it took: nothing to cover.
            Outcome::Done => PerCurrency::default(),
            other => return Err(unexpected(&other)),
        };
        let penalty = self.inner.penalties.fetch_add(1, Ordering::AcqRel) + 1;
        *self
            .inner
            .cover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Cover {
            tokens: emptied,
            // Permits are numbered by the penalties before them: this one covers those
            // admitted before it.
            upto: penalty - 1,
        };
        self.meters().penalties.increment(1);
        self.inner.line.replan();
        tracing::warn!(key = %self.inner.key, ?retry_after, "the provider refused a call; pausing the key");
        Ok(())
    }

    /// Takes what a permit admitted after `penalties` penalties may leave uncharged of a
    /// `shortfall` in `currency`: what a later penalty emptied, as far as it goes (the
    /// [`Cover`] rule, as the store's ledger applies it to calls in flight).
    pub(crate) fn covered(&self, penalties: u64, currency: Currency, shortfall: u64) -> u64 {
        self.inner
            .cover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .draw(penalties, currency, shortfall)
    }

    /// Adds `delta` to every window of each currency: a positive amount is a refund (never
    /// above a window's capacity), a negative one a charge, which may leave windows in debt
    /// (down to the store's floor of 64 bursts). For corrections a program knows of and the
    /// limiter doesn't: spending it learned of elsewhere, or a debt carried over from other
    /// limits.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{Currency, Limiter, Limits, MemoryStore, PerCurrency};
    ///
    /// let limiter = Limiter::new("carry", Limits::parse("", "100/h")?, MemoryStore::new())?;
    /// let mut delta = PerCurrency::default();
    /// delta[Currency::Tokens] = -150;
    /// limiter.adjust(delta).await?;
    /// let tokens = limiter.snapshot().await?.least(Currency::Tokens).unwrap();
    /// assert_eq!(tokens.whole(), -50);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn adjust(&self, delta: PerCurrency<i64>) -> Result<(), Error> {
        match self.call_bounded(Op::Adjust { delta }).await? {
            Outcome::Done => {
                self.refunded();
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Lowers what the windows of `currency` hold to at most `remaining` (what a provider's
    /// `remaining` header says is left); never raises them, since calls in flight are charged
    /// here and not yet counted there. Answers how many whole tokens the window closest to
    /// `remaining` held above it (what was taken off), or, negative, below it.
    pub async fn lower(&self, currency: Currency, remaining: u64) -> Result<i64, Error> {
        match self
            .call_bounded(Op::Lower {
                currency,
                remaining,
            })
            .await?
        {
            Outcome::Lowered(tokens) => {
                if tokens > 0 {
                    self.meters().lowered.increment(tokens.unsigned_abs());
                }
                Ok(tokens)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// A header sync on the store (see [`SyncArgs`]).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) async fn sync(&self, args: SyncArgs) -> Result<crate::store::Synced, Error> {
        match self.call_bounded(Op::Sync(Box::new(args))).await? {
            Outcome::Synced(synced) => {
                let lowered: u64 = synced
                    .lowered
                    .iter()
                    .filter(|(c, _)| *c != Currency::Spend)
                    .map(|(_, t)| *t)
                    .sum();
                if lowered > 0 {
                    self.meters().lowered.increment(lowered);
                }
                if synced.returned.iter().any(|(_, r)| *r > 0) {
                    self.refunded();
                }
                Ok(*synced)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// A permit that will settle went away (settled for the last time, or dropped).
    pub(crate) fn landed(&self) {
        self.inner.unsettled.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether calls that will still settle are in flight: refunds may come.
    pub(crate) fn refunds_may_come(&self) -> bool {
        self.inner.unsettled.load(Ordering::Acquire) > 0
    }

    /// Like [`acquire_timeout`](Limiter::acquire_timeout), for a call that goes out through the
    /// HTTP gate: the store remembers it as in flight (so that header syncs, in every process,
    /// know it was sent and not yet counted by the provider) until its permit settles for the
    /// last time or is dropped.
    /// Like [`acquire_flight`](Limiter::acquire_flight), but only if every window can pay now
    /// (on top of every call waiting): otherwise nothing is charged, and [`Error::Timeout`] says
    /// how long the call would wait. Waits for the store's answer (within the store's own
    /// timeout), never in line.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) async fn acquire_flight_now(&self, cost: Cost) -> Result<Permit<S>, Error> {
        let start = Instant::now();
        let op = Op::Acquire {
            cost,
            max_wait: Some(Duration::ZERO),
            fly: true,
            share: None,
        };
        let outcome = self.call_bounded(op).await?;
        if let Some(permit) = self.passed(&outcome, cost, Duration::ZERO) {
            return Ok(permit);
        }
        match outcome {
            Outcome::NotYet(needed) => Err(self.timeout(start, Some(needed))),
            other => Err(unexpected(&other)),
        }
    }

    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) async fn acquire_flight(
        &self,
        cost: Cost,
        timeout: Option<Duration>,
        share: Option<&crate::store::Share>,
    ) -> Result<Permit<S>, Error> {
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        self.instrumented(cost, start, deadline, true, share).await
    }
}

/// The longest pause consecutive 429s grow to (unless the provider's own is longer).
const MOST_PAUSE: Duration = Duration::from_secs(60);

/// The pause of a 429 after `strikes` others in a row: `hint` for the first, then
/// `hint · 2^strikes` times a jitter of 0.8 to 1.2 (`draw` in `[0, 1]` picks it), never below
/// `hint`, and no more than [`MOST_PAUSE`] (or `hint`, if longer).
pub(crate) fn backed_off(hint: Duration, strikes: u32, draw: f64) -> Duration {
    if strikes == 0 {
        return hint;
    }
    let draw = if draw.is_finite() {
        draw.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let factor = f64::from(1u32 << strikes.min(20)) * (0.8 + 0.4 * draw);
    let most = MOST_PAUSE.max(hint);
    let grown = Duration::try_from_secs_f64(hint.as_secs_f64() * factor).unwrap_or(most);
    grown.clamp(hint, most)
}
