//! Spending this process does not see: another program, a notebook or a colleague's script on
//! the same quota.
//!
//! Each header sync tells how much had been spent elsewhere, in all, by the time its call went
//! out (the store compares the provider's count with what the windows held then, and adds what
//! was already corrected: [`Synced::spent`](crate::store::Synced)). Those totals, against the
//! times their calls went out, rise at the rate of spending elsewhere. They are noisy (calls
//! sent close together reach the provider in an order of their own, which moves a total by a
//! call's cost either way), so the model fits the rate robustly: the median of the slopes
//! between the totals of the last few seconds. It charges the key at that rate between syncs,
//! so that a call
//! waiting for its turn waits as long as the provider would make it. What the model charges is
//! counted as corrected, so each sync takes off only what the model missed, and gives back
//! what it charged too much.
//!
//! In a fleet every process keeps a model of its own, and the totals are the store's, shared:
//! every process sees the same samples, and what one charges the others count as corrected.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::limiter::Limiter;
use crate::rate::Currency;
use crate::rate::PerCurrency;

/// How far back the fit looks: long enough that a neighbour's bursts average out, short
/// enough that a stop shows within seconds.
const WINDOW: Duration = Duration::from_secs(5);
/// Less history than this, or fewer samples than [`LEAST_SAMPLES`], says too little to act on.
const LEAST_SPAN: Duration = Duration::from_secs(2);
const LEAST_SAMPLES: usize = 8;
/// How often the charger charges while a rate is estimated, on a store in the process; on a
/// remote one, every [`REMOTE_TICK`] (each charge is a round trip, and every sync charges
/// what is due first anyway).
const TICK: Duration = Duration::from_millis(50);
const REMOTE_TICK: Duration = Duration::from_millis(250);
/// How far ahead the model charges: a neighbour spends in steps between two charges, and a
/// call admitted right at its turn must not find the provider a step short.
const LEAD: Duration = Duration::from_millis(100);
/// Below this many tokens a second, or this share of the currency's refill, the rate is noise
/// (a count stamped a few milliseconds off), not a neighbour.
const NEGLIGIBLE: f64 = 0.5;
const NOISE: f64 = 0.01;
/// The most of a currency's refill rate the estimate may give to others: the key always keeps
/// some, so that a call gets through, its response syncs, and an estimate too high is seen.
const MOST_SHARE: f64 = 0.75;
/// While spending elsewhere is seen, syncs leave the windows this fraction of their capacity
/// (1/25: 4%) below the provider's count.
const MARGIN: u64 = 25;
/// What a key keeps back of its windows (a quarter) when its first answer is slow in coming and
/// calls go without it: others may be spending from the quota meanwhile, for as long as that
/// answer takes. Kept back, not lost: the window refills under it, and the first syncs give
/// back whatever of it was not spent elsewhere. A level, not an amount: however many
/// processes of a fleet go blind, the windows keep back one quarter.
const BLIND: u64 = 4;
/// How long after a sync last found spending elsewhere the margin is kept.
const SEEN_FOR: Duration = Duration::from_secs(5);
/// Without a sync for this long, the estimate halves every such span: a key whose calls
/// stopped can't correct it any other way.
const STALE: Duration = Duration::from_secs(1);
/// The most samples kept per currency.
const SAMPLES: usize = 64;
/// Two samples closer than this make no slope (the noise would swamp it).
const SHORTEST_SLOPE: Duration = Duration::from_millis(200);

#[derive(Debug, Default)]
struct Model {
    /// Per currency: when calls went out and the total spent elsewhere by then, in the order
    /// they went out.
    samples: PerCurrency<VecDeque<(Instant, f64)>>,
    /// Tokens a second spent elsewhere, per currency.
    rate: PerCurrency<f64>,
    /// When each currency was last synced.
    synced: PerCurrency<Option<Instant>>,
    /// Fractions of a token charged for but not yet taken.
    owed: PerCurrency<f64>,
    /// What the model charged that no sync has confirmed yet: what a sync that finds the
    /// windows too low may give back. Each charge with when it was made: a count the provider
    /// took before a charge can't tell whether what it stood for was spent, so only the charges
    /// made before a call went out may come back at its sync.
    unconfirmed: VecDeque<(Instant, PerCurrency<u64>)>,
    /// When a sync last found spending elsewhere that had not been corrected.
    elsewhere: PerCurrency<Option<Instant>>,
    /// Charged through this time (a little ahead of now).
    charged_at: Option<Instant>,
    charger: bool,
    /// The margin was kept back once before any answer came.
    blind: bool,
}

