//! The calls on a key that went out through the HTTP gate and have not settled: what each was
//! charged and when it went out, on the store's clock, for every process that shares the key.
//!
//! A provider stamps its `remaining` count when a call *arrives*, and the answer that carries
//! it comes back later, sometimes seconds later. To bring the windows in line with that count
//! a sync needs two things the answer does not say: the refill since the stamp (the count was
//! taken about when the call went out), and the calls that went out after it (charged here,
//! not yet counted there), from every process. Both come from this ledger, kept with the
//! key's windows so that one store call reads and changes them together.
//!
//! The ledger also keeps the **cover**: what the last sync that lowered a currency took off
//! to reach the provider's count. The provider's count already held the true cost of every
//! call it had seen, so a call it had seen may settle a shortfall against that cover instead
//! of charging it again; no more than the cover, so that a provider that says little (or
//! lies) can never let a shortfall go uncharged beyond what a sync really took off.

use std::collections::VecDeque;

use super::{FLIGHT_LEASE, MAX_FLIGHTS, Nanos, PerCurrency, SEND_SKEW};

/// One call in flight (or settled, kept while an earlier one is still in flight: a sync of
/// that earlier one must still count it as unseen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flight {
    pub(crate) id: u64,
    /// When it went out (was admitted), on the store's clock.
    pub(crate) at: Nanos,
    /// What it is charged now, per currency: its estimate, or what it settled at.
    pub(crate) charged: PerCurrency<u64>,
    pub(crate) done: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Flights {
    /// The number of the next call to go out.
    pub(crate) next: u64,
    /// In the order they went out (which is the order of their numbers).
    pub(crate) list: VecDeque<Flight>,
    /// Tokens per currency that a sync took off the windows to reach the provider's count.
    pub(crate) cover: PerCurrency<u64>,
    /// Calls numbered up to this one were in that count, and may settle against the cover.
    pub(crate) covers: u64,
}

impl Flights {
    pub(crate) fn new() -> Flights {
        Flights {
            next: 1,
            ..Flights::default()
        }
    }

    /// A call charged `charged` goes out at `now`: its number.
    pub(crate) fn fly(&mut self, now: Nanos, charged: PerCurrency<u64>) -> u64 {
        self.prune(now);
        if self.list.len() >= MAX_FLIGHTS {
            self.list.pop_front();
        }
        let id = self.next;
        self.next += 1;
        self.list.push_back(Flight {
            id,
            at: now,
            charged,
            done: false,
        });
        id
    }

    pub(crate) fn find(&self, id: u64) -> Option<usize> {
        self.list.binary_search_by_key(&id, |f| f.id).ok()
    }

    /// Forgets, from the front, calls that settled and calls that outlived their lease; the
    /// cover goes with the last call it could serve.
    pub(crate) fn prune(&mut self, now: Nanos) {
        while self
            .list
            .front()
            .is_some_and(|f| f.done || f.at.plus(FLIGHT_LEASE) < now)
        {
            self.list.pop_front();
        }
        if self.list.front().is_none_or(|f| f.id > self.covers) {
            self.cover = [0; 3];
        }
    }

    /// What the calls that went out well after call `index` (see [`SEND_SKEW`]) were
    /// charged, per currency, whether or not they have settled: the provider had not seen
    /// them when it counted call `index`. And whether that count is ambiguous: another call
    /// went out within the skew of it. (Calls are kept in the order they went out, which is
    /// the order of the store's clock.)
    pub(crate) fn after(&self, index: usize) -> (PerCurrency<u64>, bool) {
        let flight = self.list[index];
        let later = flight.at.plus(SEND_SKEW);
        let mut unseen = [0u64; 3];
        let mut ambiguous = false;
        for other in self.list.range(index + 1..) {
            if other.at > later {
                for (sum, charged) in unseen.iter_mut().zip(other.charged) {
                    *sum = sum.saturating_add(charged);
                }
            } else {
                ambiguous = true;
            }
        }
        if index > 0 && self.list[index - 1].at.plus(SEND_SKEW) >= flight.at {
            ambiguous = true;
        }
        (unseen, ambiguous)
    }
}
