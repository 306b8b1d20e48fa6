//! Quotas an organisation runs on (issue 25): models with windows, aliases and prices of their
//! own; tenants in tiers; budgets answered as the providers answer a spent quota (checked with
//! the official Python SDKs); deployment pools, in memory and shared by two proxies on Redis.
//!
//! Periods are a day (or a year, for budgets) wherever a value is checked to the unit, so that
//! nothing refills during the test; the one test that shows a call waiting waits 2 s.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use tollgate_proxy::Running;
use tollgate_testkit::provider::{self, Options, Provider};
use tollgate_testkit::redis::RedisServer;

use crate::clients::{SDK_RUNS, Sdk, clients};
use crate::common::*;

pub(crate) const DAY: Duration = Duration::from_secs(86_400);

/// A name no other test uses (metrics are process-wide).
pub(crate) fn fresh(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub(crate) fn chat(model: &str, max_tokens: u64) -> Value {
    json!({"model": model, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Say hello to the proxy"}]})
}

pub(crate) const CHAT: &str = "/v1/chat/completions";

/// A chat call of `model` with these headers.
async fn call(addr: std::net::SocketAddr, model: &str, headers: &[(&str, &str)]) -> Answer {
    send(
        addr,
        CHAT,
        headers,
        Bytes::from(chat(model, 10).to_string()),
    )
    .await
}

/// `tollgate_calls_admitted_total` of `key` (`None`: never admitted a call).
async fn admitted(addr: std::net::SocketAddr, key: &str) -> Option<f64> {
    let text = get(addr, "/metrics").await.body_str();
    metric(
        &text,
        &format!(r#"tollgate_calls_admitted_total{{key="{key}"}}"#),
    )
}

/// A series of the proxy's own `/metrics`.
async fn series(addr: std::net::SocketAddr, series: &str) -> Option<f64> {
    metric(&get(addr, "/metrics").await.body_str(), series)
}

/// A stand-in that allows far more than any test here sends, counting exactly.
pub(crate) async fn roomy() -> Provider {
    Provider::start_with(Options::openai(10_000, 10_000_000, DAY).exact()).await
}

fn assert_local_429(answer: &Answer, retry_after: &str, kind: &str) {
    assert_eq!(answer.status, 429, "{}", answer.body_str());
    assert_eq!(answer.headers["x-tollgate"], "local");
    assert_eq!(
        answer.headers["retry-after"], retry_after,
        "{:?}",
        answer.headers
    );
    assert_eq!(
        answer.json()["error"]["type"],
        kind,
        "{}",
        answer.body_str()
    );
    assert_eq!(answer.json()["error"]["code"], "rate_limit_exceeded");
}

// ---------------------------------------------------------------------------------------------
// Models with windows of their own.

/// Two models of one upstream, at 3 and 10 requests a day: each is held at its own key, to the
/// call, and a model the file doesn't list goes on at the upstream's own key and windows.
#[tokio::test]
async fn two_models_of_one_upstream_are_held_at_their_own_windows_exactly() {
    let stand_in = roomy().await;
    let name = fresh("org-models");
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "2/d"
        timeout_seconds = 1
        [upstream.models."model-a"]
        requests = "3/d"
        [upstream.models."model-b"]
        requests = "10/d"
        "#,
        stand_in.addr
    ))
    .await;
    for _ in 0..3 {
        assert_eq!(call(proxy.addr, "model-a", &[]).await.status, 200);
    }
    // The fourth would wait a third of a day for model-a's window.
    assert_local_429(&call(proxy.addr, "model-a", &[]).await, "28800", "requests");
    // Meanwhile model-b has all ten of its own.
    for _ in 0..10 {
        assert_eq!(call(proxy.addr, "model-b", &[]).await.status, 200);
    }
    assert_local_429(&call(proxy.addr, "model-b", &[]).await, "8640", "requests");
    // Neither touched the upstream's own windows (2 a day), which a model not listed shares.
    assert_eq!(call(proxy.addr, "unlisted", &[]).await.status, 200);
    assert_eq!(call(proxy.addr, "unlisted", &[]).await.status, 200);
    assert_local_429(
        &call(proxy.addr, "unlisted", &[]).await,
        "43200",
        "requests",
    );
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:model-a")).await,
        Some(3.0)
    );
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:model-b")).await,
        Some(10.0)
    );
    assert_eq!(admitted(proxy.addr, &name).await, Some(2.0));
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 15);
}

/// The fourth call of a model at 3 per 6 s waits (about 2 s) at its key, while a model at 10 per
/// 6 s on the same upstream passes all ten of its calls meanwhile.
#[tokio::test]
async fn the_fourth_call_of_the_narrow_model_waits_while_the_wide_one_passes() {
    let stand_in = roomy().await;
    let name = fresh("waits");
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "100/d"
        [upstream.models."narrow"]
        requests = "3/6s"
        [upstream.models."wide"]
        requests = "10/6s"
        "#,
        stand_in.addr
    ))
    .await;
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(call(proxy.addr, "narrow", &[]).await.status, 200);
    }
    let addr = proxy.addr;
    let fourth = tokio::spawn(async move {
        let answer = call(addr, "narrow", &[]).await;
        (answer.status, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..10 {
        assert_eq!(call(proxy.addr, "wide", &[]).await.status, 200);
    }
    assert!(
        !fourth.is_finished(),
        "the narrow model's fourth call passed before the wide model's ten ({:?})",
        started.elapsed()
    );
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 13);
    let (status, took) = fourth.await.unwrap();
    assert_eq!(status, 200);
    // One request of 3 per 6 s refills in 2 s from the first call.
    assert!(took >= Duration::from_millis(1_900), "{took:?}");
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 14);
}

