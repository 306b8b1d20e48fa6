//! Three clients against a provider stand-in that enforces 120 requests and 20,000 tokens per
//! 10 seconds (and answers 429 with Retry-After beyond them), one after another, on the same
//! workload: an agent firing 60 chat calls of mixed sizes at once.
//!
//! - unthrottled: everything at once; a refused call sleeps its Retry-After and tries again;
//! - fixed delay: one call every (largest call's tokens ÷ tokens per second) seconds;
//! - tollgate: everything at once through `#[tollgate::limit]`.
//!
//! ```text
//! cargo run --release --example provider
//! ```

use std::time::Duration;

use tollgate_testkit::provider::{
    Outcome, Provider, billed_tokens, fixed_delay, unthrottled, with_tollgate, workload,
};

const REQUESTS: u64 = 120;
const TOKENS: u64 = 20_000;
const PERIOD: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() {
    let bodies = workload();
    let total: u64 = bodies.iter().map(billed_tokens).sum();
    let largest = bodies.iter().map(billed_tokens).max().unwrap_or(1);
    let per_second = TOKENS as f64 / PERIOD.as_secs_f64();
    let delay = Duration::from_secs_f64(largest as f64 / per_second);
    println!(
        "workload: {} calls, {total} tokens billed (largest {largest}); limits {REQUESTS} requests and {TOKENS} tokens per {PERIOD:?}",
        bodies.len()
    );

    // A fresh stand-in (full buckets) for each client, so that none pays for another's calls.
    let server = Provider::start(REQUESTS, TOKENS, PERIOD).await;
    let raw = unthrottled(server.addr, &bodies).await;
    let server = Provider::start(REQUESTS, TOKENS, PERIOD).await;
    let fixed = fixed_delay(server.addr, &bodies, delay).await;
    let server = Provider::start(REQUESTS, TOKENS, PERIOD).await;
    let paced = with_tollgate(server.addr, &bodies).await;

    println!();
    println!(
        "{:<22} {:>6} {:>6} {:>8} {:>9}",
        "client", "calls", "429s", "retries", "wall (s)"
    );
    let row = |name: &str, o: &Outcome| {
        println!(
            "{name:<22} {:>6} {:>6} {:>8} {:>9.1}",
            o.calls, o.refused, o.retries, o.seconds
        );
    };
    row("unthrottled", &raw);
    row(&format!("fixed delay {:.2} s", delay.as_secs_f64()), &fixed);
    row("tollgate", &paced);
    let ideal = total.saturating_sub(TOKENS) as f64 / per_second;
    println!("ideal (burst, then the refill rate): {ideal:.1} s");
    println!();
    println!(
        "provider: tollgate {} calls, {} 429s, {:.1} s; fixed delay {} 429s, {:.1} s; unthrottled {} 429s, {:.1} s",
        paced.calls,
        paced.refused,
        paced.seconds,
        fixed.refused,
        fixed.seconds,
        raw.refused,
        raw.seconds
    );
}
