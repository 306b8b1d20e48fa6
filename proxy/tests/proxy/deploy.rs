//! The Grafana dashboard (`proxy/deploy/grafana-dashboard.json`) and the Prometheus alerts
//! (`proxy/deploy/alerts.yml`) read only series a proxy exports: every metric name in their
//! queries is in a real `/metrics`, after the events that make the lazy series appear (a call
//! admitted and answered, a 429 here, a provider's 429).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tollgate_testkit::provider::{Options, Provider};

use crate::common::*;

fn deploy(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every PromQL expression of the dashboard: its panels' targets (rows' panels too) and its
/// variables' queries.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().expect("every target has an expr");
                out.push(expr.to_owned());
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            out.push(query.to_owned());
        }
    }
    out
}

/// Every alert's expression, with its rule checked for what an operator reads.
fn alert_queries(rules: &serde_yaml::Value) -> Vec<String> {
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            assert!(
                ["critical", "warning", "info"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: a severity"
            );
            assert!(
                rule["annotations"]["summary"].as_str().is_some(),
                "{name}: a summary"
            );
            out.push(
                rule["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: an expr"))
                    .to_owned(),
            );
        }
    }
    out
}

/// The metric names an expression reads (every series the proxy and the library export is
/// named `tollgate_...`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tollgate_") {
        let before = rest[..at].chars().next_back();
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        // Not the tail of a longer identifier (a recording rule's `x:tollgate_...`).
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            names.insert(name.clone());
        }
        rest = &rest[at + name.len()..];
    }
    names
}

/// An expression's brackets pair up, and each quantile is taken over `_bucket` series kept
/// apart by `le`.
fn well_formed(expr: &str) {
    let mut open = Vec::new();
    let mut quoted = false;
    for c in expr.chars() {
        match c {
            '"' => quoted = !quoted,
            _ if quoted => {}
            '(' | '{' | '[' => open.push(c),
            ')' | '}' | ']' => {
                let opened = open.pop();
                let wanted = match c {
                    ')' => '(',
                    '}' => '{',
                    _ => '[',
                };
                assert_eq!(opened, Some(wanted), "unbalanced: {expr}");
            }
            _ => {}
        }
    }
    assert!(open.is_empty() && !quoted, "unclosed: {expr}");
    for part in expr.split("histogram_quantile(").skip(1) {
        assert!(part.contains("_bucket"), "a quantile of no buckets: {expr}");
        let by = part
            .split("by (")
            .nth(1)
            .and_then(|b| b.split(')').next())
            .unwrap_or_else(|| panic!("a quantile summed by nothing: {expr}"));
        assert!(
            by.split(',').any(|label| label.trim() == "le"),
            "a quantile without `le`: {expr}"
        );
    }
}

/// The metric names in a Prometheus text.
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn the_dashboard_and_the_alerts_read_only_series_the_proxy_exports() {
    let dashboard: Value =
        serde_json::from_str(&deploy("grafana-dashboard.json")).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "tollgate-proxy");
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&deploy("alerts.yml")).expect("the alerts are YAML");
    let queries: Vec<String> = dashboard_queries(&dashboard)
        .into_iter()
        .chain(alert_queries(&rules))
        .collect();
    let mut used = BTreeSet::new();
    for query in &queries {
        well_formed(query);
        let names = metric_names(query);
        assert!(!names.is_empty(), "a query of no tollgate series: {query}");
        used.extend(names);
    }
    // What an operator must see is there.
    for needed in [
        "tollgate_proxy_requests_total",
        "tollgate_proxy_local_429s_total",
        "tollgate_proxy_upstream_429s_total",
        "tollgate_wait_seconds_bucket",
        "tollgate_proxy_upstream_seconds_bucket",
        "tollgate_proxy_added_seconds_bucket",
        "tollgate_proxy_settled_tokens_total",
        "tollgate_proxy_level",
        "tollgate_proxy_store_errors_total",
        "tollgate_proxy_slow_bodies_total",
        "tollgate_proxy_connections_closed_total",
    ] {
        assert!(used.contains(needed), "nothing reads {needed}");
    }

    // A proxy that served calls: one admitted and answered (the upstream's and the proxy's
    // latency, settled tokens, a level, the key's library meters and its wait), one answered 429
    // here (a request an hour, half a second to wait), one spent quota upstream.
    let day = Duration::from_secs(86_400);
    let stand_in = Provider::start_with(Options::openai(1_000, 100_000, day).exact()).await;
    let spent = Provider::start_with(Options::openai(1_000, 100_000, day).permanent()).await;
    let running = proxy(&format!(
        r#"
        [[upstream]]
        name = "deploy-strict"
        url = "http://{}"
        profile = "openai"
        requests = "1/h"
        tokens = "100000/d"
        timeout_seconds = 0.5

        [[upstream]]
        name = "deploy-spent"
        url = "http://{}"
        profile = "openai"
        mount = "/spent"
        requests = "1000/d"
        "#,
        stand_in.addr, spent.addr
    ))
    .await;
    let body = json!({"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let path = "/v1/chat/completions";
    assert_eq!(post(running.addr, path, &body).await.status, 200);
    assert_eq!(post(running.addr, path, &body).await.status, 429);
    assert_eq!(
        post(running.addr, "/spent/v1/chat/completions", &body)
            .await
            .status,
        429
    );
    // The settlement follows the answer's last byte.
    let mut text = String::new();
    for _ in 0..100 {
        text = get(running.addr, "/metrics").await.body_str();
        let settled = r#"tollgate_proxy_settled_tokens_total{upstream="deploy-strict"}"#;
        if metric(&text, settled).is_some_and(|n| n > 0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let exported = exported(&text);
    let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "the deploy files read series the proxy does not export: {missing:?}\n{text}"
    );
}

#[test]
fn metric_names_are_read_whole() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.95, sum by (le) (rate(tollgate_wait_seconds_bucket{key=~"$key"}[5m]))) / x:tollgate_other"#
        ),
        BTreeSet::from(["tollgate_wait_seconds_bucket".to_owned()])
    );
}