/// An alias, and a dated name of an alias's family, count at their model's key: three calls
/// under three names spend the model's three a day.
#[tokio::test]
async fn an_alias_counts_at_its_models_key() {
    let stand_in = roomy().await;
    let name = fresh("alias");
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "100/d"
        timeout_seconds = 1
        [upstream.models."model-a"]
        requests = "3/d"
        aliases = ["house-model", "legacy-a"]
        "#,
        stand_in.addr
    ))
    .await;
    assert_eq!(call(proxy.addr, "model-a", &[]).await.status, 200);
    assert_eq!(call(proxy.addr, "house-model", &[]).await.status, 200);
    assert_eq!(
        call(proxy.addr, "legacy-a-2024-06-01", &[]).await.status,
        200
    );
    assert_local_429(
        &call(proxy.addr, "house-model", &[]).await,
        "28800",
        "requests",
    );
    assert_local_429(&call(proxy.addr, "model-a", &[]).await, "28800", "requests");
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:model-a")).await,
        Some(3.0)
    );
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:house-model")).await,
        None
    );
    assert_eq!(admitted(proxy.addr, &name).await, None);
    // The stand-in saw each name as the client wrote it.
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 3);
}

/// `unknown_models = "refuse"`: a model the upstream doesn't list is a 400 naming it, and
/// nothing is sent or charged; listed models and their aliases pass.
#[tokio::test]
async fn an_unknown_model_is_refused_when_the_upstream_says_so() {
    let stand_in = roomy().await;
    let name = fresh("refuse");
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "100/d"
        unknown_models = "refuse"
        [upstream.models."gpt-4o-mini"]
        aliases = ["mini"]
        "#,
        stand_in.addr
    ))
    .await;
    let refused = call(proxy.addr, "gpt-4o", &[]).await;
    assert_eq!(refused.status, 400, "{}", refused.body_str());
    assert_eq!(refused.headers["x-tollgate"], "local");
    assert_eq!(
        refused.json()["error"],
        json!({"type": "invalid_request_error", "code": "invalid_request", "param": null,
            "message": format!("tollgate-proxy: upstream `{name}` does not serve the model `gpt-4o`")})
    );
    assert_eq!(call(proxy.addr, "gpt-4o-mini", &[]).await.status, 200);
    assert_eq!(call(proxy.addr, "mini", &[]).await.status, 200);
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 2);
    assert_eq!(admitted(proxy.addr, &name).await, None);
    assert_eq!(admitted(proxy.addr, &format!("{name}:gpt-4o")).await, None);
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:gpt-4o-mini")).await,
        Some(2.0)
    );
}

// ---------------------------------------------------------------------------------------------
// Tiers.

/// The rates written in `[tenants]` are the tier `default`, every tenant's at each upstream;
/// a tenant `tier_of` places in `batch` has batch's one a day, and each tenant its own windows.
#[tokio::test]
async fn tenants_get_the_windows_of_their_tier() {
    let stand_in = roomy().await;
    let name = fresh("tiers");
    let proxy = proxy(&format!(
        r#"
        [tenants]
        from = "header:x-team"
        trusted_network = true
        requests = "3/d"
        [tenants.tier_of]
        alice = "batch"
        [tiers.batch]
        requests = "1/d"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "100/d"
        timeout_seconds = 1
        "#,
        stand_in.addr
    ))
    .await;
    let team = |name: &'static str| [("x-team", name)];
    assert_eq!(call(proxy.addr, "gpt-4o", &team("alice")).await.status, 200);
    assert_local_429(
        &call(proxy.addr, "gpt-4o", &team("alice")).await,
        "86400",
        "requests",
    );
    for tenant in ["bob", "carol"] {
        for _ in 0..3 {
            assert_eq!(call(proxy.addr, "gpt-4o", &team(tenant)).await.status, 200);
        }
        assert_local_429(
            &call(proxy.addr, "gpt-4o", &team(tenant)).await,
            "28800",
            "requests",
        );
    }
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:tenant:alice")).await,
        Some(1.0)
    );
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 7);
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:gpt-4o")).await,
        Some(7.0)
    );
}

