//! [`Permit`]: proof that a call paid its toll, and the way to settle its estimate afterwards.

use std::time::Duration;

use super::Limiter;
use crate::bucket::flights::settlement;
use crate::bucket::{SyncArgs, Synced};
use crate::cost::{Cost, Usage};
use crate::error::Error;
use crate::rate::{Currency, PerCurrency};
use crate::store::{AnyStore, Op, Outcome, Store};

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
///
/// Dropping it without settling keeps what was charged (the estimate).
#[derive(Debug)]
pub struct Permit<S: Store = AnyStore> {
    limiter: Limiter<S>,
    cost: Cost,
    waited: Duration,
    /// The limiter's count of penalties when this call was admitted.
    penalties: u64,
    /// The call's number among the key's calls in flight, until it settles for the last time
    /// (calls that went out through the HTTP gate).
    flight: Option<u64>,
    /// What the limiter had admitted, per currency, once this call was (in the currencies it
    /// paid): what went out after it is the difference.
    admitted_total: PerCurrency<u64>,
    /// When it was admitted, for a call in flight (its windows refilled from then); a plain
    /// permit reads no clock for it.
    admitted: Option<tokio::time::Instant>,
    /// Its number among the limiter's admissions (0: not numbered).
    number: u64,
    /// How long after its admission the provider counted it, when known better than half the
    /// time until it settles (the HTTP gate reads it from the answer's head).
    counted_after: Option<Duration>,
}

/// What settling changed, per currency: positive for a refund, negative for a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Settled {
    /// The change to every token window.
    pub tokens: i64,
    /// The change to every output-token window.
    pub output_tokens: i64,
    /// The change to every spend window, in micro-dollars.
    pub spend: i64,
}

impl<S: Store> Permit<S> {
    pub(super) fn new(
        limiter: Limiter<S>,
        cost: Cost,
        waited: Duration,
        penalties: u64,
        flight: Option<u64>,
        admitted_total: PerCurrency<u64>,
        number: u64,
    ) -> Permit<S> {
        Permit {
            limiter,
            cost,
            waited,
            penalties,
            flight,
            admitted_total,
            admitted: flight.map(|_| tokio::time::Instant::now()),
            counted_after: None,
            number,
        }
    }

