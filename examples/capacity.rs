//! Capacity of a fleet on one Redis Cluster (issue 26, item 8): how many admissions a second N
//! limiter processes get from a local cluster of 3 masters and 3 replicas, how long an
//! admission takes at p99, how many Redis commands each costs, and where the ceiling is.
//!
//! ```text
//! cargo run --release --features redis --example capacity
//! cargo run --release --features redis --example capacity -- --processes 1,2,4,8 --tasks 16 --seconds 5
//! ```
//!
//! It starts the cluster (testkit's launcher: `redis-server` and `redis-cli` must be
//! installed), then for each N in `--processes` two runs of N processes (this binary with
//! `--worker`), each process running `--tasks` tasks that acquire one request and 100 tokens
//! one after another, for `--seconds`:
//!
//! - `spread`: each acquire on one of 1,000 keys, at random (keys hash to every master);
//! - `hot`: every acquire on one key (its slot, so every admission, lives on one master).
//!
//! The limits are generous (no acquire ever waits for a window): what is measured is the store.
//! One line a run: admissions a second (all processes), p50 and p99 of one admission's time,
//! Redis commands per admission (from each master's `INFO commandstats`), each master's share
//! of the commands and the CPU its `redis-server` used (from `INFO cpu`, as a share of one
//! core: a Redis node runs its commands on one thread), the replicas' CPU together (they
//! apply what their masters write), and the machine's CPU (from `/proc/stat`). A node at 100% of a core is that node's ceiling; the machine at 100% of its
//! cores is the machine's, and then the nodes' share is what is left beside the clients.
//!
//! Never run in CI (it only compiles there): the figures are in BENCHMARKS.md, "Capacity: a
//! fleet".

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::{Cost, Limits, Registry};
use tollgate_testkit::redis::{RedisCluster, cli, client_commands};

/// The keys of a spread run.
const KEYS: usize = 1_000;

struct Args {
    processes: Vec<usize>,
    tasks: usize,
    seconds: f64,
    /// In a worker: the cluster's URL, the key prefix, `hot` or `spread`, and when to start
    /// and stop (milliseconds since the epoch).
    worker: Option<(String, String, bool, u64, u64)>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        processes: vec![1, 2, 4, 8],
        tasks: 16,
        seconds: 5.0,
        worker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} takes a value"));
        match flag.as_str() {
            "--processes" => {
                args.processes = value()?
                    .split(',')
                    .map(|n| n.parse::<usize>().map(|n| n.max(1)))
                    .collect::<Result<_, _>>()
                    .map_err(|_| "--processes takes numbers, like 1,2,4,8")?
            }
            "--tasks" => {
                args.tasks = value()?
                    .parse::<usize>()
                    .map_err(|_| "--tasks takes a number")?
                    .max(1)
            }
            "--seconds" => {
                args.seconds = value()?
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .ok_or("--seconds takes a positive number")?
            }
            "--worker" => {
                let url = value()?;
                let prefix = value()?;
                let hot = value()? == "hot";
                let start = value()?.parse().map_err(|_| "--worker's start")?;
                let end = value()?.parse().map_err(|_| "--worker's end")?;
                args.worker = Some((url, prefix, hot, start, end));
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Sleeps until `at` (milliseconds since the epoch).
async fn until(at: u64) {
    let now = epoch_ms();
    if at > now {
        tokio::time::sleep(Duration::from_millis(at - now)).await;
    }
}

/// Generous limits: no acquire of the run waits for a window.
fn limits() -> Limits {
    Limits::parse("100000000/s", "10000000000/s").expect("valid limits")
}

/// One worker process: `tasks` tasks acquiring from `start` to `end`. Prints its admissions and
/// each one's time in microseconds.
async fn worker(
    tasks: usize,
    (url, prefix, hot, start, end): &(String, String, bool, u64, u64),
) -> Result<(), Box<dyn std::error::Error>> {
    let store =
        RedisStore::connect_with(url, RedisConfig::default().with_prefix(prefix.clone())).await?;
    let registry = Registry::new(store);
    let names: Vec<String> = if *hot {
        vec!["hot".to_owned()]
    } else {
        (0..KEYS).map(|k| format!("key-{k}")).collect()
    };
    // Held for the whole run, so that the registry keeps them.
    let limiters = names
        .iter()
        .map(|name| registry.limiter(name, &limits()))
        .collect::<Result<Vec<_>, _>>()?;
    // Each key once before the start: the script is loaded and the connections are open.
    for limiter in limiters.iter().take(64) {
        limiter.acquire(Cost::new(1, 100)).await?;
    }
    until(*start).await;
    let stop = Instant::now() + Duration::from_millis(end.saturating_sub(epoch_ms()));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let limiters = limiters.clone();
            // A task's own xorshift, so that tasks and processes pick different keys.
            let mut seed = (std::process::id() as u64) << 16 | t as u64 | 1;
            tokio::spawn(async move {
                let mut times = Vec::new();
                while Instant::now() < stop {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let limiter = &limiters[(seed % limiters.len() as u64) as usize];
                    let began = Instant::now();
                    limiter.acquire(Cost::new(1, 100)).await?;
                    times.push(began.elapsed().as_micros() as u32);
                }
                Ok::<_, tollgate::Error>(times)
            })
        })
        .collect();
    let mut times = Vec::new();
    for handle in handles {
        times.extend(handle.await??);
    }
    let joined: Vec<String> = times.iter().map(u32::to_string).collect();
    println!("{}", joined.join(" "));
    Ok(())
}