/// One key's model of elsewhere spending.
#[derive(Debug, Default)]
pub(super) struct Elsewhere {
    model: Mutex<Model>,
}

impl Model {
    /// Books `amounts` charged at `at` as not yet confirmed.
    fn unconfirm(&mut self, at: Instant, amounts: PerCurrency<u64>) {
        match self.unconfirmed.back_mut() {
            Some((last, kept)) if *last == at => {
                for c in Currency::ALL {
                    kept[c] = kept[c].saturating_add(amounts[c]);
                }
            }
            _ => self.unconfirmed.push_back((at, amounts)),
        }
        // Bounded: the oldest charges are confirmed by now in all but name.
        while self.unconfirmed.len() > 4_096 {
            self.unconfirmed.pop_front();
        }
    }
}

impl Elsewhere {
    fn model(&self) -> std::sync::MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The whole tokens per currency owed from the last charge until a little ahead of now,
    /// taken off the books (a sync charges them first).
    pub(super) fn due(&self) -> PerCurrency<u64> {
        let mut model = self.model();
        let through = Instant::now() + LEAD;
        let from = model.charged_at.unwrap_or(through);
        let elapsed = through.saturating_duration_since(from).as_secs_f64();
        model.charged_at = Some(from.max(through));
        let due: PerCurrency<u64> = PerCurrency::from_fn(|i| {
            model.owed[i] += model.rate[i] * elapsed;
            let whole = model.owed[i].floor();
            if whole >= 1.0 {
                model.owed[i] -= whole;
                whole as u64
            } else {
                0
            }
        });
        if due != PerCurrency::default() {
            model.unconfirm(Instant::now(), due);
        }
        due
    }

    /// Charges what the model says was spent elsewhere since the last charge (as corrected,
    /// through a sync that reads no count).
    pub(super) async fn charge(&self, limiter: &Limiter) -> Result<(), crate::error::Error> {
        let due = self.due();
        if due == PerCurrency::default() {
            return Ok(());
        }
        let args = crate::store::SyncArgs {
            elsewhere: due,
            ..crate::store::SyncArgs::default()
        };
        limiter.sync(args).await.map(|_| ())
    }

    /// What of the model's charges a sync of a call sent at `sent` may give back: those made
    /// before it went out, taken off the books until [`settled`](Elsewhere::settled) says what
    /// the sync did with them.
    pub(super) fn returnable(&self, sent: Instant) -> PerCurrency<u64> {
        let mut model = self.model();
        let mut offered: PerCurrency<u64> = PerCurrency::default();
        while let Some((at, amounts)) = model.unconfirmed.front().copied()
            && at <= sent
        {
            model.unconfirmed.pop_front();
            for c in Currency::ALL {
                offered[c] = offered[c].saturating_add(amounts[c]);
            }
        }
        offered
    }

    /// The sync did not happen: what was offered (charges made by `sent`) may still come back
    /// later.
    pub(super) fn restore(&self, sent: Instant, offered: PerCurrency<u64>) {
        if offered != PerCurrency::default() {
            self.model().unconfirmed.push_front((sent, offered));
        }
    }

    /// A sync of `currency` answered: `offered` of the model's charges could have come back and
    /// `returned` did. Where the sync compared a count (`compared`), the rest is confirmed;
    /// otherwise it may still come back at a later sync.
    pub(super) fn settled(
        &self,
        currency: Currency,
        sent: Instant,
        offered: u64,
        returned: u64,
        compared: bool,
    ) {
        if !compared && offered > returned {
            let mut amounts = PerCurrency::default();
            amounts[currency] = offered - returned;
            self.model().unconfirmed.push_front((sent, amounts));
        }
    }

