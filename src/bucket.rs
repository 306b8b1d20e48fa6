//! The bucket arithmetic: exact, pure, with time passed in.
//!
//! A window of rate `N/P burst B` holds `T` tokens at its last update and follows
//! `T = min(B, T + (N/P)·elapsed)`; a cost `c` is admitted only when `T ≥ c`.
//!
//! # Exactness
//!
//! Tokens are kept in *units* of `1/P` of a token, where `P` is the period in nanoseconds. One
//! nanosecond then refills exactly `N` units, a token is exactly `P` units, and every quantity
//! is an integer: `0.25 s` at `2/s` is `2 · 250_000_000 = 500_000_000` units, exactly half of
//! `P = 1_000_000_000`. Levels live in an `i128`; the grammar keeps `B · P` below 2^120, and
//! debt stops at 64 bursts, so nothing here can overflow. Every decision is the one exact
//! rational arithmetic gives, and every hint is the exact number of nanoseconds (rounded up)
//! until the tokens exist.
//!
//! # Arrival order
//!
//! A call that can't pass at once takes a *ticket*: its place in the key's queue, with the
//! instant it is *due* (when the key can pay for it after every ticket ahead of it has paid,
//! computed on a *shadow* copy of the levels that runs ahead of the real ones). Tickets hold no
//! tokens: the real levels are charged only when a ticket is admitted, so the window bound is
//! the bucket's own, and a ticket given up (a dropped wait) is simply removed. A newcomer passes
//! at once only if the key can pay for it *and* for every ticket waiting, so no later call
//! delays an earlier one. A ticket whose holder stops asking for it (a process that died) lapses
//! after its lease.
//!
//! Nothing here reads a clock or does I/O; the stores call it with the time they trust.

use std::collections::VecDeque;
use std::time::Duration;

use crate::cost::Cost;
use crate::rate::{Currency, Limits, Rate};

/// How many bursts of debt a window may carry (settling large underestimates): enough for any
/// honest correction, and small enough that every quantity stays far inside an `i128` (and, in
/// the Redis script, below 2^53).
pub(crate) const DEBT_BURSTS: i128 = 64;

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

    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub(crate) fn since(self, earlier: Nanos) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// An exact amount of tokens: `units / scale`, where `scale` is the period in nanoseconds (or,
/// on Redis, the period in milliseconds reduced by a common factor).
///
/// ```
/// use tollgate::Tokens;
///
/// let half = Tokens::from_units(500_000_000, 1_000_000_000);
/// assert!(half.is(1, 2));
/// assert_eq!(half.whole(), 0);
/// ```
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

impl PartialEq for Tokens {
    fn eq(&self, other: &Tokens) -> bool {
        self.is(other.units, other.scale)
    }
}

impl std::fmt::Display for Tokens {
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
    pub tokens: Tokens,
}

impl Available {
    pub(crate) fn new(currency: Currency, rate: Rate, tokens: Tokens) -> Available {
        Available {
            currency,
            rate,
            tokens,
        }
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
}

/// One window's arithmetic, in units of `1/P` token.
#[derive(Debug, Clone, Copy)]
struct Window {
    rate: Rate,
}

impl Window {
    fn scale(self) -> i128 {
        i128::from(self.rate.period_nanos())
    }

    fn cap(self) -> i128 {
        i128::from(self.rate.burst()) * self.scale()
    }

    fn floor(self) -> i128 {
        -DEBT_BURSTS * self.cap()
    }

    fn units(self, amount: u64) -> i128 {
        i128::from(amount) * self.scale()
    }

    /// The level `elapsed` after `level`: refilled, and saturated at the capacity.
    fn refill(self, level: i128, elapsed: u64) -> i128 {
        let cap = self.cap();
        let room = cap - level;
        if room <= 0 {
            return cap;
        }
        match i128::from(elapsed).checked_mul(i128::from(self.rate.amount())) {
            Some(gain) if gain < room => level + gain,
            _ => cap,
        }
    }

    /// Nanoseconds until `level` reaches `needed` units (0 when it already has).
    fn wait(self, level: i128, needed: i128) -> u64 {
        if level >= needed {
            return 0;
        }
        let amount = i128::from(self.rate.amount());
        u64::try_from((needed - level + amount - 1) / amount).unwrap_or(u64::MAX)
    }

