//! Running like a service: health, metrics without secrets, a drain on shutdown, one quota
//! for a fleet on Redis.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use tollgate_proxy::Drained;
use tollgate_testkit::provider::{Options, Provider};
use tollgate_testkit::redis::RedisServer;

use crate::common::*;

/// Tenants the configuration doesn't name (a key's hash here) share one label: no series per
/// client-chosen key, and never the key or its hash.
#[tokio::test]
async fn metrics_never_show_a_key_and_aggregate_unnamed_tenants() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let proxy = proxy(&format!(
        r#"
        [tenants]
        from = "key"
        requests = "100/m"
        tokens = "100000/m"
        [[upstream]]
        name = "met"
        url = "{}"
        profile = "openai"
        requests = "100/m"
        tokens = "100000/m"
        "#,
        upstream.url()
    ))
    .await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let secret = "sk-very-secret-key-123";
    let auth = format!("Bearer {secret}");
    let answer = send(
        proxy.addr,
        "/v1/chat/completions",
        &[("authorization", &auth)],
        Bytes::from(body.to_string()),
    )
    .await;
    assert_eq!(answer.status, 200);
    // The upstream still gets the client's own key.
    assert_eq!(
        upstream.seen.lock().unwrap()[0].headers["authorization"],
        auth.as_str()
    );
    let text = String::from_utf8(get(proxy.addr, "/metrics").await.body.to_vec()).unwrap();
    assert!(!text.contains("secret"), "{text}");
    assert!(!text.contains("tenant:k"), "{text}");
    let series = r#"tollgate_calls_admitted_total{key="met:tenant:other"}"#;
    assert_eq!(metric(&text, series), Some(1.0), "{text}");
    assert_eq!(
        metric(&text, r#"tollgate_calls_admitted_total{key="met:gpt-4o"}"#),
        Some(1.0)
    );
    // The level of the organization's request window: 100 less the one call.
    let level = r#"tollgate_proxy_level{key="met:gpt-4o",currency="requests"}"#;
    assert_eq!(metric(&text, level), Some(99.0), "{text}");
}

#[tokio::test]
async fn on_shutdown_a_stream_in_flight_finishes_and_new_connections_are_refused() {
    let stand_in = Provider::start_with(
        Options::openai(60, 20_000, Duration::from_secs(10))
            .latency(Duration::ZERO, Duration::from_millis(20)),
    )
    .await;
    let proxy = proxy(&format!(
        r#"
        drain_seconds = 5
        [[upstream]]
        name = "drain"
        url = "http://{}"
        profile = "openai"
        requests = "60/10s"
        tokens = "20000/10s"
        "#,
        stand_in.addr
    ))
    .await;
    let addr = proxy.addr;
    let body = json!({"model": "gpt-4o", "max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "Count"}]});
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let mut stream = response.into_body();
    let first = stream.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    let started = Instant::now();
    let shutdown = tokio::spawn(proxy.shutdown());
    let mut text = Vec::new();
    while let Some(frame) = stream.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            text.extend_from_slice(&data);
        }
    }
    assert!(
        String::from_utf8(text)
            .unwrap()
            .ends_with("data: [DONE]\n\n")
    );
    assert_eq!(shutdown.await.unwrap(), Drained::Clean);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn past_the_drain_deadline_the_calls_in_flight_are_cut() {
    let stand_in = Provider::start_with(
        Options::openai(60, 20_000, Duration::from_secs(10))
            .latency(Duration::ZERO, Duration::from_millis(100)),
    )
    .await;
    let proxy = proxy(&format!(
        r#"
        drain_seconds = 0.2
        [[upstream]]
        name = "cut-drain"
        url = "http://{}"
        profile = "openai"
        requests = "60/10s"
        tokens = "20000/10s"
        "#,
        stand_in.addr
    ))
    .await;
    let body = json!({"model": "gpt-4o", "max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "Count"}]});
    let request = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let mut stream = response.into_body();
    stream.frame().await.unwrap().unwrap();
    let started = Instant::now();
    assert_eq!(proxy.shutdown().await, Drained::Cut);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(900),
        "{took:?}"
    );
}

#[tokio::test]
async fn proxies_on_one_redis_share_one_quota() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let config = format!(
        r#"
        redis = "{}"
        [[upstream]]
        name = "fleet"
        url = "{}"
        profile = "openai"
        requests = "4/m"
        timeout_seconds = 0.3
        "#,
        redis.url(),
        upstream.url()
    );
    let (a, b) = (proxy(&config).await, proxy(&config).await);
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let mut statuses = Vec::new();
    for i in 0..6 {
        let to = if i % 2 == 0 { a.addr } else { b.addr };
        statuses.push(
            post(to, "/v1/chat/completions", &body)
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
    assert_eq!(upstream.count.load(std::sync::atomic::Ordering::SeqCst), 4);
}
