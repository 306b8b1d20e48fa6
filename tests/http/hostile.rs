//! Hostile or odd provider input never widens the gate, a retry never outlives the gate's
//! deadline, and a user can see the loop work (metrics, one warning). Each of these failed
//! before the change that made it pass.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tollgate::http::{Gate, MeteredBody, Profile, Reported, Verdict};
use tollgate::{Currency, Limits, MemoryStore, Registry};

fn parts() -> http::request::Parts {
    http::Request::post("http://provider.invalid/v1/messages")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

fn gate(profile: Profile, limits: Limits, registry: &Arc<Registry>) -> Gate {
    Gate::builder(profile)
        .limits(limits)
        .registry(Arc::clone(registry))
        .first_answer_wait(None)
        .model_spending_elsewhere(false)
        .build()
        .unwrap()
}

fn header_map(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.insert(*name, HeaderValue::from_str(value).unwrap());
    }
    headers
}

async fn least(registry: &Registry, key: &str, limits: &Limits, currency: Currency) -> i128 {
    let limiter = registry.limiter(key, limits).unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    snapshot.least(currency).unwrap().whole()
}

/// Anthropic rounds its token counts to the thousand, not its request counts: 3 requests left
/// is 3, not 502.
#[tokio::test(start_paused = true)]
async fn anthropic_request_counts_are_read_as_they_are() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = Limits::parse("50/m", "40000/m").unwrap();
    let gate = gate(Profile::anthropic(), limits.clone(), &registry);
    let body = json!({"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let mut call = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    call.sending();
    let headers = header_map(&[("anthropic-ratelimit-requests-remaining", "3")]);
    call.respond(StatusCode::OK, &headers, None).await;
    assert_eq!(
        least(&registry, "anthropic:claude", &limits, Currency::Requests).await,
        3
    );
}

/// Bodies serde_json refuses still cost their words, never nothing: nested deeper than it
/// reads, a lone surrogate, a byte-order mark first, a number beyond `f64`.
#[tokio::test(start_paused = true)]
async fn a_body_json_can_not_read_costs_its_words_never_zero() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(
        Profile::openai(),
        Limits::parse("", "1000000/m").unwrap(),
        &registry,
    );
    let text = "please count every one of these words";
    let nested = format!(
        r#"{{"messages":[{{"role":"user","content":"{text}"}}],"metadata":{}{}}}"#,
        "[".repeat(127),
        "]".repeat(127)
    );
    let surrogate = format!(r#"{{"messages":[{{"role":"user","content":"{text} \ud800"}}]}}"#);
    let bom = format!("\u{feff}{{\"messages\":[{{\"role\":\"user\",\"content\":\"{text}\"}}]}}");
    let huge = format!(r#"{{"messages":[{{"role":"user","content":"{text}"}}],"top_p":1e400}}"#);
    for body in [nested, surrogate, bom, huge] {
        assert!(serde_json::from_str::<serde_json::Value>(&body).is_err());
        let call = gate.admit(&parts(), body.as_bytes()).await.unwrap();
        let tokens = call.cost().unwrap().tokens;
        assert!(tokens >= 7, "{tokens} tokens for {body:.60}");
    }
}

/// A limit header of 10^20 is not learned; a first answer with request headers alone teaches
/// the requests, a later one the tokens; a changed limit is learned again.
#[tokio::test(start_paused = true)]
async fn limits_are_learned_per_currency_checked_and_learned_again() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(Profile::openai())
        .limits_from_headers(Duration::from_secs(60))
        .registry(Arc::clone(&registry))
        .build()
        .unwrap();
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let answer = |pairs: &[(&'static str, &str)]| header_map(pairs);
    // Garbage: nothing is learned, and calls still go one at a time.
    let mut first = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    assert_eq!(first.cost(), None);
    first
        .respond(
            StatusCode::OK,
            &answer(&[("x-ratelimit-limit-tokens", "100000000000000000000")]),
            None,
        )
        .await;
    drop(first);
    // Requests alone.
    let mut second = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    assert_eq!(second.cost(), None);
    second
        .respond(
            StatusCode::OK,
            &answer(&[("x-ratelimit-limit-requests", "500")]),
            None,
        )
        .await;
    drop(second);
    let third = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    let limiter = registry
        .limiter("openai:gpt-4o", &Limits::parse("500/m", "").unwrap())
        .unwrap();
    assert_eq!(limiter.limits(), &Limits::parse("500/m", "").unwrap());
    // Then tokens too.
    let mut third = third;
    third.sending();
    third
        .respond(
            StatusCode::OK,
            &answer(&[
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-limit-tokens", "30000"),
            ]),
            None,
        )
        .await;
    let fourth = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    assert!(fourth.cost().unwrap().tokens > 0);
    // The provider raised the requests: learned again.
    let mut fourth = fourth;
    fourth.sending();
    fourth
        .respond(
            StatusCode::OK,
            &answer(&[
                ("x-ratelimit-limit-requests", "900"),
                ("x-ratelimit-limit-tokens", "30000"),
            ]),
            None,
        )
        .await;
    let fifth = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    let learned = Limits::parse("900/m", "30000/m").unwrap();
    let relearned = registry
        .limiter(&format!("openai:gpt-4o@{learned}"), &learned)
        .unwrap();
    assert!(
        relearned
            .snapshot()
            .await
            .unwrap()
            .requests()
            .unwrap()
            .whole()
            < 900
    );
    drop(fifth);
}

/// Learning limits that conflict with another use of the key fails after the provider
/// answered: the answer stands (a 200 is never turned into an error), and the failure is
/// counted in `tollgate_gate_errors_total`, once. (`Verdict::Passed` alone proves nothing:
/// `respond` answers it for every status but a 429.)
#[test]
fn an_error_after_the_provider_answered_never_replaces_the_answer() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let registry = Arc::new(Registry::new(MemoryStore::new()));
            // Another part of the program holds the key with other limits.
            let _other = registry
                .limiter("openai:gpt-4o", &Limits::parse("7/m", "").unwrap())
                .unwrap();
            let gate = Gate::builder(Profile::openai())
                .limits_from_headers(Duration::from_secs(60))
                .registry(Arc::clone(&registry))
                .build()
                .unwrap();
            let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
            let mut call = gate
                .admit(&parts(), body.to_string().as_bytes())
                .await
                .unwrap();
            let headers = header_map(&[("x-ratelimit-limit-requests", "500")]);
            assert_eq!(
                call.respond(StatusCode::OK, &headers, None).await,
                Verdict::Passed
            );
        });
    });
    let errors: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == "tollgate_gate_errors_total")
        .map(|(key, _, _, value)| {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let DebugValue::Counter(n) = value else {
                panic!("tollgate_gate_errors_total is a counter")
            };
            (labels.join(","), n)
        })
        .collect();
    assert_eq!(errors, vec![("key=openai:gpt-4o".to_owned(), 1)]);
}

