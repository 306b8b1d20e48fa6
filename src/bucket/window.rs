//! One window's arithmetic, in units of `1/P` token, and the levels of every window of a key.

use super::{DEBT_BURSTS, Nanos};
use crate::cost::Cost;
use crate::rate::{Currency, Limits, Rate};

/// One window, in units of `1/P` token (`P` its period in nanoseconds).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) rate: Rate,
}

impl Window {
    pub(crate) fn scale(self) -> i128 {
        i128::from(self.rate.period_nanos())
    }

    pub(crate) fn cap(self) -> i128 {
        i128::from(self.rate.burst()) * self.scale()
    }

    pub(crate) fn floor(self) -> i128 {
        -DEBT_BURSTS * self.cap()
    }

    pub(crate) fn units(self, amount: u64) -> i128 {
        i128::from(amount) * self.scale()
    }

    /// Units of `amount`, capped where the cap already decides (beyond the debt floor and the
    /// capacity, no level can tell the difference): how the Redis script counts amounts, to
    /// stay inside its exact range.
    pub(crate) fn units_capped(self, amount: u64) -> i128 {
        let limit = u64::try_from(DEBT_BURSTS + 2)
            .unwrap_or(u64::MAX)
            .saturating_mul(self.rate.burst());
        self.units(amount.min(limit))
    }

    /// The level `elapsed` after `level`: refilled, and saturated at the capacity.
    pub(crate) fn refill(self, level: i128, elapsed: u64) -> i128 {
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
    pub(crate) fn wait(self, level: i128, needed: i128) -> u128 {
        if level >= needed {
            return 0;
        }
        let amount = i128::from(self.rate.amount());
        // Non-negative: `needed > level`.
        ((needed - level + amount - 1) / amount) as u128
    }

    pub(crate) fn clamp(self, level: i128) -> i128 {
        level.clamp(self.floor(), self.cap())
    }

    /// Whole tokens in `units`, rounded down.
    pub(crate) fn whole(self, units: i128) -> i128 {
        units.div_euclid(self.scale())
    }
}

pub(crate) fn windows(limits: &Limits) -> impl Iterator<Item = (Currency, Window)> + '_ {
    limits
        .flat()
        .iter()
        .map(|(currency, rate)| (*currency, Window { rate: *rate }))
}

/// The levels of every window of a key, as of an instant.
#[derive(Debug, Clone)]
pub(crate) struct Levels {
    pub(crate) at: Nanos,
    pub(crate) units: Box<[i128]>,
}

impl Levels {
    pub(crate) fn full(limits: &Limits, at: Nanos) -> Levels {
        Levels {
            at,
            units: windows(limits).map(|(_, w)| w.cap()).collect(),
        }
    }

    /// The levels at `t` (not before `self.at`), refilled.
    pub(crate) fn advance(&mut self, limits: &Limits, t: Nanos) {
        let elapsed = t.0.saturating_sub(self.at.0);
        for ((_, w), level) in windows(limits).zip(self.units.iter_mut()) {
            *level = w.refill(*level, elapsed);
        }
        self.at = self.at.max(t);
    }

    /// Nanoseconds from `self.at` until every window can pay `cost` on top of `ahead`.
    pub(crate) fn wait(&self, limits: &Limits, ahead: Cost, cost: Cost) -> u128 {
        windows(limits)
            .zip(self.units.iter())
            .map(|((c, w), level)| w.wait(*level - w.units(ahead.of(c)), w.units(cost.of(c))))
            .max()
            .unwrap_or(0)
    }

    /// Nanoseconds for every window to refill `cost` from nothing.
    pub(crate) fn refill_time(&self, limits: &Limits, cost: Cost) -> u128 {
        windows(limits)
            .map(|(c, w)| w.wait(0, w.units(cost.of(c))))
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn charge(&mut self, limits: &Limits, cost: Cost) {
        for ((c, w), level) in windows(limits).zip(self.units.iter_mut()) {
            *level = w.clamp(*level - w.units(cost.of(c)));
        }
    }
}
