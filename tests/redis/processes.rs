//! Two connections to one server stand for two processes: what one does to a key, the other
//! sees, and their calls wait in one line.

use std::time::{Duration, Instant};

use tollgate::store::redis::RedisStore;
use tollgate::testing;
use tollgate::{Cost, Limiter, Limits};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::runtime;

/// First come, first served across processes: waiters from two processes, arriving in turn,
/// pass in the order they arrived (each takes its ticket before the next arrives: the queue's
/// length in Redis says so).
#[test]
fn waiters_from_two_processes_pass_in_the_order_they_arrived() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let one = RedisStore::connect(&server.url()).await.unwrap();
        let two = RedisStore::connect(&server.url()).await.unwrap();
        // One call every 100 ms: the line forms long before its first passes.
        let limits = Limits::parse("10/s burst 1", "").unwrap();
        let limiters = [
            Limiter::new("in-line", limits.clone(), one.clone()).unwrap(),
            Limiter::new("in-line", limits, two).unwrap(),
        ];
        limiters[0].acquire(Cost::call(0)).await.unwrap();
        let (_, queue) = testing::redis_names(&one, "in-line");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for n in 0..8usize {
            let (limiter, tx) = (limiters[n % 2].clone(), tx.clone());
            waiters.push(tokio::spawn(async move {
                limiter.acquire_timeout(Cost::call(0), None).await.unwrap();
                tx.send(n).unwrap();
            }));
            let asked = Instant::now();
            while server.command(&["ZCARD", &queue]).trim() != format!(":{}", n + 1) {
                assert!(
                    asked.elapsed() < Duration::from_millis(90),
                    "waiter {n} took no ticket: {}",
                    server.command(&["ZCARD", &queue])
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        drop(tx);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        let mut order = Vec::new();
        while let Some(n) = rx.recv().await {
            order.push(n);
        }
        assert_eq!(order, (0..8).collect::<Vec<_>>());
    });
}

#[cfg(feature = "http")]
mod gates {
    use super::*;
    use std::sync::Arc;

    use http::{HeaderMap, StatusCode};
    use serde_json::json;
    use tollgate::http::{Gate, Profile, Reported};
    use tollgate::{Currency, Registry};

    fn gate(store: RedisStore, limits: &Limits) -> Gate {
        Gate::builder(Profile::openai())
            .limits(limits.clone())
            .registry(Arc::new(Registry::new(store)))
            .first_answer_wait(None)
            .model_spending_elsewhere(false)
            .build()
            .unwrap()
    }

    fn chat(words: usize) -> Vec<u8> {
        json!({"model": "gpt-4o", "max_tokens": 100,
            "messages": [{"role": "user", "content": vec!["word"; words].join(" ")}]})
        .to_string()
        .into_bytes()
    }

    fn parts() -> http::request::Parts {
        http::Request::post("http://provider.invalid/v1/chat/completions")
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    /// Whole tokens in the key's token window, as `limiter` sees it.
    async fn tokens<S: tollgate::Store>(limiter: &Limiter<S>) -> i128 {
        limiter
            .snapshot()
            .await
            .unwrap()
            .least(Currency::Tokens)
            .unwrap()
            .whole()
    }

    /// Two gates on two connections (two processes): what one's header sync takes off and
    /// what its settlement gives back, the other's windows show; and the other's call, sent
    /// after the synced one (and more than 250 ms after it), is not read as spending elsewhere.
    #[test]
    fn a_gate_on_redis_shares_its_syncs_and_settlements_with_another_process() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        runtime().block_on(async {
            let one = RedisStore::connect(&server.url()).await.unwrap();
            let two = RedisStore::connect(&server.url()).await.unwrap();
            // Per day: less than a token refills while the test runs.
            let limits = Limits::parse("100/d", "10000/d").unwrap();
            let (gate_one, gate_two) = (gate(one.clone(), &limits), gate(two.clone(), &limits));
            // What the other process reads the key with.
            let seen = Limiter::new("openai:gpt-4o", limits.clone(), two).unwrap();

            let mut a = gate_one.admit(&parts(), &chat(300)).await.unwrap();
            a.sending();
            let cost_a = a.cost().unwrap().tokens;
            assert_eq!(tokens(&seen).await, i128::from(10_000 - cost_a));
            // The other process sends a call of its own, 300 ms later.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut b = gate_two.admit(&parts(), &chat(200)).await.unwrap();
            b.sending();
            let cost_b = b.cost().unwrap().tokens;
            // The provider counted a when it arrived: a neighbour had spent 500.
            let mut headers = HeaderMap::new();
            headers.insert(
                "x-ratelimit-remaining-tokens",
                (10_000 - 500 - cost_a).into(),
            );
            a.respond(StatusCode::OK, &headers, None).await;
            let after_sync = i128::from(10_000 - cost_a - cost_b - 500);
            assert_eq!(tokens(&seen).await, after_sync);
            // a used 20 tokens: the rest of its estimate comes back, for both processes.
            a.finish(Reported::read(
                br#"{"usage":{"prompt_tokens":15,"completion_tokens":5}}"#,
                false,
            ))
            .await
            .unwrap();
            assert_eq!(tokens(&seen).await, after_sync + i128::from(cost_a) - 20);
            drop(b);
        });
    }
}