    /// Its number among its limiter's admissions (see [`Limiter::refused`]).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn number(&self) -> u64 {
        self.number
    }

    /// How long after its admission the provider counted this call: where a sync has not
    /// said, its settlement credits the refill its windows had alone until then (see
    /// [`Op::Settle`]). Without it, half the time from the admission to the settlement.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn counted_after(&mut self, after: Duration) {
        self.counted_after = Some(after);
    }

    fn counted_by_now(&self) -> Duration {
        self.counted_after
            .or_else(|| self.admitted.map(|at| at.elapsed() / 2))
            .unwrap_or_default()
    }

    /// What this limiter admitted after this call, per currency (in the currencies it paid).
    pub(crate) fn admitted_since(&self) -> PerCurrency<u64> {
        let now = self.limiter.admitted_total();
        PerCurrency::from_fn(|c| {
            if self.cost.of(c) == 0 {
                0
            } else {
                now[c].wrapping_sub(self.admitted_total[c])
            }
        })
    }

    /// The provider answered this call 429: the key is paused, and the windows of the
    /// currencies a provider counts come down to where the provider's are. `retry_after` is
    /// the provider's own pause, if it gave one (else a second): the pause of the first 429 in
    /// a row on the key; each further one before another answer doubles it, with jitter (0.8
    /// to 1.2 of it, never below the provider's), up to a minute. Answers how long to wait
    /// before the call goes again; the retry pays its own toll.
    ///
    /// With the provider's pause, the key's windows hold what this call needed exactly when
    /// it ends, less what went out after it; without one, they are emptied. Either way a 429
    /// never raises a window, whatever the provider's refusals cost it there (OpenAI and Gemini
    /// count refused requests).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Cost, Limiter, Limits};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// let limiter = Limiter::builder("k", Limits::parse("6/s", "")?).build()?;
    /// let permit = limiter.acquire(Cost::call(0)).await?;
    /// // The provider refused it, and will take it again in 300 ms.
    /// let pause = permit.rate_limited(Some(Duration::from_millis(300))).await?;
    /// assert_eq!(pause, Duration::from_millis(300));
    /// // Its request window holds one request when the pause ends, not the 1.8 it would have
    /// // refilled meanwhile: the provider counted its refusals.
    /// tokio::time::sleep(pause).await;
    /// assert_eq!(limiter.snapshot().await?.requests().unwrap().whole(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn rate_limited(&self, retry_after: Option<Duration>) -> Result<Duration, Error> {
        let refusal = retry_after.map(|hint| {
            let refusal = crate::store::Refusal::new(hint, self.cost, self.admitted_since());
            match self.flight {
                Some(flight) => refusal.of_flight(flight),
                None => refusal,
            }
        });
        self.limiter
            .refused(
                retry_after.unwrap_or(UNSAID_PAUSE),
                crate::rate::Currencies::PROVIDER,
                refusal,
                self.number,
            )
            .await
    }

    /// The call's number among the key's calls in flight (calls sent through the HTTP gate).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn flight(&self) -> Option<u64> {
        self.flight
    }

    /// The provider refused the call, and a sync marked it done in the store: nothing is left
    /// to settle (its charge stays: a 429 never raises a window).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn refused(&mut self) {
        if self.flight.take().is_some() {
            self.limiter.landed();
        }
    }

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

    /// Settles the token estimate against the tokens the response says were used: a call that
    /// used more is charged the difference (the token windows may go into debt, so later calls
    /// pay for the underestimate); one that used less is refunded it (never above capacity).
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
    /// assert_eq!(limiter.snapshot().await?.windows()[0].tokens.whole(), 580);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn settle(self, actual_tokens: u64) -> Result<i64, Error> {
        Ok(self
            .settle_usage(Usage::tokens(actual_tokens))
            .await?
            .tokens)
    }

    /// Settles every currency the usage reports (tokens, output tokens) against what was
    /// charged for it; a currency the usage leaves out stays as charged.
    ///
    /// A call admitted before a [`penalize`](Limiter::penalize) in this process was counted
    /// by the provider's refusal, and the penalty emptied the windows: an overestimate is
    /// refunded, and a shortfall is charged only beyond what the penalty emptied (so that it
    /// is not counted twice, and never left uncharged beyond what the penalty took).
    ///
    /// ```
    /// use tollgate::{Cost, Limiter, Limits, Usage};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// let limits = Limits::parse("", "10000/m")?.with_output_tokens("4000/m".parse::<tollgate::Rates>()?);
    /// let limiter = Limiter::builder("anthropic", limits).build()?;
    /// // 1,200 input tokens, and the 1,024 output tokens that max_tokens reserves.
    /// let permit = limiter.acquire(Cost::call(1_200).with_output_tokens(1_024)).await?;
    /// let settled = permit.settle_usage(Usage::tokens(1_180).with_output_tokens(310)).await?;
    /// assert_eq!((settled.tokens, settled.output_tokens), (20, 714));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn settle_usage(mut self, usage: Usage) -> Result<Settled, Error> {
        self.settle_now(usage, true).await
    }

    /// Settles part of the usage before the call ends: a stream that reports its input at the
    /// start (Anthropic's `message_start`) settles the input then, and the output at the end
    /// with [`settle_usage`](Permit::settle_usage). The permit's cost becomes what was used in
    /// the currencies settled.
    pub async fn settle_part(&mut self, usage: Usage) -> Result<Settled, Error> {
        self.settle_now(usage, false).await
    }

    /// Settles the call as done with `usage` in the same store step as `sync`, the header
    /// sync of its answer (one round trip to a remote store instead of two): answers what the
    /// sync found, and what settling changed. A permit that is not a call in flight syncs,
    /// then settles, apart.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) async fn sync_and_settle(
        mut self,
        sync: SyncArgs,
        usage: Usage,
    ) -> Result<(Synced, Settled), Error> {
        let Some(flight) = self.flight else {
            let synced = self.limiter.sync(sync).await?;
            let settled = self.settle_now(usage, true).await?;
            return Ok((synced, settled));
        };
        let used = self.used(usage);
        self.flight = None;
        self.limiter.landed();
        let sync = SyncArgs {
            flight,
            charged: self.cost,
            settle: Some(used),
            ..sync
        };
        let mut synced = self.limiter.sync(sync).await?;
        let Some(delta) = synced.settled.take() else {
            return Err(super::unexpected(&Outcome::Synced(Box::new(synced))));
        };
        Ok((synced, self.settled(used, delta)))
    }

    /// `usage` per currency, left out (as charged) where the limits have no window.
    fn used(&self, usage: Usage) -> PerCurrency<Option<u64>> {
        let limits = self.limiter.limits();
        let mut used = usage.per_currency();
        for c in Currency::ALL {
            if limits.of(c).is_empty() {
                used[c] = None;
            }
        }
        used
    }

    async fn settle_now(&mut self, usage: Usage, last: bool) -> Result<Settled, Error> {
        let used = self.used(usage);
        let delta = match self.flight {
            Some(flight) => {
                if last {
                    self.flight = None;
                    self.limiter.landed();
                }
                let op = Op::Settle {
                    flight,
                    charged: self.cost,
                    used,
                    last,
                    counted_after: self.counted_by_now(),
                };
                match self.limiter.call_bounded(op).await? {
                    Outcome::Settled(delta) => delta,
                    other => return Err(super::unexpected(&other)),
                }
            }
            None => {
                let charged = self.cost.per_currency();
                let mut delta = PerCurrency::splat(0i64);
                for c in Currency::ALL {
                    let Some(used) = used[c] else { continue };
                    delta[c] = settlement(charged[c], used, |shortfall| {
                        self.limiter.covered(self.penalties, c, shortfall)
                    });
                }
                if delta != PerCurrency::default() {
                    self.limiter.call_bounded(Op::Adjust { delta }).await?;
                }
                delta
            }
        };
        Ok(self.settled(used, delta))
    }

    /// After settling `used` with `delta` (what changed): the permit's cost is what was used,
    /// and the meters count it.
    fn settled(&mut self, used: PerCurrency<Option<u64>>, delta: PerCurrency<i64>) -> Settled {
        let mut cost = self.cost.per_currency();
        for c in Currency::ALL {
            if let Some(used) = used[c] {
                cost[c] = used;
            }
        }
        self.cost = Cost::from_per_currency(cost);
        let settled = Settled {
            tokens: delta[Currency::Tokens],
            output_tokens: delta[Currency::OutputTokens],
            spend: delta[Currency::Spend],
        };
        if settled != Settled::default() {
            self.limiter.meters().settled(delta);
        }
        if delta.iter().any(|(_, d)| *d > 0) {
            self.limiter.refunded();
        }
        settled
    }
}

