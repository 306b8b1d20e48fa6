//! The bucket arithmetic: exact, pure, with time passed in.
//!
//! A bucket of rate `N/P burst B` holds `T` tokens at its last update and follows
//! `T = min(B, T + (N/P)·elapsed)`; a cost `c` is admitted only when `T ≥ c`.
//!
//! # Exactness
//!
//! Tokens are kept in *units* of `1/P` of a token, where `P` is the period in nanoseconds. One
//! nanosecond then refills exactly `N` units, a token is exactly `P` units, and every quantity
//! is an integer: `0.25 s` at `2/s` is `2 · 250_000_000 = 500_000_000` units, exactly half of
//! `P = 1_000_000_000`. The state lives in an `i128`; periods are capped at 2^63 − 1 ns so that
//! `B · P` always fits. Every decision is the one exact rational arithmetic gives, and the hint
//! on a refusal is the exact number of nanoseconds (rounded up) until the tokens exist.
//!
//! Nothing here reads a clock or does I/O; the stores call it with the time they trust.

use std::fmt;
use std::time::Duration;

use crate::rate::{Currency, Limits, Rate};

/// A point in time, in nanoseconds since the origin of the clock that produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Nanos(pub u64);

impl Nanos {
    /// The instant `duration` after the origin (saturating at `u64::MAX` ns).
    pub fn from_duration(duration: Duration) -> Nanos {
        Nanos(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The time since the origin.
    pub fn as_duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_duration())
    }
}

/// What one call pays: requests (normally 1) and tokens (the estimate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cost {
    /// Charged to every request window.
    pub requests: u64,
    /// Charged to every token window.
    pub tokens: u64,
}

impl Cost {
    /// One request carrying `tokens` tokens: the cost of an ordinary call.
    pub const fn call(tokens: u64) -> Cost {
        Cost {
            requests: 1,
            tokens,
        }
    }

    /// Explicit amounts of both currencies.
    pub const fn new(requests: u64, tokens: u64) -> Cost {
        Cost { requests, tokens }
    }

    /// The amount of one currency.
    pub fn of(&self, currency: Currency) -> u64 {
        match currency {
            Currency::Requests => self.requests,
            Currency::Tokens => self.tokens,
        }
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} requests + {} tokens", self.requests, self.tokens)
    }
}

/// An exact amount of tokens: `units / scale`, where `scale` is the period in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Tokens {
    units: i128,
    scale: u64,
}

impl Tokens {
    /// `units / scale` tokens (`scale` must be positive; 0 is read as 1).
    pub fn from_units(units: i128, scale: u64) -> Tokens {
        Tokens {
            units,
            scale: scale.max(1),
        }
    }

    /// The numerator over [`scale`](Tokens::scale).
    pub fn units(&self) -> i128 {
        self.units
    }

    /// The denominator: units per token.
    pub fn scale(&self) -> u64 {
        self.scale
    }

    /// Whole tokens, rounded down (negative when the bucket is in debt).
    pub fn whole(&self) -> i128 {
        self.units.div_euclid(i128::from(self.scale))
    }

    /// True when the amount is exactly `numerator / denominator` tokens.
    ///
    /// ```
    /// use tollgate::bucket::{Bucket, Nanos};
    ///
    /// let mut bucket = Bucket::new("2/s burst 3".parse()?, Nanos(0));
    /// for _ in 0..3 {
    ///     bucket.try_take(Nanos(0), 1)?;
    /// }
    /// assert!(bucket.tokens_at(Nanos(250_000_000))?.is(1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is(&self, numerator: i128, denominator: u64) -> bool {
        // Both sides are below 2^127 / 2^64 · 2^64 only for sane inputs; widen through checked
        // multiplication so that an overflow reads as "not equal" instead of wrapping.
        match (
            self.units.checked_mul(i128::from(denominator)),
            numerator.checked_mul(i128::from(self.scale)),
        ) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    /// The amount as a float, for display only.
    pub fn as_f64(&self) -> f64 {
        self.units as f64 / self.scale as f64
    }
}

