//! Spending this process does not see: another program, a notebook or a colleague's script on
//! the same quota. Each header sync tells how much the key's windows held beyond what the
//! provider said was left, once the refill since the provider counted and every process's
//! calls it had not seen yet are accounted for (the store does both, see `Op::Sync`); what is
//! still missing, over the time since the last sync, is a rate of foreign spending. The model
//! keeps charging the key at that rate between syncs (so that a call waiting for its turn waits
//! as long as the provider would make it), and each sync corrects the rate by what it still
//! missed.
//!
//! In a fleet every process keeps a model of its own and charges the shared windows: each
//! measures what the windows missed after the others' charges, so together they charge what
//! the neighbour spends, not that many times over.

use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::Currencies;
use crate::bucket::index;
use crate::{Currency, Limiter};

/// How long the estimate remembers: spending is averaged with weights that halve about every
/// 3.5 s, so that one burst of a neighbour is not read as a lasting rate, and a stop shows
/// within seconds.
const MEMORY: f64 = 5.0;
/// How often the charger charges while a rate is estimated.
const TICK: Duration = Duration::from_millis(50);
/// How far ahead the model charges: a neighbour spends in steps between two charges, and a
/// call admitted right at its turn must not find the provider a step short.
const LEAD: Duration = Duration::from_millis(100);
/// Below this many tokens a second, the rate is forgotten and the charger stops.
const NEGLIGIBLE: f64 = 0.5;
/// The most of a currency's refill rate the estimate may give to others: the key always keeps
/// some, so that a call gets through, its response syncs, and an estimate too high is seen.
const MOST_SHARE: f64 = 0.75;
/// While spending elsewhere is seen, syncs leave the windows this fraction of their capacity
/// (1/25: 4%) below the provider's count.
const MARGIN: u64 = 25;
/// Without a sync for this long, the estimate halves every such span: a key whose calls
/// stopped can't correct it any other way.
const STALE: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Model {
    /// Tokens a second spent elsewhere, per currency.
    rate: [f64; 3],
    /// Spending elsewhere seen so far, and over how long (seconds), both decayed.
    spent: [f64; 3],
    span: [f64; 3],
    /// Charged by the model since the last sync.
    charged: [f64; 3],
    /// Where the last sync left the windows, against the provider's count (never positive:
    /// a sync lowers what is above, and a margin leaves them below).
    gap: [f64; 3],
    /// When each currency was last synced.
    synced: [Option<Instant>; 3],
    /// Fractions of a token charged for but not yet taken.
    owed: [f64; 3],
    /// When a sync last found the windows above the provider's count.
    elsewhere: [Option<Instant>; 3],
    /// Charged through this time (a little ahead of now).
    charged_at: Instant,
    charger: bool,
    /// The margin was kept back once before any answer came.
    blind: bool,
}

/// One key's model of foreign spending.
#[derive(Debug)]
pub(super) struct Foreign {
    model: Mutex<Model>,
}

impl Default for Foreign {
    fn default() -> Foreign {
        Foreign {
            model: Mutex::new(Model {
                rate: [0.0; 3],
                spent: [0.0; 3],
                span: [0.0; 3],
                charged: [0.0; 3],
                gap: [0.0; 3],
                synced: [None; 3],
                owed: [0.0; 3],
                elsewhere: [None; 3],
                charged_at: Instant::now(),
                charger: false,
                blind: false,
            }),
        }
    }
}

impl Foreign {
    fn model(&self) -> std::sync::MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The whole tokens per currency owed from the last charge until a little ahead of now,
    /// taken off the books (a sync charges them first).
    pub(super) fn due(&self) -> [u64; 3] {
        let mut model = self.model();
        let through = Instant::now() + LEAD;
        let elapsed = through
            .saturating_duration_since(model.charged_at)
            .as_secs_f64();
        model.charged_at = model.charged_at.max(through);
        std::array::from_fn(|i| {
            model.owed[i] += model.rate[i] * elapsed;
            let whole = model.owed[i].floor();
            if whole >= 1.0 {
                model.owed[i] -= whole;
                model.charged[i] += whole;
                whole as u64
            } else {
                0
            }
        })
    }

