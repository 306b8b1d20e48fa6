//! A key's whole state and its transitions: admit, queue, settle, pause, lower, sync. Each
//! transition is all or nothing, and takes the store's time as an argument.

use std::time::Duration;

use super::flights::Flights;
use super::queue::{Queue, Ticket, add, scale, sub};
use super::window::{Levels, Window, windows};
use super::{
    Available, BucketError, Delta, MAX_QUEUE, Nanos, SCAN_AHEAD, Step, SyncArgs, saturate, validate,
};
use crate::cost::Cost;
use crate::rate::{Currencies, Currency, Limits, PerCurrency};

/// The most windows the single-pass admission keeps on the stack; keys with more take the
/// general path.
const FAST_WINDOWS: usize = 4;

/// A millisecond, the shortest hint to a ticket that did not see everything ahead of it.
const MS_NANOS: u128 = 1_000_000;

/// Every window of one key, with its queue and its calls in flight: the whole state a store
/// keeps for it.
#[derive(Debug)]
pub(crate) struct KeyState {
    /// The real levels, as of the last update (never ahead of the store's clock).
    real: Levels,
    /// No call passes before this instant: a provider said 429 with a Retry-After.
    paused_until: Nanos,
    /// `None` while nobody waits, which is most of the time.
    queue: Option<Box<Queue>>,
    /// `None` until a call goes out through the HTTP gate.
    flights: Option<Box<Flights>>,
}