/// A virtual key may name its tenant's tier; a key that names none puts its tenant in
/// `default_tier`.
#[tokio::test]
async fn a_virtual_key_names_its_tier_and_the_others_take_the_default_tier() {
    // SAFETY of the test: the variable is this test's own.
    unsafe { std::env::set_var("TOLLGATE_TEST_ORG_TIER_KEY", "sk-real-org") };
    let stand_in = roomy().await;
    let name = fresh("vk-tier");
    let proxy = proxy(&format!(
        r#"
        [tenants]
        default_tier = "team"
        virtual_keys = {{ "vk-nightly-0001" = {{ tenant = "nightly", tier = "batch" }}, "vk-day-000001" = "day" }}
        [tiers.team]
        requests = "3/d"
        [tiers.batch]
        requests = "1/d"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "100/d"
        timeout_seconds = 1
        api_key_env = "TOLLGATE_TEST_ORG_TIER_KEY"
        "#,
        stand_in.addr
    ))
    .await;
    let nightly = [("authorization", "Bearer vk-nightly-0001")];
    let day = [("authorization", "Bearer vk-day-000001")];
    assert_eq!(call(proxy.addr, "gpt-4o", &nightly).await.status, 200);
    assert_local_429(
        &call(proxy.addr, "gpt-4o", &nightly).await,
        "86400",
        "requests",
    );
    for _ in 0..3 {
        assert_eq!(call(proxy.addr, "gpt-4o", &day).await.status, 200);
    }
    assert_local_429(&call(proxy.addr, "gpt-4o", &day).await, "28800", "requests");
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:tenant:nightly")).await,
        Some(1.0)
    );
    assert_eq!(
        admitted(proxy.addr, &format!("{name}:tenant:day")).await,
        Some(3.0)
    );
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 4);
}

fn header<'a>(answer: &'a Answer, name: &str) -> &'a str {
    answer
        .headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", answer.headers))
        .to_str()
        .unwrap()
}

/// A tenant's answer carries, for each currency, the rate-limit headers of the tighter of its
/// own windows and the organisation's count: here its requests (5 a day against the
/// organisation's 1,000) and the organisation's tokens (2,000 a day against its 100,000), or,
/// in a narrower tier, its own tokens too. Anthropic's answers the same, in Anthropic's names.
#[tokio::test]
async fn a_tenants_answer_shows_the_tighter_of_its_windows_and_the_organisations() {
    let stand_in = Provider::start_with(Options::openai(1_000, 2_000, DAY).exact()).await;
    let claude =
        Provider::start_with(Options::anthropic(1_000, 100_000, 100_000, DAY).exact()).await;
    let name = fresh("tenant-headers");
    let proxy = proxy(&format!(
        r#"
        [tenants]
        from = "header:x-team"
        trusted_network = true
        requests = "5/d"
        tokens = "100000/30d"
        [tenants.tier_of]
        narrow = "narrow"
        [tiers.narrow]
        requests = "5/d"
        tokens = "500/d"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "1000/d"
        tokens = "2000/d"
        estimate_margin = "0%"
        [[upstream]]
        name = "{name}-claude"
        url = "http://{}"
        profile = "anthropic"
        requests = "1000/d"
        tokens = "100000/d"
        output_tokens = "100000/d"
        estimate_margin = "0%"
        "#,
        stand_in.addr, claude.addr
    ))
    .await;
    // What one call costs the organisation's tokens on arrival: its prompt and its 10 reserved.
    let cost = provider::chat_prompt(&chat("gpt-4o", 10)) + 10;
    let wide = [("x-team", "wide")];
    let first = call(proxy.addr, "gpt-4o", &wide).await;
    assert_eq!(first.status, 200);
    let pairs = |answer: &Answer, currency: &str| {
        (
            header(answer, &format!("x-ratelimit-limit-{currency}")).to_owned(),
            header(answer, &format!("x-ratelimit-remaining-{currency}")).to_owned(),
        )
    };
    assert_eq!(pairs(&first, "requests"), ("5".into(), "4".into()));
    assert_eq!(
        pairs(&first, "tokens"),
        ("2000".into(), (2_000 - cost).to_string())
    );
    let second = call(proxy.addr, "gpt-4o", &wide).await;
    assert_eq!(pairs(&second, "requests"), ("5".into(), "3".into()));
    // The stand-in's model wrote all 10 reserved: nothing came back in between.
    assert_eq!(
        pairs(&second, "tokens"),
        ("2000".into(), (2_000 - 2 * cost).to_string())
    );
    // A tenant whose tier holds 500 tokens a day: its own count is the tighter.
    let narrow = call(proxy.addr, "gpt-4o", &[("x-team", "narrow")]).await;
    assert_eq!(pairs(&narrow, "requests"), ("5".into(), "4".into()));
    assert_eq!(
        pairs(&narrow, "tokens"),
        ("500".into(), (500 - cost).to_string())
    );
    // At Anthropic, the tenant's own requests window at that upstream, in Anthropic's names.
    let message = json!({"model": "claude-sonnet-4-5", "max_tokens": 10,
        "messages": [{"role": "user", "content": "Say hello to the proxy"}]});
    let answer = send(
        proxy.addr,
        "/v1/messages",
        &[
            ("x-team", "wide"),
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "sk-ant"),
        ],
        Bytes::from(message.to_string()),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body_str());
    assert_eq!(header(&answer, "anthropic-ratelimit-requests-limit"), "5");
    assert_eq!(
        header(&answer, "anthropic-ratelimit-requests-remaining"),
        "4"
    );
    // Its input tokens: 100,000 each (a month's: a token refills in 26 s, so the count read
    // is the count charged however slowly the call went; at 100,000 a day one refilled in
    // 0.86 s and a slow run read one more), and the stand-in rounds its count to the
    // thousand: the tenant's own count is the tighter. (The profile estimates Anthropic's input with
    // o200k, counted as OpenAI counts messages.)
    let input = provider::chat_prompt(&message);
    assert_eq!(
        header(&answer, "anthropic-ratelimit-input-tokens-limit"),
        "100000"
    );
    assert_eq!(
        header(&answer, "anthropic-ratelimit-input-tokens-remaining"),
        (100_000 - input).to_string()
    );
    // Its output tokens: the tenant has no window of them, the organisation's count stands.
    assert_eq!(
        header(&answer, "anthropic-ratelimit-output-tokens-limit"),
        "100000"
    );
    assert_eq!(
        header(&answer, "anthropic-ratelimit-output-tokens-remaining"),
        "100000"
    );
}

