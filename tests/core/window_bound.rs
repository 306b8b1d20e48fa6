//! Property tests: the window bound over every interval, and agreement with an independent
//! exact rational model, for one window and for windows in all three currencies.

use proptest::prelude::*;
use std::time::Duration;

use tollgate::{Cost, Limits, ManualClock, MemoryStore, Rate};
use tollgate_testkit::stores::{Decision, adjust_now, snapshot_now, try_now};

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
    fn level_at_ns(&self, t_ns: u128) -> Q {
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
    /// A settlement of `delta` tokens at `t_ms`: a refund never above the burst, a charge
    /// never below a debt of 64 bursts.
    fn settle(&mut self, t_ms: u64, delta: i64) {
        let floor = Q::int(-64).mul(self.burst);
        let level = self.level_at(t_ms).add(Q::int(i128::from(delta)));
        self.level = if level.ge(self.burst) {
            self.burst
        } else if floor.ge(level) {
            floor
        } else {
            level
        };
        self.last_ms = t_ms;
    }
    fn advance(&mut self, t_ms: u64) {
        self.level = self.level_at(t_ms);
        self.last_ms = t_ms;
    }
}

/// Rates from the small (1 per ms, burst 1) to the large (10^9 a day, a burst of 10^9), with
/// periods that share no factor with the amount as often as round ones.
fn rate_strategy() -> impl Strategy<Value = Rate> {
    let amount = prop_oneof![1u64..=50, 1u64..=1_000_000_000];
    let period_ms = prop_oneof![1u64..=1_000, 1u64..=120_000, 1u64..=86_400_000];
    let burst = prop_oneof![1u64..=60, 1u64..=1_000_000_000];
    (amount, period_ms, burst).prop_map(|(amount, period_ms, burst)| {
        Rate::new(amount, Duration::from_millis(period_ms))
            .unwrap()
            .with_burst(burst)
            .unwrap()
    })
}

/// One step of a trace: whether time moves first (its own draw, so that a cost's parity says
/// nothing about it), how far, and what happens then.
#[derive(Debug, Clone)]
struct Step {
    moves: bool,
    dt_ms: u64,
    what: What,
}

#[derive(Debug, Clone)]
enum What {
    /// A call of these raw costs (reduced to each window's burst).
    Take(u64, u64, u64),
    /// A settlement: a refund (positive) or a further charge (negative), in tokens.
    Settle(i64),
}

fn trace_strategy() -> impl Strategy<Value = Vec<Step>> {
    let dt_ms = prop_oneof![0u64..3_000, 0u64..86_400_000];
    let what = prop_oneof![
        4 => (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(a, b, c)| What::Take(a, b, c)),
        1 => prop_oneof![-1_000i64..=1_000, any::<i64>()].prop_map(What::Settle),
    ];
    prop::collection::vec(
        (any::<bool>(), dt_ms, what).prop_map(|(moves, dt_ms, what)| Step { moves, dt_ms, what }),
        1..120,
    )
}

/// The times of a trace's steps, in ms from the start.
fn times(trace: &[Step]) -> Vec<u64> {
    let mut t = 0;
    trace
        .iter()
        .map(|step| {
            if step.moves {
                t += step.dt_ms;
            }
            t
        })
        .collect()
}

/// What one event did to a window, as the store tells it (never the model): when, what it
/// took (the cost of a call the store admitted, nothing for one it refused; for a settlement,
/// the store's level before it less the level after, so a refund takes a negative amount),
/// and the level the store's snapshot shows after it.
#[derive(Debug, Clone, Copy)]
struct Event {
    t_ms: u64,
    spent: Q,
    left: Q,
}

/// A store's level as an exact fraction.
fn q(level: tollgate::Amount) -> Q {
    Q::new(level.units(), i128::from(level.scale()))
}

