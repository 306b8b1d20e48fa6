//! What every request shares: the upstreams (each with its gate, its client and its meters),
//! the tenancy, the store, and the bounds. Reloading it is `reload.rs`; naming its keys,
//! `naming.rs`; the levels `/metrics` shows, `levels.rs`.

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
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
use tollgate::http::models::Model;
use tollgate::http::{Gate, Profile};
use tollgate::{Limits, Registry};

use crate::config::{
    Bounds, Config, Family, KeyPaths, LimitsFrom, Priority, TenantFrom, Tier, Upstream,
};
use crate::metrics::{Metrics, ProxyMetrics, UpstreamMetrics};
use crate::tenant::Tenancy;

mod levels;
mod naming;
mod reload;

use naming::store_key_in;
pub(crate) use naming::{key_of, model_entry, model_of};
pub use reload::ReloadError;
pub(crate) use reload::{Current, Lasting};

/// The client the proxy sends with.
pub(crate) type UpstreamClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Request bodies are counted against the memory for bodies in units of this many bytes.
pub(crate) const BUFFER_UNIT: usize = 1_024;

/// An upstream, ready: its gate, its client, its meters.
pub(crate) struct ReadyUpstream {
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
    pub(crate) metrics: UpstreamMetrics,
    /// Keys seen lately (models and configured tenants), for their levels in `/metrics`.
    keys: Mutex<HashSet<String>>,
    /// Calls of a pool that chose this member to wait for and are not admitted yet: on their
    /// way to its line (which the store's wait can't count) or in it (which it counts too, so
    /// a long line weighs double; the pool compares members alike, so the shorter still wins).
    pub(crate) choosing: std::sync::atomic::AtomicU64,
    /// Its record of failures, for a pool's outlier ejection.
    pub(crate) health: crate::health::Health,
}

/// Everything the requests share.
pub(crate) struct Shared {
    pub(crate) upstreams: Vec<Arc<ReadyUpstream>>,
    /// Where each path goes.
    pub(crate) routes: crate::route::Routes,
    pub(crate) max_body: usize,
    pub(crate) bounds: Bounds,
    pub(crate) tenancy: Tenancy,
    pub(crate) tenant_header: Option<HeaderName>,
    pub(crate) virtual_key_paths: KeyPaths,
    pub(crate) registry: Arc<Registry>,
    pub(crate) draining: Arc<AtomicBool>,
    pub(crate) metrics: Metrics,
    pub(crate) proxy_metrics: ProxyMetrics,
    /// The memory for request bodies, in units of [`BUFFER_UNIT`] bytes.
    pub(crate) buffered: Arc<Semaphore>,
    /// The last answer of the store to `/readyz`, and when it came.
    pub(crate) ready: Mutex<Option<(tokio::time::Instant, bool)>>,
    /// Told when the drain starts (bodies still coming are answered 503).
    pub(crate) drain_started: Arc<tokio::sync::Notify>,
    /// Each key's counts, for the live view (`admin.rs`).
    pub(crate) live: Arc<crate::tally::Tally>,
    /// The configuration it was built from: tiers, pools.
    pub(crate) config: Config,
    /// Where the next pool call starts looking among the members (so that members that can
    /// all admit at once share the calls).
    pub(crate) next_member: std::sync::atomic::AtomicUsize,
    /// What outlives a reload.
    pub(crate) lasting: Arc<Lasting>,
    /// The organisation's secrets, masked in everything a client reads.
    pub(crate) secrets: Arc<crate::relay::Secrets>,
    /// Who owns each stored object.
    pub(crate) owners: Arc<crate::owners::Owners>,
    /// What calls with inputs the proxy can't see were billed.
    pub(crate) hidden: Arc<crate::hidden::Hidden>,
    /// Which configuration this is (0: the first), in [`Lasting::history`].
    generation: usize,
    /// The keys whose levels were carried over into this configuration already.
    carried: Mutex<HashSet<String>>,
}

/// Why the proxy can't start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::config::masked(&self.0))
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

