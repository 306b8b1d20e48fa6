//! [`Permit`]: proof that a call paid its toll, and the way to settle its estimate afterwards.

use std::time::Duration;

use super::Limiter;
use crate::cost::{Cost, Usage};
use crate::error::Error;
use crate::store::{AnyStore, Op, Store};

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
    /// The limiter's count of penalties when this call was admitted.
    penalties: u64,
}

/// What settling changed, per currency: positive for a refund, negative for a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Settled {
    /// The change to every token window.
    pub tokens: i64,
    /// The change to every output-token window.
    pub output_tokens: i64,
}

fn delta(charged: u64, used: Option<u64>) -> i64 {
    let Some(used) = used else { return 0 };
    let delta = i128::from(charged) - i128::from(used);
    i64::try_from(delta).unwrap_or(if delta > 0 { i64::MAX } else { i64::MIN })
}

impl<S: Store> Permit<S> {
    pub(super) fn new(
        limiter: Limiter<S>,
        cost: Cost,
        waited: Duration,
        penalties: u64,
    ) -> Permit<S> {
        Permit {
            limiter,
            cost,
            waited,
            penalties,
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
    /// assert_eq!(limiter.snapshot().await?[0].tokens.whole(), 580);
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
    /// A call admitted before a [`penalize`](Limiter::penalize) in this process is refunded
    /// an overestimate but not charged its shortfall: the provider's 429 already counted it,
    /// and the penalty emptied the windows, so charging it again would count it twice.
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
    pub async fn settle_usage(self, usage: Usage) -> Result<Settled, Error> {
        let limits = self.limiter.limits();
        let mut usage = usage;
        if self.limiter.penalized_since(self.penalties) {
            usage.tokens = usage.tokens.map(|t| t.min(self.cost.tokens));
            usage.output_tokens = usage.output_tokens.map(|t| t.min(self.cost.output_tokens));
        }
        let settled = Settled {
            tokens: if limits.tokens().is_empty() {
                0
            } else {
                delta(self.cost.tokens, usage.tokens)
            },
            output_tokens: if limits.output_tokens().is_empty() {
                0
            } else {
                delta(self.cost.output_tokens, usage.output_tokens)
            },
        };
        if settled == Settled::default() {
            return Ok(settled);
        }
        self.limiter
            .call_bounded(Op::Adjust {
                requests: 0,
                tokens: settled.tokens,
                output_tokens: settled.output_tokens,
            })
            .await?;
        self.limiter.meters().settlements.increment(1);
        if settled.tokens > 0 || settled.output_tokens > 0 {
            self.limiter.refunded();
        }
        Ok(settled)
    }
}