// ---------------------------------------------------------------------------------------------
// Pools.

/// Two deployments of one model and a pool over them, with `extra` in each upstream.
pub(crate) fn pool_config(
    name: &str,
    east: &str,
    west: &str,
    east_extra: &str,
    west_extra: &str,
) -> String {
    format!(
        r#"
        [[upstream]]
        name = "{name}-east"
        url = "{east}"
        profile = "openai"
        {east_extra}
        [[upstream]]
        name = "{name}-west"
        url = "{west}"
        profile = "openai"
        {west_extra}
        [[pool]]
        name = "{name}"
        members = ["{name}-east", "{name}-west"]
        models = ["gpt-4o"]
        "#
    )
}

/// Members that can both admit a call take turns; when one's windows are spent, the other
/// takes every call.
#[tokio::test]
async fn a_pool_spreads_calls_over_the_members_that_can_take_them() {
    let (east, west) = (roomy().await, roomy().await);
    let name = fresh("spread");
    let roomy_limits = "requests = \"100/d\"\ntimeout_seconds = 1";
    let running = proxy(&pool_config(
        &name,
        &format!("http://{}", east.addr),
        &format!("http://{}", west.addr),
        roomy_limits,
        roomy_limits,
    ))
    .await;
    for _ in 0..10 {
        assert_eq!(call(running.addr, "gpt-4o", &[]).await.status, 200);
    }
    assert_eq!(east.stats.ok.load(Ordering::Relaxed), 5);
    assert_eq!(west.stats.ok.load(Ordering::Relaxed), 5);
    assert_eq!(
        admitted(running.addr, &format!("{name}-east:gpt-4o")).await,
        Some(5.0)
    );
    assert_eq!(
        admitted(running.addr, &format!("{name}-west:gpt-4o")).await,
        Some(5.0)
    );

    // East holds 3 a day: it takes its turns until they are spent, then west takes the rest.
    let (east, west) = (roomy().await, roomy().await);
    let name = fresh("spread");
    let running = proxy(&pool_config(
        &name,
        &format!("http://{}", east.addr),
        &format!("http://{}", west.addr),
        "requests = \"3/d\"\ntimeout_seconds = 1",
        roomy_limits,
    ))
    .await;
    for _ in 0..10 {
        assert_eq!(call(running.addr, "gpt-4o", &[]).await.status, 200);
    }
    assert_eq!(east.stats.ok.load(Ordering::Relaxed), 3);
    assert_eq!(west.stats.ok.load(Ordering::Relaxed), 7);
    // A model the pool doesn't serve stays at the upstream it was routed to.
    assert_eq!(call(running.addr, "gpt-4o-mini", &[]).await.status, 200);
    assert_eq!(east.stats.ok.load(Ordering::Relaxed), 4);
}

