//! The reqwest-middleware adapter, with a real reqwest client and middleware chain against the
//! provider stand-in: Anthropic's messages with separate output limits, streamed and not; a
//! spend-limit 429; transient 429s retried by the gate; and a retry middleware placed before
//! the gate, whose every attempt pays its toll.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use serde_json::{Value, json};
use tollgate::http::reqwest_middleware::GateMiddleware;
use tollgate::http::{Gate, PermanentRefusal, Profile};
use tollgate::{Currency, Limits, MemoryStore, Rate, Registry};
use tollgate_testkit::provider::{Options, Provider, anthropic_input};

const DAY: Duration = Duration::from_secs(86_400);

fn completion(prompt: u64, reserved: u64) -> u64 {
    reserved.min(10 + prompt % 40)
}

fn message(words: usize, max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": max_tokens,
        "stream": stream,
        "system": "Answer in one line.",
        "messages": [{"role": "user", "content": vec!["tollgate"; words].join(" ")}],
    })
}

struct Setup {
    provider: Provider,
    registry: Arc<Registry>,
    limits: Limits,
    through_gate: Arc<AtomicU64>,
}

impl Setup {
    async fn new(options: Options, limits: Limits) -> Setup {
        Setup {
            provider: Provider::start_with(options).await,
            registry: Arc::new(Registry::new(MemoryStore::new())),
            limits,
            through_gate: Arc::new(AtomicU64::new(0)),
        }
    }

    fn gate(&self, retries: u32) -> GateMiddleware {
        let counter = Arc::clone(&self.through_gate);
        GateMiddleware::new(
            Gate::builder(Profile::anthropic())
                .limits(self.limits.clone())
                .registry(Arc::clone(&self.registry))
                .retries(retries)
                .key(move |_, _| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    "anthropic".to_owned()
                })
                .build()
                .unwrap(),
        )
    }

    fn client(&self) -> ClientWithMiddleware {
        ClientBuilder::new(reqwest::Client::new())
            .with(self.gate(2))
            .build()
    }

    async fn send(
        &self,
        client: &ClientWithMiddleware,
        body: &Value,
    ) -> reqwest_middleware::Result<(u16, String)> {
        let response = client
            .post(format!("{}/messages", self.provider.base_url()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.text().await?))
    }

    async fn left(&self, currency: Currency) -> i128 {
        let limiter = self.registry.limiter("anthropic", &self.limits).unwrap();
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

fn anthropic_limits() -> Limits {
    Limits::new(
        Rate::new(1_000, DAY).unwrap(),
        Rate::new(10_000, DAY).unwrap(),
    )
    .with_output_tokens(Rate::new(4_000, DAY).unwrap())
}

#[tokio::test]
async fn messages_settle_input_and_output_apart_streamed_or_not() {
    for stream in [false, true] {
        let s = Setup::new(
            Options::anthropic(1_000, 10_000, 4_000, DAY).exact(),
            anthropic_limits(),
        )
        .await;
        let body = message(80, 600, stream);
        let (status, text) = s.send(&s.client(), &body).await.unwrap();
        assert_eq!(status, 200, "{text}");
        let input = anthropic_input(&body);
        let output = completion(input, 600);
        assert_eq!(
            s.left(Currency::OutputTokens).await,
            4_000 - i128::from(output),
            "stream: {stream}"
        );
        // The estimate, counted independently: tiktoken-rs's num_tokens_from_messages.
        let estimate = tollgate_testkit::provider::chat_prompt(&body);
        assert_eq!(
            s.left(Currency::Tokens).await,
            10_000 - i128::from(estimate.min(input)),
            "stream: {stream}"
        );
    }
}

#[tokio::test]
async fn a_spend_limit_429_fails_at_once() {
    let s = Setup::new(
        Options::anthropic(1_000, 10_000, 4_000, DAY).permanent(),
        anthropic_limits(),
    )
    .await;
    let err = s
        .send(&s.client(), &message(5, 10, false))
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(inner) = &err else {
        panic!("not the middleware's error: {err:?}");
    };
    assert!(
        inner.downcast_ref::<PermanentRefusal>().is_some(),
        "{inner}"
    );
    assert_eq!(s.provider.stats.permanent.load(Ordering::Relaxed), 1);
    assert_eq!(s.through_gate.load(Ordering::Relaxed), 1);
}

/// Every attempt the gate retries pays its toll again: the key admitted exactly as many
/// calls as the provider saw, and the request was read (its key found) once however often it
/// was sent.
#[test]
fn transient_429s_are_retried_by_the_gate() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (sent, read) = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let s = Setup::new(
                Options::anthropic(1, 1_000_000, 1_000_000, Duration::from_secs(1)),
                Limits::parse("100/s", "1000000/m").unwrap(),
            )
            .await;
            let client = s.client();
            let body = message(5, 10, false);
            let (a, b) = tokio::join!(s.send(&client, &body), s.send(&client, &body));
            assert_eq!(a.unwrap().0, 200);
            assert_eq!(b.unwrap().0, 200);
            let stats = &s.provider.stats;
            assert!(stats.refused.load(Ordering::Relaxed) >= 1);
            let sent = stats.ok.load(Ordering::Relaxed) + stats.refused.load(Ordering::Relaxed);
            (sent, s.through_gate.load(Ordering::Relaxed))
        })
    });
    let admitted: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == "tollgate_calls_admitted_total")
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(admitted, sent);
    assert_eq!(read, 2);
}

/// A minimal retry middleware: sends again after each 429, up to three times.
struct RetryOn429;

#[async_trait::async_trait]
impl Middleware for RetryOn429 {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut attempt = 0;
        loop {
            let again = request.try_clone().expect("a body that can be sent again");
            let response = next.clone().run(again, extensions).await?;
            if response.status() != 429 || attempt == 3 {
                return Ok(response);
            }
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(1_100)).await;
        }
    }
}

#[tokio::test]
async fn a_retry_middleware_before_the_gate_pays_a_toll_for_every_attempt() {
    let s = Setup::new(
        Options::anthropic(1, 1_000_000, 1_000_000, Duration::from_secs(1)),
        Limits::parse("100/s", "1000000/m").unwrap(),
    )
    .await;
    // Added first, so it runs first: the gate is between it and the network.
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryOn429)
        .with(s.gate(0))
        .build();
    let body = message(5, 10, false);
    let (a, b) = tokio::join!(s.send(&client, &body), s.send(&client, &body));
    assert_eq!(a.unwrap().0, 200);
    assert_eq!(b.unwrap().0, 200);
    let stats = &s.provider.stats;
    assert!(stats.refused.load(Ordering::Relaxed) >= 1);
    let sent = stats.ok.load(Ordering::Relaxed) + stats.refused.load(Ordering::Relaxed);
    assert_eq!(s.through_gate.load(Ordering::Relaxed), sent);
}