impl KeyState {
    /// Full windows at `now`.
    pub(crate) fn new(limits: &Limits, now: Nanos) -> KeyState {
        KeyState {
            real: Levels::full(limits, now),
            paused_until: Nanos(0),
            queue: None,
            flights: None,
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

    /// The levels changed other than by a ticket paying: the schedule must be rebuilt.
    fn replan(&mut self) {
        if let Some(queue) = self.queue.as_mut() {
            queue.shadow = None;
        }
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
        let queue = self.queue.get_or_insert_with(|| Box::new(Queue::new()));
        queue.shadow.get_or_insert_with(|| {
            let mut shadow = real.clone();
            shadow.advance(limits, now.max(paused_until));
            for ticket in &queue.tickets {
                let due = shadow.wait(limits, Cost::default(), ticket.cost);
                let due = Nanos(saturate(u128::from(shadow.at.0) + due));
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

    /// Remembers an admitted call of `cost` as gone out at `now` when `fly` (the HTTP gate's
    /// calls), answering its number.
    fn went(&mut self, limits: &Limits, now: Nanos, cost: Cost, fly: bool) -> Step {
        if !fly {
            return Step::Admitted;
        }
        let level = PerCurrency::from_fn(|c| tightest(limits, c).map_or(0, |i| self.real.units[i]));
        let flights = self.flights.get_or_insert_with(|| Box::new(Flights::new()));
        Step::Flying {
            flight: flights.fly(now, cost.per_currency(), level),
        }
    }

    /// A call arrives: admitted at once if the key can pay for it on top of every waiting
    /// ticket; else queued, unless it would be due more than `max_wait` from now (then
    /// nothing changes and the answer says when it could pass). With `fly`, an admitted call is
    /// remembered as in flight.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acquire(
        &mut self,
        limits: &Limits,
        now: Nanos,
        cost: Cost,
        max_wait: Option<Duration>,
        fly: bool,
        lease: Duration,
        id: impl FnOnce() -> u64,
    ) -> Result<Step, BucketError> {
        if self.queue.is_none()
            && now >= self.paused_until
            && let Some(Step::Admitted) = self.admit_at_once(limits, now, cost)?
        {
            let now = now.max(self.real.at);
            return Ok(self.went(limits, now, cost, fly));
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
            return Ok(self.went(limits, now, cost, fly));
        }
        let paused_until = self.paused_until;
        let queued = self.queue.as_ref().map_or(0, |q| q.tickets.len());
        let shadow = self.shadow(limits, now);
        let start = shadow.at.max(now).max(paused_until);
        let mut at_start = shadow.clone();
        at_start.advance(limits, start);
        // Exact, in nanoseconds from now: never shortened by the end of the clock.
        let due_in = u128::from(start.0 - now.0) + at_start.wait(limits, Cost::default(), cost);
        if max_wait.is_some_and(|w| due_in > w.as_nanos()) {
            if self.queue.as_ref().is_some_and(|q| q.tickets.is_empty()) {
                self.queue = None;
            }
            return Ok(Step::NotYet {
                wait: saturate(due_in),
            });
        }
        if queued >= MAX_QUEUE {
            return Err(BucketError::QueueFull);
        }
        let due = Nanos(saturate(u128::from(now.0) + due_in));
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
        Ok(Step::Queued {
            id,
            due_in: saturate(due_in),
        })
    }

    /// The holder of ticket `id` asks to pass: admitted if the key can pay for it on top of the
    /// live tickets ahead of it (which it must not delay), else told when to ask again (and its
    /// lease is extended past then). With `fly`, an admitted call is remembered as in flight.
    pub(crate) fn admit(
        &mut self,
        limits: &Limits,
        now: Nanos,
        id: u64,
        fly: bool,
        lease: Duration,
    ) -> Result<Step, BucketError> {
        let now = self.refilled(limits, now);
        let Some(queue) = self.queue.as_mut() else {
            return Ok(Step::Lost);
        };
        let Some(mut index) = queue.find(id) else {
            return Ok(Step::Lost);
        };
        // A holder that comes back after its ticket's lease has lost its place: it lapsed, and
        // may already be gone (a store forgets a key no ticket can still claim).
        if queue.tickets[index].lease_until < now {
            queue.remove(index);
            queue.shadow = None;
            if queue.tickets.is_empty() {
                self.queue = None;
            }
            return Ok(Step::Lost);
        }
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
        let ready_in = if paused {
            u128::from(self.paused_until.0 - now.0).max(wait)
        } else if wait == 0 && !unseen {
            self.real.charge(limits, ticket.cost);
            queue.remove(index);
            if queue.tickets.is_empty() {
                self.queue = None;
            }
            return Ok(self.went(limits, now, ticket.cost, fly));
        } else if unseen {
            // Calls this ticket did not look at are ahead. Guess their cost from those it saw,
            // and ask again when half of the guess has passed: a waiter deep in the line asks
            // a few times on its way to the front, not once per call ahead of it.
            let guess = scale(ahead, index as u64, 2 * SCAN_AHEAD as u64);
            self.real
                .wait(limits, guess, ticket.cost)
                .max(self.real.refill_time(limits, ticket.cost))
                .max(MS_NANOS)
        } else {
            wait
        };
        let ready = Nanos(saturate(u128::from(now.0) + ready_in));
        let lease_until = ready.plus(lease);
        let ticket = &mut queue.tickets[index];
        ticket.lease_until = ticket.lease_until.max(lease_until);
        let wait = saturate(ready_in);
        // In line behind calls that have yet to pass, and not held up by a pause: nothing
        // failed here, the line is just not there yet.
        if index > 0 && !paused {
            return Ok(Step::Behind { wait });
        }
        Ok(Step::NotYet { wait })
    }

    /// Gives up ticket `id`: nothing was charged for it, so nothing is given back.
    pub(crate) fn cancel(&mut self, now: Nanos, id: u64) -> Step {
        if let Some(queue) = self.queue.as_mut()
            && let Some(index) = queue.find(id)
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

    /// Adds `delta` to the windows of each currency (positive: a refund, never above capacity;
    /// negative: a charge that may go into debt, down to 64 bursts), to the real levels and to
    /// the schedule alike.
    fn add_delta(&mut self, limits: &Limits, delta: Delta) {
        let apply = |levels: &mut Levels| {
            for ((c, w), level) in windows(limits).zip(levels.units.iter_mut()) {
                let d = delta[c];
                *level = w.clamp(level.saturating_add(i128::from(d) * w.scale()));
            }
        };
        apply(&mut self.real);
        if let Some(shadow) = self.queue.as_mut().and_then(|q| q.shadow.as_mut()) {
            apply(shadow);
        }
    }

    /// Adds `delta` to every window of each currency (positive: a refund, never above capacity;
    /// negative: a charge that may go into debt, down to 64 bursts).
    pub(crate) fn adjust(&mut self, limits: &Limits, now: Nanos, delta: Delta) -> Step {
        self.refilled(limits, now);
        self.add_delta(limits, delta);
        Step::Done
    }

    /// What a provider's 429 means: the windows of the `spent` currencies emptied (what they
    /// held is the cover of every call in flight, which the refusal counted), and nothing
    /// passes before `until`. A longer pause already in force wins; the windows refill during
    /// the pause as always.
    pub(crate) fn penalize(
        &mut self,
        limits: &Limits,
        now: Nanos,
        until: Nanos,
        spent: Currencies,
    ) -> Step {
        self.refilled(limits, now);
        let mut emptied: PerCurrency<Option<u64>> = PerCurrency::splat(None);
        for ((c, w), level) in windows(limits).zip(self.real.units.iter_mut()) {
            if spent.contains(c) {
                let held = u64::try_from(w.whole((*level).max(0))).unwrap_or(u64::MAX);
                let slot = &mut emptied[c];
                *slot = Some(slot.map_or(held, |e| e.min(held)));
                *level = (*level).min(0);
            }
        }
        let emptied = emptied.map(|e| e.unwrap_or(0));
        self.paused_until = self.paused_until.max(until);
        if let Some(flights) = self.flights.as_mut()
            && let Some(last) = flights.list.back()
        {
            flights.covers = last.id;
            for c in Currency::ALL {
                if spent.contains(c) {
                    flights.cover[c] = emptied[c];
                    // What the windows held, the provider says is spent: taken off for spending
                    // elsewhere, like a sync's correction.
                    flights.corrected[c] =
                        flights.corrected[c].saturating_add(clamp_i64(i128::from(emptied[c])));
                }
            }
        }
        self.replan();
        Step::Emptied(emptied)
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
                let tokens = clamp_i64(w.whole(*level - target));
                above = Some(above.map_or(tokens, |a| a.min(tokens)));
                *level = (*level).min(target);
            }
        }
        self.replan();
        Step::Lowered(above.unwrap_or(0))
    }

    /// Adds `tokens` (negative: takes them) to every window of `currency`, within capacity and
    /// the debt floor.
    fn shift(&mut self, limits: &Limits, currency: Currency, tokens: i64) {
        let mut delta = Delta::default();
        delta[currency] = tokens;
        self.add_delta(limits, delta);
    }

    /// A header sync: brings the windows in line with what a provider's answer to call
    /// `args.flight` says was left when the call arrived, never raising them past it.
    ///
    /// First the spending elsewhere that the gate's model says happened is charged (and
    /// counted as corrected). Then, per currency the answer counted, what the currency's
    /// tightest window held when the call went out (its record) is compared with the count:
    /// the excess is what was spent elsewhere by then, less what calls that went out just
    /// before it and may not have arrived first were charged. Less what has been corrected
    /// since the call went out, plus the margin, that much is taken off every window of the
    /// currency now (and counted as corrected); when it is negative, up to `returnable` of what
    /// the model charged comes back. What a sync takes off for spending it found is the cover
    /// of the calls the count held (see [`flights`](super::flights)).
    ///
    /// A call the key no longer remembers (or never did: a gate's first call, before its limits
    /// were known) has no record to compare with: its count lowers every window of the
    /// currency to at most the count, as [`lower`](KeyState::lower) does.
    pub(crate) fn sync(&mut self, limits: &Limits, now: Nanos, args: &SyncArgs) -> Step {
        let now = self.refilled(limits, now);
        self.add_delta(limits, args.foreign.map(|t| -clamp_i64(i128::from(t))));
        if let Some(flights) = self.flights.as_deref_mut() {
            for c in Currency::ALL {
                flights.corrected[c] =
                    flights.corrected[c].saturating_add(clamp_i64(i128::from(args.foreign[c])));
            }
        }
        let found = self
            .flights
            .as_deref()
            .and_then(|f| f.find(args.flight).map(|i| (i, f.list[i], f.close_to(i))));
        let ambiguous = found.is_none_or(|(_, _, (_, ambiguous))| ambiguous);
        let back = args.refused.unwrap_or(crate::Currencies::NONE);
        if args.refused.is_some() {
            // The provider refused the call and counted nothing of it in the currencies it
            // gives back: what it was charged there comes back, and it is done (an adapter
            // that retries admits it again).
            let mut charged = found.map_or(args.charged.per_currency(), |(_, f, _)| f.charged);
            for c in Currency::ALL {
                if !back.contains(c) {
                    charged[c] = 0;
                }
            }
            self.add_delta(limits, charged.map(|c| clamp_i64(i128::from(c))));
            if let (Some(flights), Some((i, _, _))) = (self.flights.as_deref_mut(), found) {
                for c in Currency::ALL {
                    if back.contains(c) {
                        flights.list[i].charged[c] = 0;
                    }
                }
                flights.list[i].done = true;
            }
        }
        let mut above: PerCurrency<Option<i64>> = PerCurrency::splat(None);
        let mut spent: PerCurrency<Option<i64>> = PerCurrency::splat(None);
        let mut lowered = PerCurrency::splat(0u64);
        let mut returned = PerCurrency::splat(0u64);
        for c in Currency::ALL {
            let (Some(remaining), Some(tight)) = (args.remaining[c], tightest(limits, c)) else {
                continue;
            };
            let w = Window {
                rate: limits.flat()[tight].1,
            };
            let counted = w.units(remaining.min(w.rate.burst()));
            let Some((_, flight, (before, _))) = found else {
                above[c] = Some(clamp_i64(w.whole(self.real.units[tight] - counted)));
                for ((currency, w), level) in windows(limits).zip(self.real.units.iter_mut()) {
                    if currency == c {
                        *level = (*level).min(w.units(remaining.min(w.rate.burst())));
                    }
                }
                continue;
            };
            // The call's own charge is in its record; a refused call is not in the count where
            // the provider gave it back.
            let mut held = flight.level[c];
            if back.contains(c) {
                held -= w.units_capped(flight.charged[c]);
            }
            // What was spent elsewhere if the provider counted the calls in the order they went
            // out: a sample for the model, right on average.
            let likely = clamp_i64(w.whole(held - counted));
            // Calls that went out close to it are left out, whichever side of it they were
            // counted on: what is taken off is never more than was spent elsewhere.
            let excess = clamp_i64(w.whole(held - w.units_capped(before[c]) - counted));
            let corrected = self.flights.as_deref().map_or(0, |f| f.corrected[c]);
            let since = corrected.saturating_sub(flight.corrected[c]);
            above[c] = Some(excess);
            spent[c] = Some(likely.saturating_add(flight.corrected[c]));
            // What this count finds spent elsewhere beyond what was corrected: the likely
            // amount, but never more than the margin beyond the least there can be (a burst
            // that reached the provider in another order can't take off more than that).
            let margin = clamp_i64(i128::from(args.margin[c]));
            let found_more = likely
                .saturating_sub(since)
                .min(excess.saturating_sub(since).saturating_add(margin));
            // A margin held ready for spending elsewhere applies only when this count finds
            // more of it.
            let margin = if args.margin_if_above[c] && found_more <= 0 {
                0
            } else {
                margin
            };
            let take = found_more.saturating_add(margin);
            let Some(flights) = self.flights.as_deref_mut() else {
                continue;
            };
            if take > 0 {
                flights.corrected[c] = flights.corrected[c].saturating_add(take);
                lowered[c] = take.unsigned_abs();
                if found_more > 0 {
                    flights.cover[c] = found_more.min(take).unsigned_abs();
                    flights.covers = flight.id;
                }
                self.shift(limits, c, -take);
            } else if take < 0 {
                let back = take.unsigned_abs().min(args.returnable[c]);
                if back > 0 {
                    flights.corrected[c] =
                        flights.corrected[c].saturating_sub(clamp_i64(i128::from(back)));
                    returned[c] = back;
                    self.shift(limits, c, clamp_i64(i128::from(back)));
                }
            }
        }
        let since = found.map_or(0, |(_, f, _)| now.0 - f.at.0);
        if args.refused.is_some()
            && let Some(flights) = self.flights.as_deref_mut()
        {
            flights.prune(now);
            if flights.list.is_empty() {
                self.flights = None;
            }
        }
        self.replan();
        Step::Synced(Box::new(super::Synced {
            above,
            spent,
            ambiguous,
            since: std::time::Duration::from_nanos(since),
            lowered,
            returned,
        }))
    }

    /// Settles call `flight` (charged `charged`, if the key no longer remembers it) with what
    /// it used, per currency (`None`: as charged): a refund for an overestimate; for an
    /// underestimate, a charge, less what the cover of a sync that counted the call pays
    /// (never more than that cover holds). With `last`, the call is done.
    pub(crate) fn settle(
        &mut self,
        limits: &Limits,
        now: Nanos,
        flight: u64,
        charged: Cost,
        used: PerCurrency<Option<u64>>,
        last: bool,
    ) -> Step {
        let now = self.refilled(limits, now);
        let mut flights = self.flights.as_mut();
        let found = flights.as_ref().and_then(|f| f.find(flight));
        let mut was = charged.per_currency();
        let mut coverable = false;
        if let (Some(flights), Some(i)) = (&flights, found) {
            was = flights.list[i].charged;
            coverable = flights.list[i].id <= flights.covers;
        }
        let mut delta = Delta::default();
        for c in Currency::ALL {
            let Some(used) = used[c] else {
                continue;
            };
            if limits.of(c).is_empty() {
                continue;
            }
            let difference = i128::from(was[c]) - i128::from(used);
            delta[c] = if difference >= 0 {
                clamp_i64(difference)
            } else {
                let shortfall = u64::try_from(-difference).unwrap_or(u64::MAX);
                let covered = match flights.as_deref_mut() {
                    Some(flights) if coverable => {
                        let covered = shortfall.min(flights.cover[c]);
                        flights.cover[c] -= covered;
                        covered
                    }
                    _ => 0,
                };
                -clamp_i64(i128::from(shortfall - covered))
            };
            if let (Some(flights), Some(f)) = (flights.as_deref_mut(), found) {
                flights.list[f].charged[c] = used;
            }
        }
        if last && let (Some(flights), Some(f)) = (flights, found) {
            flights.list[f].done = true;
            flights.prune(now);
            if flights.list.is_empty() {
                self.flights = None;
            }
        }
        self.add_delta(limits, delta);
        Step::Settled(delta)
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
                    super::Amount::from_units(w.refill(*level, elapsed), w.rate.period_nanos()),
                )
            })
            .collect()
    }

    /// How many calls hold a ticket.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.queue.as_ref().map_or(0, |q| q.tickets.len())
    }

