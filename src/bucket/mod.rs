//! A key's rule book: exact, pure, with time passed in. Every store keeps its keys by these
//! rules: the memory store calls them, and the Redis script is a port of them checked against
//! them by a differential test.
//!
//! - [`window`]: one window's arithmetic. A window of rate `N/P burst B` holds `T` tokens at
//!   its last update and follows `T = min(B, T + (N/P)·elapsed)`; a cost `c` is admitted only
//!   when `T ≥ c`.
//! - [`queue`]: the tickets of the calls that wait, in fair order (arrival order for one
//!   tenant), and the shadow schedule that says when each is due.
//! - [`flights`]: the calls that went out through the HTTP gate and have not settled yet,
//!   which a header sync needs to read the provider's count.
//! - [`state`]: the key's transitions, all or nothing.
//!
//! # Exactness
//!
//! Tokens are kept in *units* of `1/P` of a token, where `P` is the period in nanoseconds. One
//! nanosecond then refills exactly `N` units, a token is exactly `P` units, and every quantity
//! is an integer: `0.25 s` at `2/s` is `2 · 250_000_000 = 500_000_000` units, exactly half of
//! `P = 1_000_000_000`. Levels live in an `i128`; the grammar keeps `B · P` below 2^120, and
//! debt stops at 64 bursts, so nothing here can overflow. Every decision is the one exact
//! rational arithmetic gives, and every hint is the exact number of nanoseconds (rounded up)
//! until the tokens exist, saturated at `u64::MAX` nanoseconds (never shorter than the wait).
//!
//! # Arrival order
//!
//! A call that can't pass at once takes a *ticket*: its place in the key's queue, with the
//! instant it is *due* (when the key can pay for it after every ticket ahead of it has paid,
//! computed on a *shadow* copy of the levels that runs ahead of the real ones). Tickets hold no
//! tokens until they pass: the real levels are charged when a ticket is admitted, so the window
//! bound is the bucket's own, and a ticket given up before then (a dropped wait) is simply
//! removed. A newcomer passes at once only if the key can pay for it *and* for every ticket
//! waiting, so no later call delays an earlier one. A ticket whose holder stops asking for it
//! (a process that died) lapses after its lease.
//!
//! # Fair order
//!
//! Tickets wait in *fair order*, which for one tenant is arrival order. Each ticket is tagged as
//! it is issued with a virtual finish time `max(V, G) + ⌈r / (1000·w)⌉`: `V` the tag of the
//! ticket first in line, `G` the tag of the tenant's last ticket (both forgotten when nobody
//! waits), `r` the nanoseconds the key takes to refill the call's cost in its slowest window,
//! `w` the tenant's weight ([`op::Share`]; calls without one are one tenant of weight 1). The
//! queue is sorted by tag, then by issue. One tenant's tags only grow, so its tickets stay in
//! arrival order, and a key with one tenant waiting admits exactly as a FIFO. Tenants sharing
//! a key then get its capacity in proportion to their weights, by cost: a call of cost `c` of
//! weight `w`, finding its tenant with nothing waiting, has ahead of it from each other tenant
//! `j` calls of total cost at most `w_j·⌈c/w⌉` plus two calls (the one first in line, and one
//! whose tag straddles it), whenever they arrive; so nobody starves
//! (`state/fair.rs` checks this bound as a property). A ticket placed ahead of others plans the
//! line again, and breaks every waiting ticket's promise (below).
//!
//! A ticket not to fly, issued when every ticket ahead of it is promised, is *promised*: the
//! key charges it at its due time itself, before the first operation that comes after that
//! time, and its holder passes then by reading that it was (on Redis, without running the
//! script). Anything that moves the levels under the schedule (a pause, a lowered count, a
//! sync, a charge or a refund) breaks every waiting ticket's promise, and those ask to pass as
//! above. Promised tickets are always the head of the queue, so a ticket that asks can never
//! pass ahead of one and take what its promise counted on.
//!
//! Nothing here reads a clock or does I/O; the stores call it with the time they trust.

use std::time::Duration;

use crate::cost::Cost;
use crate::rate::{Currency, Limits, PerCurrency, Rate};

pub(crate) mod flights;
pub(crate) mod op;
pub(crate) mod queue;
pub(crate) mod state;
pub(crate) mod window;

pub(crate) use state::KeyState;