    /// Charges what the model says was spent elsewhere since the last charge.
    pub(super) async fn charge(&self, limiter: &Limiter) -> Result<(), crate::Error> {
        for (currency, tokens) in Currency::ALL.into_iter().zip(self.due()) {
            if tokens > 0 {
                limiter.charge(currency, tokens).await?;
            }
        }
        Ok(())
    }

    /// A sync of `currency` found the windows `above` tokens above the provider's count
    /// (negative: below), and left them `gap` from it: what was spent elsewhere since the last
    /// sync is what the model charged meanwhile plus how much further above the count the
    /// windows were than the last sync left them. The rate is the decayed average of that
    /// spending over time, between 0 and `most` (the currency's refill rate: nobody spends
    /// faster for long). Answers true when a charger should be started.
    ///
    /// A sync that can't be read (another call went out too close to the answered one to tell
    /// whether the provider counted it: not `clear`) still starts the next interval, and its
    /// own is left out.
    pub(super) fn synced(
        &self,
        currency: Currency,
        above: i64,
        gap: i64,
        most: f64,
        clear: bool,
    ) -> bool {
        let mut model = self.model();
        let now = Instant::now();
        let i = index(currency);
        if !clear {
            model.charged[i] = 0.0;
        } else if let Some(last) = model.synced[i] {
            let seconds = now.saturating_duration_since(last).as_secs_f64();
            let charged = std::mem::take(&mut model.charged[i]);
            // Nobody spends faster than the refill for long: a sample beyond it (two answers
            // that reached here out of order) is cut to it.
            let bound = most * seconds;
            let spent = (charged + (above as f64 - model.gap[i])).clamp(-bound, bound);
            let keep = (-seconds / MEMORY).exp();
            model.spent[i] = model.spent[i] * keep + spent;
            model.span[i] = model.span[i] * keep + seconds;
            // Less than a second of history says too little to act on.
            model.rate[i] = if model.span[i] >= 1.0 {
                (model.spent[i] / model.span[i]).clamp(0.0, most * MOST_SHARE)
            } else {
                0.0
            };
            if model.rate[i] < NEGLIGIBLE {
                model.rate[i] = 0.0;
            }
        }
        if model.synced[i].is_none() {
            // A baseline: what was charged before it is no part of the next interval.
            model.charged[i] = 0.0;
        }
        model.synced[i] = Some(now);
        model.gap[i] = gap as f64;
        let start = !model.charger && model.rate.iter().any(|&r| r > 0.0);
        if start {
            model.charger = true;
        }
        start
    }

    /// A 429 emptied the windows of the `spent` currencies: where they stand against the
    /// provider's count is no longer known, so the next sync of each starts a new interval.
    pub(super) fn penalized(&self, spent: Currencies) {
        let mut model = self.model();
        for currency in Currency::ALL {
            if spent.contains(currency) {
                let i = index(currency);
                model.synced[i] = None;
                model.charged[i] = 0.0;
            }
        }
    }

    /// How far below the provider's count a sync leaves the windows of `currency` (whose
    /// tightest window holds `capacity`): while spending elsewhere is estimated, the estimate
    /// is never exact, and a call admitted the moment its tokens exist here must find them
    /// there too. Nothing while no such spending is seen (in the last few seconds).
    ///
    /// Answers the margin, and whether it applies only where the sync finds the windows above
    /// the count: before any spending elsewhere is seen, the margin is held ready for the
    /// first sync that finds it.
    pub(super) fn margin(&self, currency: Currency, capacity: u64) -> (u64, bool) {
        let model = self.model();
        let i = index(currency);
        let seen = model.elsewhere[i].is_some_and(|at| at.elapsed().as_secs_f64() < MEMORY);
        (capacity / MARGIN, !(model.rate[i] > 0.0 || seen))
    }

    /// The first answer on a key is slow in coming, and calls are about to go without it: what
    /// others spent from the quota meanwhile is unknown, so the windows keep the margin back
    /// until the provider has answered, charged as spending elsewhere (the first sync gives
    /// back what was not spent). Once per key.
    pub(super) async fn blind(&self, limiter: &Limiter) -> Result<(), crate::Error> {
        {
            let mut model = self.model();
            if model.blind {
                return Ok(());
            }
            model.blind = true;
        }
        for currency in Currency::ALL {
            let Some(capacity) = limiter.limits().of(currency).capacity() else {
                continue;
            };
            let margin = capacity / MARGIN;
            if margin > 0 {
                limiter.charge(currency, margin).await?;
                self.model().charged[index(currency)] += margin as f64;
            }
        }
        Ok(())
    }

