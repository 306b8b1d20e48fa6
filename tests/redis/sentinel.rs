//! The Redis store through Redis Sentinel, against real servers on loopback: a master, its
//! replica and a sentinel watching them (`redis-server --sentinel`). The store asks the
//! sentinel for the master, stays exact, fails waiting calls closed when the master dies, and
//! follows the sentinel to the promoted replica; a master demoted by a failover it survives is
//! left for the new one.

use std::time::{Duration, Instant};

use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::{Attempt, Cost, Error, Limiter, Limits};
use tollgate_testkit::redis::{MASTER, Watched, resp, wait_for};
use tollgate_testkit::runtime;

/// A limiter on `key` through `watched`'s sentinel, with the store's `timeout`.
async fn limiter(
    watched: &Watched,
    key: &str,
    limits: &str,
    timeout: Duration,
) -> Limiter<RedisStore> {
    let config = RedisConfig::default()
        .with_timeout(timeout)
        // Waiters learn of a failure within their timeouts: asked after half of one.
        .with_liveness(timeout / 2);
    let store = RedisStore::connect_with(&watched.url(), config)
        .await
        .unwrap();
    Limiter::new(key, Limits::parse(limits, "").unwrap(), store).unwrap()
}

/// One request, without waiting.
async fn call(limiter: &Limiter<RedisStore>) -> Result<Attempt<RedisStore>, Error> {
    limiter.try_acquire(Cost::call(0)).await
}

fn requests_left(snapshot: &tollgate::Snapshot) -> i128 {
    snapshot.requests().unwrap().whole()
}

#[test]
fn through_sentinel_the_store_is_exact_and_follows_a_failover() {
    let Some(mut watched) = Watched::start() else {
        return;
    };
    let timeout = Duration::from_millis(500);
    runtime().block_on(async {
        // A window that barely refills during the test, so that what a failover loses shows.
        let limiter = limiter(&watched, "sentinel", "1/m burst 10", timeout).await;
        assert!(format!("{:?}", limiter.store()).contains(&format!(
            "redis+sentinel://127.0.0.1:{}",
            watched.sentinel_port
        )));
        for _ in 0..10 {
            assert!(call(&limiter).await.unwrap().is_admitted());
        }
        assert!(matches!(call(&limiter).await.unwrap(), Attempt::NotYet(_)));
        // The charges reached the master, not some other server.
        assert!(!resp(watched.master.port, &["DBSIZE"]).starts_with(":0"));
        watched.replica_caught_up();

        let waiters = crate::failover::waiting(&limiter, 5).await;
        let old = watched.master.port;
        watched.master.kill();
        let killed = Instant::now();
        let failed_after = crate::failover::all_fail_closed(waiters, killed, timeout).await;

        // The sentinel promotes the replica; the store asks it again and goes on there.
        let snapshot = crate::failover::answered_again(&limiter, Duration::from_secs(30)).await;
        let answered = killed.elapsed();
        assert_eq!(watched.master_port(), Some(watched.replica.port));
        assert_ne!(watched.replica.port, old);
        // The replica had caught up: the spent burst stays spent, exactly.
        assert_eq!(requests_left(&snapshot), 0);
        assert!(matches!(
            call(&limiter).await.unwrap(),
            Attempt::NotYet(_)
        ));
        eprintln!(
            "sentinel failover: waiters failed {failed_after:?} after the kill; the key answered on the promoted replica {answered:?} after it (down-after 300 ms)"
        );
    });
}

#[test]
fn a_master_demoted_by_a_failover_is_left_for_the_new_one() {
    let Some(watched) = Watched::start() else {
        return;
    };
    runtime().block_on(async {
        let default_timeout = RedisConfig::default().timeout();
        let limiter = limiter(&watched, "demoted", "1/m burst 4", default_timeout).await;
        for _ in 0..2 {
            assert!(call(&limiter).await.unwrap().is_admitted());
        }
        watched.replica_caught_up();
        // Both servers stay up: the old master becomes a replica, and answers writes with
        // READONLY once it does.
        // The sentinel refuses (NOGOODSLAVE) until it has heard from the replica itself.
        wait_for("the sentinel to start a failover", || {
            resp(watched.sentinel_port, &["SENTINEL", "FAILOVER", MASTER]).contains("OK")
        });
        wait_for("the sentinel to name the replica", || {
            watched.master_port() == Some(watched.replica.port)
        });
        wait_for("the old master to become a replica", || {
            resp(watched.master.port, &["ROLE"]).contains("slave")
        });
        // At most one call hears READONLY (or a dropped connection) from the old master; the
        // next goes to the new one, where the two spent requests are still spent.
        let mut admitted = 0;
        let mut refused = 0;
        for _ in 0..4 {
            match call(&limiter).await {
                Ok(attempt) if attempt.is_admitted() => admitted += 1,
                Ok(_) => panic!("the key had two requests left"),
                Err(Error::Unavailable { .. }) => refused += 1,
                Err(other) => panic!("unexpected: {other}"),
            }
            if admitted == 2 {
                break;
            }
        }
        eprintln!("sentinel demotion: {refused} call(s) failed before the store followed");
        assert_eq!(admitted, 2);
        assert!(refused <= 1, "{refused} calls failed after the failover");
        assert!(matches!(call(&limiter).await.unwrap(), Attempt::NotYet(_)));
        // And the writes landed on the new master.
        assert!(resp(watched.replica.port, &["ROLE"]).contains("master"));
    });
}

#[test]
fn a_sentinel_address_that_does_not_read_shows_no_password() {
    let rt = runtime();
    let _entered = rt.enter();
    for url in [
        "redis+sentinel://:s3cretpw@127.0.0.1:1",
        "redis+sentinel://:s3cretpw@127.0.0.1:1/m/notadb",
        "redis+sentinel://u:s3cretpw@/m",
    ] {
        let err = RedisStore::lazy(url, RedisConfig::default()).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cretpw"), "{url}: {shown}");
        assert!(shown.contains("Sentinel"), "{url}: {shown}");
    }
    let store = RedisStore::lazy(
        "redis+sentinel://user:s3cretpw@127.0.0.1:1,127.0.0.1:2/m/3",
        RedisConfig::default(),
    )
    .unwrap();
    assert_eq!(
        format!("{store:?}").split('"').nth(1).unwrap_or_default(),
        "redis+sentinel://user:***@127.0.0.1:1,127.0.0.1:2/m/3"
    );
    assert!(RedisStore::lazy("rediss+sentinel://h:1/m", RedisConfig::default()).is_err());
}

#[test]
fn with_the_master_dead_and_the_sentinel_stopped_calls_fail_within_the_timeout() {
    let Some(mut watched) = Watched::start() else {
        return;
    };
    let timeout = Duration::from_millis(300);
    runtime().block_on(async {
        let limiter = limiter(&watched, "stopped", "100/m", timeout).await;
        assert!(call(&limiter).await.unwrap().is_admitted());
        // The master dies and the sentinel stops answering (SIGSTOP): asking it again hangs,
        // and each call must still end within its timeout, closed.
        watched.master.kill();
        watched.pause_sentinel();
        for _ in 0..3 {
            let started = Instant::now();
            let result = call(&limiter).await;
            let took = started.elapsed();
            assert!(
                matches!(result, Err(Error::Unavailable { .. })),
                "got {result:?}"
            );
            assert!(
                took <= timeout + Duration::from_millis(100),
                "took {took:?}"
            );
        }
        watched.resume_sentinel();
    });
}