/// East answers its second call 429 (with `retry-after` of `pause`, and `code`), saying nothing
/// of its windows: the call goes to west instead, and east is paused for its retry-after and
/// gets no call until then. With `insufficient_quota` (no retry-after), east refuses every call
/// after its first, and each is moved.
async fn a_429_moves(pause: Duration, code: &'static str) {
    let told = [
        ("retry-after", pause.as_secs().to_string()),
        ("retry-after-ms", pause.as_millis().to_string()),
    ];
    let east = Scripted::start(move |n, _| {
        if n == 1 || (n > 1 && code == "insufficient_quota") {
            let told: Vec<(&str, &str)> = told.iter().map(|(k, v)| (*k, v.as_str())).collect();
            json_response(
                429,
                if code == "insufficient_quota" {
                    &[]
                } else {
                    &told
                },
                &json!({"error": {"message": "Rate limit reached for gpt-4o", "type": "requests",
                    "param": null, "code": code}}),
            )
        } else {
            json_response(200, &[], &chat_answer(12, 10))
        }
    })
    .await;
    let west = roomy().await;
    let name = fresh("moved-429-");
    let limits = "requests = \"100/d\"\ntimeout_seconds = 10";
    let running = proxy(&pool_config(
        &name,
        &east.url(),
        &format!("http://{}", west.addr),
        limits,
        limits,
    ))
    .await;
    for i in 0..6 {
        let answer = call(running.addr, "gpt-4o", &[]).await;
        assert_eq!(answer.status, 200, "call {i}: {}", answer.body_str());
    }
    let moves = series(
        running.addr,
        &format!(r#"tollgate_proxy_pool_moves_total{{upstream="{name}-east"}}"#),
    )
    .await;
    if code == "insufficient_quota" {
        // A spent quota ejects east at once (issue 31): no call after the second tries it (it
        // had been tried first by every call after the second, refusing each).
        assert_eq!(east.count.load(Ordering::SeqCst), 2);
        assert_eq!(west.stats.ok.load(Ordering::Relaxed), 5);
        assert_eq!(moves, Some(1.0));
    } else {
        assert_eq!(east.count.load(Ordering::SeqCst), 2);
        assert_eq!(west.stats.ok.load(Ordering::Relaxed), 5);
        assert_eq!(moves, Some(1.0));
    }
}

#[tokio::test]
async fn a_members_429_moves_the_call_to_another_member() {
    // A pause of 4 s, within the call's deadline of 10 s.
    a_429_moves(Duration::from_secs(4), "rate_limit_exceeded").await;
}

#[tokio::test]
async fn a_members_429_with_a_pause_past_the_deadline_moves_the_call_too() {
    // East's requests for the day are spent: its pause is longer than any call's deadline, and
    // west can serve the call now.
    a_429_moves(DAY, "rate_limit_exceeded").await;
}

#[tokio::test]
async fn a_members_spent_quota_moves_the_call_too() {
    // East's account is out of credit: west's may not be.
    a_429_moves(DAY, "insufficient_quota").await;
}

/// A member that is down (a closed port) or answers 500 before its first byte: each call is
/// moved to the other member and answered from there; after three failures in a row the
/// member is ejected, and the fourth call goes straight to the other.
#[tokio::test]
async fn a_member_down_or_failing_moves_the_call_to_another_member() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let failing = Scripted::start(|_, _| {
        json_response(
            500,
            &[],
            &json!({"error": {"message": "The server had an error", "type": "server_error", "param": null, "code": null}}),
        )
    })
    .await;
    for (what, east) in [("down", format!("http://{closed}")), ("500", failing.url())] {
        let west = roomy().await;
        let name = fresh("moved-");
        let limits = "requests = \"100/d\"\ntimeout_seconds = 5\nconnect_timeout_seconds = 1";
        let proxy = proxy(&pool_config(
            &name,
            &east,
            &format!("http://{}", west.addr),
            limits,
            limits,
        ))
        .await;
        for i in 0..4 {
            let answer = call(proxy.addr, "gpt-4o", &[]).await;
            assert_eq!(
                answer.status,
                200,
                "{what}, call {i}: {}",
                answer.body_str()
            );
            assert_eq!(
                answer.json()["usage"]["prompt_tokens"],
                provider::chat_prompt(&chat("gpt-4o", 10))
            );
        }
        assert_eq!(west.stats.ok.load(Ordering::Relaxed), 4, "{what}");
        // Each call tries east first (the turn moves on with the move, so the next call's
        // turn comes back to east) and is moved, until east is ejected.
        assert_eq!(
            series(
                proxy.addr,
                &format!(r#"tollgate_proxy_pool_moves_total{{upstream="{name}-east"}}"#)
            )
            .await,
            Some(3.0),
            "{what}"
        );
    }
    assert_eq!(failing.count.load(Ordering::SeqCst), 3);
}

// ---------------------------------------------------------------------------------------------
// Budgets.

/// gpt-4o's price in micro-dollars per million tokens: $2.50 in, $10 out.
pub(crate) const GPT_4O: (u64, u64) = (2_500_000, 10_000_000);
/// claude-sonnet-4's: $3 in, $15 out.
const SONNET_4: (u64, u64) = (3_000_000, 15_000_000);

/// What `input` and `output` tokens are billed at `price`, in micro-dollars, rounded up: worked
/// here from the price per million, not by the code under test.
pub(crate) fn billed(price: (u64, u64), input: u64, output: u64) -> u64 {
    (input * price.0 + output * price.1).div_ceil(1_000_000)
}

/// `GET /admin/api/keys`.
pub(crate) async fn view(running: &Running) -> Value {
    let answer = get(
        running.admin.expect("admin_listen is set"),
        "/admin/api/keys",
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body_str());
    answer.json()
}

/// A key's entry in the live view.
pub(crate) fn entry<'a>(view: &'a Value, key: &str) -> &'a Value {
    view["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == key)
        .unwrap_or_else(|| panic!("no {key} in {view:#}"))
}