    /// True when nobody waits (every ticket left, if any, lapsed before `now`) and no pause is
    /// in force at `now`: where an arriving call needs to look at nothing but the windows (the
    /// Redis script's fast path).
    #[cfg(feature = "testing")]
    pub(crate) fn is_quiet(&self, now: Nanos) -> bool {
        now >= self.paused_until
            && self
                .queue
                .as_ref()
                .is_none_or(|q| q.tickets.iter().all(|t| t.lease_until < now))
    }

    /// True when the state says nothing a fresh one wouldn't: every window full at `now`, no
    /// pause, nobody waiting, no call in flight. Such a key may be forgotten.
    pub(crate) fn is_idle(&self, limits: &Limits, now: Nanos) -> bool {
        let elapsed = now.0.saturating_sub(self.real.at.0);
        self.queue.is_none()
            && self.flights.is_none()
            && now >= self.paused_until
            && windows(limits)
                .zip(self.real.units.iter())
                .all(|((_, w), level)| w.refill(*level, elapsed) >= w.cap())
    }
}

/// The index, among the key's windows, of the tightest window of `currency` (the smallest
/// burst, the first of equals): the one a provider's count of that currency speaks of.
fn tightest(limits: &Limits, currency: Currency) -> Option<usize> {
    limits
        .flat()
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| *c == currency)
        .min_by_key(|(_, (_, rate))| rate.burst())
        .map(|(i, _)| i)
}

