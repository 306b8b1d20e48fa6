//! Fair share through the limiter ([`Limiter::acquire_as`]), on tokio's paused clock: a quiet
//! tenant's call passes behind about one call of a noisy tenant's backlog, not behind all of
//! it, and nothing of the key's capacity is lost.

use std::time::Duration;

use tokio::time::Instant;
use tollgate::store::Share;
use tollgate::{Cost, Limiter, Limits, MemoryStore};

const CALL: Cost = Cost::call(0);

#[tokio::test(start_paused = true)]
async fn a_quiet_tenant_waits_for_one_noisy_call_not_for_the_noisy_backlog() {
    let limiter = Limiter::new(
        "org",
        Limits::parse("10/s burst 1", "").unwrap(),
        MemoryStore::new(),
    )
    .unwrap();
    let start = Instant::now();
    let noisy = Share::new("noisy", 1);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (limiter, noisy) = (limiter.clone(), noisy.clone());
            tokio::spawn(async move {
                limiter.acquire_as(&noisy, CALL).await.unwrap();
                Instant::now() - start
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // At 1 s, ten noisy calls have passed (one every 100 ms after the burst's) and forty wait:
    // four seconds of backlog. The quiet call goes behind the one first in line and the one
    // its tag ties with: it waits 300 ms, not 4 s.
    let arrived = Instant::now();
    limiter
        .acquire_as(&Share::new("quiet", 1), CALL)
        .await
        .unwrap();
    assert_eq!(Instant::now() - arrived, Duration::from_millis(300));
    // The noisy tenant lost one call's time: its last passes when the key's capacity for all
    // 51 calls is used, at 5 s.
    let mut times = Vec::new();
    for task in tasks {
        times.push(task.await.unwrap());
    }
    times.sort();
    assert_eq!(times.last(), Some(&Duration::from_millis(5_000)));
    // Before the quiet call, one every 100 ms from 0; the first after it, at 1.1 s, in its place.
    assert_eq!(times[10], Duration::from_millis(1_000));
    assert_eq!(times[11], Duration::from_millis(1_100));
}

#[tokio::test(start_paused = true)]
async fn without_shares_the_quiet_call_waits_behind_the_whole_backlog() {
    // The same load, with calls made by `acquire`: arrival order, and the quiet call waits for
    // every call ahead of it (the contrast the fair order removes).
    let limiter = Limiter::new(
        "org",
        Limits::parse("10/s burst 1", "").unwrap(),
        MemoryStore::new(),
    )
    .unwrap();
    for _ in 0..50 {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(CALL).await.unwrap() });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let arrived = Instant::now();
    limiter.acquire(CALL).await.unwrap();
    assert_eq!(Instant::now() - arrived, Duration::from_millis(4_000));
}