    fn clamp(self, level: i128) -> i128 {
        level.clamp(self.floor(), self.cap())
    }
}

fn windows(limits: &Limits) -> impl Iterator<Item = (Currency, Window)> + '_ {
    limits
        .flat()
        .iter()
        .map(|(currency, rate)| (*currency, Window { rate: *rate }))
}

/// The most windows the single-pass admission keeps on the stack; keys with more take the
/// general path.
const FAST_WINDOWS: usize = 4;

/// How many of the tickets ahead of it an asking ticket looks at (the Redis script keeps the
/// same number).
pub(crate) const SCAN_AHEAD: usize = 32;

/// `cost · num / den`, rounded down, in every currency (saturating).
fn scale(cost: Cost, num: u64, den: u64) -> Cost {
    let one = |n: u64| {
        u64::try_from(u128::from(n) * u128::from(num) / u128::from(den.max(1))).unwrap_or(u64::MAX)
    };
    Cost::new(one(cost.requests), one(cost.tokens)).with_output_tokens(one(cost.output_tokens))
}

/// A millisecond, the shortest hint to a ticket that did not see everything ahead of it.
const MS_NANOS: u64 = 1_000_000;

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

/// The answer of one step of a key's state machine, in the store's own time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Charged; the call may go.
    Admitted,
    /// Queued behind earlier calls: ticket `id`, due at `due`.
    Queued { id: u64, due: Nanos },
    /// Nothing charged, nothing queued: the call could pass at `ready`.
    NotYet { ready: Nanos },
    /// The ticket waits for calls ahead of it that have not passed yet; if they passed now,
    /// it could pass at `ready`.
    Behind { ready: Nanos },
    /// The ticket is gone (it lapsed or was cancelled).
    Lost,
    /// Done (adjustments, penalties, cancellations).
    Done,
    /// Lowered: how many whole tokens the window of the currency closest to the remaining
    /// count held above it (negative: below, and nothing was lowered there).
    Lowered(i64),
}

/// Tokens to add to (or, negative, take from) the windows of each currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Delta {
    pub(crate) requests: i64,
    pub(crate) tokens: i64,
    pub(crate) output_tokens: i64,
}

impl Delta {
    pub(crate) fn of(&self, currency: Currency) -> i64 {
        match currency {
            Currency::Requests => self.requests,
            Currency::Tokens => self.tokens,
            Currency::OutputTokens => self.output_tokens,
        }
    }
}

/// One waiting call's place.
#[derive(Debug, Clone, Copy)]
struct Ticket {
    id: u64,
    cost: Cost,
    lease_until: Nanos,
}

/// Levels as of an instant.
#[derive(Debug, Clone)]
struct Levels {
    at: Nanos,
    units: Box<[i128]>,
}

#[derive(Debug)]
struct Queue {
    tickets: VecDeque<Ticket>,
    /// What the tickets will pay, in all.
    pending: Cost,
    /// The levels after every queued ticket has paid, as of the last one's due time; `None`
    /// when it must be rebuilt (after a cancellation or a penalty).
    shadow: Option<Levels>,
}

/// Every window of one key, with its queue: the whole state a store keeps for it.
#[derive(Debug)]
pub(crate) struct KeyState {
    /// The real levels, as of the last update (never ahead of the store's clock).
    real: Levels,
    /// No call passes before this instant: a provider said 429 with a Retry-After.
    paused_until: Nanos,
    /// `None` while nobody waits, which is most of the time.
    queue: Option<Box<Queue>>,
}

fn add(a: Cost, b: Cost) -> Cost {
    Cost::new(
        a.requests.saturating_add(b.requests),
        a.tokens.saturating_add(b.tokens),
    )
    .with_output_tokens(a.output_tokens.saturating_add(b.output_tokens))
}

fn sub(a: Cost, b: Cost) -> Cost {
    Cost::new(
        a.requests.saturating_sub(b.requests),
        a.tokens.saturating_sub(b.tokens),
    )
    .with_output_tokens(a.output_tokens.saturating_sub(b.output_tokens))
}

impl Queue {
    fn remove(&mut self, index: usize) {
        if let Some(ticket) = self.tickets.remove(index) {
            self.pending = sub(self.pending, ticket.cost);
        }
    }
}

impl Levels {
    fn full(limits: &Limits, at: Nanos) -> Levels {
        Levels {
            at,
            units: windows(limits).map(|(_, w)| w.cap()).collect(),
        }
    }

