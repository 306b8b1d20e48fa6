//! Money and tenants hold (issue 31): what the proxy can't see can't overrun a budget, an error
//! costs nothing, nothing the organisation holds reaches a tenant, operators' data stays with
//! operators, and pools route around trouble.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use crate::common::*;
use crate::org::{CHAT, budget_left, chat, fresh};

/// The organisation's real key, as the tests' upstreams see it.
pub(crate) const REAL_KEY: &str = "sk-org-REAL-0123456789abcdef";

/// Sets the variable `api_key_env` names (each test its own variable).
pub(crate) fn real_key(var: &str) {
    // SAFETY of the test: the variable is this test's own, and nothing reads it concurrently.
    unsafe { std::env::set_var(var, REAL_KEY) };
}

// ---------------------------------------------------------------------------------------------
// An error without usage spends no money.

/// Upstream errors without usage (400, 401, 500, 503, each with a JSON error body and its
/// length) give back every micro-dollar they reserved, in the tenant's budget, the tier's shared
/// one and the upstream's, while the tenant's request window keeps each request. (Before: each
/// error kept its reservation, and nine of them spent most of a $1 budget.)
#[tokio::test]
async fn an_error_without_usage_gives_its_reservation_back_to_every_budget() {
    let failing = Scripted::start(|n, _| {
        let status = [400, 401, 500, 503][n as usize % 4];
        json_response(
            status,
            &[],
            &json!({"error": {"message": "no", "type": "server_error", "param": null, "code": null}}),
        )
    })
    .await;
    let name = fresh("errors-free-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tiers.team]
        requests = "100/d"
        spend = "$1/365d"
        spend_total = "$1/365d"
        [tenants]
        default_tier = "team"
        virtual_keys = {{ "vk-alice-0000" = "alice" }}
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        requests = "1000/d"
        spend = "$1/365d"
        retries = 0
        api_key_env = "{var}"
        "#,
        failing.url()
    ))
    .await;
    for i in 0..9 {
        let answer = send(
            running.addr,
            CHAT,
            &[("authorization", "Bearer vk-alice-0000")],
            Bytes::from(chat("gpt-4o", 10_000).to_string()),
        )
        .await;
        assert_eq!(
            answer.status,
            [400, 401, 500, 503][i % 4],
            "{}",
            answer.body_str()
        );
    }
    assert_eq!(failing.count.load(Ordering::SeqCst), 9);
    for key in [
        "budget:tenant:alice".to_owned(),
        "budget:tier:team".to_owned(),
        format!("budget:upstream:{name}"),
    ] {
        // Settled as each body ended: nothing left to wait for.
        let mut left = budget_left(&running, &key).await;
        for _ in 0..250 {
            if left >= 1_000_000.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            left = budget_left(&running, &key).await;
        }
        assert!(
            (1_000_000.0..1_000_000.5).contains(&left),
            "{key} holds {left}"
        );
    }
    assert_eq!(
        level(running.addr, &format!("{name}:tenant:alice"), "requests").await,
        91
    );
}

// ---------------------------------------------------------------------------------------------
// Nothing the organisation holds reaches a tenant.

/// What the scripted upstream echoes the `Authorization` it received in, by call number.
fn echoing(n: u64, seen: &Seen) -> http::Response<http_body_util::Full<Bytes>> {
    let echoed = seen
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    match n {
        0 => json_response(
            401,
            &[],
            &json!({"error": {"message": format!("bad key: {echoed}"), "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
        ),
        1 => json_response(
            500,
            &[],
            &json!({"error": {"message": format!("failed for {echoed}"), "type": "server_error", "param": null, "code": null}}),
        ),
        2 => {
            let mut answer = chat_answer(5, 2);
            answer["choices"][0]["message"]["content"] = json!(echoed);
            json_response(200, &[("x-debug-auth", &echoed)], &answer)
        }
        _ => {
            let first = json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": echoed}}]});
            let usage = json!({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}});
            http::Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .body(http_body_util::Full::new(Bytes::from(format!(
                    "data: {first}\n\ndata: {usage}\n\ndata: [DONE]\n\n"
                ))))
                .unwrap()
        }
    }
}

/// An upstream that echoes the `Authorization` it received (in a 401's body, a 500's, a 200's
/// and a response header, a stream's first event) never hands the organisation's real key to
/// the tenant: every answer has it masked (it had come back verbatim in all four shapes).
#[tokio::test]
async fn the_organisations_key_is_masked_in_everything_an_upstream_echoes() {
    let echo = Scripted::start(echoing).await;
    let name = fresh("scrub-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&format!(
        r#"
        [tenants]
        virtual_keys = {{ "vk-bob-00000" = "bob" }}
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        requests = "1000/d"
        retries = 0
        api_key_env = "{var}"
        "#,
        echo.url()
    ))
    .await;
    let statuses = [401, 500, 200, 200];
    for (i, status) in statuses.into_iter().enumerate() {
        let mut body = chat("gpt-4o", 10);
        if i == 3 {
            body["stream"] = json!(true);
        }
        let answer = send(
            running.addr,
            CHAT,
            &[("authorization", "Bearer vk-bob-00000")],
            Bytes::from(body.to_string()),
        )
        .await;
        assert_eq!(answer.status, status, "{}", answer.body_str());
        let text = answer.body_str();
        assert!(!text.contains(REAL_KEY), "call {i}: {text}");
        assert!(text.contains("Bearer [redacted]"), "call {i}: {text}");
        for (name, value) in &answer.headers {
            let value = String::from_utf8_lossy(value.as_bytes());
            assert!(!value.contains(REAL_KEY), "call {i}: {name}: {value}");
        }
        if i == 2 {
            assert!(
                answer.headers["x-debug-auth"]
                    .to_str()
                    .unwrap()
                    .starts_with("Bearer [redacted]*"),
                "{:?}",
                answer.headers
            );
        }
    }
    // The upstream did get the real key: it is the answers that are masked.
    let seen = echo.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    assert!(
        seen.iter()
            .all(|s| s.headers["authorization"] == format!("Bearer {REAL_KEY}"))
    );
}

/// A tenant's `OpenAI-Organization` and `OpenAI-Project` never go up beside the organisation's
/// real key (they had, so a tenant chose the organisation and project billed); an upstream
/// with `tenant_org_headers = true` lets them through.
#[tokio::test]
async fn a_tenant_cannot_choose_the_organisation_or_project_billed() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(5, 2))).await;
    for allowed in [false, true] {
        let name = fresh("org-headers-");
        let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
        real_key(&var);
        let running = proxy(&format!(
            r#"
            [tenants]
            virtual_keys = {{ "vk-carol-0000" = "carol" }}
            [[upstream]]
            name = "{name}"
            url = "{}"
            profile = "openai"
            requests = "1000/d"
            api_key_env = "{var}"
            {}
            "#,
            upstream.url(),
            if allowed {
                "tenant_org_headers = true"
            } else {
                ""
            }
        ))
        .await;
        let answer = send(
            running.addr,
            CHAT,
            &[
                ("authorization", "Bearer vk-carol-0000"),
                ("openai-organization", "org-someone-else"),
                ("openai-project", "proj_someone_else"),
            ],
            Bytes::from(chat("gpt-4o", 10).to_string()),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
        let seen = upstream.seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(
            seen.headers.get("openai-organization").is_some(),
            allowed,
            "{:?}",
            seen.headers
        );
        assert_eq!(seen.headers.get("openai-project").is_some(), allowed);
    }
}

