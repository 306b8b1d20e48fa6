//! Quota bypasses a hostile client tried (issue 23): every one is metered now. Each test sends
//! what the client sent, through a hostile upstream that bills what a Python server would, and
//! checks what the proxy charged or let through.

use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tollgate_testkit::hostile::{self, HostileUpstream, Step};

use crate::common::*;

/// A fresh upstream name for each proxy: metrics are the process's, and keys must not meet.
fn fresh(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// An upstream that streams `events` (each a JSON value) and `[DONE]`, with no usage.
async fn streaming(events: Vec<Value>) -> HostileUpstream {
    HostileUpstream::start(move |_, _| {
        let mut steps = vec![Step::Write(hostile::stream_head(&[]))];
        for event in &events {
            steps.push(Step::Write(hostile::event(event)));
        }
        steps.push(Step::Write(b"data: [DONE]\n\n".to_vec()));
        steps
    })
    .await
}

fn delta(delta: Value) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

fn openai(name: &str, url: &str, extra: &str) -> String {
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

/// Sends `body` with `headers` and reads the whole answer.
async fn call(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Answer {
    send(addr, path, headers, Bytes::from(body)).await
}

/// The tokens the proxy charged one streamed call of `body` (sent with `headers`), on a key
/// of 1,000,000 tokens a minute, when the upstream streams "ok" and no usage.
async fn charged(body: Vec<u8>, headers: &[(&str, &str)]) -> i64 {
    let upstream = streaming(vec![delta(json!({"role": "assistant", "content": "ok"}))]).await;
    let name = fresh("shape");
    let proxy = proxy(&openai(
        &name,
        &upstream.url(),
        r#"requests = "100/m"
        tokens = "1000000/30d""#,
    ))
    .await;
    let answer = call(proxy.addr, "/v1/chat/completions", headers, body).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    // A body no server reads names no model: it is charged at the upstream's own key.
    let text = get(proxy.addr, "/metrics").await.body_str();
    let key = if text.contains(&format!("{name}:gpt-4o")) {
        format!("{name}:gpt-4o")
    } else {
        name
    };
    let left = level(proxy.addr, &key, "tokens").await;
    1_000_000 - left
}

/// Headers a test sends.
type Headers = Vec<(&'static str, &'static str)>;

fn text(words: usize) -> String {
    "rivers carry water to the sea ".repeat(words / 6)
}

fn chat(extra: &str, content: &str) -> Vec<u8> {
    format!(
        r#"{{"model":"gpt-4o","stream":true,"max_tokens":10,{extra}"messages":[{{"role":"user","content":"{content}"}}]}}"#
    )
    .into_bytes()
}

/// A body Python's `json` reads and serde_json refuses pays what the same body written plainly
/// pays, not a token: a byte-order mark, NaN, a number past f64, a lone surrogate, 130 levels of
/// nesting, UTF-16, gzip. What no parser reads pays one token a byte.
#[tokio::test]
async fn a_body_only_a_lenient_parser_reads_pays_what_it_costs() {
    let words = text(2_000);
    let clean = charged(chat("", &words), &[]).await;
    assert!(clean > 1_900, "a 2,000-word prompt charged {clean}");
    let deep = format!("\"x\":{}1{},", "[".repeat(130), "]".repeat(130));
    let mut utf16: Vec<u8> = vec![0xFF, 0xFE];
    utf16.extend(
        String::from_utf8(chat("", &words))
            .unwrap()
            .encode_utf16()
            .flat_map(u16::to_le_bytes),
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&chat("", &words)).unwrap();
    let gz = gz.finish().unwrap();
    let cases: Vec<(&str, Vec<u8>, Headers)> = vec![
        (
            "bom",
            [b"\xEF\xBB\xBF".as_slice(), &chat("", &words)].concat(),
            vec![],
        ),
        ("nan", chat("\"temperature\":NaN,", &words), vec![]),
        ("1e400", chat("\"temperature\":1e400,", &words), vec![]),
        ("surrogate", chat("", &format!("{words}\\ud800")), vec![]),
        ("nesting", chat(&deep, &words), vec![]),
        ("utf-16", utf16, vec![]),
        ("gzip", gz, vec![("content-encoding", "gzip")]),
    ];
    for (what, body, headers) in cases {
        let paid = charged(body, &headers).await;
        // The nesting's brackets, kept as text, count too (erring high).
        assert!(
            paid >= clean && paid <= clean + 300,
            "{what}: charged {paid}, the plain body {clean}"
        );
    }
    // Cut off mid-document: one token a byte, never one token.
    let broken = chat("", &words);
    let broken = broken[..broken.len() - 40].to_vec();
    let bytes = broken.len() as i64;
    let paid = charged(broken, &[]).await;
    assert!(
        paid >= bytes,
        "an unreadable body of {bytes} bytes charged {paid}"
    );
}

/// A compression the proxy can't read is refused before anything is charged or sent; one that
/// decodes past the body limit is a 413.
#[tokio::test]
async fn an_encoding_the_proxy_cant_read_is_refused_with_415() {
    let upstream = streaming(vec![]).await;
    let proxy = proxy(&format!(
        "max_body_bytes = 100000\n{}",
        openai(&fresh("enc"), &upstream.url(), r#"requests = "100/m""#)
    ))
    .await;
    let answer = call(
        proxy.addr,
        "/v1/chat/completions",
        &[("content-encoding", "compress")],
        chat("", "hi"),
    )
    .await;
    assert_eq!(answer.status, 415);
    let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    bomb.write_all(&vec![b' '; 10 << 20]).unwrap();
    let answer = call(
        proxy.addr,
        "/v1/chat/completions",
        &[("content-encoding", "gzip")],
        bomb.finish().unwrap(),
    )
    .await;
    assert_eq!(answer.status, 413);
    assert_eq!(upstream.count(), 0);
}

/// A stream that carries no usage is charged at least its reservation, and everything it
/// generated past it: tool-call arguments and reasoning count as content does (they were
/// skipped: 463 calls passed a 3,000-token window where 5 should have). Here a model the
/// configuration doesn't know, with no `max_tokens`, reserves the upstream's 100 and writes
/// some 1,500.
#[tokio::test]
async fn streamed_tool_calls_and_reasoning_are_charged_without_usage() {
    let arguments = "{\"query\": \"".to_owned() + &text(1_500) + "\"}";
    let reasoning = text(1_500);
    let bpe = tiktoken_rs::o200k_base().unwrap();
    for (what, events, expected) in [
        (
            "tool calls",
            arguments
                .as_bytes()
                .chunks(200)
                .map(|piece| {
                    delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": String::from_utf8_lossy(piece)}}]}))
                })
                .collect::<Vec<_>>(),
            bpe.encode_ordinary(&arguments).len() as i64,
        ),
        (
            "reasoning",
            reasoning
                .as_bytes()
                .chunks(200)
                .map(|piece| delta(json!({"reasoning_content": String::from_utf8_lossy(piece)})))
                .collect(),
            bpe.encode_ordinary(&reasoning).len() as i64,
        ),
    ] {
        let upstream = streaming(events).await;
        let name = fresh("gen");
        let proxy = proxy(&format!(
            r#"
            [[upstream]]
            name = "{name}"
            url = "{}"
            profile = "generic"
            default_max_tokens = 100
            requests = "100/m"
            tokens = "1000000/30d"
            "#,
            upstream.url()
        ))
        .await;
        let body = json!({"model": "my-model", "stream": true,
            "messages": [{"role": "user", "content": "search"}]});
        let answer = post(proxy.addr, "/v1/chat/completions", &body).await;
        assert_eq!(answer.status, 200);
        let paid = 1_000_000 - level(proxy.addr, &name, "tokens").await;
        // The prompt is a dozen tokens; the rest is the generated text, counted in pieces of
        // 64 KiB (each boundary can split a token: the count errs high).
        assert!(
            paid >= expected && paid <= expected + 40,
            "{what}: charged {paid}, generated {expected}"
        );
    }
}

/// A stream whose client did not ask for usage is asked for it upstream
/// (`stream_options.include_usage`), settled from the provider's own count, and the extra
/// chunk never reaches the client.
#[tokio::test]
async fn a_stream_is_asked_for_its_usage_and_the_client_never_sees_the_chunk() {
    let upstream = streaming(vec![
        delta(json!({"role": "assistant", "content": "Hello"})),
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 40, "completion_tokens": 1234, "total_tokens": 1274}}),
    ])
    .await;
    let name = fresh("usage");
    let proxy = proxy(&openai(
        &name,
        &upstream.url(),
        r#"requests = "100/m"
        tokens = "1000000/30d""#,
    ))
    .await;
    let body = json!({"model": "gpt-4o", "stream": true, "max_tokens": 2000,
        "messages": [{"role": "user", "content": "hi"}]});
    let answer = post(proxy.addr, "/v1/chat/completions", &body).await;
    let seen = String::from_utf8_lossy(&answer.body).into_owned();
    assert!(
        seen.contains("Hello") && seen.ends_with("data: [DONE]\n\n"),
        "{seen}"
    );
    assert!(!seen.contains("completion_tokens"), "{seen}");
    let sent = upstream.request(0).json();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(sent["messages"], body["messages"]);
    // Settled from the provider's count, not the estimate or the reservation.
    let paid = 1_000_000 - level(proxy.addr, &format!("{name}:gpt-4o"), "tokens").await;
    assert_eq!(paid, 1_274);
    // A client that asked keeps its chunk.
    let mut asked = body.clone();
    asked["stream_options"] = json!({"include_usage": true});
    let answer = post(proxy.addr, "/v1/chat/completions", &asked).await;
    assert!(String::from_utf8_lossy(&answer.body).contains("completion_tokens"));
}

/// Percent-encoded letters reach the same route the upstream's server decodes them to, and
/// pay for it (they went unmetered: 40 of 40 against a limit of 5).
#[tokio::test]
async fn percent_encoded_paths_are_metered_as_the_server_reads_them() {
    let upstream = HostileUpstream::start(|_, _| {
        vec![Step::Write(hostile::json(200, &[], &chat_answer(3, 1)))]
    })
    .await;
    let proxy = proxy(&openai(
        &fresh("pct"),
        &upstream.url(),
        r#"requests = "5/10s"
        timeout_seconds = 0.2"#,
    ))
    .await;
    let body = json!({"model": "gpt-4o", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    let mut passed = 0;
    for round in 0..10 {
        for path in [
            "/v1/chat/%63ompletions",
            "/v1/chat/completion%73",
            "/v1/%63hat/completions",
            "/%761/chat/completions",
        ] {
            let status = post(proxy.addr, path, &body).await.status;
            assert!(status == 200 || status == 429, "{round} {path}: {status}");
            passed += usize::from(status == 200);
        }
    }
    assert_eq!(passed, 5);
    assert_eq!(upstream.count(), 5);
    for n in 0..5 {
        assert_eq!(upstream.request(n).path, "/v1/chat/completions");
    }
}

/// Model names a client invents share the upstream's key: 40 names can't make 40 sets of
/// windows.
#[tokio::test]
async fn invented_model_names_share_one_key() {
    let upstream = HostileUpstream::start(|_, _| {
        vec![Step::Write(hostile::json(200, &[], &chat_answer(3, 1)))]
    })
    .await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{}"
        url = "{}"
        profile = "generic"
        requests = "5/10s"
        timeout_seconds = 0.2
        "#,
        fresh("models"),
        upstream.url()
    ))
    .await;
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let addr = proxy.addr;
            tokio::spawn(async move {
                let body = json!({"model": format!("made-up-{i}"), "messages": [{"role": "user", "content": "hi"}]});
                post(addr, "/v1/chat/completions", &body).await.status.as_u16()
            })
        })
        .collect();
    let mut passed = 0;
    for task in calls {
        passed += usize::from(task.await.unwrap() == 200);
    }
    assert_eq!(passed, 5);
    assert_eq!(upstream.count(), 5);
    let text = get(proxy.addr, "/metrics").await.body_str();
    assert!(!text.contains("made-up"), "a model name became a label");
}

