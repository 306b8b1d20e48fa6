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
}

#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) tickets: VecDeque<Place>,
    /// What the tickets will pay, in all.
    pub(crate) pending: Cost,
    /// The levels after every queued ticket has paid, as of the last one's due time; `None`
    /// when it must be rebuilt (after a cancellation, a penalty or a sync).
    pub(crate) shadow: Option<Levels>,
}

impl Queue {
    pub(crate) fn new() -> Queue {
        Queue {
            tickets: VecDeque::new(),
            pending: Cost::default(),
            shadow: None,
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
