//! A dropped wait consumes nothing, on Redis too: thousands of acquires cut at random points
//! (before their ticket, while they sleep, while a question is on the wire), and the server's
//! windows end up charged for exactly the permits that were granted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tollgate::store::redis::RedisStore;
use tollgate::{Cost, Limiter, Limits};
use tollgate_testkit::redis::RedisServer;

/// The window that counts: a day's refill is one token, so over the test it refills far less
/// than one and its whole tokens say exactly what was taken.
const LEDGER_BURST: u64 = 500_000;

#[test]
fn thousands_of_cut_acquires_consume_only_what_their_permits_were_granted() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        // Requests pace the calls (so they queue, hold tickets and get cut while waiting);
        // tokens keep the ledger.
        let limits = Limits::parse("200/s burst 5", &format!("1/d burst {LEDGER_BURST}")).unwrap();
        let limiter = Limiter::new("cut", limits, store).unwrap();
        let granted = Arc::new(AtomicU64::new(0));
        let permits = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicU64::new(0));
        let mut rng = StdRng::seed_from_u64(20261201);
        let calls: Vec<_> = (0..4_000)
            .map(|n| {
                let start = Duration::from_micros(rng.random_range(0..2_000_000));
                let limit = Duration::from_micros(rng.random_range(0..4_000));
                let tokens = rng.random_range(1..=100);
                let (limiter, granted, permits, cut) = (
                    limiter.clone(),
                    granted.clone(),
                    permits.clone(),
                    cut.clone(),
                );
                tokio::spawn(async move {
                    tokio::time::sleep(start).await;
                    let cost = Cost::new(1, tokens);
                    // Half are dropped from outside at a random point, half give up at their
                    // own deadline.
                    let result = if n % 2 == 0 {
                        tokio::time::timeout(limit, limiter.acquire_timeout(cost, None))
                            .await
                            .ok()
                    } else {
                        Some(limiter.acquire_timeout(cost, Some(limit)).await)
                    };
                    match result {
                        Some(Ok(permit)) => {
                            granted.fetch_add(tokens, Ordering::Relaxed);
                            permits.fetch_add(1, Ordering::Relaxed);
                            permit.settle(tokens).await.unwrap();
                        }
                        Some(Err(tollgate::Error::Timeout { .. })) | None => {
                            cut.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(Err(other)) => panic!("call {n}: {other}"),
                    }
                })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        let (granted, permits, cut) = (
            granted.load(Ordering::Relaxed),
            permits.load(Ordering::Relaxed),
            cut.load(Ordering::Relaxed),
        );
        assert!(permits >= 100 && cut >= 1_000, "{permits} permits, {cut} cut: the test did not test");
        // What a cut call took is given back in a task of its own: wait (at most 5 s) until the
        // server's ledger stops moving.
        let consumed = || async {
            let snapshot = limiter.snapshot().await.unwrap();
            let ledger = snapshot
                .windows()
                .iter()
                .find(|a| a.currency == tollgate::Currency::Tokens)
                .unwrap();
            LEDGER_BURST as i128 - ledger.tokens.whole()
        };
        let mut seen = consumed().await;
        for _ in 0..50 {
            if seen == i128::from(granted) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            seen = consumed().await;
        }
        assert_eq!(
            seen,
            i128::from(granted),
            "{permits} permits were granted {granted} tokens; the server consumed {seen} ({cut} calls cut)"
        );
    });
}
