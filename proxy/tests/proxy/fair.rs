//! Fair share at the organisation's keys through the proxy: a tenant's tier weight (times its
//! priority's factor) is the weight its calls wait with; a quiet tenant's call passes a noisy
//! tenant's backlog within the bound; `/metrics` and the live view show each tenant's waits,
//! weight and share.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tollgate_proxy::Running;

use crate::common::*;

/// A proxy with its live view, header tenants `noisy` (tier `wide`, weight 3, batch) and
/// `quiet` (tier `narrow`, weight 1, interactive), and an organisation key of 5 requests per
/// 5 s in front of `upstream`.
async fn fair_proxy(name: &str, upstream: &str) -> Running {
    proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tiers.wide]
        weight = 3
        priority = "batch"
        [tiers.narrow]
        weight = 1
        [tenants]
        from = "header:x-team"
        trusted_network = true
        tier_of = {{ noisy = "wide", quiet = "narrow" }}
        [[upstream]]
        name = "{name}"
        url = "{upstream}"
        profile = "openai"
        per_model = false
        requests = "5/5s"
        "#
    ))
    .await
}

async fn view(running: &Running) -> Value {
    get(running.admin.unwrap(), "/admin/api/keys").await.json()
}

/// Polls the live view until `done` holds, at most 10 s.
async fn until(running: &Running, done: impl Fn(&Value) -> bool) -> Value {
    let mut seen = view(running).await;
    for _ in 0..200 {
        if done(&seen) {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = view(running).await;
    }
    seen
}

fn waiting_at(view: &Value, key: &str) -> u64 {
    view["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == key)
        .and_then(|k| k["waiting"].as_u64())
        .unwrap_or(0)
}

/// The organisation's key, 5 requests per 5 s: the noisy tenant's burst of 5 passes and 6 more
/// of its calls wait. The quiet tenant's call then waits behind at most the bound's calls of
/// the noisy one (weights 1×10 against 3×1: 3/10 of a call, plus one call, plus the call first
/// in line: 2), where arrival order had put it behind all 6.
#[tokio::test]
async fn a_quiet_tenants_call_passes_a_noisy_tenants_backlog_within_the_bound() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    // Who sent each call the upstream received, in order (the content names its tenant).
    let order = || -> Vec<String> {
        upstream
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|seen| {
                let body: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
                body["messages"][0]["content"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    };
    let name = "fair-bound";
    let running = fair_proxy(name, &upstream.url()).await;
    let addr = running.addr;
    let call = |team: &'static str| async move {
        let body = json!({"model": "gpt-4o", "max_tokens": 2, "messages": [{"role": "user", "content": team}]});
        send(
            addr,
            "/v1/chat/completions",
            &[("x-team", team)],
            Bytes::from(body.to_string()),
        )
        .await
        .status
    };
    let noisy: Vec<_> = (0..11).map(|_| tokio::spawn(call("noisy"))).collect();
    let backlog = until(&running, |v| waiting_at(v, name) == 6).await;
    assert_eq!(waiting_at(&backlog, name), 6, "{backlog:#}");
    let sent_at = order().len();
    assert_eq!(sent_at, 5);
    let quiet = tokio::spawn(call("quiet"));
    assert_eq!(quiet.await.unwrap(), 200);
    for task in noisy {
        assert_eq!(task.await.unwrap(), 200);
    }
    let order = order();
    let position = order.iter().position(|t| t == "quiet").unwrap();
    let ahead = position - sent_at;
    assert!(
        ahead <= 2,
        "the quiet call waited behind {ahead} noisy calls: {order:?}"
    );

    // What the operators see: the weights, and every admission's wait, by tenant.
    let view = view(&running).await;
    let tenants: Vec<Value> = view["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            json!([
                t["tenant"],
                t["tier"],
                t["weight"],
                t["priority"],
                t["weight_at_key"],
                t["recent"]["calls"]
            ])
        })
        .collect();
    assert_eq!(
        tenants,
        [
            json!(["noisy", "wide", 3, "batch", 3, 11]),
            json!(["quiet", "narrow", 1, "interactive", 10, 1]),
        ]
    );
    let metrics = get(addr, "/metrics").await.body_str();
    for (tenant, calls) in [("noisy", 11.0), ("quiet", 1.0)] {
        let series = format!(r#"tollgate_wait_seconds_count{{key="{name}",tenant="{tenant}"}}"#);
        assert_eq!(
            metric(&metrics, &series),
            Some(calls),
            "{series} in:\n{metrics}"
        );
        let series =
            format!(r#"tollgate_proxy_admitted_tokens_total{{key="{name}",tenant="{tenant}"}}"#);
        assert!(
            metric(&metrics, &series).is_some(),
            "{series} in:\n{metrics}"
        );
    }
}

/// Tenants the configuration doesn't name (here, hashed keys) wait with the default tier's
/// weight and are shown together as `other`: no key, and a bounded set of labels.
#[tokio::test]
async fn tenants_the_configuration_does_not_name_are_shown_together_as_other() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let name = "fair-other";
    let running = proxy(&format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tiers.base]
        weight = 4
        [tenants]
        from = "key"
        default_tier = "base"
        [[upstream]]
        name = "{name}"
        url = "{}"
        profile = "openai"
        per_model = false
        requests = "100/s"
        "#,
        upstream.url()
    ))
    .await;
    let body = Bytes::from(
        json!({"model": "gpt-4o", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
    );
    for key in ["sk-first-tenant-key", "sk-second-tenant-key"] {
        let auth = format!("Bearer {key}");
        let answer = send(
            running.addr,
            "/v1/chat/completions",
            &[("authorization", &auth)],
            body.clone(),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
    }
    let view = view(&running).await;
    let tenants = view["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 1, "{view:#}");
    let other = &tenants[0];
    assert_eq!(
        json!([
            other["tenant"],
            other["tier"],
            other["weight"],
            other["weight_at_key"],
            other["recent"]["calls"],
            other["recent"]["share"]
        ]),
        json!(["other", "base", 4, 40, 2, 1.0])
    );
    assert!(!view.to_string().contains("sk-"), "a key leaked");
    let metrics = get(running.addr, "/metrics").await.body_str();
    let series = format!(r#"tollgate_wait_seconds_count{{key="{name}",tenant="other"}}"#);
    assert_eq!(metric(&metrics, &series), Some(2.0), "{metrics}");
}

/// A reload carries new weights and priorities: the next call waits with them, and the live
/// view shows them at once.
#[tokio::test]
async fn a_reload_carries_a_tiers_new_weight_and_priority() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let running = fair_proxy("fair-reload", &upstream.url()).await;
    let weights = |view: &Value| -> Vec<Value> {
        view["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| json!([t["tenant"], t["weight"], t["priority"], t["weight_at_key"]]))
            .collect()
    };
    assert_eq!(
        weights(&view(&running).await),
        [
            json!(["noisy", 3, "batch", 3]),
            json!(["quiet", 1, "interactive", 10])
        ]
    );
    let text = format!(
        r#"
        admin_listen = "127.0.0.1:0"
        [tiers.wide]
        weight = 7
        [tiers.narrow]
        weight = 2
        priority = "batch"
        [tenants]
        from = "header:x-team"
        trusted_network = true
        tier_of = {{ noisy = "wide", quiet = "narrow" }}
        [[upstream]]
        name = "fair-reload"
        url = "{}"
        profile = "openai"
        per_model = false
        requests = "5/5s"
        "#,
        upstream.url()
    );
    let mut config = tollgate_proxy::Config::from_toml(&text).unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    running.reloader.reload(config).await.unwrap();
    assert_eq!(
        weights(&view(&running).await),
        [
            json!(["noisy", 7, "interactive", 70]),
            json!(["quiet", 2, "batch", 2])
        ]
    );
}
