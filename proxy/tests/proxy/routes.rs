//! Each route and profile through the proxy: what reaches the upstream, what comes back.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use tollgate_testkit::provider::{self, Options, Provider};

use crate::common::*;

fn openai_upstream(name: &str, url: &str, extra: &str) -> String {
    format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "{url}"
        profile = "openai"
        {extra}
        "#
    )
}

async fn settled(addr: std::net::SocketAddr, series: &str, expected: f64) -> f64 {
    // Settlement runs in a task of its own once the usage has passed: give it a moment.
    let mut value = 0.0;
    for _ in 0..100 {
        value = metric(&get(addr, "/metrics").await.body_str(), series).unwrap_or(0.0);
        if value == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    value
}

#[tokio::test]
async fn a_chat_goes_through_with_the_providers_headers_and_settles_its_usage() {
    let stand_in = Provider::start(60, 20_000, Duration::from_secs(10)).await;
    let proxy = proxy(&openai_upstream(
        "chat1",
        &format!("http://{}", stand_in.addr),
        r#"requests = "60/10s"
        tokens = "20000/10s""#,
    ))
    .await;
    let body = json!({"model": "gpt-4o", "max_tokens": 20,
        "messages": [{"role": "user", "content": "Say hello to the proxy"}]});
    let answer = post(proxy.addr, "/v1/chat/completions", &body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let prompt = provider::chat_prompt(&body);
    assert_eq!(answer.json()["usage"]["prompt_tokens"], prompt);
    let completion = answer.json()["usage"]["completion_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(answer.headers["x-ratelimit-remaining-requests"], "59");
    assert!(!answer.headers.contains_key("x-tollgate"));
    let series = r#"tollgate_proxy_settled_tokens_total{upstream="chat1"}"#;
    let total = (prompt + completion) as f64;
    assert_eq!(settled(proxy.addr, series, total).await, total);
    assert_eq!(
        stand_in.stats.ok.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn a_stream_passes_through_as_it_is_written() {
    // The stand-in writes a stream's first events at once and its last after 20 ms per output
    // token (10 or more tokens).
    let stand_in = Provider::start_with(
        Options::openai(60, 20_000, Duration::from_secs(10))
            .latency(Duration::ZERO, Duration::from_millis(20)),
    )
    .await;
    let proxy = proxy(&openai_upstream(
        "stream1",
        &format!("http://{}", stand_in.addr),
        r#"requests = "60/10s"
        tokens = "20000/10s""#,
    ))
    .await;
    let body = json!({"model": "gpt-4o", "max_tokens": 50, "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Count to ten"}]});
    let request = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let sent = Instant::now();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let mut first = None;
    let mut text = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            first.get_or_insert_with(|| sent.elapsed());
            text.extend_from_slice(&data);
        }
    }
    let end = sent.elapsed();
    let first = first.unwrap();
    // The first event came while the stand-in was still writing (≥ 200 ms before its end).
    assert!(
        end - first >= Duration::from_millis(190),
        "first {first:?}, end {end:?}"
    );
    let text = String::from_utf8(text).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let prompt =
        provider::chat_prompt(&json!({"messages": [{"role": "user", "content": "Count to ten"}]}));
    let completion = 10 + prompt % 40;
    let series = r#"tollgate_proxy_settled_tokens_total{upstream="stream1"}"#;
    let total = (prompt + completion) as f64;
    assert_eq!(settled(proxy.addr, series, total).await, total);
}

#[tokio::test]
async fn a_call_that_would_wait_past_its_deadline_gets_a_providers_429_from_the_proxy() {
    let stand_in = Provider::start(60, 20_000, Duration::from_secs(10)).await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "late-requests"
        url = "http://{addr}"
        mount = "/r"
        profile = "openai"
        requests = "1/m"
        tokens = "100000/m"
        timeout_seconds = 0.2
        [[upstream]]
        name = "late"
        url = "http://{addr}"
        profile = "openai"
        requests = "60/m"
        tokens = "1000/m"
        timeout_seconds = 0.2
        [[upstream]]
        name = "late-anthropic"
        url = "http://{addr}"
        profile = "anthropic"
        requests = "60/m"
        tokens = "1000/m"
        output_tokens = "1000/m"
        timeout_seconds = 0.2
        "#,
        addr = stand_in.addr
    ))
    .await;
    // A prompt of some 600 tokens: the second can't pass for about (2 × 600 − 1000) / 1000
    // of a minute.
    let words = "word ".repeat(600);
    let body = json!({"model": "gpt-4o", "max_tokens": 1, "messages": [{"role": "user", "content": words}]});
    let cost = provider::chat_prompt(&body) + 1;
    assert_eq!(
        post(proxy.addr, "/v1/chat/completions", &body).await.status,
        200
    );
    let refused = post(proxy.addr, "/v1/chat/completions", &body).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.headers["x-tollgate"], "local");
    assert_eq!(refused.headers["x-should-retry"], "true");
    let after: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let expected = (2 * cost - 1_000) * 60 / 1_000;
    assert!(
        after.abs_diff(expected) <= 2,
        "retry-after {after}, expected about {expected}"
    );
    assert_eq!(refused.json()["error"]["code"], "rate_limit_exceeded");
    // The tokens could not pay (the requests could): the 429 names the token window, in
    // OpenAI's words, since a client's gate reads them to tell which window is spent.
    assert_eq!(
        refused.json()["error"]["type"],
        "tokens",
        "{:?}",
        refused.json()
    );
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("on tokens per min (TPM)"), "{message}");
    // Anthropic's shape on Anthropic's path.
    let messages = json!({"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": words}]});
    assert_eq!(
        post(proxy.addr, "/v1/messages", &messages).await.status,
        200
    );
    let refused = post(proxy.addr, "/v1/messages", &messages).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["type"], "error");
    assert_eq!(refused.json()["error"]["type"], "rate_limit_error");
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("input tokens per minute"), "{message}");
    // A refusal for want of a request names the request window.
    let small = json!({"model": "gpt-4o", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        post(proxy.addr, "/r/v1/chat/completions", &small)
            .await
            .status,
        200
    );
    let refused = post(proxy.addr, "/r/v1/chat/completions", &small).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.json()["error"]["type"],
        "requests",
        "{:?}",
        refused.json()
    );
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("on requests per min (RPM)"), "{message}");
    assert_eq!(
        stand_in.stats.ok.load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    assert_eq!(
        stand_in
            .stats
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn a_permanent_429_is_handed_on_at_once_and_marked_not_to_retry() {
    let stand_in =
        Provider::start_with(Options::openai(60, 20_000, Duration::from_secs(10)).permanent())
            .await;
    let proxy = proxy(&openai_upstream(
        "spent",
        &format!("http://{}", stand_in.addr),
        r#"requests = "60/10s"
        tokens = "20000/10s""#,
    ))
    .await;
    let body = json!({"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let answer = post(proxy.addr, "/v1/chat/completions", &body).await;
    assert_eq!(answer.status, 429);
    assert_eq!(answer.json()["error"]["code"], "insufficient_quota");
    assert_eq!(answer.headers["x-should-retry"], "false");
    assert!(!answer.headers.contains_key("x-tollgate"));
    assert_eq!(
        stand_in
            .stats
            .permanent
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn gemini_is_retried_after_the_delay_its_429_body_states() {
    let upstream = Scripted::start(|n, _| {
        if n == 0 {
            json_response(
                429,
                &[],
                &json!([{"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED",
                    "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.6s"}]}}]),
            )
        } else {
            json_response(200, &[], &chat_answer(7, 3))
        }
    })
    .await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "gem"
        url = "{}/v1beta/openai"
        profile = "gemini"
        strip = "/v1"
        requests = "100/m"
        tokens = "100000/m"
        "#,
        upstream.url()
    ))
    .await;
    let body =
        json!({"model": "gemini-2.0-flash", "messages": [{"role": "user", "content": "hi"}]});
    let sent = Instant::now();
    let answer = post(proxy.addr, "/v1/chat/completions", &body).await;
    let took = sent.elapsed();
    assert_eq!(answer.status, 200);
    assert_eq!(upstream.count.load(std::sync::atomic::Ordering::SeqCst), 2);
    // The backoff is floored at the stated 0.6 s (jitter adds at most the backoff's own).
    assert!(took >= Duration::from_millis(600), "{took:?}");
    let seen = upstream.seen.lock().unwrap();
    assert_eq!(seen[1].path, "/v1beta/openai/chat/completions");
}

#[tokio::test]
async fn anthropics_count_tokens_is_not_metered_and_messages_are() {
    let upstream =
        Scripted::start(|_, _| json_response(200, &[], &json!({"input_tokens": 5}))).await;
    let proxy = proxy(&format!(
        r#"
        other_paths = "refuse"
        [[upstream]]
        name = "ant-ct"
        url = "{}"
        profile = "anthropic"
        requests = "100/m"
        tokens = "10/m"
        "#,
        upstream.url()
    ))
    .await;
    let words = "word ".repeat(200);
    let body = json!({"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": words}]});
    let counted = post(proxy.addr, "/v1/messages/count_tokens", &body).await;
    assert_eq!(counted.status, 200);
    assert_eq!(counted.json()["input_tokens"], 5);
    // Metered, the same body can never pass a 10-token window: refused at once, not sent.
    let refused = post(proxy.addr, "/v1/messages", &body).await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.json()["error"]["type"], "invalid_request_error");
    // Other paths are refused as configured.
    let other = post(proxy.addr, "/v1/models", &json!({})).await;
    assert_eq!(other.status, 404);
    assert_eq!(other.json()["error"]["type"], "not_found_error");
    assert_eq!(upstream.count.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn azure_deployments_are_keyed_by_deployment_and_forwarded_as_they_are() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(4, 2))).await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "az"
        url = "{}"
        profile = "azure-openai"
        requests = "100/m"
        tokens = "100000/m"
        models = ["gpt4o-prod"]
        "#,
        upstream.url()
    ))
    .await;
    let path = "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21";
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let answer = send(
        proxy.addr,
        path,
        &[("api-key", "azure-key")],
        Bytes::from(body.to_string()),
    )
    .await;
    assert_eq!(answer.status, 200);
    let seen = upstream.seen.lock().unwrap().clone();
    assert_eq!(seen[0].path, path);
    assert_eq!(seen[0].headers["api-key"], "azure-key");
    // The body goes on byte for byte: the proxy reads it to estimate, never rewrites it.
    assert_eq!(seen[0].body, Bytes::from(body.to_string()));
    let text = get(proxy.addr, "/metrics").await.body_str();
    assert_eq!(
        metric(
            &text,
            r#"tollgate_calls_admitted_total{key="az:gpt4o-prod"}"#
        ),
        Some(1.0),
        "{text}"
    );
    // A deployment the configuration doesn't list shares the upstream's own key: clients
    // can't make keys of their own by naming deployments.
    for name in ["made-up", "another-one"] {
        let path = format!("/openai/deployments/{name}/chat/completions?api-version=2024-10-21");
        let answer = send(
            proxy.addr,
            &path,
            &[("api-key", "azure-key")],
            Bytes::from(body.to_string()),
        )
        .await;
        assert_eq!(answer.status, 200);
    }
    let text = get(proxy.addr, "/metrics").await.body_str();
    assert_eq!(
        metric(&text, r#"tollgate_calls_admitted_total{key="az"}"#),
        Some(2.0),
        "{text}"
    );
}

