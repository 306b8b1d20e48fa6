//! The Redis script against the rule book where `differential.rs` does not go: rates that
//! refill a fraction of a token each millisecond (`200000/m` is 10/3 a millisecond, `7/s` one
//! token every 142.857 ms), costs above a window's burst, and charges that drive windows into
//! debt down to their floor and past it.
//!
//! Both sides keep levels as exact fractions, so after every step they must hold the same
//! level to the unit, and admit or refuse the same calls. Only a wait differs by design: the
//! rule book counts it in nanoseconds, the script in whole milliseconds rounded up, so a
//! script's wait must be the rule book's rounded up to the millisecond.

use std::time::Duration;

use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::store::{Op, Outcome};
use tollgate::testing::{RuleBook, redis_apply_at};
use tollgate::{Cost, Currency, Error, Limits, PerCurrency, Rates, Store};
use tollgate_testkit::Lcg;
use tollgate_testkit::redis::RedisServer;

use crate::differential::smallest_burst;

const LEASE: Duration = Duration::from_secs(1);
const SEQUENCES: u64 = 300;
const STEPS: u64 = 40;

fn limit_sets() -> Vec<Limits> {
    vec![
        Limits::parse("", "200000/m").unwrap(),
        Limits::parse("7/s", "90000/m burst 1000").unwrap(),
        Limits::parse("3/m burst 2", "30000/m; 1000000/d")
            .unwrap()
            .with_output_tokens("8000/m".parse::<Rates>().unwrap()),
        Limits::parse("500/m", "")
            .unwrap()
            .with_spend(Rates::parse_money("$50/d burst $0.01").unwrap()),
    ]
}

/// A cost: mostly one that fits, sometimes one above the smallest burst of a currency (both
/// sides must refuse it the same way).
fn cost(rng: &mut Lcg, limits: &Limits) -> Cost {
    let amount = |rng: &mut Lcg, currency: Currency| {
        let burst = smallest_burst(limits, currency);
        match (burst, rng.below(10)) {
            (0, _) => 0,
            (burst, 0) => burst + 1 + rng.below(burst),
            (burst, _) => rng.below(burst + 1),
        }
    };
    let requests = u64::from(!limits.requests().is_empty());
    let cost = Cost::new(requests, amount(rng, Currency::Tokens))
        .with_output_tokens(amount(rng, Currency::OutputTokens))
        .with_spend(amount(rng, Currency::Spend));
    if cost.is_zero() {
        Cost::new(1, 1)
    } else {
        cost
    }
}

fn operation(rng: &mut Lcg, limits: &Limits) -> Op {
    match rng.below(10) {
        0..=5 => Op::Acquire {
            cost: cost(rng, limits),
            max_wait: Some(Duration::ZERO),
            fly: false,
            share: None,
        },
        6..=8 => {
            // Charges up to four bursts at once, now and then up to seventy, and now and then
            // a refund.
            let delta = PerCurrency::from_fn(|currency| {
                let burst = smallest_burst(limits, currency) as i64;
                match rng.below(5) {
                    0 => rng.below(burst as u64 + 1) as i64,
                    // Past the floor of 64 bursts in debt, and past what one adjustment may
                    // take (66 bursts).
                    1 => -(rng.below(70 * burst as u64 + 1) as i64),
                    _ => -(rng.below(4 * burst as u64 + 1) as i64),
                }
            });
            Op::Adjust { delta }
        }
        _ => Op::Penalize {
            pause: Duration::from_millis(rng.below(500)),
            spent: tollgate::Currencies::NONE.with(Currency::Tokens),
            refusal: None,
        },
    }
}

/// The rule book's wait rounded up to a whole millisecond, as the script counts it.
fn in_whole_ms(wait: Duration) -> Duration {
    Duration::from_millis(wait.as_nanos().div_ceil(1_000_000) as u64)
}

fn kind(err: &Error) -> String {
    let text = format!("{err:?}");
    text.split([' ', '{', '(']).next().unwrap_or("").to_owned()
}

#[test]
fn fractional_rates_costs_above_a_burst_and_debt_agree_with_the_rule_book() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    tollgate_testkit::local_runtime().block_on(async {
        let config = RedisConfig::default().with_lease(LEASE);
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        let sets = limit_sets();
        let (mut admitted, mut refused, mut too_large, mut in_debt, mut at_floor) = (0, 0, 0, 0, 0);
        for seed in 0..SEQUENCES {
            let mut rng = Lcg(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x7A3);
            let limits = &sets[(seed % sets.len() as u64) as usize];
            let key = store.bind(&format!("edges-{seed}"), limits).unwrap();
            let mut now_ms = 5_000_000 + rng.below(1_000_000);
            let mut book = RuleBook::new(limits, Duration::from_millis(now_ms), LEASE);
            for step in 0..STEPS {
                // Steps that are not multiples of any refill period.
                now_ms += [0, 1, 2, 7, 13, 143, 1_001, 20_011][rng.below(8) as usize];
                let op = operation(&mut rng, limits);
                let context = || format!("{limits:?}, seed {seed}, step {step}, at {now_ms} ms: {op:?}");
                let expected = book.apply(op.clone(), Duration::from_millis(now_ms));
                let got = redis_apply_at(&store, &key, op.clone(), Some(now_ms))
                    .await
                    .map(|(outcome, _)| outcome);
                match (expected, got) {
                    (Err(a), Err(b)) => {
                        assert_eq!(kind(&a), kind(&b), "{}: {a} / {b}", context());
                        if matches!(a, Error::CostExceedsCapacity { .. }) {
                            too_large += 1;
                        }
                    }
                    (Ok(Outcome::NotYet(a)), Ok(Outcome::NotYet(b))) => {
                        assert_eq!(in_whole_ms(a), b, "{}: the wait", context());
                        refused += 1;
                    }
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "{}", context());
                        if a == Outcome::Admitted {
                            admitted += 1;
                        }
                    }
                    (a, b) => panic!("{}: the rule book {a:?}, the script {b:?}", context()),
                }
                let levels = book
                    .apply(Op::Snapshot, Duration::from_millis(now_ms))
                    .unwrap();
                let (theirs, _) = redis_apply_at(&store, &key, Op::Snapshot, Some(now_ms))
                    .await
                    .unwrap();
                assert_eq!(levels, theirs, "{}: levels after", context());
                if let Outcome::Snapshot(levels) = &levels {
                    if levels.iter().any(|level| level.tokens.units() < 0) {
                        in_debt += 1;
                    }
                    if levels.iter().any(|level| {
                        level.tokens.whole() <= -64 * i128::from(level.rate.burst())
                    }) {
                        at_floor += 1;
                    }
                }
            }
        }
        eprintln!(
            "edges: {admitted} admitted, {refused} refused with a wait, {too_large} above a burst, {in_debt} steps with a window in debt, {at_floor} at its floor"
        );
        for (what, count) in [
            ("admitted", admitted),
            ("refused with a wait", refused),
            ("above a burst", too_large),
            ("in debt", in_debt),
            ("at the debt floor", at_floor),
        ] {
            assert!(count >= 100, "only {count} steps were `{what}`");
        }
    });
}
