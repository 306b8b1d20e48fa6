//! The worked example and a ledger of events, with exact expected values, on a manual clock.

use std::time::Duration;

use tollgate::bucket::{Bucket, BucketError, Decision, Nanos};
use tollgate::clock::ManualClock;
use tollgate::{Cost, Error, Limits, MemoryStore, Rate};

const MS: u64 = 1_000_000;

fn seed_rate() -> Rate {
    // B = 3, r = 2 per second.
    "2/s burst 3".parse().unwrap()
}

#[test]
fn worked_example_on_one_bucket() {
    let mut bucket = Bucket::new(seed_rate(), Nanos(0));
    for _ in 0..3 {
        assert_eq!(bucket.try_take(Nanos(0), 1), Ok(Decision::Admitted));
    }
    assert_eq!(
        bucket.try_take(Nanos(0), 1),
        Ok(Decision::NotYet(Duration::from_millis(500)))
    );

    // 0.25 s at 2/s is exactly half a token: still refused, and the half is kept.
    assert_eq!(
        bucket.try_take(Nanos(250 * MS), 1),
        Ok(Decision::NotYet(Duration::from_millis(250)))
    );
    assert!(bucket.tokens_at(Nanos(250 * MS)).unwrap().is(1, 2));

    // At 0.5 s exactly one passes.
    assert_eq!(bucket.try_take(Nanos(500 * MS), 1), Ok(Decision::Admitted));
    assert_eq!(
        bucket.try_take(Nanos(500 * MS), 1),
        Ok(Decision::NotYet(Duration::from_millis(500)))
    );

    // At 10 s the bucket is full, not at 20 tokens: 3 pass, a fourth does not.
    assert!(bucket.tokens_at(Nanos(10_000 * MS)).unwrap().is(3, 1));
    assert_eq!(
        bucket.try_take(Nanos(10_000 * MS), 3),
        Ok(Decision::Admitted)
    );
    assert_eq!(
        bucket.try_take(Nanos(10_000 * MS), 1),
        Ok(Decision::NotYet(Duration::from_millis(500)))
    );
}

#[test]
fn worked_example_through_the_store() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let limits = Limits::requests_only(seed_rate());
    let unit = Cost::call(0);
    let take = |cost| store.try_acquire_now("seed", &limits, cost).unwrap();

    for _ in 0..3 {
        assert_eq!(take(unit), Decision::Admitted);
    }
    assert_eq!(take(unit), Decision::NotYet(Duration::from_millis(500)));
    clock.set(Duration::from_millis(250)).unwrap();
    assert_eq!(take(unit), Decision::NotYet(Duration::from_millis(250)));
    let snapshot = store.snapshot_now("seed", &limits).unwrap();
    assert!(snapshot[0].tokens.is(1, 2), "{:?}", snapshot[0].tokens);
    clock.set(Duration::from_millis(500)).unwrap();
    assert_eq!(take(unit), Decision::Admitted);
    assert_eq!(take(unit), Decision::NotYet(Duration::from_millis(500)));
    clock.set(Duration::from_secs(10)).unwrap();
    assert_eq!(take(Cost::new(3, 0)), Decision::Admitted);
    assert_eq!(take(unit), Decision::NotYet(Duration::from_millis(500)));
}

/// One row of the ledger: at `t_ms`, a call of `cost` finds `before` tokens (as left by the
/// previous row), `elapsed_ms` later there are `available`, and it is admitted or not.
/// Token amounts are exact fractions `(numerator, denominator)`.
struct Row {
    t_ms: u64,
    cost: u64,
    before: (i128, u64),
    elapsed_ms: u64,
    available: (i128, u64),
    admitted: bool,
    wait_ns: u64,
}

const fn row(
    t_ms: u64,
    cost: u64,
    before: (i128, u64),
    elapsed_ms: u64,
    available: (i128, u64),
    admitted: bool,
    wait_ns: u64,
) -> Row {
    Row {
        t_ms,
        cost,
        before,
        elapsed_ms,
        available,
        admitted,
        wait_ns,
    }
}

#[rustfmt::skip]
const LEDGER: &[Row] = &[
    //   t (ms)  cost  before   elapsed  available  admitted  wait (ns)
    row(     0,  1,   (3, 1),       0,   (3, 1),    true,            0),
    row(     0,  2,   (2, 1),       0,   (2, 1),    true,            0),
    row(   100,  1,   (0, 1),     100,   (1, 5),    false, 400_000_000),
    row(   250,  1,   (1, 5),     150,   (1, 2),    false, 250_000_000),
    row(   500,  1,   (1, 2),     250,   (1, 1),    true,            0),
    row(  1500,  3,   (0, 1),    1000,   (2, 1),    false, 500_000_000),
    row(  2000,  3,   (2, 1),     500,   (3, 1),    true,            0),
    row(  2200,  1,   (0, 1),     200,   (2, 5),    false, 300_000_000),
    row( 10000,  2,   (2, 5),    7800,   (3, 1),    true,            0),
    row( 10125,  1,   (1, 1),     125,   (5, 4),    true,            0),
    row( 10125,  1,   (1, 4),       0,   (1, 4),    false, 375_000_000),
    row( 10126,  1,   (1, 4),       1,   (63, 250), false, 374_000_000),
];