impl<S: Store> Permit<S> {
    /// The header sync `sync` of the call's answer, and its settlement as charged, in one
    /// step, in the background (a call dropped before its whole answer was read).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn sync_in_background(mut self, sync: SyncArgs) {
        let Some(flight) = self.flight.take() else {
            return;
        };
        self.limiter.landed();
        self.limiter
            .settle_in_background(Op::Sync(Box::new(SyncArgs {
                flight,
                charged: self.cost,
                settle: Some(PerCurrency::splat(None)),
                ..sync
            })));
    }

    /// The call never went out: everything it was charged comes back (and, in flight, it is
    /// done). In the background, on a remote store.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn give_back(mut self) {
        let cost = self.cost;
        match self.flight.take() {
            Some(flight) => {
                self.limiter.landed();
                self.limiter.settle_in_background(Op::Settle {
                    flight,
                    charged: cost,
                    used: PerCurrency::splat(Some(0)),
                    last: true,
                    counted_after: Duration::ZERO,
                });
            }
            None => self.limiter.settle_in_background(Op::Adjust {
                delta: cost.per_currency().map(|c| clamp(u128::from(c))),
            }),
        }
        self.limiter.refunded();
    }
}

impl<S: Store> Drop for Permit<S> {
    fn drop(&mut self) {
        // A call in flight that never settled keeps its estimate, and is done.
        if let Some(flight) = self.flight.take() {
            self.limiter.landed();
            let counted_after = self.counted_by_now();
            self.limiter.settle_in_background(Op::Settle {
                flight,
                charged: self.cost,
                used: PerCurrency::splat(None),
                last: true,
                counted_after,
            });
        }
    }
}

/// The pause of a 429 that does not say when to come back.
const UNSAID_PAUSE: Duration = Duration::from_secs(1);

fn clamp(amount: u128) -> i64 {
    i64::try_from(amount).unwrap_or(i64::MAX)
}
