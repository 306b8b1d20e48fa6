//! `#[tollgate::limit]` at run time, on tokio's paused clock: shared keys, per-host keys, the
//! token cost of the arguments, skipped arguments, output reservations and timeouts.

use std::time::Duration;

use serde::Serialize;
use tollgate::{Limits, Registry};

#[derive(Debug)]
enum AppError {
    Limited(tollgate::Error),
}

impl From<tollgate::Error> for AppError {
    fn from(err: tollgate::Error) -> AppError {
        AppError::Limited(err)
    }
}

fn is_timeout(result: Result<(), AppError>) -> bool {
    matches!(
        result,
        Err(AppError::Limited(tollgate::Error::Timeout { .. }))
    )
}

async fn tokens_left(key: &str, requests: &str, tokens: &str) -> i128 {
    let limits = Limits::parse(requests, tokens).unwrap();
    let limiter = Registry::global().limiter(key, &limits).unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    snapshot
        .windows()
        .iter()
        .find(|a| a.currency == tollgate::Currency::Tokens)
        .map(|a| a.tokens.whole())
        .unwrap()
}

#[tollgate::limit(key = "behaviour-shared", requests = "2/m", timeout = "1s")]
async fn search(_query: &str) -> Result<(), AppError> {
    Ok(())
}

#[tollgate::limit(key = "behaviour-shared", requests = "2/m", timeout = "1s")]
async fn lookup(_id: u64) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn two_functions_with_one_key_share_the_buckets() {
    search("rivers").await.unwrap();
    lookup(7).await.unwrap();
    // Both requests of the minute are spent, whichever function asks next.
    assert!(is_timeout(search("lakes").await));
    assert!(is_timeout(lookup(8).await));
    tokio::time::advance(Duration::from_secs(30)).await;
    lookup(9).await.unwrap();
}

fn host(url: &str) -> &str {
    url.split('/').next().unwrap_or(url)
}

#[tollgate::limit(key = format!("behaviour-scrape:{}", host(url)), requests = "1/m", timeout = "1s")]
async fn fetch(url: &str) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_per_host_key_keeps_hosts_apart() {
    fetch("a.example/one").await.unwrap();
    fetch("b.example/one").await.unwrap();
    assert!(is_timeout(fetch("a.example/two").await));
    assert!(is_timeout(fetch("b.example/two").await));
    fetch("c.example/one").await.unwrap();
}

#[derive(Serialize, Clone)]
struct Message {
    role: String,
    content: String,
}

/// Not `Serialize`: skipped without the user doing anything.
struct Client {
    _secret: &'static str,
}

#[tollgate::limit(
    key = "behaviour-chat",
    requests = "500/m",
    tokens = "100000/m",
    estimator = "openai"
)]
async fn chat(client: &Client, messages: &[Message], temperature: f32) -> Result<usize, AppError> {
    let _ = (client, temperature);
    Ok(messages.len())
}

fn conversation() -> Vec<Message> {
    vec![
        Message {
            role: "system".into(),
            content: "You answer in one sentence.".into(),
        },
        Message {
            role: "user".into(),
            content: "Why do rate limits exist?".into(),
        },
    ]
}

#[tokio::test(start_paused = true)]
async fn the_token_cost_is_the_estimate_of_the_arguments() {
    let messages = conversation();
    let client = Client { _secret: "sk-..." };
    assert_eq!(chat(&client, &messages, 0.2).await.unwrap(), 2);
    // Counted independently, by tiktoken-rs's num_tokens_from_messages: 3 a message, its role
    // and its content, and 3 for the reply's priming.
    let expected =
        tollgate_testkit::provider::chat_prompt(&serde_json::json!({ "messages": messages }));
    assert_eq!(expected, 3 + 1 + 6 + 3 + 1 + 6 + 3);
    // Charged with the default margin of 3% for the provider's count straying from it (23
    // tokens: 1 more, rounded up), which comes back when the call settles with its usage.
    let left = tokens_left("behaviour-chat", "500/m", "100000/m").await;
    assert_eq!(
        left,
        100_000 - i128::from(tollgate::Margin::DEFAULT.on(expected))
    );
    assert_eq!(tollgate::Margin::DEFAULT.on(expected), expected + 1);
}

#[tollgate::limit(
    key = "behaviour-reserve",
    tokens = "10000/m",
    estimator = "words",
    tokens_from = [prompt],
    reserve_output = max_tokens
)]
async fn complete(prompt: &str, max_tokens: u32, _note: &str) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn tokens_from_and_an_explicit_reservation() {
    // "three short words" is 3 tokens by the words rule; the note is not counted.
    complete(
        "three short words",
        500,
        "a note that is not counted at all",
    )
    .await
    .unwrap();
    assert_eq!(
        tokens_left("behaviour-reserve", "", "10000/m").await,
        10_000 - 503
    );
}

