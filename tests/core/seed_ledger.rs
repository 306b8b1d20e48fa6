//! The worked example and a ledger of events, with exact expected values, on a manual clock.

use std::time::Duration;

use tollgate::{Amount, Cost, Error, Limits, ManualClock, MemoryStore, Rate};
use tollgate_testkit::stores::{Decision, snapshot_now, try_now};

const MS: u64 = 1_000_000;

/// One window of tokens in a store on a manual clock: the bucket arithmetic seen from outside.
struct Bucket {
    clock: ManualClock,
    store: MemoryStore,
    limits: Limits,
}

impl Bucket {
    fn new(rate: Rate) -> Bucket {
        let clock = ManualClock::new();
        Bucket {
            store: MemoryStore::with_clock(clock.clone()),
            clock,
            limits: Limits::tokens_only(rate),
        }
    }

    fn at(&self, nanos: u64) {
        self.clock.set(Duration::from_nanos(nanos)).unwrap();
    }

    fn try_take(&self, nanos: u64, cost: u64) -> Result<Decision, Error> {
        self.at(nanos);
        try_now(&self.store, "k", &self.limits, Cost::new(0, cost))
    }

    fn tokens_at(&self, nanos: u64) -> Amount {
        self.at(nanos);
        snapshot_now(&self.store, "k", &self.limits).unwrap()[0].tokens
    }
}

fn seed_rate() -> Rate {
    // B = 3, r = 2 per second.
    "2/s burst 3".parse().unwrap()
}

#[test]
fn worked_example_on_one_bucket() {
    let bucket = Bucket::new(seed_rate());
    for _ in 0..3 {
        assert_eq!(bucket.try_take(0, 1).unwrap(), Decision::Admitted);
    }
    assert_eq!(
        bucket.try_take(0, 1).unwrap(),
        Decision::NotYet(Duration::from_millis(500))
    );

    // 0.25 s at 2/s is exactly half a token: still refused, and the half is kept.
    assert_eq!(
        bucket.try_take(250 * MS, 1).unwrap(),
        Decision::NotYet(Duration::from_millis(250))
    );
    assert!(bucket.tokens_at(250 * MS).is(1, 2));

    // At 0.5 s exactly one passes.
    assert_eq!(bucket.try_take(500 * MS, 1).unwrap(), Decision::Admitted);
    assert_eq!(
        bucket.try_take(500 * MS, 1).unwrap(),
        Decision::NotYet(Duration::from_millis(500))
    );

    // At 10 s the bucket is full, not at 20 tokens: 3 pass, a fourth does not.
    assert!(bucket.tokens_at(10_000 * MS).is(3, 1));
    assert_eq!(bucket.try_take(10_000 * MS, 3).unwrap(), Decision::Admitted);
    assert_eq!(
        bucket.try_take(10_000 * MS, 1).unwrap(),
        Decision::NotYet(Duration::from_millis(500))
    );
}

#[test]
fn worked_example_through_the_store() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let limits = Limits::requests_only(seed_rate());
    let unit = Cost::call(0);
    let take = |cost| try_now(&store, "seed", &limits, cost).unwrap();

    for _ in 0..3 {
        assert_eq!(take(unit), Decision::Admitted);
    }
    assert_eq!(take(unit), Decision::NotYet(Duration::from_millis(500)));
    clock.set(Duration::from_millis(250)).unwrap();
    assert_eq!(take(unit), Decision::NotYet(Duration::from_millis(250)));
    let snapshot = snapshot_now(&store, "seed", &limits).unwrap();
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
    let bucket = Bucket::new(seed_rate());
    let mut last_ms = 0;
    for (i, r) in LEDGER.iter().enumerate() {
        let before = bucket.tokens_at(last_ms * MS);
        assert!(
            before.is(r.before.0, r.before.1),
            "row {i}: before {before:?}"
        );
        assert_eq!(
            r.t_ms - last_ms,
            r.elapsed_ms,
            "row {i}: the table's elapsed"
        );
        let now = r.t_ms * MS;
        let available = bucket.tokens_at(now);
        assert!(
            available.is(r.available.0, r.available.1),
            "row {i}: available {available:?}"
        );
        let expected = if r.admitted {
            Decision::Admitted
        } else {
            Decision::NotYet(Duration::from_nanos(r.wait_ns))
        };
        assert_eq!(bucket.try_take(now, r.cost).unwrap(), expected, "row {i}");
        last_ms = r.t_ms;
    }
}

