//! The async-openai adapter, with the real async-openai client pointed at the provider
//! stand-in through `api_base`: chat and embeddings, streamed and not, settled from their
//! usage; a permanent 429; and where the layer goes beside async-openai's own retry layer.
//! Limits are per day, so levels can be asserted exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::ReqwestService;
use async_openai::middleware::retry::OpenAIRetryLayer;
use async_openai::types::chat::{
    ChatCompletionRequestSystemMessage, ChatCompletionRequestUserMessage,
    ChatCompletionStreamOptions, CreateChatCompletionRequest, CreateChatCompletionRequestArgs,
};
use async_openai::types::embeddings::CreateEmbeddingRequestArgs;
use futures_util::StreamExt;
use tollgate::http::async_openai::GateLayer;
use tollgate::http::{Gate, PermanentRefusal, Profile};
use tollgate::{Currency, Limits, MemoryStore, Rate, Registry};
use tollgate_testkit::provider::{Options, Provider, chat_prompt, embedding_input};
use tower::ServiceBuilder;

const DAY: Duration = Duration::from_secs(86_400);

fn per_day(requests: u64, tokens: u64) -> Limits {
    Limits::new(
        Rate::new(requests, DAY).unwrap(),
        Rate::new(tokens, DAY).unwrap(),
    )
}

fn completion(prompt: u64, reserved: u64) -> u64 {
    reserved.min(10 + prompt % 40)
}

struct Setup {
    provider: Provider,
    registry: Arc<Registry>,
    /// How many attempts passed through the gate (its key function runs once for each).
    through_gate: Arc<AtomicU64>,
    limits: Limits,
}

impl Setup {
    async fn new(options: Options, limits: Limits) -> Setup {
        Setup {
            provider: Provider::start_with(options).await,
            registry: Arc::new(Registry::new(MemoryStore::new())),
            through_gate: Arc::new(AtomicU64::new(0)),
            limits,
        }
    }

    fn gate(&self, retries: u32) -> Gate {
        let counter = Arc::clone(&self.through_gate);
        Gate::builder(Profile::openai())
            .limits(self.limits.clone())
            .registry(Arc::clone(&self.registry))
            .retries(retries)
            .key(move |_, _| {
                counter.fetch_add(1, Ordering::Relaxed);
                "openai".to_owned()
            })
            .build()
            .unwrap()
    }

    fn config(&self) -> OpenAIConfig {
        OpenAIConfig::new()
            .with_api_base(self.provider.base_url())
            .with_api_key("sk-test")
    }

    /// A client with the tollgate layer alone (it retries itself).
    fn client(&self) -> Client<OpenAIConfig> {
        let service = ServiceBuilder::new()
            .layer(GateLayer::new(self.gate(2)))
            .service(ReqwestService::new(reqwest::Client::new()));
        Client::with_config(self.config()).with_http_service(service)
    }

    async fn tokens_left(&self) -> i128 {
        let limiter = self.registry.limiter("openai", &self.limits).unwrap();
        let snapshot = limiter.snapshot().await.unwrap();
        snapshot
            .windows()
            .iter()
            .find(|a| a.currency == Currency::Tokens)
            .unwrap()
            .tokens
            .whole()
    }
}

fn chat_request(words: usize, max_tokens: u32) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model("gpt-4o")
        .max_tokens(max_tokens)
        .messages([
            ChatCompletionRequestSystemMessage::from("Answer in one line.").into(),
            ChatCompletionRequestUserMessage::from(vec!["tollgate"; words].join(" ").as_str())
                .into(),
        ])
        .build()
        .unwrap()
}

/// The prompt the stand-in bills for `request`.
fn billed_prompt(request: &CreateChatCompletionRequest) -> u64 {
    chat_prompt(&serde_json::to_value(request).unwrap())
}

#[tokio::test]
async fn a_chat_completion_settles_with_its_usage() {
    let s = Setup::new(
        Options::openai(1_000, 10_000, DAY).exact(),
        per_day(1_000, 10_000),
    )
    .await;
    let request = chat_request(90, 200);
    let prompt = billed_prompt(&request);
    let answer = s.client().chat().create(request).await.unwrap();
    let usage = answer.usage.unwrap();
    assert_eq!(u64::from(usage.prompt_tokens), prompt);
    let used = prompt + completion(prompt, 200);
    assert_eq!(s.tokens_left().await, 10_000 - i128::from(used));
    assert_eq!(s.provider.tokens_left(), 10_000 - used);
}

