//! The arithmetic at the edges of what the grammar accepts: the largest counts, the longest
//! periods, settlements of i64::MIN and i64::MAX, pauses of centuries and clocks near the end
//! of time. Tests run with overflow checks on, so any overflow is a panic here: there must be
//! none, and every level stays between 64 bursts of debt and the capacity.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::store::{Op, Outcome};
use tollgate::{Cost, Currency, Limits, ManualClock, MemoryStore, Rate, Rates, Store};

/// The longest period the grammar accepts, in whole milliseconds.
const LONGEST_MS: u64 = (i64::MAX as u64) / 1_000_000;

#[test]
fn the_longest_periods_are_inside_the_grammar() {
    // Otherwise the strategy below would filter its longest arm away.
    assert!(Rate::new(1, Duration::from_millis(LONGEST_MS)).is_ok());
    assert!(Rate::new(1, Duration::from_millis(LONGEST_MS + 1)).is_err());
    assert!(Rate::new(1, Duration::from_millis((1 << 56) / 1_000_000)).is_ok());
}

/// Any rate the grammar accepts, with the extremes weighted in.
fn extreme_rate() -> impl Strategy<Value = Rate> {
    let count = prop_oneof![Just(1u64), Just(u64::MAX), any::<u64>(), 1u64..1000];
    let period_ms = prop_oneof![
        Just(1u64),
        Just(86_400_000u64),
        // About 2.3 years: the longest period any burst fits.
        Just((1u64 << 56) / 1_000_000),
        // The longest period there is (2^63 - 1 ns), and just below it.
        (LONGEST_MS - 1_000)..=LONGEST_MS,
        1u64..100_000,
        any::<u64>(),
    ];
    (count.clone(), period_ms, count).prop_filter_map("inside the grammar", |(n, p, b)| {
        Rate::new(n, Duration::from_millis(p))
            .ok()?
            .with_burst(b)
            .ok()
    })
}

#[derive(Debug, Clone)]
enum Step {
    Wait(u64),
    Take(u64, u64),
    Settle(i64),
    Penalize(Duration),
    Lower(u64),
}

fn step() -> impl Strategy<Value = Step> {
    let extreme_i64 = prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>(), -5i64..5];
    prop_oneof![
        prop_oneof![Just(u64::MAX), any::<u64>(), 0u64..1_000_000_000].prop_map(Step::Wait),
        (any::<u64>(), any::<u64>()).prop_map(|(a, b)| Step::Take(a, b)),
        extreme_i64.prop_map(Step::Settle),
        prop_oneof![
            Just(Duration::MAX),
            any::<u64>().prop_map(Duration::from_nanos)
        ]
        .prop_map(Step::Penalize),
        any::<u64>().prop_map(Step::Lower),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn extreme_rates_and_settlements_never_overflow(
        requests in extreme_rate(),
        tokens in extreme_rate(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let limits = Limits::new(Rates::from(requests), Rates::from(tokens));
        let key = store.bind("edge", &limits).unwrap();
        for step in steps {
            let op = match step {
                Step::Wait(nanos) => {
                    clock.advance(Duration::from_nanos(nanos));
                    continue;
                }
                Step::Take(a, b) => Op::Acquire {
                    cost: Cost::new(1 + a % requests.burst(), b % tokens.burst().saturating_add(1)),
                    max_wait: None,
                    fly: false,
                    share: None,
                },
                Step::Settle(delta) => Op::Adjust { delta: tollgate::PerCurrency::from([delta, delta, 0, delta]) },
                Step::Penalize(pause) => Op::Penalize { pause, spent: tollgate::Currencies::ALL, refusal: None },
                Step::Lower(remaining) => Op::Lower { currency: Currency::Tokens, remaining },
            };
            let outcome = store.apply_now(&key, op).unwrap();
            prop_assert!(outcome.is_ok(), "{:?}", outcome);
            let Outcome::Snapshot(levels) = store.apply_now(&key, Op::Snapshot).unwrap().unwrap() else {
                panic!("not a snapshot");
            };
            for level in levels {
                let burst = i128::from(level.rate.burst());
                let whole = level.tokens.whole();
                prop_assert!(whole <= burst, "{:?} above capacity", level);
                prop_assert!(whole >= -64 * burst, "{:?} below the debt floor", level);
            }
        }
    }
}