    /// The levels at `t` (not before `self.at`), refilled.
    fn advance(&mut self, limits: &Limits, t: Nanos) {
        let elapsed = t.0.saturating_sub(self.at.0);
        for ((_, w), level) in windows(limits).zip(self.units.iter_mut()) {
            *level = w.refill(*level, elapsed);
        }
        self.at = self.at.max(t);
    }

    /// Nanoseconds from `self.at` until every window can pay `cost` on top of `ahead`.
    fn wait(&self, limits: &Limits, ahead: Cost, cost: Cost) -> u64 {
        windows(limits)
            .zip(self.units.iter())
            .map(|((c, w), level)| w.wait(*level - w.units(ahead.of(c)), w.units(cost.of(c))))
            .max()
            .unwrap_or(0)
    }

    /// Nanoseconds for every window to refill `cost` from nothing.
    fn refill_time(&self, limits: &Limits, cost: Cost) -> u64 {
        windows(limits)
            .map(|(c, w)| w.wait(0, w.units(cost.of(c))))
            .max()
            .unwrap_or(0)
    }

    fn charge(&mut self, limits: &Limits, cost: Cost) {
        for ((c, w), level) in windows(limits).zip(self.units.iter_mut()) {
            *level = w.clamp(*level - w.units(cost.of(c)));
        }
    }
}

impl KeyState {
    /// Full windows at `now`.
    pub(crate) fn new(limits: &Limits, now: Nanos) -> KeyState {
        KeyState {
            real: Levels::full(limits, now),
            paused_until: Nanos(0),
            queue: None,
        }
    }

    /// The real levels brought up to `now` (which keeps their value: refilling is not
    /// spending). A `now` before the last update counts as no time passing: a key's time
    /// only moves forward.
    fn refilled(&mut self, limits: &Limits, now: Nanos) -> Nanos {
        let now = now.max(self.real.at);
        self.real.advance(limits, now);
        now
    }

    fn pending(&self) -> Cost {
        self.queue.as_ref().map_or(Cost::default(), |q| q.pending)
    }

    /// Drops lapsed tickets at the head of the queue (others lapse when they reach it, or when a
    /// ticket behind them looks past them).
    fn expire_head(&mut self, now: Nanos) {
        if let Some(queue) = &mut self.queue {
            while queue.tickets.front().is_some_and(|t| t.lease_until < now) {
                queue.remove(0);
                queue.shadow = None;
            }
            if queue.tickets.is_empty() {
                self.queue = None;
            }
        }
    }

    /// The shadow levels, rebuilt from the real ones by replaying the queue if needed.
    fn shadow(&mut self, limits: &Limits, now: Nanos) -> &mut Levels {
        let real = &self.real;
        let paused_until = self.paused_until;
        let queue = self.queue.get_or_insert_with(|| {
            Box::new(Queue {
                tickets: VecDeque::new(),
                pending: Cost::default(),
                shadow: None,
            })
        });
        queue.shadow.get_or_insert_with(|| {
            let mut shadow = real.clone();
            shadow.advance(limits, now.max(paused_until));
            for ticket in &queue.tickets {
                let due = shadow.wait(limits, Cost::default(), ticket.cost);
                let due = Nanos(shadow.at.0.saturating_add(due));
                shadow.advance(limits, due);
                shadow.charge(limits, ticket.cost);
            }
            shadow
        })
    }

    /// The hot path, with nobody waiting and no pause: refill, check and charge every window in
    /// one pass, committing only if all can pay. `None` when some can't (or the key has more
    /// windows than the pass keeps), for the general path to answer.
    fn admit_at_once(
        &mut self,
        limits: &Limits,
        now: Nanos,
        cost: Cost,
    ) -> Result<Option<Step>, BucketError> {
        if cost.is_zero() {
            return Err(BucketError::ZeroCost);
        }
        let flat = limits.flat();
        if flat.len() > FAST_WINDOWS || flat.len() != self.real.units.len() {
            return Ok(None);
        }
        let now = now.max(self.real.at);
        let elapsed = now.0 - self.real.at.0;
        let mut next = [0i128; FAST_WINDOWS];
        let mut short = false;
        for (i, (currency, rate)) in flat.iter().enumerate() {
            let amount = cost.of(*currency);
            if amount > rate.burst() {
                return Err(BucketError::CostExceedsCapacity {
                    currency: *currency,
                    rate: *rate,
                    cost: amount,
                });
            }
            let w = Window { rate: *rate };
            let level = w.refill(self.real.units[i], elapsed);
            let left = level - w.units(amount);
            short |= left < 0;
            next[i] = left;
        }
        if short {
            return Ok(None);
        }
        // Element by element: a copy of a length known only at run time is a call to memmove,
        // which costs more than the few windows it copies.
        for (level, left) in self.real.units.iter_mut().zip(next) {
            *level = left;
        }
        self.real.at = now;
        Ok(Some(Step::Admitted))
    }

