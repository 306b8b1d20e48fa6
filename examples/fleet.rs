//! A fleet on one quota: several processes send chat calls through the gate (the tower layer
//! over hyper-util's client) to one provider stand-in, sharing their windows, their calls in
//! flight and their syncs through one Redis. Once with header sync, once without.
//!
//! ```text
//! cargo run --release --features tower,redis --example fleet                       # 4 processes
//! cargo run --release --features tower,redis --example fleet -- --processes 8
//! cargo run --release --features tower,redis --example fleet -- --latency 0.3
//! cargo run --release --features tower,redis --example fleet -- --per-minute       # 440 calls, 4 processes
//! ```
//!
//! The stand-in enforces 90 requests and 30,000 tokens per 10 s (with `--per-minute`, 600
//! requests and 200,000 tokens a minute), counts each call when it arrives and answers it
//! after 150 ms plus a time per output token (about 3 s a call by default). One line:
//!
//! `fleet: P processes, N calls, answers ~L s: with sync X s (ideal ratio), k 429s, c Redis
//! commands per call; without sync Y s, k' 429s, c' commands per call; ideal Z s`
//!
//! where the ideal is the best schedule the stand-in allows one client that sends the calls in
//! order and knows everything.

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::http::tower::GateLayer;
use tollgate::http::{Gate, Profile};
use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::{Limits, Registry};
use tollgate_testkit::provider::{Options, Provider, chats, ideal_seconds};
use tower::ServiceExt;

