//! The provider's ledger: what a provider said, kept against what the key charged. A 429 empties
//! the windows it names and pauses the key (penalize); a provider's `remaining` count lowers a
//! window (lower) or is compared, call by call, with what the windows held when the call went
//! out (sync); an answer's usage settles what its call was charged (settle). The calls in
//! flight they read are [`Flights`]. The Redis script's `penalize`, `lower`, `sync` and
//! `settle` port this.

use super::*;
use crate::bucket::Refusal;
use crate::bucket::flights::settlement;
use std::time::Duration;

impl KeyState {
    /// What a provider's 429 means: nothing passes before `until` (a longer pause already in
    /// force wins), and the windows of the `spent` currencies come down to where the
    /// provider's are.
    ///
    /// With a `refusal` (the provider said when the refused call would pass), the tightest
    /// window of each spent currency is lowered to hold exactly what the call needed when the
    /// provider's pause ends, less what went out after it (which the provider had not counted
    /// yet): `need − rate·hint − later`. The provider holds at least that much (its pause is
    /// its wait for the call, rounded up), so the key can't send into a window the provider
    /// has spent, whatever debt its refusals left there (OpenAI and Gemini count a refused
    /// request). Its other windows keep their level (a day's window is not spent by a
    /// minute's 429). Without one, every window of a spent currency is emptied. Either way a
    /// window is only ever lowered.
    ///
    /// What was taken off is the cover of every call in flight, which the refusal counted.
    pub(crate) fn penalize(
        &mut self,
        limits: &Limits,
        now: Nanos,
        until: Nanos,
        spent: Currencies,
        refusal: Option<&Refusal>,
    ) -> Outcome {
        self.refilled(limits, now);
        // What went out after the refused call, per currency: the key's own record of the calls
        // in flight where it has one, else the caller's count.
        let later = refusal.map(|r| {
            let found = self.flights.as_deref().and_then(|f| {
                (r.flight > 0)
                    .then(|| f.find(r.flight))
                    .flatten()
                    .map(|i| (f, i))
            });
            match found {
                Some((flights, i)) => {
                    let mut later = PerCurrency::splat(0u64);
                    for flight in flights.list.range(i + 1..) {
                        for c in Currency::ALL {
                            later[c] = later[c].saturating_add(flight.charged[c]);
                        }
                    }
                    later
                }
                None => r.later,
            }
        });
        let tight = PerCurrency::from_fn(|c| tightest(limits, c));
        let mut emptied: PerCurrency<Option<u64>> = PerCurrency::splat(None);
        for (i, ((c, w), level)) in windows(limits).zip(self.real.units.iter_mut()).enumerate() {
            if !spent.contains(c) {
                continue;
            }
            let target = match (refusal, later) {
                (Some(r), Some(later)) if tight[c] == Some(i) => {
                    // What the call needed when the provider's pause ends, less what went out
                    // after it: `need − rate·hint − later`, never below the debt floor.
                    let t = w.units_capped(r.need[c]) - w.units_capped(later[c]);
                    let refill = i128::from(w.rate.amount())
                        .checked_mul(i128::try_from(r.hint.as_nanos()).unwrap_or(i128::MAX));
                    match refill {
                        Some(refill) if t >= w.floor() && refill <= t - w.floor() => {
                            w.clamp(t - refill)
                        }
                        _ => w.floor(),
                    }
                }
                (Some(_), Some(_)) => continue,
                _ => 0,
            };
            let taken = u64::try_from(w.whole((*level - target).max(0))).unwrap_or(u64::MAX);
            let slot = &mut emptied[c];
            *slot = Some(slot.map_or(taken, |e| e.min(taken)));
            *level = (*level).min(target);
        }
        let emptied = emptied.map(|e| e.unwrap_or(0));
        self.paused_until = self.paused_until.max(until);
        if let Some(flights) = self.flights.as_mut()
            && let Some(last) = flights.list.back()
        {
            // The refusal counted the calls up to the refused one; a penalty without one, every
            // call out.
            flights.cover.upto = match refusal {
                Some(r) if flights.find(r.flight).is_some() => r.flight,
                _ => last.id,
            };
            // The windows of the spent currencies now hold what the provider does: the refill a
            // counted call that found them full would have given back is in that already.
            let spent_windows = windows(limits)
                .enumerate()
                .filter(|(j, (c, _))| *j < 32 && spent.contains(*c))
                .fold(0u32, |mask, (j, _)| mask | (1 << j));
            let upto = flights.cover.upto;
            for flight in flights.list.iter_mut().filter(|f| f.id <= upto) {
                flight.full &= !spent_windows;
            }
            for c in Currency::ALL {
                if spent.contains(c) {
                    flights.cover.tokens[c] = emptied[c];
                    // What the windows held, the provider says is spent: taken off for spending
                    // elsewhere, like a sync's correction.
                    flights.corrected[c] = flights.corrected[c]
                        .saturating_add(saturate::<_, i64>(i128::from(emptied[c])));
                }
            }
        }
        self.replan();
        Outcome::Emptied(emptied)
    }