#[test]
fn refusal_keeps_partial_credit() {
    let bucket = Bucket::new(seed_rate());
    assert_eq!(bucket.try_take(0, 3).unwrap(), Decision::Admitted);
    // Refused at 0.1 s and again at 0.2 s: the 0.4 token refilled by then is all still there.
    assert!(!bucket.try_take(100 * MS, 1).unwrap().is_admitted());
    assert!(!bucket.try_take(200 * MS, 1).unwrap().is_admitted());
    assert!(bucket.tokens_at(200 * MS).is(2, 5));
    assert_eq!(bucket.try_take(500 * MS, 1).unwrap(), Decision::Admitted);
    assert!(bucket.tokens_at(500 * MS).is(0, 1));
}

#[test]
fn saturation_after_silence() {
    let bucket = Bucket::new(seed_rate());
    assert_eq!(bucket.try_take(0, 3).unwrap(), Decision::Admitted);
    let much_later = 3_600_000 * MS;
    assert!(bucket.tokens_at(much_later).is(3, 1));
    // A full bucket says nothing a new one wouldn't: the store may forget it.
    bucket.store.sweep();
    assert!(bucket.store.is_empty());
    // Time so long that rate × elapsed overflows anything smaller than u128: still full.
    let huge = Bucket::new(Rate::new(u64::MAX, Duration::from_secs(1)).unwrap());
    assert_eq!(huge.try_take(0, u64::MAX).unwrap(), Decision::Admitted);
    assert!(huge.tokens_at(u64::MAX).is(i128::from(u64::MAX), 1));
}

#[test]
fn cost_above_capacity_is_an_error() {
    let bucket = Bucket::new(seed_rate());
    match bucket.try_take(0, 4).unwrap_err() {
        Error::CostExceedsCapacity {
            currency,
            rate,
            cost: 4,
            capacity: 3,
            ..
        } => assert_eq!((currency, rate), (tollgate::Currency::Tokens, seed_rate())),
        other => panic!("expected CostExceedsCapacity, got {other:?}"),
    }
    assert!(bucket.tokens_at(0).is(3, 1));

    let store = MemoryStore::with_clock(ManualClock::new());
    let limits = Limits::parse("2/s burst 3", "100/m").unwrap();
    let err = try_now(&store, "k", &limits, Cost::call(101)).unwrap_err();
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
    let bucket = Bucket::new(seed_rate());
    assert_eq!(bucket.try_take(400 * MS, 2).unwrap(), Decision::Admitted);
    assert!(matches!(
        bucket.try_take(400 * MS, 0),
        Err(Error::InvalidCost { .. })
    ));
    // Time can't be set back, so no operation ever sees it run backwards.
    let err = bucket.clock.set(Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, Error::ClockWentBackwards { .. }), "{err:?}");
    assert!(bucket.tokens_at(400 * MS).is(1, 1));

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
    // Only a cost of nothing at all is invalid (an empty prompt still pays its request).
    let err = try_now(&store, "k", &limits, Cost::new(0, 0)).unwrap_err();
    assert!(matches!(err, Error::InvalidCost { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "key `k`: cost 0 requests + 0 tokens is invalid: it is zero in every currency; a call pays at least one request or one token"
    );
    let err = try_now(&store, "k", &limits, Cost::new(4, 5)).unwrap_err();
    assert!(matches!(err, Error::CostExceedsCapacity { .. }), "{err:?}");
    assert!(store.is_empty(), "a refused input created no state");
}

#[test]
fn an_empty_prompt_pays_its_request_and_passes() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let limits = Limits::parse("2/s", "100/m").unwrap();
    assert_eq!(
        try_now(&store, "k", &limits, Cost::call(0)).unwrap(),
        Decision::Admitted
    );
    let left = snapshot_now(&store, "k", &limits).unwrap();
    assert!(
        left[0].tokens.is(1, 1) && left[1].tokens.is(100, 1),
        "{left:?}"
    );
    // Tokens alone, without a request, are a cost too.
    assert_eq!(
        try_now(&store, "k", &limits, Cost::new(0, 5)).unwrap(),
        Decision::Admitted
    );
}