/// How many bursts of debt a window may carry (settling large underestimates): enough for any
/// honest correction, and small enough that every quantity stays far inside an `i128` (and, in
/// the Redis script, below 2^53).
pub(crate) const DEBT_BURSTS: i128 = 64;

/// How many of the tickets ahead of it an asking ticket looks at.
pub(crate) const SCAN_AHEAD: usize = 32;

/// The longest queue a key may have (rebuilding the shadow replays all of it).
pub(crate) const MAX_QUEUE: usize = 100_000;

/// The most calls in flight a key remembers; beyond it the oldest is forgotten (as if it had
/// lapsed).
pub(crate) const MAX_FLIGHTS: usize = 10_000;

/// How long a call in flight is remembered without settling (a process that died with calls
/// out): longer than any answer a provider takes.
pub(crate) const FLIGHT_LEASE: Duration = Duration::from_secs(600);

/// How far apart two calls must have gone out (been admitted) to be sure to reach the provider
/// in that order: calls closer together may reach it in either order (their connections, their
/// tasks, the network each take their own time), so a sync leaves them out of its comparison,
/// which can then only find less spending elsewhere than there was. Too short, and a burst
/// admitted at once but arriving in another order reads as spending elsewhere.
pub(crate) const SEND_SKEW: Duration = Duration::from_millis(250);

/// A point in time, in nanoseconds since the origin of the clock that produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct Nanos(pub(crate) u64);

impl Nanos {
    pub(crate) fn from_duration(duration: Duration) -> Nanos {
        Nanos(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
    }

    pub(crate) fn as_duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    pub(crate) fn plus(self, by: Duration) -> Nanos {
        Nanos(self.0.saturating_add(Nanos::from_duration(by).0))
    }
}

/// `value` in a narrower integer type, saturated at its bounds: nanoseconds as a `u64` (a hint
/// is never shorter than the true wait), tokens as an `i64` correction or refund. The one
/// saturating conversion of the rule book and the limiter.
pub(crate) fn saturate<T, U>(value: T) -> U
where
    T: Copy + PartialOrd + Default,
    U: TryFrom<T> + Bounds,
{
    U::try_from(value).unwrap_or(if value > T::default() { U::MAX } else { U::MIN })
}

/// An integer type's bounds, for [`saturate`].
pub(crate) trait Bounds {
    const MIN: Self;
    const MAX: Self;
}

impl Bounds for u64 {
    const MIN: u64 = u64::MIN;
    const MAX: u64 = u64::MAX;
}

impl Bounds for i64 {
    const MIN: i64 = i64::MIN;
    const MAX: i64 = i64::MAX;
}

/// An exact amount of tokens: `units / scale`, where `scale` is the period in nanoseconds (or,
/// on Redis, the period in milliseconds reduced by a common factor).
///
/// ```
/// use tollgate::Amount;
///
/// let half = Amount::from_units(500_000_000, 1_000_000_000);
/// assert!(half.is(1, 2));
/// assert_eq!(half.whole(), 0);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Amount {
    units: i128,
    scale: u64,
}

impl Amount {
    /// `units / scale` tokens (`scale` must be positive; 0 is read as 1).
    pub fn from_units(units: i128, scale: u64) -> Amount {
        Amount {
            units,
            scale: scale.max(1),
        }
    }

    /// The numerator over [`scale`](Amount::scale).
    pub fn units(&self) -> i128 {
        self.units
    }

    /// The denominator: units per token.
    pub fn scale(&self) -> u64 {
        self.scale
    }

    /// Whole tokens, rounded down (negative when the window is in debt).
    pub fn whole(&self) -> i128 {
        self.units.div_euclid(i128::from(self.scale))
    }

    /// True when the amount is exactly `numerator / denominator` tokens.
    pub fn is(&self, numerator: i128, denominator: u64) -> bool {
        // Widen through checked multiplication, so that an overflow reads as "not equal"
        // instead of wrapping.
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

impl PartialEq for Amount {
    fn eq(&self, other: &Amount) -> bool {
        self.is(other.units, other.scale)
    }
}

impl PartialOrd for Amount {
    fn partial_cmp(&self, other: &Amount) -> Option<std::cmp::Ordering> {
        let a = self.units.checked_mul(i128::from(other.scale))?;
        let b = other.units.checked_mul(i128::from(self.scale))?;
        Some(a.cmp(&b))
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.as_f64())
    }
}

/// What one window holds at an instant.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Available {
    /// The currency of the window.
    pub currency: Currency,
    /// The window.
    pub rate: Rate,
    /// What it holds (negative in debt).
    pub tokens: Amount,
}