    /// What the model charged for `currency` since its last sync (before that sync is taken
    /// into account): the most a sync that finds the windows too low may give back.
    pub(super) fn charged_since_sync(&self, currency: Currency) -> u64 {
        self.model().charged[index(currency)].max(0.0) as u64
    }

    /// The estimated rate of `currency`, in tokens a second.
    pub(super) fn rate_of(&self, currency: Currency) -> f64 {
        self.model().rate[index(currency)]
    }

    /// A sync found the windows above the provider's count: something else spends from the
    /// quota. The margin holds from now on, before there is history enough for a rate (the
    /// first answer on a key can show it, while the calls it held back are about to go).
    pub(super) fn spent_elsewhere(&self, currency: Currency) {
        self.model().elsewhere[index(currency)] = Some(Instant::now());
    }

    /// The estimated rate of `currency`, in tokens a second.
    #[cfg(test)]
    pub(super) fn rate(&self, currency: Currency) -> f64 {
        self.model().rate[index(currency)]
    }

    /// Whether the charger should go on: some rate is estimated. A rate not synced for a
    /// while decays, by half every [`STALE`].
    fn live(&self) -> bool {
        let mut model = self.model();
        let tick = TICK.as_secs_f64() / STALE.as_secs_f64();
        for i in 0..3 {
            let stale = model.synced[i].is_none_or(|at| at.elapsed() > STALE);
            if stale {
                model.rate[i] *= 0.5f64.powf(tick);
                if model.rate[i] < NEGLIGIBLE {
                    model.rate[i] = 0.0;
                }
            }
        }
        let on = model.rate.iter().any(|&r| r > 0.0);
        if !on {
            model.charger = false;
        }
        on
    }
}

/// Charges `foreign` on `limiter` every tick while it estimates a rate, until the key's state
/// is dropped.
pub(super) fn start_charger(foreign: Weak<Foreign>, limiter: Limiter) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(foreign) = foreign.upgrade() else {
                return;
            };
            if !foreign.live() {
                return;
            }
            if let Err(err) = foreign.charge(&limiter).await {
                tracing::debug!(%err, "could not charge foreign spending");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A neighbour spending 600 tokens a second, seen only through syncs every 100 ms: the
    /// estimate comes within 10% of it in a few seconds, and decays once syncs stop.
    #[tokio::test(start_paused = true)]
    async fn the_estimate_follows_a_steady_neighbour_and_decays_without_syncs() {
        let foreign = Foreign::default();
        let (mut local, mut provider) = (10_000.0f64, 10_000.0f64);
        for _ in 0..100 {
            tokio::time::advance(Duration::from_millis(100)).await;
            provider -= 60.0;
            local -= foreign.due()[1] as f64;
            let above = (local - provider).floor() as i64;
            if above > 0 {
                local = provider;
            }
            foreign.synced(Currency::Tokens, above, above.min(0), 2_000.0, true);
        }
        let rate = foreign.rate(Currency::Tokens);
        assert!((540.0..=660.0).contains(&rate), "{rate}");
        // Unreadable syncs neither raise nor lower it.
        foreign.synced(Currency::Tokens, 5_000, 0, 2_000.0, false);
        assert_eq!(foreign.rate(Currency::Tokens), rate);
        // No syncs for a while: it halves every second.
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..20 {
            assert!(foreign.live());
        }
        assert!(foreign.rate(Currency::Tokens) < rate * 0.6);
    }

    #[tokio::test(start_paused = true)]
    async fn no_sample_counts_more_than_the_refill_and_the_estimate_keeps_a_share() {
        let foreign = Foreign::default();
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(100)).await;
            let _ = foreign.due();
            // Absurd shortfalls: far above what any neighbour could spend.
            foreign.synced(Currency::Tokens, 1_000_000, 0, 2_000.0, true);
        }
        assert_eq!(foreign.rate(Currency::Tokens), 2_000.0 * MOST_SHARE);
    }
}
