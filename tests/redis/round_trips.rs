//! A whole answer's header sync and its call's settlement take one step of the store (issue 30,
//! item 3: at most 3 Redis commands per admitted call with sync): one script call where they
//! took two, with the same windows after it.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde_json::json;
use tollgate::http::{Gate, Profile, Reported};
use tollgate::store::redis::RedisStore;
use tollgate::{Currency, Limits, Registry};
use tollgate_testkit::redis::{RedisServer, client_commands};

fn parts() -> http::request::Parts {
    http::Request::post("http://provider.invalid/v1/chat/completions")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

fn chat(model: &str) -> Vec<u8> {
    json!({"model": model, "max_tokens": 200,
        "messages": [{"role": "user", "content": vec!["word"; 300].join(" ")}]})
    .to_string()
    .into_bytes()
}

/// A day's windows: the refill in the test's few milliseconds is far below a token.
fn limits() -> Limits {
    Limits::parse("1000/d", "100000/d").unwrap()
}

/// A gate on the Redis at `url`, with its registry.
async fn gate_on(url: &str) -> (Arc<Registry>, Gate) {
    let store = RedisStore::connect(url).await.unwrap();
    let registry = Arc::new(Registry::new(store));
    let gate = Gate::builder(Profile::openai())
        .limits(limits())
        .registry(Arc::clone(&registry))
        .first_answer_wait(None)
        // No margin below the provider's counts: the windows come to them exactly.
        .model_spending_elsewhere(false)
        .timeout(Some(Duration::from_secs(10)))
        .build()
        .unwrap();
    (registry, gate)
}

async fn tokens_left(registry: &Registry, key: &str) -> i128 {
    let limiter = registry.limiter(key, &limits()).unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    snapshot
        .windows()
        .iter()
        .find(|a| a.currency == Currency::Tokens)
        .unwrap()
        .tokens
        .whole()
}

/// One call on `model` answered with 60,000 tokens left and its usage (330 tokens): the
/// script calls its answer took (the sync and the settlement), with `whole` or not, and what
/// the call was charged.
async fn answer(gate: &Gate, url: &str, model: &str, whole: bool) -> (u64, i128) {
    let mut call = gate.admit(&parts(), &chat(model)).await.unwrap();
    let charged = i128::from(call.cost().unwrap().tokens);
    call.sending();
    if whole {
        call.whole_answer();
    }
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-remaining-tokens", "60000".parse().unwrap());
    headers.insert("x-ratelimit-remaining-requests", "900".parse().unwrap());
    let before = client_commands(url).await.unwrap();
    call.respond(StatusCode::OK, &headers, None).await;
    call.finish(Reported::read(
        br#"{"usage":{"prompt_tokens":290,"completion_tokens":40}}"#,
        false,
    ))
    .await
    .unwrap();
    (client_commands(url).await.unwrap() - before, charged)
}

#[test]
fn a_whole_answers_sync_and_settlement_take_one_script_call_with_the_same_windows() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    tollgate_testkit::runtime().block_on(async {
        let url = server.url();
        let (registry, gate) = gate_on(&url).await;
        // The same call on two keys: its answer in two steps, then in one.
        let (apart, charged) = answer(&gate, &url, "gpt-4o", false).await;
        let (together, _) = answer(&gate, &url, "gpt-4o-mini", true).await;
        assert_eq!((apart, together), (2, 1));
        let (a, b) = (
            tokens_left(&registry, "openai:gpt-4o").await,
            tokens_left(&registry, "openai:gpt-4o-mini").await,
        );
        assert_eq!(a, b);
        // The sync lowered the window to the provider's count; the settlement then gave back
        // what the call was charged beyond its 330 tokens (its reservation of 200 output
        // tokens, and the estimate's margin).
        assert_eq!(a, 60_000 + charged - 330);
    });
}

#[test]
fn a_whole_answer_dropped_before_it_settles_syncs_and_settles_in_the_background() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    tollgate_testkit::runtime().block_on(async {
        let url = server.url();
        let (registry, gate) = gate_on(&url).await;
        let mut call = gate.admit(&parts(), &chat("gpt-4o")).await.unwrap();
        let charged = i128::from(call.cost().unwrap().tokens);
        call.sending();
        call.whole_answer();
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-remaining-tokens", "60000".parse().unwrap());
        call.respond(StatusCode::OK, &headers, None).await;
        // Nothing synced yet: the answer's body was not read.
        assert_eq!(
            tokens_left(&registry, "openai:gpt-4o").await,
            100_000 - charged
        );
        drop(call);
        // The sync went on in the background, and the call kept its charge.
        let mut left = 0;
        for _ in 0..200 {
            left = tokens_left(&registry, "openai:gpt-4o").await;
            if left <= 60_000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(left, 60_000);
    });
}
