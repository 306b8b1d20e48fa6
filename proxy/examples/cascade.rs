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
//! cargo run --release -p tollgate-proxy --example cascade -- 3 tenants shared  # the same, the
//!                          # tenants without windows of their own: all wait at the shared key
//! cargo run --release -p tollgate-proxy --example cascade -- 3 weights  # 2 tenants of weights
//!                          # 1 and 2 fire 80 each at once: their shares of the tokens
//! cargo run --release -p tollgate-proxy --example cascade -- 3 tenants redis  # two proxies
//!                          # sharing one redis-server (started here), calls spread over both
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
//!
//! `tenants` prints, per run, the quiet tenants' latency (from sending a call to its answer, as
//! their client sees it, retries included: the wait for admission plus the stand-in's service
//! time, about 25 ms for their 5-token answers), p50, p99 and most; the noisy tenant's
//! completion time against its ideal (the best schedule for every call, the quiet ones first:
//! the capacity left to it); and the 429s at the stand-in. `weights` prints each tenant's share
//! of the tokens (its calls' estimates, as the proxy charges them) answered while both were
//! backlogged, against 1:2.

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
    /// Two tenants of weights 1 and 2 fire 80 calls each at once.
    Weights,
}

/// What one call of a tenant did: its tenant's index, its cost in tokens, when it was sent and
/// answered (from the run's start), and whether it was answered 200.
#[derive(Debug, Clone, Copy)]
struct Done {
    tenant: usize,
    tokens: u64,
    sent: f64,
    answered: f64,
    ok: bool,
}

/// A run's figures beyond the 429s.
#[derive(Debug, Clone, Default)]
struct Figures {
    /// Quiet tenants' latency, p50, p99 and most, in seconds.
    quiet: Option<(f64, f64, f64)>,
    /// The noisy tenant's completion time and its ideal.
    noisy: Option<(f64, f64)>,
    /// The two tenants' shares of the tokens while both were backlogged (weights 1 and 2).
    shares: Option<(f64, f64)>,
}

/// A call's cost as the proxy charges it (less its margin): its input, estimated with
/// o200k_base, and its `max_tokens`.
fn tokens_of(body: &Value) -> u64 {
    use tollgate::estimators::{Billing, estimate_with, estimator};
    let estimator = estimator("openai").expect("the openai estimator");
    let input = estimate_with(&*estimator, body, &Billing::default()).map_or(0, |e| e.input_tokens);
    input + body["max_tokens"].as_u64().unwrap_or(0)
}

