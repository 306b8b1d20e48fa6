//! Both buckets, or none; and the boundary under racing threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::{Attempt, Cost, Currency, Limiter, Limits, ManualClock, MemoryStore};
use tollgate_testkit::stores::{Decision, snapshot_now, try_now};

fn tokens_of(store: &MemoryStore, limits: &Limits) -> Vec<(Currency, i128)> {
    snapshot_now(store, "k", limits)
        .unwrap()
        .into_iter()
        .map(|a| {
            assert_eq!(a.tokens.units() % i128::from(a.tokens.scale()), 0);
            (a.currency, a.tokens.whole())
        })
        .collect()
}

#[test]
fn request_bucket_can_pay_token_bucket_cannot_consumes_neither() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let limits = Limits::parse("10/s", "1000/m").unwrap();
    assert_eq!(
        try_now(&store, "k", &limits, Cost::call(900)).unwrap(),
        Decision::Admitted
    );
    // 9 requests left, 100 tokens left: 1 request + 150 tokens can't pay.
    let decision = try_now(&store, "k", &limits, Cost::call(150)).unwrap();
    assert_eq!(decision, Decision::NotYet(Duration::from_secs(3)));
    assert_eq!(
        tokens_of(&store, &limits),
        vec![(Currency::Requests, 9), (Currency::Tokens, 100)]
    );
}

#[test]
fn token_bucket_can_pay_request_bucket_cannot_consumes_neither() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let limits = Limits::parse("2/m", "1000/m").unwrap();
    for _ in 0..2 {
        assert!(
            try_now(&store, "k", &limits, Cost::call(10))
                .unwrap()
                .is_admitted()
        );
    }
    let decision = try_now(&store, "k", &limits, Cost::call(10)).unwrap();
    assert_eq!(decision, Decision::NotYet(Duration::from_secs(30)));
    assert_eq!(
        tokens_of(&store, &limits),
        vec![(Currency::Requests, 0), (Currency::Tokens, 980)]
    );
}

#[test]
fn hint_is_the_longest_wait_of_all_windows() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let limits = Limits::parse("1/s; 3/m", "100/10s").unwrap();
    assert!(
        try_now(&store, "k", &limits, Cost::call(100))
            .unwrap()
            .is_admitted()
    );
    // Requests: 1/s needs 1 s, 3/m has 2 left; tokens: 100/10s needs 10 s for 100.
    assert_eq!(
        try_now(&store, "k", &limits, Cost::call(100)).unwrap(),
        Decision::NotYet(Duration::from_secs(10))
    );
    clock.advance(Duration::from_secs(10));
    assert!(
        try_now(&store, "k", &limits, Cost::call(100))
            .unwrap()
            .is_admitted()
    );
    // The minute window: 3 - 1 at 0 s, + 10 s × 3/60 = 2.5 - 1 at 10 s, 1.55 - 1 at 11 s.
    clock.advance(Duration::from_secs(1));
    assert!(
        try_now(&store, "k", &limits, Cost::call(1))
            .unwrap()
            .is_admitted()
    );
    // At 12 s the second window is full again but the minute window holds 0.6: 0.4 more
    // takes 8 s at 3/m.
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        try_now(&store, "k", &limits, Cost::call(1)).unwrap(),
        Decision::NotYet(Duration::from_secs(8))
    );
}

#[test]
fn racing_threads_admit_exactly_the_capacity() {
    // Time frozen on a manual clock: 4 threads × 1,000 tasks race for B = 100.
    let store = MemoryStore::with_clock(ManualClock::new());
    let limits = Limits::parse("100/h", "").unwrap();
    let limiter = Limiter::new("k", limits.clone(), store.clone()).unwrap();
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, admitted, start) =
                (limiter.clone(), Arc::clone(&admitted), Arc::clone(&start));
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                start.wait();
                runtime.block_on(async {
                    let tasks: Vec<_> = (0..1000)
                        .map(|_| {
                            let (limiter, admitted) = (limiter.clone(), Arc::clone(&admitted));
                            tokio::spawn(async move {
                                if let Attempt::Admitted(_) =
                                    limiter.try_acquire(Cost::call(0)).await.unwrap()
                                {
                                    admitted.fetch_add(1, Ordering::Relaxed);
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.unwrap();
                    }
                });
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 100);
    let snapshot = snapshot_now(&store, "k", &limits).unwrap();
    assert!(snapshot[0].tokens.is(0, 1));
}
