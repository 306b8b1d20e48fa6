//! The provider stand-in of the tests as a program, to try the proxy without a provider:
//!
//! ```sh
//! cargo run -p tollgate-proxy --example stand_in            # OpenAI-style, 60 requests and
//!                                                          # 20,000 tokens per 10 s
//! cargo run -p tollgate-proxy --example stand_in anthropic  # Anthropic-style
//! tollgate-proxy --upstream http://127.0.0.1:PORT --profile openai --requests 60/10s --tokens 20000/10s
//! ```
//!
//! It prints its address, then serves until Ctrl-C, and prints what it saw.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_testkit::provider::{Options, Provider};

#[tokio::main]
async fn main() {
    let period = Duration::from_secs(10);
    let options = match std::env::args().nth(1).as_deref() {
        Some("anthropic") => Options::anthropic(60, 20_000, 8_000, period),
        _ => Options::openai(60, 20_000, period),
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