// ---------------------------------------------------------------------------------------------
// Operators' data for operators.

/// A GET with these headers.
async fn get_with(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = http::Request::get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client()
        .request(
            request
                .body(http_body_util::Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .expect("the proxy answers");
    let (head, body) = response.into_parts();
    use http_body_util::BodyExt;
    Answer {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// `/metrics` (every tenant's name, spend and levels) answers no one on the clients' listener
/// without the configured token (it answered anyone, with no key); the admin listener serves
/// it, and the clients' listener with the token.
#[tokio::test]
async fn metrics_are_for_operators_only() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(5, 2))).await;
    let name = fresh("metrics-");
    let toml = format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        requests = "1000/d"
        "#,
        upstream.url()
    );
    // Without a token configured (built here, not by `proxy`, which gives one).
    let mut config = tollgate_proxy::Config::from_toml(&toml).unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    let running = tollgate_proxy::Proxy::bind(config).await.unwrap().spawn();
    for headers in [
        vec![],
        vec![("authorization", "Bearer tests-metrics-token-0123")],
    ] {
        let answer = get_with(running.addr, "/metrics", &headers).await;
        assert_eq!(answer.status, 404, "{}", answer.body_str());
        assert!(!answer.body_str().contains("tollgate_"));
    }
    let admin = running.admin.unwrap();
    let served = get_with(admin, "/metrics", &[]).await;
    assert_eq!(served.status, 200);
    assert!(served.body_str().contains("tollgate_proxy_"));
    // With a token: only with it.
    let running = proxy(&toml).await;
    for (headers, status) in [
        (vec![], 404),
        (
            vec![("authorization", "Bearer tests-metrics-token-0124")],
            404,
        ),
        (
            vec![("authorization", "Bearer tests-metrics-token-0123")],
            200,
        ),
    ] {
        let answer = get_with(running.addr, "/metrics", &headers).await;
        assert_eq!(answer.status, status, "{headers:?}");
    }
}

/// The live view answers only to its own address and the names `admin_hosts` lists: a page
/// reaching it through another name (DNS rebinding) is refused (it answered any `Host`).
#[tokio::test]
async fn the_live_view_answers_only_to_its_own_names() {
    let file = |hosts: &str| {
        format!(
            "admin_listen = \"127.0.0.1:0\"\n{hosts}\n[[upstream]]\nurl = \"http://127.0.0.1:9\"\nrequests = \"1/s\"\n"
        )
    };
    let running = proxy(&file("")).await;
    let admin = running.admin.unwrap();
    let port = admin.port();
    for (host, status) in [
        (format!("127.0.0.1:{port}"), 200),
        (format!("localhost:{port}"), 200),
        (format!("rebind.attacker.example:{port}"), 421),
        ("127.0.0.1:1".to_owned(), 421),
        ("ops.example.com".to_owned(), 421),
    ] {
        for path in ["/admin/api/keys", "/admin/", "/metrics"] {
            let answer = get_with(admin, path, &[("host", &host)]).await;
            assert_eq!(answer.status, status, "{host} {path}");
            if status != 200 {
                assert!(!answer.body_str().contains("keys"), "{host} {path}");
            }
        }
    }
    // A name the operator lists is answered.
    let running = proxy(&file("admin_hosts = [\"ops.example.com\"]")).await;
    let answer = get_with(
        running.admin.unwrap(),
        "/admin/api/keys",
        &[("host", "ops.example.com")],
    )
    .await;
    assert_eq!(answer.status, 200);
}

