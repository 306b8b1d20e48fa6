//! Which clock a memory store reads: the CPU's counter, or tokio's when a test pauses it. The
//! choice is made at the store's first operation.

use std::time::Duration;

use tollgate::{Attempt, Cost, Limiter, Limits, MemoryStore};
use tollgate_testkit::ready;

fn one_per_minute(store: MemoryStore) -> Limiter<MemoryStore> {
    Limiter::new("clock", Limits::parse("1/m", "").unwrap(), store).unwrap()
}

async fn admitted(limiter: &Limiter<MemoryStore>) -> bool {
    matches!(
        limiter.try_acquire(Cost::call(0)).await.unwrap(),
        Attempt::Admitted(_)
    )
}

/// First used on a paused runtime, a store follows tokio's clock: a minute of paused time
/// refills.
#[tokio::test(start_paused = true)]
async fn a_store_made_on_a_paused_runtime_follows_its_clock() {
    let limiter = one_per_minute(MemoryStore::new());
    assert!(admitted(&limiter).await);
    assert!(!admitted(&limiter).await);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(admitted(&limiter).await);
}

/// The usual shape of a test: the limiter is built (its key bound), then the clock is paused,
/// then calls wait. The store chooses its clock at the first call, so the wait is the paused
/// clock's second, not a timeout.
#[tokio::test]
async fn a_limiter_built_before_the_clock_is_paused_follows_it() {
    let limiter = Limiter::builder("paused-later", Limits::parse("1/s", "").unwrap())
        .timeout(Some(Duration::from_secs(30)))
        .build()
        .unwrap();
    tokio::time::pause();
    let _first = limiter.acquire(Cost::call(0)).await.unwrap();
    let start = tokio::time::Instant::now();
    let _second = limiter.acquire(Cost::call(0)).await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited <= Duration::from_millis(1_001),
        "{waited:?}"
    );
}

/// First used outside any runtime, a store reads the CPU's counter from then on: a minute of
/// paused time is no time at all for it (the real time the test takes is far below the
/// minute that would refill it). `on_tokio_clock` follows the paused clock wherever it was
/// made.
#[test]
fn a_store_first_used_elsewhere_reads_the_cpu_unless_told_to_follow_tokio() {
    let fast = one_per_minute(MemoryStore::new());
    let follows = one_per_minute(MemoryStore::on_tokio_clock());
    assert!(ready(admitted(&fast)));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        assert!(admitted(&follows).await);
        assert!(!admitted(&fast).await && !admitted(&follows).await);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!admitted(&fast).await, "the CPU's counter moved a minute");
        assert!(admitted(&follows).await);
    });
}