/// A text through every path of an estimator's counter: ASCII words, contractions, numbers,
/// punctuation and whitespace runs, and beyond ASCII accented and Cyrillic letters, combining
/// marks, CJK, emoji and Unicode spaces.
const WARM_TEXT: &str = "Warm up: it's 2026, they'll count 1234567 tokens/s...\n\n  \
    Café naïve Ωμέγα Привет e\u{301} 中文字符 日本語 🦀👩\u{200d}👧\u{a0}\u{3000}end";

/// Makes the estimator `name` ready before the proxy listens, so that a fresh proxy's first
/// call counts as fast as its thousandth: the gate has loaded its vocabulary (once per
/// process, the same estimator), and one count here takes every path of its counter once.
fn warm(name: &str) {
    let started = std::time::Instant::now();
    // The gate was just built with this name, so it is there; if it somehow weren't, the
    // first call would load it, as before.
    if let Ok(estimator) = tollgate::estimators::estimator_strict(name) {
        let tokens = estimator.count(WARM_TEXT);
        tracing::debug!(
            estimator = name,
            tokens,
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "estimator ready"
        );
    }
}

/// The profile with the models' own figures: a listed model's price and most output (given,
/// or its family's in the profile's table), and its aliases with the same.
fn with_models(upstream: &Upstream, profile: Profile) -> Profile {
    if upstream.models.is_empty() {
        return profile;
    }
    let mut table: Vec<Model> = profile.model_table().to_vec();
    for m in &upstream.models {
        let serves = m.model.as_deref().unwrap_or(&m.name);
        let known = profile.model(serves).cloned();
        let max_output = m
            .max_output
            .or(known.as_ref().map(|k| k.max_output))
            .unwrap_or_else(|| profile.output_without_max_tokens(None));
        let price = m.price.or_else(|| profile.price_of(serves));
        for name in std::iter::once(&m.name).chain(&m.aliases) {
            table.retain(|entry| entry.name != name.as_str());
            table.push(Model::new(name.clone(), max_output, price));
        }
    }
    profile.models(table)
}

fn key_fn(
    upstream: &Upstream,
    profile: Profile,
    naming: Arc<(Config, Config)>,
) -> impl Fn(&http::request::Parts, &Value) -> String + Send + Sync + 'static {
    let config = upstream.clone();
    move |parts, body| {
        let key = key_of(&config, &profile, model_of(config.family(), parts, body));
        store_key_in(&naming.0, &naming.1, &key)
    }
}