/// Over every interval [t_i, t_j] between events, what the events took is at most
/// B + r·(t_j − t_i), plus the debt the last of them left: the level at t_i is at most B, the
/// refill adds r·(t_j − t_i), and what remains is the level after t_j. The sum is taken afresh
/// for each interval.
fn assert_window_bound(rate: &Rate, events: &[Event]) -> Result<(), TestCaseError> {
    let burst = Q::int(rate.burst() as i128);
    let per_ms = Q::new(rate.amount() as i128, rate.period().as_millis() as i128);
    for i in 0..events.len() {
        for j in i..events.len() {
            let (ti, tj) = (events[i].t_ms, events[j].t_ms);
            // Events at ti before i are left out: their instant's level was already lower.
            let sum = events[i..=j]
                .iter()
                .fold(Q::int(0), |sum, e| sum.add(e.spent));
            let debt = Q::int(0).min(events[j].left);
            let bound = burst.add(per_ms.mul(Q::int((tj - ti) as i128))).sub(debt);
            prop_assert!(
                bound.ge(sum),
                "rate {rate}: {sum:?} taken in [{ti} ms, {tj} ms], bound {bound:?}"
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
        let mut events = Vec::new();
        for (step, t_ms) in trace.iter().zip(times(&trace)) {
            clock.set(Duration::from_millis(t_ms)).unwrap();
            let before = q(snapshot_now(&store, "k", &limits).unwrap()[0].tokens);
            let spent = match step.what {
                What::Take(raw, _, _) => {
                    let cost = 1 + raw % rate.burst();
                    let decision = try_now(&store, "k", &limits, Cost::new(0, cost)).unwrap();
                    let expected = model.can_pay(t_ms, cost);
                    prop_assert_eq!(decision.is_admitted(), expected, "at {} ms, cost {}", t_ms, cost);
                    if expected {
                        model.pay(t_ms, cost);
                    } else {
                        model.advance(t_ms);
                        // The hint is exact: the model holds the cost after it, and not a
                        // nanosecond before.
                        let Decision::NotYet(wait) = decision else { unreachable!() };
                        let ready = u128::from(t_ms) * 1_000_000 + wait.as_nanos();
                        let need = Q::int(cost as i128);
                        // A wait beyond 2^64 ns saturates there, shorter than the truth.
                        let saturated = wait.as_nanos() == u128::from(u64::MAX);
                        prop_assert!(saturated || model.level_at_ns(ready).ge(need), "hint {:?} too short", wait);
                        prop_assert!(!model.level_at_ns(ready - 1).ge(need), "hint {:?} too long", wait);
                    }
                    // What the store let through: the cost it admitted.
                    if decision.is_admitted() { Some(Q::int(cost as i128)) } else { Some(Q::int(0)) }
                }
                What::Settle(delta) => {
                    adjust_now(&store, "k", &limits, delta).unwrap();
                    model.settle(t_ms, delta);
                    None
                }
            };
            let left = q(snapshot_now(&store, "k", &limits).unwrap()[0].tokens);
            // A settlement took what the store's levels say it took.
            let spent = spent.unwrap_or_else(|| before.sub(left));
            events.push(Event { t_ms, spent, left });
            let m = model.level_at(t_ms);
            prop_assert!(left == m, "level {:?} vs model {:?}", left, m);
        }
        assert_window_bound(&rate, &events)?;
    }

    #[test]
    fn windows_in_three_currencies_pay_all_or_nothing_and_keep_window_bound(
        requests in rate_strategy(),
        tokens in rate_strategy(),
        output in rate_strategy(),
        trace in trace_strategy(),
    ) {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let limits = Limits::new(requests, tokens).with_output_tokens(output);
        let rates = [requests, tokens, output];
        let mut models = rates.map(|r| Model::new(&r));
        let mut events: [Vec<Event>; 3] = Default::default();
        for (step, t_ms) in trace.iter().zip(times(&trace)) {
            clock.set(Duration::from_millis(t_ms)).unwrap();
            let before: Vec<Q> = snapshot_now(&store, "k", &limits)
                .unwrap()
                .iter()
                .map(|w| q(w.tokens))
                .collect();
            // What each window let through, as the store decided (`None`: a settlement).
            let admitted: [Option<Q>; 3] = match step.what {
                What::Take(a, b, c) => {
                    let amounts = [1 + a % requests.burst(), 1 + b % tokens.burst(), 1 + c % output.burst()];
                    let cost = Cost::new(amounts[0], amounts[1]).with_output_tokens(amounts[2]);
                    let decision = try_now(&store, "k", &limits, cost).unwrap();
                    let expected = (0..3).all(|i| models[i].can_pay(t_ms, amounts[i]));
                    prop_assert_eq!(decision.is_admitted(), expected);
                    for i in 0..3 {
                        if expected {
                            models[i].pay(t_ms, amounts[i]);
                        } else {
                            models[i].advance(t_ms);
                        }
                    }
                    if let Decision::NotYet(wait) = decision {
                        // The hint is the longest of the windows' exact waits.
                        let ready = u128::from(t_ms) * 1_000_000 + wait.as_nanos();
                        // A wait beyond 2^64 ns saturates there, shorter than the truth.
                        let saturated = wait.as_nanos() == u128::from(u64::MAX);
                        prop_assert!(saturated || (0..3).all(|i| models[i].level_at_ns(ready).ge(Q::int(amounts[i] as i128))));
                        prop_assert!((0..3).any(|i| !models[i].level_at_ns(ready - 1).ge(Q::int(amounts[i] as i128))));
                    }
                    let paid = decision.is_admitted();
                    amounts.map(|a| Some(Q::int(if paid { a as i128 } else { 0 })))
                }
                What::Settle(delta) => {
                    // A settlement moves the token windows alone.
                    adjust_now(&store, "k", &limits, delta).unwrap();
                    models[0].advance(t_ms);
                    models[1].settle(t_ms, delta);
                    models[2].advance(t_ms);
                    [None; 3]
                }
            };
            let levels = snapshot_now(&store, "k", &limits).unwrap();
            for i in 0..3 {
                let left = q(levels[i].tokens);
                let spent = admitted[i].unwrap_or_else(|| before[i].sub(left));
                events[i].push(Event { t_ms, spent, left });
                let m = models[i].level_at(t_ms);
                prop_assert!(left == m, "window {}: {:?} vs {:?}", i, levels[i].tokens, m);
            }
        }
        for i in 0..3 {
            assert_window_bound(&rates[i], &events[i])?;
        }
    }
}
