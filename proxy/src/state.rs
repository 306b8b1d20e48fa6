//! What every request shares: the upstreams (each with its gate, its client and its meters),
//! the tenancy, the store, and the bounds.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::sync::Semaphore;
use tollgate::http::{Gate, Profile};
use tollgate::{Currency, Limits, Registry};

use crate::config::{
    Bounds, Config, Family, KeyPaths, LimitsFrom, OtherPaths, TenantFrom, Upstream,
};
use crate::metrics::{Metrics, OTHER, ProxyMetrics, UpstreamMetrics};
use crate::route::azure_deployment;
use crate::tenant::Tenancy;

/// The client the proxy sends with.
pub(crate) type UpstreamClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// What follows an upstream's name in its tenants' keys: `{upstream}:tenant:{tenant}`.
pub(crate) const TENANT_PART: &str = "tenant:";
/// The most keys per upstream whose levels `/metrics` shows.
const LEVEL_KEYS: usize = 1_024;
/// Request bodies are counted against the memory for bodies in units of this many bytes.
pub(crate) const BUFFER_UNIT: usize = 1_024;

/// An upstream, ready: its gate, its client, its meters.
pub(crate) struct Upstreamed {
    /// Its name.
    pub(crate) name: String,
    pub(crate) config: Upstream,
    pub(crate) family: Family,
    pub(crate) profile: Profile,
    pub(crate) gate: Gate,
    pub(crate) client: UpstreamClient,
    pub(crate) scheme: http::uri::Scheme,
    pub(crate) authority: http::uri::Authority,
    /// The real key, in the header the family sends it in (with virtual keys).
    pub(crate) real_key: Option<(HeaderName, HeaderValue)>,
    pub(crate) tenant_limits: Option<Limits>,
    pub(crate) metrics: UpstreamMetrics,
    /// Keys seen lately (models and configured tenants), for their levels in `/metrics`.
    keys: Mutex<HashSet<String>>,
}

/// Everything the requests share.
pub(crate) struct Shared {
    pub(crate) upstreams: Vec<Arc<Upstreamed>>,
    pub(crate) routes: Vec<Upstream>,
    pub(crate) other: OtherPaths,
    pub(crate) max_body: usize,
    pub(crate) bounds: Bounds,
    pub(crate) tenancy: Tenancy,
    pub(crate) tenant_header: Option<HeaderName>,
    pub(crate) virtual_key_paths: KeyPaths,
    pub(crate) registry: Arc<Registry>,
    pub(crate) draining: AtomicBool,
    pub(crate) metrics: Metrics,
    pub(crate) proxy_metrics: ProxyMetrics,
    /// The memory for request bodies, in units of [`BUFFER_UNIT`] bytes.
    pub(crate) buffered: Arc<Semaphore>,
    /// The last answer of the store to `/readyz`, and when it came.
    pub(crate) ready: Mutex<Option<(tokio::time::Instant, bool)>>,
    /// Told when the drain starts (bodies still coming are answered 503).
    pub(crate) drain_started: tokio::sync::Notify,
    /// Each key's counts, for the live view (`admin.rs`).
    pub(crate) live: crate::admin::Tally,
}

/// Why the proxy can't start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

fn client(upstream: &Upstream) -> Result<UpstreamClient, StartError> {
    // rustls needs one crypto provider for the process; ring is the one built in.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(upstream.connect_timeout));
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    // The platform's roots, or webpki's where the platform has none (a bare container).
    let builder = match builder.with_native_roots() {
        Ok(builder) => builder,
        Err(_) => hyper_rustls::HttpsConnectorBuilder::new().with_webpki_roots(),
    };
    let connector = builder
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    let mut client = Client::builder(TokioExecutor::new());
    client
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1_024)
        .http2_only(upstream.http2_only);
    Ok(client.build(connector))
}

