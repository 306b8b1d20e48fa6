//! Worker processes sharing one key through Redis.
//!
//! ```text
//! cargo run --release --features testing --example workers              # starts its own redis-server
//! cargo run --release --features testing --example workers -- --redis redis://127.0.0.1:6379
//! cargo run --release --features testing --example workers -- --processes 16 --tasks 50
//! ```
//!
//! Without flags, 3 processes each make 20 calls, one after another, on `5/s burst 10`. With
//! `--processes P --tasks T`, each of the P processes runs T tasks of one call each, all at
//! once, on a rate that makes the run last about 15 s (`R/s burst R` with `R = P·T/15`).
//!
//! Every admission is recorded with Redis's own time; the summary line checks the window bound
//! over every interval between admissions, across all the processes, on the server's clock,
//! and counts the Redis commands the run cost (from `INFO commandstats`) per admitted call.

use std::process::{Command, ExitCode, Stdio};

use tollgate::store::redis::RedisStore;
use tollgate::{Cost, Limiter, Limits};

/// The run's shape.
struct Args {
    redis: Option<String>,
    processes: usize,
    /// Tasks per process, each making `calls` calls one after another.
    tasks: usize,
    calls: usize,
    worker: Option<String>,
}

impl Args {
    fn total(&self) -> usize {
        self.processes * self.tasks * self.calls
    }

    /// `5/s burst 10` for the default run; for a large one, a rate that makes it last ~15 s.
    fn rate(&self) -> (u64, u64) {
        if self.tasks == 1 && self.total() <= 60 {
            (5, 10)
        } else {
            let per_sec = (self.total() as u64 / 15).max(1);
            (per_sec, per_sec)
        }
    }

    fn limits(&self) -> String {
        let (per_sec, burst) = self.rate();
        format!("{per_sec}/s burst {burst}")
    }
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        redis: None,
        processes: 3,
        tasks: 1,
        calls: 20,
        worker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--redis" => args.redis = Some(value("--redis")?),
            "--processes" | "--workers" => {
                args.processes = count(value("--processes")?, "--processes")?
            }
            "--tasks" => {
                args.tasks = count(value("--tasks")?, "--tasks")?;
                // A run of many tasks makes one call per task.
                args.calls = 1;
            }
            "--calls" => args.calls = count(value("--calls")?, "--calls")?,
            "--worker-key" => args.worker = Some(value("--worker-key")?),
            other => {
                return Err(format!(
                    "unknown argument `{other}`; expected --redis URL, --processes N, --tasks N, --calls N"
                ));
            }
        }
    }
    Ok(args)
}

/// A count of at least one.
fn count(text: String, name: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err(format!("{name} must be at least 1")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

async fn worker(args: &Args, url: &str, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = tollgate::testing::Recording::new(RedisStore::connect(url).await?);
    let limiter = Limiter::new(key, Limits::parse(&args.limits(), "")?, store)?;
    let tasks: Vec<_> = (0..args.tasks)
        .map(|_| {
            let limiter = limiter.clone();
            let calls = args.calls;
            tokio::spawn(async move {
                for _ in 0..calls {
                    limiter.acquire_timeout(Cost::call(0), None).await?;
                }
                Ok::<(), tollgate::Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    for t in limiter.store().admitted_at() {
        println!("ADMIT {t}");
    }
    Ok(())
}

/// The interval where admissions most exceed `B + r·dt` (times in ms, exact), if any.
fn worst_window(times: &[u64], (per_sec, burst): (u64, u64)) -> Option<(u64, u64, u64)> {
    let mut worst = None;
    let mut worst_excess = 0i128;
    for i in 0..times.len() {
        for j in i..times.len() {
            let count = (j - i + 1) as i128;
            let dt = i128::from(times[j] - times[i]);
            let excess = count * 1000 - (i128::from(burst) * 1000 + i128::from(per_sec) * dt);
            if excess > worst_excess {
                worst_excess = excess;
                worst = Some((times[i], times[j], count as u64));
            }
            // Past a burst's worth of slack no later window from `i` can exceed the bound.
            if -excess > (i128::from(burst) + 1) * 1000 {
                break;
            }
        }
    }
    worst
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("workers: {err}");
            return ExitCode::from(2);
        }
    };
    if let Some(key) = &args.worker {
        let url = args.redis.as_deref().unwrap_or("redis://127.0.0.1:6379");
        return match worker(&args, url, key).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("worker: {err}");
                ExitCode::FAILURE
            }
        };
    }

    let (url, own_server) = match tollgate_testkit::redis::given_or_own(args.redis.clone()) {
        Ok(found) => found,
        Err(err) => {
            eprintln!("workers: {err}");
            return ExitCode::FAILURE;
        }
    };

    let key = format!("workers-demo-{}", std::process::id());
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("workers: {err}");
            return ExitCode::FAILURE;
        }
    };
    let commands_before = match tollgate_testkit::redis::client_commands(&url).await {
        Ok(n) => n,
        Err(err) => {
            eprintln!("workers: INFO commandstats: {err}");
            return ExitCode::FAILURE;
        }
    };
    let children: Vec<_> = (0..args.processes)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--worker-key",
                    &key,
                    "--redis",
                    &url,
                    "--processes",
                    &args.processes.to_string(),
                    "--tasks",
                    &args.tasks.to_string(),
                    "--calls",
                    &args.calls.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect();
    let mut times = Vec::new();
    for (n, child) in children.into_iter().enumerate() {
        let output = match child.and_then(|c| c.wait_with_output()) {
            Ok(output) if output.status.success() => output,
            Ok(output) => {
                eprintln!("workers: worker {n} failed: {}", output.status);
                return ExitCode::FAILURE;
            }
            Err(err) => {
                eprintln!("workers: worker {n}: {err}");
                return ExitCode::FAILURE;
            }
        };
        let mine: Vec<u64> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("ADMIT ")?.trim().parse().ok())
            .collect();
        println!("worker {n}: {} calls admitted", mine.len());
        times.extend(mine);
    }
    let commands = match tollgate_testkit::redis::client_commands(&url).await {
        Ok(n) => n.saturating_sub(commands_before),
        Err(err) => {
            eprintln!("workers: INFO commandstats: {err}");
            return ExitCode::FAILURE;
        }
    };
    drop(own_server);
    times.sort_unstable();
    let calls = times.len() as u64;
    let (per_sec, burst) = args.rate();
    let total =
        (times.last().copied().unwrap_or(0) - times.first().copied().unwrap_or(0)) as f64 / 1000.0;
    let ideal = calls.saturating_sub(burst) as f64 / per_sec as f64;
    let verdict = match worst_window(&times, (per_sec, burst)) {
        None => "window bound held".to_owned(),
        Some((from, to, count)) => {
            format!("window bound BROKEN: {count} calls in [{from}, {to}] ms")
        }
    };
    println!(
        "workers: {calls} calls in {} processes in {total:.2} s, ideal {ideal:.2} s, efficiency {:.1}%, {verdict}, {:.2} Redis commands per call",
        args.processes,
        100.0 * ideal / total.max(f64::EPSILON),
        commands as f64 / calls.max(1) as f64
    );
    if calls as usize != args.total() {
        eprintln!(
            "workers: {calls} admissions recorded, {} expected",
            args.total()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
