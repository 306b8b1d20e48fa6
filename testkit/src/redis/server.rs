//! A real `redis-server` on a free loopback port, started for a test and stopped after it.
//!
//! When `redis-server` is not installed the test says so and is skipped, unless
//! `TOLLGATE_REQUIRE_REDIS` is set (as `.ci/run` sets it), where it fails instead.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::port::{free_port, is_process};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    args: Vec<String>,
    /// With `TOLLGATE_REDIS_CLUSTER` set, the "server" is a whole cluster (3 masters, 3
    /// replicas), and every method acts on all of it.
    cluster: Option<super::cluster::RedisCluster>,
}

/// Whether the Redis tests run against a cluster (`TOLLGATE_REDIS_CLUSTER` set).
pub fn cluster_mode() -> bool {
    std::env::var_os("TOLLGATE_REDIS_CLUSTER").is_some()
}

/// In cluster mode, says why a test that is about one server does not run there, and answers
/// true.
pub fn single_server_only(reason: &str) -> bool {
    if cluster_mode() {
        eprintln!("SKIPPED in cluster mode: {reason}");
    }
    cluster_mode()
}

fn installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl RedisServer {
    /// Starts a server, or returns `None` (after saying why) when there is none to start.
    pub fn start() -> Option<RedisServer> {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra arguments (`--requirepass`, ...).
    pub fn start_with(extra: &[&str]) -> Option<RedisServer> {
        if !installed() {
            if std::env::var_os("TOLLGATE_REQUIRE_REDIS").is_some() {
                panic!(
                    "redis-server is not installed and TOLLGATE_REQUIRE_REDIS is set: install the Debian package redis-server"
                );
            }
            eprintln!(
                "SKIPPED: redis-server is not installed (apt-get install redis-server to run this test)"
            );
            return None;
        }
        if cluster_mode() {
            let cluster = super::cluster::RedisCluster::start_with(extra)?;
            return Some(RedisServer {
                child: None,
                port: cluster.nodes[0].port,
                args: extra.iter().map(|s| s.to_string()).collect(),
                cluster: Some(cluster),
            });
        }
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            cluster: None,
        };
        // A port free when chosen may be taken before the server binds it (another test's
        // server or connection): a server that ends at once is started again on another.
        for _ in 0..10 {
            if server.spawn() {
                return Some(server);
            }
            server.port = free_port();
        }
        panic!("no redis-server started in 10 tries on free ports");
    }

    fn launch(&mut self) {
        self.spawn_child();
        self.wait_until_it_answers();
    }

    /// Starts the server on its port: whether it answers (false: it ended at once, its port
    /// taken).
    fn spawn(&mut self) -> bool {
        self.spawn_child();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let ended = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if ended {
                self.child = None;
                return false;
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                break;
            }
            // Waiting for a process to come up, not timing anything under test.
            std::thread::sleep(Duration::from_millis(10));
        }
        self.wait_until_it_answers();
        // Our server, not another that took the port first (its process id says so).
        let pid = self.child.as_ref().map_or(0, std::process::Child::id);
        if is_process(&self.info_server(), pid) {
            return true;
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        false
    }

    /// The server's `INFO server` section, as text (empty if it can't be read).
    fn info_server(&self) -> String {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let password = self
            .args
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| self.args.get(i + 1));
        let command = match password {
            Some(p) => format!("AUTH {p}\r\nINFO server\r\n"),
            None => "INFO server\r\n".to_owned(),
        };
        if stream.write_all(command.as_bytes()).is_err() {
            return String::new();
        }
        let mut text = String::new();
        let mut buffer = [0u8; 4096];
        while !text.contains("process_id:") || !text.ends_with("\r\n") {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.push_str(&String::from_utf8_lossy(&buffer[..n])),
            }
        }
        text
    }

    fn spawn_child(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
    }

    fn wait_until_it_answers(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let password = self
            .args
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| self.args.get(i + 1));
        while Instant::now() < deadline {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
                let command = match password {
                    Some(p) => format!("AUTH {p}\r\nPING\r\n"),
                    None => "PING\r\n".to_owned(),
                };
                let mut reply = [0u8; 64];
                if stream.write_all(command.as_bytes()).is_ok()
                    && let Ok(n) = stream.read(&mut reply)
                    && String::from_utf8_lossy(&reply[..n]).contains("+")
                {
                    return;
                }
            }
            // Waiting for a process to come up, not timing anything under test.
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on port {} did not answer within 10 s",
            self.port
        );
    }

    pub fn url(&self) -> String {
        match &self.cluster {
            Some(cluster) => cluster.url(),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Kills the server at once, without letting it save or say goodbye.
    pub fn kill(&mut self) {
        if let Some(cluster) = &mut self.cluster {
            cluster.kill_all();
            return;
        }
        if let Some(mut child) = self.child.take() {
            // A stopped process can't die until it runs again.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server without killing it (SIGSTOP): it holds its connections open and
    /// answers nothing until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(cluster) = &self.cluster {
            cluster.signal_all(signal);
            return;
        }
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("kill runs");
            assert!(status.success(), "kill {signal} failed");
        }
    }

    /// Starts it again on the same port (empty: nothing was saved).
    pub fn restart(&mut self) {
        if let Some(cluster) = &mut self.cluster {
            cluster.restart_all();
            return;
        }
        self.kill();
        self.launch();
    }

    /// Runs a command with `redis-cli`-free plain RESP and returns the raw reply (in cluster
    /// mode, the replies of every master, one after another).
    pub fn command(&self, args: &[&str]) -> String {
        match &self.cluster {
            Some(cluster) => cluster
                .masters()
                .into_iter()
                .map(|port| resp(port, args))
                .collect(),
            None => resp(self.port, args),
        }
    }
}

/// One command to the server on `port`, in plain RESP; the raw reply.
pub fn resp(port: u16, args: &[&str]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = [0u8; 4096];
    let n = stream.read(&mut reply).unwrap_or(0);
    String::from_utf8_lossy(&reply[..n]).into_owned()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
