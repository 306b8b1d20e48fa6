//! Property tests: the window bound over every interval, and agreement with an independent
//! exact rational model, for one window and for windows in all three currencies.

use proptest::prelude::*;
use std::time::Duration;

use tollgate::{Cost, Limits, ManualClock, MemoryStore, Rate};
use tollgate_testkit::stores::{Decision, snapshot_now, try_now};

/// An exact fraction with a positive denominator, kept in lowest terms: a model of the bucket
/// that shares no arithmetic with the crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Q {
    n: i128,
    d: i128,
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 { a.abs() } else { gcd(b, a % b) }
}

impl Q {
    fn new(n: i128, d: i128) -> Q {
        let g = gcd(n, d).max(1);
        Q { n: n / g, d: d / g }
    }
    fn int(n: i128) -> Q {
        Q { n, d: 1 }
    }
    fn add(self, o: Q) -> Q {
        Q::new(self.n * o.d + o.n * self.d, self.d * o.d)
    }
    fn sub(self, o: Q) -> Q {
        Q::new(self.n * o.d - o.n * self.d, self.d * o.d)
    }
    fn mul(self, o: Q) -> Q {
        Q::new(self.n * o.n, self.d * o.d)
    }
    fn ge(self, o: Q) -> bool {
        self.n * o.d >= o.n * self.d
    }
    fn min(self, o: Q) -> Q {
        if self.ge(o) { o } else { self }
    }
}

/// The model: T = min(B, T + r·elapsed) with r = amount / period, all in exact fractions of
/// seconds.
struct Model {
    burst: Q,
    per_sec: Q,
    level: Q,
    last_ms: u64,
}

impl Model {
    fn new(rate: &Rate) -> Model {
        let period_ms = rate.period().as_millis() as i128;
        Model {
            burst: Q::int(rate.burst() as i128),
            per_sec: Q::new(rate.amount() as i128 * 1000, period_ms),
            level: Q::int(rate.burst() as i128),
            last_ms: 0,
        }
    }
    fn level_at(&self, t_ms: u64) -> Q {
        let elapsed = Q::new((t_ms - self.last_ms) as i128, 1000);
        self.level.add(self.per_sec.mul(elapsed)).min(self.burst)
    }
    fn level_at_ns(&self, t_ns: u64) -> Q {
        let elapsed = Q::new(
            t_ns as i128 - self.last_ms as i128 * 1_000_000,
            1_000_000_000,
        );
        self.level.add(self.per_sec.mul(elapsed)).min(self.burst)
    }
    fn can_pay(&self, t_ms: u64, cost: u64) -> bool {
        self.level_at(t_ms).ge(Q::int(cost as i128))
    }
    fn pay(&mut self, t_ms: u64, cost: u64) {
        self.level = self.level_at(t_ms).sub(Q::int(cost as i128));
        self.last_ms = t_ms;
    }
    fn advance(&mut self, t_ms: u64) {
        self.level = self.level_at(t_ms);
        self.last_ms = t_ms;
    }
}

fn rate_strategy() -> impl Strategy<Value = Rate> {
    (1u64..=50, 1u64..=120_000, 1u64..=60).prop_map(|(amount, period_ms, burst)| {
        Rate::new(amount, Duration::from_millis(period_ms))
            .unwrap()
            .with_burst(burst)
            .unwrap()
    })
}

/// Times in ms since the start (non-decreasing; repeats allowed) and raw costs.
fn trace_strategy() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    prop::collection::vec((0u64..3_000, 1u64..=1_000, 1u64..=1_000), 1..120).prop_map(|steps| {
        let mut t = 0;
        steps
            .into_iter()
            .map(|(dt, a, b)| {
                // Half the steps at the same instant, to press on the burst.
                if a % 2 == 0 {
                    t += dt;
                }
                (t, a, b)
            })
            .collect()
    })
}