/// What a budget key holds now, in micro-dollars (with fractions), from the live view.
pub(crate) async fn budget_left(running: &Running, key: &str) -> f64 {
    let view = view(running).await;
    let entry = entry(&view, key);
    assert_eq!(entry["kind"], "budget", "{entry:#}");
    let windows = entry["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 1, "{entry:#}");
    assert_eq!(windows[0]["currency"], "spend", "{entry:#}");
    windows[0]["level"].as_f64().unwrap()
}

/// A budget of `$amount/365d` refills about 0.003 micro-dollars a second per dollar-tenth: a
/// level read within a minute of the calls is what they left, plus less than half a
/// micro-dollar.
pub(crate) fn assert_left(left: f64, expected: u64) {
    assert!(
        left >= expected as f64 && left < expected as f64 + 0.5,
        "the budget holds {left}, expected {expected}"
    );
}

/// Waits (at most 2 s) until a budget holds `expected` micro-dollars (see [`assert_left`]).
pub(crate) async fn settled(running: &Running, key: &str, expected: u64) {
    for _ in 0..100 {
        let left = budget_left(running, key).await;
        if left >= expected as f64 && left < expected as f64 + 0.5 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_left(budget_left(running, key).await, expected);
}

/// Through the official Python SDK, with two retries allowed: calls pass while the tenant's
/// budget can pay the most each may cost ($2.50 a million in, $10 out, 30 tokens reserved);
/// then the SDK raises `RateLimitError` with code `insufficient_quota`, naming the budget and
/// when it refills, and does not retry it. The budget holds what it held less what each call
/// was billed for the usage the stand-in reported, not what was reserved.
#[tokio::test]
async fn a_spent_tenant_budget_is_the_python_sdks_insufficient_quota_and_is_not_retried() {
    let Some(clients) = clients("org-budget") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    // SAFETY of the test: the variable is this test's own.
    unsafe { std::env::set_var("TOLLGATE_TEST_ORG_BUDGET_KEY", "sk-real-org") };
    let stand_in = Provider::start_with(Options::openai(1_000, 1_000_000, DAY).exact()).await;
    let name = fresh("budget");
    let running = proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tenants]
        virtual_keys = {{ "sk-tollgate-test" = {{ tenant = "nightly", tier = "batch" }} }}
        [tiers.batch]
        spend = "$0.0015/365d"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "1000/d"
        tokens = "1000000/d"
        api_key_env = "TOLLGATE_TEST_ORG_BUDGET_KEY"
        [upstream.models."gpt-4o"]
        price = {{ input = 2.5, cached_input = 1.25, output = 10 }}
        "#,
        stand_in.addr
    ))
    .await;
    let calls = clients
        .run(Sdk::Python, running.addr, &["budget", "10"])
        .await;
    let calls = calls.as_array().unwrap().clone();
    let (refused, passed) = calls.split_last().unwrap();
    // Each call reserved its prompt and 30 tokens out; what the stand-in's model wrote was
    // billed instead. (A call settles as its answer's body ends, which a client that counts
    // the bytes may not wait for: the figures are such that no level a call passes at is
    // within one settlement of the refusal, so the count of calls that pass is exact.)
    let prompt = provider::chat_prompt(
        &json!({"messages": [{"role": "user", "content": "Say hello to the proxy"}]}),
    );
    let reserved = billed(GPT_4O, prompt, 30);
    let each = billed(GPT_4O, prompt, written(prompt, 30));
    assert!(
        each < reserved,
        "the settlement differs from the reservation"
    );
    let mut left = 1_500;
    for call in passed {
        assert_eq!(call["input"], prompt, "{calls:?}");
        assert!(
            left >= reserved + (reserved - each),
            "{left} left: {calls:?}"
        );
        left -= billed(GPT_4O, prompt, call["output"].as_u64().unwrap());
    }
    assert!(
        left < reserved,
        "{left} left could pay {reserved}: {calls:?}"
    );
    assert_eq!(passed.len(), 5, "{calls:?}");
    assert_eq!(refused["error"], "RateLimitError", "{refused}");
    assert_eq!(refused["rate_limit"], true);
    assert_eq!(refused["status"], 429);
    assert_eq!(refused["should_retry"], "false");
    assert_eq!(refused["body"]["code"], "insufficient_quota", "{refused}");
    assert_eq!(refused["body"]["type"], "insufficient_quota", "{refused}");
    let message = refused["body"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "tollgate-proxy: the budget of tenant `nightly` ($0.0015/365d, tier `batch`) is spent:"
        ),
        "{message}"
    );
    assert!(message.contains("refills in"), "{message}");
    // Not retried: the SDK made one attempt, refused here, and the stand-in saw only the calls
    // that passed.
    assert_eq!(
        series(
            running.addr,
            &format!(r#"tollgate_proxy_budget_refusals_total{{upstream="{name}"}}"#)
        )
        .await,
        Some(1.0)
    );
    assert_eq!(
        stand_in.stats.ok.load(Ordering::Relaxed),
        passed.len() as u64
    );
    assert_left(budget_left(&running, "budget:tenant:nightly").await, left);
    // What was spent, by upstream, model and tenant, and in the live view.
    let spent = 1_500 - left;
    assert_eq!(
        series(
            running.addr,
            &format!(
                r#"tollgate_proxy_spend_micros_total{{upstream="{name}",model="gpt-4o",tenant="nightly"}}"#
            )
        )
        .await,
        Some(spent as f64)
    );
    let view = view(&running).await;
    let budget = entry(&view, "budget:tenant:nightly");
    assert_eq!(budget["spend"]["amount"], spent as f64 / 1e6, "{budget:#}");
    assert_eq!(budget["counts"]["budget_refusals"], 1, "{budget:#}");
}

/// What the stand-in's model writes for a prompt, given the output reserved.
fn written(prompt: u64, reserved: u64) -> u64 {
    reserved.min(10 + prompt % 40)
}