    /// A call arrives: admitted at once if the key can pay for it on top of every waiting
    /// ticket; else queued, unless it would be due more than `max_wait` from now (then
    /// nothing changes and the answer says when it could pass).
    pub(crate) fn acquire(
        &mut self,
        limits: &Limits,
        now: Nanos,
        cost: Cost,
        max_wait: Option<Duration>,
        lease: Duration,
        id: impl FnOnce() -> u64,
    ) -> Result<Step, BucketError> {
        if self.queue.is_none()
            && now >= self.paused_until
            && let Some(step) = self.admit_at_once(limits, now, cost)?
        {
            return Ok(step);
        }
        validate(limits, cost)?;
        let now = self.refilled(limits, now);
        self.expire_head(now);
        let pending = self.pending();
        if now >= self.paused_until && self.real.wait(limits, pending, cost) == 0 {
            self.real.charge(limits, cost);
            if let Some(shadow) = self.queue.as_mut().and_then(|q| q.shadow.as_mut()) {
                shadow.charge(limits, cost);
            }
            return Ok(Step::Admitted);
        }
        let paused_until = self.paused_until;
        let shadow = self.shadow(limits, now);
        let start = shadow.at.max(now).max(paused_until);
        let mut at_start = shadow.clone();
        at_start.advance(limits, start);
        let due = Nanos(
            start
                .0
                .saturating_add(at_start.wait(limits, Cost::default(), cost)),
        );
        if max_wait.is_some_and(|w| due.since(now) > w) {
            if self.queue.as_ref().is_some_and(|q| q.tickets.is_empty()) {
                self.queue = None;
            }
            return Ok(Step::NotYet { ready: due });
        }
        at_start.advance(limits, due);
        at_start.charge(limits, cost);
        *shadow = at_start;
        let id = id();
        let queue = self.queue.as_mut().expect("the shadow made the queue");
        queue.tickets.push_back(Ticket {
            id,
            cost,
            lease_until: due.plus(lease),
        });
        queue.pending = add(queue.pending, cost);
        Ok(Step::Queued { id, due })
    }

    /// The holder of ticket `id` asks to pass: admitted if the key can pay for it on top of the
    /// live tickets ahead of it (which it must not delay), else told when to ask again (and its
    /// lease is extended past then).
    pub(crate) fn admit(
        &mut self,
        limits: &Limits,
        now: Nanos,
        id: u64,
        lease: Duration,
    ) -> Result<Step, BucketError> {
        let now = self.refilled(limits, now);
        let Some(queue) = self.queue.as_mut() else {
            return Ok(Step::Lost);
        };
        let Ok(mut index) = queue.tickets.binary_search_by_key(&id, |t| t.id) else {
            return Ok(Step::Lost);
        };
        // Only the nearest tickets ahead are looked at, so that asking costs the same however
        // long the line; lapsed ones among them are dropped now (they would only block this
        // one). With more ahead, this ticket can't pass yet, and their cost is a lower bound.
        let from = index.saturating_sub(SCAN_AHEAD);
        let mut lapsed = Cost::default();
        let mut kept = from;
        for i in from..index {
            let t = queue.tickets[i];
            if t.lease_until >= now {
                queue.tickets[kept] = t;
                kept += 1;
            } else {
                lapsed = add(lapsed, t.cost);
            }
        }
        if kept != index {
            queue.tickets.drain(kept..index);
            index = kept;
            queue.pending = sub(queue.pending, lapsed);
            queue.shadow = None;
        }
        let unseen = from > 0;
        let ahead = queue
            .tickets
            .range(from..index)
            .fold(Cost::default(), |sum, t| add(sum, t.cost));
        let ticket = queue.tickets[index];
        let wait = self.real.wait(limits, ahead, ticket.cost);
        let paused = now < self.paused_until;
        let ready = if paused {
            self.paused_until.max(Nanos(now.0.saturating_add(wait)))
        } else if wait == 0 && !unseen {
            self.real.charge(limits, ticket.cost);
            queue.remove(index);
            if queue.tickets.is_empty() {
                self.queue = None;
            }
            return Ok(Step::Admitted);
        } else if unseen {
            // Calls this ticket did not look at are ahead. Guess their cost from those it saw,
            // and ask again when half of the guess has passed: a waiter deep in the line asks
            // a few times on its way to the front, not once per call ahead of it.
            let guess = scale(ahead, index as u64, 2 * SCAN_AHEAD as u64);
            let again = self
                .real
                .wait(limits, guess, ticket.cost)
                .max(self.real.refill_time(limits, ticket.cost))
                .max(MS_NANOS);
            Nanos(now.0.saturating_add(again))
        } else {
            Nanos(now.0.saturating_add(wait))
        };
        let lease_until = ready.plus(lease);
        let ticket = &mut queue.tickets[index];
        ticket.lease_until = ticket.lease_until.max(lease_until);
        // In line behind calls that have yet to pass, and not held up by a pause: nothing
        // failed here, the line is just not there yet.
        if index > 0 && !paused {
            return Ok(Step::Behind { ready });
        }
        Ok(Step::NotYet { ready })
    }