impl Shared {
    /// Builds every upstream's gate and client, on what lasts across reloads: the first
    /// configuration (`generation` 0), or the one a reload puts in force after the others.
    pub(crate) fn new(
        config: &Config,
        lasting: &Arc<Lasting>,
        generation: usize,
    ) -> Result<Shared, StartError> {
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        let tenancy = Tenancy::new(&config.tenants);
        let registry = Arc::clone(&lasting.registry);
        let naming = Arc::new((lasting.base.clone(), config.clone()));
        let mut upstreams = Vec::new();
        let mut secrets: crate::relay::Secrets = Vec::new();
        if let Some(secret) = &config.tenants.header_secret {
            secrets.push(secret.as_bytes().to_vec());
        }
        for u in &config.upstreams {
            let profile = with_models(u, u.library_profile().map_err(StartError)?);
            let builder = Gate::builder(profile.clone())
                .registry(Arc::clone(&registry))
                .key(key_fn(u, profile.clone(), Arc::clone(&naming)))
                .timeout(Some(u.timeout))
                .retries(u.retries)
                .estimate_margin(u.estimate_margin)
                .max_body(config.max_body);
            let mut builder = match &u.limits {
                LimitsFrom::Fixed(limits) => builder.limits(limits.clone()),
                LimitsFrom::Headers => builder.limits_from_headers(Duration::from_secs(60)),
            };
            for model in &u.models {
                let key = store_key_in(&naming.0, &naming.1, &format!("{}:{}", u.name, model.name));
                builder = match &model.limits {
                    Some(LimitsFrom::Fixed(limits)) => builder.key_limits(key, limits.clone()),
                    Some(LimitsFrom::Headers) => {
                        builder.key_limits_from_headers(key, Duration::from_secs(60))
                    }
                    None => builder,
                };
            }
            let what =
                |e: &dyn std::fmt::Display| StartError(format!("upstream `{}`: {e}", u.name));
            let gate = builder.build().map_err(|e| what(&e))?;
            warm(profile.estimator_name());
            let real_key = match &u.api_key_env {
                Some(var) if tenancy.has_virtual_keys() => {
                    let key = std::env::var(var).map_err(|_| {
                        what(&format!(
                            "the environment variable {var} (api_key_env) is not set"
                        ))
                    })?;
                    // A key too short to be one would mask half of every answer.
                    if key.len() >= 8 && !secrets.iter().any(|s| s == key.as_bytes()) {
                        secrets.push(key.as_bytes().to_vec());
                    }
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
            upstreams.push(Arc::new(ReadyUpstream {
                name: u.name.clone(),
                config: u.clone(),
                family: u.family(),
                profile,
                gate,
                client: client(u)?,
                scheme,
                authority,
                real_key,
                metrics: UpstreamMetrics::new(&u.name),
                keys: Mutex::new(HashSet::new()),
                choosing: std::sync::atomic::AtomicU64::new(0),
                health: crate::health::Health::default(),
            }));
        }
        let tenant_header = match &config.tenants.from {
            TenantFrom::Header(name) => Some(name.clone()),
            _ => None,
        };
        Ok(Shared {
            upstreams,
            routes: crate::route::Routes::new(&config.upstreams, config.other_paths),
            max_body: config.max_body,
            bounds: config.bounds.clone(),
            tenancy,
            tenant_header,
            virtual_key_paths: config.tenants.virtual_key_paths,
            registry,
            draining: Arc::clone(&lasting.draining),
            metrics: lasting.metrics.clone(),
            proxy_metrics: lasting.proxy_metrics.clone(),
            buffered: Arc::clone(&lasting.buffered),
            ready: Mutex::new(None),
            drain_started: Arc::clone(&lasting.drain_started),
            live: Arc::clone(&lasting.live),
            config: config.clone(),
            next_member: std::sync::atomic::AtomicUsize::new(0),
            lasting: Arc::clone(lasting),
            secrets: Arc::new(secrets),
            owners: Arc::clone(&lasting.owners),
            hidden: Arc::clone(&lasting.hidden),
            generation,
            carried: Mutex::new(HashSet::new()),
        })
    }

    /// The tier a tenant is in: its own, or the default tier.
    pub(crate) fn tier(&self, tenant: &str) -> Option<&Tier> {
        self.config.tenants.tier_of(tenant)
    }

    /// How a tenant waits at the organisation's keys: its tier's weight times its priority's
    /// factor; a tenant without a tier weighs 1, interactive.
    pub(crate) fn share_of(&self, tenant: &str) -> tollgate::store::Share {
        let weight = self.tier(tenant).map_or_else(
            || Priority::Interactive.factor(),
            crate::config::Tier::share_weight,
        );
        tollgate::store::Share::new(tenant, weight)
    }

    /// A tenant's own windows at each upstream: its tier's.
    pub(crate) fn tenant_limits(&self, tenant: &str) -> Option<&Limits> {
        self.tier(tenant).and_then(|tier| tier.limits.as_ref())
    }

    /// The windows of tenants the configuration doesn't name (the default tier's).
    pub(crate) fn other_tenant_limits(&self) -> Option<&Limits> {
        self.config
            .tenants
            .default_tier
            .as_ref()
            .and_then(|tier| self.config.tenants.tiers.get(tier))
            .and_then(|tier| tier.limits.as_ref())
    }

    /// Whether any tenant has windows of its own.
    pub(crate) fn tenant_windows(&self) -> bool {
        self.config
            .tenants
            .tiers
            .values()
            .any(|t| t.limits.is_some())
    }

    /// The upstream named `name`.
    pub(crate) fn upstream_named(&self, name: &str) -> Option<&Arc<ReadyUpstream>> {
        self.upstreams.iter().find(|u| u.name == name)
    }
}
