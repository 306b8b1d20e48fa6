//! Worker processes sharing one key through Redis: each makes 20 calls on `5/s burst 10`.
//!
//! ```text
//! cargo run --release --features redis --example workers -- --redis redis://127.0.0.1:6379
//! cargo run --release --features redis --example workers              # starts its own redis-server
//! cargo run --release --features redis --example workers -- --workers 5
//! ```
//!
//! Every admission is recorded with Redis's own time; the summary line checks the window bound
//! over every interval between admissions, across all the processes.

#[path = "../tests/support/recording.rs"]
mod recording;

use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use tollgate::store::redis::RedisStore;
use tollgate::{Cost, Limiter, Limits};

const RATE: &str = "5/s burst 10";
const BURST: u64 = 10;
const PER_SEC: u64 = 5;

struct Args {
    redis: Option<String>,
    workers: usize,
    calls: usize,
    worker: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        redis: None,
        workers: 3,
        calls: 20,
        worker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--redis" => args.redis = Some(value("--redis")?),
            "--workers" => {
                args.workers = value("--workers")?
                    .parse()
                    .map_err(|e| format!("--workers: {e}"))?
            }
            "--calls" => {
                args.calls = value("--calls")?
                    .parse()
                    .map_err(|e| format!("--calls: {e}"))?
            }
            "--worker-key" => args.worker = Some(value("--worker-key")?),
            other => {
                return Err(format!(
                    "unknown argument `{other}`; expected --redis URL, --workers N, --calls N"
                ));
            }
        }
    }
    Ok(args)
}

async fn worker(url: &str, key: &str, calls: usize) -> Result<(), Box<dyn std::error::Error>> {
    let store = recording::Recording::new(RedisStore::connect(url).await?);
    let limiter = Limiter::new(key, Limits::parse(RATE, "")?, store)?;
    for _ in 0..calls {
        limiter.acquire_timeout(Cost::call(0), None).await?;
    }
    for t in limiter.store().admitted_at() {
        println!("ADMIT {t}");
    }
    Ok(())
}

/// A redis-server of our own on a free port, for when no URL is given.
fn start_redis() -> Result<(Child, String), String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("could not start redis-server ({e}); install it or pass --redis URL")
        })?;
    Ok((child, format!("redis://127.0.0.1:{port}")))
}

/// The interval where admissions most exceed `B + r·dt`, if any.
fn worst_window(times: &[u64]) -> Option<(u64, u64, u64)> {
    let mut worst = None;
    let mut worst_excess = 0i128;
    for i in 0..times.len() {
        for j in i..times.len() {
            let count = (j - i + 1) as i128;
            let dt = i128::from(times[j] - times[i]);
            let excess = count * 1000 - (i128::from(BURST) * 1000 + i128::from(PER_SEC) * dt);
            if excess > worst_excess {
                worst_excess = excess;
                worst = Some((times[i], times[j], count as u64));
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
        return match worker(url, key, args.calls).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("worker: {err}");
                ExitCode::FAILURE
            }
        };
    }

    let mut own_server = None;
    let url = match args.redis.clone() {
        Some(url) => url,
        None => match start_redis() {
            Ok((child, url)) => {
                own_server = Some(child);
                // Wait until it answers (a process starting, not a measurement).
                for _ in 0..200 {
                    if RedisStore::connect(&url).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                url
            }
            Err(err) => {
                eprintln!("workers: {err}");
                return ExitCode::FAILURE;
            }
        },
    };
    let key = format!("workers-demo-{}", std::process::id());
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("workers: {err}");
            return ExitCode::FAILURE;
        }
    };
    let children: Vec<_> = (0..args.workers)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--worker-key",
                    &key,
                    "--redis",
                    &url,
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
    if let Some(mut child) = own_server {
        let _ = child.kill();
        let _ = child.wait();
    }
    times.sort_unstable();
    let calls = times.len() as u64;
    let total =
        (times.last().copied().unwrap_or(0) - times.first().copied().unwrap_or(0)) as f64 / 1000.0;
    let ideal = calls.saturating_sub(BURST) as f64 / PER_SEC as f64;
    let verdict = match worst_window(&times) {
        None => "window bound held".to_owned(),
        Some((from, to, count)) => {
            format!("window bound BROKEN: {count} calls in [{from}, {to}] ms")
        }
    };
    println!(
        "workers: {calls} calls in {} processes in {total:.2} s, ideal {ideal:.2} s, efficiency {:.1}%, {verdict}",
        args.workers,
        100.0 * ideal / total.max(f64::EPSILON)
    );
    ExitCode::SUCCESS
}