#[tollgate::limit(
    key = "behaviour-body",
    tokens = "10000/m",
    estimator = "words",
    reserve_output
)]
async fn send(body: serde_json::Value) -> Result<(), AppError> {
    let _ = body;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_request_body_reserves_its_output() {
    let body = serde_json::json!({
        "model": "gpt-4o",
        "max_tokens": 200,
        "n": 2,
        "messages": [{"role": "user", "content": "Hello there"}]
    });
    send(body).await.unwrap();
    // 3 + "user" 1 + "Hello there" 2 + 3 priming = 9, plus 200 × 2 reserved.
    assert_eq!(
        tokens_left("behaviour-body", "", "10000/m").await,
        10_000 - 409
    );
}

#[tollgate::limit(key = "behaviour-big", tokens = "100/m", estimator = "words")]
async fn too_big(text: String) -> Result<(), AppError> {
    let _ = text;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_cost_above_capacity_comes_back_through_the_error_type() {
    let result = too_big("word ".repeat(500)).await;
    assert!(
        matches!(
            result,
            Err(AppError::Limited(tollgate::Error::CostExceedsCapacity {
                cost: 500,
                capacity: 100,
                ..
            }))
        ),
        "{result:?}"
    );
}

#[tollgate::limit(key = "behaviour-conflict", requests = "5/m")]
async fn first_limits() -> Result<(), AppError> {
    Ok(())
}

#[tollgate::limit(key = "behaviour-conflict", requests = "6/m")]
async fn second_limits() -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn different_limits_for_one_key_are_an_error_at_the_first_call() {
    first_limits().await.unwrap();
    match second_limits().await {
        Err(AppError::Limited(err @ tollgate::Error::ConflictingLimits { .. })) => {
            assert!(err.to_string().contains("requests 5/m"), "{err}");
            assert!(err.to_string().contains("requests 6/m"), "{err}");
        }
        other => panic!("expected ConflictingLimits, got {other:?}"),
    }
}

struct Agent {
    calls: u32,
}

impl Agent {
    #[tollgate::limit(key = format!("behaviour-agent-{}", self.calls / 100), requests = "1/s", timeout = "none")]
    async fn step(&mut self, prompt: &str) -> Result<u32, AppError> {
        let _ = prompt;
        self.calls += 1;
        Ok(self.calls)
    }
}

#[tokio::test(start_paused = true)]
async fn methods_wait_their_turn_without_a_deadline() {
    let mut agent = Agent { calls: 0 };
    let start = tokio::time::Instant::now();
    for _ in 0..3 {
        agent.step("go").await.unwrap();
    }
    // 1/s: the first at once, then one a second.
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert!(waited < Duration::from_millis(2100), "{waited:?}");
}

pub struct Reply {
    pub text: String,
    pub used: u64,
}

#[tollgate::limit(key = "behaviour-settle", tokens = "1000/m", estimator = "words", settle = |reply| reply.used)]
async fn answer(prompt: &str, used: u64) -> Result<Reply, AppError> {
    Ok(Reply {
        text: prompt.to_owned(),
        used,
    })
}

#[tokio::test(start_paused = true)]
async fn the_body_settles_its_permit_with_the_usage_it_reports() {
    // "one two three" costs 3 by the words rule (the number is skipped: not text); the reply
    // says 120 were used, so 117 more are charged, and 1000 - 120 are left.
    assert_eq!(
        answer("one two three", 120).await.unwrap().text,
        "one two three"
    );
    assert_eq!(tokens_left("behaviour-settle", "", "1000/m").await, 880);
    // An overestimate is refunded: 3 charged, 1 used.
    answer("one two three", 1).await.unwrap();
    assert_eq!(tokens_left("behaviour-settle", "", "1000/m").await, 879);
}

#[tollgate::limit(
    key = "behaviour-output",
    requests = "50/m",
    tokens = "4000/m",
    output_tokens = "2000/m",
    estimator = "words",
    reserve_output = max_tokens
)]
async fn messages(prompt: &str, max_tokens: u32) -> Result<(), AppError> {
    let _ = (prompt, max_tokens);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn with_output_windows_the_reservation_goes_to_them() {
    messages("four words of prompt", 1024).await.unwrap();
    let limits = Limits::parse("50/m", "4000/m")
        .unwrap()
        .with_output_tokens("2000/m".parse::<tollgate::Rates>().unwrap());
    let limiter = Registry::global()
        .limiter("behaviour-output", &limits)
        .unwrap();
    let left: Vec<i128> = limiter
        .snapshot()
        .await
        .unwrap()
        .windows()
        .iter()
        .map(|a| a.tokens.whole())
        .collect();
    // One request; the prompt's 5 tokens from the input window (by the words rule, 1 per 5
    // letters: "prompt" is 2); the 1,024 reserved from the output window.
    assert_eq!(left, vec![49, 3995, 976]);
}
