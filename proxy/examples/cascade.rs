//! Many calls at once through the proxy to a stand-in at the proxy's own limits, the stand-in
//! counting the requests it refuses (as OpenAI does): how many 429s reach it, run after run,
//! and, call by call, what the proxy's windows held when it let a call go beside what the
//! stand-in's held when the call arrived.
//!
//! ```sh
//! cargo run --release -p tollgate-proxy --example cascade                # 10 runs of 80 calls
//! cargo run --release -p tollgate-proxy --example cascade -- 20 80 trace # and the records of
//!                                                                          # each run with a 429
//! cargo run --release -p tollgate-proxy --example cascade -- 20 80 small # small calls: requests
//!                                                                          # run out, not tokens
//! ```
//!
//! Each run prints its 429s, its time against the ideal, and (with `trace`) the records around
//! the first 429: `S` lines are the stand-in's (what its windows held on arrival, before the
//! call was charged), `P` lines the proxy's (what its windows held right after the admission).

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tollgate_proxy::{Config, Proxy};
use tollgate_testkit::provider::{self, Options, Provider};

/// The proxy's records of the run under way: (when, line).
static RECORDS: Mutex<Vec<(Instant, String)>> = Mutex::new(Vec::new());

struct Recorder;

impl std::io::Write for Recorder {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let at = Instant::now();
        let line = String::from_utf8_lossy(buf).trim_end().to_owned();
        RECORDS.lock().unwrap().push((at, line));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(10);
    let calls: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(80);
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
    // `small`: one-line prompts with `max_tokens` 5, so that requests, not tokens, run out.
    let bodies: Vec<serde_json::Value> = if args.iter().any(|a| a == "small") {
        (0..calls)
            .map(|i| {
                serde_json::json!({"model": "gpt-4o", "max_tokens": 5,
                    "messages": [{"role": "user", "content": format!("Say hello to caller {i}")}]})
            })
            .collect()
    } else {
        provider::chats(0, calls)
    };
    let ideal = provider::ideal_seconds(&bodies, &options, 0.0);
    let mut counts = Vec::new();
    for run in 0..runs {
        RECORDS.lock().unwrap().clear();
        // The stand-in counts its records from its start, a moment after this.
        let start = Instant::now();
        let stand_in = Provider::start_with(options.clone()).await;
        let toml = format!(
            r#"
            [[upstream]]
            name = "cascade-{run}"
            url = "http://{}"
            profile = "openai"
            requests = "60/10s"
            tokens = "20000/10s"
            "#,
            stand_in.addr
        );
        let mut config = Config::from_toml(&toml).expect("a valid configuration");
        config.listen = "127.0.0.1:0".parse().unwrap();
        let proxy = Proxy::bind(config).await.expect("the proxy starts").spawn();
        let began = Instant::now();
        let tasks: Vec<_> = bodies
            .iter()
            .cloned()
            .map(|body| {
                let addr = proxy.addr;
                tokio::spawn(async move { provider::post(addr, &body).await })
            })
            .collect();
        let mut ok = 0;
        for task in tasks {
            if let Ok(Ok(response)) = task.await
                && response.status == 200
            {
                ok += 1;
            }
        }
        let seconds = began.elapsed().as_secs_f64();
        let refused = stand_in.stats.refused.load(Ordering::Relaxed);
        counts.push(refused);
        println!(
            "run {run:>2}: {ok}/{calls} ok, {refused:>3} 429s at the stand-in, {seconds:.2} s ({:.3}× the ideal {ideal:.2} s)",
            seconds / ideal
        );
        if trace && refused > 0 {
            print_records(&stand_in, start);
        }
    }
    counts.sort_unstable();
    let bad = counts.iter().filter(|c| **c > 2).count();
    println!(
        "{runs} runs: {bad} with more than 2 429s; median {} 429s, most {}",
        counts[counts.len() / 2],
        counts.last().copied().unwrap_or(0)
    );
}

/// The stand-in's and the proxy's records around the first 429, in time order.
fn print_records(stand_in: &Provider, start: Instant) {
    let trace = stand_in.stats.trace.lock().unwrap().clone();
    let Some(first) = trace.iter().position(|a| a.refused.is_some()) else {
        return;
    };
    let from = trace[first.saturating_sub(12)].at;
    let to = trace[(first + 20).min(trace.len() - 1)].at;
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
