//! When the Redis server dies or stops, every call waiting on a key learns it within about one
//! store timeout, together, rather than one after another at its own turn; and no call returns
//! later than its deadline, even when its store call hangs.

use std::time::{Duration, Instant};

use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::{Cost, Error, Limiter, Limits};
use tollgate_testkit::redis::RedisServer;

const STORE_TIMEOUT: Duration = Duration::from_millis(500);

use tollgate_testkit::local_runtime as runtime;

/// 50 calls waiting on a key (one a second), none with a deadline; then `fault` is done to
/// the server. Answers how long after the fault the last waiter failed.
fn fifty_waiters_then(server: &mut RedisServer, fault: impl FnOnce(&mut RedisServer)) -> Duration {
    runtime().block_on(async {
        let config = RedisConfig::default()
            .with_timeout(STORE_TIMEOUT)
            // Waiters learn of a failure within their timeouts: asked after half of one.
            .with_liveness(STORE_TIMEOUT / 2);
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        let limiter = Limiter::new("waited", Limits::parse("1/s", "").unwrap(), store).unwrap();
        limiter.acquire(Cost::call(0)).await.unwrap();
        let waiters: Vec<_> = (0..50)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move { limiter.acquire_timeout(Cost::call(0), None).await })
            })
            .collect();
        while limiter.waiters() < 50 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        fault(server);
        let faulted = Instant::now();
        let mut last = Duration::ZERO;
        for waiter in waiters {
            let result = waiter.await.unwrap();
            assert!(
                matches!(result, Err(Error::Unavailable { .. })),
                "a waiter got {result:?}"
            );
            last = last.max(faulted.elapsed());
        }
        last
    })
}

#[test]
fn every_waiter_fails_together_when_the_server_dies() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let last = fifty_waiters_then(&mut server, RedisServer::kill);
    println!("50 waiters, server killed: the last failed after {last:?}");
    assert!(
        last <= 2 * STORE_TIMEOUT,
        "the last waiter failed after {last:?}"
    );
}

#[test]
fn every_waiter_fails_together_when_the_server_stops() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let last = fifty_waiters_then(&mut server, |s| s.pause());
    println!("50 waiters, server stopped: the last failed after {last:?}");
    assert!(
        last <= 2 * STORE_TIMEOUT,
        "the last waiter failed after {last:?}"
    );
    server.resume();
}

#[test]
fn no_call_outlives_its_deadline_when_the_server_stops() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    tollgate_testkit::local_runtime().block_on(async {
        let config = RedisConfig::default().with_timeout(Duration::from_secs(5));
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        // A window that refills one token in six minutes, so that a call that took one shows.
        let limiter = Limiter::new("deadline", Limits::parse("10/h", "").unwrap(), store).unwrap();
        limiter.acquire(Cost::call(0)).await.unwrap();
        server.pause();
        // With the server stopped nothing can answer: tokio's clock is paused from here, and
        // what passes on it is the waits of the call alone (the store's 5 s timeout, and the
        // call's deadline and its grace).
        tokio::time::pause();
        let deadline = Duration::from_millis(100);
        let start = tokio::time::Instant::now();
        let result = limiter.acquire_timeout(Cost::call(0), Some(deadline)).await;
        let took = start.elapsed();
        println!("acquire with a 100 ms deadline, server stopped: returned after {took:?}");
        assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
        // The store's own timeout is 5 s; the call's deadline cuts it, 2 ms after it at most
        // (the grace an answer on its way is given), as tokio's timers count: to their next
        // millisecond tick.
        assert!(
            took >= deadline && took <= deadline + Duration::from_millis(3),
            "took {took:?}"
        );
        tokio::time::resume();
        server.resume();
        // And nothing was taken by the call that was cut: the server, back, still has 9.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let left = limiter.snapshot().await.unwrap().windows()[0]
            .tokens
            .whole();
        assert_eq!(left, 9, "the call that was cut took something");
    });
}

/// A limiter whose watchdog was sleeping when its runtime shut down (a `block_on` per request,
/// a runtime per test) still gets one on the next runtime: a waiter due in 10 s learns that
/// the server stopped within its timeouts, not at its turn.
#[test]
fn a_watchdog_dropped_with_its_runtime_is_replaced_on_the_next() {
    // It pauses its one server; a cluster store on a new runtime is
    // cluster::a_cluster_store_outlives_the_runtime_that_connected_it.
    if tollgate_testkit::redis::single_server_only("pauses a single server") {
        return;
    }
    let Some(server) = RedisServer::start() else {
        return;
    };
    let config = RedisConfig::default()
        .with_timeout(STORE_TIMEOUT)
        .with_liveness(STORE_TIMEOUT / 2);
    let limiter = runtime().block_on(async {
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        Limiter::new("rearmed", Limits::parse("1/10s", "").unwrap(), store).unwrap()
    });
    // A waiter on a first runtime, which is dropped while it (and the watchdog) sleep.
    let first = runtime();
    first.block_on(async {
        limiter.acquire(Cost::call(0)).await.unwrap();
        let waiting = limiter.clone();
        tokio::spawn(async move { waiting.acquire_timeout(Cost::call(0), None).await });
        while limiter.waiters() < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    drop(first);
    let last = runtime().block_on(async {
        let waiting = limiter.clone();
        let waiter =
            tokio::spawn(async move { waiting.acquire_timeout(Cost::call(0), None).await });
        while limiter.waiters() < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.pause();
        let stopped = Instant::now();
        let result = waiter.await.unwrap();
        assert!(
            matches!(result, Err(Error::Unavailable { .. })),
            "the waiter got {result:?}"
        );
        stopped.elapsed()
    });
    assert!(
        last <= 2 * STORE_TIMEOUT,
        "the waiter failed after {last:?}"
    );
}
