//! The calls on a key that went out through the HTTP gate and have not settled: what each was
//! charged, when it went out, and what the key's windows held right after, on the store's
//! clock, for every process that shares the key.
//!
//! A provider stamps its `remaining` count when a call *arrives*, and the answer that carries
//! it comes back later, sometimes seconds later. Between the stamp and the answer both sides
//! refilled, both saw the same calls go out and the same answers settle, and both may have
//! hit their capacity; what only the provider saw is spending elsewhere. So a sync compares
//! like with like: the provider's count against what the windows held when the call went out
//! (its record here), and the difference is what was spent elsewhere by then, less what the
//! key has already taken off for such spending since (its running `corrected` total). Only
//! that rest is taken off now. Nothing depends on how long the answer took, on the order
//! answers come back in, or on a capacity reached in between.
//!
//! The ledger also keeps the **cover**: what the last sync that lowered a currency took off
//! to reach the provider's count. The provider's count already held the true cost of every
//! call it had seen, so a call it had seen may settle a shortfall against that cover instead
//! of charging it again; no more than the cover, so that a provider that says little (or
//! lies) can never let a shortfall go uncharged beyond what a sync really took off.

use std::collections::VecDeque;

use super::{FLIGHT_LEASE, MAX_FLIGHTS, Nanos, SEND_SKEW};
use crate::rate::{Currency, PerCurrency};

/// One call in flight (or settled, kept while an earlier one is still in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flight {
    pub(crate) id: u64,
    /// When it went out (was admitted), on the store's clock.
    pub(crate) at: Nanos,
    /// What it is charged now, per currency: its estimate, or what it settled at.
    pub(crate) charged: PerCurrency<u64>,
    pub(crate) done: bool,
    /// What the tightest window of each currency held right after the call was charged, in
    /// its units (0 for a currency without windows).
    pub(crate) level: PerCurrency<i128>,
    /// The key's [`Flights::corrected`] totals when the call went out.
    pub(crate) corrected: PerCurrency<i64>,
    /// The windows (bit `i` for the key's window `i`, the first 32) that were full when the call
    /// was charged: the call made them start refilling when it went out, the provider's when it
    /// counted it. Cleared once a sync has taken that difference off.
    pub(crate) full: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Flights {
    /// The number of the next call to go out.
    pub(crate) next: u64,
    /// In the order they went out (which is the order of their numbers).
    pub(crate) list: VecDeque<Flight>,
    /// What the last sync or penalty took off the windows for calls the provider had counted.
    pub(crate) cover: Cover,
    /// Whole tokens per currency taken off (positive) or given back (negative) for spending
    /// elsewhere since the ledger began: by syncs, and by the gate's model of that spending.
    pub(crate) corrected: PerCurrency<i64>,
}

impl Flights {
    pub(crate) fn new() -> Flights {
        Flights {
            next: 1,
            ..Flights::default()
        }
    }

    /// A call charged `charged` goes out at `now`, leaving the tightest window of each currency
    /// at `level`: its number.
    pub(crate) fn fly(
        &mut self,
        now: Nanos,
        charged: PerCurrency<u64>,
        level: PerCurrency<i128>,
        full: u32,
    ) -> u64 {
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
            level,
            corrected: self.corrected,
            full,
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
        if self.list.front().is_none_or(|f| !self.cover.counted(f.id)) {
            self.cover.tokens = PerCurrency::default();
        }
    }

    /// What the calls that went out within [`SEND_SKEW`] of call `index`, before or after it,
    /// were charged, per currency: the provider may have counted any of them before it or
    /// after it (calls reach it in an order of their own), so a comparison of its count with
    /// the windows' level leaves them out, and can only find less spending elsewhere than
    /// there was, never more. And whether there were any: the count is then ambiguous. (Calls
    /// are kept in the order they went out, which is the order of the store's clock.)
    pub(crate) fn close_to(&self, index: usize) -> (PerCurrency<u64>, bool) {
        let flight = self.list[index];
        let mut close = PerCurrency::splat(0u64);
        let mut ambiguous = false;
        let near = |other: &Flight| {
            other.at.plus(SEND_SKEW) >= flight.at && other.at <= flight.at.plus(SEND_SKEW)
        };
        let before = self.list.range(..index).rev().take_while(|o| near(o));
        let after = self.list.range(index + 1..).take_while(|o| near(o));
        for other in before.chain(after) {
            ambiguous = true;
            for c in Currency::ALL {
                close[c] = close[c].saturating_add(other.charged[c]);
            }
        }
        (close, ambiguous)
    }
}

/// The cover: what a provider's count showed spent, and the key took off its windows to
/// match (a sync that lowered them, a 429 that emptied them), for the calls that count held.
/// The provider had counted those calls at their true cost, so one of them that settles above
/// its charge draws the difference from here before the windows are charged: never more than
/// what was taken off, so a provider that says little (or lies) can never leave a shortfall
/// uncharged beyond it.
///
/// The one rule of both ledgers: the store's, over the calls in flight numbered by
/// [`Flights`] (a sync covers calls up to the one it answered; a penalty, up to the last
/// out), and a limiter's own, for permits settled without a flight (numbered by the count of
/// penalties before them, so that a penalty covers the permits admitted before it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cover {
    /// Whole tokens per currency taken off for the counted calls, not yet drawn.
    pub(crate) tokens: PerCurrency<u64>,
    /// Calls numbered up to this one were counted.
    pub(crate) upto: u64,
}

impl Cover {
    /// Whether call `call` was in the count.
    pub(crate) fn counted(&self, call: u64) -> bool {
        call <= self.upto
    }

    /// What the cover pays of call `call`'s `shortfall` in `currency`: nothing for a call the
    /// count did not hold, else as much as is left, taken from it.
    pub(crate) fn draw(&mut self, call: u64, currency: Currency, shortfall: u64) -> u64 {
        if !self.counted(call) {
            return 0;
        }
        let paid = shortfall.min(self.tokens[currency]);
        self.tokens[currency] -= paid;
        paid
    }
}

/// What settling a call charged `charged` that used `used` adds to its currency's windows: the
/// overestimate back, or the shortfall charged less what `cover` pays of it (given the
/// shortfall). Saturates at `i64`'s range.
pub(crate) fn settlement(charged: u64, used: u64, cover: impl FnOnce(u64) -> u64) -> i64 {
    if used <= charged {
        super::saturate(charged - used)
    } else {
        let shortfall = used - charged;
        -super::saturate::<u64, i64>(shortfall - cover(shortfall).min(shortfall))
    }
}