    /// Gives up ticket `id`: nothing was charged for it, so nothing is given back.
    pub(crate) fn cancel(&mut self, now: Nanos, id: u64) -> Step {
        if let Some(queue) = self.queue.as_mut()
            && let Ok(index) = queue.tickets.binary_search_by_key(&id, |t| t.id)
        {
            queue.remove(index);
            queue.shadow = None;
            if queue.tickets.is_empty() {
                self.queue = None;
            }
        }
        self.expire_head(now);
        Step::Done
    }

    /// Adds `delta` to every window of each currency (positive: a refund, never above capacity;
    /// negative: a charge that may go into debt, down to 64 bursts).
    pub(crate) fn adjust(&mut self, limits: &Limits, now: Nanos, delta: Delta) -> Step {
        self.refilled(limits, now);
        let apply = |levels: &mut Levels| {
            for ((c, w), level) in windows(limits).zip(levels.units.iter_mut()) {
                let d = delta.of(c);
                *level = w.clamp(level.saturating_add(i128::from(d) * w.scale()));
            }
        };
        apply(&mut self.real);
        if let Some(shadow) = self.queue.as_mut().and_then(|q| q.shadow.as_mut()) {
            apply(shadow);
        }
        Step::Done
    }

    /// What a provider's 429 means: every window emptied, and nothing passes before `until`. A
    /// longer pause already in force wins; the windows refill during the pause as always.
    pub(crate) fn penalize(&mut self, limits: &Limits, now: Nanos, until: Nanos) -> Step {
        self.refilled(limits, now);
        for level in self.real.units.iter_mut() {
            *level = (*level).min(0);
        }
        self.paused_until = self.paused_until.max(until);
        if let Some(queue) = self.queue.as_mut() {
            queue.shadow = None;
        }
        Step::Done
    }

    /// Lowers every window of `currency` to at most `remaining` tokens (a provider's
    /// `remaining` header): never raises one.
    pub(crate) fn lower(
        &mut self,
        limits: &Limits,
        now: Nanos,
        currency: Currency,
        remaining: u64,
    ) -> Step {
        self.refilled(limits, now);
        // How far above `remaining` the window closest to it was (negative: below).
        let mut above: Option<i64> = None;
        for ((c, w), level) in windows(limits).zip(self.real.units.iter_mut()) {
            if c == currency {
                let target = w.units(remaining.min(w.rate.burst()));
                let tokens = (*level - target).div_euclid(i128::from(w.rate.period_nanos()));
                let tokens =
                    i64::try_from(tokens).unwrap_or(if tokens > 0 { i64::MAX } else { i64::MIN });
                above = Some(above.map_or(tokens, |a| a.min(tokens)));
                *level = (*level).min(target);
            }
        }
        let lowered = above.unwrap_or(0);
        if let Some(queue) = self.queue.as_mut() {
            queue.shadow = None;
        }
        Step::Lowered(lowered)
    }

