//! What an operator reads (issue 23, item 8): readiness apart from liveness, a store outage
//! counted, streams a client left counted apart from whole answers, histograms a fleet can
//! sum, request logs with the call's tenant, model, tokens and wait, and lines a client can't
//! forge.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use tollgate_testkit::Captured;
use tollgate_testkit::hostile::{self, HostileUpstream, Step};
use tollgate_testkit::redis::RedisServer;

use crate::common::*;

fn fresh(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// `/readyz` is 503 while the store can't be reached and while draining; `/healthz` stays
/// liveness. A call while Redis is down is 503, logged and counted.
#[tokio::test]
async fn readiness_follows_the_store_and_the_drain() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let upstream = HostileUpstream::start(|_, _| {
        vec![Step::Write(hostile::json(200, &[], &chat_answer(3, 1)))]
    })
    .await;
    let proxy = proxy(&format!(
        r#"
        redis = "{}"
        [[upstream]]
        name = "{}"
        url = "{}"
        profile = "openai"
        requests = "100/m"
        timeout_seconds = 2
        "#,
        redis.url(),
        fresh("ready"),
        upstream.url()
    ))
    .await;
    assert_eq!(get(proxy.addr, "/readyz").await.status, 200);
    drop(redis);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let ready = get(proxy.addr, "/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.body_str());
    assert_eq!(get(proxy.addr, "/healthz").await.status, 200);
    let body = json!({"model": "gpt-4o", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    let answer = post(proxy.addr, "/v1/chat/completions", &body).await;
    assert_eq!(answer.status, 503);
    let text = get(proxy.addr, "/metrics").await.body_str();
    assert!(
        metric(&text, "tollgate_proxy_store_errors_total").is_some_and(|n| n >= 2.0),
        "{text}"
    );
    assert_eq!(upstream.count(), 0);
    let addr = proxy.addr;
    let draining = tokio::spawn(proxy.shutdown());
    let _ = draining.await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// `tollgate_proxy_cut_short_total` counts streams a client left, not whole answers (it
/// counted every plain answer).
#[tokio::test]
async fn cut_short_counts_only_streams_a_client_left() {
    let upstream = HostileUpstream::start(|n, _| {
        if n < 3 {
            vec![Step::Write(hostile::json(200, &[], &chat_answer(3, 1)))]
        } else {
            let mut steps = vec![Step::Write(hostile::stream_head(&[]))];
            for _ in 0..100 {
                steps.push(Step::Write(hostile::event(
                    &json!({"choices": [{"delta": {"content": "x "}}]}),
                )));
                steps.push(Step::Sleep(Duration::from_millis(20)));
            }
            steps
        }
    })
    .await;
    let name = fresh("cut");
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        requests = "100/m"
        "#,
        upstream.url()
    ))
    .await;
    let series = format!(r#"tollgate_proxy_cut_short_total{{upstream="{name}"}}"#);
    let body = json!({"model": "gpt-4o", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..3 {
        assert_eq!(
            post(proxy.addr, "/v1/chat/completions", &body).await.status,
            200
        );
    }
    let text = get(proxy.addr, "/metrics").await.body_str();
    assert_eq!(metric(&text, &series).unwrap_or(0.0), 0.0, "{text}");
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let request = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .body(http_body_util::Full::new(Bytes::from(
            stream_body.to_string(),
        )))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let mut stream = response.into_body();
    stream.frame().await.unwrap().unwrap();
    drop(stream);
    let mut cut = 0.0;
    for _ in 0..100 {
        cut = metric(&get(proxy.addr, "/metrics").await.body_str(), &series).unwrap_or(0.0);
        if cut == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(cut, 1.0);
}

/// Waits and latencies are histograms with `_bucket` series (summaries can't be summed across
/// a fleet), and requests are counted by upstream, route and status.
#[tokio::test]
async fn latencies_are_histograms_and_requests_are_counted_by_status_and_route() {
    let upstream = HostileUpstream::start(|_, _| {
        vec![Step::Write(hostile::json(200, &[], &chat_answer(3, 1)))]
    })
    .await;
    let name = fresh("hist");
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        requests = "100/m"
        "#,
        upstream.url()
    ))
    .await;
    let body = json!({"model": "gpt-4o", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        post(proxy.addr, "/v1/chat/completions", &body).await.status,
        200
    );
    assert_eq!(
        post(proxy.addr, "/v1/images/generations", &body)
            .await
            .status,
        404
    );
    let text = get(proxy.addr, "/metrics").await.body_str();
    for family in [
        "tollgate_wait_seconds_bucket",
        "tollgate_proxy_upstream_seconds_bucket",
        "tollgate_proxy_added_seconds_bucket",
    ] {
        assert!(text.contains(family), "no {family} in:\n{text}");
    }
    assert!(!text.contains("quantile="), "a summary in:\n{text}");
    let requests =
        format!(r#"tollgate_proxy_requests_total{{upstream="{name}",route="chat",status="200"}}"#);
    assert_eq!(metric(&text, &requests), Some(1.0), "{text}");
    assert!(
        text.contains(
            r#"tollgate_proxy_requests_total{upstream="-",route="refused",status="404"}"#
        ),
        "{text}"
    );
}

/// A call's log line carries its tenant, model, estimated and settled tokens, wait and
/// upstream status; what a client chose is escaped, so a model named with a newline can't
/// forge a line.
#[test]
fn a_calls_log_line_carries_its_tokens_and_cannot_be_forged() {
    // SAFETY of the test: the variable is this test's own (unique name).
    unsafe { std::env::set_var("TOLLGATE_TEST_REAL_KEY_LOG", "sk-org-logged") };
    let captured = Captured::default();
    let _capture = captured.capture();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let upstream = HostileUpstream::start(|_, _| {
            vec![Step::Write(hostile::json(200, &[], &chat_answer(9, 2)))]
        })
        .await;
        let proxy = proxy(&format!(
            r#"
            [tenants]
            virtual_keys = {{ "vk-logged-1234" = "dana" }}
            [[upstream]]
            name = "{}"
            url = "{}"
            profile = "openai"
            requests = "100/m"
            tokens = "100000/m"
            api_key_env = "TOLLGATE_TEST_REAL_KEY_LOG"
            "#,
            fresh("log"),
            upstream.url()
        ))
        .await;
        let body = json!({"model": "gpt-4o\nforged=line", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]});
        let answer = send(
            proxy.addr,
            "/v1/chat/completions",
            &[("authorization", "Bearer vk-logged-1234")],
            Bytes::from(body.to_string()),
        )
        .await;
        assert_eq!(answer.status, 200);
    });
    let text = captured.text();
    let line = text
        .lines()
        .find(|l| l.contains("message=call"))
        .unwrap_or_else(|| panic!("no call line in:\n{text}"));
    for field in [
        "tenant=\"dana\"",
        "estimated=",
        "settled=\"11\"",
        "wait_ms=",
        "upstream_status=200",
    ] {
        assert!(line.contains(field), "{field} not in {line}");
    }
    assert!(line.contains(r"gpt-4o\\nforged=line"), "{line}");
    assert!(!text.contains("vk-logged-1234") && !text.contains("sk-org-logged"));
}