impl Available {
    pub(crate) fn new(currency: Currency, rate: Rate, tokens: Amount) -> Available {
        Available {
            currency,
            rate,
            tokens,
        }
    }
}

/// What every window of a key holds at an instant, read by currency.
///
/// ```
/// use tollgate::{Cost, Currency, Limiter, Limits};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// let limiter = Limiter::builder("k", Limits::parse("60/m", "1000/m; 20000/d")?).build()?;
/// limiter.acquire(Cost::call(300)).await?;
/// let snapshot = limiter.snapshot().await?;
/// assert_eq!(snapshot.requests().unwrap().whole(), 59);
/// // The least any token window holds: what a call can pay now.
/// assert_eq!(snapshot.tokens().unwrap().whole(), 700);
/// assert_eq!(snapshot.of(Currency::Tokens).count(), 2);
/// assert!(snapshot.output_tokens().is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot(Vec<Available>);

impl Snapshot {
    pub(crate) fn new(windows: Vec<Available>) -> Snapshot {
        Snapshot(windows)
    }

    /// Every window, in the order of [`Limits::windows`].
    pub fn windows(&self) -> &[Available] {
        &self.0
    }

    /// The windows of `currency`.
    pub fn of(&self, currency: Currency) -> impl Iterator<Item = &Available> {
        self.0.iter().filter(move |a| a.currency == currency)
    }

    /// The least any window of `currency` holds (what a call can pay in it now), or `None`
    /// when the key has no window of it.
    pub fn least(&self, currency: Currency) -> Option<Amount> {
        self.of(currency)
            .map(|a| a.tokens)
            .reduce(|a, b| if b < a { b } else { a })
    }

    /// [`least`](Snapshot::least) of the request windows.
    pub fn requests(&self) -> Option<Amount> {
        self.least(Currency::Requests)
    }

    /// [`least`](Snapshot::least) of the token windows.
    pub fn tokens(&self) -> Option<Amount> {
        self.least(Currency::Tokens)
    }

    /// [`least`](Snapshot::least) of the output-token windows.
    pub fn output_tokens(&self) -> Option<Amount> {
        self.least(Currency::OutputTokens)
    }
}

impl<'a> IntoIterator for &'a Snapshot {
    type Item = &'a Available;
    type IntoIter = std::slice::Iter<'a, Available>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Input the arithmetic refuses. None of these changes any state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BucketError {
    /// A cost of zero in every currency: a call always pays something.
    ZeroCost,
    /// A cost larger than a window's burst: no amount of waiting could admit it.
    CostExceedsCapacity {
        currency: Currency,
        rate: Rate,
        cost: u64,
    },
    /// The key's queue holds [`MAX_QUEUE`] tickets already.
    QueueFull,
}

/// Checks a cost against the windows, before any time is involved: a cost of zero in every
/// currency, or above some window's burst, is refused.
pub(crate) fn validate(limits: &Limits, cost: Cost) -> Result<(), BucketError> {
    if cost.is_zero() {
        return Err(BucketError::ZeroCost);
    }
    for (currency, rate) in limits.windows() {
        let amount = cost.of(currency);
        if amount > rate.burst() {
            return Err(BucketError::CostExceedsCapacity {
                currency,
                rate: *rate,
                cost: amount,
            });
        }
    }
    Ok(())
}

/// Tokens to add to (or, negative, take from) the windows of each currency.
pub(crate) type Delta = PerCurrency<i64>;