impl PartialEq for Tokens {
    fn eq(&self, other: &Tokens) -> bool {
        self.is(other.units, other.scale)
    }
}

impl fmt::Display for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_f64())
    }
}

/// The answer to a request for tokens: admitted, or the exact wait until it could be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Every bucket paid.
    Admitted,
    /// Nothing was charged; every bucket could pay after this long, if nothing else is charged
    /// meanwhile.
    NotYet(Duration),
}

impl Decision {
    /// True for [`Decision::Admitted`].
    pub fn is_admitted(&self) -> bool {
        matches!(self, Decision::Admitted)
    }
}

/// Input the arithmetic refuses. None of these changes any state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    /// A cost of zero in a currency that has windows: a call always pays something.
    #[error("a cost of 0 {currency} is invalid; a call pays at least 1")]
    ZeroCost {
        /// The currency whose cost was zero.
        currency: Currency,
    },
    /// A cost larger than a window's burst: no amount of waiting could admit it.
    #[error(
        "a cost of {cost} {currency} exceeds the capacity {} of the {currency} window `{rate}`; waiting cannot help: raise the burst or split the call",
        rate.burst()
    )]
    CostExceedsCapacity {
        /// The currency of the window.
        currency: Currency,
        /// The window that is too small.
        rate: Rate,
        /// The cost that was asked for.
        cost: u64,
    },
    /// A time earlier than the bucket's last update.
    #[error("time went backwards: {now} is before the last update at {last}")]
    TimeWentBackwards {
        /// The last update.
        last: Nanos,
        /// The time that was passed in.
        now: Nanos,
    },
}

/// One window's state.
///
/// ```
/// use std::time::Duration;
/// use tollgate::bucket::{Bucket, Decision, Nanos};
///
/// let mut bucket = Bucket::new("2/s burst 3".parse()?, Nanos(0));
/// assert_eq!(bucket.try_take(Nanos(0), 3)?, Decision::Admitted);
/// assert_eq!(
///     bucket.try_take(Nanos(0), 1)?,
///     Decision::NotYet(Duration::from_millis(500))
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: Rate,
    /// Tokens in units of 1/P; negative when in debt.
    level: i128,
    last: Nanos,
}

impl Bucket {
    /// A full bucket at `now`.
    pub fn new(rate: Rate, now: Nanos) -> Bucket {
        let mut bucket = Bucket {
            rate,
            level: 0,
            last: now,
        };
        bucket.level = bucket.capacity_units();
        bucket
    }

    /// The window this bucket enforces.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// When the state was last brought up to date.
    pub fn last_update(&self) -> Nanos {
        self.last
    }

    fn scale(&self) -> i128 {
        i128::from(self.rate.period_nanos())
    }

    fn capacity_units(&self) -> i128 {
        i128::from(self.rate.burst()) * self.scale()
    }

    fn elapsed(&self, now: Nanos) -> Result<u64, BucketError> {
        now.0
            .checked_sub(self.last.0)
            .ok_or(BucketError::TimeWentBackwards {
                last: self.last,
                now,
            })
    }

    /// The level at `now`, refilled and saturated, without changing the state.
    fn level_at(&self, now: Nanos) -> Result<i128, BucketError> {
        let elapsed = self.elapsed(now)?;
        let cap = self.capacity_units();
        let room = cap - self.level;
        if room <= 0 {
            return Ok(self.level.min(cap));
        }
        let gain = i128::from(elapsed).checked_mul(i128::from(self.rate.amount()));
        Ok(match gain {
            Some(gain) if gain < room => self.level + gain,
            _ => cap,
        })
    }

    /// The exact number of tokens available at `now`.
    pub fn tokens_at(&self, now: Nanos) -> Result<Tokens, BucketError> {
        Ok(Tokens {
            units: self.level_at(now)?,
            scale: self.rate.period_nanos(),
        })
    }

    /// True when the bucket is at its capacity at `now`: its state carries no information and
    /// may be forgotten.
    pub fn is_full(&self, now: Nanos) -> bool {
        self.level_at(now)
            .is_ok_and(|level| level >= self.capacity_units())
    }