    /// What every window holds at `now`.
    pub(crate) fn snapshot(&self, limits: &Limits, now: Nanos) -> Vec<Available> {
        let elapsed = now.0.saturating_sub(self.real.at.0);
        windows(limits)
            .zip(self.real.units.iter())
            .map(|((currency, w), level)| {
                Available::new(
                    currency,
                    w.rate,
                    Tokens::from_units(w.refill(*level, elapsed), w.rate.period_nanos()),
                )
            })
            .collect()
    }

    /// How many calls hold a ticket.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.queue.as_ref().map_or(0, |q| q.tickets.len())
    }

    /// True when the state says nothing a fresh one wouldn't: every window full at `now`, no
    /// pause, nobody waiting. Such a key may be forgotten.
    pub(crate) fn is_idle(&self, limits: &Limits, now: Nanos) -> bool {
        let elapsed = now.0.saturating_sub(self.real.at.0);
        self.queue.is_none()
            && now >= self.paused_until
            && windows(limits)
                .zip(self.real.units.iter())
                .all(|((_, w), level)| w.refill(*level, elapsed) >= w.cap())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const LEASE: Duration = Duration::from_secs(1);

    fn limits(requests: &str, tokens: &str) -> Limits {
        Limits::parse(requests, tokens).unwrap()
    }

    fn ids() -> impl FnMut() -> u64 {
        let mut next = 0;
        move || {
            next += 1;
            next
        }
    }

    #[test]
    fn a_newcomer_never_passes_ahead_of_a_ticket() {
        let l = limits("", "10/s");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let big = Cost::new(0, 10);
        let small = Cost::new(0, 1);
        assert_eq!(
            state.acquire(&l, Nanos(0), Cost::new(0, 9), None, LEASE, &mut id),
            Ok(Step::Admitted)
        );
        // 1 token left: the big call is due when 10 exist, at 0.9 s.
        assert_eq!(
            state.acquire(&l, Nanos(0), big, None, LEASE, &mut id),
            Ok(Step::Queued {
                id: 1,
                due: Nanos(900 * MS)
            })
        );
        // The token that exists now is promised: the small call queues behind, due at 1.0 s.
        assert_eq!(
            state.acquire(&l, Nanos(0), small, None, LEASE, &mut id),
            Ok(Step::Queued {
                id: 2,
                due: Nanos(1_000 * MS)
            })
        );
        // Asking early changes nothing but says when to come back.
        assert_eq!(
            state.admit(&l, Nanos(500 * MS), 1, LEASE),
            Ok(Step::NotYet {
                ready: Nanos(900 * MS)
            })
        );
        assert_eq!(
            state.admit(&l, Nanos(900 * MS), 1, LEASE),
            Ok(Step::Admitted)
        );
        assert_eq!(
            state.admit(&l, Nanos(1_000 * MS), 2, LEASE),
            Ok(Step::Admitted)
        );
        assert_eq!(state.queued(), 0);
    }

    #[test]
    fn a_cancelled_ticket_was_never_charged() {
        let l = limits("1/s", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let call = Cost::call(0);
        assert_eq!(
            state.acquire(&l, Nanos(0), call, None, LEASE, &mut id),
            Ok(Step::Admitted)
        );
        let Ok(Step::Queued { id: ticket, .. }) =
            state.acquire(&l, Nanos(0), call, None, LEASE, &mut id)
        else {
            panic!("expected a ticket")
        };
        state.cancel(Nanos(300 * MS), ticket);
        assert!(state.snapshot(&l, Nanos(300 * MS))[0].tokens.is(3, 10));
        assert_eq!(
            state.admit(&l, Nanos(2_000 * MS), ticket, LEASE),
            Ok(Step::Lost)
        );
        // With the queue empty, the next call is due at once when the token exists.
        assert_eq!(
            state.acquire(&l, Nanos(1_000 * MS), call, None, LEASE, &mut id),
            Ok(Step::Admitted)
        );
    }

    #[test]
    fn a_lapsed_ticket_stops_blocking_those_behind_it() {
        let l = limits("", "10/s");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        state
            .acquire(&l, Nanos(0), Cost::new(0, 10), None, LEASE, &mut id)
            .unwrap();
        // Two tickets: the first (due 1 s) is never claimed; the second is due at 1.5 s.
        state
            .acquire(&l, Nanos(0), Cost::new(0, 10), None, LEASE, &mut id)
            .unwrap();
        assert_eq!(
            state.acquire(&l, Nanos(0), Cost::new(0, 5), None, LEASE, &mut id),
            Ok(Step::Queued {
                id: 2,
                due: Nanos(1_500 * MS)
            })
        );
        // At 1.5 s the dead ticket still holds its 10 tokens: the second must wait, behind it.
        assert!(matches!(
            state.admit(&l, Nanos(1_500 * MS), 2, LEASE),
            Ok(Step::Behind { .. })
        ));
        // Its lease (1 s past its due) runs out at 2 s: then the second passes.
        assert_eq!(
            state.admit(&l, Nanos(2_000 * MS + 1), 2, LEASE),
            Ok(Step::Admitted)
        );
        assert_eq!(state.queued(), 0);
    }

    #[test]
    fn a_ticket_behind_a_late_call_is_told_so_and_a_pause_is_not_a_line() {
        let l = limits("10/s burst 1", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let call = Cost::call(0);
        state
            .acquire(&l, Nanos(0), call, None, LEASE, &mut id)
            .unwrap();
        for (ticket, due) in [(1, 100), (2, 200)] {
            assert_eq!(
                state.acquire(&l, Nanos(0), call, None, LEASE, &mut id),
                Ok(Step::Queued {
                    id: ticket,
                    due: Nanos(due * MS)
                })
            );
        }
        // The head of the line asking early is not behind anyone.
        assert_eq!(
            state.admit(&l, Nanos(50 * MS), 1, LEASE),
            Ok(Step::NotYet {
                ready: Nanos(100 * MS)
            })
        );
        // Ticket 2 is due at 200 ms, but ticket 1 has not come: were it to pass now, ticket 2
        // could pass one refill later.
        assert_eq!(
            state.admit(&l, Nanos(200 * MS), 2, LEASE),
            Ok(Step::Behind {
                ready: Nanos(300 * MS)
            })
        );
        // Nor is a ticket held up by a pause, even with calls ahead of it.
        state.penalize(&l, Nanos(200 * MS), Nanos(1_000 * MS));
        assert_eq!(
            state.admit(&l, Nanos(200 * MS), 2, LEASE),
            Ok(Step::NotYet {
                ready: Nanos(1_000 * MS)
            })
        );
    }

    #[test]
    fn max_wait_refuses_without_queueing() {
        let l = limits("1/m", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let call = Cost::call(0);
        state
            .acquire(&l, Nanos(0), call, None, LEASE, &mut id)
            .unwrap();
        assert_eq!(
            state.acquire(
                &l,
                Nanos(0),
                call,
                Some(Duration::from_secs(10)),
                LEASE,
                &mut id
            ),
            Ok(Step::NotYet {
                ready: Nanos(60_000 * MS)
            })
        );
        assert_eq!(state.queued(), 0);
        assert!(state.queue.is_none());
    }

    #[test]
    fn an_empty_prompt_pays_its_request_but_a_cost_of_nothing_is_refused() {
        let l = limits("10/s", "100/m");
        let mut state = KeyState::new(&l, Nanos(0));
        assert_eq!(
            state.acquire(
                &l,
                Nanos(0),
                Cost::call(0),
                Some(Duration::ZERO),
                LEASE,
                || 1
            ),
            Ok(Step::Admitted)
        );
        assert_eq!(validate(&l, Cost::new(0, 0)), Err(BucketError::ZeroCost));
    }

    #[test]
    fn debt_stops_at_64_bursts_and_extreme_rates_never_overflow() {
        let l = limits("", "18446744073709551615/730d");
        let mut state = KeyState::new(&l, Nanos(0));
        for step in 0..1_000u64 {
            state.adjust(
                &l,
                Nanos(step),
                Delta {
                    tokens: i64::MIN,
                    ..Delta::default()
                },
            );
        }
        let w = Window {
            rate: *l.tokens().as_slice().first().unwrap(),
        };
        assert_eq!(state.real.units[0], w.floor());
        for step in 0..1_000u64 {
            state.adjust(
                &l,
                Nanos(1_000 + step),
                Delta {
                    tokens: i64::MAX,
                    ..Delta::default()
                },
            );
        }
        assert_eq!(state.real.units[0], w.cap());
        let waited = state.acquire(
            &l,
            Nanos(u64::MAX),
            Cost::new(0, u64::MAX),
            None,
            LEASE,
            || 1,
        );
        assert_eq!(waited, Ok(Step::Admitted));
    }
}