/// Fields the estimate skipped pay now: a gzip body, the responses API's `instructions`, a
/// call with no `max_tokens` (it reserves its model's most output, as far as the window
/// holds). 15 calls at once against 3,000 tokens per 10 s: one passes, as for a plain body.
#[tokio::test]
async fn fields_the_estimate_skipped_are_charged() {
    let prompt = text(2_000);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(
        json!({"model": "gpt-4o", "max_tokens": 10, "messages": [{"role": "user", "content": prompt}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let gz = gz.finish().unwrap();
    let cases: Vec<(&str, &str, Vec<u8>, Headers)> = vec![
        ("gzip", "/v1/chat/completions", gz, vec![("content-encoding", "gzip")]),
        (
            "instructions",
            "/v1/responses",
            json!({"model": "gpt-4o", "max_output_tokens": 10, "instructions": prompt, "input": "hi"})
                .to_string()
                .into_bytes(),
            vec![],
        ),
        (
            "no max_tokens",
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Write at length."}]})
                .to_string()
                .into_bytes(),
            vec![],
        ),
    ];
    for (what, path, body, headers) in cases {
        let upstream = HostileUpstream::start(|_, _| {
            vec![
                Step::Sleep(Duration::from_millis(300)),
                Step::Write(hostile::json(200, &[], &chat_answer(2_000, 10))),
            ]
        })
        .await;
        let proxy = proxy(&openai(
            &fresh("fields"),
            &upstream.url(),
            r#"requests = "100/10s"
            tokens = "3000/10s"
            timeout_seconds = 0.2"#,
        ))
        .await;
        let calls: Vec<_> = (0..15)
            .map(|_| {
                let (addr, body, headers) = (proxy.addr, body.clone(), headers.clone());
                tokio::spawn(async move { call(addr, path, &headers, body).await.status.as_u16() })
            })
            .collect();
        let mut statuses = Vec::new();
        for task in calls {
            statuses.push(task.await.unwrap());
        }
        assert_eq!(upstream.count(), 1, "{what}: {statuses:?}");
    }
}

/// With tenants, a call can't escape its tenant or spend another's: no tenant is 401 (or the
/// default tenant, when one is set), a header tenant needs the front proxy's secret, and
/// credentials are read strictly.
#[tokio::test]
async fn tenants_cannot_be_escaped_or_spoofed() {
    let upstream = HostileUpstream::start(|_, _| {
        vec![Step::Write(hostile::json(200, &[], &chat_answer(3, 1)))]
    })
    .await;
    // SAFETY of the test: the variable is this test's own (unique name).
    unsafe { std::env::set_var("TOLLGATE_TEST_TENANT_SECRET", "front-proxy-secret-123") };
    let headers_proxy = proxy(&format!(
        r#"
        [tenants]
        from = "header:x-team"
        header_secret_env = "TOLLGATE_TEST_TENANT_SECRET"
        requests = "3/10s"
        {}"#,
        openai(&fresh("th"), &upstream.url(), r#"requests = "100/10s""#)
    ))
    .await;
    let body = serde_json::to_vec(&json!({"model": "gpt-4o", "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}]}))
    .unwrap();
    let path = "/v1/chat/completions";
    let status = |answer: Answer| answer.status.as_u16();
    assert_eq!(
        status(call(headers_proxy.addr, path, &[], body.clone()).await),
        401
    );
    assert_eq!(
        status(call(headers_proxy.addr, path, &[("x-team", "bob")], body.clone()).await),
        401
    );
    let secret = ("tollgate-tenant-secret", "front-proxy-secret-123");
    assert_eq!(
        status(
            call(
                headers_proxy.addr,
                path,
                &[("x-team", "bob"), secret],
                body.clone()
            )
            .await
        ),
        200
    );
    let key_proxy = proxy(&format!(
        r#"
        [tenants]
        from = "key"
        requests = "3/10s"
        {}"#,
        openai(&fresh("tk"), &upstream.url(), r#"requests = "100/10s""#)
    ))
    .await;
    for headers in [
        vec![],
        vec![("authorization", "Basic dXNlcjpwYXNz")],
        vec![("authorization", "Bearer\tsk-real")],
        vec![("authorization", "Bearer junk"), ("x-api-key", "sk-real")],
    ] {
        assert_eq!(
            status(call(key_proxy.addr, path, &headers, body.clone()).await),
            401,
            "{headers:?}"
        );
    }
    assert_eq!(
        status(
            call(
                key_proxy.addr,
                path,
                &[("authorization", "Bearer sk-real")],
                body.clone()
            )
            .await
        ),
        200
    );
    // A default tenant takes the calls that name none, in its own windows: 3 of 5 pass.
    let default_proxy = proxy(&format!(
        r#"
        [tenants]
        from = "key"
        default = "anonymous"
        requests = "3/10s"
        {}"#,
        openai(
            &fresh("td"),
            &upstream.url(),
            r#"requests = "100/10s"
        timeout_seconds = 0.1"#
        )
    ))
    .await;
    let mut passed = 0;
    for _ in 0..5 {
        passed +=
            usize::from(status(call(default_proxy.addr, path, &[], body.clone()).await) == 200);
    }
    assert_eq!(passed, 3);
}

/// A client that leaves a stream early keeps its reservation charged: the upstream generated
/// on (it had written 121,650 events when 57,118 tokens were settled and the rest refunded).
#[tokio::test]
async fn a_client_that_leaves_a_stream_keeps_its_reservation_charged() {
    let upstream = HostileUpstream::start(|_, _| {
        let mut steps = vec![Step::Write(hostile::stream_head(&[]))];
        for _ in 0..200 {
            steps.push(Step::Write(hostile::event(&delta(
                json!({"content": "word "}),
            ))));
            steps.push(Step::Sleep(Duration::from_millis(10)));
        }
        steps
    })
    .await;
    let name = fresh("leave");
    let proxy = proxy(&openai(
        &name,
        &upstream.url(),
        r#"requests = "100/m"
        tokens = "1000000/30d"
        estimate_margin = "0%""#,
    ))
    .await;
    let body = json!({"model": "gpt-4o", "stream": true, "max_tokens": 200000,
        "messages": [{"role": "user", "content": "hi"}]});
    let request = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let mut stream = response.into_body();
    for _ in 0..3 {
        stream.frame().await.unwrap().unwrap();
    }
    drop(stream);
    // The prompt (3 + "user" + "hi" + 3 = 8 tokens) and the whole reservation stay charged.
    let mut paid = 0;
    for _ in 0..200 {
        paid = 1_000_000 - level(proxy.addr, &format!("{name}:gpt-4o"), "tokens").await;
        let text = get(proxy.addr, "/metrics").await.body_str();
        if metric(
            &text,
            &format!(r#"tollgate_proxy_cut_short_total{{upstream="{name}"}}"#),
        ) == Some(1.0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(paid, 200_000 + 8);
}

/// Ordinary mistakes are refused with what was likely meant, and a request in the other
/// provider's shape never goes on with its key.
#[tokio::test]
async fn mistakes_are_refused_with_a_hint_and_keys_never_reach_the_wrong_provider() {
    let upstream = HostileUpstream::start(|_, _| {
        vec![Step::Write(hostile::json(200, &[], &chat_answer(3, 1)))]
    })
    .await;
    let proxy = proxy(&openai(
        &fresh("mis"),
        &upstream.url(),
        r#"requests = "100/m""#,
    ))
    .await;
    let body = serde_json::to_vec(&json!({"model": "gpt-4o", "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}]}))
    .unwrap();
    // OPENAI_BASE_URL without /v1.
    let answer = call(
        proxy.addr,
        "/chat/completions",
        &[("authorization", "Bearer sk-x")],
        body.clone(),
    )
    .await;
    assert_eq!(answer.status, 404);
    assert!(
        answer.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1")
    );
    // The Anthropic SDK pointed here: Anthropic's answer shape, and its key goes nowhere.
    let anthropic = [
        ("x-api-key", "sk-ant-secret"),
        ("anthropic-version", "2023-06-01"),
    ];
    for path in ["/v1/messages", "/v1/v1/messages", "/v1/chat/completions"] {
        let answer = call(proxy.addr, path, &anthropic, body.clone()).await;
        assert_eq!(answer.status, 404, "{path}");
        assert_eq!(answer.json()["type"], "error", "{path}");
    }
    // Unknown paths are refused by default, spending ones among them.
    for path in [
        "/v1/images/generations",
        "/v1/audio/speech",
        "/v1/batches",
        "/v1/files",
    ] {
        assert_eq!(
            call(proxy.addr, path, &[], body.clone()).await.status,
            404,
            "{path}"
        );
    }
    assert_eq!(upstream.count(), 0);
}

/// A virtual key reaches only the metered routes (and the free ones): an unmetered path never
/// goes up with the organization's real key, even when other paths pass.
#[tokio::test]
async fn virtual_keys_never_carry_the_real_key_to_an_unmetered_path() {
    let upstream = HostileUpstream::start(|_, _| {
        vec![Step::Write(hostile::json(200, &[], &json!({"data": []})))]
    })
    .await;
    // SAFETY of the test: the variable is this test's own (unique name).
    unsafe { std::env::set_var("TOLLGATE_TEST_REAL_KEY_PATHS", "sk-org-real") };
    let proxy = proxy(&format!(
        r#"
        other_paths = "pass"
        [tenants]
        virtual_keys = {{ "vk-carol-1234" = "carol" }}
        {}"#,
        openai(
            &fresh("vkp"),
            &upstream.url(),
            r#"requests = "100/m"
            api_key_env = "TOLLGATE_TEST_REAL_KEY_PATHS""#
        )
    ))
    .await;
    let vk = [("authorization", "Bearer vk-carol-1234")];
    assert_eq!(
        call(proxy.addr, "/v1/files", &vk, b"{}".to_vec())
            .await
            .status,
        404
    );
    let deleted = http::Request::delete(format!("http://{}/v1/files/file-1", proxy.addr))
        .header("authorization", "Bearer vk-carol-1234")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let deleted = client().request(deleted).await.unwrap();
    assert_eq!(deleted.status(), 404);
    assert_eq!(upstream.count(), 0);
    // The free model list goes, with the real key.
    let models = http::Request::get(format!("http://{}/v1/models", proxy.addr))
        .header("authorization", "Bearer vk-carol-1234")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(client().request(models).await.unwrap().status(), 200);
    assert_eq!(
        upstream.request(0).header("authorization"),
        Some("Bearer sk-org-real")
    );
}