fn clamp_i64(value: i128) -> i64 {
    i64::try_from(value).unwrap_or(if value > 0 { i64::MAX } else { i64::MIN })
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
            state.acquire(&l, Nanos(0), Cost::new(0, 9), None, false, LEASE, &mut id),
            Ok(Step::Admitted)
        );
        // 1 token left: the big call is due when 10 exist, at 0.9 s.
        assert_eq!(
            state.acquire(&l, Nanos(0), big, None, false, LEASE, &mut id),
            Ok(Step::Queued {
                id: 1,
                due_in: 900 * MS
            })
        );
        // The token that exists now is promised: the small call queues behind, due at 1.0 s.
        assert_eq!(
            state.acquire(&l, Nanos(0), small, None, false, LEASE, &mut id),
            Ok(Step::Queued {
                id: 2,
                due_in: 1_000 * MS
            })
        );
        // Asking early changes nothing but says when to come back.
        assert_eq!(
            state.admit(&l, Nanos(500 * MS), 1, false, LEASE),
            Ok(Step::NotYet { wait: 400 * MS })
        );
        assert_eq!(
            state.admit(&l, Nanos(900 * MS), 1, false, LEASE),
            Ok(Step::Admitted)
        );
        assert_eq!(
            state.admit(&l, Nanos(1_000 * MS), 2, false, LEASE),
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
            state.acquire(&l, Nanos(0), call, None, false, LEASE, &mut id),
            Ok(Step::Admitted)
        );
        let Ok(Step::Queued { id: ticket, .. }) =
            state.acquire(&l, Nanos(0), call, None, false, LEASE, &mut id)
        else {
            panic!("expected a ticket")
        };
        state.cancel(Nanos(300 * MS), ticket);
        assert!(state.snapshot(&l, Nanos(300 * MS))[0].tokens.is(3, 10));
        assert_eq!(
            state.admit(&l, Nanos(2_000 * MS), ticket, false, LEASE),
            Ok(Step::Lost)
        );
        // With the queue empty, the next call is due at once when the token exists.
        assert_eq!(
            state.acquire(&l, Nanos(1_000 * MS), call, None, false, LEASE, &mut id),
            Ok(Step::Admitted)
        );
    }

    #[test]
    fn a_lapsed_ticket_stops_blocking_those_behind_it() {
        let l = limits("", "10/s");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        state
            .acquire(&l, Nanos(0), Cost::new(0, 10), None, false, LEASE, &mut id)
            .unwrap();
        // Two tickets: the first (due 1 s) is never claimed; the second is due at 1.5 s.
        state
            .acquire(&l, Nanos(0), Cost::new(0, 10), None, false, LEASE, &mut id)
            .unwrap();
        assert_eq!(
            state.acquire(&l, Nanos(0), Cost::new(0, 5), None, false, LEASE, &mut id),
            Ok(Step::Queued {
                id: 2,
                due_in: 1_500 * MS
            })
        );
        // At 1.5 s the dead ticket still holds its 10 tokens: the second must wait, behind it.
        assert!(matches!(
            state.admit(&l, Nanos(1_500 * MS), 2, false, LEASE),
            Ok(Step::Behind { .. })
        ));
        // Its lease (1 s past its due) runs out at 2 s: then the second passes.
        assert_eq!(
            state.admit(&l, Nanos(2_000 * MS + 1), 2, false, LEASE),
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
            .acquire(&l, Nanos(0), call, None, false, LEASE, &mut id)
            .unwrap();
        for (ticket, due) in [(1, 100), (2, 200)] {
            assert_eq!(
                state.acquire(&l, Nanos(0), call, None, false, LEASE, &mut id),
                Ok(Step::Queued {
                    id: ticket,
                    due_in: due * MS
                })
            );
        }
        // The head of the line asking early is not behind anyone.
        assert_eq!(
            state.admit(&l, Nanos(50 * MS), 1, false, LEASE),
            Ok(Step::NotYet { wait: 50 * MS })
        );
        // Ticket 2 is due at 200 ms, but ticket 1 has not come: were it to pass now, ticket 2
        // could pass one refill later.
        assert_eq!(
            state.admit(&l, Nanos(200 * MS), 2, false, LEASE),
            Ok(Step::Behind { wait: 100 * MS })
        );
        // Nor is a ticket held up by a pause, even with calls ahead of it.
        state.penalize(&l, Nanos(200 * MS), Nanos(1_000 * MS), Currencies::ALL);
        assert_eq!(
            state.admit(&l, Nanos(200 * MS), 2, false, LEASE),
            Ok(Step::NotYet { wait: 800 * MS })
        );
    }

    #[test]
    fn max_wait_refuses_without_queueing() {
        let l = limits("1/m", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let call = Cost::call(0);
        state
            .acquire(&l, Nanos(0), call, None, false, LEASE, &mut id)
            .unwrap();
        assert_eq!(
            state.acquire(
                &l,
                Nanos(0),
                call,
                Some(Duration::from_secs(10)),
                false,
                LEASE,
                &mut id
            ),
            Ok(Step::NotYet { wait: 60_000 * MS })
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
                false,
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
            state.adjust(&l, Nanos(step), Delta::from([0, i64::MIN, 0, 0]));
        }
        let w = Window {
            rate: *l.tokens().as_slice().first().unwrap(),
        };
        assert_eq!(state.real.units[0], w.floor());
        for step in 0..1_000u64 {
            state.adjust(&l, Nanos(1_000 + step), Delta::from([0, i64::MAX, 0, 0]));
        }
        assert_eq!(state.real.units[0], w.cap());
        let waited = state.acquire(
            &l,
            Nanos(u64::MAX),
            Cost::new(0, u64::MAX),
            None,
            false,
            LEASE,
            || 1,
        );
        assert_eq!(waited, Ok(Step::Admitted));
    }

    #[test]
    fn at_the_end_of_the_clock_a_call_that_may_not_wait_is_never_queued() {
        let l = limits("1/s", "");
        let mut state = KeyState::new(&l, Nanos(u64::MAX - 1));
        let mut id = ids();
        let end = Nanos(u64::MAX);
        assert_eq!(
            state.acquire(
                &l,
                end,
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                LEASE,
                &mut id
            ),
            Ok(Step::Admitted)
        );
        // The next token exists a second after the end of the clock: not now, and no ticket.
        assert_eq!(
            state.acquire(
                &l,
                end,
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                LEASE,
                &mut id
            ),
            Ok(Step::NotYet { wait: 1_000 * MS })
        );
        assert_eq!(state.queued(), 0);
    }

    #[test]
    fn a_wait_beyond_the_clock_is_never_hinted_shorter_than_it_is() {
        // One token a year: after the burst, the next is a year away, 10^16 nanoseconds and
        // more; from 2^64 - 1 ns, far past the end of the clock.
        let l = limits("1/365d", "");
        let mut state = KeyState::new(&l, Nanos(u64::MAX));
        let mut id = ids();
        let end = Nanos(u64::MAX);
        assert!(matches!(
            state.acquire(
                &l,
                end,
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                LEASE,
                &mut id
            ),
            Ok(Step::Admitted)
        ));
        let year = 365 * 86_400 * 1_000 * MS;
        assert_eq!(
            state.acquire(
                &l,
                end,
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                LEASE,
                &mut id
            ),
            Ok(Step::NotYet { wait: year })
        );
        // Two years of debt: the exact wait passes 2^64 ns only with a long enough debt, so
        // take the window 64 bursts into debt on a rate whose refill is one unit a period.
        let slow = limits("", "1/365d burst 1000000000");
        let mut state = KeyState::new(&slow, Nanos(u64::MAX));
        state.adjust(&slow, Nanos(u64::MAX), Delta::from([0, i64::MIN, 0, 0]));
        assert_eq!(
            state.acquire(
                &slow,
                end,
                Cost::new(0, 1),
                Some(Duration::ZERO),
                false,
                LEASE,
                &mut id
            ),
            Ok(Step::NotYet { wait: u64::MAX })
        );
    }
}
