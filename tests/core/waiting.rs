//! Waiting: the fan-out, deadlines, the queue cap, arrival order, and cancellation, on tokio's
//! paused clock.

use std::time::Duration;

use tokio::time::Instant;
use tollgate::{Backoff, Cost, Error, Limiter, Limits, MemoryStore, WaitPolicy};

fn limiter(limits: &str, policy: WaitPolicy) -> Limiter<MemoryStore> {
    Limiter::with_policy(
        "k",
        Limits::parse(limits, "").unwrap(),
        MemoryStore::new(),
        policy,
    )
    .unwrap()
}

/// Cost one request against request-only limits.
const CALL: Cost = Cost::call(0);

#[tokio::test(start_paused = true)]
async fn fanout_of_60_calls_on_5_per_second_burst_10() {
    let limiter = limiter("5/s burst 10", WaitPolicy::default());
    let start = Instant::now();
    let tasks: Vec<_> = (0..60)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                limiter.acquire(CALL).await.unwrap();
                Instant::now() - start
            })
        })
        .collect();
    let mut times = Vec::new();
    for task in tasks {
        times.push(task.await.unwrap());
    }
    times.sort();
    assert!(
        times[..10].iter().all(|t| t.is_zero()),
        "{:?}",
        &times[..10]
    );
    // The rest are paced at 5/s: the k-th call past the burst not before k × 0.2 s.
    for (k, t) in times[10..].iter().enumerate() {
        let ideal = Duration::from_millis(200 * (k as u64 + 1));
        assert!(*t >= ideal, "call {} at {t:?}, before {ideal:?}", k + 10);
        assert!(
            *t <= ideal + Duration::from_millis(10),
            "call {} at {t:?}",
            k + 10
        );
    }
    let last = times[59].as_secs_f64();
    assert!((last - 10.0).abs() <= 0.1, "last call at {last} s");
    // The window bound over every interval between admissions: count ≤ 10 + 5·dt.
    for i in 0..times.len() {
        for j in i..times.len() {
            let dt_ns = (times[j] - times[i]).as_nanos();
            let count = (j - i + 1) as u128;
            assert!(count * 1_000_000_000 <= 10 * 1_000_000_000 + 5 * dt_ns);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn timeout_at_once_when_the_hint_passes_the_deadline() {
    let limiter = limiter("1/m", WaitPolicy::default());
    limiter.acquire(CALL).await.unwrap();
    let start = Instant::now();
    let err = limiter
        .acquire_timeout(CALL, Some(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert_eq!(Instant::now(), start, "answered without waiting");
    match err {
        Error::Timeout { waited, needed, .. } => {
            assert_eq!(waited, Duration::ZERO);
            assert_eq!(needed, Some(Duration::from_secs(60)));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    // Nothing was charged: at 60 s the call passes.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(limiter.try_acquire(CALL).await.unwrap().is_admitted());
}

#[tokio::test(start_paused = true)]
async fn timeout_at_once_when_the_turn_comes_after_the_deadline() {
    // One call waits for the token due at 1 s; the next one's turn comes at 2 s, after its
    // 500 ms deadline: it is told at once, with how long it would have needed.
    let limiter = limiter("1/s", WaitPolicy::default());
    limiter.acquire(CALL).await.unwrap();
    let head = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(CALL).await })
    };
    tokio::task::yield_now().await;
    assert_eq!(limiter.waiters(), 1);
    let start = Instant::now();
    let err = limiter
        .acquire_timeout(CALL, Some(Duration::from_millis(500)))
        .await
        .unwrap_err();
    match err {
        Error::Timeout { waited, needed, .. } => {
            assert_eq!(waited, Duration::ZERO);
            assert_eq!(needed, Some(Duration::from_secs(2)));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(Instant::now(), start, "answered without waiting");
    let permit = head.await.unwrap().unwrap();
    assert_eq!(permit.waited(), Duration::from_secs(1));
    assert_eq!(limiter.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn timeout_when_a_penalty_pushes_the_turn_past_the_deadline() {
    // A waiter due at 1 s, with a deadline at 1.5 s; a 429 at 0.5 s pauses the key for 2 s:
    // the penalty rings the line, the waiter asks at once, learns the key is paused past its
    // deadline, and gives up then rather than at its due time.
    let limiter = limiter("1/s", WaitPolicy::default());
    limiter.acquire(CALL).await.unwrap();
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            limiter
                .acquire_timeout(CALL, Some(Duration::from_millis(1500)))
                .await
        })
    };
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    limiter.penalize(Duration::from_secs(2)).await.unwrap();
    match waiter.await.unwrap().unwrap_err() {
        Error::Timeout { waited, needed, .. } => {
            assert_eq!(waited, Duration::from_millis(500));
            assert_eq!(needed, Some(Duration::from_secs(2)));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(limiter.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_never_takes_the_tokens_a_waiter_is_due() {
    // A waiter is due at 1 s. A call that doesn't queue, made at 1 s, finds that token
    // promised: it is told to wait behind, and the waiter passes on time.
    let limiter = limiter("1/s", WaitPolicy::default());
    limiter.acquire(CALL).await.unwrap();
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            limiter
                .acquire_timeout(CALL, Some(Duration::from_millis(1500)))
                .await
        })
    };
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(1)).await;
    match limiter.try_acquire(CALL).await.unwrap() {
        tollgate::Attempt::NotYet(wait) => assert_eq!(wait, Duration::from_secs(1)),
        tollgate::Attempt::Admitted(_) => panic!("passed ahead of the waiter"),
    }
    let permit = waiter.await.unwrap().unwrap();
    assert_eq!(permit.waited(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn queue_full_beyond_max_waiters() {
    let policy = WaitPolicy::default().with_max_waiters(2);
    let limiter = limiter("1/s", policy);
    limiter.acquire(CALL).await.unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire(CALL).await })
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(limiter.waiters(), 2);
    let err = limiter.acquire(CALL).await.unwrap_err();
    assert!(matches!(err, Error::QueueFull { limit: 2, .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "key `k`: 2 calls are already waiting; the queue is full (raise `max_waiters` or shed load)"
    );
    for task in waiting {
        task.await.unwrap().unwrap();
    }
    assert_eq!(limiter.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn large_call_is_not_starved_by_a_stream_of_small_ones() {
    // 10,000 tokens a minute; the bucket starts empty, and a stream of 100-token calls arrives
    // at exactly the refill rate (one every 0.6 s). Without arrival order the 8,000-token call
    // would never see 8,000 tokens at once.
    let limiter = Limiter::new(
        "k",
        Limits::tokens_only("10000/m".parse::<tollgate::Rate>().unwrap()),
        MemoryStore::new(),
    )
    .unwrap();
    limiter.acquire(Cost::new(0, 10_000)).await.unwrap();
    let small = Cost::new(0, 100);
    let stream = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let mut calls = Vec::new();
            for _ in 0..150 {
                tokio::time::sleep(Duration::from_millis(600)).await;
                let limiter = limiter.clone();
                calls.push(tokio::spawn(async move {
                    limiter.acquire_timeout(small, None).await.unwrap()
                }));
            }
            for call in calls {
                call.await.unwrap();
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let ahead = limiter.waiters() as u32;
    let big = limiter
        .acquire_timeout(Cost::new(0, 8_000), None)
        .await
        .unwrap();
    // Its own refill time: 8,000 tokens at 10,000/m is 48 s; plus what was queued ahead of it.
    let own = Duration::from_secs(48);
    let queue = Duration::from_millis(600) * (ahead + 1);
    let jitter = Backoff::default().cap();
    assert!(
        big.waited() <= own + queue + jitter,
        "waited {:?}",
        big.waited()
    );
    assert!(big.waited() >= own - queue, "waited {:?}", big.waited());
    stream.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn dropped_acquire_holds_nothing_and_consumed_nothing() {
    let limiter = limiter("1/s", WaitPolicy::default());
    // Drop a waiting acquire at many points of its wait, at the head of the queue and behind
    // another waiter; after each drop the queue is empty and the bucket holds exactly what
    // refill alone gives.
    for behind in [false, true] {
        for cut_ms in (0..1000).step_by(50) {
            limiter.acquire(CALL).await.unwrap();
            let started = Instant::now();
            let head = behind.then(|| {
                let limiter = limiter.clone();
                tokio::spawn(async move { limiter.acquire(CALL).await })
            });
            tokio::task::yield_now().await;
            let result = tokio::time::timeout(
                Duration::from_millis(cut_ms),
                limiter.acquire_timeout(CALL, None),
            )
            .await;
            assert!(result.is_err(), "cut at {cut_ms} ms should have cancelled");
            let expected_waiters = usize::from(behind);
            assert_eq!(limiter.waiters(), expected_waiters, "cut at {cut_ms} ms");
            if let Some(head) = head {
                head.await.unwrap().unwrap();
                assert_eq!(limiter.waiters(), 0);
            } else {
                let elapsed = Instant::now() - started;
                let available = limiter.snapshot().await.unwrap().windows()[0].tokens;
                assert!(
                    available.is(elapsed.as_millis() as i128, 1000),
                    "cut at {cut_ms} ms: {available:?} after {elapsed:?}"
                );
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
    }
}