/// An Anthropic 429 whose `retry-after` can't be read is a rate limit to retry, not a spend
/// limit (which has no `retry-after` at all).
#[tokio::test(start_paused = true)]
async fn an_unreadable_retry_after_is_not_a_spend_limit() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(
        Profile::anthropic(),
        Limits::parse("50/m", "40000/m").unwrap(),
        &registry,
    );
    let body = json!({"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let mut call = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    call.sending();
    let headers = header_map(&[("retry-after", "soon")]);
    let verdict = call
        .respond(
            StatusCode::TOO_MANY_REQUESTS,
            &headers,
            Some(br#"{"type":"error","error":{"type":"rate_limit_error"}}"#),
        )
        .await;
    // A rate limit, paused for the gate's own fallback (its backoff's base), not a spend
    // limit refused for good.
    assert_eq!(
        verdict,
        Verdict::Transient {
            pause: Some(Duration::from_millis(500))
        }
    );
}

/// A JSON answer read whole and then dropped before its end was polled (a client that stops at
/// the content length) still settles its usage.
#[tokio::test(start_paused = true)]
async fn a_json_body_dropped_once_read_still_settles() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = Limits::parse("", "100000/d").unwrap();
    let gate = gate(Profile::openai(), limits.clone(), &registry);
    let body = json!({"model": "gpt-4o", "max_tokens": 500, "messages": [{"role": "user", "content": "hi"}]});
    let mut call = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    call.sending();
    let estimate = call.cost().unwrap().tokens;
    call.respond(StatusCode::OK, &HeaderMap::new(), None).await;
    let answer = r#"{"usage":{"prompt_tokens":9,"completion_tokens":3}}"#;
    let mut metered = MeteredBody::new(Full::new(Bytes::from(answer)), call, false);
    // One frame, all of it; the end is never polled.
    let frame = metered.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), answer.as_bytes());
    drop(metered);
    // The settlement runs in a task of its own.
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    assert_eq!(
        least(&registry, "openai:gpt-4o", &limits, Currency::Tokens).await,
        100_000 - 12
    );
    assert!(estimate > 500);
}

