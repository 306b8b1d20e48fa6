//! A master, one replica that has caught up with it, and one sentinel watching them with a
//! quorum of one (`redis-server --sentinel`), which calls the master down after 300 ms without
//! an answer.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::port::free_port;
use super::server::{RedisServer, resp, single_server_only};

/// The name the sentinel watches the master under.
pub const MASTER: &str = "tollgate-test";

/// The watched pair and its sentinel.
pub struct Watched {
    pub master: RedisServer,
    pub replica: RedisServer,
    sentinel: Child,
    pub sentinel_port: u16,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Watched {
    /// Starts the three servers and waits until the sentinel knows the replica (`None` when
    /// there is no redis-server, or in cluster mode, where Sentinel has no place).
    pub fn start() -> Option<Watched> {
        if single_server_only("Sentinel watches single servers") {
            return None;
        }
        // Each server writes what replication moves (the replica saves the snapshot it is
        // sent) and the sentinel its config into a folder of the test's own.
        let dir = std::env::temp_dir().join(format!("tollgate-sentinel-{}", free_port()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let folder = dir.to_str().expect("a UTF-8 temporary folder");
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
        .expect("the sentinel's config is written");
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

    /// The store's address: `redis+sentinel://127.0.0.1:<port>/<MASTER>`.
    pub fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/{MASTER}", self.sentinel_port)
    }

    /// The port the sentinel names as the master's.
    pub fn master_port(&self) -> Option<u16> {
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
    pub fn replica_caught_up(&self) {
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

    /// Stops the sentinel (SIGSTOP): asking it anything hangs until [`resume_sentinel`].
    ///
    /// [`resume_sentinel`]: Watched::resume_sentinel
    pub fn pause_sentinel(&self) {
        signal(self.sentinel.id(), "-STOP");
    }

    /// Lets a stopped sentinel run again.
    pub fn resume_sentinel(&self) {
        signal(self.sentinel.id(), "-CONT");
    }
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
}

impl Drop for Watched {
    fn drop(&mut self) {
        signal(self.sentinel.id(), "-CONT");
        let _ = self.sentinel.kill();
        let _ = self.sentinel.wait();
    }
}

/// Polls `done` every 20 ms for up to 30 s: waiting for servers to reach a state, not timing
/// anything under test.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