/// The `q` quantile of sorted `values`, by nearest rank.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sends `body` as tenant `tenant` (with `key`) after `at`, to one of `proxies`, and says what
/// it did.
fn tenant_call(
    proxies: &[SocketAddr],
    began: Instant,
    tenant: usize,
    key: &'static str,
    body: Value,
    at: Duration,
    i: usize,
) -> tokio::task::JoinHandle<Done> {
    let proxy = proxies[i % proxies.len()];
    let tokens = tokens_of(&body);
    tokio::spawn(async move {
        tokio::time::sleep(at).await;
        let sent = began.elapsed().as_secs_f64();
        let ok = sdk_call(proxy, &body, Some(key), None).await;
        Done {
            tenant,
            tokens,
            sent,
            answered: began.elapsed().as_secs_f64(),
            ok,
        }
    })
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

/// Runs one workload; answers the calls answered, the calls sent, the seconds it took, the
/// ideal seconds, and the tenants' figures.
async fn run(
    workload: Workload,
    proxies: &[SocketAddr],
    options: &Options,
) -> (u64, u64, f64, f64, Figures) {
    let proxy = proxies[0];
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
            (
                ok,
                80,
                began.elapsed().as_secs_f64(),
                ideal,
                Figures::default(),
            )
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
            (
                ok,
                150,
                began.elapsed().as_secs_f64(),
                ideal,
                Figures::default(),
            )
        }
        Workload::Tenants => {
            let noisy = provider::chats(0, 200);
            let quiet_calls = small_calls(90);
            let mut everything = noisy.clone();
            everything.extend(quiet_calls.iter().cloned());
            let ideal = provider::ideal_seconds(&everything, options, 0.0);
            // The capacity left to the noisy tenant: every quiet call served first.
            let mut quiet_first = quiet_calls.clone();
            quiet_first.extend(noisy.iter().cloned());
            let noisy_ideal = provider::ideal_seconds(&quiet_first, options, 0.0);
            let mut tasks: Vec<_> = noisy
                .into_iter()
                .enumerate()
                .map(|(i, body)| {
                    tenant_call(
                        proxies,
                        began,
                        0,
                        "vk-noisy-0000001",
                        body,
                        Duration::ZERO,
                        i,
                    )
                })
                .collect();
            for (i, body) in quiet_calls.into_iter().enumerate() {
                let key = ["vk-quiet-0000001", "vk-quiet-0000002", "vk-quiet-0000003"][i % 3];
                let at = Duration::from_millis(1_000 * (i as u64 / 3));
                tasks.push(tenant_call(proxies, began, 1 + i % 3, key, body, at, i));
            }
            let sent = tasks.len() as u64;
            let mut done = Vec::new();
            for task in tasks {
                done.extend(task.await.ok());
            }
            let ok = done.iter().filter(|d| d.ok).count() as u64;
            let mut quiet: Vec<f64> = done
                .iter()
                .filter(|d| d.tenant > 0)
                .map(|d| d.answered - d.sent)
                .collect();
            quiet.sort_by(f64::total_cmp);
            let noisy_done = done
                .iter()
                .filter(|d| d.tenant == 0)
                .map(|d| d.answered)
                .fold(0.0, f64::max);
            let figures = Figures {
                quiet: Some((
                    quantile(&quiet, 0.5),
                    quantile(&quiet, 0.99),
                    quiet.last().copied().unwrap_or(f64::NAN),
                )),
                noisy: Some((noisy_done, noisy_ideal)),
                shares: None,
            };
            (ok, sent, began.elapsed().as_secs_f64(), ideal, figures)
        }
        Workload::Weights => {
            let one = provider::chats(0, 80);
            let two = provider::chats(80, 80);
            let mut everything = one.clone();
            everything.extend(two.iter().cloned());
            let ideal = provider::ideal_seconds(&everything, options, 0.0);
            let mut tasks = Vec::new();
            for (i, (a, b)) in one.into_iter().zip(two).enumerate() {
                let at = Duration::ZERO;
                tasks.push(tenant_call(proxies, began, 0, "vk-light-0000001", a, at, i));
                tasks.push(tenant_call(
                    proxies,
                    began,
                    1,
                    "vk-heavy-0000001",
                    b,
                    at,
                    i + 1,
                ));
            }
            let sent = tasks.len() as u64;
            let mut done = Vec::new();
            for task in tasks {
                done.extend(task.await.ok());
            }
            let ok = done.iter().filter(|d| d.ok).count() as u64;
            (
                ok,
                sent,
                began.elapsed().as_secs_f64(),
                ideal,
                Figures {
                    shares: Some(backlogged_shares(&done)),
                    ..Figures::default()
                },
            )
        }
    }
}

/// The two tenants' shares of the tokens answered while both had calls waiting: from the first
/// answer that waited a second (the burst the windows held at the start is admitted as it
/// arrives, before anyone waits) to the last answer of the tenant that finished first.
fn backlogged_shares(done: &[Done]) -> (f64, f64) {
    let from = done
        .iter()
        .filter(|d| d.answered - d.sent >= 1.0)
        .map(|d| d.answered)
        .fold(f64::INFINITY, f64::min);
    let last = |tenant| {
        done.iter()
            .filter(|d| d.tenant == tenant)
            .map(|d| d.answered)
            .fold(0.0, f64::max)
    };
    let to = last(0).min(last(1));
    let tokens = |tenant| -> u64 {
        done.iter()
            .filter(|d| d.tenant == tenant && d.ok && d.answered >= from && d.answered <= to)
            .map(|d| d.tokens)
            .sum()
    };
    let (a, b) = (tokens(0) as f64, tokens(1) as f64);
    (a / (a + b), b / (a + b))
}