#[tokio::test]
async fn a_streamed_chat_completion_settles_from_its_last_chunk() {
    let s = Setup::new(
        Options::openai(1_000, 10_000, DAY).exact(),
        per_day(1_000, 10_000),
    )
    .await;
    let mut request = chat_request(60, 300);
    request.stream_options = Some(ChatCompletionStreamOptions {
        include_usage: Some(true),
        ..Default::default()
    });
    let prompt = billed_prompt(&request);
    let mut stream = s.client().chat().create_stream(request).await.unwrap();
    let mut text = String::new();
    let mut usage = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        if let Some(choice) = chunk.choices.first() {
            text += choice.delta.content.as_deref().unwrap_or("");
        }
        usage = usage.or(chunk.usage);
    }
    assert_eq!(text, "ok");
    assert_eq!(u64::from(usage.unwrap().prompt_tokens), prompt);
    let used = prompt + completion(prompt, 300);
    assert_eq!(s.tokens_left().await, 10_000 - i128::from(used));
}

#[tokio::test]
async fn an_embeddings_batch_settles_with_its_usage() {
    let s = Setup::new(
        Options::openai(1_000, 10_000, DAY).exact(),
        per_day(1_000, 10_000),
    )
    .await;
    let inputs = vec![
        "The quick brown fox jumps over the lazy dog.".to_owned(),
        "Rate limits keep agents polite.".to_owned(),
        "tollgate ".repeat(40),
    ];
    let request = CreateEmbeddingRequestArgs::default()
        .model("text-embedding-3-small")
        .input(inputs.clone())
        .build()
        .unwrap();
    let billed = embedding_input(&serde_json::json!({ "input": inputs }));
    let answer = s.client().embeddings().create(request).await.unwrap();
    assert_eq!(answer.data.len(), 3);
    assert_eq!(u64::from(answer.usage.prompt_tokens), billed);
    assert_eq!(s.tokens_left().await, 10_000 - i128::from(billed));
}

#[tokio::test]
async fn a_spent_quota_fails_at_once_with_an_error_that_says_so() {
    let s = Setup::new(
        Options::openai(1_000, 10_000, DAY).permanent(),
        per_day(1_000, 10_000),
    )
    .await;
    let err = s
        .client()
        .chat()
        .create(chat_request(5, 10))
        .await
        .unwrap_err();
    let OpenAIError::Boxed(inner) = &err else {
        panic!("not the layer's error: {err:?}");
    };
    let refusal = inner
        .downcast_ref::<PermanentRefusal>()
        .unwrap_or_else(|| panic!("not a permanent refusal: {inner}"));
    assert_eq!(refusal.code.as_deref(), Some("insufficient_quota"));
    assert_eq!(s.provider.stats.permanent.load(Ordering::Relaxed), 1);
}

/// Sends `calls` chat requests at once through `client`; answers how many succeeded.
async fn burst(client: &Client<OpenAIConfig>, calls: usize) -> usize {
    let tasks: Vec<_> = (0..calls)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.chat().create(chat_request(5, 10)).await })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        ok += usize::from(task.await.unwrap().is_ok());
    }
    ok
}

#[tokio::test]
async fn every_attempt_of_async_openais_retry_layer_passes_through_the_gate_inside_it() {
    // The provider takes one request a second; tollgate was told far more, so the provider
    // refuses and async-openai's retry layer (outside the gate) sends again.
    let s = Setup::new(
        Options::openai(1, 1_000_000, Duration::from_secs(1)),
        Limits::parse("100/s", "1000000/m").unwrap(),
    )
    .await;
    let service = ServiceBuilder::new()
        .layer(OpenAIRetryLayer::new(3))
        .layer(GateLayer::new(s.gate(0)))
        .service(ReqwestService::new(reqwest::Client::new()));
    let client = Client::with_config(s.config()).with_http_service(service);
    assert_eq!(burst(&client, 2).await, 2);
    let stats = &s.provider.stats;
    let sent = stats.ok.load(Ordering::Relaxed) + stats.refused.load(Ordering::Relaxed);
    assert!(
        stats.refused.load(Ordering::Relaxed) >= 1,
        "the provider never refused"
    );
    // Every attempt the provider saw paid its toll.
    assert_eq!(s.through_gate.load(Ordering::Relaxed), sent);
}

#[tokio::test]
async fn a_retry_layer_inside_the_gate_sends_attempts_the_gate_never_sees() {
    // The wrong order, to show what the docs warn of.
    let s = Setup::new(
        Options::openai(1, 1_000_000, Duration::from_secs(1)),
        Limits::parse("100/s", "1000000/m").unwrap(),
    )
    .await;
    let service = ServiceBuilder::new()
        .layer(GateLayer::new(s.gate(0)))
        .layer(OpenAIRetryLayer::new(3))
        .service(ReqwestService::new(reqwest::Client::new()));
    let client = Client::with_config(s.config()).with_http_service(service);
    assert_eq!(burst(&client, 2).await, 2);
    let stats = &s.provider.stats;
    let sent = stats.ok.load(Ordering::Relaxed) + stats.refused.load(Ordering::Relaxed);
    assert!(s.through_gate.load(Ordering::Relaxed) < sent);
}
