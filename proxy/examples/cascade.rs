//! Many calls through the proxy to a stand-in at the proxy's own limits (60 requests and 20,000
//! tokens per 10 s), the stand-in counting the requests it refuses (as OpenAI does): how many
//! 429s reach it, run after run, and, call by call, what the proxy's windows held when it let a
//! call go beside what the stand-in's held when the call arrived.
//!
//! ```sh
//! cargo run --release -p tollgate-proxy --example cascade               # 10 runs of 80 at once
//! cargo run --release -p tollgate-proxy --example cascade -- 20 burst   # 20 runs
//! cargo run --release -p tollgate-proxy --example cascade -- 20 small   # 80 one-line calls:
//!                                                                        # requests run out first
//! cargo run --release -p tollgate-proxy --example cascade -- 10 timeouts  # 150 calls from 50
//!                                                      # clients that give up after 4 s
//! cargo run --release -p tollgate-proxy --example cascade -- 3 tenants  # 4 tenants on virtual
//!                          # keys: one fires 200 at once, three send one a second
//! cargo run --release -p tollgate-proxy --example cascade -- 5 burst trace  # and the records
//! ```
//!
//! The clients behave as the official SDKs do: a 429 is tried again (twice) after the pause
//! it names, a call that takes longer than its timeout is abandoned and tried again after half
//! a second. Each run prints its 429s at the stand-in and its time against the ideal (the best
//! schedule the stand-in allows for the same calls); with `trace`, a run with a 429 (or slower
//! than 1.1× the ideal) prints the records around it: `S` lines are the stand-in's (what its
//! windows held on arrival, before the call was charged), `P` lines the proxy's (what its
//! windows held right after the admission, and its warnings).

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tollgate_proxy::{Config, Proxy};
use tollgate_testkit::provider::{self, Options, Provider};

/// The proxy's records of the run under way: (when, line).
static RECORDS: Mutex<Vec<(Instant, String)>> = Mutex::new(Vec::new());

struct Recorder;

impl std::io::Write for Recorder {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf).trim_end().to_owned();
        RECORDS.lock().unwrap().push((Instant::now(), line));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// 80 chat calls of mixed sizes at once.
    Burst,
    /// 80 one-line calls reserving 5 tokens at once: requests run out, not tokens.
    Small,
    /// 150 calls from 50 clients, one after another in each, that give up after 4 s.
    Timeouts,
    /// Four tenants on virtual keys sharing the organisation's window, each allowed all of it:
    /// one fires 200 calls at once, three send one call a second for 30 s.
    Tenants,
}

/// How a client sends one call, as the official SDKs do: up to three attempts, a 429 tried
/// again after its pause, a call past `timeout` abandoned and tried again after 0.5 s.
async fn sdk_call(
    proxy: SocketAddr,
    body: &Value,
    key: Option<&str>,
    timeout: Option<Duration>,
) -> bool {
    let bearer = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    for _ in 0..3 {
        let sent = provider::post_with(proxy, body, &headers);
        let answer = match timeout {
            Some(timeout) => tokio::time::timeout(timeout, sent).await.ok(),
            None => Some(sent.await),
        };
        match answer {
            Some(Ok(response)) if response.status == 200 => return true,
            Some(Ok(response)) if response.status == 429 => {
                let pause = response
                    .retry_after_ms
                    .or(response.retry_after)
                    .unwrap_or(Duration::from_millis(500));
                tokio::time::sleep(pause).await;
            }
            Some(_) => return false,
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    false
}

fn small_calls(count: u64) -> Vec<Value> {
    (0..count)
        .map(|i| {
            json!({"model": "gpt-4o", "max_tokens": 5,
                "messages": [{"role": "user", "content": format!("Say hello to caller {i}")}]})
        })
        .collect()
}

/// Runs one workload; answers the calls answered, the calls sent, the seconds it took, and the
/// ideal seconds.
async fn run(workload: Workload, proxy: SocketAddr, options: &Options) -> (u64, u64, f64, f64) {
    let began = Instant::now();
    match workload {
        Workload::Burst | Workload::Small => {
            let bodies = if workload == Workload::Small {
                small_calls(80)
            } else {
                provider::chats(0, 80)
            };
            let ideal = provider::ideal_seconds(&bodies, options, 0.0);
            let tasks: Vec<_> = bodies
                .into_iter()
                .map(|body| tokio::spawn(async move { sdk_call(proxy, &body, None, None).await }))
                .collect();
            let mut ok = 0;
            for task in tasks {
                ok += u64::from(task.await.unwrap_or(false));
            }
            (ok, 80, began.elapsed().as_secs_f64(), ideal)
        }
        Workload::Timeouts => {
            let bodies = provider::chats(0, 150);
            let ideal = provider::ideal_seconds(&bodies, options, 0.0);
            let workers: Vec<_> = bodies
                .chunks(3)
                .map(|chunk| {
                    let chunk = chunk.to_vec();
                    tokio::spawn(async move {
                        let mut ok = 0;
                        for body in chunk {
                            let timeout = Some(Duration::from_secs(4));
                            ok += u64::from(sdk_call(proxy, &body, None, timeout).await);
                        }
                        ok
                    })
                })
                .collect();
            let mut ok = 0;
            for worker in workers {
                ok += worker.await.unwrap_or(0);
            }
            (ok, 150, began.elapsed().as_secs_f64(), ideal)
        }
        Workload::Tenants => {
            let noisy = provider::chats(0, 200);
            let quiet_calls = small_calls(90);
            let mut everything = noisy.clone();
            everything.extend(quiet_calls.iter().cloned());
            let ideal = provider::ideal_seconds(&everything, options, 0.0);
            let mut tasks: Vec<tokio::task::JoinHandle<bool>> = noisy
                .into_iter()
                .map(|body| {
                    tokio::spawn(async move {
                        sdk_call(proxy, &body, Some("vk-noisy-0000001"), None).await
                    })
                })
                .collect();
            for (i, body) in quiet_calls.into_iter().enumerate() {
                let key = ["vk-quiet-0000001", "vk-quiet-0000002", "vk-quiet-0000003"][i % 3];
                let at = Duration::from_millis(1_000 * (i as u64 / 3));
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(at).await;
                    sdk_call(proxy, &body, Some(key), None).await
                }));
            }
            let sent = tasks.len() as u64;
            let mut ok = 0;
            for task in tasks {
                ok += u64::from(task.await.unwrap_or(false));
            }
            (ok, sent, began.elapsed().as_secs_f64(), ideal)
        }
    }
}