    /// Lowers every window of `currency` to at most `remaining` tokens (a provider's
    /// `remaining` header): never raises one.
    pub(crate) fn lower(
        &mut self,
        limits: &Limits,
        now: Nanos,
        currency: Currency,
        remaining: u64,
    ) -> Outcome {
        self.refilled(limits, now);
        // How far above `remaining` the window closest to it was (negative: below).
        let mut above: Option<i64> = None;
        for ((c, w), level) in windows(limits).zip(self.real.units.iter_mut()) {
            if c == currency {
                let target = w.units(remaining.min(w.rate.burst()));
                let tokens = saturate::<_, i64>(w.whole(*level - target));
                above = Some(above.map_or(tokens, |a| a.min(tokens)));
                *level = (*level).min(target);
            }
        }
        self.replan();
        Outcome::Lowered(above.unwrap_or(0))
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
    /// of the calls the count held (see [`flights`](crate::bucket::flights)).
    ///
    /// A call the key no longer remembers (or never did: a gate's first call, before its limits
    /// were known) has no record to compare with: its count lowers every window of the
    /// currency to at most the count, as [`lower`](KeyState::lower) does.
    pub(crate) fn sync(&mut self, limits: &Limits, now: Nanos, args: &SyncArgs) -> Outcome {
        let now = self.refilled(limits, now);
        self.add_delta(
            limits,
            args.elsewhere.map(|t| -saturate::<_, i64>(i128::from(t))),
        );
        if let Some(flights) = self.flights.as_deref_mut() {
            for c in Currency::ALL {
                flights.corrected[c] = flights.corrected[c]
                    .saturating_add(saturate::<_, i64>(i128::from(args.elsewhere[c])));
            }
        }
        let found = self
            .flights
            .as_deref()
            .and_then(|f| f.find(args.flight).map(|i| (i, f.list[i], f.close_to(i))));
        let ambiguous = found.is_none_or(|(_, _, (_, ambiguous))| ambiguous);
        let back = args.refused.unwrap_or(crate::rate::Currencies::NONE);
        if let Some((i, flight, _)) = found {
            self.credit_full(limits, i, &flight, args.counted_after, back);
        }
        if args.refused.is_some() {
            // The provider refused the call and counted nothing of it in the currencies it
            // gives back: its record no longer counts there, and it is done (an adapter that
            // retries admits it again, and pays again). Its charge stays in the windows: a 429
            // never raises one, and what the provider holds after it is the penalty's to say.
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
                above[c] = Some(saturate::<_, i64>(
                    w.whole(self.real.units[tight] - counted),
                ));
                for ((currency, w), level) in windows(limits).zip(self.real.units.iter_mut()) {
                    if currency == c {
                        *level = (*level).min(w.units(remaining.min(w.rate.burst())));
                    }
                }
                continue;
            };
            // The call's own charge is in its record; a refused call is not in the count where
            // the provider gave it back, so it is added back to read the record like the count.
            // Then the refill from when the call went out to when the provider counted it: the
            // key's windows had it, the provider's did not yet.
            let mut held = flight.level[c];
            if back.contains(c) {
                held = w.clamp(held + w.units_capped(flight.charged[c]));
            }
            let held = w.refill(held, saturate(args.counted_after.as_nanos()));
            // What was spent elsewhere if the provider counted the calls in the order they went
            // out: a sample for the model, right on average.
            let likely = saturate::<_, i64>(w.whole(held - counted));
            // Calls that went out close to it are left out, whichever side of it they were
            // counted on: what is taken off is never more than was spent elsewhere.
            let excess = saturate::<_, i64>(w.whole(held - w.units_capped(before[c]) - counted));
            let corrected = self.flights.as_deref().map_or(0, |f| f.corrected[c]);
            let since = corrected.saturating_sub(flight.corrected[c]);
            above[c] = Some(excess);
            spent[c] = Some(likely.saturating_add(flight.corrected[c]));
            // What this count finds spent elsewhere beyond what was corrected: the likely
            // amount, but never more than the margin beyond the least there can be (a burst
            // that reached the provider in another order can't take off more than that).
            let margin = saturate::<_, i64>(i128::from(args.margin[c]));
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
                    flights.cover.tokens[c] = found_more.min(take).unsigned_abs();
                    flights.cover.upto = flight.id;
                }
                self.shift(limits, c, -take);
            } else if take < 0 {
                let back = take.unsigned_abs().min(args.returnable[c]);
                if back > 0 {
                    flights.corrected[c] =
                        flights.corrected[c].saturating_sub(saturate::<_, i64>(i128::from(back)));
                    returned[c] = back;
                    self.shift(limits, c, saturate::<_, i64>(i128::from(back)));
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
        Outcome::Synced(Box::new(Synced {
            above,
            spent,
            ambiguous,
            since: std::time::Duration::from_nanos(since),
            lowered,
            returned,
            settled: None,
        }))
    }

    /// A call that found a window full made it start refilling when it went out; the
    /// provider's started when it counted the call, `counted_after` later. That refill (at most
    /// the call's charge: by then the window may have been full again) is the key's alone:
    /// taken off, exactly, once (by the call's sync, else its settlement), except in the
    /// currencies `back` the provider did not count it in. Counted as corrected, so that a
    /// later count does not find it again.
    fn credit_full(
        &mut self,
        limits: &Limits,
        index: usize,
        flight: &crate::bucket::flights::Flight,
        counted_after: Duration,
        back: Currencies,
    ) {
        if flight.full == 0 || counted_after.is_zero() {
            return;
        }
        let elapsed = i128::try_from(counted_after.as_nanos()).unwrap_or(i128::MAX);
        let mut credited = PerCurrency::splat(0i64);
        let tight = PerCurrency::from_fn(|c| tightest(limits, c));
        for (j, ((c, w), level)) in windows(limits).zip(self.real.units.iter_mut()).enumerate() {
            if j >= 32 || flight.full & (1 << j) == 0 || back.contains(c) {
                continue;
            }
            let charge = w.units_capped(flight.charged[c]);
            let over = i128::from(w.rate.amount())
                .saturating_mul(elapsed)
                .min(charge);
            if tight[c] == Some(j) {
                credited[c] = saturate::<_, i64>(w.whole(over));
            }
            *level = w.clamp(*level - over);
        }
        if let Some(flights) = self.flights.as_deref_mut() {
            flights.list[index].full = 0;
            for c in Currency::ALL {
                flights.corrected[c] = flights.corrected[c].saturating_add(credited[c]);
            }
        }
        self.replan();
    }

    /// Settles call `flight` (charged `charged`, if the key no longer remembers it) with what
    /// it used, per currency (`None`: as charged): a refund for an overestimate; for an
    /// underestimate, a charge, less what the cover of a sync that counted the call pays
    /// (never more than that cover holds). With `last`, the call is done.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn settle(
        &mut self,
        limits: &Limits,
        now: Nanos,
        flight: u64,
        charged: Cost,
        used: PerCurrency<Option<u64>>,
        last: bool,
        counted_after: Duration,
    ) -> Outcome {
        let now = self.refilled(limits, now);
        if let Some(i) = self.flights.as_deref().and_then(|f| f.find(flight)) {
            let record = self.flights.as_deref().expect("found").list[i];
            self.credit_full(limits, i, &record, counted_after, Currencies::NONE);
        }
        let mut flights = self.flights.as_mut();
        let found = flights.as_ref().and_then(|f| f.find(flight));
        let mut was = charged.per_currency();
        // A call the key no longer remembers is one no count is known to have held.
        let mut number = None;
        if let (Some(flights), Some(i)) = (&flights, found) {
            was = flights.list[i].charged;
            number = Some(flights.list[i].id);
        }
        let mut delta = Delta::default();
        for c in Currency::ALL {
            let Some(used) = used[c] else {
                continue;
            };
            if limits.of(c).is_empty() {
                continue;
            }
            delta[c] = settlement(was[c], used, |shortfall| {
                match (flights.as_deref_mut(), number) {
                    (Some(flights), Some(call)) => flights.cover.draw(call, c, shortfall),
                    _ => 0,
                }
            });
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
        Outcome::Settled(delta)
    }
}