/// An upstream URL's password never appears in a configuration's errors, at start or at a
/// reload (it was printed as written).
#[tokio::test]
async fn a_urls_password_never_appears_in_an_error() {
    let file = r#"
        [[upstream]]
        name = "secret-url"
        url = "ftp://admin:hunter2-password@10.0.0.7:8000/v1"
        requests = "1/s"
        [[upstream]]
        name = "other"
        url = "https://user:hunter2-password@api.example.com?x=1"
        requests = "1/s"
    "#;
    let err = tollgate_proxy::Config::from_toml(file).unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("ftp://***@10.0.0.7:8000/v1"), "{text}");
    // A file that doesn't parse quotes its line: masked too.
    let err = tollgate_proxy::Config::from_toml(
        "[[upstream]]\nurl = \"https://user:hunter2-password@api.example.com\" nonsense\n",
    )
    .unwrap_err();
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err}");
    // At a reload, refused and logged: the same text.
    let running = proxy("[[upstream]]\nurl = \"http://127.0.0.1:9\"\nrequests = \"1/s\"\n").await;
    let mut config =
        tollgate_proxy::Config::from_toml("[[upstream]]\nurl = \"http://127.0.0.1:9\"\n").unwrap();
    config.upstreams[0].url = "http://user:hunter2-password@127.0.0.1:9".parse().unwrap();
    config.upstreams[0].profile = "no-such-profile".to_owned();
    let err = running.reloader.reload(config).await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err}");
}

/// The live view shows a budget in dollars: `$5/d` reads $5 of $5 (it read "5,000,000 of
/// 5,000,000"), beside the micro-dollars its windows count in.
#[tokio::test]
async fn the_live_view_shows_money_in_dollars() {
    let name = fresh("dollars-");
    let running = proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [[upstream]]
        name = "{name}"
        url = "http://127.0.0.1:9"
        requests = "1/s"
        spend = "$5/d"
        "#
    ))
    .await;
    let view = crate::org::view(&running).await;
    let entry = crate::org::entry(&view, &format!("budget:upstream:{name}"));
    let window = &entry["windows"][0];
    assert_eq!(window["capacity"], 5_000_000);
    assert_eq!(window["dollars"]["rate"], "$5/d");
    assert_eq!(window["dollars"]["capacity"], 5.0);
    assert_eq!(window["dollars"]["level"], 5.0);
    let page = get(running.admin.unwrap(), "/admin/").await.body_str();
    assert!(
        page.contains("w.dollars.capacity"),
        "the page draws dollars"
    );
}

// ---------------------------------------------------------------------------------------------
// Pools that route around trouble.