    /// Checks `cost` against the rate alone, before any time is involved.
    pub fn validate(rate: &Rate, currency: Currency, cost: u64) -> Result<(), BucketError> {
        if cost == 0 {
            return Err(BucketError::ZeroCost { currency });
        }
        if cost > rate.burst() {
            return Err(BucketError::CostExceedsCapacity {
                currency,
                rate: *rate,
                cost,
            });
        }
        Ok(())
    }

    /// How long until `cost` tokens exist, given `level` units now: zero when they already do.
    fn wait_for(&self, level: i128, cost: u64) -> Duration {
        let needed = i128::from(cost) * self.scale();
        if level >= needed {
            return Duration::ZERO;
        }
        let deficit = needed - level;
        let amount = i128::from(self.rate.amount());
        let nanos = (deficit + amount - 1) / amount;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Brings the state up to `now` (which keeps the value: refilling is not spending).
    fn advance(&mut self, now: Nanos) -> Result<(), BucketError> {
        self.level = self.level_at(now)?;
        self.last = now;
        Ok(())
    }

    /// Takes `cost` at `now` if the bucket holds it; otherwise answers how long until it would.
    ///
    /// A cost of zero or above the burst is an error, and so is a `now` before the last update;
    /// errors leave the state untouched.
    pub fn try_take(&mut self, now: Nanos, cost: u64) -> Result<Decision, BucketError> {
        Bucket::validate(&self.rate, Currency::Tokens, cost)?;
        self.advance(now)?;
        let wait = self.wait_for(self.level, cost);
        if wait.is_zero() {
            self.level -= i128::from(cost) * self.scale();
            Ok(Decision::Admitted)
        } else {
            Ok(Decision::NotYet(wait))
        }
    }

    /// Adds `delta` tokens (positive: a refund, never above capacity; negative: a charge that may
    /// put the bucket into debt, so that later calls pay for an underestimate).
    pub fn adjust(&mut self, now: Nanos, delta: i64) -> Result<(), BucketError> {
        self.advance(now)?;
        let delta = i128::from(delta).saturating_mul(self.scale());
        // The floor keeps any debt repayable within about 292 years of refill.
        let floor = -self.capacity_units().saturating_mul(1 << 20);
        self.level = self
            .level
            .saturating_add(delta)
            .clamp(floor, self.capacity_units());
        Ok(())
    }

    /// Empties the bucket at `now`: what a provider's 429 says about our estimate of it.
    pub fn drain(&mut self, now: Nanos) -> Result<(), BucketError> {
        self.advance(now)?;
        self.level = self.level.min(0);
        Ok(())
    }
}

/// Every window of one key, paid all-or-nothing.
///
/// ```
/// use std::time::Duration;
/// use tollgate::bucket::{Buckets, Decision, Nanos};
/// use tollgate::{Cost, Limits};
///
/// let limits = Limits::parse("2/s", "100/s")?;
/// let mut buckets = Buckets::new(&limits, Nanos(0));
/// assert_eq!(buckets.try_take(Nanos(0), Cost::call(80))?, Decision::Admitted);
/// // The request bucket could pay, the token bucket can't: neither is charged.
/// assert_eq!(
///     buckets.try_take(Nanos(0), Cost::call(50))?,
///     Decision::NotYet(Duration::from_millis(300))
/// );
/// let now = buckets.snapshot(Nanos(0))?;
/// assert_eq!((now[0].tokens.whole(), now[1].tokens.whole()), (1, 20));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Buckets {
    buckets: Vec<(Currency, Bucket)>,
    /// No call passes before this instant: a provider said 429 with a Retry-After.
    paused_until: Nanos,
}

impl Buckets {
    /// Full buckets for every window of `limits`, at `now`.
    pub fn new(limits: &Limits, now: Nanos) -> Buckets {
        let windows = |currency| {
            limits
                .of(currency)
                .as_slice()
                .iter()
                .map(move |rate| (currency, Bucket::new(*rate, now)))
        };
        Buckets {
            buckets: windows(Currency::Requests)
                .chain(windows(Currency::Tokens))
                .collect(),
            paused_until: Nanos(0),
        }
    }

