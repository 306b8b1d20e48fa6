//! The calls that wait on a key, in arrival order: their tickets, what they will pay, and the
//! shadow schedule that says when each is due.

use std::collections::VecDeque;

use super::Nanos;
use super::window::Levels;
use crate::cost::Cost;
use crate::rate::PerCurrency;

/// One waiting call's place.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub(crate) id: u64,
    pub(crate) cost: Cost,
    pub(crate) lease_until: Nanos,
    /// When it is due, as issued.
    pub(crate) due: Nanos,
    /// Issued promised: not to fly, behind promised tickets only (see [`Queue::promised`]).
    pub(crate) promise: bool,
}

#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) tickets: VecDeque<Place>,
    /// What the tickets will pay, in all.
    pub(crate) pending: Cost,
    /// The levels after every queued ticket has paid, as of the last one's due time; `None`
    /// when it must be rebuilt (after a cancellation, a penalty or a sync).
    pub(crate) shadow: Option<Levels>,
    /// Tickets up to this id lost their promise (a pause, a lowered count, a sync or a charge
    /// came before they were due).
    pub(crate) floor: u64,
}

impl Queue {
    pub(crate) fn new() -> Queue {
        Queue {
            tickets: VecDeque::new(),
            pending: Cost::default(),
            shadow: None,
            floor: 0,
        }
    }

    /// Whether `ticket` is promised: it will be charged at its due time, and its holder passes
    /// then without asking again. Promised tickets are the head of the queue: one is issued
    /// promised only behind promised ones, and a promise broken is broken for every ticket
    /// waiting. So none can pass ahead of its turn and charge what a promise counted on.
    pub(crate) fn promised(&self, ticket: &Place) -> bool {
        ticket.promise && ticket.id > self.floor
    }

    /// Whether a ticket issued now may be promised: every ticket waiting is.
    pub(crate) fn all_promised(&self) -> bool {
        self.tickets.back().is_none_or(|t| self.promised(t))
    }

    /// The levels changed under the schedule the promises were made on: no ticket waiting
    /// is promised any more.
    pub(crate) fn break_promises(&mut self) {
        if let Some(last) = self.tickets.back() {
            self.floor = self.floor.max(last.id);
        }
    }

    pub(crate) fn remove(&mut self, index: usize) {
        if let Some(ticket) = self.tickets.remove(index) {
            self.pending = sub(self.pending, ticket.cost);
        }
    }

    pub(crate) fn find(&self, id: u64) -> Option<usize> {
        self.tickets.binary_search_by_key(&id, |t| t.id).ok()
    }
}

/// What the holder of a ticket learns by reading the ticket's record at its due time, without
/// running the key's transitions (the Redis store's claim: `TIME` and one hash read, no
/// script).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// It passed at its due time (charged then, or to be charged at it by the next
    /// operation, which charges due promises first).
    Passed,
    /// Promised, and due after this long (in the store's unit).
    NotYet(u64),
    /// Only the key's transitions can say: ask them.
    Ask,
}

/// The claim at `now` of a ticket due at `due`, whose record says it is promised
/// (`Some(true)`), waiting unpromised (`Some(false)`), or gone (`None`), on a store whose
/// tickets lapse `lease` after their due time (all in the store's unit). A ticket leaves the
/// queue by its holder's question or cancellation, by its charge at its due time, or by
/// lapsing after its lease: gone between its due time and then, it was charged. Up to half
/// the lease only, so that the time read and the record read a moment later can't straddle a
/// lapse.
pub(crate) fn claim(now: u64, due: u64, lease: u64, record: Option<bool>) -> Claim {
    match record {
        Some(true) if now < due => Claim::NotYet(due - now),
        _ if now < due || now - due > lease / 2 => Claim::Ask,
        None | Some(true) => Claim::Passed,
        Some(false) => Claim::Ask,
    }
}

pub(crate) fn add(a: Cost, b: Cost) -> Cost {
    combine(a, b, u64::saturating_add)
}

pub(crate) fn sub(a: Cost, b: Cost) -> Cost {
    combine(a, b, u64::saturating_sub)
}

fn combine(a: Cost, b: Cost, f: fn(u64, u64) -> u64) -> Cost {
    let (a, b) = (a.per_currency(), b.per_currency());
    Cost::from_per_currency(PerCurrency::from_fn(|c| f(a[c], b[c])))
}

/// `cost · num / den`, rounded down, in every currency (saturating).
pub(crate) fn scale(cost: Cost, num: u64, den: u64) -> Cost {
    let one = |n: u64| {
        u64::try_from(u128::from(n) * u128::from(num) / u128::from(den.max(1))).unwrap_or(u64::MAX)
    };
    Cost::from_per_currency(cost.per_currency().map(one))
}