/// Over every interval [t_i, t_j] between admissions, admitted cost ≤ B + r·(t_j − t_i),
/// with the sum taken afresh for each interval.
fn assert_window_bound(rate: &Rate, admitted: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let burst = Q::int(rate.burst() as i128);
    let per_ms = Q::new(rate.amount() as i128, rate.period().as_millis() as i128);
    for i in 0..admitted.len() {
        for j in i..admitted.len() {
            let (ti, tj) = (admitted[i].0, admitted[j].0);
            let sum: u64 = admitted
                .iter()
                .filter(|(t, _)| *t >= ti && *t <= tj)
                .map(|(_, c)| c)
                .sum();
            let bound = burst.add(per_ms.mul(Q::int((tj - ti) as i128)));
            prop_assert!(
                bound.ge(Q::int(sum as i128)),
                "rate {rate}: {sum} admitted in [{ti} ms, {tj} ms], bound {bound:?}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn single_bucket_matches_exact_model_and_keeps_window_bound(
        rate in rate_strategy(),
        trace in trace_strategy(),
    ) {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let limits = Limits::tokens_only(rate);
        let mut model = Model::new(&rate);
        let mut admitted = Vec::new();
        for (t_ms, raw, _) in trace {
            let cost = 1 + raw % rate.burst();
            clock.set(Duration::from_millis(t_ms)).unwrap();
            let decision = try_now(&store, "k", &limits, Cost::new(0, cost)).unwrap();
            let expected = model.can_pay(t_ms, cost);
            prop_assert_eq!(decision.is_admitted(), expected, "at {} ms, cost {}", t_ms, cost);
            if expected {
                model.pay(t_ms, cost);
                admitted.push((t_ms, cost));
            } else {
                model.advance(t_ms);
                // The hint is exact: the model holds the cost after it, and not a nanosecond
                // before.
                let Decision::NotYet(wait) = decision else { unreachable!() };
                let ready = t_ms * 1_000_000 + wait.as_nanos() as u64;
                let need = Q::int(cost as i128);
                prop_assert!(model.level_at_ns(ready).ge(need), "hint {:?} too short", wait);
                prop_assert!(!model.level_at_ns(ready - 1).ge(need), "hint {:?} too long", wait);
            }
            let level = snapshot_now(&store, "k", &limits).unwrap()[0].tokens;
            let m = model.level_at(t_ms);
            prop_assert!(level.is(m.n, m.d as u64), "level {:?} vs model {:?}", level, m);
        }
        assert_window_bound(&rate, &admitted)?;
    }

    #[test]
    fn windows_in_three_currencies_pay_all_or_nothing_and_keep_window_bound(
        requests in rate_strategy(),
        tokens in rate_strategy(),
        output in rate_strategy(),
        trace in trace_strategy(),
        salt in any::<u64>(),
    ) {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let limits = Limits::new(requests, tokens).with_output_tokens(output);
        let rates = [requests, tokens, output];
        let mut models = rates.map(|r| Model::new(&r));
        let mut admitted: [Vec<(u64, u64)>; 3] = Default::default();
        for (step, (t_ms, a, b)) in trace.into_iter().enumerate() {
            let c = (salt >> (step % 60)) ^ a.wrapping_mul(b);
            let amounts = [1 + a % requests.burst(), 1 + b % tokens.burst(), 1 + c % output.burst()];
            let cost = Cost::new(amounts[0], amounts[1]).with_output_tokens(amounts[2]);
            clock.set(Duration::from_millis(t_ms)).unwrap();
            let decision = try_now(&store, "k", &limits, cost).unwrap();
            let expected = (0..3).all(|i| models[i].can_pay(t_ms, amounts[i]));
            prop_assert_eq!(decision.is_admitted(), expected);
            for i in 0..3 {
                if expected {
                    models[i].pay(t_ms, amounts[i]);
                    admitted[i].push((t_ms, amounts[i]));
                } else {
                    models[i].advance(t_ms);
                }
            }
            if let Decision::NotYet(wait) = decision {
                // The hint is the longest of the windows' exact waits.
                let ready = t_ms * 1_000_000 + wait.as_nanos() as u64;
                prop_assert!((0..3).all(|i| models[i].level_at_ns(ready).ge(Q::int(amounts[i] as i128))));
                prop_assert!((0..3).any(|i| !models[i].level_at_ns(ready - 1).ge(Q::int(amounts[i] as i128))));
            }
            let levels = snapshot_now(&store, "k", &limits).unwrap();
            for i in 0..3 {
                let m = models[i].level_at(t_ms);
                prop_assert!(levels[i].tokens.is(m.n, m.d as u64), "window {}: {:?} vs {:?}", i, levels[i].tokens, m);
            }
        }
        for i in 0..3 {
            assert_window_bound(&rates[i], &admitted[i])?;
        }
    }
}
