//! A hostile client and a failing upstream: absurd sizes, malformed requests, clients that go
//! away mid-stream, upstreams that die mid-call. The proxy answers each in the provider's
//! shape (or hyper's plain 4xx), charges nothing it should not, and keeps serving.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_testkit::provider::{Options, Provider};

use crate::common::*;

/// Writes `request` on a new connection and reads what comes back until the proxy closes it
/// or 2 s pass.
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn still_serving(addr: SocketAddr) {
    let health = get(addr, "/healthz").await;
    assert_eq!(
        (health.status.as_u16(), &health.body[..]),
        (200, &b"ok\n"[..])
    );
}

fn small_proxy(url: &str, extra: &str) -> String {
    format!(
        r#"
        max_body_bytes = 1000
        [[upstream]]
        name = "{name}"
        url = "{url}"
        profile = "openai"
        requests = "100/m"
        tokens = "100000/m"
        "#,
        name = extra
    )
}

#[tokio::test]
async fn bodies_above_the_limit_get_413_before_anything_is_charged_or_sent() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(1, 1))).await;
    let proxy = proxy(&small_proxy(&upstream.url(), "big")).await;
    let big =
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x".repeat(2_000)}]});
    let answer = post(proxy.addr, "/v1/chat/completions", &big).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.json()["error"]["code"], "request_too_large");
    // Without a length, the body is cut off where it passes the limit.
    let chunk = "x".repeat(1_500);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    let text = raw(proxy.addr, request.as_bytes()).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    // A length that lies beyond any number.
    let text = raw(
        proxy.addr,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 4"), "{text}");
    assert_eq!(upstream.count.load(std::sync::atomic::Ordering::SeqCst), 0);
    let text = get(proxy.addr, "/metrics").await;
    let text = String::from_utf8_lossy(&text.body);
    assert_eq!(
        metric(&text, r#"tollgate_proxy_too_large_total{upstream="big"}"#),
        Some(2.0)
    );
    assert_eq!(
        metric(&text, r#"tollgate_calls_admitted_total{key="big:gpt-4o"}"#),
        None
    );
    still_serving(proxy.addr).await;
}

#[tokio::test]
async fn malformed_requests_are_answered_and_the_proxy_keeps_serving() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(1, 1))).await;
    let proxy = proxy(&small_proxy(&upstream.url(), "odd")).await;
    // A body that is not JSON still pays (by its words) and goes on: the provider judges it.
    let answer = send(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        Bytes::from_static(b"{\"model\": [unclosed"),
    )
    .await;
    assert_eq!(answer.status, 200);
    // Paths that climb are never forwarded.
    let answer = post(proxy.addr, "/v1/../admin", &json!({})).await;
    assert_eq!(answer.status, 400);
    // Garbage instead of HTTP, an absurd header, an absurd URL, a non-UTF-8 header value.
    let garbage = raw(proxy.addr, b"\x00\xff\xfe GARBAGE\r\n\r\n").await;
    assert!(
        garbage.is_empty() || garbage.starts_with("HTTP/1.1 4"),
        "{garbage}"
    );
    let huge_header = format!(
        "GET /healthz HTTP/1.1\r\nHost: p\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let text = raw(proxy.addr, huge_header.as_bytes()).await;
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "{}",
        &text[..text.len().min(80)]
    );
    let long_url = format!("GET /{} HTTP/1.1\r\nHost: p\r\n\r\n", "v".repeat(100_000));
    let text = raw(proxy.addr, long_url.as_bytes()).await;
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 4"),
        "{}",
        &text[..text.len().min(80)]
    );
    let text = raw(
        proxy.addr,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer \xff\xfe\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 "), "{text}");
    still_serving(proxy.addr).await;
    assert_eq!(upstream.count.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// An upstream that reads a request, writes `then`, and closes.
async fn dying_upstream(then: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 65_536];
                let _ = stream.read(&mut buffer).await;
                let _ = stream.write_all(then).await;
                let _ = stream.flush().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_upstream_that_dies_mid_call_is_a_502_in_the_providers_shape() {
    let addr = dying_upstream(b"").await;
    let proxy = proxy(&small_proxy(&format!("http://{addr}"), "dies")).await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let answer = post(proxy.addr, "/v1/chat/completions", &body).await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.json()["error"]["code"], "upstream_unreachable");
    // Nothing listens there any more.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = closed.local_addr().unwrap();
    drop(closed);
    let proxy = self::proxy(&small_proxy(&format!("http://{gone}"), "gone")).await;
    let answer = post(proxy.addr, "/v1/chat/completions", &body).await;
    assert_eq!(answer.status, 502);
    still_serving(proxy.addr).await;
}

/// A stream the upstream breaks off keeps what the call was charged (its reservation), unless
/// it had generated more; the break is counted as the upstream's error, not as a client that
/// left.
#[tokio::test]
async fn a_stream_cut_by_the_upstream_keeps_its_reservation() {
    let addr = dying_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n3b\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"one two three\"}}]}\n\n\r\n",
    )
    .await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "cut"
        url = "http://{addr}"
        profile = "openai"
        requests = "100/m"
        tokens = "100000/30d"
        estimate_margin = "0%"
        "#
    ))
    .await;
    let body = json!({"model": "gpt-4o", "stream": true, "max_tokens": 500,
        "messages": [{"role": "user", "content": "hi"}]});
    let request = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut text = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            text.extend_from_slice(&data);
        }
    }
    assert!(String::from_utf8_lossy(&text).contains("one two three"));
    drop(body);
    // The input as estimated (3 framing + "user" + "hi" + 3 priming = 8) and the 500 reserved.
    let mut left = 0;
    for _ in 0..100 {
        left = level(proxy.addr, "cut:gpt-4o", "tokens").await;
        if left == 100_000 - 508 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(left, 100_000 - 508);
    let text = get(proxy.addr, "/metrics").await;
    let text = String::from_utf8_lossy(&text.body);
    assert_eq!(
        metric(&text, r#"tollgate_proxy_cut_short_total{upstream="cut"}"#).unwrap_or(0.0),
        0.0
    );
    still_serving(proxy.addr).await;
}

/// A client that leaves mid-stream: its input settled as the stream reported it at its
/// start, its output reservation kept, and the stream counted as cut short.
#[tokio::test]
async fn a_client_that_leaves_mid_stream_keeps_its_output_reservation() {
    // 100 output tokens at 30 ms each: 3 s of stream, of which the client reads the start.
    let stand_in = Provider::start_with(
        Options::anthropic(60, 100_000, 100_000, Duration::from_secs(60))
            .latency(Duration::ZERO, Duration::from_millis(30)),
    )
    .await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "leave"
        url = "http://{}"
        profile = "anthropic"
        requests = "60/m"
        tokens = "100000/m"
        output_tokens = "100000/30d"
        "#,
        stand_in.addr
    ))
    .await;
    let body = json!({"model": "claude-3-5-haiku", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let request = http::Request::post(format!("http://{}/v1/messages", proxy.addr))
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    drop(body);
    let mut cut = None;
    for _ in 0..100 {
        let text = get(proxy.addr, "/metrics").await;
        let text = String::from_utf8_lossy(&text.body).into_owned();
        cut = metric(&text, r#"tollgate_proxy_cut_short_total{upstream="leave"}"#);
        if cut == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(cut, Some(1.0));
    assert_eq!(
        level(proxy.addr, "leave:claude-3-5-haiku", "output tokens").await,
        100_000 - 100
    );
    still_serving(proxy.addr).await;
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_finishes_its_head_is_cut_off_after_30_seconds() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(1, 1))).await;
    let proxy = proxy(&small_proxy(&upstream.url(), "slow")).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut out = Vec::new();
    // The clock is paused: it jumps to the next timer whenever everything waits.
    let closed = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut out)).await;
    assert!(closed.is_ok(), "the connection was still open after 60 s");
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert_eq!(upstream.count.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_path_that_hides_a_step_up_in_percent_signs_is_refused() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(1, 1))).await;
    let proxy = proxy(&small_proxy(&upstream.url(), "hidden")).await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    for path in [
        "/v1/%2e%2e/v1/chat/completions",
        "/v1/%2E%2E/v1/chat/completions",
        "/v1%2Fchat/completions",
    ] {
        let answer = post(proxy.addr, path, &body).await;
        assert_eq!(answer.status, 400, "{path}");
        assert_eq!(answer.json()["error"]["code"], "invalid_request", "{path}");
    }
    assert_eq!(upstream.count.load(std::sync::atomic::Ordering::SeqCst), 0);
    still_serving(proxy.addr).await;
}