/// What a master node has done so far: commands clients sent, CPU seconds its process used.
struct NodeStats {
    commands: u64,
    cpu: f64,
}

async fn node_stats(port: u16) -> Result<NodeStats, Box<dyn std::error::Error>> {
    let commands = client_commands(&format!("redis://127.0.0.1:{port}")).await?;
    let info = cli(port, &["INFO", "cpu"]);
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    Ok(NodeStats {
        commands,
        cpu: field("used_cpu_sys") + field("used_cpu_user"),
    })
}

/// The machine's busy and total jiffies so far (`/proc/stat`), and its cores.
fn machine_cpu() -> (u64, u64, usize) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cores = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count()
        .max(1);
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total, cores)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    f64::from(sorted[i]) / 1_000.0
}

/// One run: N processes, spread or hot. Prints its line.
async fn run(
    args: &Args,
    cluster: &RedisCluster,
    processes: usize,
    hot: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let url = cluster.url();
    let prefix = format!("capacity-{}-{processes}-{hot}", std::process::id());
    // Time to start the processes, connect and warm up, then the measured stretch.
    let start = epoch_ms() + 2_000 + 150 * processes as u64;
    let end = start + (args.seconds * 1e3) as u64;
    let mut children = Vec::new();
    for _ in 0..processes {
        children.push(
            Command::new(&exe)
                .args([
                    "--tasks",
                    &args.tasks.to_string(),
                    "--worker",
                    &url,
                    &prefix,
                ])
                .arg(if hot { "hot" } else { "spread" })
                .args([start.to_string(), end.to_string()])
                .stdout(Stdio::piped())
                .spawn()?,
        );
    }
    let masters = cluster.masters();
    let replicas: Vec<u16> = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .filter(|port| !masters.contains(port))
        .collect();
    until(start.saturating_sub(50)).await;
    let mut before = Vec::new();
    for &port in masters.iter().chain(&replicas) {
        before.push(node_stats(port).await?);
    }
    let machine_before = machine_cpu();
    let began = Instant::now();
    let outputs = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|child| child.wait_with_output())
            .collect::<Result<Vec<_>, _>>()
    })
    .await??;
    let wall = began.elapsed().as_secs_f64().max(args.seconds);
    let machine_after = machine_cpu();
    let mut after = Vec::new();
    for &port in masters.iter().chain(&replicas) {
        after.push(node_stats(port).await?);
    }
    // The replicas apply what their masters write: their CPU is the cluster's too.
    let replicas_cpu: f64 = after[masters.len()..]
        .iter()
        .zip(&before[masters.len()..])
        .map(|(a, b)| a.cpu - b.cpu)
        .sum::<f64>()
        / wall;
    let (after, before) = (&after[..masters.len()], &before[..masters.len()]);
    let mut times: Vec<u32> = Vec::new();
    for output in &outputs {
        if !output.status.success() {
            return Err("a worker failed".into());
        }
        times.extend(
            String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .filter_map(|t| t.parse::<u32>().ok()),
        );
    }
    times.sort_unstable();
    let admissions = times.len() as f64;
    let commands: u64 = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.commands - b.commands)
        .sum();
    let nodes: Vec<String> = masters
        .iter()
        .zip(after.iter().zip(before))
        .map(|(port, (a, b))| {
            format!(
                "{port}: {:.0}% of commands, {:.0}% CPU",
                100.0 * (a.commands - b.commands) as f64 / commands.max(1) as f64,
                100.0 * (a.cpu - b.cpu) / wall,
            )
        })
        .collect();
    let (busy, total, cores) = (
        machine_after.0 - machine_before.0,
        machine_after.1 - machine_before.1,
        machine_after.2,
    );
    println!(
        "capacity: {processes} processes × {} tasks, {}: {:.0} admissions/s, p50 {:.2} ms, p99 {:.2} ms, {:.2} Redis commands per admission; masters {}; replicas {:.0}% CPU together; machine {:.0}% of {cores} cores",
        args.tasks,
        if hot { "one hot key" } else { "1,000 keys" },
        admissions / args.seconds,
        percentile(&times, 0.50),
        percentile(&times, 0.99),
        commands as f64 / admissions.max(1.0),
        nodes.join(", "),
        100.0 * replicas_cpu,
        100.0 * busy as f64 / total.max(1) as f64,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("capacity: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(worker_args) = &args.worker {
        return match worker(args.tasks, worker_args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("capacity worker: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let Some(cluster) = RedisCluster::start() else {
        return ExitCode::FAILURE;
    };
    for &processes in &args.processes {
        for hot in [false, true] {
            if let Err(err) = run(&args, &cluster, processes, hot).await {
                eprintln!("capacity: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