    /// A sync of `currency` found `spent` tokens spent elsewhere in all by the time its
    /// call went out, `since` ago; `found_more` when that was more than had been corrected.
    /// The rate is the rise of those totals over the last [`WINDOW`], between 0 and `most`
    /// (the currency's refill rate: nobody spends faster for long). Answers true when a
    /// charger should be started.
    pub(super) fn sample(
        &self,
        currency: Currency,
        spent: i64,
        since: Duration,
        found_more: bool,
        most: f64,
    ) -> bool {
        let mut model = self.model();
        let now = Instant::now();
        let i = currency;
        let at = now.checked_sub(since).unwrap_or(now);
        model.synced[i] = Some(now);
        if found_more {
            model.elsewhere[i] = Some(now);
        }
        let samples = &mut model.samples[i];
        // Answers come back out of order: a count older than the newest says nothing new.
        if samples.back().is_none_or(|(last, _)| at > *last) {
            samples.push_back((at, spent as f64));
            while samples.len() > SAMPLES
                || samples
                    .front()
                    .is_some_and(|(first, _)| at.saturating_duration_since(*first) > WINDOW)
            {
                samples.pop_front();
            }
        }
        let rate = match (samples.front(), samples.back()) {
            (Some((first, _)), Some((last, _)))
                if last.saturating_duration_since(*first) >= LEAST_SPAN
                    && samples.len() >= LEAST_SAMPLES =>
            {
                median_slope(samples).map_or(0.0, |r| r.clamp(0.0, most * MOST_SHARE))
            }
            _ => model.rate[i],
        };
        model.rate[i] = if rate < NEGLIGIBLE.max(most * NOISE) {
            0.0
        } else {
            rate
        };
        let start = !model.charger && model.rate.iter().any(|(_, &r)| r > 0.0);
        if start {
            model.charger = true;
        }
        start
    }

    /// How far below the provider's count a sync leaves the windows of `currency` (whose
    /// tightest window holds `capacity`): while spending elsewhere is estimated, the estimate
    /// is never exact, and a call admitted the moment its tokens exist here must find them
    /// there too.
    ///
    /// Answers the margin, and whether it applies only where the sync finds more spending
    /// elsewhere than was corrected: before any is seen, the margin is held ready for the
    /// first sync that finds some.
    pub(super) fn margin(&self, currency: Currency, capacity: u64) -> (u64, bool) {
        let model = self.model();
        let i = currency;
        let seen = model.elsewhere[i].is_some_and(|at| at.elapsed() < SEEN_FOR);
        (capacity / MARGIN, !(model.rate[i] > 0.0 || seen))
    }

    /// The first answer on a key is slow in coming, and calls are about to go without it: what
    /// others spent from the quota meanwhile is unknown, so the windows keep a quarter of their
    /// capacity back: each currency the provider counts is lowered to at most three quarters of
    /// its widest window. What that took off is booked like the model's own charges: the
    /// first syncs that compare a count give back whatever of it was not spent elsewhere. Once
    /// per key and process.
    ///
    /// A lowering, not a charge: in a fleet on one store every process goes blind on its own
    /// first answer, and a charge from each would keep back a quarter per process (eight
    /// processes held back two windows' worth, and ran 1.4 times slower than without sync),
    /// where lowering twice to the same level keeps back the quarter once.
    pub(super) async fn blind(&self, limiter: &Limiter) -> Result<(), crate::error::Error> {
        {
            let mut model = self.model();
            if model.blind {
                return Ok(());
            }
            model.blind = true;
        }
        // Money is counted by nobody else: only the currencies a provider counts.
        let mut taken = PerCurrency::default();
        for currency in Currency::ALL.into_iter().filter(|c| *c != Currency::Spend) {
            // The widest window: a narrower one holds less than three quarters of it anyway,
            // and refills within its own short period.
            let widest = limiter
                .limits()
                .of(currency)
                .as_slice()
                .iter()
                .map(|r| r.burst())
                .max();
            if let Some(capacity) = widest {
                let off = limiter.lower(currency, capacity - capacity / BLIND).await?;
                taken[currency] = u64::try_from(off).unwrap_or(0);
            }
        }
        if taken != PerCurrency::default() {
            self.model().unconfirm(Instant::now(), taken);
        }
        Ok(())
    }

    /// The estimated rate of `currency`, in tokens a second.
    pub(super) fn rate_of(&self, currency: Currency) -> f64 {
        self.model().rate[currency]
    }