/// With Anthropic's SDK, a spent budget is a `BadRequestError` (400, as Anthropic answers a
/// credit balance too low), naming the budget; the budget holds what the calls' usage was
/// billed at claude-sonnet-4's price.
#[tokio::test]
async fn a_spent_budget_is_the_anthropic_sdks_bad_request() {
    let Some(clients) = clients("org-budget-anthropic") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    // SAFETY of the test: the variable is this test's own.
    unsafe { std::env::set_var("TOLLGATE_TEST_ORG_BUDGET_ANT", "sk-ant-real") };
    let stand_in =
        Provider::start_with(Options::anthropic(1_000, 1_000_000, 1_000_000, DAY).exact()).await;
    let name = fresh("budget-claude");
    let running = proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tenants]
        virtual_keys = {{ "sk-ant-tollgate-test" = "claude-nightly" }}
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "anthropic"
        requests = "1000/d"
        tokens = "1000000/d"
        output_tokens = "1000000/d"
        spend = "$0.0019/365d"
        api_key_env = "TOLLGATE_TEST_ORG_BUDGET_ANT"
        "#,
        stand_in.addr
    ))
    .await;
    let calls = clients
        .run(Sdk::Python, running.addr, &["messages-budget", "10"])
        .await;
    let calls = calls.as_array().unwrap().clone();
    let (refused, passed) = calls.split_last().unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Say hello to the proxy"}]});
    // The stand-in counts the input its own way; the proxy reserves its estimate (o200k,
    // counted as OpenAI counts messages) and 30 tokens out at claude-sonnet-4's price.
    let input = provider::anthropic_input(&body);
    let reserved = billed(SONNET_4, provider::chat_prompt(&body), 30);
    let each = billed(SONNET_4, input, written(input, 30));
    let mut left = 1_900;
    for call in passed {
        assert_eq!(call["input"], input, "{calls:?}");
        assert!(
            left >= reserved + (reserved - each),
            "{left} left: {calls:?}"
        );
        left -= billed(SONNET_4, input, call["output"].as_u64().unwrap());
    }
    assert!(
        left < reserved,
        "{left} left could pay {reserved}: {calls:?}"
    );
    assert_eq!(passed.len(), 5, "{calls:?}");
    assert_eq!(refused["error"], "BadRequestError", "{refused}");
    assert_eq!(refused["status"], 400);
    assert_eq!(refused["should_retry"], "false");
    assert_eq!(refused["body"]["type"], "error", "{refused}");
    assert_eq!(
        refused["body"]["error"]["type"], "invalid_request_error",
        "{refused}"
    );
    let message = refused["body"]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "tollgate-proxy: the budget of upstream `{name}` ($0.0019/365d) is spent:"
        )),
        "{message}"
    );
    assert_eq!(
        series(
            running.addr,
            &format!(r#"tollgate_proxy_budget_refusals_total{{upstream="{name}"}}"#)
        )
        .await,
        Some(1.0)
    );
    assert_eq!(
        stand_in.stats.ok.load(Ordering::Relaxed),
        passed.len() as u64
    );
    assert_left(
        budget_left(&running, &format!("budget:upstream:{name}")).await,
        left,
    );
}

/// A tier's shared budget refuses every tenant of the tier once their calls together spent it;
/// a model with no price on a key with a budget is a 400 at once.
#[tokio::test]
async fn a_tiers_shared_budget_is_spent_by_its_tenants_together() {
    let stand_in = roomy().await;
    let name = fresh("shared-budget");
    let running = proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tenants]
        from = "header:x-team"
        trusted_network = true
        default_tier = "team"
        [tiers.team]
        spend_total = "$0.001/365d"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "1000/d"
        "#,
        stand_in.addr
    ))
    .await;
    // gpt-4o at the profile's price; 10 tokens reserved, all 10 written: each call is billed
    // what it reserved.
    let prompt = provider::chat_prompt(&chat("gpt-4o", 10));
    let each = billed(GPT_4O, prompt, 10);
    let fits = 1_000 / each;
    let teams = ["alice", "bob"];
    for i in 0..fits {
        let answer = call(running.addr, "gpt-4o", &[("x-team", teams[i as usize % 2])]).await;
        assert_eq!(answer.status, 200, "call {i}: {}", answer.body_str());
    }
    for team in teams {
        let refused = call(running.addr, "gpt-4o", &[("x-team", team)]).await;
        assert_eq!(refused.status, 429, "{}", refused.body_str());
        assert_eq!(refused.headers["x-should-retry"], "false");
        assert_eq!(refused.json()["error"]["code"], "insufficient_quota");
        let message = refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.starts_with(
                "tollgate-proxy: the shared budget of tier `team` ($0.001/365d) is spent:"
            ),
            "{message}"
        );
    }
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), fits);
    assert_left(
        budget_left(&running, "budget:tier:team").await,
        1_000 - fits * each,
    );
    // No price for this model, and the tier keeps a budget: it can't be kept, 400 at once.
    let unpriced = call(running.addr, "house-llama", &[("x-team", "alice")]).await;
    assert_eq!(unpriced.status, 400, "{}", unpriced.body_str());
    assert_eq!(unpriced.json()["error"]["type"], "invalid_request_error");
    let message = unpriced.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("the model `house-llama` has no price"),
        "{message}"
    );
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), fits);
}

