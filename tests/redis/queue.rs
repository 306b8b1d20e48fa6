//! The queue after refunds, on Redis (issue 24, item 4): waiters planned against an empty
//! window pass when refunds make room, not at their old due times.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};
use serde_json::json;
use tollgate::http::{Gate, Profile, Reported};
use tollgate::store::redis::RedisStore;
use tollgate::{Limits, Rates, Registry};
use tollgate_testkit::redis::RedisServer;

fn messages(words: usize) -> Vec<u8> {
    json!({"model": "claude-sonnet-4", "max_tokens": 100,
        "messages": [{"role": "user", "content": vec!["word"; words].join(" ")}]})
    .to_string()
    .into_bytes()
}

fn parts() -> http::request::Parts {
    http::Request::post("http://provider.invalid/v1/messages")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

#[test]
fn waiters_planned_on_an_empty_window_pass_when_refunds_come_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    tollgate_testkit::runtime().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let registry = Arc::new(Registry::new(store));
        let limits = Limits::parse("1000/m", "20000/m")
            .unwrap()
            .with_output_tokens("80000/m".parse::<Rates>().unwrap());
        // Estimates charged as they are: the 20 calls fill the window exactly.
        let gate = Gate::builder(Profile::anthropic())
            .limits(limits)
            .estimate_margin(tollgate::Margin::NONE)
            .registry(Arc::clone(&registry))
            .first_answer_wait(None)
            .timeout(Some(Duration::from_secs(120)))
            .build()
            .unwrap();
        let start = Instant::now();
        let mut out = Vec::new();
        for _ in 0..20 {
            let mut call = gate.admit(&parts(), &messages(990)).await.unwrap();
            call.sending();
            out.push(call);
        }
        let waiters: Vec<_> = (0..20)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move {
                    let mut call = gate.admit(&parts(), &messages(880)).await.unwrap();
                    call.sending();
                    Instant::now()
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
        let took = last - start;
        assert!(
            took < Duration::from_millis(1_500),
            "the last waiter passed at {took:?}"
        );
    });
}