#[test]
fn ledger_of_events_matches_exact_arithmetic() {
    let mut bucket = Bucket::new(seed_rate(), Nanos(0));
    let mut last_ms = 0;
    for (i, r) in LEDGER.iter().enumerate() {
        let before = bucket.tokens_at(bucket.last_update()).unwrap();
        assert!(
            before.is(r.before.0, r.before.1),
            "row {i}: before {before:?}"
        );
        assert_eq!(
            r.t_ms - last_ms,
            r.elapsed_ms,
            "row {i}: the table's elapsed"
        );
        let now = Nanos(r.t_ms * MS);
        let available = bucket.tokens_at(now).unwrap();
        assert!(
            available.is(r.available.0, r.available.1),
            "row {i}: available {available:?}"
        );
        let expected = if r.admitted {
            Decision::Admitted
        } else {
            Decision::NotYet(Duration::from_nanos(r.wait_ns))
        };
        assert_eq!(bucket.try_take(now, r.cost), Ok(expected), "row {i}");
        last_ms = r.t_ms;
    }
}

#[test]
fn refusal_keeps_partial_credit() {
    let mut bucket = Bucket::new(seed_rate(), Nanos(0));
    assert_eq!(bucket.try_take(Nanos(0), 3), Ok(Decision::Admitted));
    // Refused at 0.1 s and again at 0.2 s: the 0.4 token refilled by then is all still there.
    assert!(!bucket.try_take(Nanos(100 * MS), 1).unwrap().is_admitted());
    assert!(!bucket.try_take(Nanos(200 * MS), 1).unwrap().is_admitted());
    assert!(bucket.tokens_at(Nanos(200 * MS)).unwrap().is(2, 5));
    assert_eq!(bucket.try_take(Nanos(500 * MS), 1), Ok(Decision::Admitted));
    assert!(bucket.tokens_at(Nanos(500 * MS)).unwrap().is(0, 1));
}

#[test]
fn saturation_after_silence() {
    let mut bucket = Bucket::new(seed_rate(), Nanos(0));
    assert_eq!(bucket.try_take(Nanos(0), 3), Ok(Decision::Admitted));
    let much_later = Nanos(3_600_000 * MS);
    assert!(bucket.tokens_at(much_later).unwrap().is(3, 1));
    assert!(bucket.is_full(much_later));
    // Time so long that rate × elapsed overflows anything smaller than u128: still 3.
    let mut huge = Bucket::new(
        Rate::new(u64::MAX, Duration::from_secs(1)).unwrap(),
        Nanos(0),
    );
    assert_eq!(huge.try_take(Nanos(0), u64::MAX), Ok(Decision::Admitted));
    assert!(
        huge.tokens_at(Nanos(u64::MAX))
            .unwrap()
            .is(i128::from(u64::MAX), 1)
    );
}

#[test]
fn cost_above_capacity_is_an_error() {
    let mut bucket = Bucket::new(seed_rate(), Nanos(0));
    assert_eq!(
        bucket.try_take(Nanos(0), 4),
        Err(BucketError::CostExceedsCapacity {
            currency: tollgate::Currency::Tokens,
            rate: seed_rate(),
            cost: 4
        })
    );
    assert!(bucket.tokens_at(Nanos(0)).unwrap().is(3, 1));

    let store = MemoryStore::with_clock(ManualClock::new());
    let limits = Limits::parse("2/s burst 3", "100/m").unwrap();
    let err = store
        .try_acquire_now("k", &limits, Cost::call(101))
        .unwrap_err();
    match &err {
        Error::CostExceedsCapacity {
            key,
            currency,
            cost,
            capacity,
            ..
        } => {
            assert_eq!(
                (key.as_str(), *currency, *cost, *capacity),
                ("k", tollgate::Currency::Tokens, 101, 100)
            );
        }
        other => panic!("expected CostExceedsCapacity, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "key `k`: a cost of 101 tokens exceeds the capacity 100 of the tokens window `100/m`; waiting cannot help: raise the burst or split the call"
    );
}

#[test]
fn bad_input_changes_no_state() {
    let mut bucket = Bucket::new(seed_rate(), Nanos(0));
    assert_eq!(bucket.try_take(Nanos(400 * MS), 2), Ok(Decision::Admitted));
    assert_eq!(
        bucket.try_take(Nanos(400 * MS), 0),
        Err(BucketError::ZeroCost {
            currency: tollgate::Currency::Tokens
        })
    );
    assert_eq!(
        bucket.try_take(Nanos(300 * MS), 1),
        Err(BucketError::TimeWentBackwards {
            last: Nanos(400 * MS),
            now: Nanos(300 * MS)
        })
    );
    assert_eq!(bucket.last_update(), Nanos(400 * MS));
    assert!(bucket.tokens_at(Nanos(400 * MS)).unwrap().is(1, 1));

    let clock = ManualClock::new();
    clock.set(Duration::from_secs(2)).unwrap();
    let err = clock.set(Duration::from_secs(1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "time went backwards from 2s to 1s; a clock may only move forward"
    );
    assert_eq!(clock.elapsed(), Duration::from_secs(2));

    let store = MemoryStore::with_clock(clock);
    let limits = Limits::parse("2/s burst 3", "100/m").unwrap();
    let err = store
        .try_acquire_now("k", &limits, Cost::call(0))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidCost { .. }), "{err:?}");
    let err = store
        .try_acquire_now("k", &limits, Cost::new(0, 5))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidCost { .. }), "{err:?}");
    assert!(store.is_empty(), "a refused input created no state");
}