/// A number written `1e308` is five characters of JSON, counted as such (not the 309 digits of
/// Rust's formatting).
#[test]
fn a_huge_float_is_counted_as_the_json_text_it_is() {
    let estimator = tollgate::estimators::estimator("words").unwrap();
    let body = json!({"messages": [{"role": "tool", "content": [{"type": "text", "text": "x"}]}],
                      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"default": 1e308}}}]});
    let estimate = tollgate::estimators::estimate(&*estimator, &body).unwrap();
    assert!(estimate.input_tokens < 100, "{estimate:?}");
}

/// Metrics per key: tokens settled and refunded, tokens lowered by a sync, 429s by kind; and
/// a rate-limit header that can't be read is warned of once per key.
#[test]
fn the_loop_shows_in_metrics_and_one_warning() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let captured = tollgate_testkit::Captured::default();
    let _logging = captured.capture();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let registry = Arc::new(Registry::new(MemoryStore::new()));
            let gate = gate(
                Profile::openai(),
                Limits::parse("100/d", "100000/d").unwrap(),
                &registry,
            );
            let body = json!({"model": "gpt-4o", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
            let send = || async {
                let mut call = gate.admit(&parts(), body.to_string().as_bytes()).await.unwrap();
                call.sending();
                call
            };
            // Settled below its estimate (a refund), after a sync that finds 500 spent
            // elsewhere.
            let mut call = send().await;
            let estimate = call.cost().unwrap().tokens;
            let left = (100_000 - 500 - estimate).to_string();
            call.respond(
                StatusCode::OK,
                &header_map(&[("x-ratelimit-remaining-tokens", &left)]),
                None,
            )
            .await;
            call.finish(Reported::read(
                br#"{"usage":{"prompt_tokens":8,"completion_tokens":2}}"#,
                false,
            ))
            .await
            .unwrap();
            // Two answers with a header that can't be read: one warning.
            for _ in 0..2 {
                let mut call = send().await;
                call.respond(
                    StatusCode::OK,
                    &header_map(&[("x-ratelimit-remaining-tokens", "plenty")]),
                    None,
                )
                .await;
            }
            // A permanent 429, then a transient one (last: it empties the day's tokens).
            let mut call = send().await;
            let verdict = call
                .respond(
                    StatusCode::TOO_MANY_REQUESTS,
                    &HeaderMap::new(),
                    Some(br#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota."}}"#),
                )
                .await;
            assert_eq!(
                verdict,
                Verdict::Permanent {
                    code: Some("insufficient_quota".into()),
                    message: Some("You exceeded your current quota.".into()),
                }
            );
            let mut call = send().await;
            call.respond(
                StatusCode::TOO_MANY_REQUESTS,
                &header_map(&[("retry-after", "1")]),
                Some(br#"{"error":{"type":"tokens"}}"#),
            )
            .await;
            estimate
        })
    });
    let mut counters = std::collections::HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        if let DebugValue::Counter(n) = value {
            counters.insert(format!("{} {}", key.key().name(), labels.join(",")), n);
        }
    }
    let count = |name: &str| counters.get(name).copied().unwrap_or(0);
    let key = "key=openai:gpt-4o";
    assert_eq!(count(&format!("tollgate_tokens_lowered_total {key}")), 500);
    assert!(count(&format!("tollgate_tokens_refunded_total {key}")) > 0);
    assert_eq!(
        count(&format!(
            "tollgate_provider_429s_total {key},kind=transient"
        )),
        1
    );
    assert_eq!(
        count(&format!(
            "tollgate_provider_429s_total {key},kind=permanent"
        )),
        1
    );
    assert_eq!(captured.count("can't be read"), 1, "{}", captured.text());
}
