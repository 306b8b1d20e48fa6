//! The operators' live view, on a listener of its own (`admin_listen`), never on the clients':
//!
//! - `GET /admin/api/keys`: every key the proxy knows (each upstream's own key, the model keys
//!   seen, the configured tenants' keys, and the other tenants aggregated under one entry),
//!   each with its windows' levels, the calls waiting at it and its counts (admitted, local
//!   429s, upstream 429s). The shape is in the README (`## The live view`).
//! - `GET /admin/`: a status page (one HTML file, no build step, no external asset) that polls
//!   the JSON every second and draws each key's windows as bars.
//!
//! The counts are this process's own (a fleet on Redis shares levels, not counts); they are
//! kept here rather than read back from the metrics recorder, which is one per process and
//! shared by every proxy in it (as in the tests).

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tollgate::{Currency, Limiter, Limits};

use crate::config::LimitsFrom;
use crate::keys::{BUDGET, TENANT_PART};
use crate::metrics::OTHER;
use crate::state::{ReadyUpstream, Shared};
use crate::tally::{Counts, unix_ms};

/// The status page.
const PAGE: &str = include_str!("admin.html");
/// The version of the JSON's shape: fields may be added within a version, never removed or
/// changed.
const SHAPE: u32 = 1;
/// The most connections to the admin listener at once (a browser opens a few).
const ADMIN_CONNECTIONS: usize = 64;
/// How long the view waits for the store, per key.
const STORE_WAIT: Duration = Duration::from_secs(2);

/// `GET /admin/api/keys`.
#[derive(Debug, Serialize)]
struct View {
    /// The version of this shape.
    version: u32,
    /// When the view was read, in milliseconds since the Unix epoch.
    now: u64,
    store: StoreView,
    /// The proxy is draining (SIGTERM).
    draining: bool,
    upstreams: Vec<UpstreamView>,
    keys: Vec<KeyView>,
    /// Each tenant's weight, and its last minute at the organisation's keys: the configured
    /// tenants, and `other` for the rest once one was admitted.
    tenants: Vec<TenantView>,
}

/// A tenant at the organisation's keys (where tenants wait in fair order by weight).
#[derive(Debug, Serialize)]
struct TenantView {
    tenant: String,
    /// Its tier (`null`: none).
    tier: Option<String>,
    /// Its tier's `weight` (1 without a tier).
    weight: u32,
    /// `interactive` or `batch`.
    priority: &'static str,
    /// What it waits with at a key: `weight` × 10 when interactive, × 1 for batch.
    weight_at_key: u32,
    /// Its calls, waits and share of the tokens admitted in the last minute (`null`: none).
    recent: Option<crate::fair::Recent>,
}

/// The tenants' weights and their last minute at the organisation's keys.
fn tenant_views(shared: &Shared, named: &BTreeSet<String>) -> Vec<TenantView> {
    let mut recent = shared.live.fair.recent(tokio::time::Instant::now());
    let mut out = Vec::new();
    let mut view = |tenant: &str, tier: Option<&crate::config::Tier>, recent| {
        let (weight, priority) = tier.map_or((1, crate::config::Priority::Interactive), |t| {
            (t.weight, t.priority)
        });
        out.push(TenantView {
            tenant: tenant.to_owned(),
            tier: tier.map(|t| t.name.clone()),
            weight,
            priority: priority.name(),
            weight_at_key: weight.saturating_mul(priority.factor()),
            recent,
        });
    };
    for tenant in named {
        let mine = recent.remove(tenant);
        view(tenant, shared.tier(tenant), mine);
    }
    if let Some(others) = recent.remove(OTHER) {
        let tier = shared
            .config
            .tenants
            .default_tier
            .as_ref()
            .and_then(|t| shared.config.tenants.tiers.get(t));
        view(OTHER, tier, Some(others));
    }
    out
}

#[derive(Debug, Serialize)]
struct StoreView {
    /// `memory` or `redis`.
    kind: &'static str,
    /// Every level was read (false: the store did not answer; levels are `null`).
    ok: bool,
}

#[derive(Debug, Serialize)]
struct UpstreamView {
    name: String,
    profile: String,
    /// The base URL, without credentials.
    url: String,
    /// The prefix its clients' paths are under (`""`: none).
    mount: String,
    /// `fixed` (rates in the configuration) or `from-headers`.
    limits: &'static str,
}