/// Whether `model` is `name` or one of its family (`name` then `-`, `:`, `@` or `.`).
fn family_of(model: &str, name: &str) -> bool {
    model
        .strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', ':', '@', '.']))
}

/// The model a call's key is named after: a listed model (the longest that `model` is, or
/// starts a family of), else, when none are listed, the profile's known model; `None`: the
/// upstream's own key.
pub(crate) fn model_entry(upstream: &Upstream, profile: &Profile, model: &str) -> Option<String> {
    if upstream.models.is_empty() {
        return profile.model(model).map(|m| m.name.to_string());
    }
    upstream
        .models
        .iter()
        .filter(|name| family_of(model, name))
        .max_by_key(|name| name.len())
        .cloned()
}

/// The model (or Azure deployment) a request names.
pub(crate) fn model_of<'a>(
    family: Family,
    parts: &'a http::request::Parts,
    body: &'a Value,
) -> Option<&'a str> {
    if family == Family::Azure {
        let path = parts.uri.path();
        path.find("/openai/deployments/")
            .and_then(|at| azure_deployment(&path[at..]))
            .map(|(deployment, _)| deployment)
    } else {
        body.get("model").and_then(Value::as_str)
    }
}

fn key_fn(
    upstream: &Upstream,
    profile: Profile,
) -> impl Fn(&http::request::Parts, &Value) -> String + Send + Sync + 'static {
    let config = upstream.clone();
    move |parts, body| {
        if !config.per_model {
            return config.name.clone();
        }
        match model_of(config.family(), parts, body).and_then(|m| model_entry(&config, &profile, m))
        {
            Some(model) => format!("{}:{model}", config.name),
            None => config.name.clone(),
        }
    }
}

