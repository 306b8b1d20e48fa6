//! A shared quota: the provider stand-in enforces 120 requests and 20,000 tokens per 10 s,
//! and a neighbour (another program on the same organization's quota) spends a steady 30% of
//! the tokens outside tollgate. Our agent sends its 60 chat calls at once through the
//! async-openai client with the tollgate layer, settling every call from its usage: once with
//! header sync (the `x-ratelimit-remaining-*` headers lower the windows) and once without.
//!
//! ```text
//! cargo run --release --features async-openai --example neighbour
//! ```
//!
//! It ends with one line: `neighbour: with sync N 429s in X s; without sync M 429s in Y s;
//! ideal Z s`, where the ideal is the agent's tokens beyond the burst at the 70% of the refill
//! rate the neighbour leaves it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::middleware::ReqwestService;
use async_openai::types::chat::CreateChatCompletionRequest;
use tollgate::http::async_openai::GateLayer;
use tollgate::http::{Gate, Profile};
use tollgate::{Limits, MemoryStore, Registry};
use tollgate_testkit::provider::{Options, Provider, chat_prompt, workload};

const REQUESTS: u64 = 120;
const TOKENS: u64 = 20_000;
const PERIOD: Duration = Duration::from_secs(10);
/// The neighbour's share of the token rate.
const SHARE: f64 = 0.3;

/// One run: a fresh stand-in and neighbour, the 60 calls at once; answers the agent's 429s
/// and how long its calls took.
async fn run(sync: bool) -> (u64, f64) {
    let provider = Arc::new(Provider::start_with(Options::openai(REQUESTS, TOKENS, PERIOD)).await);
    // The neighbour: every 50 ms it spends another slice of its share, whatever the agent
    // does (what doesn't fit is paid from the refill before the agent gets any).
    let neighbour = {
        let provider = Arc::clone(&provider);
        tokio::spawn(async move {
            let per_tick = TOKENS as f64 / PERIOD.as_secs_f64() * SHARE * 0.05;
            let mut owed = 0.0;
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tick.tick().await;
                owed += per_tick;
                let whole = owed.floor();
                owed -= whole;
                provider.spend_always(whole as u64);
            }
        })
    };
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(Profile::openai())
        .limits(Limits::parse("120/10s", "20000/10s").expect("valid limits"))
        .registry(registry)
        .sync(sync)
        .retries(10)
        .build()
        .expect("a gate");
    let service = tower::ServiceBuilder::new()
        .layer(GateLayer::new(gate))
        .service(ReqwestService::new(reqwest::Client::new()));
    let config = OpenAIConfig::new()
        .with_api_base(provider.base_url())
        .with_api_key("sk-demo");
    let client = Client::with_config(config).with_http_service(service);

    let start = Instant::now();
    let calls: Vec<_> = workload()
        .into_iter()
        .map(|body| {
            let client = client.clone();
            let request: CreateChatCompletionRequest =
                serde_json::from_value(body).expect("a chat request");
            tokio::spawn(async move { client.chat().create(request).await })
        })
        .collect();
    for call in calls {
        call.await
            .expect("the call's task")
            .expect("every call passes in the end");
    }
    let seconds = start.elapsed().as_secs_f64();
    neighbour.abort();
    (provider.stats.refused.load(Ordering::Relaxed), seconds)
}

#[tokio::main]
async fn main() {
    // What the agent's calls cost net (prompt plus what the stand-in's model writes), and the
    // ideal: beyond the burst, at the 70% of the refill rate the neighbour leaves.
    let net: u64 = workload()
        .iter()
        .map(|body| {
            let prompt = chat_prompt(body);
            prompt + 100u64.min(10 + prompt % 40)
        })
        .sum();
    let rate = TOKENS as f64 / PERIOD.as_secs_f64() * (1.0 - SHARE);
    let ideal = net.saturating_sub(TOKENS) as f64 / rate;
    let (synced_429s, synced) = run(true).await;
    println!("with sync: {synced_429s} 429s in {synced:.1} s");
    let (blind_429s, blind) = run(false).await;
    println!("without sync: {blind_429s} 429s in {blind:.1} s");
    println!(
        "neighbour: with sync {synced_429s} 429s in {synced:.1} s; without sync {blind_429s} 429s in {blind:.1} s; ideal {ideal:.1} s"
    );
}