/// What a header sync brings ([`Op::Sync`](crate::store::Op::Sync)): the provider's counts,
/// read from the answer to one call in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SyncArgs {
    /// The call whose answer carried the counts
    /// ([`Outcome::Flying`](crate::store::Outcome::Flying)).
    pub flight: u64,
    /// What the call was charged, in case the key no longer remembers it.
    pub charged: Cost,
    /// The provider's `remaining`, per currency (`None`: not said).
    pub remaining: PerCurrency<Option<u64>>,
    /// Spending elsewhere to charge first, per currency (the gate's model of it).
    pub elsewhere: PerCurrency<u64>,
    /// What of the model's earlier charges may come back, per currency, where the count shows
    /// the windows lower than it and the margin say.
    pub returnable: PerCurrency<u64>,
    /// How far below the provider's count to leave each currency.
    pub margin: PerCurrency<u64>,
    /// Per currency, true: the margin applies only where the count of a call the key
    /// remembers finds more spending elsewhere than has been corrected.
    pub margin_if_above: PerCurrency<bool>,
    /// The answer was a 429 (`Some`), and the call is done: the provider counted nothing of it
    /// in the currencies given here (OpenAI and Gemini count a refused request against the
    /// request limit, so a gate following them names its tokens but not its request), so its
    /// count is read without the call there. Its charge is not given back: a 429 never raises
    /// a window (a retry pays again).
    pub refused: Option<crate::rate::Currencies>,
    /// How long after the call went out the provider counted it: its own stamp where it sends
    /// one, else half the round trip. The windows' refill in between is the key's, not the
    /// provider's (it was full, or counting, from later on): the comparison credits it to the
    /// key's level before reading the count against it.
    pub counted_after: Duration,
    /// With `Some`, the call is then settled as done, in the same step, with what it used per
    /// currency (`None`: as charged), as [`Op::Settle`](crate::store::Op::Settle) would: a
    /// whole answer read at once costs the store one round trip instead of two. What it
    /// settled is [`Synced::settled`].
    pub settle: Option<PerCurrency<Option<u64>>>,
}

/// The call a provider's 429 refused, when the provider said when it would pass
/// ([`Op::Penalize`](crate::store::Op::Penalize)): what lets a penalty bring the key's windows
/// to where the provider's are, instead of only emptying them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Refusal {
    /// The provider's own pause: the call would pass when it ends.
    pub hint: Duration,
    /// What the call needed, per currency (what it was charged).
    pub need: PerCurrency<u64>,
    /// Its number among the calls in flight ([`Outcome::Flying`](crate::store::Outcome::Flying)),
    /// or 0: the calls that went out after it were not counted yet when it was refused.
    pub flight: u64,
    /// What went out after it, per currency, when the key does not remember the call (a
    /// limiter's own count of what it admitted since).
    pub later: PerCurrency<u64>,
}

impl Refusal {
    /// A call that needed `need`, refused with the provider's pause `hint`, with `later` gone
    /// out after it (and no number among the calls in flight).
    pub fn new(hint: Duration, need: Cost, later: PerCurrency<u64>) -> Refusal {
        Refusal {
            hint,
            need: need.per_currency(),
            flight: 0,
            later,
        }
    }

    /// The same refusal, of call `flight` among the calls in flight.
    pub fn of_flight(self, flight: u64) -> Refusal {
        Refusal { flight, ..self }
    }
}

/// What a header sync ([`Op::Sync`](crate::store::Op::Sync)) found and did; a currency the
/// answer did not count is `None` (or 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Synced {
    /// Whole tokens the currency's tightest window held above the provider's count when the
    /// call went out (negative: below), calls that went out close to it left out: the least
    /// there can be.
    pub above: PerCurrency<Option<i64>>,
    /// The estimate of all the spending elsewhere by the time the call went out, in whole
    /// tokens since the key began remembering calls, if the provider counted the calls in the
    /// order they went out: right on average, noisy when calls went out close together (what
    /// a model of that spending fits a rate to, robustly).
    pub spent: PerCurrency<Option<i64>>,
    /// Another call went out too close to this one to tell which the provider counted first,
    /// or the key does not remember this call.
    pub ambiguous: bool,
    /// How long ago the call went out.
    pub since: Duration,
    /// Whole tokens taken off every window of the currency now.
    pub lowered: PerCurrency<u64>,
    /// Whole tokens of the model's earlier charges given back.
    pub returned: PerCurrency<u64>,
    /// What settling the call changed, where the sync settled it too
    /// ([`SyncArgs::settle`]): positive for a refund, negative for a charge.
    pub settled: Option<PerCurrency<i64>>,
}

impl SyncArgs {
    /// A sync of the counts in `remaining` from the answer to call `flight`, charged
    /// `charged`, with no spending elsewhere, no margin, and not refused.
    pub fn new(flight: u64, charged: Cost, remaining: PerCurrency<Option<u64>>) -> SyncArgs {
        SyncArgs {
            flight,
            charged,
            remaining,
            ..SyncArgs::default()
        }
    }
}