    /// Checks a cost against every window, before any time is involved: a zero cost in a
    /// limited currency, or a cost above some window's burst, is an error.
    pub fn validate(limits: &Limits, cost: Cost) -> Result<(), BucketError> {
        for currency in [Currency::Requests, Currency::Tokens] {
            for rate in limits.of(currency).as_slice() {
                Bucket::validate(rate, currency, cost.of(currency))?;
            }
        }
        Ok(())
    }

    /// The buckets with their currencies.
    pub fn iter(&self) -> impl Iterator<Item = (Currency, &Bucket)> {
        self.buckets
            .iter()
            .map(|(currency, bucket)| (*currency, bucket))
    }

    fn check_time(&self, now: Nanos) -> Result<(), BucketError> {
        for (_, bucket) in &self.buckets {
            bucket.elapsed(now)?;
        }
        Ok(())
    }

    /// Charges `cost` to every bucket if every bucket can pay at `now`; otherwise charges none
    /// and answers the exact wait until all of them could.
    pub fn try_take(&mut self, now: Nanos, cost: Cost) -> Result<Decision, BucketError> {
        self.check_time(now)?;
        let mut wait = Duration::from_nanos(self.paused_until.0.saturating_sub(now.0));
        for (currency, bucket) in &self.buckets {
            let amount = cost.of(*currency);
            Bucket::validate(&bucket.rate, *currency, amount)?;
            wait = wait.max(bucket.wait_for(bucket.level_at(now)?, amount));
        }
        if !wait.is_zero() {
            return Ok(Decision::NotYet(wait));
        }
        for (currency, bucket) in &mut self.buckets {
            bucket.advance(now)?;
            bucket.level -= i128::from(cost.of(*currency)) * bucket.scale();
        }
        Ok(Decision::Admitted)
    }

    /// True when every bucket is full at `now` and no pause is in force: the state carries no
    /// information and may be forgotten.
    pub fn is_full(&self, now: Nanos) -> bool {
        now >= self.paused_until && self.buckets.iter().all(|(_, bucket)| bucket.is_full(now))
    }

    /// Adds `delta` to every bucket of `currency` (see [`Bucket::adjust`]).
    pub fn adjust(
        &mut self,
        now: Nanos,
        currency: Currency,
        delta: i64,
    ) -> Result<(), BucketError> {
        self.check_time(now)?;
        for (c, bucket) in &mut self.buckets {
            if *c == currency {
                bucket.adjust(now, delta)?;
            }
        }
        Ok(())
    }

    /// Empties every bucket at `now`.
    pub fn drain(&mut self, now: Nanos) -> Result<(), BucketError> {
        self.check_time(now)?;
        for (_, bucket) in &mut self.buckets {
            bucket.drain(now)?;
        }
        Ok(())
    }

    /// What a provider's 429 means: empties every bucket and admits nothing before `until`.
    /// A longer pause already in force wins. The buckets refill during the pause as always.
    pub fn penalize(&mut self, now: Nanos, until: Nanos) -> Result<(), BucketError> {
        self.drain(now)?;
        self.paused_until = self.paused_until.max(until);
        Ok(())
    }

    /// The instant before which nothing passes (at or before any time when there is no pause).
    pub fn paused_until(&self) -> Nanos {
        self.paused_until
    }

    /// The tokens every window holds at `now`.
    pub fn snapshot(&self, now: Nanos) -> Result<Vec<Available>, BucketError> {
        self.buckets
            .iter()
            .map(|(currency, bucket)| {
                Ok(Available {
                    currency: *currency,
                    rate: bucket.rate,
                    tokens: bucket.tokens_at(now)?,
                })
            })
            .collect()
    }
}

/// What one window holds at an instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Available {
    /// The currency of the window.
    pub currency: Currency,
    /// The window.
    pub rate: Rate,
    /// What it holds.
    pub tokens: Tokens,
}
