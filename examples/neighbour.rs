//! A shared quota: the provider stand-in enforces 120 requests and 20,000 tokens per 10 s,
//! and a neighbour (another program on the same organization's quota) spends a steady 30% of
//! the tokens outside tollgate. Our agent sends its 60 chat calls at once through the
//! async-openai client with the tollgate layer, settling every call from its usage: once with
//! header sync (the `x-ratelimit-remaining-*` headers lower the windows) and once without.
//!
//! The stand-in counts a call (and stamps the `remaining` it sends back) when the call arrives,
//! and answers after a latency: at once, after about 0.3 s, and after about 3 s (150 ms plus
//! a time per output token), one line each.
//!
//! ```text
//! cargo run --release --features async-openai --example neighbour           # all three
//! cargo run --release --features async-openai --example neighbour -- '~3 s' # one of them
//! ```
//!
//! Each line: `neighbour, answers ~L: with sync N 429s in X s; without sync M 429s in Y s;
//! ideal Z s`, where the ideal is the best schedule the stand-in allows a client that knows
//! everything, with the neighbour taking its 30% of the refill.

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
use tollgate_testkit::provider::{Options, Provider, chats, ideal_seconds, workload};

const REQUESTS: u64 = 120;
const TOKENS: u64 = 20_000;
const PERIOD: Duration = Duration::from_secs(10);
/// The neighbour's share of the token rate.
const SHARE: f64 = 0.3;

/// One run: a fresh stand-in and neighbour, the 60 calls at once; answers the agent's 429s
/// and how long its calls took.
async fn run(options: Options, sync: bool, share: f64, bodies: &[serde_json::Value]) -> (u64, f64) {
    let provider = Arc::new(Provider::start_with(options).await);
    // The neighbour: every 50 ms it spends another slice of its share, whatever the agent
    // does (what doesn't fit is paid from the refill before the agent gets any).
    let neighbour = {
        let provider = Arc::clone(&provider);
        tokio::spawn(async move {
            let per_tick = TOKENS as f64 / PERIOD.as_secs_f64() * share * 0.05;
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
    let monitor = std::env::var("NEIGHBOUR_DEBUG").is_ok().then(|| {
        let (provider, registry) = (Arc::clone(&provider), Arc::clone(&registry));
        tokio::spawn(async move {
            let started = Instant::now();
            let limits = Limits::parse("120/10s", "20000/10s").expect("valid limits");
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let ours = match registry.limiter("openai:gpt-4o", &limits) {
                    Ok(l) => l
                        .snapshot()
                        .await
                        .ok()
                        .and_then(|s| s.least(tollgate::Currency::Tokens))
                        .map(|t| t.whole()),
                    Err(_) => None,
                };
                eprintln!(
                    "{:.2}s provider {} ours {:?}",
                    started.elapsed().as_secs_f64(),
                    provider.tokens_left(),
                    ours
                );
            }
        })
    });
    let gate = Gate::builder(Profile::openai())
        .limits(Limits::parse("120/10s", "20000/10s").expect("valid limits"))
        .registry(registry)
        .sync(sync)
        .retries(10)
        .timeout(Some(Duration::from_secs(120)))
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
    let calls: Vec<_> = bodies
        .iter()
        .cloned()
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
    if let Some(m) = monitor {
        m.abort();
    }
    if std::env::var("NEIGHBOUR_DEBUG").is_ok() {
        eprintln!(
            "sync {sync}: refused for requests {}, refusals {:?}",
            provider.stats.refused_requests.load(Ordering::Relaxed),
            provider.stats.refusals.lock().unwrap()
        );
    }
    (provider.stats.refused.load(Ordering::Relaxed), seconds)
}

#[tokio::main]
async fn main() {
    let base = Options::openai(REQUESTS, TOKENS, PERIOD);
    let ms = Duration::from_millis;
    let at_once = base.clone().latency(Duration::ZERO, Duration::ZERO);
    let scenarios = [
        ("at once", at_once, SHARE, workload()),
        (
            "~0.3 s",
            base.clone().latency(ms(150), ms(5)),
            SHARE,
            workload(),
        ),
        (
            "~3 s",
            base.clone().latency(ms(150), ms(95)),
            SHARE,
            workload(),
        ),
        // Issue 24's: 80 calls at once, alone on the quota, answers of 150 ms plus 20 ms an
        // output token (up to 100 written: about 3 s at most).
        (
            "~3 s, alone, 80 calls",
            base.clone().latency(ms(150), ms(20)),
            0.0,
            chats(0, 80),
        ),
    ];
    // One scenario alone when named: `at once`, `~0.3 s`, `~3 s` or `~3 s, alone, 80 calls`.
    let only = std::env::args().nth(1).unwrap_or_default();
    for (latency, options, share, bodies) in scenarios {
        if !only.is_empty() && latency != only {
            continue;
        }
        let ideal = ideal_seconds(&bodies, &options, share);
        let (synced_429s, synced) = run(options.clone(), true, share, &bodies).await;
        let (blind_429s, blind) = run(options, false, share, &bodies).await;
        println!(
            "neighbour, answers {latency}: with sync {synced_429s} 429s in {synced:.1} s ({:.2}x without sync, {:.2}x ideal); without sync {blind_429s} 429s in {blind:.1} s; ideal {ideal:.1} s",
            synced / blind,
            synced / ideal
        );
    }
}
