//! A real Redis Cluster on loopback: 3 masters and 3 replicas, each a `redis-server` with
//! `--cluster-enabled yes` on a free port, joined by `redis-cli --cluster create`, and stopped
//! after the test.
//!
//! Skipped (with a message) when `redis-server` or `redis-cli` is missing, unless
//! `TOLLGATE_REQUIRE_REDIS` is set (as `.ci/run` sets it).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::port::{free_port, is_process};

pub struct Node {
    pub port: u16,
    child: Option<Child>,
}

pub struct RedisCluster {
    pub nodes: Vec<Node>,
    dir: PathBuf,
    args: Vec<String>,
}

fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `redis-cli` against one node, answering its output (raw, one reply per line).
pub fn cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Several commands on one `redis-cli` connection (one per line), in order.
pub fn cli_batch(port: u16, commands: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(commands.as_bytes())
        .expect("commands written");
    let output = child.wait_with_output().expect("redis-cli ends");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl RedisCluster {
    /// Starts the six nodes and joins them, or returns `None` (after saying why).
    pub fn start() -> Option<RedisCluster> {
        RedisCluster::start_with(&[])
    }

    /// Starts the cluster with extra arguments for every node.
    pub fn start_with(extra: &[&str]) -> Option<RedisCluster> {
        if !installed("redis-server") || !installed("redis-cli") {
            if std::env::var_os("TOLLGATE_REQUIRE_REDIS").is_some() {
                panic!(
                    "redis-server or redis-cli is not installed and TOLLGATE_REQUIRE_REDIS is set: install the Debian packages redis-server and redis-tools"
                );
            }
            eprintln!("SKIPPED: redis-server and redis-cli are needed for a Redis Cluster");
            return None;
        }
        let first = free_port();
        let dir =
            std::env::temp_dir().join(format!("tollgate-cluster-{}-{first}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the cluster's files");
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            dir,
            args: extra.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..6 {
            cluster.nodes.push(Node {
                port: first,
                child: None,
            });
            cluster.launch_new(i);
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create").args(&addresses);
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        if let Some(password) = cluster.password() {
            create.args(["-a", &password, "--no-auth-warning"]);
        }
        let status = create
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli --cluster create runs");
        assert!(status.success(), "redis-cli --cluster create failed");
        cluster.wait_until_ok();
        cluster.wait_until_replicated();
        Some(cluster)
    }

    fn password(&self) -> Option<String> {
        self.args
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| self.args.get(i + 1))
            .cloned()
    }

    /// Starts node `i` on a port free now, and its cluster bus (the port + 10,000) free too;
    /// another port if the server could not bind it after all (another test's server or
    /// connection took it in between: a node that never answered had failed CI).
    fn launch_new(&mut self, i: usize) {
        for _ in 0..10 {
            self.nodes[i].port = cluster_port();
            if self.spawn(i) {
                return;
            }
        }
        panic!("no cluster node started in 10 tries on free ports");
    }

    /// Starts node `i` again on its port.
    fn launch(&mut self, i: usize) {
        let port = self.nodes[i].port;
        assert!(self.spawn(i), "cluster node on {port} did not answer");
    }

    /// Starts node `i` on its port: whether it answered within 10 s (false: the server ended,
    /// having failed to bind its port or its bus).
    fn spawn(&mut self, i: usize) -> bool {
        let port = self.nodes[i].port;
        let dir = self.dir.join(port.to_string());
        std::fs::create_dir_all(&dir).expect("a directory for the node");
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            .args([
                "--cluster-config-file",
                "nodes.conf",
                "--logfile",
                "node.log",
            ])
            .arg("--dir")
            .arg(&dir)
            .args(&self.args);
        if let Some(password) = self.password() {
            command.args(["--masterauth", &password]);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.nodes[i].child = Some(child);
        let pid = self.nodes[i]
            .child
            .as_ref()
            .map_or(0, std::process::Child::id);
        let deadline = Instant::now() + Duration::from_secs(10);
        // Our server, not another that took the port (its process id says so).
        while !is_process(&self.node_cli(port, &["INFO", "server"]), pid) {
            let ended = self.nodes[i]
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if ended || Instant::now() >= deadline {
                if let Some(mut child) = self.nodes[i].child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return false;
            }
            // Waiting for a process to come up, not timing anything under test.
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// `redis-cli` against one node, with the cluster's password.
    pub fn node_cli(&self, port: u16, args: &[&str]) -> String {
        match self.password() {
            Some(password) => {
                let mut all = vec!["-a", &password, "--no-auth-warning"];
                all.extend_from_slice(args);
                cli(port, &all)
            }
            None => cli(port, args),
        }
    }

    /// Waits until every live node says the cluster is ok and sees the same masters.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let live: Vec<u16> = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some())
                .map(|n| n.port)
                .collect();
            let ok = live.iter().all(|&port| {
                self.node_cli(port, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            }) && live
                .iter()
                .all(|&port| self.masters_seen_by(port).len() == 3);
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ok within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every master's replica has finished its first sync (a replica that never
    /// synced refuses to take over).
    pub fn wait_until_replicated(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.masters().iter().all(|&port| {
            self.node_cli(port, &["INFO", "replication"])
                .contains("state=online")
        }) {
            assert!(
                Instant::now() < deadline,
                "the replicas did not sync within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The ports of the live masters as `port` sees them.
    fn masters_seen_by(&self, port: u16) -> Vec<u16> {
        self.node_cli(port, &["CLUSTER", "NODES"])
            .lines()
            .filter(|line| line.contains("master") && !line.contains("fail"))
            .filter_map(|line| {
                let address = line.split(' ').nth(1)?;
                address.split('@').next()?.rsplit(':').next()?.parse().ok()
            })
            .collect()
    }

    /// The address for [`RedisStore::connect`](tollgate::store::redis::RedisStore::connect): `redis+cluster://` and every node.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        match self.password() {
            Some(password) => format!("redis+cluster://:{password}@{}", hosts.join(",")),
            None => format!("redis+cluster://{}", hosts.join(",")),
        }
    }

    /// The port of the master that holds `name`'s slot.
    pub fn master_of(&self, name: &str) -> u16 {
        self.live_master_of(name)
            .unwrap_or_else(|| panic!("no live master holds the slot of {name}"))
    }

    /// The port of the live master that holds `name`'s slot, if one does.
    pub fn live_master_of(&self, name: &str) -> Option<u16> {
        let live = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node")
            .port;
        let slot: u16 = self
            .node_cli(live, &["CLUSTER", "KEYSLOT", name])
            .trim()
            .parse()
            .expect("a slot");
        let nodes = self.node_cli(live, &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if !fields.get(2).is_some_and(|f| f.contains("master")) || line.contains("fail") {
                continue;
            }
            let holds = fields
                .iter()
                .skip(8)
                .any(|range| match range.split_once('-') {
                    Some((a, b)) => {
                        a.parse::<u16>().is_ok_and(|a| a <= slot)
                            && b.parse::<u16>().is_ok_and(|b| slot <= b)
                    }
                    None => range.parse::<u16>() == Ok(slot),
                });
            if holds {
                return fields[1]
                    .split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok());
            }
        }
        None
    }

    /// The port of the replica of the master on `master`.
    pub fn replica_of(&self, master: u16) -> u16 {
        let nodes = self.node_cli(master, &["CLUSTER", "NODES"]);
        let id = nodes
            .lines()
            .find(|line| line.contains("myself"))
            .and_then(|line| line.split(' ').next())
            .expect("the master's own id")
            .to_owned();
        nodes
            .lines()
            .find(|line| line.split(' ').nth(3) == Some(id.as_str()))
            .and_then(|line| {
                line.split(' ')
                    .nth(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            })
            .expect("a replica of the master")
    }

    /// Sends `signal` (`-STOP`, `-CONT`) to one node.
    pub fn signal(&self, port: u16, signal: &str) {
        if let Some(child) = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
        {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    /// Every live master's port.
    pub fn masters(&self) -> Vec<u16> {
        let live = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node")
            .port;
        self.masters_seen_by(live)
    }

    /// Kills one node at once.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port)
            && let Some(mut child) = node.child.take()
        {
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills every node.
    pub fn kill_all(&mut self) {
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        for port in ports {
            self.kill(port);
        }
    }

    /// Kills every node and starts them again on their ports, empty (nothing was saved) but
    /// with their cluster configuration, so that the same cluster forms again.
    pub fn restart_all(&mut self) {
        self.kill_all();
        for i in 0..self.nodes.len() {
            self.launch(i);
        }
        self.wait_until_ok();
        self.wait_until_replicated();
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) every node.
    pub fn signal_all(&self, signal: &str) {
        for node in &self.nodes {
            if let Some(child) = &node.child {
                let _ = Command::new("kill")
                    .args([signal, &child.id().to_string()])
                    .status();
            }
        }
    }

    /// Runs a command on every live master; answers their outputs joined by newlines.
    pub fn on_masters(&self, args: &[&str]) -> String {
        if self.nodes.iter().all(|n| n.child.is_none()) {
            return String::new();
        }
        self.masters()
            .into_iter()
            .map(|port| self.node_cli(port, args))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.kill_all();
        if std::env::var_os("TOLLGATE_KEEP_CLUSTER_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A loopback port free now whose cluster bus port (10,000 above it, at most 65,535) is free
/// too.
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}