fn config(
    workload: Workload,
    run: usize,
    upstream: SocketAddr,
    redis: Option<&str>,
    own_windows: bool,
) -> String {
    let windows = if own_windows {
        "requests = \"60/10s\"\ntokens = \"20000/10s\""
    } else {
        ""
    };
    let tenants = match workload {
        Workload::Tenants => {
            r#"
        [tenants]
        from = "key"
        WINDOWS
        virtual_keys = { "vk-noisy-0000001" = "noisy", "vk-quiet-0000001" = "quiet-1", "vk-quiet-0000002" = "quiet-2", "vk-quiet-0000003" = "quiet-3" }
        "#
        }
        Workload::Weights => {
            r#"
        [tiers.one]
        weight = 1
        [tiers.two]
        weight = 2
        [tenants]
        from = "key"
        virtual_keys = { "vk-light-0000001" = { tenant = "light", tier = "one" }, "vk-heavy-0000001" = { tenant = "heavy", tier = "two" } }
        "#
        }
        _ => "",
    };
    let key = if matches!(workload, Workload::Tenants | Workload::Weights) {
        "api_key_env = \"HOME\""
    } else {
        ""
    };
    let tenants = tenants.replace("WINDOWS", windows);
    let redis = redis
        .map(|url| format!("redis = \"{url}\""))
        .unwrap_or_default();
    format!(
        r#"
        {redis}
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
    } else if args.iter().any(|a| a == "weights") {
        Workload::Weights
    } else {
        Workload::Burst
    };
    let trace = args.iter().any(|a| a == "trace");
    // `tenants shared`: the tenants have no windows of their own, so the noisy tenant's backlog
    // waits at the organisation's key itself (with windows of their own, each at the
    // organisation's rate, it waits at its own key and reaches the shared one at that rate).
    let shared_only = args.iter().any(|a| a == "shared");
    // Two proxies on one redis-server, the calls spread over both.
    let redis = args
        .iter()
        .any(|a| a == "redis")
        .then(|| tollgate_testkit::redis::RedisServer::start().expect("redis-server"));
    let redis_url = redis
        .as_ref()
        .map(|r| format!("redis://127.0.0.1:{}", r.port));
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
    let mut all = Vec::new();
    for run_number in 0..runs {
        RECORDS.lock().unwrap().clear();
        // The stand-in counts its records from its start, a moment after this.
        let start = Instant::now();
        let stand_in = Provider::start_with(options.clone()).await;
        let text = config(
            workload,
            run_number,
            stand_in.addr,
            redis_url.as_deref(),
            !shared_only,
        );
        let mut config = Config::from_toml(&text).expect("a valid configuration");
        config.listen = "127.0.0.1:0".parse().unwrap();
        let mut running = Vec::new();
        for _ in 0..if redis.is_some() { 2 } else { 1 } {
            running.push(
                Proxy::bind(config.clone())
                    .await
                    .expect("the proxy starts")
                    .spawn(),
            );
        }
        let addrs: Vec<SocketAddr> = running.iter().map(|p| p.addr).collect();
        let (ok, sent, seconds, ideal, figures) = run(workload, &addrs, &options).await;
        let refused = stand_in.stats.refused.load(Ordering::Relaxed);
        counts.push(refused);
        ratios.push(seconds / ideal);
        println!(
            "run {run_number:>2}: {ok}/{sent} ok, {refused:>3} 429s at the stand-in, {seconds:.2} s ({:.3}× the ideal {ideal:.2} s)",
            seconds / ideal
        );
        if let Some((p50, p99, most)) = figures.quiet {
            println!("        quiet latency p50 {p50:.3} s, p99 {p99:.3} s, most {most:.3} s");
        }
        if let Some((done, ideal)) = figures.noisy {
            println!(
                "        noisy done in {done:.2} s, {:.3}× its ideal {ideal:.2} s",
                done / ideal
            );
        }
        if let Some((one, two)) = figures.shares {
            println!(
                "        shares while both waited: weight 1 {one:.3}, weight 2 {two:.3} ({:.3}:2)",
                2.0 * one / two
            );
        }
        all.push((refused, figures));
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
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let of = |pick: &dyn Fn(&Figures) -> Option<f64>| {
        median(all.iter().filter_map(|(_, f)| pick(f)).collect())
    };
    if all.iter().any(|(_, f)| f.quiet.is_some()) {
        println!(
            "medians: quiet p50 {:.3} s, p99 {:.3} s, most {:.3} s; noisy {:.3}× its ideal",
            of(&|f| f.quiet.map(|q| q.0)),
            of(&|f| f.quiet.map(|q| q.1)),
            of(&|f| f.quiet.map(|q| q.2)),
            of(&|f| f.noisy.map(|(d, i)| d / i)),
        );
    }
    if all.iter().any(|(_, f)| f.shares.is_some()) {
        println!(
            "medians: weight 1 {:.3}, weight 2 {:.3} of the tokens ({:.3}:2)",
            of(&|f| f.shares.map(|s| s.0)),
            of(&|f| f.shares.map(|s| s.1)),
            of(&|f| f.shares.map(|s| 2.0 * s.0 / s.1)),
        );
    }
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