fn config(workload: Workload, run: usize, upstream: SocketAddr) -> String {
    let tenants = if workload == Workload::Tenants {
        r#"
        [tenants]
        from = "key"
        requests = "60/10s"
        tokens = "20000/10s"
        virtual_keys = { "vk-noisy-0000001" = "noisy", "vk-quiet-0000001" = "quiet-1", "vk-quiet-0000002" = "quiet-2", "vk-quiet-0000003" = "quiet-3" }
        "#
    } else {
        ""
    };
    let key = if workload == Workload::Tenants {
        "api_key_env = \"HOME\""
    } else {
        ""
    };
    format!(
        r#"
        {tenants}
        [[upstream]]
        name = "cascade-{run}"
        url = "http://{upstream}"
        profile = "openai"
        requests = "60/10s"
        tokens = "20000/10s"
        {key}
        "#
    )
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(10);
    let workload = if args.iter().any(|a| a == "small") {
        Workload::Small
    } else if args.iter().any(|a| a == "timeouts") {
        Workload::Timeouts
    } else if args.iter().any(|a| a == "tenants") {
        Workload::Tenants
    } else {
        Workload::Burst
    };
    let trace = args.iter().any(|a| a == "trace");
    if trace {
        tracing_subscriber::fmt()
            .with_env_filter("tollgate=trace,tollgate_proxy=warn")
            .with_writer(|| Recorder)
            .without_time()
            .with_ansi(false)
            .with_target(false)
            .init();
    }
    let options = Options::openai(60, 20_000, Duration::from_secs(10));
    let mut counts = Vec::new();
    let mut ratios = Vec::new();
    for run_number in 0..runs {
        RECORDS.lock().unwrap().clear();
        // The stand-in counts its records from its start, a moment after this.
        let start = Instant::now();
        let stand_in = Provider::start_with(options.clone()).await;
        let mut config = Config::from_toml(&config(workload, run_number, stand_in.addr))
            .expect("a valid configuration");
        config.listen = "127.0.0.1:0".parse().unwrap();
        let proxy = Proxy::bind(config).await.expect("the proxy starts").spawn();
        let (ok, sent, seconds, ideal) = run(workload, proxy.addr, &options).await;
        let refused = stand_in.stats.refused.load(Ordering::Relaxed);
        counts.push(refused);
        ratios.push(seconds / ideal);
        println!(
            "run {run_number:>2}: {ok}/{sent} ok, {refused:>3} 429s at the stand-in, {seconds:.2} s ({:.3}× the ideal {ideal:.2} s)",
            seconds / ideal
        );
        if trace && (refused > 0 || seconds > 1.1 * ideal) {
            print_records(&stand_in, start);
        }
    }
    counts.sort_unstable();
    ratios.sort_by(f64::total_cmp);
    let bad = counts.iter().filter(|c| **c > 2).count();
    println!(
        "{workload:?}, {runs} runs: {bad} with more than 2 429s; 429s median {}, most {}; time median {:.3}× the ideal, most {:.3}×",
        counts[counts.len() / 2],
        counts.last().copied().unwrap_or(0),
        ratios[ratios.len() / 2],
        ratios.last().copied().unwrap_or(0.0),
    );
}

/// The stand-in's and the proxy's records around the first 429 (or the whole run when there is
/// none: a slow one), in time order.
fn print_records(stand_in: &Provider, start: Instant) {
    let trace = stand_in.stats.trace.lock().unwrap().clone();
    if trace.is_empty() {
        return;
    }
    let refused = trace.iter().position(|a| a.refused.is_some());
    let first = refused.unwrap_or(12);
    let from = trace[first.saturating_sub(12)].at;
    let to = match refused {
        Some(_) => trace[(first + 20).min(trace.len() - 1)].at,
        None => trace[trace.len() - 1].at,
    };
    let mut lines: Vec<(Duration, String)> = trace
        .iter()
        .filter(|a| a.at >= from && a.at <= to)
        .map(|a| {
            (
                a.at,
                format!(
                    "S requests {:>7.2} tokens {:>9.1} cost {:>5}{}",
                    a.requests,
                    a.tokens,
                    a.cost,
                    a.refused
                        .map(|p| format!("  429 retry-after {p:?}"))
                        .unwrap_or_default()
                ),
            )
        })
        .collect();
    let records = RECORDS.lock().unwrap().clone();
    for (at, line) in records {
        let at = at.saturating_duration_since(start);
        if at >= from && at <= to {
            lines.push((at, format!("P {line}")));
        }
    }
    lines.sort_by_key(|(at, _)| *at);
    for (at, line) in lines {
        println!("  {:>9.3} ms  {line}", at.as_secs_f64() * 1e3);
    }
}
