//! Which clock a memory store reads: the CPU's counter, or tokio's when a test pauses it.

use std::time::Duration;

use tollgate::{Attempt, Cost, Limiter, Limits, MemoryStore};

fn one_per_minute(store: MemoryStore) -> Limiter<MemoryStore> {
    Limiter::new("clock", Limits::parse("1/m", "").unwrap(), store).unwrap()
}

async fn admitted(limiter: &Limiter<MemoryStore>) -> bool {
    matches!(
        limiter.try_acquire(Cost::call(0)).await.unwrap(),
        Attempt::Admitted(_)
    )
}

/// Made on a paused runtime, a store follows tokio's clock: a minute of paused time refills.
#[tokio::test(start_paused = true)]
async fn a_store_made_on_a_paused_runtime_follows_its_clock() {
    let limiter = one_per_minute(MemoryStore::new());
    assert!(admitted(&limiter).await);
    assert!(!admitted(&limiter).await);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(admitted(&limiter).await);
}

/// Made outside any runtime, a store reads the CPU's counter: a minute of paused time is no
/// time at all (the real time the test takes is far below the minute that would refill it).
/// `on_tokio_clock` follows the paused clock wherever it was made.
#[test]
fn a_store_made_elsewhere_reads_the_cpu_unless_told_to_follow_tokio() {
    let fast = one_per_minute(MemoryStore::new());
    let follows = one_per_minute(MemoryStore::on_tokio_clock());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        assert!(admitted(&fast).await && admitted(&follows).await);
        assert!(!admitted(&fast).await && !admitted(&follows).await);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!admitted(&fast).await, "the CPU's counter moved a minute");
        assert!(admitted(&follows).await);
    });
}