/// A call moved off a member that answered 500 is charged its budget once, settled with the
/// usage of the member that served it; its spend is counted there.
#[tokio::test]
async fn a_call_moved_after_a_500_settles_its_budget_with_the_usage_that_served_it() {
    let failing = Scripted::start(|_, _| {
        json_response(
            500,
            &[],
            &json!({"error": {"message": "The server had an error", "type": "server_error", "param": null, "code": null}}),
        )
    })
    .await;
    let west = roomy().await;
    let name = fresh("moved-budget-");
    let limits = "requests = \"100/d\"\ntimeout_seconds = 5";
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
        {}
        "#,
        pool_config(
            &name,
            &failing.url(),
            &format!("http://{}", west.addr),
            limits,
            limits
        )
    ))
    .await;
    let body = chat("gpt-4o", 50);
    let answer = send(
        running.addr,
        CHAT,
        &[("x-team", "ops")],
        Bytes::from(body.to_string()),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body_str());
    assert_eq!(failing.count.load(Ordering::SeqCst), 1);
    let usage = &answer.json()["usage"];
    let spent = billed(
        GPT_4O,
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    assert!(spent < billed(GPT_4O, provider::chat_prompt(&body), 50));
    settled(&running, "budget:tenant:ops", 1_000_000 - spent).await;
    let text = get(running.addr, "/metrics").await.body_str();
    let spend = |upstream: &str| {
        metric(
            &text,
            &format!(
                r#"tollgate_proxy_spend_micros_total{{upstream="{upstream}",model="gpt-4o",tenant="ops"}}"#
            ),
        )
    };
    assert_eq!(spend(&format!("{name}-west")), Some(spent as f64), "{text}");
    assert_eq!(spend(&format!("{name}-east")), None, "{text}");
}

// ---------------------------------------------------------------------------------------------
// A fleet on Redis.

/// Two proxies on one Redis share a pool's members' windows and a tenant's budget: a call
/// through either spends what the other sees.
#[tokio::test]
async fn two_proxies_on_redis_share_a_pool_and_a_budget() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (east, west) = (roomy().await, roomy().await);
    let name = fresh("fleet-");
    // Each member: 2 requests a day. The tenant `ops`: a budget for two calls of 50 tokens
    // reserved at gpt-4o's price, not three.
    let body = chat("gpt-4o", 50);
    let prompt = provider::chat_prompt(&body);
    let reserved = billed(GPT_4O, prompt, 50);
    let each = billed(GPT_4O, prompt, written(prompt, 50));
    let budget = 2 * each + reserved - 1;
    assert!(budget - each >= reserved, "two calls fit");
    let limits = "requests = \"2/d\"\ntimeout_seconds = 1";
    let config = format!(
        r#"
        admin_listen = "127.0.0.1:0"
        redis = "{}"
        [tenants]
        from = "header:x-team"
        trusted_network = true
        [tenants.tier_of]
        ops = "ops"
        [tiers.ops]
        spend = "${}/365d"
        {}
        "#,
        redis.url(),
        budget as f64 / 1e6,
        pool_config(
            &name,
            &format!("http://{}", east.addr),
            &format!("http://{}", west.addr),
            limits,
            limits
        )
    );
    let (a, b) = (proxy(&config).await, proxy(&config).await);
    let chat_body = Bytes::from(body.to_string());
    let through = |running: &Running, headers: &'static [(&'static str, &'static str)]| {
        let addr = running.addr;
        let body = chat_body.clone();
        async move { send(addr, CHAT, headers, body).await }
    };
    const OPS: &[(&str, &str)] = &[("x-team", "ops")];
    const DEV: &[(&str, &str)] = &[("x-team", "dev")];
    let mut spent = 0;
    for running in [&a, &b] {
        let answer = through(running, OPS).await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
        let usage = &answer.json()["usage"];
        spent += billed(
            GPT_4O,
            usage["prompt_tokens"].as_u64().unwrap(),
            usage["completion_tokens"].as_u64().unwrap(),
        );
        // The call settles as its body ends, which the client, counting the bytes, need not
        // wait for.
        settled(running, "budget:tenant:ops", budget - spent).await;
    }
    // The third, through the first proxy: the budget is spent by the calls through both.
    let refused = through(&a, OPS).await;
    assert_eq!(refused.status, 429, "{}", refused.body_str());
    assert_eq!(refused.json()["error"]["code"], "insufficient_quota");
    for running in [&a, &b] {
        assert_left(
            budget_left(running, "budget:tenant:ops").await,
            budget - spent,
        );
    }
    // Two more calls fill the members' four requests between them; the next finds both full.
    for running in [&b, &a] {
        let answer = through(running, DEV).await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
    }
    let full = through(&b, DEV).await;
    assert_eq!(full.status, 429, "{}", full.body_str());
    assert_eq!(full.headers["x-tollgate"], "local");
    assert_eq!(full.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(east.stats.ok.load(Ordering::Relaxed), 2);
    assert_eq!(west.stats.ok.load(Ordering::Relaxed), 2);
}
