//! The Redis script's own time for an uncontended acquire (issue 33, item 3): what one
//! admission costs the server, from Redis's counters (`INFO commandstats`, `usec_per_call` of
//! `EVALSHA`), not from the client's clock.
//!
//! ```text
//! cargo run --release --features redis --example script_time
//! cargo run --release --features redis --example script_time -- --calls 20000 --runs 9
//! cargo run --release --features redis --example script_time -- --snapshot
//! ```
//!
//! With `--snapshot`, each call is a snapshot of the key's windows instead: an operation that
//! takes the script's full path with nothing to do, whose time is the full path's setup.
//!
//! It starts a `redis-server` of its own (testkit's launcher), then for each run resets the
//! server's counters and makes `--calls` admissions one after another through a limiter on a
//! key of two windows (requests and tokens, generous: every call passes at once, the script's
//! fast path), one request and 700 tokens each, as an application would. One line a run, then
//! the median and the minimum: the minimum is the figure on a quiet machine.

use std::process::ExitCode;

use tollgate::store::redis::RedisStore;
use tollgate::{Cost, Limiter, Limits};
use tollgate_testkit::redis::RedisServer;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `usec_per_call` of `cmdstat_evalsha` in an `INFO commandstats` reply.
fn evalsha_usec(info: &str) -> Option<f64> {
    let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"))?;
    line.split("usec_per_call=")
        .nth(1)?
        .split(',')
        .next()?
        .parse()
        .ok()
}

fn main() -> ExitCode {
    let (calls, runs) = (arg("--calls", 10_000), arg("--runs", 7));
    let snapshot = std::env::args().any(|a| a == "--snapshot");
    let Some(server) = RedisServer::start() else {
        eprintln!("redis-server is not installed");
        return ExitCode::FAILURE;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let times = runtime.block_on(async {
        let url = server.url();
        let store = RedisStore::connect(&url).await.expect("the server answers");
        let limits = Limits::parse("1000000/s burst 1000000", "1000000000/s").expect("limits");
        let limiter = Limiter::new("script-time", limits, store).expect("a limiter");
        let client = redis::Client::open(url.as_str()).expect("a client");
        let mut admin = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection");
        let mut times = Vec::new();
        for run in 0..runs {
            // A first call loads the script; the counters start after it.
            limiter.acquire(Cost::call(700)).await.expect("admitted");
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut admin)
                .await
                .expect("reset");
            for _ in 0..calls {
                if snapshot {
                    limiter.snapshot().await.expect("a snapshot");
                } else {
                    limiter.acquire(Cost::call(700)).await.expect("admitted");
                }
            }
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut admin)
                .await
                .expect("info");
            let usec = evalsha_usec(&info).expect("EVALSHA counted");
            let what = if snapshot { "snapshot" } else { "acquire" };
            println!("run {run}: {usec:.2} µs of server time per {what} ({calls} calls)");
            times.push(usec);
        }
        times
    });
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "{}, server time: median {:.2} µs, min {:.2} µs over {runs} runs",
        if snapshot {
            "snapshot (the full path's setup)"
        } else {
            "uncontended acquire"
        },
        sorted[sorted.len() / 2],
        sorted[0]
    );
    ExitCode::SUCCESS
}
