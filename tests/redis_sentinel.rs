//! The Redis store through Redis Sentinel, against real servers on loopback: a master, its
//! replica and a sentinel watching them (`redis-server --sentinel`). The store asks the
//! sentinel for the master, stays exact, fails waiting calls closed when the master dies, and
//! follows the sentinel to the promoted replica; a master demoted by a failover it survives is
//! left for the new one.

#![cfg(feature = "redis")]

#[path = "support/failover.rs"]
mod failover;
#[path = "support/redis_cluster.rs"]
mod redis_cluster;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis_server::{RedisServer, free_port, resp};
use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::{Attempt, Cost, Currency, Error, Limiter, Limits};

const MASTER: &str = "tollgate-test";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A master, one replica that has caught up with it, and one sentinel watching them with a
/// quorum of one, which calls the master down after 300 ms without an answer.
struct Watched {
    master: RedisServer,
    replica: RedisServer,
    sentinel: Child,
    sentinel_port: u16,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Watched {
    fn start() -> Option<Watched> {
        if redis_server::single_server_only("Sentinel watches single servers") {
            return None;
        }
        // Each server writes what replication moves (the replica saves the snapshot it is
        // sent) and the sentinel its config into a folder of the test's own.
        let dir = std::env::temp_dir().join(format!("tollgate-sentinel-{}", free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let folder = dir.to_str().unwrap();
        let master = RedisServer::start_with(&["--dir", folder, "--dbfilename", "master.rdb"])?;
        let port = master.port.to_string();
        let replica = RedisServer::start_with(&[
            "--replicaof",
            "127.0.0.1",
            &port,
            "--dir",
            folder,
            "--dbfilename",
            "replica.rdb",
        ])?;
        wait_for("the replica to sync", || {
            resp(replica.port, &["INFO", "replication"]).contains("master_link_status:up")
        });
        let sentinel_port = free_port();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {port} 1\n\
                 sentinel down-after-milliseconds {MASTER} 300\n\
                 sentinel failover-timeout {MASTER} 2000\n",
                dir.display()
            ),
        )
        .unwrap();
        let sentinel = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel starts");
        let watched = Watched {
            master,
            replica,
            sentinel,
            sentinel_port,
            _dir: TempDir(dir),
        };
        // A failover needs the sentinel to know the replica, which it learns from the master.
        wait_for("the sentinel to see the replica", || {
            if std::net::TcpStream::connect(("127.0.0.1", sentinel_port)).is_err() {
                return false;
            }
            let replicas = resp(sentinel_port, &["SENTINEL", "REPLICAS", MASTER]);
            replicas.contains(&watched.replica.port.to_string())
        });
        Some(watched)
    }

    fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/{MASTER}", self.sentinel_port)
    }

    /// The port the sentinel names as the master's.
    fn master_port(&self) -> Option<u16> {
        let reply = resp(
            self.sentinel_port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER],
        );
        reply
            .lines()
            .nth(4)
            .and_then(|port| port.trim().parse().ok())
    }

    /// Waits until the replica holds every write its master acknowledged.
    fn replica_caught_up(&self) {
        let offset = |port: u16, field: &str| {
            resp(port, &["INFO", "replication"])
                .lines()
                .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_owned()))
        };
        wait_for("the replica to catch up", || {
            let master = offset(self.master.port, "master_repl_offset:");
            master.is_some() && master == offset(self.replica.port, "slave_repl_offset:")
        });
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.sentinel.kill();
        let _ = self.sentinel.wait();
    }
}

/// Polls `done` every 20 ms for up to 30 s: waiting for servers to reach a state, not timing
/// anything under test.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Watched {
    /// A limiter on `key` through the sentinel, with the store's `timeout`.
    async fn limiter(&self, key: &str, limits: &str, timeout: Duration) -> Limiter<RedisStore> {
        let config = RedisConfig::default().with_timeout(timeout);
        let store = RedisStore::connect_with(&self.url(), config).await.unwrap();
        Limiter::new(key, Limits::parse(limits, "").unwrap(), store).unwrap()
    }
}

/// One request, without waiting.
async fn call(limiter: &Limiter<RedisStore>) -> Result<Attempt<RedisStore>, Error> {
    limiter.try_acquire(Cost::call(0)).await
}

fn requests_left(snapshot: &[tollgate::Available]) -> i128 {
    snapshot
        .iter()
        .find(|a| a.currency == Currency::Requests)
        .unwrap()
        .tokens
        .whole()
}

#[test]
fn through_sentinel_the_store_is_exact_and_follows_a_failover() {
    let Some(mut watched) = Watched::start() else {
        return;
    };
    let timeout = Duration::from_millis(500);
    runtime().block_on(async {
        // A window that barely refills during the test, so that what a failover loses shows.
        let limiter = watched.limiter("sentinel", "1/m burst 10", timeout).await;
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

        let waiters = failover::waiting(&limiter, 5).await;
        let old = watched.master.port;
        watched.master.kill();
        let killed = Instant::now();
        let failed_after = failover::all_fail_closed(waiters, killed, timeout).await;

        // The sentinel promotes the replica; the store asks it again and goes on there.
        let snapshot = failover::answered_again(&limiter, Duration::from_secs(30)).await;
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
        let limiter = watched
            .limiter("demoted", "1/m burst 4", default_timeout)
            .await;
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
        let limiter = watched.limiter("stopped", "100/m", timeout).await;
        assert!(call(&limiter).await.unwrap().is_admitted());
        // The master dies and the sentinel stops answering (SIGSTOP): asking it again hangs,
        // and each call must still end within its timeout, closed.
        watched.master.kill();
        let sentinel = watched.sentinel.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-STOP", &sentinel])
                .status()
                .unwrap()
                .success()
        );
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
        assert!(
            Command::new("kill")
                .args(["-CONT", &sentinel])
                .status()
                .unwrap()
                .success()
        );
    });
}
