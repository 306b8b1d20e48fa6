//! [`Permit`]: proof that a call paid its toll, and the way to settle its estimate afterwards.

use std::time::Duration;

use super::Limiter;
use crate::bucket::flights::settlement;
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
    ) -> Permit<S> {
        Permit {
            limiter,
            cost,
            waited,
            penalties,
            flight,
        }
    }

    /// The call's number among the key's calls in flight (calls sent through the HTTP gate).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn flight(&self) -> Option<u64> {
        self.flight
    }

    /// The provider refused the call, and a sync gave its charge back in the currencies
    /// `back` and marked it done in the store: nothing is left to settle or to give back.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn refused(&mut self, back: crate::Currencies) {
        if self.flight.take().is_some() {
            self.limiter.landed();
        }
        if back.contains(crate::Currency::Requests) {
            self.cost.requests = 0;
        }
        if back.contains(crate::Currency::Tokens) {
            self.cost.tokens = 0;
        }
        if back.contains(crate::Currency::OutputTokens) {
            self.cost.output_tokens = 0;
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

    async fn settle_now(&mut self, usage: Usage, last: bool) -> Result<Settled, Error> {
        let limits = self.limiter.limits();
        let mut used = usage.per_currency();
        for c in Currency::ALL {
            if limits.of(c).is_empty() {
                used[c] = None;
            }
        }
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
        Ok(settled)
    }
}

impl<S: Store> Permit<S> {
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
            self.limiter.settle_in_background(Op::Settle {
                flight,
                charged: self.cost,
                used: PerCurrency::splat(None),
                last: true,
            });
        }
    }
}

fn clamp(amount: u128) -> i64 {
    i64::try_from(amount).unwrap_or(i64::MAX)
}
