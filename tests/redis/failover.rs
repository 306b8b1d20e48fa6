//! What the failover tests share: calls waiting on a key when its server dies, which must all
//! fail closed within the store's timeout, and the key answering again once a replica has
//! taken over.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tollgate::store::redis::RedisStore;
use tollgate::{Cost, Error, Limiter, Permit, Snapshot};

type Waiter = JoinHandle<Result<Permit<RedisStore>, Error>>;

/// `n` calls waiting on `limiter` (without deadlines), once every one of them is in line.
pub async fn waiting(limiter: &Limiter<RedisStore>, n: usize) -> Vec<Waiter> {
    let waiters = (0..n)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire_timeout(Cost::call(0), None).await })
        })
        .collect();
    while limiter.waiters() < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiters
}

/// Asserts that every waiter failed with `Unavailable`, the last within two store timeouts of
/// `killed`; answers how long after it the last one failed.
pub async fn all_fail_closed(waiters: Vec<Waiter>, killed: Instant, timeout: Duration) -> Duration {
    for waiter in waiters {
        let result = waiter.await.unwrap();
        assert!(
            matches!(result, Err(Error::Unavailable { .. })),
            "a waiter got {result:?}"
        );
    }
    let failed_after = killed.elapsed();
    assert!(
        failed_after <= 2 * timeout,
        "the last waiter failed {failed_after:?} after its master died"
    );
    failed_after
}

/// The key's levels once it answers again, asking every 20 ms while the store is unavailable,
/// for up to `within`.
pub async fn answered_again(limiter: &Limiter<RedisStore>, within: Duration) -> Snapshot {
    let start = Instant::now();
    loop {
        match limiter.snapshot().await {
            Ok(snapshot) => break snapshot,
            Err(Error::Unavailable { .. }) if start.elapsed() < within => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("after the failover: {other}"),
        }
    }
}
