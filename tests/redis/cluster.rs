//! The Redis store on a real Redis Cluster (3 masters, 3 replicas on loopback): keys spread
//! over the masters and each stays exact, waiters keep their order, and a failover fails the
//! waiting calls closed, then serves again once the replica is promoted.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::{Attempt, Cost, Currency, Error, Limiter, Limits, testing};
use tollgate_testkit::redis::RedisCluster;

use tollgate_testkit::runtime;

#[test]
fn keys_spread_over_the_masters_and_each_stays_exact() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    runtime().block_on(async {
        let store = RedisStore::connect(&cluster.url()).await.unwrap();
        let limits = Limits::parse("5/s burst 2", "").unwrap();
        let mut masters = BTreeSet::new();
        for k in 0..24 {
            let key = format!("spread-{k}");
            let limiter = Limiter::new(key.as_str(), limits.clone(), store.clone()).unwrap();
            for _ in 0..2 {
                assert!(matches!(
                    limiter.try_acquire(Cost::call(0)).await.unwrap(),
                    Attempt::Admitted(_)
                ));
            }
            // The third waits for one refill (200 ms), less the few ms since the second.
            match limiter.try_acquire(Cost::call(0)).await.unwrap() {
                Attempt::NotYet(hint) => assert!(
                    hint <= Duration::from_millis(200) && hint > Duration::from_millis(100),
                    "key {key}: hint {hint:?}"
                ),
                Attempt::Admitted(_) => panic!("key {key}: a third call passed a burst of 2"),
            }
            let (hash, queue) = testing::redis_names(&store, &key);
            let master = cluster.master_of(&hash);
            assert_eq!(
                master,
                cluster.master_of(&queue),
                "a key's names share a slot"
            );
            masters.insert(master);
        }
        assert_eq!(masters.len(), 3, "24 keys landed on {masters:?}");
    });
}

#[test]
fn waiters_on_a_cluster_key_pass_in_the_order_they_arrived() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    runtime().block_on(async {
        let store = RedisStore::connect(&cluster.url()).await.unwrap();
        let limiter =
            Limiter::new("ordered", Limits::parse("50/s burst 1", "").unwrap(), store).unwrap();
        limiter.acquire(Cost::call(0)).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for n in 0..10 {
            let (waiter, tx) = (limiter.clone(), tx.clone());
            waiters.push(tokio::spawn(async move {
                waiter.acquire_timeout(Cost::call(0), None).await.unwrap();
                tx.send(n).unwrap();
            }));
            // Each takes its ticket before the next arrives (a slow machine may admit one
            // before it ever waits: then it is simply first).
            let queued = Instant::now();
            while limiter.waiters() < n + 1 && queued.elapsed() < Duration::from_secs(1) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        for waiter in waiters {
            waiter.await.unwrap();
        }
        drop(tx);
        let mut order = Vec::new();
        while let Some(n) = rx.recv().await {
            order.push(n);
        }
        assert_eq!(order, (0..10).collect::<Vec<_>>());
    });
}

