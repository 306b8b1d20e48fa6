//! Issue 31's promises tried again, as a hostile tenant, a hostile upstream and a careless
//! operator would try them: each test is named for the promise it holds the proxy to.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tollgate_testkit::hostile::{self, HostileUpstream, Step};

use crate::common::*;
use crate::holds::{ALICE, BOB, REAL_KEY, as_tenant, owners_config, real_key, storing};
use crate::org::{CHAT, budget_left, chat, fresh};

/// Sends `body` as it is (bytes) to `path` as `key`'s tenant, with `headers`.
async fn raw_as(
    addr: std::net::SocketAddr,
    key: &str,
    method: http::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Answer {
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client()
        .request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .expect("the proxy answers");
    let (head, body) = response.into_parts();
    Answer {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.expect("a whole body").to_bytes(),
    }
}

/// `text` as UTF-16 (little-endian, with its byte-order mark): Python's `json.loads` reads it.
fn utf16(text: &str) -> Vec<u8> {
    let mut out = vec![0xFF, 0xFE];
    for unit in text.encode_utf16() {
        out.extend_from_slice(&unit.to_le_bytes());
    }
    out
}

/// The spellings of one JSON body that a Python or JavaScript server reads as that body (and
/// the proxy's gate reads so too), but that a strict parser refuses.
fn lenient_spellings(body: &serde_json::Value) -> Vec<(&'static str, Vec<u8>)> {
    let text = body.to_string();
    let mut with_nan = body.clone();
    with_nan["temperature"] = json!(0.5);
    let with_nan = with_nan.to_string().replace("0.5", "NaN");
    let surrogate = text.replacen('{', r#"{"user":"\ud800","#, 1);
    vec![
        (
            "a byte-order mark",
            [&b"\xEF\xBB\xBF"[..], text.as_bytes()].concat(),
        ),
        ("UTF-16", utf16(&text)),
        ("NaN", with_nan.into_bytes()),
        ("a lone surrogate", surrogate.into_bytes()),
    ]
}

// ---------------------------------------------------------------------------------------------
// Stored objects belong to the tenant that created them, whatever the body's spelling.

/// Bob can't continue Alice's response by spelling his body as a Python server still reads
/// it (a byte-order mark, UTF-16, a `NaN`, a lone surrogate): the proxy reads the ids it names
/// as the upstream will.
#[tokio::test]
async fn a_body_spelled_leniently_cannot_name_another_tenants_objects() {
    use http::Method;
    let upstream = Scripted::start(storing).await;
    let name = fresh("lenient-owners-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&owners_config(&name, &var, &upstream.url(), None)).await;
    let addr = running.addr;
    let ask = json!({"model": "gpt-4o", "input": "my secret plan", "max_output_tokens": 20});
    let created = as_tenant(addr, ALICE, Method::POST, "/v1/responses", &ask).await;
    assert_eq!(created.status, 200, "{}", created.body_str());
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let seen_before = upstream.count.load(Ordering::SeqCst);
    let continued = json!({"model": "gpt-4o", "input": "and?", "previous_response_id": id, "max_output_tokens": 20});
    // A passed path too (other_paths = "pass"): a run on Alice's thread.
    let run = json!({"assistant_id": "asst_x", "thread_id": id});
    for (path, body) in [("/v1/responses", &continued), ("/v1/threads/runs", &run)] {
        for (spelling, bytes) in lenient_spellings(body) {
            let answer = raw_as(addr, BOB, Method::POST, path, &[], bytes).await;
            assert_eq!(
                answer.status,
                404,
                "{path} with {spelling}: {}",
                answer.body_str()
            );
        }
    }
    assert_eq!(
        upstream.count.load(Ordering::SeqCst),
        seen_before,
        "Bob reached nothing"
    );
}

/// Stored objects of every family are the tenant's: Bob can neither list the organisation's
/// evals, videos or ChatKit threads nor read one of Alice's by its id (the proxy's list of
/// collections had no such families, so they passed to the organisation's key).
#[tokio::test]
async fn stored_objects_of_every_family_belong_to_their_tenant() {
    use http::Method;
    let upstream = Scripted::start(|n, seen| {
        let path = seen.path.split('?').next().unwrap_or("").to_owned();
        let id = match path.as_str() {
            "/v1/evals" => format!("eval_{n:08}abcdef"),
            "/v1/videos" => format!("video_{n:08}abcdef"),
            _ => path.clone(),
        };
        json_response(200, &[], &json!({"id": id, "object": "thing", "data": []}))
    })
    .await;
    let name = fresh("families-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&owners_config(&name, &var, &upstream.url(), None)).await;
    let addr = running.addr;
    let eval = as_tenant(
        addr,
        ALICE,
        Method::POST,
        "/v1/evals",
        &json!({"name": "mine"}),
    )
    .await;
    assert_eq!(eval.status, 200, "{}", eval.body_str());
    let eval = eval.json()["id"].as_str().unwrap().to_owned();
    let video = as_tenant(
        addr,
        ALICE,
        Method::POST,
        "/v1/videos",
        &json!({"prompt": "a cat"}),
    )
    .await;
    assert_eq!(video.status, 200, "{}", video.body_str());
    let video = video.json()["id"].as_str().unwrap().to_owned();
    let seen_before = upstream.count.load(Ordering::SeqCst);
    for path in ["/v1/evals", "/v1/videos", "/v1/chatkit/threads"] {
        let answer = as_tenant(addr, BOB, Method::GET, path, &json!(null)).await;
        assert_eq!(answer.status, 403, "{path}: {}", answer.body_str());
    }
    for path in [
        format!("/v1/evals/{eval}"),
        format!("/v1/evals/{eval}/runs"),
        format!("/v1/videos/{video}/content"),
    ] {
        let answer = as_tenant(addr, BOB, Method::GET, &path, &json!(null)).await;
        assert_eq!(answer.status, 404, "{path}: {}", answer.body_str());
    }
    assert_eq!(upstream.count.load(Ordering::SeqCst), seen_before);
    // Alice reads her own.
    for path in [
        format!("/v1/evals/{eval}"),
        format!("/v1/videos/{video}/content"),
    ] {
        let answer = as_tenant(addr, ALICE, Method::GET, &path, &json!(null)).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body_str());
    }
}

// ---------------------------------------------------------------------------------------------
// Nothing the organisation holds reaches a tenant, whatever shape the echo takes.

fn scrub_config(name: &str, var: &str, url: &str) -> String {
    format!(
        r#"
        [tenants]
        virtual_keys = {{ "vk-bob-00000" = "bob" }}
        [[upstream]]
        name = "{name}"
        url = "{url}"
        profile = "openai"
        requests = "1000/d"
        retries = 0
        api_key_env = "{var}"
        "#
    )
}

/// An upstream that echoes the key in a trailer field (after a chunked body) hands it to no
/// tenant, whether the tenant reads over HTTP/2 (where trailers always pass) or asks for
/// trailers over HTTP/1.1.
#[tokio::test]
async fn the_organisations_key_is_masked_in_trailers() {
    let upstream = HostileUpstream::start(|_, request| {
        let echoed = request.header("authorization").unwrap_or("").to_owned();
        let body = chat_answer(5, 2).to_string();
        vec![Step::Write(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\ntrailer: x-echo\r\nconnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\nx-echo: {echoed}\r\n\r\n",
                body.len()
            )
            .into_bytes(),
        )]
    })
    .await;
    let name = fresh("trailers-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&scrub_config(&name, &var, &upstream.url())).await;
    let h2: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    for (path, method, body) in [
        (CHAT, http::Method::POST, chat("gpt-4o", 10).to_string()),
        ("/v1/models", http::Method::GET, String::new()),
    ] {
        for two in [true, false] {
            let request = http::Request::builder()
                .method(method.clone())
                .uri(format!("http://{}{path}", running.addr))
                .header("authorization", "Bearer vk-bob-00000")
                .header("content-type", "application/json")
                .header("te", "trailers")
                .body(Full::new(Bytes::from(body.clone())))
                .unwrap();
            let response = if two {
                h2.request(request).await
            } else {
                client().request(request).await
            }
            .expect("the proxy answers");
            assert_eq!(response.status(), 200, "{path}");
            let collected = response.into_body().collect().await.unwrap();
            let trailers = format!("{:?}", collected.trailers());
            let text = String::from_utf8_lossy(&collected.to_bytes()).into_owned();
            assert!(!trailers.contains(REAL_KEY), "{path} h2 {two}: {trailers}");
            assert!(!text.contains(REAL_KEY), "{path} h2 {two}: {text}");
        }
    }
}

/// An upstream that compresses its answer though the proxy asked for none (a CDN or a server
/// that always does) can't slip the key past the mask inside gzip or deflate; an answer in a
/// coding the proxy can't read is not handed on at all (502).
#[tokio::test]
async fn the_organisations_key_is_masked_in_a_compressed_echo() {
    use std::io::Write as _;
    let upstream = HostileUpstream::start(move |n, request| {
        let echoed = request.header("authorization").unwrap_or("").to_owned();
        let (status, body) = if n % 2 == 0 {
            (401, json!({"error": {"message": format!("bad key: {echoed}"), "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}))
        } else {
            let mut answer = chat_answer(5, 2);
            answer["choices"][0]["message"]["content"] = json!(echoed);
            (200, answer)
        };
        let text = body.to_string();
        let (coding, body) = match (n / 2) % 3 {
            0 => {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                encoder.write_all(text.as_bytes()).unwrap();
                ("gzip", encoder.finish().unwrap())
            }
            1 => {
                let mut encoder =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
                encoder.write_all(text.as_bytes()).unwrap();
                ("deflate", encoder.finish().unwrap())
            }
            // Not zstd at all: the key in plain, under a coding the proxy doesn't decode.
            _ => ("zstd", text.into_bytes()),
        };
        let mut out = hostile::head(
            status,
            &[
                ("content-type", "application/json"),
                ("content-encoding", coding),
                ("content-length", &body.len().to_string()),
            ],
        );
        out.extend_from_slice(&body);
        vec![Step::Write(out)]
    })
    .await;
    let name = fresh("gzip-echo-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&scrub_config(&name, &var, &upstream.url())).await;
    for n in 0..12 {
        // Metered calls and free ones (the models), each coding in an error and an answer.
        let (path, method, body) = if n < 6 {
            (
                CHAT,
                http::Method::POST,
                chat("gpt-4o", 10).to_string().into_bytes(),
            )
        } else {
            ("/v1/models", http::Method::GET, Vec::new())
        };
        let answer = raw_as(running.addr, "vk-bob-00000", method, path, &[], body).await;
        let text = answer.body_str();
        assert!(!text.contains(REAL_KEY), "{path} {}: {text}", answer.status);
        assert!(
            answer.headers.get("content-encoding").is_none(),
            "{path} {n}"
        );
        if (n / 2) % 3 == 2 {
            assert_eq!(answer.status, 502, "{path} {n}: {text}");
        } else {
            assert!(text.contains("Bearer [redacted]***"), "{path} {n}: {text}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A budget's overrun is bounded by one call, whatever the proxy can't see.

/// The tenant's budget config of `holds`, with `$1/d`, and the upstream at `url`.
fn dave(name: &str, url: &str) -> String {
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    crate::holds::budget_config(name, &var, url)
}

/// A responses call whose input the proxy can't see (a file by URL): billed 60,000 tokens of
/// input by the stand-ins here.
fn unseen(model: &str) -> serde_json::Value {
    json!({"model": model, "max_output_tokens": 10,
        "input": [{"role": "user", "content": [
            {"type": "input_file", "file_url": "https://example.com/report.pdf"},
            {"type": "input_text", "text": "Summarise"}]}]})
}

/// What one such call is billed on gpt-4o: 60,000 tokens in at $2.50 a million, 10 out at $10.
const UNSEEN_BILL: u64 = (60_000 * 2_500_000 + 10 * 10_000_000) / 1_000_000;

/// A burst spelled leniently (a byte-order mark) is still one at a time until the first is
/// billed, then reserved at the ceiling: it stops within one call of the budget.
#[tokio::test]
async fn a_body_spelled_leniently_still_reserves_the_inputs_the_proxy_cant_see() {
    let upstream =
        crate::holds::Slow::start(Duration::from_millis(300), crate::holds::hidden_usage).await;
    let name = fresh("lenient-hidden-");
    let running = proxy(&dave(&name, &format!("http://{}", upstream.addr))).await;
    let body = [
        &b"\xEF\xBB\xBF"[..],
        unseen("gpt-4o").to_string().as_bytes(),
    ]
    .concat();
    let calls: Vec<_> = (0..60)
        .map(|_| {
            let (addr, body) = (running.addr, body.clone());
            tokio::spawn(async move {
                raw_as(
                    addr,
                    "vk-dave-00000",
                    http::Method::POST,
                    "/v1/responses",
                    &[],
                    body,
                )
                .await
                .status
            })
        })
        .collect();
    let mut ok = 0;
    for call in calls {
        ok += u64::from(call.await.unwrap() == 200);
    }
    assert_eq!(upstream.answered.load(Ordering::SeqCst), ok);
    assert!(
        ok * UNSEEN_BILL <= 1_000_000 + UNSEEN_BILL,
        "{ok} calls admitted: ${} billed of $1",
        (ok * UNSEEN_BILL) as f64 / 1e6
    );
}

/// Snapshots of one model are one model: calls with unseen inputs naming gpt-4o's dated
/// snapshots still go one at a time until one is billed (each spelling had a turn of its own,
/// so as many went at once, each reserved without its unseen input).
#[tokio::test]
async fn a_models_snapshots_share_its_turn_for_unseen_inputs() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let upstream = {
        let arrivals = Arc::clone(&arrivals);
        HostileUpstream::start(move |_, _| {
            arrivals.lock().unwrap().push(std::time::Instant::now());
            vec![
                Step::Sleep(Duration::from_millis(300)),
                Step::Write(hostile::json(
                    200,
                    &[],
                    &json!({"id": "resp_x", "object": "response", "status": "completed", "output": [],
                        "usage": {"input_tokens": 60_000, "output_tokens": 10, "total_tokens": 60_010}}),
                )),
            ]
        })
        .await
    };
    let name = fresh("snapshots-");
    let running = proxy(&dave(&name, &upstream.url())).await;
    // The key's first call goes alone (the gate waits for its answer's headers): past it,
    // what holds the calls below back is their unseen input alone.
    let warm = json!({"model": "gpt-4o", "max_output_tokens": 10, "input": "hello"});
    let warmed = raw_as(
        running.addr,
        "vk-dave-00000",
        http::Method::POST,
        "/v1/responses",
        &[],
        warm.to_string().into_bytes(),
    )
    .await;
    assert_eq!(warmed.status, 200);
    arrivals.lock().unwrap().clear();
    let calls: Vec<_> = ["gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"]
        .into_iter()
        .map(|model| {
            let addr = running.addr;
            tokio::spawn(async move {
                raw_as(
                    addr,
                    "vk-dave-00000",
                    http::Method::POST,
                    "/v1/responses",
                    &[],
                    unseen(model).to_string().into_bytes(),
                )
                .await
                .status
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    // The first call's answer takes 300 ms: the second can't have gone before it.
    let mut arrivals = arrivals.lock().unwrap().clone();
    arrivals.sort_unstable();
    assert_eq!(arrivals.len(), 3);
    let gap = arrivals[1] - arrivals[0];
    assert!(
        gap >= Duration::from_millis(300),
        "the second went {gap:?} after the first"
    );
}

/// A stream of a call with unseen inputs that the tenant leaves after its first event, again
/// and again: the provider bills each its 60,000 tokens of input, and the budget still stops
/// the tenant within one call's bill of its end (each left call had kept only its reservation
/// without the unseen input and freed its turn, so the next went alone too, unbounded).
#[tokio::test]
async fn leaving_streams_with_unseen_inputs_cannot_take_a_budget_past_one_call() {
    let upstream = HostileUpstream::start(|_, _| {
        let created = json!({"type": "response.created", "response": {"id": "resp_s", "object": "response", "status": "in_progress"}});
        let done = json!({"type": "response.completed", "response": {"id": "resp_s", "object": "response", "status": "completed",
            "output": [], "usage": {"input_tokens": 60_000, "output_tokens": 10, "total_tokens": 60_010}}});
        vec![
            Step::Write(hostile::stream_head(&[])),
            Step::Write(format!("event: response.created\ndata: {created}\n\n").into_bytes()),
            Step::Sleep(Duration::from_millis(200)),
            Step::Write(format!("event: response.completed\ndata: {done}\n\n").into_bytes()),
        ]
    })
    .await;
    let name = fresh("left-hidden-");
    let running = proxy(&dave(&name, &upstream.url())).await;
    let mut body = unseen("gpt-4o");
    body["stream"] = json!(true);
    let mut admitted = 0u64;
    for _ in 0..20 {
        let request = http::Request::post(format!("http://{}/v1/responses", running.addr))
            .header("authorization", "Bearer vk-dave-00000")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = client().request(request).await.unwrap();
        if response.status() != 200 {
            continue;
        }
        admitted += 1;
        // The first event, then the tenant hangs up.
        let mut body = response.into_body();
        let _ = body.frame().await;
        drop(body);
    }
    // The proxy read each left stream to its end: its bill taught the ceiling, and the calls
    // after the first were reserved at it (not refused for want of a turn).
    assert!(admitted >= 2, "{admitted} calls admitted");
    assert!(
        admitted * UNSEEN_BILL <= 1_000_000 + UNSEEN_BILL,
        "{admitted} calls admitted: ${} billed of $1",
        (admitted * UNSEEN_BILL) as f64 / 1e6
    );
}

/// A background response (`"background": true`) with unseen inputs answers at once, queued,
/// without its usage, which comes later where the proxy doesn't see it: under a budget such a
/// call is refused (each had gone alone, reserved without its unseen input, freed its turn as
/// soon as it was queued and settled at its visible estimate, 20 of 20 admitted under $1 for
/// $3 billed), before and after a call in the foreground taught the ceiling.
#[tokio::test]
async fn background_calls_with_unseen_inputs_cannot_take_a_budget_past_one_call() {
    let upstream = Scripted::start(|n, seen| {
        let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap_or_default();
        if body["background"] == json!(true) {
            json_response(
                200,
                &[],
                &json!({"id": format!("resp_bg{n}"), "object": "response", "status": "queued", "output": []}),
            )
        } else {
            json_response(
                200,
                &[],
                &json!({"id": format!("resp_fg{n}"), "object": "response", "status": "completed", "output": [],
                    "usage": {"input_tokens": 60_000, "output_tokens": 10, "total_tokens": 60_010}}),
            )
        }
    })
    .await;
    let name = fresh("background-");
    let running = proxy(&dave(&name, &upstream.url())).await;
    let foreground = unseen("gpt-4o");
    let mut background = foreground.clone();
    background["background"] = json!(true);
    let call = |body: &serde_json::Value| {
        raw_as(
            running.addr,
            "vk-dave-00000",
            http::Method::POST,
            "/v1/responses",
            &[],
            body.to_string().into_bytes(),
        )
    };
    let mut admitted = 0u64;
    for i in 0..20 {
        if i == 10 {
            assert_eq!(call(&foreground).await.status, 200);
            admitted += 1;
        }
        let answer = call(&background).await;
        assert_eq!(answer.status, 400, "{}", answer.body_str());
    }
    assert_eq!(upstream.count.load(Ordering::SeqCst), admitted);
}

/// The call that goes alone and is answered without its usage (an upstream that reports none)
/// teaches nothing: the next such call doesn't go alone as blind as it did (it had, and so
/// every call after it, each kept at its visible estimate), but waits for a ceiling, and is
/// refused 429 by its deadline.
#[tokio::test]
async fn a_call_with_unseen_inputs_answered_without_its_bill_holds_the_next() {
    let upstream = Scripted::start(|n, _| {
        json_response(
            200,
            &[],
            &json!({"id": format!("resp_{n}"), "object": "response", "status": "completed", "output": []}),
        )
    })
    .await;
    let name = fresh("unbilled-");
    let running = proxy(&format!(
        "{}timeout_seconds = 1\n",
        dave(&name, &upstream.url())
    ))
    .await;
    let call = || {
        raw_as(
            running.addr,
            "vk-dave-00000",
            http::Method::POST,
            "/v1/responses",
            &[],
            unseen("gpt-4o").to_string().into_bytes(),
        )
    };
    assert_eq!(call().await.status, 200);
    let held = call().await;
    assert_eq!(held.status, 429, "{}", held.body_str());
    assert_eq!(upstream.count.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------------------------
// An error without usage spends no money.

fn error_budget_config(name: &str, url: &str) -> String {
    format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tiers.team]
        spend = "$1/365d"
        spend_total = "$1/365d"
        [tenants]
        default_tier = "team"
        from = "header:x-team"
        trusted_network = true
        [tenants.tier_of]
        alice = "team"
        [[upstream]]
        name = "{name}"
        url = "{url}"
        profile = "openai"
        requests = "1000/s"
        spend = "$1/365d"
        retries = 0
        "#
    )
}

async fn all_budgets_full(running: &tollgate_proxy::Running, name: &str) {
    for key in [
        "budget:tenant:alice".to_owned(),
        "budget:tier:team".to_owned(),
        format!("budget:upstream:{name}"),
    ] {
        let mut left = 0.0;
        for _ in 0..100 {
            left = budget_left(running, &key).await;
            if left >= 1_000_000.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            (1_000_000.0..1_000_000.5).contains(&left),
            "{key} holds {left}"
        );
    }
}

/// A 429 handed on (a transient one with no retries left, and a spent quota) is billed
/// nothing: every budget gets its reservation back.
#[tokio::test]
async fn a_429_handed_on_spends_no_money() {
    let upstream = Scripted::start(|n, _| {
        if n % 2 == 0 {
            json_response(
                429,
                &[("retry-after", "0")],
                &json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
            )
        } else {
            json_response(
                429,
                &[],
                &json!({"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}),
            )
        }
    })
    .await;
    let name = fresh("handed-429-");
    let running = proxy(&error_budget_config(&name, &upstream.url())).await;
    for _ in 0..4 {
        let answer = send(
            running.addr,
            CHAT,
            &[("x-team", "alice"), ("authorization", "Bearer sk-a")],
            Bytes::from(chat("gpt-4o", 10_000).to_string()),
        )
        .await;
        assert_eq!(answer.status, 429, "{}", answer.body_str());
    }
    all_budgets_full(&running, &name).await;
}

/// An error whose body the tenant doesn't wait for (it hangs up after the head) is billed
/// nothing by the provider: every budget gets its reservation back all the same.
#[tokio::test]
async fn an_error_the_tenant_leaves_early_spends_no_money() {
    let upstream = HostileUpstream::start(|_, _| {
        let body = json!({"error": {"message": "bad request", "type": "invalid_request_error", "param": null, "code": null}}).to_string();
        let mut out = hostile::head(
            400,
            &[
                ("content-type", "application/json"),
                ("content-length", &body.len().to_string()),
            ],
        );
        out.extend_from_slice(&body.as_bytes()[..10]);
        vec![
            Step::Write(out),
            Step::Sleep(Duration::from_millis(500)),
            Step::Write(body.as_bytes()[10..].to_vec()),
        ]
    })
    .await;
    let name = fresh("left-error-");
    let running = proxy(&error_budget_config(&name, &upstream.url())).await;
    for _ in 0..3 {
        let request = http::Request::post(format!("http://{}{CHAT}", running.addr))
            .header("x-team", "alice")
            .header("authorization", "Bearer sk-a")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(chat("gpt-4o", 10_000).to_string())))
            .unwrap();
        let response = client().request(request).await.unwrap();
        assert_eq!(response.status(), 400);
        drop(response);
    }
    all_budgets_full(&running, &name).await;
}

// ---------------------------------------------------------------------------------------------
// Pools that route around trouble.

/// A member that sends a stream's head and then nothing (a stalled backend behind a live
/// front) is a dead member: every streamed call is answered whole by the other member, none
/// waits for the chunk timeout, and the dead one is ejected.
#[tokio::test]
async fn a_pool_member_that_stalls_after_its_head_is_routed_around() {
    let east =
        HostileUpstream::start(|_, _| vec![Step::Write(hostile::stream_head(&[])), Step::Hold])
            .await;
    let west = crate::org::roomy().await;
    let name = fresh("stall-");
    let limits = "requests = \"1000/d\"\ntimeout_seconds = 4\nchunk_timeout_seconds = 3";
    let running = proxy(&crate::org::pool_config(
        &name,
        &east.url(),
        &format!("http://{}", west.addr),
        limits,
        limits,
    ))
    .await;
    let mut body = chat("gpt-4o", 10);
    body["stream"] = json!(true);
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let (addr, body) = (running.addr, body.clone());
            tokio::spawn(async move {
                let began = std::time::Instant::now();
                let request = http::Request::post(format!("http://{addr}{CHAT}"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.to_string())))
                    .unwrap();
                let response = client().request(request).await.unwrap();
                let status = response.status();
                let whole = response
                    .into_body()
                    .collect()
                    .await
                    .map(|c| String::from_utf8_lossy(&c.to_bytes()).contains("[DONE]"))
                    .unwrap_or(false);
                (status, whole, began.elapsed())
            })
        })
        .collect();
    for call in calls {
        let (status, whole, took) = call.await.unwrap();
        assert_eq!(status, 200);
        assert!(whole, "a stream broke off after {took:?}");
        assert!(took < Duration::from_secs(3), "took {took:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Operators' data for operators.

/// A password with `/`, `?` or `#` in it (unescaped, as a careless operator pastes it) is
/// masked all the same in every error that quotes its URL.
#[test]
fn a_url_password_with_any_character_is_masked() {
    for url in [
        "https://user:pa/ss-hunter2@api.example.com",
        "https://user:pa?ss-hunter2@api.example.com",
        "https://user:pa#ss-hunter2@api.example.com",
        "redis://:p/w?x#hunter2@10.0.0.5:6379",
    ] {
        let shown = tollgate_proxy::config::masked(&format!("redis: bad url `{url}`: it failed"));
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("pa"), "{shown}");
        let file = format!("[[upstream]]\nurl = \"{url}\"\nrequests = \"1/s\"\n");
        if let Err(err) = tollgate_proxy::Config::from_toml(&file) {
            let text = format!("{err} {err:?}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Images at their model's rule, whatever the model is called.

/// Ten high-detail images by URL on a model that bills gpt-4o-mini's rule (2,833 an image and
/// 5,667 a tile) cost about $0.07 of input: a `$0.01` budget can never pay for such a call,
/// whether the model is gpt-4o-mini, a fine-tune of it (`ft:gpt-4o-mini:...`, billed at its
/// base model's rule) or an Azure deployment that serves it (they were reserved at gpt-4o's
/// 85 and 170, 33 times less, and passed).
#[tokio::test]
async fn images_are_reserved_at_the_rule_of_the_model_that_reads_them() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(5, 2))).await;
    let image = json!({"type": "image_url", "image_url": {"url": "https://example.com/page.png", "detail": "high"}});
    let content: Vec<_> = std::iter::repeat_n(image, 10).collect();
    let body = |model: &str| {
        let mut body =
            json!({"max_tokens": 10, "messages": [{"role": "user", "content": content}]});
        if !model.is_empty() {
            body["model"] = json!(model);
        }
        Bytes::from(body.to_string())
    };
    let name = fresh("ft-images-");
    let running = proxy(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        requests = "1000/d"
        spend = "$0.01/d"
        [upstream.models."ft:gpt-4o-mini-2024-07-18:acme::abc123"]
        price = {{ input = 0.30, cached_input = 0.15, output = 1.20 }}
        [[upstream]]
        name = "{name}-azure"
        url = "{}"
        profile = "azure-openai"
        requests = "1000/d"
        spend = "$0.01/d"
        mount = "/azure"
        [upstream.models."prod-mini"]
        model = "gpt-4o-mini"
        "#,
        upstream.url(),
        upstream.url()
    ))
    .await;
    for (path, model) in [
        (CHAT, "gpt-4o-mini"),
        (CHAT, "ft:gpt-4o-mini-2024-07-18:acme::abc123"),
        (
            "/azure/openai/deployments/prod-mini/chat/completions?api-version=2024-10-21",
            "",
        ),
    ] {
        let answer = send(running.addr, path, &[("api-key", "k")], body(model)).await;
        assert_eq!(answer.status, 429, "{path} {model}: {}", answer.body_str());
        assert_eq!(
            answer.json()["error"]["code"],
            "insufficient_quota",
            "{path} {model}"
        );
    }
    assert_eq!(upstream.count.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------------------------
// The organisation and project billed are the organisation's to choose.

/// A tenant can't choose the organisation or project billed by spelling the header with an
/// underscore (`OpenAI_Organization`), which servers that read headers as CGI variables take
/// for the same header.
#[tokio::test]
async fn a_tenant_cannot_choose_the_organisation_billed_with_an_underscored_header() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(5, 2))).await;
    let name = fresh("org-underscore-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&scrub_config(&name, &var, &upstream.url())).await;
    let answer = send(
        running.addr,
        CHAT,
        &[
            ("authorization", "Bearer vk-bob-00000"),
            ("openai_organization", "org-someone-else"),
            ("OpenAI_Project", "proj_someone_else"),
        ],
        Bytes::from(chat("gpt-4o", 10).to_string()),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body_str());
    let seen = upstream.seen.lock().unwrap().last().cloned().unwrap();
    for (name, _) in &seen.headers {
        let name = name.as_str().replace('_', "-");
        assert!(
            name != "openai-organization" && name != "openai-project",
            "{:?}",
            seen.headers
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Stored objects: every spelling of a path, and what an answer may claim.

/// Paths that name Alice's response in another spelling (the collection's case, a trailing
/// slash, a query, a dot segment) reach nothing of hers for Bob.
#[tokio::test]
async fn every_spelling_of_a_stored_objects_path_is_its_owners() {
    use http::Method;
    let upstream = Scripted::start(storing).await;
    let name = fresh("spellings-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&owners_config(&name, &var, &upstream.url(), None)).await;
    let addr = running.addr;
    let ask = json!({"model": "gpt-4o", "input": "my secret plan", "max_output_tokens": 20});
    let created = as_tenant(addr, ALICE, Method::POST, "/v1/responses", &ask).await;
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let seen_before = upstream.count.load(Ordering::SeqCst);
    for path in [
        format!("/v1/Responses/{id}"),
        format!("/V1/responses/{id}"),
        format!("/v1/responses/{id}/"),
        format!("/v1/responses/{id}?include=x"),
        format!("/v1/./responses/{id}"),
        format!("/v1/responses/./{id}"),
        format!("/v1/%72esponses/{id}"),
    ] {
        let answer = as_tenant(addr, BOB, Method::GET, &path, &json!(null)).await;
        assert_ne!(answer.status, 200, "{path}: {}", answer.body_str());
    }
    assert_eq!(upstream.count.load(Ordering::SeqCst), seen_before);
}

/// What a tenant uploads is not the provider's word: a file whose content names Alice's
/// response, thread and file as if in an answer (`"id"`, `"thread_id"`, `"output_file_id"`)
/// gives Bob none of them when he downloads it (the ids read from the download had been
/// recorded as his, taking them from Alice).
#[tokio::test]
async fn downloading_a_file_that_names_anothers_objects_makes_them_no_ones_but_their_owners() {
    use http::Method;
    let stored: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let upstream = {
        let stored = Arc::clone(&stored);
        Scripted::start(move |n, seen| {
            let path = seen.path.split('?').next().unwrap_or("").to_owned();
            if path == "/v1/files" {
                let mut files = stored.lock().unwrap();
                files.push(seen.body.clone());
                return json_response(
                    200,
                    &[],
                    &json!({"id": format!("file-{}", files.len() - 1), "object": "file"}),
                );
            }
            if let Some(rest) = path.strip_prefix("/v1/files/file-")
                && let Some(index) = rest.strip_suffix("/content")
            {
                let files = stored.lock().unwrap();
                let body = files[index.parse::<usize>().unwrap()].clone();
                return http::Response::builder()
                    .status(200)
                    .header("content-type", "application/octet-stream")
                    .body(Full::new(body))
                    .unwrap();
            }
            storing(n, seen)
        })
        .await
    };
    let name = fresh("file-claims-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&owners_config(&name, &var, &upstream.url(), None)).await;
    let addr = running.addr;
    let ask = json!({"model": "gpt-4o", "input": "my secret plan", "max_output_tokens": 20});
    let created = as_tenant(addr, ALICE, Method::POST, "/v1/responses", &ask).await;
    let id = created.json()["id"].as_str().unwrap().to_owned();
    // Bob uploads a "file" (a multipart body, not JSON) that reads like an answer.
    let claim = format!(
        "--b\r\ncontent-disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n\r\n{{\"id\": \"{id}\", \"thread_id\": \"thread_alice1\", \"output_file_id\": \"file-0\"}}\r\n--b--\r\n"
    );
    let uploaded = raw_as(
        addr,
        BOB,
        Method::POST,
        "/v1/files",
        &[("content-type", "multipart/form-data; boundary=b")],
        claim.into_bytes(),
    )
    .await;
    assert_eq!(uploaded.status, 200, "{}", uploaded.body_str());
    let file = uploaded.json()["id"].as_str().unwrap().to_owned();
    let download = as_tenant(
        addr,
        BOB,
        Method::GET,
        &format!("/v1/files/{file}/content"),
        &json!(null),
    )
    .await;
    assert_eq!(download.status, 200, "{}", download.body_str());
    let read = as_tenant(
        addr,
        BOB,
        Method::GET,
        &format!("/v1/responses/{id}"),
        &json!(null),
    )
    .await;
    assert_eq!(read.status, 404, "{}", read.body_str());
    let mine = as_tenant(
        addr,
        ALICE,
        Method::GET,
        &format!("/v1/responses/{id}"),
        &json!(null),
    )
    .await;
    assert_eq!(mine.status, 200, "{}", mine.body_str());
}

/// Fields that name a stored object without ending in `_id`: a fine-tuning job's
/// `training_file` and `validation_file`, an eval run's data source `{"type": "file_id",
/// "id": ...}`. Bob can't fine-tune on Alice's file or run an eval over it (they went up).
#[tokio::test]
async fn a_body_cannot_name_anothers_file_in_any_field() {
    use http::Method;
    let upstream = Scripted::start(storing).await;
    let name = fresh("file-fields-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&owners_config(&name, &var, &upstream.url(), None)).await;
    let addr = running.addr;
    let file = as_tenant(
        addr,
        ALICE,
        Method::POST,
        "/v1/files",
        &json!({"purpose": "fine-tune"}),
    )
    .await;
    assert_eq!(file.status, 200, "{}", file.body_str());
    let file = file.json()["id"].as_str().unwrap().to_owned();
    let seen_before = upstream.count.load(Ordering::SeqCst);
    for (path, body) in [
        (
            "/v1/fine_tuning/jobs",
            json!({"model": "gpt-4o-mini-2024-07-18", "training_file": file}),
        ),
        (
            "/v1/fine_tuning/jobs",
            json!({"model": "gpt-4o-mini-2024-07-18", "training_file": "file-bob", "validation_file": file}),
        ),
        (
            "/v1/evals/eval_bob1/runs",
            json!({"data_source": {"type": "jsonl", "source": {"type": "file_id", "id": file}}}),
        ),
    ] {
        let answer = as_tenant(addr, BOB, Method::POST, path, &body).await;
        assert_eq!(answer.status, 404, "{path} {body}: {}", answer.body_str());
    }
    assert_eq!(upstream.count.load(Ordering::SeqCst), seen_before);
}

/// An input item by reference (`{"type": "item_reference", "id": ...}`) brings input the proxy
/// can't see, like a previous response: such calls go one at a time until one is billed.
#[tokio::test]
async fn an_item_by_reference_is_an_input_the_proxy_cant_see() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let upstream = {
        let arrivals = Arc::clone(&arrivals);
        HostileUpstream::start(move |_, _| {
            arrivals.lock().unwrap().push(std::time::Instant::now());
            vec![
                Step::Sleep(Duration::from_millis(300)),
                Step::Write(hostile::json(
                    200,
                    &[],
                    &json!({"id": "resp_x", "object": "response", "status": "completed", "output": [],
                        "usage": {"input_tokens": 60_000, "output_tokens": 10, "total_tokens": 60_010}}),
                )),
            ]
        })
        .await
    };
    let name = fresh("item-reference-");
    let running = proxy(&dave(&name, &upstream.url())).await;
    // The key's first call goes alone (the gate waits for its answer's headers): past it,
    // what holds the calls below back is their unseen input alone.
    let warm = json!({"model": "gpt-4o", "max_output_tokens": 10, "input": "hello"});
    let warmed = raw_as(
        running.addr,
        "vk-dave-00000",
        http::Method::POST,
        "/v1/responses",
        &[],
        warm.to_string().into_bytes(),
    )
    .await;
    assert_eq!(warmed.status, 200);
    arrivals.lock().unwrap().clear();
    let body = json!({"model": "gpt-4o", "max_output_tokens": 10,
        "input": [{"type": "item_reference", "id": "msg_0123456789abcdef"},
            {"role": "user", "content": "and then?"}]});
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let (addr, body) = (running.addr, body.to_string());
            tokio::spawn(async move {
                raw_as(
                    addr,
                    "vk-dave-00000",
                    http::Method::POST,
                    "/v1/responses",
                    &[],
                    body.into_bytes(),
                )
                .await
                .status
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    let mut arrivals = arrivals.lock().unwrap().clone();
    arrivals.sort_unstable();
    assert_eq!(arrivals.len(), 2);
    let gap = arrivals[1] - arrivals[0];
    assert!(
        gap >= Duration::from_millis(300),
        "the second went {gap:?} after the first"
    );
}