#[tokio::test]
async fn mistral_headers_lower_the_windows_where_openais_names_would_not() {
    // Both upstreams answer "no request left this minute" in Mistral's words.
    let answer = || {
        json_response(
            200,
            &[
                ("x-ratelimit-limit-req-minute", "10"),
                ("x-ratelimit-remaining-req-minute", "0"),
            ],
            &chat_answer(4, 2),
        )
    };
    let mistral = Scripted::start(move |_, _| answer()).await;
    let generic = Scripted::start(move |_, _| answer()).await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "mis"
        url = "{}"
        profile = "mistral"
        mount = "/mistral"
        requests = "10/m"
        timeout_seconds = 0.3
        [[upstream]]
        name = "gen"
        url = "{}"
        profile = "generic"
        mount = "/generic"
        requests = "10/m"
        timeout_seconds = 0.3
        "#,
        mistral.url(),
        generic.url()
    ))
    .await;
    let body = json!({"model": "mistral-small", "messages": [{"role": "user", "content": "hi"}]});
    for mount in ["/mistral", "/generic"] {
        let path = format!("{mount}/v1/chat/completions");
        assert_eq!(post(proxy.addr, &path, &body).await.status, 200);
    }
    let path = "/mistral/v1/chat/completions";
    assert_eq!(post(proxy.addr, path, &body).await.status, 429);
    let path = "/generic/v1/chat/completions";
    assert_eq!(post(proxy.addr, path, &body).await.status, 200);
}