    /// Whether the charger should go on: some rate is estimated. A rate not synced for a
    /// while decays, by half every [`STALE`].
    fn live(&self, every: Duration) -> bool {
        let mut model = self.model();
        let tick = every.as_secs_f64() / STALE.as_secs_f64();
        for i in Currency::ALL {
            let stale = model.synced[i].is_none_or(|at| at.elapsed() > STALE);
            if stale {
                model.rate[i] *= 0.5f64.powf(tick);
                if model.rate[i] < NEGLIGIBLE {
                    model.rate[i] = 0.0;
                }
            }
        }
        let on = model.rate.iter().any(|(_, &r)| r > 0.0);
        if !on {
            model.charger = false;
        }
        on
    }
}

/// The median of the slopes between every two samples at least [`SHORTEST_SLOPE`] apart
/// (Theil and Sen's estimator: a few samples moved by a call's cost don't move it).
fn median_slope(samples: &VecDeque<(Instant, f64)>) -> Option<f64> {
    let mut slopes = Vec::new();
    for (i, (t1, f1)) in samples.iter().enumerate() {
        for (t2, f2) in samples.iter().skip(i + 1) {
            let dt = t2.saturating_duration_since(*t1);
            if dt >= SHORTEST_SLOPE {
                slopes.push((f2 - f1) / dt.as_secs_f64());
            }
        }
    }
    if slopes.is_empty() {
        return None;
    }
    let middle = slopes.len() / 2;
    let (_, median, _) = slopes.select_nth_unstable_by(middle, f64::total_cmp);
    Some(*median)
}

/// Charges the `model` of spending elsewhere on `limiter` every tick while it estimates a rate, until the key's state
/// is dropped.
pub(super) fn start_charger(model: Weak<Elsewhere>, limiter: Limiter) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let every = if limiter.store().as_memory().is_some() {
        TICK
    } else {
        REMOTE_TICK
    };
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(elsewhere) = model.upgrade() else {
                return;
            };
            if !elsewhere.live(every) {
                return;
            }
            if let Err(err) = elsewhere.charge(&limiter).await {
                tracing::debug!(%err, "could not charge the spending elsewhere");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A neighbour spending 600 tokens a second, seen through the totals of syncs every 100 ms
    /// (each call out for 3 s): the fit comes within 5% of it, and decays once syncs stop.
    #[tokio::test(start_paused = true)]
    async fn the_rate_follows_a_steady_neighbour_and_decays_without_syncs() {
        let elsewhere = Elsewhere::default();
        for step in 1..=100u64 {
            tokio::time::advance(Duration::from_millis(100)).await;
            // The call answered now went out 3 s ago, when 600/s had been spent for that long.
            let went_out = (step * 100).saturating_sub(3_000) as f64 / 1_000.0;
            elsewhere.sample(
                Currency::Tokens,
                (600.0 * went_out) as i64,
                Duration::from_secs(3),
                true,
                2_000.0,
            );
        }
        let rate = elsewhere.rate_of(Currency::Tokens);
        assert!((570.0..=630.0).contains(&rate), "{rate}");
        // An answer to an older call says nothing new.
        elsewhere.sample(Currency::Tokens, 0, Duration::from_secs(9), false, 2_000.0);
        assert_eq!(elsewhere.rate_of(Currency::Tokens), rate);
        // No syncs for a while: it halves every second.
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..20 {
            assert!(elsewhere.live(TICK));
        }
        assert!(elsewhere.rate_of(Currency::Tokens) < rate * 0.6);
    }

    #[tokio::test(start_paused = true)]
    async fn no_estimate_passes_a_share_of_the_refill_and_noise_is_no_neighbour() {
        let elsewhere = Elsewhere::default();
        for step in 1..=30i64 {
            tokio::time::advance(Duration::from_millis(100)).await;
            // Absurd totals: far above what any neighbour could spend.
            elsewhere.sample(
                Currency::Tokens,
                step * 1_000_000,
                Duration::ZERO,
                true,
                2_000.0,
            );
        }
        assert_eq!(elsewhere.rate_of(Currency::Tokens), 2_000.0 * MOST_SHARE);
        // Totals that wobble by a few tokens around a constant: no rate at all.
        let quiet = Elsewhere::default();
        for step in 1..=50i64 {
            tokio::time::advance(Duration::from_millis(100)).await;
            quiet.sample(
                Currency::Tokens,
                500 + step % 3,
                Duration::ZERO,
                false,
                2_000.0,
            );
        }
        assert_eq!(quiet.rate_of(Currency::Tokens), 0.0);
    }
}
