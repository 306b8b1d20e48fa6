//! Tenants inside one organization's quota: each passes its own windows, then the
//! organization's; a noisy one can't starve the others; virtual keys keep the real key inside.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;

use crate::common::*;

/// The longest any of `calls` calls of the quiet tenant takes while the noisy one has 30 in
/// flight, with or without tenant windows.
async fn quiet_latency(tenant_windows: bool) -> Duration {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let tenants = if tenant_windows {
        "[tenants]\nfrom = \"header:x-team\"\ntrusted_network = true\nrequests = \"5/s\"\n"
    } else {
        "[tenants]\nfrom = \"header:x-team\"\ntrusted_network = true\n"
    };
    let proxy = proxy(&format!(
        r#"
        {tenants}
        [[upstream]]
        name = "org-{tenant_windows}"
        url = "{}"
        profile = "openai"
        per_model = false
        requests = "10/s"
        "#,
        upstream.url()
    ))
    .await;
    let addr = proxy.addr;
    let call = |team: &'static str| async move {
        let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
        let sent = Instant::now();
        let answer = send(
            addr,
            "/v1/chat/completions",
            &[("x-team", team)],
            Bytes::from(body.to_string()),
        )
        .await;
        assert_eq!(answer.status, 200);
        sent.elapsed()
    };
    let noisy: Vec<_> = (0..30).map(|_| tokio::spawn(call("noisy"))).collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let quiet: Vec<_> = (0..3).map(|_| tokio::spawn(call("quiet"))).collect();
    let mut longest = Duration::ZERO;
    for task in quiet {
        longest = longest.max(task.await.unwrap());
    }
    for task in noisy {
        task.abort();
    }
    let _: SocketAddr = addr;
    longest
}

#[tokio::test]
async fn a_noisy_tenant_does_not_starve_the_others() {
    // Organization: 10 requests a second. With 5 a second each, the noisy one holds at most
    // its own 5 of the organization's 10, and the quiet one's 3 calls pass at once. Without
    // tenant windows, the noisy tenant's 30 calls take the burst and queue at the
    // organization's key: in arrival order the quiet calls would wait behind ~20 of them
    // (2 s); in the fair order each waits behind about one noisy call per quiet call ahead of
    // it, so the third passes after about 6 calls (0.6 s).
    let (with, without) = (quiet_latency(true).await, quiet_latency(false).await);
    assert!(
        with < Duration::from_millis(300),
        "with tenant windows: {with:?}"
    );
    assert!(
        without < Duration::from_millis(1_200),
        "without tenant windows, in the fair order: {without:?}"
    );
}

#[tokio::test]
async fn virtual_keys_stand_for_the_real_key_which_never_leaves_the_proxy() {
    // SAFETY of the test: the variable is this test's own (unique name).
    unsafe { std::env::set_var("TOLLGATE_TEST_REAL_KEY_VK", "sk-real-upstream") };
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let proxy = proxy(&format!(
        r#"
        [tenants]
        virtual_keys = {{ "vk-alice" = "alice", "vk-bob-12" = "bob" }}
        requests = "100/m"
        [[upstream]]
        name = "vk"
        url = "{}"
        profile = "openai"
        requests = "100/m"
        api_key_env = "TOLLGATE_TEST_REAL_KEY_VK"
        "#,
        upstream.url()
    ))
    .await;
    let body = Bytes::from(
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    let ok = send(
        proxy.addr,
        "/v1/chat/completions",
        &[("authorization", "Bearer vk-alice")],
        body.clone(),
    )
    .await;
    assert_eq!(ok.status, 200);
    let refused = send(
        proxy.addr,
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-real-upstream")],
        body.clone(),
    )
    .await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["error"]["code"], "invalid_api_key");
    let none = send(proxy.addr, "/v1/chat/completions", &[], body).await;
    assert_eq!(none.status, 401);
    let seen = upstream.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["authorization"], "Bearer sk-real-upstream");
    let text = String::from_utf8(get(proxy.addr, "/metrics").await.body.to_vec()).unwrap();
    assert_eq!(
        metric(
            &text,
            r#"tollgate_calls_admitted_total{key="vk:tenant:alice"}"#
        ),
        Some(1.0)
    );
    assert!(!text.contains("vk-alice"));
}

#[tokio::test]
async fn a_model_named_like_a_tenant_key_does_not_touch_that_tenants_windows() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let proxy = proxy(&format!(
        r#"
        [tenants]
        from = "header:x-team"
        trusted_network = true
        requests = "2/m"
        [[upstream]]
        name = "tk"
        url = "{}"
        profile = "openai"
        requests = "100/m"
        timeout_seconds = 0.2
        "#,
        upstream.url()
    ))
    .await;
    let chat = |model: &str| {
        Bytes::from(
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        )
    };
    let path = "/v1/chat/completions";
    let team = [("x-team", "team-a")];
    assert_eq!(
        send(proxy.addr, path, &team, chat("gpt-4o")).await.status,
        200
    );
    // Another client names the team's key as its model: "tk" + ":" + "tenant:team-a".
    let other = [("x-team", "team-b")];
    let hostile = send(proxy.addr, path, &other, chat("tenant:team-a")).await;
    assert_eq!(hostile.status, 200, "{:?}", hostile.body);
    assert_eq!(
        send(proxy.addr, path, &team, chat("gpt-4o")).await.status,
        200
    );
    let text = String::from_utf8(get(proxy.addr, "/metrics").await.body.to_vec()).unwrap();
    let admitted = |key: &str| {
        metric(
            &text,
            &format!(r#"tollgate_calls_admitted_total{{key="{key}"}}"#),
        )
    };
    // Team A's two calls passed its 2/m: the hostile call took nothing of its windows, and
    // went to the upstream's own key (a model no one configured gets no key of its own).
    assert_eq!(admitted("tk:gpt-4o"), Some(2.0), "{text}");
    assert_eq!(admitted("tk"), Some(1.0), "{text}");
    assert_eq!(
        send(proxy.addr, path, &team, chat("gpt-4o")).await.status,
        429
    );
}