#[derive(Debug, Serialize)]
struct KeyView {
    key: String,
    upstream: String,
    /// `upstream` (its own key, shared by models without one), `model`, `tenant` (named in the
    /// configuration), or `tenants` (every other tenant, aggregated).
    kind: &'static str,
    model: Option<String>,
    tenant: Option<String>,
    /// The limits as text (`requests 60/m, tokens 20000/m`); `null` while they are learned from
    /// the headers.
    limits: Option<String>,
    windows: Vec<WindowView>,
    /// Calls waiting at the key now.
    waiting: usize,
    counts: Counts,
    /// For `tenants`: how many tenants were seen lately.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenants: Option<usize>,
    /// What the key's calls cost since the proxy started, at their models' prices
    /// (`{"amount": 12.5, "currency": "USD", "since": <unix ms>}`); `null` before any was
    /// priced.
    spend: Option<serde_json::Value>,
    /// A pause its provider put on the key, still in force (`{"until": <unix ms>}`), as this
    /// process heard it; `null` when none.
    pause: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
struct WindowView {
    /// `requests`, `tokens` or `output_tokens`.
    currency: Currency,
    /// The rate as written in the configuration (`60/m`, `20000/10s burst 500`).
    rate: String,
    /// The most the window holds.
    capacity: u64,
    /// What it holds now, with fractions (negative: in debt); `null` when not read (an
    /// aggregate of tenants, or a store that did not answer).
    level: Option<f64>,
    /// What it refills a second.
    refill_per_second: f64,
    /// For a budget (`spend`, counted in micro-dollars): its capacity, level and refill in
    /// dollars, as people read money.
    #[serde(skip_serializing_if = "Option::is_none")]
    dollars: Option<DollarsView>,
}

#[derive(Debug, Serialize)]
struct DollarsView {
    /// The rate as written in the configuration (`$5/d`).
    rate: String,
    capacity: f64,
    level: Option<f64>,
    refill_per_second: f64,
}

fn windows(limits: &Limits, levels: Option<&tollgate::Snapshot>) -> Vec<WindowView> {
    let mut out = Vec::new();
    for (i, (currency, rate)) in limits.windows().enumerate() {
        let level = levels
            .and_then(|s| s.windows().get(i))
            .filter(|a| a.currency == currency)
            .map(|a| a.tokens.as_f64());
        let refill_per_second = rate.amount() as f64 / rate.period().as_secs_f64();
        let dollars = (currency == Currency::Spend).then(|| DollarsView {
            rate: tollgate::Rates::from(*rate).money().to_string(),
            capacity: rate.burst() as f64 / 1e6,
            level: level.map(|l| l / 1e6),
            refill_per_second: refill_per_second / 1e6,
        });
        out.push(WindowView {
            currency,
            rate: rate.to_string(),
            capacity: rate.burst(),
            level,
            refill_per_second,
            dollars,
        });
    }
    out
}

/// An upstream's base URL without its user and password.
fn shown_url(url: &http::Uri) -> String {
    let authority = url.authority().map_or("", |a| a.as_str());
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let path = url.path().trim_end_matches('/');
    format!("{}://{host}{path}", url.scheme_str().unwrap_or("https"))
}

/// The limiter holding a key's windows, if its limits are known.
fn limiter_of(
    shared: &Shared,
    upstream: &ReadyUpstream,
    key: &str,
    tenant: bool,
) -> Option<Limiter> {
    let stored = shared.store_key(key);
    if tenant {
        let name = key.rsplit(TENANT_PART).next()?;
        let limits = shared.tenant_limits(name)?;
        return shared.registry.limiter(&stored, limits).ok();
    }
    if let Some(limiter) = upstream.gate.limiter_of(&stored) {
        return Some(limiter);
    }
    let limits = upstream.gate.configured_limits(&stored)?;
    shared.registry.limiter(&stored, limits).ok()
}

/// What a key's calls cost, as the view shows it.
fn spend_of(counts: &Counts, since: u64) -> Option<serde_json::Value> {
    (counts.spent_micros > 0).then(|| {
        serde_json::json!({
            "amount": counts.spent_micros as f64 / 1e6,
            "currency": "USD",
            "since": since,
        })
    })
}

/// A pause still in force on a key as the store has it (a fleet on Redis: any proxy may have
/// heard the provider's 429), read within [`STORE_WAIT`].
async fn stored_pause(shared: &Shared, key: &str) -> Option<serde_json::Value> {
    let until = tokio::time::timeout(STORE_WAIT, shared.owners.pause_of(key))
        .await
        .ok()
        .flatten()?;
    (until > unix_ms()).then(|| serde_json::json!({"until": until}))
}

/// A pause still in force on a key.
fn pause_of(counts: &Counts) -> Option<serde_json::Value> {
    (counts.paused_until > unix_ms()).then(|| serde_json::json!({"until": counts.paused_until}))
}

/// Reads every key.
async fn view(shared: &Shared) -> View {
    let named: BTreeSet<String> = shared.config.tenants.named().cloned().collect();
    let counts = shared.live.counts();
    let mut store_ok = true;
    let mut keys = Vec::new();
    let mut upstreams = Vec::new();
    for upstream in &shared.upstreams {
        let name = upstream.name.as_str();
        upstreams.push(UpstreamView {
            name: name.to_owned(),
            profile: upstream.config.profile.clone(),
            url: shown_url(&upstream.config.url),
            mount: upstream.config.mount.clone(),
            limits: match upstream.config.limits {
                LimitsFrom::Fixed(_) => "fixed",
                LimitsFrom::Headers => "from-headers",
            },
        });
        let tenant_prefix = format!("{name}:{TENANT_PART}");
        let aggregate = format!("{tenant_prefix}{OTHER}");
        let mut models = BTreeSet::new();
        let mut tenants = BTreeSet::new();
        let seen = upstream.seen_keys();
        let counted = counts
            .keys()
            .filter(|k| {
                k.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(':'))
            })
            .cloned();
        for key in seen.into_iter().chain(counted) {
            if key == aggregate {
                continue;
            }
            match key.strip_prefix(&tenant_prefix) {
                Some(tenant) if named.contains(tenant) => {
                    tenants.insert(tenant.to_owned());
                }
                Some(_) => {}
                None => {
                    if let Some(model) = key.strip_prefix(name).and_then(|r| r.strip_prefix(':')) {
                        models.insert(model.to_owned());
                    }
                }
            }
        }
        if shared.tenant_windows() {
            tenants.extend(
                named
                    .iter()
                    .filter(|t| shared.tenant_limits(t).is_some())
                    .cloned(),
            );
        }
        let mut entries: Vec<(String, &'static str, Option<String>, Option<String>)> =
            vec![(name.to_owned(), "upstream", None, None)];
        entries.extend(
            models
                .into_iter()
                .map(|m| (format!("{name}:{m}"), "model", Some(m), None)),
        );
        entries.extend(
            tenants
                .into_iter()
                .map(|t| (format!("{tenant_prefix}{t}"), "tenant", None, Some(t))),
        );
        for (key, kind, model, tenant) in entries {
            let limiter = limiter_of(shared, upstream, &key, kind == "tenant");
            let snapshot = snapshot_of(limiter.as_ref(), &mut store_ok).await;
            let counted = counts.get(&key).copied().unwrap_or_default();
            let pause = match pause_of(&counted) {
                Some(pause) => Some(pause),
                None if store_ok => stored_pause(shared, &key).await,
                None => None,
            };
            keys.push(KeyView {
                limits: limiter.as_ref().map(|l| l.limits().to_string()),
                windows: limiter
                    .as_ref()
                    .map(|l| windows(l.limits(), snapshot.as_ref()))
                    .unwrap_or_default(),
                waiting: limiter.as_ref().map_or(0, Limiter::waiters),
                counts: counted,
                key,
                upstream: name.to_owned(),
                kind,
                model,
                tenant,
                tenants: None,
                spend: spend_of(&counted, shared.live.started),
                pause,
            });
        }
        let (members, waiting) = shared.live.others_of(name);
        let aggregate_counts = counts.get(&aggregate).copied();
        if let Some(limits) = shared.other_tenant_limits()
            && (members > 0 || aggregate_counts.is_some())
        {
            keys.push(KeyView {
                key: aggregate,
                upstream: name.to_owned(),
                kind: "tenants",
                model: None,
                tenant: Some(OTHER.to_owned()),
                limits: Some(limits.to_string()),
                windows: windows(limits, None),
                waiting,
                counts: aggregate_counts.unwrap_or_default(),
                tenants: Some(members),
                spend: aggregate_counts.and_then(|c| spend_of(&c, shared.live.started)),
                pause: None,
            });
        }
    }
    // The budgets: each upstream's, each tier's shared one, each named tenant's.
    let mut budgets: Vec<(String, Option<String>, Option<String>, tollgate::Rates)> = Vec::new();
    for upstream in &shared.upstreams {
        if !upstream.config.spend.is_empty() {
            budgets.push((
                format!("{BUDGET}upstream:{}", upstream.name),
                Some(upstream.name.clone()),
                None,
                upstream.config.spend.clone(),
            ));
        }
    }
    for tier in shared.config.tenants.tiers.values() {
        if !tier.spend_total.is_empty() {
            budgets.push((
                format!("{BUDGET}tier:{}", tier.name),
                None,
                None,
                tier.spend_total.clone(),
            ));
        }
    }
    for tenant in &named {
        if let Some(tier) = shared.tier(tenant)
            && !tier.spend.is_empty()
        {
            budgets.push((
                format!("{BUDGET}{TENANT_PART}{tenant}"),
                None,
                Some(tenant.clone()),
                tier.spend.clone(),
            ));
        }
    }
    for (key, upstream, tenant, spend) in budgets {
        let limits = Limits::default().with_spend(spend);
        let limiter = shared
            .registry
            .limiter(&shared.store_key(&key), &limits)
            .ok();
        let snapshot = snapshot_of(limiter.as_ref(), &mut store_ok).await;
        let counted = counts.get(&key).copied().unwrap_or_default();
        keys.push(KeyView {
            limits: Some(limits.to_string()),
            windows: windows(&limits, snapshot.as_ref()),
            waiting: 0,
            counts: counted,
            key,
            upstream: upstream.unwrap_or_default(),
            kind: "budget",
            model: None,
            tenant,
            tenants: None,
            spend: spend_of(&counted, shared.live.started),
            pause: None,
        });
    }
    View {
        version: SHAPE,
        now: unix_ms(),
        store: StoreView {
            kind: shared.live.store,
            ok: store_ok,
        },
        draining: shared.draining.load(Ordering::Relaxed),
        upstreams,
        keys,
        tenants: tenant_views(shared, &named),
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// Whether the live view answers a request naming `host` (its `Host` header) on a listener
/// bound to `local`: its own address, `localhost`, `127.0.0.1` or `[::1]` at its port when it
/// is bound to loopback, or a name `admin_hosts` lists (`host`, any port, or `host:port`). A
/// page on another name (DNS rebinding) is refused.
fn host_allowed(host: Option<&str>, local: std::net::SocketAddr, listed: &[String]) -> bool {
    let Some(host) = host.map(str::to_ascii_lowercase) else {
        return false;
    };
    let port = local.port();
    let (name, given_port) = match host.rsplit_once(':') {
        Some((name, p)) if !name.ends_with(':') && p.bytes().all(|b| b.is_ascii_digit()) => {
            (name.to_owned(), p.parse::<u16>().ok())
        }
        _ => (host.clone(), None),
    };
    // A browser always sends the port unless it is the scheme's default.
    let at_port = given_port.unwrap_or(80) == port;
    let own = [
        (!local.ip().is_unspecified()).then(|| match local {
            std::net::SocketAddr::V4(v4) => v4.ip().to_string(),
            std::net::SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
        }),
        local.ip().is_loopback().then(|| "localhost".to_owned()),
        local.ip().is_loopback().then(|| "127.0.0.1".to_owned()),
        local.ip().is_loopback().then(|| "[::1]".to_owned()),
    ];
    if at_port && own.iter().flatten().any(|own| *own == name) {
        return true;
    }
    listed.iter().any(|entry| {
        let entry = entry.to_ascii_lowercase();
        entry == host || (!entry.contains(':') && entry == name)
    })
}

/// One request to the admin listener.
async fn serve_request(
    shared: &Shared,
    request: Request<Incoming>,
    local: std::net::SocketAddr,
) -> Response<Full<Bytes>> {
    let text = "text/plain; charset=utf-8";
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    if !host_allowed(host, local, &shared.config.admin_hosts) {
        return respond(
            StatusCode::MISDIRECTED_REQUEST,
            text,
            Bytes::from_static(
                b"the live view answers only to its own address (and the names admin_hosts lists)\n",
            ),
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            Bytes::from_static(b"GET only\n"),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match request.uri().path() {
        "/" | "/admin" => {
            let mut response = respond(StatusCode::PERMANENT_REDIRECT, text, Bytes::new());
            response
                .headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("/admin/"));
            response
        }
        "/admin/" | "/admin/index.html" => {
            let mut response = respond(
                StatusCode::OK,
                "text/html; charset=utf-8",
                Bytes::from_static(PAGE.as_bytes()),
            );
            // Only its own inline style and script, and fetches of its own JSON.
            response.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                ),
            );
            response
        }
        "/metrics" => {
            let (body, content_type) = crate::service::metrics_page(shared).await;
            let mut response = respond(StatusCode::OK, text, body);
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type);
            response
        }
        "/admin/api/keys" => {
            let view = view(shared).await;
            let body = serde_json::to_vec(&view).unwrap_or_default();
            respond(StatusCode::OK, "application/json", Bytes::from(body))
        }
        _ => respond(
            StatusCode::NOT_FOUND,
            text,
            Bytes::from_static(
                b"not found: GET /admin/ (the page) or /admin/api/keys (its JSON)\n",
            ),
        ),
    }
}

/// Serves the admin listener until the task is dropped (its connections with it).
pub(crate) async fn serve(listener: TcpListener, current: Arc<crate::state::Current>) {
    let mut connections = JoinSet::new();
    let Ok(local) = listener.local_addr() else {
        return;
    };
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "admin: accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        if connections.len() >= ADMIN_CONNECTIONS {
            // A page left open in many tabs: the newest waits for a connection to close.
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let current = Arc::clone(&current);
        let header_timeout = current.get().bounds.header_timeout;
        connections.spawn(async move {
            let service = service_fn(move |request| {
                let shared = current.get();
                async move { Ok::<_, Infallible>(serve_request(&shared, request, local).await) }
            });
            // A kept-alive connection that sends nothing is closed after the header timeout.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// What `limiter`'s windows hold, asked within [`STORE_WAIT`] while the store has answered
/// so far; after a store that didn't answer, no key asks again (`store_ok` goes false), so a
/// down store costs the view one wait, not one a key.
async fn snapshot_of(limiter: Option<&Limiter>, store_ok: &mut bool) -> Option<tollgate::Snapshot> {
    let limiter = limiter.filter(|_| *store_ok)?;
    match tokio::time::timeout(STORE_WAIT, limiter.snapshot()).await {
        Ok(Ok(snapshot)) => Some(snapshot),
        _ => {
            *store_ok = false;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_answers_its_own_names_only() {
        let local: std::net::SocketAddr = "127.0.0.1:8788".parse().unwrap();
        let listed = vec!["ops.example.com".to_owned(), "view.example:9000".to_owned()];
        for ok in [
            "127.0.0.1:8788",
            "localhost:8788",
            "LOCALHOST:8788",
            "[::1]:8788",
            "ops.example.com",
            "ops.example.com:443",
            "view.example:9000",
        ] {
            assert!(host_allowed(Some(ok), local, &listed), "{ok}");
        }
        for refused in [
            "evil.example:8788",
            "127.0.0.1:9999",
            "localhost",
            "view.example:9001",
            "127.0.0.1.evil.example:8788",
            "",
        ] {
            assert!(!host_allowed(Some(refused), local, &listed), "{refused}");
        }
        assert!(!host_allowed(None, local, &listed));
        let any: std::net::SocketAddr = "0.0.0.0:8788".parse().unwrap();
        assert!(!host_allowed(Some("0.0.0.0:8788"), any, &[]));
        assert!(host_allowed(
            Some("10.1.2.3:8788"),
            "10.1.2.3:8788".parse().unwrap(),
            &[]
        ));
    }

    #[test]
    fn a_url_is_shown_without_its_credentials() {
        let url: http::Uri = "https://user:secret@api.example.com:8443/v1/"
            .parse()
            .unwrap();
        assert_eq!(shown_url(&url), "https://api.example.com:8443/v1");
        let url: http::Uri = "http://127.0.0.1:9".parse().unwrap();
        assert_eq!(shown_url(&url), "http://127.0.0.1:9");
    }
}
