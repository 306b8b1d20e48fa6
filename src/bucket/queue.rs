//! The calls that wait on a key, in fair order (arrival order for one tenant): their tickets,
//! what they will pay, and the shadow schedule that says when each is due.

use std::collections::{HashMap, VecDeque};

use super::Nanos;
use super::window::Levels;
use crate::cost::Cost;
use crate::rate::{Limits, PerCurrency};

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
    /// Its place in the fair order: the queue is sorted by tag, then by id.
    pub(crate) tag: u64,
    /// Its tenant ([`Share`](super::op::Share)'s id; 0: the key's own calls).
    pub(crate) tenant: u64,
}

/// A tenant with tickets waiting: the tag of its last ticket, and how many wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiting {
    pub(crate) tag: u64,
    pub(crate) tickets: u32,
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
    /// The id of the last ticket issued (ids grow in the order tickets are issued).
    pub(crate) last_id: u64,
    /// The tenants with tickets waiting: each one's last tag and how many wait. A tenant whose
    /// last ticket left (passed, given up, lapsed) is forgotten, so its next call starts from
    /// the head, as a tenant with nothing waiting should.
    pub(crate) tenants: HashMap<u64, Waiting>,
    /// Every ticket went in at the back since the queue was last empty: ids are in order too.
    pub(crate) by_id: bool,
}

impl Queue {
    pub(crate) fn new() -> Queue {
        Queue {
            tickets: VecDeque::new(),
            pending: Cost::default(),
            shadow: None,
            floor: 0,
            last_id: 0,
            tenants: HashMap::new(),
            by_id: true,
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
        if !self.tickets.is_empty() {
            self.floor = self.floor.max(self.last_id);
        }
    }

    pub(crate) fn remove(&mut self, index: usize) {
        if let Some(ticket) = self.tickets.remove(index) {
            self.left(&ticket);
        }
    }

    /// `ticket` left the queue: what it would have paid, and its tenant's count, go with it.
    pub(crate) fn left(&mut self, ticket: &Place) {
        self.pending = sub(self.pending, ticket.cost);
        if let std::collections::hash_map::Entry::Occupied(mut entry) =
            self.tenants.entry(ticket.tenant)
        {
            entry.get_mut().tickets = entry.get().tickets.saturating_sub(1);
            if entry.get().tickets == 0 {
                entry.remove();
            }
        }
    }

    pub(crate) fn find(&self, id: u64) -> Option<usize> {
        if self.by_id {
            self.tickets.binary_search_by_key(&id, |t| t.id).ok()
        } else {
            self.tickets.iter().position(|t| t.id == id)
        }
    }

    /// The tag of a ticket of `tenant` whose fair step is `step`, and its place: behind every
    /// ticket of a tag up to its own (see [`Op::Acquire`](super::op::Op::Acquire)). With nobody
    /// waiting, the tenants' tags start again from 0.
    pub(crate) fn fair_place(&mut self, tenant: u64, step: u64) -> (u64, usize) {
        if self.tickets.is_empty() {
            self.tenants.clear();
            self.by_id = true;
        }
        let head = self.tickets.front().map_or(0, |t| t.tag);
        let last = self.tenants.get(&tenant).map_or(0, |w| w.tag);
        let tag = head.max(last).saturating_add(step).min(MAX_TAG);
        let at = self.tickets.partition_point(|t| t.tag <= tag);
        (tag, at)
    }

    /// Puts `place` of `tenant` at `at` (from [`fair_place`](Queue::fair_place)), counting
    /// what it will pay.
    pub(crate) fn insert(&mut self, at: usize, place: Place) {
        if at < self.tickets.len() {
            self.by_id = false;
        }
        let waiting = self
            .tenants
            .entry(place.tenant)
            .or_insert(Waiting { tag: 0, tickets: 0 });
        waiting.tag = place.tag;
        waiting.tickets += 1;
        self.last_id = self.last_id.max(place.id);
        self.pending = add(self.pending, place.cost);
        self.tickets.insert(at, place);
    }
}

/// The largest tag: 2^53 - 1, the largest integer the Redis script counts exactly (a sorted
/// set's score is a double). Microseconds of refill: reached only after centuries of backlog.
pub(crate) const MAX_TAG: u64 = (1 << 53) - 1;

/// The step a ticket's tag takes past its tenant's last one (or the head's): the microseconds
/// the key takes to refill `cost` in its slowest window, divided by the tenant's weight,
/// rounded up (at least 1, so that one tenant's tags only grow).
pub(crate) fn fair_step(limits: &Limits, cost: Cost, weight: u32) -> u64 {
    let refill = super::window::windows(limits)
        .map(|(c, w)| w.wait(0, w.units(cost.of(c))))
        .max()
        .unwrap_or(0);
    let micros = refill.div_ceil(1_000 * u128::from(weight.max(1)));
    u64::try_from(micros).unwrap_or(MAX_TAG).clamp(1, MAX_TAG)
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