/// An upstream that accepts connections and never answers; counts the connections.
pub(crate) struct Hanging {
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Hanging {
    pub(crate) async fn start() -> Hanging {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = std::sync::Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        Hanging {
            addr,
            accepted,
            task,
        }
    }
}

impl Drop for Hanging {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A pool of two whose east member hangs: 50 calls at once are all answered (from west), none
/// waiting its 4 s deadline: an attempt at east moves on after its share of the time left (half
/// of it, by default), and east, failing three in a row, is passed over by the calls after
/// (before: 25 of 50 ended in 504 after the whole deadline).
#[tokio::test]
async fn a_pool_with_a_hanging_member_answers_every_call_well_inside_its_deadline() {
    let east = Hanging::start().await;
    let west = crate::org::roomy().await;
    let name = fresh("hang-");
    let limits = "requests = \"1000/d\"\ntimeout_seconds = 4";
    let running = proxy(&crate::org::pool_config(
        &name,
        &format!("http://{}", east.addr),
        &format!("http://{}", west.addr),
        limits,
        limits,
    ))
    .await;
    let started = std::time::Instant::now();
    let calls = (0..50).map(|_| {
        let addr = running.addr;
        tokio::spawn(async move {
            let began = std::time::Instant::now();
            let answer = send(addr, CHAT, &[], Bytes::from(chat("gpt-4o", 10).to_string())).await;
            (answer.status, began.elapsed())
        })
    });
    let mut slowest = Duration::ZERO;
    for call in calls.collect::<Vec<_>>() {
        let (status, took) = call.await.unwrap();
        assert_eq!(status, 200);
        slowest = slowest.max(took);
    }
    assert!(slowest < Duration::from_secs(3), "slowest {slowest:?}");
    assert_eq!(west.stats.ok.load(Ordering::Relaxed), 50);
    // Ejected: the calls after it don't try east at all.
    let tried = east.accepted.load(Ordering::SeqCst);
    for _ in 0..10 {
        let answer = send(
            running.addr,
            CHAT,
            &[],
            Bytes::from(chat("gpt-4o", 10).to_string()),
        )
        .await;
        assert_eq!(answer.status, 200);
    }
    assert_eq!(east.accepted.load(Ordering::SeqCst), tried);
    assert!(started.elapsed() < Duration::from_secs(4));
    let text = get(running.addr, "/metrics").await.body_str();
    assert_eq!(
        metric(
            &text,
            &format!(r#"tollgate_proxy_pool_ejections_total{{upstream="{name}-east"}}"#)
        ),
        Some(1.0),
        "{text}"
    );
}

/// A member whose own budget is spent is skipped and the other member serves (before, 151 of
/// 200 calls were refused `insufficient_quota` while west had $100 left); a member that answers
/// 500 gets its budget's charge back (24 failed attempts had drained east's) and, failing three
/// in a row, is passed over.
#[tokio::test]
async fn each_member_of_a_pool_pays_its_own_budget_and_a_spent_or_failing_one_is_skipped() {
    let east = crate::org::roomy().await;
    let west = crate::org::roomy().await;
    let name = fresh("pool-budget-");
    let running = proxy(&format!(
        "admin_listen = \"127.0.0.1:0\"\n{}",
        crate::org::pool_config(
            &name,
            &format!("http://{}", east.addr),
            &format!("http://{}", west.addr),
            "requests = \"1000/d\"\nspend = \"$0.0005/365d\"",
            "requests = \"1000/d\"\nspend = \"$100/365d\"",
        )
    ))
    .await;
    for i in 0..40 {
        let answer = send(
            running.addr,
            CHAT,
            &[],
            Bytes::from(chat("gpt-4o", 10).to_string()),
        )
        .await;
        assert_eq!(answer.status, 200, "call {i}: {}", answer.body_str());
    }
    let served_east = east.stats.ok.load(Ordering::Relaxed);
    assert_eq!(served_east + west.stats.ok.load(Ordering::Relaxed), 40);
    assert!(served_east >= 1, "east served {served_east}");
    // East served until its budget could pay no more (a call reserves about $0.00013), and
    // never went past it.
    let east_left = budget_left(&running, &format!("budget:upstream:{name}-east")).await;
    assert!(
        (0.0..200.0).contains(&east_left),
        "east's budget holds {east_left}"
    );
    let west_left = budget_left(&running, &format!("budget:upstream:{name}-west")).await;
    assert!(west_left < 100_000_000.0, "west paid for what it served");

    // East answers 500 to everything: its budget keeps nothing of the attempts.
    let failing = Scripted::start(|_, _| {
        json_response(
            500,
            &[],
            &json!({"error": {"message": "The server had an error", "type": "server_error", "param": null, "code": null}}),
        )
    })
    .await;
    let west = crate::org::roomy().await;
    let name = fresh("pool-500-");
    let running = proxy(&format!(
        "admin_listen = \"127.0.0.1:0\"\n{}",
        crate::org::pool_config(
            &name,
            &failing.url(),
            &format!("http://{}", west.addr),
            "requests = \"1000/d\"\nspend = \"$1/365d\"",
            "requests = \"1000/d\"",
        )
    ))
    .await;
    for i in 0..20 {
        let answer = send(
            running.addr,
            CHAT,
            &[],
            Bytes::from(chat("gpt-4o", 10).to_string()),
        )
        .await;
        assert_eq!(answer.status, 200, "call {i}: {}", answer.body_str());
    }
    assert_eq!(west.stats.ok.load(Ordering::Relaxed), 20);
    assert_eq!(
        failing.count.load(Ordering::SeqCst),
        3,
        "ejected after three"
    );
    let mut left = 0.0;
    for _ in 0..250 {
        left = budget_left(&running, &format!("budget:upstream:{name}-east")).await;
        if left >= 1_000_000.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        (1_000_000.0..1_000_000.5).contains(&left),
        "east holds {left}"
    );
}

// ---------------------------------------------------------------------------------------------
// Stored objects belong to the tenant that created them.

/// A stand-in for stored objects: a response created by POST /v1/responses (an id per call,
/// streamed when asked), a file by POST /v1/files; reads, deletes and lists answer 200.
pub(crate) fn storing(n: u64, seen: &Seen) -> http::Response<http_body_util::Full<Bytes>> {
    let path = seen.path.split('?').next().unwrap_or("").to_owned();
    let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap_or_default();
    match path.as_str() {
        "/v1/responses" if body["stream"] == json!(true) => {
            let created = json!({"type": "response.created", "response": {"id": format!("resp_{n}"), "object": "response", "status": "in_progress"}});
            let done = json!({"type": "response.completed", "response": {"id": format!("resp_{n}"), "object": "response", "status": "completed", "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}});
            http::Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .body(http_body_util::Full::new(Bytes::from(format!(
                    "event: response.created\ndata: {created}\n\nevent: response.completed\ndata: {done}\n\n"
                ))))
                .unwrap()
        }
        "/v1/responses" => json_response(
            200,
            &[],
            &json!({"id": format!("resp_{n}"), "object": "response", "status": "completed",
                "output": [{"type": "message", "id": "msg_1", "content": [{"type": "output_text", "text": "private answer"}]}],
                "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}),
        ),
        "/v1/files" if seen.headers.contains_key("content-type") && !seen.body.is_empty() => {
            json_response(
                200,
                &[],
                &json!({"id": format!("file-{n}"), "object": "file"}),
            )
        }
        _ => json_response(
            200,
            &[],
            &json!({"id": path, "object": "thing", "data": []}),
        ),
    }
}

/// Sends `method` to `path` as `key`'s tenant, with `body` (empty: none).
pub(crate) async fn as_tenant(
    addr: std::net::SocketAddr,
    key: &str,
    method: http::Method,
    path: &str,
    body: &serde_json::Value,
) -> Answer {
    use http_body_util::BodyExt;
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"));
    let bytes = if body.is_null() {
        Bytes::new()
    } else {
        request = request.header("content-type", "application/json");
        Bytes::from(body.to_string())
    };
    let response = client()
        .request(request.body(http_body_util::Full::new(bytes)).unwrap())
        .await
        .unwrap();
    let (head, body) = response.into_parts();
    Answer {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

pub(crate) fn owners_config(name: &str, var: &str, url: &str, redis: Option<&str>) -> String {
    let redis = redis.map_or_else(String::new, |r| format!("redis = \"{r}\""));
    format!(
        r#"
        {redis}
        other_paths = "pass"
        [tenants]
        virtual_keys = {{ "vk-alice-0001" = "alice", "vk-bob-00002" = "bob" }}
        virtual_key_paths = "any"
        [[upstream]]
        name = "{name}"
        url = "{url}"
        profile = "openai"
        requests = "1000/d"
        api_key_env = "{var}"
        "#
    )
}

pub(crate) const ALICE: &str = "vk-alice-0001";
pub(crate) const BOB: &str = "vk-bob-00002";

/// Bob can't read, delete or continue Alice's stored response, nor read her file, nor list the
/// organisation's objects (each had answered 200 with her data); Alice can, and so can a
/// response created in a stream. The provider's 404 shape.
#[tokio::test]
async fn a_tenant_reaches_only_the_stored_objects_it_created() {
    use http::Method;
    let upstream = Scripted::start(storing).await;
    let name = fresh("owners-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&owners_config(&name, &var, &upstream.url(), None)).await;
    let addr = running.addr;
    let ask = json!({"model": "gpt-4o", "input": "my secret plan", "max_output_tokens": 20});
    let created = as_tenant(addr, ALICE, Method::POST, "/v1/responses", &ask).await;
    assert_eq!(created.status, 200, "{}", created.body_str());
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let stream = as_tenant(addr, ALICE, Method::POST, "/v1/responses", &streamed).await;
    assert_eq!(stream.status, 200);
    let stream_id = format!("resp_{}", 1);
    assert!(stream.body_str().contains(&stream_id));
    let file = as_tenant(
        addr,
        ALICE,
        Method::POST,
        "/v1/files",
        &json!({"purpose": "user_data"}),
    )
    .await;
    assert_eq!(file.status, 200, "{}", file.body_str());
    let file_id = file.json()["id"].as_str().unwrap().to_owned();
    let seen_before = upstream.count.load(Ordering::SeqCst);

    let continued = json!({"model": "gpt-4o", "input": "and?", "previous_response_id": id, "max_output_tokens": 20});
    let with_file = json!({"model": "gpt-4o", "max_output_tokens": 20,
        "input": [{"role": "user", "content": [{"type": "input_file", "file_id": file_id}]}]});
    for (method, path, body) in [
        (Method::GET, format!("/v1/responses/{id}"), json!(null)),
        (
            Method::GET,
            format!("/v1/responses/{stream_id}"),
            json!(null),
        ),
        (
            Method::GET,
            format!("/v1/responses/{id}/input_items"),
            json!(null),
        ),
        (Method::DELETE, format!("/v1/responses/{id}"), json!(null)),
        (Method::POST, "/v1/responses".to_owned(), continued.clone()),
        (Method::POST, "/v1/responses".to_owned(), with_file.clone()),
        (
            Method::GET,
            format!("/v1/files/{file_id}/content"),
            json!(null),
        ),
    ] {
        let answer = as_tenant(addr, BOB, method.clone(), &path, &body).await;
        assert_eq!(answer.status, 404, "{method} {path}: {}", answer.body_str());
        assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
        assert!(!answer.body_str().contains("private answer"));
    }
    for path in [
        "/v1/files",
        "/v1/chat/completions",
        "/v1/batches",
        "/v1/assistants",
        "/v1/vector_stores",
        "/v1/responses",
    ] {
        let answer = as_tenant(addr, BOB, Method::GET, path, &json!(null)).await;
        assert_eq!(answer.status, 403, "{path}: {}", answer.body_str());
    }
    assert_eq!(
        upstream.count.load(Ordering::SeqCst),
        seen_before,
        "Bob reached nothing"
    );
    // Alice reaches every one of them.
    for (method, path, body) in [
        (Method::GET, format!("/v1/responses/{id}"), json!(null)),
        (
            Method::GET,
            format!("/v1/responses/{stream_id}"),
            json!(null),
        ),
        (Method::POST, "/v1/responses".to_owned(), continued),
        (Method::POST, "/v1/responses".to_owned(), with_file),
        (
            Method::GET,
            format!("/v1/files/{file_id}/content"),
            json!(null),
        ),
        (Method::DELETE, format!("/v1/responses/{id}"), json!(null)),
    ] {
        let answer = as_tenant(addr, ALICE, method.clone(), &path, &body).await;
        assert_eq!(answer.status, 200, "{method} {path}: {}", answer.body_str());
    }
}

/// On Redis, a fleet shares who owns what: a response Alice created through one proxy is hers
/// through the other, and Bob's through neither.
#[tokio::test]
async fn a_fleet_on_redis_shares_who_owns_each_stored_object() {
    use http::Method;
    let Some(redis) = tollgate_testkit::redis::RedisServer::start() else {
        return;
    };
    let upstream = Scripted::start(storing).await;
    let name = fresh("owners-fleet-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let config = owners_config(&name, &var, &upstream.url(), Some(&redis.url()));
    let (a, b) = (proxy(&config).await, proxy(&config).await);
    let ask = json!({"model": "gpt-4o", "input": "hi", "max_output_tokens": 20});
    let created = as_tenant(a.addr, ALICE, Method::POST, "/v1/responses", &ask).await;
    assert_eq!(created.status, 200, "{}", created.body_str());
    let path = format!("/v1/responses/{}", created.json()["id"].as_str().unwrap());
    let bob = as_tenant(b.addr, BOB, Method::GET, &path, &json!(null)).await;
    assert_eq!(bob.status, 404, "{}", bob.body_str());
    let alice = as_tenant(b.addr, ALICE, Method::GET, &path, &json!(null)).await;
    assert_eq!(alice.status, 200, "{}", alice.body_str());
}

// ---------------------------------------------------------------------------------------------
// A budget's overrun is bounded by one call, whatever the proxy can't see.

/// An upstream that answers each call after `delay` with `usage(body)` as its usage (so that
/// a burst's calls are all in flight at once), counting the calls it answered.
pub(crate) struct Slow {
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) answered: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Slow {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Slow {
    pub(crate) async fn start(
        delay: Duration,
        usage: fn(&serde_json::Value) -> serde_json::Value,
    ) -> Slow {
        use http_body_util::BodyExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = std::sync::Arc::clone(&answered);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let count = std::sync::Arc::clone(&count);
                let service = hyper::service::service_fn(
                    move |request: http::Request<hyper::body::Incoming>| {
                        let count = std::sync::Arc::clone(&count);
                        async move {
                            let body = request.into_body().collect().await.unwrap().to_bytes();
                            let body: serde_json::Value =
                                serde_json::from_slice(&body).unwrap_or_default();
                            tokio::time::sleep(delay).await;
                            count.fetch_add(1, Ordering::SeqCst);
                            let answer = json!({"id": "resp_x", "object": "response",
                                "status": "completed", "output": [], "usage": usage(&body)});
                            Ok::<_, std::convert::Infallible>(json_response(200, &[], &answer))
                        }
                    },
                );
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Slow {
            addr,
            answered,
            task,
        }
    }
}

/// 150 calls at once against a tenant's `$1/d`, each answered after 300 ms; answers the
/// statuses' count of 200s.
async fn burst(running: &tollgate_proxy::Running, path: &str, body: &serde_json::Value) -> u64 {
    let calls: Vec<_> = (0..150)
        .map(|_| {
            let (addr, path, body) = (running.addr, path.to_owned(), body.clone());
            tokio::spawn(async move {
                send(
                    addr,
                    &path,
                    &[("authorization", "Bearer vk-dave-00000")],
                    Bytes::from(body.to_string()),
                )
                .await
                .status
            })
        })
        .collect();
    let mut ok = 0;
    for call in calls {
        let status = call.await.unwrap();
        assert!(status == 200 || status == 429, "{status}");
        ok += u64::from(status == 200);
    }
    ok
}

pub(crate) fn budget_config(name: &str, var: &str, url: &str) -> String {
    format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tiers.team]
        spend = "$1/d"
        [tenants]
        default_tier = "team"
        virtual_keys = {{ "vk-dave-00000" = "dave" }}
        [[upstream]]
        name = "{name}"
        url = "{url}"
        profile = "openai"
        requests = "100000/d"
        api_key_env = "{var}"
        "#
    )
}

/// What gpt-4o-mini bills for ten high-detail images of 2048 × 768 by OpenAI's published rule
/// (2,833 a picture and 5,667 a tile, eight tiles each), beside a few tokens of text.
const MINI_IMAGES: u64 = 10 * (2_833 + 8 * 5_667);

fn mini_usage(_: &serde_json::Value) -> serde_json::Value {
    json!({"prompt_tokens": MINI_IMAGES + 20, "completion_tokens": 10, "total_tokens": MINI_IMAGES + 30})
}

/// 150 calls at once, each with ten high-detail images, on gpt-4o-mini under a `$1/d` budget:
/// each reserves what OpenAI's rule for that model bills, so the burst stops at the budget
/// (before: 14,468 tokens reserved a call, every call admitted, $10.84 spent).
#[tokio::test]
async fn gpt_4o_minis_images_are_reserved_at_its_own_rule_and_a_burst_stops_at_the_budget() {
    let upstream = Slow::start(Duration::from_millis(300), mini_usage).await;
    let name = fresh("images-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&budget_config(
        &name,
        &var,
        &format!("http://{}", upstream.addr),
    ))
    .await;
    let image = json!({"type": "image_url", "image_url": {"url": "https://example.com/page.png", "detail": "high"}});
    let mut content = vec![json!({"type": "text", "text": "Read these pages"})];
    content.extend(std::iter::repeat_n(image, 10));
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 10,
        "messages": [{"role": "user", "content": content}]});
    let ok = burst(&running, CHAT, &body).await;
    assert_eq!(upstream.answered.load(Ordering::SeqCst), ok);
    // gpt-4o-mini: $0.15 a million in, $0.60 out.
    let bill = ((MINI_IMAGES + 20) * 150_000 + 10 * 600_000).div_ceil(1_000_000);
    let spent = ok * bill;
    assert!(
        spent <= 1_000_000 + bill,
        "{ok} calls admitted: ${} spent of $1",
        spent as f64 / 1e6
    );
    assert!(ok >= 1_000_000 / bill - 1, "{ok} calls admitted");
}

/// What a responses call with a file by URL and web search is billed: 60,000 tokens of input
/// the request doesn't show.
pub(crate) fn hidden_usage(_: &serde_json::Value) -> serde_json::Value {
    json!({"input_tokens": 60_000, "output_tokens": 10, "total_tokens": 60_010})
}

/// 150 calls at once to `/v1/responses` with an `input_file` by `file_url` and `web_search`
/// under a `$1/d` budget: the first goes alone, its bill teaches the ceiling, and the others
/// are reserved at it (and at web search's fee), so the burst stops within one call of the
/// budget (before: 39 tokens reserved a call, every call admitted, $22.51 spent).
#[tokio::test]
async fn inputs_the_proxy_cant_see_are_reserved_at_a_learned_ceiling_and_a_burst_stops_at_the_budget()
 {
    let upstream = Slow::start(Duration::from_millis(300), hidden_usage).await;
    let name = fresh("hidden-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let running = proxy(&budget_config(
        &name,
        &var,
        &format!("http://{}", upstream.addr),
    ))
    .await;
    let body = json!({"model": "gpt-4o", "max_output_tokens": 10, "tools": [{"type": "web_search"}],
        "input": [{"role": "user", "content": [
            {"type": "input_file", "file_url": "https://example.com/report.pdf"},
            {"type": "input_text", "text": "Summarise with sources"}]}]});
    let ok = burst(&running, "/v1/responses", &body).await;
    assert_eq!(upstream.answered.load(Ordering::SeqCst), ok);
    // gpt-4o: $2.50 a million in, $10 out; the provider's fee: one search, $0.01.
    let bill = (60_000 * 2_500_000 + 10 * 10_000_000u64).div_ceil(1_000_000) + 10_000;
    let spent = ok * bill;
    assert!(
        spent <= 1_000_000 + bill,
        "{ok} calls admitted: ${} spent of $1",
        spent as f64 / 1e6
    );
    assert!(ok >= 2, "{ok} calls admitted");
}

// ---------------------------------------------------------------------------------------------
// Round 4's leftovers.

/// An Azure deployment is priced as the model it serves (its name, or `model = "gpt-4o"`), or
/// at its own `price`, whatever the body's `model` says (a body naming gpt-4o-mini had been
/// billed at mini's price on a gpt-4o deployment); a deployment with none of them is unpriced
/// under a budget.
#[tokio::test]
async fn an_azure_deployment_is_priced_as_what_it_serves_not_as_the_body_says() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(1_000, 100))).await;
    let path = |deployment: &str| {
        format!("/openai/deployments/{deployment}/chat/completions?api-version=2024-10-21")
    };
    // A deployment named as the model it serves.
    let name = fresh("azure-named-");
    let running = proxy(&format!(
        "admin_listen = \"127.0.0.1:0\"\n[[upstream]]\nname = \"{name}\"\nurl = \"{}\"\nprofile = \"azure-openai\"\nrequests = \"1000/d\"\nspend = \"$1/365d\"\n",
        upstream.url()
    ))
    .await;
    let answer = send(
        running.addr,
        &path("gpt-4o"),
        &[("api-key", "client-key")],
        Bytes::from(chat("gpt-4o-mini", 100).to_string()),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body_str());
    crate::org::settled(
        &running,
        &format!("budget:upstream:{name}"),
        1_000_000 - crate::org::billed((2_500_000, 10_000_000), 1_000, 100),
    )
    .await;
    // Deployments named otherwise, with the model they serve or a price of their own.
    let name = fresh("azure-price-");
    let running = proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "azure-openai"
        requests = "1000/d"
        spend = "$1/365d"
        [upstream.models."prod-4o"]
        model = "gpt-4o"
        [upstream.models."house"]
        price = {{ input = 1.0, output = 2.0 }}
        "#,
        upstream.url()
    ))
    .await;
    let key = format!("budget:upstream:{name}");
    let mut left = 1_000_000u64;
    for (deployment, price) in [
        ("prod-4o", (2_500_000, 10_000_000)),
        ("house", (1_000_000, 2_000_000)),
    ] {
        let answer = send(
            running.addr,
            &path(deployment),
            &[("api-key", "client-key")],
            Bytes::from(chat("gpt-4o-mini", 100).to_string()),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
        left -= crate::org::billed(price, 1_000, 100);
        crate::org::settled(&running, &key, left).await;
    }
    let unpriced = send(
        running.addr,
        &path("unlisted"),
        &[("api-key", "client-key")],
        Bytes::from(chat("gpt-4o", 100).to_string()),
    )
    .await;
    assert_eq!(unpriced.status, 400, "{}", unpriced.body_str());
}

/// Unmetered spending paths that go out with the organisation's key are named at start
/// (they went out without a word).
#[test]
fn unmetered_spending_paths_are_warned_of_at_start() {
    let file = |extra: &str| {
        format!(
            r#"
            {extra}
            [tenants]
            virtual_keys = {{ "vk-erin-00000" = "erin" }}
            virtual_key_paths = "any"
            [[upstream]]
            name = "openai"
            url = "http://127.0.0.1:9"
            api_key_env = "PATH"
            "#
        )
    };
    let warned = tollgate_proxy::Config::from_toml(&file("other_paths = \"pass\""))
        .unwrap()
        .warnings();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("unmetered with the organisation's key (upstreams openai)"));
    assert_eq!(
        tollgate_proxy::Config::from_toml(&file(""))
            .unwrap()
            .warnings(),
        Vec::<String>::new()
    );
}

/// The live view shows a pause its provider put on a key whichever proxy of a fleet heard it:
/// read from the store (it was each process's own).
#[tokio::test]
async fn the_live_view_reads_a_pause_from_the_store() {
    let Some(redis) = tollgate_testkit::redis::RedisServer::start() else {
        return;
    };
    let east = Scripted::start(|n, _| {
        if n == 0 {
            json_response(200, &[], &chat_answer(5, 2))
        } else {
            json_response(
                429,
                &[("retry-after", "60")],
                &json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
            )
        }
    })
    .await;
    let west = crate::org::roomy().await;
    let name = fresh("paused-");
    let limits = "requests = \"1000/d\"\ntimeout_seconds = 10";
    let config = format!(
        "admin_listen = \"127.0.0.1:0\"\nredis = \"{}\"\n{}",
        redis.url(),
        crate::org::pool_config(
            &name,
            &east.url(),
            &format!("http://{}", west.addr),
            limits,
            limits
        )
    );
    let (a, b) = (proxy(&config).await, proxy(&config).await);
    let call = |addr| send(addr, CHAT, &[], Bytes::from(chat("gpt-4o", 10).to_string()));
    // B's call goes to east (answered), A's is refused there with a pause and moved to west.
    assert_eq!(call(b.addr).await.status, 200);
    assert_eq!(call(a.addr).await.status, 200);
    assert_eq!(east.count.load(Ordering::SeqCst), 2);
    let view = crate::org::view(&b).await;
    let entry = crate::org::entry(&view, &format!("{name}-east:gpt-4o"));
    let until = entry["pause"]["until"].as_u64().expect("a pause");
    let now = view["now"].as_u64().unwrap();
    assert!(
        (now + 55_000..=now + 60_000).contains(&until),
        "{until} vs {now}"
    );
}

/// On Redis, a ceiling one proxy learned reserves the next such call through another: with
/// $0.30 and a first call billed $0.16 (60,000 tokens and a search), the second, through the
/// other proxy, reserves $0.20 at the ceiling and is refused, where it would have reserved
/// 39 tokens and passed.
#[tokio::test]
async fn a_fleet_shares_what_calls_with_unseen_inputs_are_billed() {
    let Some(redis) = tollgate_testkit::redis::RedisServer::start() else {
        return;
    };
    let upstream = Slow::start(Duration::ZERO, hidden_usage).await;
    let name = fresh("hidden-fleet-");
    let var = format!("TOLLGATE_TEST_{}", name.replace('-', "_").to_uppercase());
    real_key(&var);
    let config = budget_config(&name, &var, &format!("http://{}", upstream.addr))
        .replace("spend = \"$1/d\"", "spend = \"$0.30/d\"")
        .replace(
            "admin_listen = \"127.0.0.1:0\"",
            &format!(
                "admin_listen = \"127.0.0.1:0\"\nredis = \"{}\"",
                redis.url()
            ),
        );
    let (a, b) = (proxy(&config).await, proxy(&config).await);
    let body = json!({"model": "gpt-4o", "max_output_tokens": 10, "tools": [{"type": "web_search", "max_uses": 1}],
        "input": [{"role": "user", "content": [
            {"type": "input_file", "file_url": "https://example.com/report.pdf"},
            {"type": "input_text", "text": "Summarise with sources"}]}]});
    let through = |addr| {
        send(
            addr,
            "/v1/responses",
            &[("authorization", "Bearer vk-dave-00000")],
            Bytes::from(body.to_string()),
        )
    };
    assert_eq!(through(a.addr).await.status, 200);
    // The ceiling is shared in a task of its own as the call settles: read it from the store
    // as the other proxy will (a fixed wait had raced that task on a busy machine).
    let store = tollgate::store::redis::RedisStore::connect(&redis.url())
        .await
        .unwrap();
    let mut shared = None;
    for _ in 0..500 {
        shared = store.get_record("ceiling:dave:gpt-4o").await.unwrap();
        if shared.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(shared.is_some(), "the ceiling was never shared");
    let refused = through(b.addr).await;
    assert_eq!(refused.status, 429, "{}", refused.body_str());
    assert_eq!(refused.json()["error"]["code"], "insufficient_quota");
    assert_eq!(upstream.answered.load(Ordering::SeqCst), 1);
}

/// Server-side tool fees are priced from the profile's table and settled at the calls the
/// answer reports: three Anthropic searches cost $0.03 beside their tokens, two of OpenAI's
/// responses API's $0.02 (they were outside every budget).
#[tokio::test]
async fn server_side_tool_fees_are_charged_to_the_budget_at_the_calls_reported() {
    let anthropic = Scripted::start(|_, _| {
        json_response(
            200,
            &[],
            &json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4",
                "content": [{"type": "text", "text": "found it"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 100, "output_tokens": 10, "server_tool_use": {"web_search_requests": 3}}}),
        )
    })
    .await;
    let openai = Scripted::start(|_, _| {
        json_response(
            200,
            &[],
            &json!({"id": "resp_tools", "object": "response", "status": "completed",
                "output": [{"type": "web_search_call", "id": "ws_1", "status": "completed"},
                    {"type": "web_search_call", "id": "ws_2", "status": "completed"},
                    {"type": "message", "id": "msg_2", "content": [{"type": "output_text", "text": "found"}]}],
                "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}}),
        )
    })
    .await;
    let name = fresh("fees-");
    let running = proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tenants]
        from = "header:x-team"
        trusted_network = true
        [tenants.tier_of]
        ops = "ops"
        [tiers.ops]
        spend = "$1/365d"
        [[upstream]]
        name = "{name}-a"
        url = "{}"
        profile = "anthropic"
        requests = "1000/d"
        [[upstream]]
        name = "{name}-o"
        url = "{}"
        profile = "openai"
        requests = "1000/d"
        "#,
        anthropic.url(),
        openai.url()
    ))
    .await;
    let searched = send(
        running.addr,
        "/v1/messages",
        &[
            ("x-team", "ops"),
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "k-ops-1"),
        ],
        Bytes::from(
            json!({"model": "claude-sonnet-4", "max_tokens": 10,
                "messages": [{"role": "user", "content": "search this"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]})
            .to_string(),
        ),
    )
    .await;
    assert_eq!(searched.status, 200, "{}", searched.body_str());
    // claude-sonnet-4: $3 a million in, $15 out; three searches at $10 a thousand.
    let mut left = 1_000_000 - (crate::org::billed((3_000_000, 15_000_000), 100, 10) + 30_000);
    crate::org::settled(&running, "budget:tenant:ops", left).await;
    let searched = send(
        running.addr,
        "/v1/responses",
        &[("x-team", "ops"), ("authorization", "Bearer k-ops-1")],
        Bytes::from(
            json!({"model": "gpt-4o", "max_output_tokens": 10, "input": "search this",
                "tools": [{"type": "web_search"}]})
            .to_string(),
        ),
    )
    .await;
    assert_eq!(searched.status, 200, "{}", searched.body_str());
    left -= crate::org::billed(crate::org::GPT_4O, 100, 10) + 20_000;
    crate::org::settled(&running, "budget:tenant:ops", left).await;
}