#[test]
fn a_failover_fails_waiting_calls_closed_then_serves_again() {
    let Some(mut cluster) = RedisCluster::start() else {
        return;
    };
    let timeout = Duration::from_millis(500);
    runtime().block_on(async {
        let config = RedisConfig::default().with_timeout(timeout)
            // Waiters learn of a failure within their timeouts: asked after half of one.
            .with_liveness(timeout / 2);
        let store = RedisStore::connect_with(&cluster.url(), config).await.unwrap();
        // A window that barely refills during the test, so that what a failover loses shows.
        let limiter = Limiter::new(
            "failover",
            Limits::parse("1/m burst 10", "").unwrap(),
            store.clone(),
        )
        .unwrap();
        for _ in 0..10 {
            limiter.acquire(Cost::call(0)).await.unwrap();
        }
        let waiters = crate::failover::waiting(&limiter, 5).await;
        let (hash, _) = testing::redis_names(&store, "failover");
        let master = cluster.master_of(&hash);
        // Every charge and ticket has reached the replica before the kill (WAIT answers how
        // many replicas acknowledged), so the failover has nothing to forget.
        let acknowledged = cluster.node_cli(master, &["WAIT", "1", "5000"]);
        assert_eq!(acknowledged.trim(), "1", "the replica did not acknowledge");
        cluster.kill(master);
        let killed = Instant::now();
        let failed_after = crate::failover::all_fail_closed(waiters, killed, timeout).await;

        // The replica takes over (the node timeout is 1 s); then the key answers again.
        let deadline = Instant::now() + Duration::from_secs(30);
        while cluster.live_master_of(&hash).is_none_or(|m| m == master) {
            assert!(
                Instant::now() < deadline,
                "no replica took over within 30 s: {}",
                cluster.on_masters(&["CLUSTER", "NODES"])
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cluster.wait_until_ok();
        let promoted = Instant::now();
        let answer = crate::failover::answered_again(&limiter, Duration::from_secs(10)).await;
        let level = answer
            .windows()
            .iter()
            .find(|a| a.currency == Currency::Requests)
            .unwrap()
            .tokens;
        // The burst was spent before the kill, and less than one token refilled since: a
        // replica that had seen every charge holds none of them again.
        assert_eq!(
            level.whole(),
            0,
            "the promoted replica gave back spent tokens ({failed_after:?} after the kill, {:?} after the promotion)",
            promoted.elapsed()
        );
        assert!(matches!(
            limiter.try_acquire(Cost::call(0)).await,
            Ok(Attempt::Admitted(_) | Attempt::NotYet(_))
        ));
    });
}

/// What a failover can lose, measured at its worst: the replica's link is cut while the burst
/// is spent on its master, the master dies, and the replica takes over without ever having
/// seen those charges. Replication is asynchronous, so the key goes back to the state
/// the replica last had: here the whole burst comes back, and can pass a second time.
#[test]
fn a_failover_gives_back_what_the_replica_had_not_seen() {
    let Some(mut cluster) = RedisCluster::start() else {
        return;
    };
    runtime().block_on(async {
        let store = RedisStore::connect(&cluster.url()).await.unwrap();
        let limiter =
            Limiter::new("lagging", Limits::parse("1/m burst 10", "").unwrap(), store.clone())
                .unwrap();
        // The key exists on both before the replica stops.
        limiter.snapshot().await.unwrap();
        let (hash, _) = testing::redis_names(&store, "lagging");
        let master = cluster.master_of(&hash);
        let replica = cluster.replica_of(master);
        // Let the first write reach the replica, then cut its link: it reconnects within about
        // a second, and the master dies before that.
        tokio::time::sleep(Duration::from_millis(100)).await;
        // (A new password on the master keeps the replica from coming back; connections
        // already open stay signed in.)
        tollgate_testkit::redis::cli_batch(
            master,
            "CONFIG SET requirepass not-for-the-replica\nCLIENT KILL TYPE replica\n",
        );
        for _ in 0..10 {
            limiter.acquire(Cost::call(0)).await.unwrap();
        }
        cluster.kill(master);
        let deadline = Instant::now() + Duration::from_secs(30);
        while cluster.live_master_of(&hash) != Some(replica) {
            assert!(Instant::now() < deadline, "the replica did not take over within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut passed_again = 0;
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            match limiter.try_acquire(Cost::call(0)).await {
                Ok(Attempt::Admitted(_)) => passed_again += 1,
                Ok(Attempt::NotYet(_)) => break,
                Err(Error::Unavailable { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(other) => panic!("after the failover: {other}"),
            }
        }
        eprintln!("failover with a lagging replica: {passed_again} calls passed again after spending the burst of 10");
        assert_eq!(passed_again, 10, "the replica never saw the 10 charges");
    });
}

/// A cluster store made on one runtime serves on the next, after the first shut down (a
/// `block_on` per request, a runtime per test): its first call there finds the old
/// connection's tasks gone and is answered by a new connection, and the key's count carries
/// on from the server, exact.
#[test]
fn a_cluster_store_outlives_the_runtime_that_connected_it() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let first = runtime();
    let (store, limiter) = first.block_on(async {
        let store = RedisStore::connect(&cluster.url()).await.unwrap();
        let limiter = Limiter::new(
            "outlives",
            Limits::parse("10/h", "").unwrap(),
            store.clone(),
        )
        .unwrap();
        for _ in 0..3 {
            limiter.acquire(Cost::call(0)).await.unwrap();
        }
        (store, limiter)
    });
    drop(first);
    runtime().block_on(async {
        let mut errors = 0;
        let mut admitted = 0;
        loop {
            match limiter.try_acquire(Cost::call(0)).await {
                Ok(Attempt::Admitted(_)) => admitted += 1,
                Ok(Attempt::NotYet(_)) => break,
                Err(error) => {
                    errors += 1;
                    assert!(errors <= 1, "after the first runtime: {error}");
                }
            }
        }
        assert_eq!(errors, 0, "the first call on the new runtime failed");
        assert_eq!(admitted, 7, "10 an hour, 3 taken on the first runtime");
        let other =
            Limiter::new("outlives-other", Limits::parse("2/h", "").unwrap(), store).unwrap();
        assert!(matches!(
            other.try_acquire(Cost::call(0)).await.unwrap(),
            Attempt::Admitted(_)
        ));
    });
}
