//! The tower layer in front of a real client (hyper-util's), against the provider stand-in:
//! usage settled from plain and streamed bodies, header sync with a neighbour spending from
//! the same quota, final and transient 429s. Limits are per day, so that the windows refill
//! by less than a token while a test runs, and levels can be asserted exactly.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tollgate::http::tower::{BoxError, GateLayer};
use tollgate::http::{Gate, PermanentRefusal, Profile};
use tollgate::{Currency, Limits, MemoryStore, Registry};
use tollgate_testkit::provider::{Options, Provider, anthropic_input, chat_prompt};
use tower::{ServiceBuilder, ServiceExt};

const DAY: Duration = Duration::from_secs(86_400);

/// Requests and tokens per day.
fn per_day(requests: u64, tokens: u64) -> Limits {
    Limits::new(
        tollgate::Rate::new(requests, DAY).unwrap(),
        tollgate::Rate::new(tokens, DAY).unwrap(),
    )
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn chat(words: usize, max_tokens: u64) -> Value {
    json!({
        "model": "gpt-4o",
        "max_tokens": max_tokens,
        "messages": [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": vec!["tollgate"; words].join(" ")}
        ],
    })
}

/// What the stand-in's model writes for a prompt (its rule, repeated here).
fn completion(prompt: u64, reserved: u64) -> u64 {
    reserved.min(10 + prompt % 40)
}

struct Setup {
    provider: Provider,
    registry: Arc<Registry>,
    gate: Gate,
}

async fn setup(options: Options, profile: Profile, limits: &Limits) -> Setup {
    let provider = Provider::start_with(options).await;
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(profile)
        .limits(limits.clone())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .retries(2)
        .build()
        .unwrap();
    Setup {
        provider,
        registry,
        gate,
    }
}

impl Setup {
    /// Sends `body` to `path` through the layer; answers the status and the body read whole.
    async fn send(&self, path: &str, body: &Value) -> Result<(u16, String), BoxError> {
        let service = ServiceBuilder::new()
            .layer(GateLayer::new(self.gate.clone()))
            .service(client());
        let request = http::Request::post(format!("{}{path}", self.provider.base_url()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = service.oneshot(request).await?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    async fn left(&self, key: &str, limits: &Limits, currency: Currency) -> i128 {
        let limiter = self.registry.limiter(key, limits).unwrap();
        let snapshot = limiter.snapshot().await.unwrap();
        snapshot
            .windows()
            .iter()
            .find(|a| a.currency == currency)
            .unwrap()
            .tokens
            .whole()
    }
}

#[tokio::test]
async fn a_plain_answer_settles_the_call_with_its_usage() {
    let limits = per_day(1_000, 10_000);
    let s = setup(
        Options::openai(1_000, 10_000, DAY).exact(),
        Profile::openai(),
        &limits,
    )
    .await;
    let body = chat(120, 200);
    let (status, text) = s.send("/chat/completions", &body).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let prompt = chat_prompt(&body);
    let used = prompt + completion(prompt, 200);
    // Once the body is read, the windows hold the real usage, here and at the provider.
    assert_eq!(
        s.left("openai:gpt-4o", &limits, Currency::Tokens).await,
        10_000 - i128::from(used)
    );
    assert_eq!(s.provider.tokens_left(), 10_000 - used);
}

#[tokio::test]
async fn a_streamed_answer_settles_from_its_last_chunk() {
    let limits = per_day(1_000, 10_000);
    let s = setup(
        Options::openai(1_000, 10_000, DAY).exact(),
        Profile::openai(),
        &limits,
    )
    .await;
    let mut body = chat(75, 300);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, text) = s.send("/chat/completions", &body).await.unwrap();
    assert_eq!(status, 200);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let prompt = chat_prompt(&body);
    let used = prompt + completion(prompt, 300);
    assert_eq!(
        s.left("openai:gpt-4o", &limits, Currency::Tokens).await,
        10_000 - i128::from(used)
    );
}

#[tokio::test]
async fn a_neighbours_spending_lowers_the_windows_and_a_larger_remaining_never_raises_them() {
    let limits = per_day(1_000, 10_000);
    let s = setup(
        Options::openai(1_000, 10_000, DAY).exact(),
        Profile::openai(),
        &limits,
    )
    .await;
    // Another program spends 3,000 of the quota without tollgate.
    assert!(s.provider.spend(3_000));
    let body = chat(40, 100);
    s.send("/chat/completions", &body).await.unwrap();
    let prompt = chat_prompt(&body);
    let used = prompt + completion(prompt, 100);
    // Down to the provider's count, and 4% of the capacity (400) below it: spending
    // elsewhere is now known to happen, and the model of it is never exact.
    assert_eq!(
        s.left("openai:gpt-4o", &limits, Currency::Tokens).await,
        10_000 - 3_000 - i128::from(used) - 400
    );

    // Configured below the provider: its larger remaining leaves the windows alone.
    let small = per_day(1_000, 5_000);
    let s = setup(
        Options::openai(1_000, 10_000, DAY).exact(),
        Profile::openai(),
        &small,
    )
    .await;
    s.send("/chat/completions", &body).await.unwrap();
    assert_eq!(
        s.left("openai:gpt-4o", &small, Currency::Tokens).await,
        5_000 - i128::from(used)
    );
}

#[tokio::test]
async fn a_permanent_429_fails_at_once_and_is_never_retried() {
    let limits = Limits::parse("1000/d", "10000/d").unwrap();
    for (options, profile, path, code) in [
        (
            Options::openai(1_000, 10_000, DAY).permanent(),
            Profile::openai(),
            "/chat/completions",
            Some("insufficient_quota"),
        ),
        (
            Options::anthropic(1_000, 10_000, 10_000, DAY).permanent(),
            Profile::anthropic(),
            "/messages",
            Some("rate_limit_error"),
        ),
    ] {
        let s = setup(options, profile, &limits).await;
        let err = s.send(path, &chat(10, 10)).await.unwrap_err();
        let refusal = err
            .downcast_ref::<PermanentRefusal>()
            .unwrap_or_else(|| panic!("not a permanent refusal: {err}"));
        assert_eq!(refusal.code.as_deref(), code);
        assert!(err.to_string().contains("retrying will not help"), "{err}");
        assert_eq!(s.provider.stats.permanent.load(Ordering::Relaxed), 1);
    }
}

/// Two calls at once on a provider that allows one request a second: one is refused with a
/// pause, and its retry reaches the provider no sooner than that pause after the refusal, and
/// pays its toll again (every attempt the provider saw was admitted by the gate).
#[tokio::test]
async fn a_transient_429_is_retried_after_the_providers_pause_and_pays_again() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    // This thread's recorder: the test, the layer and the stand-in run on this one thread.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    // The provider allows one request a second; tollgate was told far more.
    let limits = Limits::parse("100/s", "100000/m").unwrap();
    let s = setup(
        Options::openai(1, 100_000, Duration::from_secs(1)),
        Profile::openai(),
        &limits,
    )
    .await;
    let body = chat(5, 10);
    let (a, b) = tokio::join!(
        s.send("/chat/completions", &body),
        s.send("/chat/completions", &body)
    );
    assert_eq!(a.unwrap().0, 200);
    assert_eq!(b.unwrap().0, 200);
    let refused = s.provider.stats.refused.load(Ordering::Relaxed);
    assert!((1..=2).contains(&refused), "{refused} 429s");
    assert_eq!(s.provider.stats.ok.load(Ordering::Relaxed), 2);
    let mut arrivals = s.provider.stats.arrivals.lock().unwrap().clone();
    arrivals.sort();
    assert_eq!(arrivals.len() as u64, 2 + refused, "{arrivals:?}");
    // The last attempt is the last retry: it came after the last refusal's pause.
    let (refused_at, pause) = arrivals
        .iter()
        .rev()
        .find_map(|(at, pause)| pause.map(|p| (*at, p)))
        .unwrap();
    let (retried_at, last) = *arrivals.last().unwrap();
    assert_eq!(last, None, "{arrivals:?}");
    assert!(
        retried_at >= refused_at + pause,
        "refused at {refused_at:?} with a pause of {pause:?}, retried at {retried_at:?}"
    );
    // Each attempt paid its toll: the refused one, and its retry.
    let admitted: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == "tollgate_calls_admitted_total")
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(admitted, 2 + refused);
}

#[tokio::test]
async fn anthropic_output_is_its_own_currency_and_settles_from_the_stream() {
    let limits =
        per_day(1_000, 10_000).with_output_tokens(tollgate::Rate::new(4_000, DAY).unwrap());
    let s = setup(
        Options::anthropic(1_000, 10_000, 4_000, DAY).exact(),
        Profile::anthropic(),
        &limits,
    )
    .await;
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 700,
        "stream": true,
        "system": "Answer in one line.",
        "messages": [{"role": "user", "content": vec!["tollgate"; 60].join(" ")}],
    });
    let (status, text) = s.send("/messages", &body).await.unwrap();
    assert_eq!(status, 200);
    assert!(text.contains("message_stop"), "{text}");
    let input = anthropic_input(&body);
    let output = completion(input, 700);
    let key = "anthropic:claude-sonnet-4-5";
    // The output reservation of 700 came back down to what was written.
    assert_eq!(
        s.left(key, &limits, Currency::OutputTokens).await,
        4_000 - i128::from(output)
    );
    // Input: charged the estimate, settled to the provider's count where that is lower (the
    // headers' rounded remaining lowered nothing).
    // The estimate, counted independently: tiktoken-rs's num_tokens_from_messages.
    let estimate = tollgate_testkit::provider::chat_prompt(&body);
    assert_eq!(
        s.left(key, &limits, Currency::Tokens).await,
        10_000 - i128::from(estimate.min(input))
    );
}
