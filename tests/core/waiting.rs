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
        // Each is due at a whole millisecond, where tokio's paused timer fires exactly.
        let ideal = Duration::from_millis(200 * (k as u64 + 1));
        assert_eq!(*t, ideal, "call {}", k + 10);
    }
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

/// A token limiter: 600 tokens a minute (10 a second), with one request window out of the way.
fn tokens_limiter() -> Limiter<MemoryStore> {
    Limiter::new(
        "replan",
        Limits::parse("", "600/m").unwrap(),
        MemoryStore::new(),
    )
    .unwrap()
}

/// `n` waiters of `tokens` each, queued in order; answers when each passed, from `start`.
fn waiters(
    limiter: &Limiter<MemoryStore>,
    n: usize,
    tokens: u64,
    start: Instant,
) -> Vec<tokio::task::JoinHandle<Duration>> {
    (0..n)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                limiter
                    .acquire_timeout(Cost::new(0, tokens), None)
                    .await
                    .unwrap();
                start.elapsed()
            })
        })
        .collect()
}

async fn passed(waiters: Vec<tokio::task::JoinHandle<Duration>>) -> Vec<Duration> {
    let mut times = Vec::new();
    for waiter in waiters {
        times.push(waiter.await.unwrap());
    }
    times
}

/// Ten calls of 60 drain the window; five waiters of 50 queue behind (their turns are 5 s
/// apart on the empty window's schedule). The ten settle at 10 each at 1 s, giving back 500:
/// every waiter passes then, not at its old due time.
#[tokio::test(start_paused = true)]
async fn a_refund_plans_the_line_again_and_every_waiter_that_can_pay_passes_at_once() {
    let limiter = tokens_limiter();
    let start = Instant::now();
    let mut permits = Vec::new();
    for _ in 0..10 {
        permits.push(limiter.acquire(Cost::new(0, 60)).await.unwrap());
    }
    let line = waiters(&limiter, 5, 50, start);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for permit in permits {
        permit.settle(10).await.unwrap();
    }
    assert_eq!(passed(line).await, vec![Duration::from_secs(1); 5]);
    // 500 given back and 10 refilled, 250 taken.
    let left = limiter.snapshot().await.unwrap().tokens().unwrap();
    assert!(left.is(260, 1), "{left}");
}

/// The same, with the key paused for 2 s by a 429 right after the drain: the refunds at 1 s
/// come during the pause, and every waiter passes the moment it lifts.
#[tokio::test(start_paused = true)]
async fn after_a_pause_the_line_passes_as_soon_as_the_windows_can_pay() {
    let limiter = tokens_limiter();
    let start = Instant::now();
    let mut permits = Vec::new();
    for _ in 0..10 {
        permits.push(limiter.acquire(Cost::new(0, 60)).await.unwrap());
    }
    let line = waiters(&limiter, 5, 50, start);
    tokio::task::yield_now().await;
    limiter.penalize(Duration::from_secs(2)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for permit in permits {
        permit.settle(10).await.unwrap();
    }
    assert_eq!(passed(line).await, vec![Duration::from_secs(2); 5]);
}

/// Half the calls settle below their estimate and half above: 5 × 50 come back and 5 × 30 are
/// charged, 100 tokens net at 1 s. Two waiters of 50 pass then; the third at 1 s plus the
/// refill of its 50 (5 s), the fourth 5 s later, and the fifth 5 s after that: each the moment
/// its tokens exist.
#[tokio::test(start_paused = true)]
async fn mixed_settlements_let_each_waiter_pass_when_its_tokens_exist() {
    let limiter = tokens_limiter();
    let start = Instant::now();
    let mut permits = Vec::new();
    for _ in 0..10 {
        permits.push(limiter.acquire(Cost::new(0, 60)).await.unwrap());
    }
    let line = waiters(&limiter, 5, 50, start);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (i, permit) in permits.into_iter().enumerate() {
        permit
            .settle(if i % 2 == 0 { 10 } else { 90 })
            .await
            .unwrap();
    }
    // At 1 s: 10 refilled + 250 back − 150 charged = 110: two pass (100), 10 left; the third
    // needs 40 more (4 s), the fourth 50 more after it (5 s), the fifth 5 s after that.
    let secs = Duration::from_secs;
    assert_eq!(
        passed(line).await,
        vec![secs(1), secs(1), secs(5), secs(10), secs(15)]
    );
}
