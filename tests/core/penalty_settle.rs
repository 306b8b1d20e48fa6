//! Living with a real API: 429 penalties that pause every waiter, estimates settled against
//! real usage, and the metrics that say what happened.

use std::time::Duration;

use tokio::time::Instant;
use tollgate::{Attempt, Cost, Limiter, Limits, MemoryStore, Registry};

fn limiter(requests: &str, tokens: &str) -> Limiter {
    Limiter::builder("k", Limits::parse(requests, tokens).unwrap())
        .build()
        .unwrap()
}

fn not_yet(attempt: Attempt) -> Duration {
    match attempt {
        Attempt::NotYet(wait) => wait,
        Attempt::Admitted(_) => panic!("expected NotYet"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_penalty_drains_the_key_and_pauses_every_waiter() {
    let limiter = limiter("2/s", "");
    let call = Cost::call(0);
    limiter.acquire(call).await.unwrap();
    limiter.acquire(call).await.unwrap();
    // Three waiters, the first due in 0.5 s.
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                limiter.acquire_timeout(call, None).await.unwrap();
                start.elapsed()
            })
        })
        .collect();
    tokio::task::yield_now().await;
    limiter.penalize(Duration::from_secs(2)).await.unwrap();
    // Drained and paused: nothing passes for 2 s, though a request was due in 0.5 s. A call
    // that doesn't queue comes after the three waiters: at 2 s the refilled burst of 2 lets
    // two of them through, the third passes at 2.5 s, and its own turn is at 3 s.
    assert_eq!(
        not_yet(limiter.try_acquire(call).await.unwrap()),
        Duration::from_secs(3)
    );
    let snapshot = limiter.snapshot().await.unwrap();
    assert!(
        snapshot.windows()[0].tokens.is(0, 1),
        "{:?}",
        snapshot.windows()[0].tokens
    );
    for waiter in waiters {
        let waited = waiter.await.unwrap();
        assert!(
            waited >= Duration::from_secs(2),
            "a waiter passed after {waited:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_longer_pause_in_force_wins() {
    let limiter = limiter("10/s", "");
    limiter.penalize(Duration::from_secs(5)).await.unwrap();
    limiter.penalize(Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        not_yet(limiter.try_acquire(Cost::call(0)).await.unwrap()),
        Duration::from_secs(5)
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    limiter.penalize(Duration::from_secs(4)).await.unwrap();
    assert_eq!(
        not_yet(limiter.try_acquire(Cost::call(0)).await.unwrap()),
        Duration::from_secs(4)
    );
    tokio::time::advance(Duration::from_secs(4)).await;
    // Refilled during the pause: 4 s at 10/s is a full bucket.
    assert!(
        limiter
            .try_acquire(Cost::call(0))
            .await
            .unwrap()
            .is_admitted()
    );
}

#[tokio::test(start_paused = true)]
async fn the_registry_penalizes_live_keys_by_name() {
    let registry = Registry::new(MemoryStore::new());
    let limits = Limits::parse("5/s", "").unwrap();
    let limiter = registry.limiter("live", &limits).unwrap();
    assert!(
        registry
            .penalize("live", Duration::from_secs(1))
            .await
            .unwrap()
    );
    assert!(
        !registry
            .penalize("never-seen", Duration::from_secs(1))
            .await
            .unwrap()
    );
    assert_eq!(
        match limiter.try_acquire(Cost::call(0)).await.unwrap() {
            Attempt::NotYet(wait) => wait,
            Attempt::Admitted(_) => Duration::ZERO,
        },
        Duration::from_secs(1)
    );
}

#[tokio::test(start_paused = true)]
async fn settling_charges_an_underestimate_and_refunds_an_overestimate() {
    let limiter = limiter("", "1000/m");
    // Used more than estimated: the difference is charged, into debt if need be.
    let permit = limiter.acquire(Cost::call(900)).await.unwrap();
    assert_eq!(permit.settle(1_300).await.unwrap(), -400);
    let left = limiter.snapshot().await.unwrap().windows()[0].tokens;
    assert!(left.is(-300, 1), "{left:?}");
    // Later calls pay for it: 100 tokens need the debt repaid first, 400 tokens at 1000/m.
    assert_eq!(
        match limiter.try_acquire(Cost::call(100)).await.unwrap() {
            Attempt::NotYet(wait) => wait,
            Attempt::Admitted(_) => Duration::ZERO,
        },
        Duration::from_secs(24)
    );
    tokio::time::advance(Duration::from_secs(120)).await;
    // Used less: refunded.
    let permit = limiter.acquire(Cost::call(500)).await.unwrap();
    assert_eq!(permit.settle(100).await.unwrap(), 400);
    assert!(
        limiter.snapshot().await.unwrap().windows()[0]
            .tokens
            .is(900, 1)
    );
    // But never above capacity: refilled to 1000 meanwhile, a refund of 50 stays at 1000.
    let permit = limiter.acquire(Cost::call(50)).await.unwrap();
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(permit.settle(0).await.unwrap(), 50);
    assert!(
        limiter.snapshot().await.unwrap().windows()[0]
            .tokens
            .is(1000, 1)
    );
    // An exact estimate changes nothing.
    let permit = limiter.acquire(Cost::call(10)).await.unwrap();
    assert_eq!(permit.settle(10).await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_shortfall_a_429_already_counted_is_not_charged_again() {
    let limiter = limiter("", "1000/d");
    let early = limiter.acquire(Cost::call(300)).await.unwrap();
    let refunded = limiter.acquire(Cost::call(300)).await.unwrap();
    // A 429 for a third call empties the windows: the provider has counted the first two.
    limiter.penalize(Duration::from_secs(1)).await.unwrap();
    // The first used 500: its shortfall of 200 is in the provider's count already.
    assert_eq!(early.settle(500).await.unwrap(), 0);
    assert!(
        limiter.snapshot().await.unwrap().windows()[0]
            .tokens
            .is(0, 1)
    );
    // The second used 100: its overestimate of 200 comes back.
    assert_eq!(refunded.settle(100).await.unwrap(), 200);
    assert_eq!(
        limiter.snapshot().await.unwrap().windows()[0]
            .tokens
            .whole(),
        200
    );
    // A call admitted after the penalty settles in full, shortfall included.
    tokio::time::advance(Duration::from_secs(1)).await;
    let later = limiter.acquire(Cost::call(100)).await.unwrap();
    assert_eq!(later.settle(250).await.unwrap(), -150);
    assert_eq!(
        limiter.snapshot().await.unwrap().windows()[0]
            .tokens
            .whole(),
        200 - 100 - 150
    );
}

/// The issue-30 trial through the public API: 19 calls drain a `20000/m` window, the provider
/// pauses the key for a second, then the 19 settle at 100 tokens each. The window then holds
/// enough for the 19 waiters of 900 queued behind them: they pass when the pause ends, not one
/// every 1.2 s as the empty window planned them (the last passed at 23.2 s).
#[tokio::test(start_paused = true)]
async fn waiters_follow_the_refunds_that_come_during_a_pause() {
    let limiter = limiter("", "20000/m");
    let start = Instant::now();
    let mut out = Vec::new();
    for _ in 0..19 {
        out.push(limiter.acquire(Cost::call(1_050)).await.unwrap());
    }
    let waiters: Vec<_> = (0..19)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                limiter
                    .acquire_timeout(Cost::call(900), Some(Duration::from_secs(60)))
                    .await
                    .unwrap();
                Instant::now()
            })
        })
        .collect();
    tokio::task::yield_now().await;
    limiter.penalize(Duration::from_secs(1)).await.unwrap();
    for permit in out {
        permit.settle(100).await.unwrap();
    }
    let mut last = start;
    for waiter in waiters {
        last = last.max(waiter.await.unwrap());
    }
    // 19 refunds of 950 leave 18,050 once the pause ends: 19 waiters of 900 (17,100) pass then.
    assert_eq!(last - start, Duration::from_secs(1));
}
