//! A key's whole state and its transitions, each all or nothing and taking the store's time as
//! an argument. They come in two halves, as in the Redis script that ports them:
//! - [`admission`]: a call pays its whole cost at once or waits its turn (acquire, admit,
//!   cancel), and a charge is corrected afterwards (adjust);
//! - [`ledger`]: what the provider said, kept against what was charged (penalize, lower, sync,
//!   settle), over the calls in flight of [`Flights`].
//!
//! This file keeps the state itself and what both halves use: refilling, the queue's schedule,
//! the snapshot.

use std::time::Duration;

mod admission;
#[cfg(test)]
mod fair;
mod ledger;

use super::flights::Flights;
use super::op::Outcome;
use super::op::{Share, Ticket};
use super::queue::{Place, Queue, add, fair_step, scale};
use super::window::{Levels, Window, windows};
use super::{
    Available, BucketError, Delta, MAX_QUEUE, Nanos, SCAN_AHEAD, SyncArgs, Synced, saturate,
    validate,
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

    /// Forgets the queue once nobody waits in it (most keys, most of the time, have none).
    fn forget_empty_queue(&mut self) {
        if self.queue.as_ref().is_some_and(|q| q.tickets.is_empty()) {
            self.queue = None;
        }
    }

    fn pending(&self) -> Cost {
        self.queue.as_ref().map_or(Cost::default(), |q| q.pending)
    }

    /// The levels changed other than by a ticket paying: the schedule must be rebuilt, and
    /// no ticket waiting is promised any more.
    fn replan(&mut self) {
        if let Some(queue) = self.queue.as_mut() {
            queue.shadow = None;
            queue.break_promises();
        }
    }

    /// Promised tickets due by `now` pass: each is charged at its due time, in order, as if
    /// its holder had asked then (it goes without asking). Runs before every operation, so
    /// that each sees the levels as they are.
    pub(crate) fn charge_due(&mut self, limits: &Limits, now: Nanos) {
        let Some(queue) = self.queue.as_mut() else {
            return;
        };
        let now = now.max(self.real.at);
        while let Some(t) = queue.tickets.front().copied() {
            if !queue.promised(&t) || t.due > now {
                break;
            }
            self.real.advance(limits, t.due);
            self.real.charge(limits, t.cost);
            queue.remove(0);
        }
        self.forget_empty_queue();
    }

    /// Drops lapsed tickets at the head of the queue (others lapse when they reach it, or when a
    /// ticket behind them looks past them).
    fn expire_head(&mut self, now: Nanos) {
        if let Some(queue) = &mut self.queue {
            while queue.tickets.front().is_some_and(|t| t.lease_until < now) {
                queue.remove(0);
                queue.shadow = None;
            }
            self.forget_empty_queue();
        }
    }

    /// The shadow levels, rebuilt from the real ones by replaying the queue if needed.
    fn shadow(&mut self, limits: &Limits, now: Nanos) -> &mut Levels {
        let real = &self.real;
        let paused_until = self.paused_until;
        let queue = self.queue.get_or_insert_with(|| Box::new(Queue::new()));
        let floor = queue.floor;
        queue.shadow.get_or_insert_with(|| {
            let mut shadow = real.clone();
            shadow.advance(limits, now.max(paused_until));
            for ticket in &queue.tickets {
                let due = shadow.wait(limits, Cost::default(), ticket.cost);
                let mut due = Nanos(saturate(u128::from(shadow.at.0) + due));
                // A promised ticket pays at its due time, never sooner (a cancellation ahead
                // of it may have made room sooner, but its holder sleeps until then).
                if ticket.promise && ticket.id > floor {
                    due = due.max(ticket.due);
                }
                shadow.advance(limits, due);
                shadow.charge(limits, ticket.cost);
            }
            shadow
        })
    }

    /// Adds `delta` to the windows of each currency (positive: a refund, never above capacity;
    /// negative: a charge that may go into debt, down to 64 bursts), to the real levels and to
    /// the schedule alike.
    fn add_delta(&mut self, limits: &Limits, delta: Delta) {
        // A charge takes what a promise counted on; a refund lets the tickets waiting pass
        // sooner than promised, and the limiter rings them to ask.
        if Currency::ALL.iter().any(|&c| delta[c] != 0)
            && let Some(queue) = self.queue.as_mut()
        {
            queue.break_promises();
        }
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

    /// How many tickets wait behind ticket `id` (`None`: it does not wait).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn behind(&self, id: u64) -> Option<usize> {
        let queue = self.queue.as_ref()?;
        queue.find(id).map(|at| queue.tickets.len() - at - 1)
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