struct Args {
    processes: u64,
    calls: u64,
    latency: f64,
    per_minute: bool,
    /// Without the model of spending elsewhere.
    no_model: bool,
    redis: Option<String>,
    /// In a worker: where the stand-in listens, the key prefix, sync on or off, and which
    /// calls to send.
    worker: Option<(String, String, bool, u64, u64)>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        processes: 4,
        calls: 0,
        latency: 3.0,
        per_minute: false,
        no_model: false,
        redis: None,
        worker: None,
    };
    let mut it = std::env::args().skip(1);
    let number = |v: Option<String>, what: &str| -> Result<u64, String> {
        v.and_then(|v| v.parse().ok())
            .ok_or(format!("{what} takes a number"))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--processes" => args.processes = number(it.next(), "--processes")?.max(1),
            "--calls" => args.calls = number(it.next(), "--calls")?,
            "--latency" => {
                args.latency = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                    .ok_or("--latency takes seconds, like 3 or 0.3")?
            }
            "--per-minute" => args.per_minute = true,
            "--no-model" => args.no_model = true,
            "--redis" => args.redis = Some(it.next().ok_or("--redis takes a URL")?),
            "--worker" => {
                let addr = it.next().ok_or("--worker takes an address")?;
                let prefix = it.next().ok_or("--worker takes a prefix")?;
                let sync = it.next().ok_or("--worker takes on or off")? == "on";
                let first = number(it.next(), "--worker's first call")?;
                let count = number(it.next(), "--worker's count")?;
                args.worker = Some((addr, prefix, sync, first, count));
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if args.calls == 0 {
        args.calls = if args.per_minute { 440 } else { 160 };
    }
    Ok(args)
}

impl Args {
    fn options(&self) -> Options {
        let base = if self.per_minute {
            Options::openai(600, 200_000, Duration::from_secs(60))
        } else {
            Options::openai(90, 30_000, Duration::from_secs(10))
        };
        // The stand-in's answers write 10 to 49 tokens (30 on average): 150 ms plus a time
        // per token that makes an answer take `latency` seconds on average.
        let per_token = ((self.latency - 0.15).max(0.0) / 30.0).max(0.0);
        let fixed = self.latency.min(0.15);
        base.latency(
            Duration::from_secs_f64(fixed),
            Duration::from_secs_f64(per_token),
        )
    }

    fn limits(&self) -> Limits {
        let options = self.options();
        let period = format!("{}s", options.period.as_secs());
        Limits::parse(
            &format!("{}/{period}", options.requests),
            &format!("{}/{period}", options.tokens),
        )
        .expect("valid limits")
    }
}

/// One worker process: its calls, all at once, through the gate on the shared Redis.
async fn worker(
    args: &Args,
    url: &str,
    (addr, prefix, sync, first, count): &(String, String, bool, u64, u64),
) -> Result<(), Box<dyn std::error::Error>> {
    let config = RedisConfig::default().with_prefix(prefix.clone());
    let store = RedisStore::connect_with(url, config).await?;
    let gate = Gate::builder(Profile::openai())
        .limits(args.limits())
        .registry(Arc::new(Registry::new(store)))
        .sync(*sync)
        .model_spending_elsewhere(!args.no_model)
        .retries(20)
        .timeout(Some(Duration::from_secs(900)))
        .build()?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let service = tower::ServiceBuilder::new()
        .layer(GateLayer::new(gate))
        .service(client);
    let calls: Vec<_> = chats(*first, *count)
        .into_iter()
        .map(|body| {
            let service = service.clone();
            let uri = format!("http://{addr}/v1/chat/completions");
            tokio::spawn(async move {
                let request = http::Request::post(uri)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.to_string())))?;
                let response = service.oneshot(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                if status != 200 {
                    return Err(format!("a call ended with {status}").into());
                }
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for call in calls {
        call.await?.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One run of the fleet: answers the wall time, the 429s and the Redis commands per call.
async fn run(
    args: &Args,
    url: &str,
    sync: bool,
) -> Result<(f64, u64, f64), Box<dyn std::error::Error>> {
    let provider = Provider::start_with(args.options()).await;
    let exe = std::env::current_exe()?;
    let prefix = format!("fleet-{}-{}", std::process::id(), u8::from(sync));
    let before = tollgate_testkit::redis::client_commands(url).await?;
    let start = Instant::now();
    let share = args.calls.div_ceil(args.processes);
    let mut children = Vec::new();
    for p in 0..args.processes {
        let first = p * share;
        let count = share.min(args.calls.saturating_sub(first));
        let mut command = Command::new(&exe);
        command
            .args(["--latency", &args.latency.to_string(), "--redis", url])
            .args(["--worker", &provider.addr.to_string(), &prefix])
            .arg(if sync { "on" } else { "off" })
            .args([first.to_string(), count.to_string()])
            .stdout(Stdio::null());
        if args.per_minute {
            command.arg("--per-minute");
        }
        if args.no_model {
            command.arg("--no-model");
        }
        children.push(command.spawn()?);
    }
    let waited = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|mut child| child.wait().map(|s| s.success()))
            .collect::<Result<Vec<bool>, _>>()
    })
    .await??;
    let seconds = start.elapsed().as_secs_f64();
    if waited.iter().any(|ok| !ok) {
        return Err("a worker failed".into());
    }
    let after = tollgate_testkit::redis::client_commands(url).await?;
    let per_call = (after - before) as f64 / args.calls as f64;
    Ok((
        seconds,
        provider.stats.refused.load(Ordering::Relaxed),
        per_call,
    ))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("fleet: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(worker_args) = &args.worker {
        let url = args.redis.as_deref().unwrap_or("redis://127.0.0.1:6379");
        return match worker(&args, url, worker_args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("fleet worker: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let (url, _own) = match tollgate_testkit::redis::given_or_own(args.redis.clone()) {
        Ok(found) => found,
        Err(err) => {
            eprintln!("fleet: {err}");
            return ExitCode::FAILURE;
        }
    };
    let ideal = ideal_seconds(&chats(0, args.calls), &args.options(), 0.0);
    let mut lines = Vec::new();
    for sync in [true, false] {
        match run(&args, &url, sync).await {
            Ok(result) => lines.push(result),
            Err(err) => {
                eprintln!("fleet: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    let [
        (with, with_429s, with_commands),
        (without, without_429s, without_commands),
    ] = lines[..]
    else {
        return ExitCode::FAILURE;
    };
    println!(
        "fleet: {} processes, {} calls, answers ~{} s: with sync {with:.1} s ({:.2}× ideal), {with_429s} 429s, {with_commands:.1} Redis commands per call; without sync {without:.1} s ({:.2}× ideal), {without_429s} 429s, {without_commands:.1} commands per call; ideal {ideal:.1} s; sync/no sync {:.2}×",
        args.processes,
        args.calls,
        args.latency,
        with / ideal,
        without / ideal,
        with / without,
    );
    ExitCode::SUCCESS
}
