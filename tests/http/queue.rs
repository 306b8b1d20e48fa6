//! The queue after refunds and pauses (issue 24, item 4): a waiter passes once every window can
//! pay for it and the key's pause is over, however the refunds and the pause came.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde_json::json;
use tollgate::http::{Gate, Profile, Reported};
use tollgate::{Limits, MemoryStore, Rates, Registry};

fn messages(words: usize, max_tokens: u64) -> Vec<u8> {
    json!({"model": "claude-sonnet-4", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": vec!["word"; words].join(" ")}]})
    .to_string()
    .into_bytes()
}

fn anthropic_parts() -> http::request::Parts {
    http::Request::post("http://provider.invalid/v1/messages")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

/// Anthropic-shaped: 19 calls drain the input window and settle at 100 tokens each after a
/// 1 s pause; 20 waiters of about 900 tokens queue behind them. The refunds make room for all
/// but the last of them at the pause's end; the rest of the input window refills at 333 a
/// second (the refused call keeps its charge: a 429 never raises a window), and the output
/// window holds what the refused call needed when the pause ends, then refills 1,333 a second.
/// The last waiter passes at 2.75 s (it passed at 23.2 s when waiters did not follow refunds).
#[tokio::test(start_paused = true)]
async fn waiters_pass_once_refunds_and_the_pause_allow() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = Limits::parse("1000/m", "20000/m")
        .unwrap()
        .with_output_tokens("80000/m".parse::<Rates>().unwrap());
    let gate = Gate::builder(Profile::anthropic())
        .limits(limits)
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .first_answer_wait(None)
        .timeout(Some(Duration::from_secs(60)))
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut out = Vec::new();
    for _ in 0..19 {
        let mut call = gate
            .admit(&anthropic_parts(), &messages(1_000, 100))
            .await
            .unwrap();
        call.sending();
        out.push(call);
    }
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut call = gate
                    .admit(&anthropic_parts(), &messages(880, 100))
                    .await
                    .unwrap();
                call.sending();
                tokio::time::Instant::now()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The provider pauses the key for a second (a 429 for one of them), then the 19 answer.
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", "1".parse().unwrap());
    let mut refused = out.pop().unwrap();
    refused
        .respond(
            StatusCode::TOO_MANY_REQUESTS,
            &headers,
            Some(br#"{"type":"error","error":{"type":"rate_limit_error","message":"... output tokens per minute"}}"#),
        )
        .await;
    drop(refused);
    for mut call in out {
        call.respond(StatusCode::OK, &HeaderMap::new(), None).await;
        call.finish(Reported::read(
            br#"{"usage":{"input_tokens":100,"output_tokens":50}}"#,
            false,
        ))
        .await
        .unwrap();
    }
    let mut last = start;
    for waiter in waiters {
        last = last.max(waiter.await.unwrap());
    }
    let took = last - start;
    assert_eq!(
        took,
        Duration::from_millis(2_750),
        "the last waiter passed at {took:?}"
    );
}

/// Without a pause: 20 calls drain the window, their answers come after 1 s and settle far
/// below their estimates; the 20 waiters behind them pass at that second, not at the times
/// they were planned for when the window was empty (over a minute away at the back).
#[tokio::test(start_paused = true)]
async fn waiters_planned_on_an_empty_window_pass_when_refunds_come() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = Limits::parse("1000/m", "20000/m")
        .unwrap()
        .with_output_tokens("80000/m".parse::<Rates>().unwrap());
    let gate = Gate::builder(Profile::anthropic())
        .limits(limits)
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .first_answer_wait(None)
        .timeout(Some(Duration::from_secs(120)))
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut out = Vec::new();
    for _ in 0..20 {
        let mut call = gate
            .admit(&anthropic_parts(), &messages(990, 100))
            .await
            .unwrap();
        call.sending();
        out.push(call);
    }
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut call = gate
                    .admit(&anthropic_parts(), &messages(880, 100))
                    .await
                    .unwrap();
                call.sending();
                tokio::time::Instant::now()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for mut call in out {
        call.respond(StatusCode::OK, &HeaderMap::new(), None).await;
        call.finish(Reported::read(
            br#"{"usage":{"input_tokens":100,"output_tokens":50}}"#,
            false,
        ))
        .await
        .unwrap();
    }
    let mut last = start;
    for waiter in waiters {
        last = last.max(waiter.await.unwrap());
    }
    // 20 refunds of about 900 tokens make room for the 20 waiters at once.
    assert_eq!(last - start, Duration::from_secs(1));
}
