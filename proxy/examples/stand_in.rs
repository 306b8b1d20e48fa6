//! The provider stand-in of the tests as a program, to try the proxy without a provider:
//!
//! ```sh
//! cargo run -p tollgate-proxy --example stand_in            # OpenAI-style, 60 requests and
//!                                                          # 20,000 tokens per 10 s
//! cargo run -p tollgate-proxy --example stand_in anthropic  # Anthropic-style
//! cargo run -p tollgate-proxy --example stand_in openai 30 10000 10   # 30 requests and
//!                                                          # 10,000 tokens per 10 s
//! tollgate-proxy --upstream http://127.0.0.1:PORT --profile openai --requests 60/10s --tokens 20000/10s
//! ```
//!
//! It prints its address, then serves until Ctrl-C, and prints what it saw.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_testkit::provider::{Options, Provider};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: u64| {
        args.get(i).map_or(default, |a| {
            a.parse()
                .unwrap_or_else(|_| panic!("`{a}` is not a whole number"))
        })
    };
    let (requests, tokens) = (number(1, 60), number(2, 20_000));
    let period = Duration::from_secs(number(3, 10));
    let options = match args.first().map(String::as_str) {
        Some("anthropic") => Options::anthropic(requests, tokens, 8_000, period),
        _ => Options::openai(requests, tokens, period),
    };
    let stand_in = Provider::start_with(options).await;
    println!("stand-in listening on http://{}", stand_in.addr);
    let _ = tokio::signal::ctrl_c().await;
    let stats = &stand_in.stats;
    println!(
        "stand-in: {} answered, {} refused with 429, {} refused for good",
        stats.ok.load(Ordering::Relaxed),
        stats.refused.load(Ordering::Relaxed),
        stats.permanent.load(Ordering::Relaxed)
    );
}
