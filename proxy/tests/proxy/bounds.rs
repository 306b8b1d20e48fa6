//! Everything a client or an upstream can hold has a limit and a timeout (issue 23): silent
//! connections, slow and stalled bodies, memory for bodies, a hung or stalling upstream, a lying
//! one, keys a client invents. Timeouts are checked on tokio's paused clock where the proxy's
//! timers are tokio's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tollgate_testkit::hostile::{self, Hostile, HostileUpstream, Step};

use crate::common::*;

fn fresh(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn answering() -> HostileUpstream {
    HostileUpstream::start(|_, _| vec![Step::Write(hostile::json(200, &[], &chat_answer(3, 1)))])
        .await
}

fn config(url: &str, top: &str, upstream: &str) -> String {
    format!(
        r#"
        {top}
        [[upstream]]
        name = "{}"
        url = "{url}"
        profile = "openai"
        requests = "1000/m"
        {upstream}
        "#,
        fresh("bound")
    )
}

const CHAT: &[u8] =
    br#"{"model":"gpt-4o","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#;

fn head(length: usize) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    )
    .into_bytes()
}

/// A connection that sends nothing, one that sends a lone byte, and an HTTP/2 preface with no
/// stream are all closed (they stayed open past 100 s; 1,100 of them locked every client out).
#[tokio::test(start_paused = true)]
async fn silent_connections_are_closed() {
    let upstream = answering().await;
    let proxy = proxy(&config(
        &upstream.url(),
        "idle_timeout_seconds = 5\nheader_timeout_seconds = 10",
        "",
    ))
    .await;
    let client = Hostile::new(proxy.addr);
    let mut silent = client.connect().await;
    let closed = Hostile::closed_within(&mut silent, Duration::from_secs(60)).await;
    assert_eq!(closed, Some(Duration::from_secs(5)));
    let mut lone = client.connect().await;
    lone.write_all(b"P").await.unwrap();
    let closed = Hostile::closed_within(&mut lone, Duration::from_secs(60)).await;
    assert!(
        closed.is_some_and(|c| c <= Duration::from_secs(10)),
        "a lone byte: {closed:?}"
    );
    let mut preface = client.connect().await;
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let closed = Hostile::closed_within(&mut preface, Duration::from_secs(60)).await;
    assert!(
        closed.is_some_and(|c| c <= Duration::from_secs(6)),
        "an HTTP/2 preface: {closed:?}"
    );
    // A kept-alive connection between requests is idle too.
    let text = client
        .send(
            &[b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n".as_slice()].concat(),
            Duration::from_secs(60),
        )
        .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

/// Past `max_connections`, the connection idle the longest makes room for a new one; the
/// listener never stops accepting, and a client is served however many silent sockets came
/// first.
#[tokio::test]
async fn silent_sockets_cannot_lock_clients_out() {
    let upstream = answering().await;
    let proxy = proxy(&config(&upstream.url(), "max_connections = 20", "")).await;
    let client = Hostile::new(proxy.addr);
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(client.connect().await);
    }
    let answer = send(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        Bytes::from_static(CHAT),
    )
    .await;
    assert_eq!(answer.status, 200);
    // Most of the silent sockets were closed to make room.
    let mut closed = 0;
    for mut socket in silent {
        if Hostile::closed_within(&mut socket, Duration::from_millis(20))
            .await
            .is_some()
        {
            closed += 1;
        }
    }
    assert!(closed >= 80, "{closed} of 100 silent sockets closed");
}

/// A body that comes slower than the minimum rate (after its first 5 s), or not at all, is
/// answered 408: a body trickled a byte every 5 s stayed unanswered past 45 s.
#[tokio::test(start_paused = true)]
async fn a_slow_or_stalled_body_is_answered_408() {
    let upstream = answering().await;
    let proxy = proxy(&config(
        &upstream.url(),
        "body_min_bytes_per_second = 100",
        "",
    ))
    .await;
    let client = Hostile::new(proxy.addr);
    let started = tokio::time::Instant::now();
    let answer = client
        .trickle(
            &head(CHAT.len()),
            CHAT,
            Duration::from_secs(5),
            Duration::from_secs(60),
        )
        .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // Behind from 5 s on: a byte every 5 s is never 100 a second.
    assert!(
        started.elapsed() <= Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Half a body, then nothing.
    let started = tokio::time::Instant::now();
    let answer = client
        .send(
            &[head(CHAT.len()).as_slice(), &CHAT[..20]].concat(),
            Duration::from_secs(60),
        )
        .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() <= Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(upstream.count(), 0);
}

/// The memory held for request bodies across all requests is bounded: a body that would pass
/// it is answered 503 at once (16 stalled 30 MiB bodies held 483 MiB).
#[tokio::test]
async fn bodies_held_at_once_are_bounded() {
    let upstream = answering().await;
    let proxy = proxy(&config(
        &upstream.url(),
        "max_buffered_bytes = 100000\nmax_body_bytes = 1000000",
        "",
    ))
    .await;
    let client = Hostile::new(proxy.addr);
    // A body declares 60 KB and sends most of it, then stalls: it holds what it sent (a
    // declared length alone holds nothing), and a second of 60 KB doesn't fit beside it.
    let mut first = client.connect().await;
    first.write_all(&head(60_000)).await.unwrap();
    first.write_all(&[b' '; 59_000]).await.unwrap();
    let mut declared = client.connect().await;
    declared.write_all(&head(1_000_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = client
        .send(
            &[head(60_000).as_slice(), &[b' '; 60_000]].concat(),
            Duration::from_secs(5),
        )
        .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Once the first is gone, a body fits again.
    let answer = send(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        Bytes::from_static(CHAT),
    )
    .await;
    assert_eq!(answer.status, 200);
}

/// A client trickling its body can't hold the drain: the drain answers it 503 and ends clean
/// (the proxy exited 3 after its drain deadline).
#[tokio::test]
async fn a_trickling_client_does_not_hold_the_drain() {
    let upstream = answering().await;
    let proxy = proxy(&config(&upstream.url(), "drain_seconds = 20", "")).await;
    let client = Hostile::new(proxy.addr);
    let trickler = tokio::spawn(async move {
        client
            .trickle(
                &head(CHAT.len()),
                CHAT,
                Duration::from_millis(500),
                Duration::from_secs(5),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    assert_eq!(proxy.shutdown().await, tollgate_proxy::Drained::Clean);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let answer = trickler.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
}

/// An upstream that never answers is a 504 at the call's deadline; one that sends a head and
/// then nothing is cut at its chunk timeout (a silent upstream held its client 25 s with a
/// timeout of 3).
#[tokio::test(start_paused = true)]
async fn a_silent_or_stalling_upstream_cannot_hold_its_client() {
    let upstream = HostileUpstream::start(|n, _| match n {
        0 => vec![Step::Hold],
        _ => vec![
            Step::Write(hostile::stream_head(&[])),
            Step::Write(hostile::event(
                &json!({"choices": [{"delta": {"content": "hi"}}]}),
            )),
            Step::Hold,
        ],
    })
    .await;
    let proxy = proxy(&config(
        &upstream.url(),
        "",
        "timeout_seconds = 3\nchunk_timeout_seconds = 2",
    ))
    .await;
    let started = tokio::time::Instant::now();
    let answer = send(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        Bytes::from_static(CHAT),
    )
    .await;
    assert_eq!(answer.status, 504);
    assert_eq!(answer.json()["error"]["code"], "upstream_timeout");
    assert!(
        started.elapsed() <= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let body = br#"{"model":"gpt-4o","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .body(http_body_util::Full::new(Bytes::from_static(body)))
        .unwrap();
    let started = tokio::time::Instant::now();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.into_body();
    let mut broke = false;
    while let Some(frame) = stream.frame().await {
        if frame.is_err() {
            broke = true;
            break;
        }
    }
    assert!(broke, "the stalled stream ended as if whole");
    assert!(
        started.elapsed() <= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// With limits learned from the headers, a call that hangs holds the key's turn for at most
/// the first-answer wait (1 s): the next call goes alone after it, instead of every call of
/// the model waiting (and getting 429) for as long as it hangs.
#[tokio::test(start_paused = true)]
async fn a_hung_call_does_not_hold_a_key_that_learns_its_limits() {
    let upstream = HostileUpstream::start(|n, _| match n {
        0 => vec![Step::Hold],
        _ => vec![Step::Write(hostile::json(
            200,
            &[
                ("x-ratelimit-limit-requests", "100"),
                ("x-ratelimit-remaining-requests", "98"),
                ("x-ratelimit-limit-tokens", "100000"),
                ("x-ratelimit-remaining-tokens", "99000"),
            ],
            &chat_answer(3, 1),
        ))],
    })
    .await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{}"
        url = "{}"
        profile = "openai"
        limits = "from-headers"
        timeout_seconds = 30
        "#,
        fresh("learn"),
        upstream.url()
    ))
    .await;
    let addr = proxy.addr;
    let hung = tokio::spawn(async move {
        send(addr, "/v1/chat/completions", &[], Bytes::from_static(CHAT)).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = tokio::time::Instant::now();
    let answer = send(addr, "/v1/chat/completions", &[], Bytes::from_static(CHAT)).await;
    assert_eq!(answer.status, 200);
    assert!(
        started.elapsed() <= Duration::from_millis(1_000),
        "{:?}",
        started.elapsed()
    );
    hung.abort();
}

/// Usage no request could have produced (u64::MAX, 10^18) is settled at what the request could
/// have cost (twice its body and 8,192 tokens of context, or a window): the key is not locked
/// for 64 periods.
#[tokio::test]
async fn a_lying_upstream_cannot_lock_a_key() {
    let upstream = HostileUpstream::start(|n, _| {
        let usage = match n {
            0 => json!({"prompt_tokens": u64::MAX, "completion_tokens": 0}),
            _ => json!({"prompt_tokens": 3, "completion_tokens": 1}),
        };
        let body = json!({"choices": [{"message": {"role": "assistant", "content": "ok"}}], "usage": usage});
        vec![Step::Write(hostile::json(200, &[], &body))]
    })
    .await;
    let name = fresh("lie");
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        requests = "100/m"
        tokens = "6000/m"
        timeout_seconds = 0.1
        "#,
        upstream.url()
    ))
    .await;
    let sent = std::time::Instant::now();
    assert_eq!(
        send(
            proxy.addr,
            "/v1/chat/completions",
            &[],
            Bytes::from_static(CHAT)
        )
        .await
        .status,
        200
    );
    // The lie is settled at twice the body's 8 tokens and 8,192 of context: 2,208 owed
    // beyond the window, less what the window refilled (100 a second) before it was read.
    let level = level(proxy.addr, &format!("{name}:gpt-4o"), "tokens").await;
    let refilled = (sent.elapsed().as_secs_f64() * 100.0).ceil() as i64;
    let owed = 6_000 - (2 * 8 + 8_192);
    assert!(
        (owed..=owed + refilled).contains(&level),
        "{level} is not {owed} (+ up to {refilled} refilled)"
    );
    // A call of 1,000 tokens waits for 3,208 tokens of refill (32 s), not for 64 minutes.
    let thousand =
        br#"{"model":"gpt-4o","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}"#;
    let refused = send(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        Bytes::from_static(thousand),
    )
    .await;
    assert_eq!(refused.status, 429);
    let after: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (31..=34).contains(&after),
        "a lie locked the key for {after} s"
    );
}

/// Keys a client invents cost bounded memory and labels: 2,000 random API keys as tenants
/// make one series, and `/metrics` stays small (100,000 keys made 100,003 labels and 142 MiB).
#[tokio::test]
async fn invented_keys_share_one_label() {
    let upstream = answering().await;
    let name = fresh("keys");
    let proxy = proxy(&format!(
        r#"
        [tenants]
        from = "key"
        requests = "100/m"
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        requests = "100000/m"
        "#,
        upstream.url()
    ))
    .await;
    for i in 0..2_000 {
        let key = format!("Bearer sk-random-{i:08}-{}", i * 7919);
        let answer = send(
            proxy.addr,
            "/v1/chat/completions",
            &[("authorization", &key)],
            Bytes::from_static(CHAT),
        )
        .await;
        assert_eq!(answer.status, 200);
    }
    let text = get(proxy.addr, "/metrics").await.body_str();
    let series = format!(r#"tollgate_calls_admitted_total{{key="{name}:tenant:other"}}"#);
    assert_eq!(metric(&text, &series), Some(2_000.0));
    assert!(!text.contains(&format!("{name}:tenant:k")));
    // A series per key would make 2,000 lines or more that name this upstream (its own few
    // series and their buckets make about 120). The recorder is the process's: other tests'
    // series, which come and go beside this one, are left out.
    let ours = text.lines().filter(|line| line.contains(&name)).count();
    assert!(ours < 500, "{ours} lines of /metrics name {name}");
}

/// A client that stops reading an answer can't hold it, or the upstream call behind it: past
/// `write_timeout` the answer is cut and the upstream's connection closed (five such clients
/// held their calls for over 60 s with every other timeout at 3 s).
#[tokio::test]
async fn a_client_that_stops_reading_cannot_hold_the_upstream_call() {
    let event = hostile::event(&json!({"choices": [{"delta": {"content": "x".repeat(1_000)}}]}));
    let upstream = HostileUpstream::start(move |_, _| {
        let mut steps = vec![Step::Write(hostile::stream_head(&[]))];
        steps.extend(std::iter::repeat_n(Step::Write(event.clone()), 50_000));
        steps
    })
    .await;
    let proxy = proxy(&config(&upstream.url(), "write_timeout_seconds = 1", "")).await;
    let body = br#"{"model":"gpt-4o","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut client = Hostile::new(proxy.addr).connect().await;
    client
        .write_all(&[head(body.len()).as_slice(), body].concat())
        .await
        .unwrap();
    // The client reads nothing; the upstream writes until the proxy cuts it.
    let started = std::time::Instant::now();
    while upstream.broken.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the upstream call was still held after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = get(proxy.addr, "/metrics").await.body_str();
    assert!(
        metric(
            &text,
            r#"tollgate_proxy_connections_closed_total{reason="unread"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
}