impl Shared {
    /// Builds every upstream's gate and client on a registry over `store`.
    pub(crate) fn new(
        config: &Config,
        store: tollgate::store::AnyStore,
    ) -> Result<Shared, StartError> {
        // The recorder first: the counters made below must be its.
        let metrics = Metrics::new();
        let proxy_metrics = ProxyMetrics::new();
        let tenancy = Tenancy::new(&config.tenants);
        // Tenants the configuration names keep their own label; every other (a hashed key, a
        // header's value) shares one.
        let named: BTreeSet<String> = config
            .tenants
            .virtual_keys
            .values()
            .chain(config.tenants.default.iter())
            .cloned()
            .collect();
        let registry = Arc::new(Registry::new(store).label_keys(move |key| {
            let key = key.split('@').next().unwrap_or(key);
            match key.split_once(&format!(":{TENANT_PART}")) {
                Some((_, tenant)) if named.contains(tenant) => key.to_owned(),
                Some((upstream, _)) => format!("{upstream}:{TENANT_PART}{OTHER}"),
                None => key.to_owned(),
            }
        }));
        let mut upstreams = Vec::new();
        for u in &config.upstreams {
            let profile = u.library_profile().map_err(StartError)?;
            let builder = Gate::builder(profile.clone())
                .registry(Arc::clone(&registry))
                .key(key_fn(u, profile.clone()))
                .timeout(Some(u.timeout))
                .retries(u.retries)
                .max_body(config.max_body);
            let builder = match &u.limits {
                LimitsFrom::Fixed(limits) => builder.limits(limits.clone()),
                LimitsFrom::Headers => builder.limits_from_headers(Duration::from_secs(60)),
            };
            let what =
                |e: &dyn std::fmt::Display| StartError(format!("upstream `{}`: {e}", u.name));
            let gate = builder.build().map_err(|e| what(&e))?;
            let real_key = match &u.api_key_env {
                Some(var) if tenancy.has_virtual_keys() => {
                    let key = std::env::var(var).map_err(|_| {
                        what(&format!(
                            "the environment variable {var} (api_key_env) is not set"
                        ))
                    })?;
                    let (name, value) = match u.family() {
                        Family::Anthropic => (HeaderName::from_static("x-api-key"), key),
                        Family::Azure => (HeaderName::from_static("api-key"), key),
                        Family::OpenAi | Family::Voyage => {
                            (header::AUTHORIZATION, format!("Bearer {key}"))
                        }
                    };
                    let mut value = HeaderValue::try_from(value)
                        .map_err(|_| what(&format!("{var} is not a valid header value")))?;
                    value.set_sensitive(true);
                    Some((name, value))
                }
                _ => None,
            };
            if tenancy.has_virtual_keys() && real_key.is_none() {
                return Err(what(
                    &"virtual keys are configured: give the upstream its real key with api_key_env",
                ));
            }
            let scheme = u.url.scheme().cloned().unwrap_or(http::uri::Scheme::HTTPS);
            let authority = u
                .url
                .authority()
                .cloned()
                .ok_or_else(|| what(&"the url has no host"))?;
            upstreams.push(Arc::new(Upstreamed {
                name: u.name.clone(),
                config: u.clone(),
                family: u.family(),
                profile,
                gate,
                client: client(u)?,
                scheme,
                authority,
                real_key,
                tenant_limits: config.tenants.limits.clone(),
                metrics: UpstreamMetrics::new(&u.name),
                keys: Mutex::new(HashSet::new()),
            }));
        }
        let tenant_header = match &config.tenants.from {
            TenantFrom::Header(name) => Some(name.clone()),
            _ => None,
        };
        let units = (config.bounds.max_buffered / BUFFER_UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Ok(Shared {
            upstreams,
            routes: config.upstreams.clone(),
            other: config.other_paths,
            max_body: config.max_body,
            bounds: config.bounds.clone(),
            tenancy,
            tenant_header,
            virtual_key_paths: config.tenants.virtual_key_paths,
            registry,
            draining: AtomicBool::new(false),
            metrics,
            proxy_metrics,
            buffered: Arc::new(Semaphore::new(units)),
            ready: Mutex::new(None),
            drain_started: tokio::sync::Notify::new(),
            live: crate::admin::Tally::new(config),
        })
    }

    /// Sets the level gauges of the keys seen lately (at each scrape of `/metrics`).
    pub(crate) async fn record_levels(&self) {
        for upstream in &self.upstreams {
            let keys: Vec<String> = upstream
                .keys
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .cloned()
                .collect();
            for key in keys {
                let tenant_key = key
                    .strip_prefix(upstream.name.as_str())
                    .and_then(|rest| rest.strip_prefix(':'))
                    .is_some_and(|rest| rest.starts_with(TENANT_PART));
                let limits = if tenant_key {
                    upstream.tenant_limits.clone()
                } else {
                    match &upstream.config.limits {
                        LimitsFrom::Fixed(limits) => Some(limits.clone()),
                        LimitsFrom::Headers => None,
                    }
                };
                let Some(limits) = limits else { continue };
                let Ok(limiter) = self.registry.limiter(&key, &limits) else {
                    continue;
                };
                let Ok(snapshot) = limiter.snapshot().await else {
                    continue;
                };
                for currency in Currency::ALL {
                    if let Some(level) = snapshot.least(currency) {
                        metrics::gauge!("tollgate_proxy_level", "key" => key.clone(), "currency" => currency.to_string())
                            .set(level.whole() as f64);
                    }
                }
            }
        }
    }
}

impl Upstreamed {
    /// Remembers a key for its level in `/metrics`: model keys, and configured tenants' keys
    /// (a tenant the configuration doesn't name is never shown on its own).
    pub(crate) fn saw_key(&self, key: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.contains(key) {
            return;
        }
        if keys.len() >= LEVEL_KEYS {
            keys.clear();
        }
        keys.insert(key.to_owned());
    }

    /// The keys seen lately (see [`saw_key`](Upstreamed::saw_key)), for the live view.
    pub(crate) fn seen_keys(&self) -> Vec<String> {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.iter().cloned().collect()
    }
}
