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
use tollgate::http::models::Model;
use tollgate::http::{Gate, Profile};
use tollgate::{Currency, Limits, Registry};

use crate::config::{
    Bounds, Config, Family, KeyPaths, LimitsFrom, OtherPaths, TenantFrom, Tier, Upstream,
};
pub(crate) use crate::keys::{BUDGET, TENANT_PART, family_of};
use crate::metrics::{Metrics, OTHER, ProxyMetrics, UpstreamMetrics};
use crate::route::azure_deployment;
use crate::tenant::Tenancy;

/// The client the proxy sends with.
pub(crate) type UpstreamClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The most keys per upstream whose levels `/metrics` shows.
const LEVEL_KEYS: usize = 1_024;
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
    pub(crate) routes: Vec<Upstream>,
    pub(crate) other: OtherPaths,
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

/// The most keys a configuration remembers having carried over (past it, it forgets them:
/// carrying again is harmless, only a few store operations).
const CARRIED_KEYS: usize = 10_000;

/// What outlives a reload: the store and its keys' limiters, the counts, the memory for
/// bodies, the drain, and the configuration the process started with.
pub(crate) struct Lasting {
    registry: Arc<Registry>,
    /// The tenants with labels of their own (read by the registry's label function).
    named: Arc<std::sync::RwLock<BTreeSet<String>>>,
    live: Arc<crate::tally::Tally>,
    buffered: Arc<Semaphore>,
    draining: Arc<AtomicBool>,
    drain_started: Arc<tokio::sync::Notify>,
    metrics: Metrics,
    proxy_metrics: ProxyMetrics,
    /// Who owns each stored object (`owners.rs`).
    owners: Arc<crate::owners::Owners>,
    /// What calls with inputs the proxy can't see were billed (`hidden.rs`).
    hidden: Arc<crate::hidden::Hidden>,
    /// The configuration the process started with: a key whose limits differ from what they
    /// were in it is stored as `{key}@{limits}` (a store keeps one set of limits per key).
    base: Config,
    /// Every configuration put in force since, the first one first.
    history: Mutex<Vec<Config>>,
}

impl Lasting {
    /// From the configuration the process starts with, over `store`.
    pub(crate) fn new(
        config: &Config,
        store: tollgate::store::AnyStore,
        records: Option<tollgate::store::redis::RedisStore>,
    ) -> Lasting {
        // The recorder first: the counters made below must be its.
        let metrics = Metrics::new();
        let proxy_metrics = ProxyMetrics::new();
        let named = Arc::new(std::sync::RwLock::new(
            config
                .tenants
                .named()
                .cloned()
                .collect::<BTreeSet<String>>(),
        ));
        // Tenants the configuration names keep their own label; every other (a hashed key, a
        // header's value) shares one.
        let labels = Arc::clone(&named);
        let registry = Arc::new(Registry::new(store).label_keys(move |key| {
            let named = labels.read().unwrap_or_else(PoisonError::into_inner);
            let key = key.split('@').next().unwrap_or(key);
            if let Some(tenant) = key.strip_prefix(&format!("{BUDGET}{TENANT_PART}")) {
                return if named.contains(tenant) {
                    key.to_owned()
                } else {
                    format!("{BUDGET}{TENANT_PART}{OTHER}")
                };
            }
            match key.split_once(&format!(":{TENANT_PART}")) {
                Some((_, tenant)) if named.contains(tenant) => key.to_owned(),
                Some((upstream, _)) => format!("{upstream}:{TENANT_PART}{OTHER}"),
                None => key.to_owned(),
            }
        }));
        let units = (config.bounds.max_buffered / BUFFER_UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Lasting {
            registry,
            named,
            live: Arc::new(crate::tally::Tally::new(config)),
            buffered: Arc::new(Semaphore::new(units)),
            draining: Arc::new(AtomicBool::new(false)),
            drain_started: Arc::new(tokio::sync::Notify::new()),
            metrics,
            proxy_metrics,
            hidden: Arc::default(),
            owners: Arc::new(match records {
                Some(redis) => crate::owners::Owners::Redis(redis),
                None => crate::owners::Owners::Memory(std::sync::Mutex::default()),
            }),
            base: config.clone(),
            history: Mutex::new(vec![config.clone()]),
        }
    }
}

/// The limits `config` gives the logical key `key` (an upstream's own key, a model's, a
/// tenant's at an upstream, a budget), when it gives fixed ones.
pub(crate) fn limits_of_key(config: &Config, key: &str) -> Option<Limits> {
    let spend_only = |rates: &tollgate::Rates| {
        (!rates.is_empty()).then(|| Limits::default().with_spend(rates.clone()))
    };
    if let Some(rest) = key.strip_prefix(BUDGET) {
        if let Some(tenant) = rest.strip_prefix(TENANT_PART) {
            return config
                .tenants
                .tier_of(tenant)
                .and_then(|tier| spend_only(&tier.spend));
        }
        if let Some(tier) = rest.strip_prefix("tier:") {
            return config
                .tenants
                .tiers
                .get(tier)
                .and_then(|tier| spend_only(&tier.spend_total));
        }
        let name = rest.strip_prefix("upstream:")?;
        let upstream = config.upstreams.iter().find(|u| u.name == name)?;
        return spend_only(&upstream.spend);
    }
    let (name, rest) = key.split_once(':').unwrap_or((key, ""));
    let upstream = config.upstreams.iter().find(|u| u.name == name)?;
    if let Some(tenant) = rest.strip_prefix(TENANT_PART) {
        return config
            .tenants
            .tier_of(tenant)
            .and_then(|tier| tier.limits.clone());
    }
    let own = upstream
        .models
        .iter()
        .find(|m| !rest.is_empty() && m.name == rest)
        .and_then(|m| m.limits.as_ref());
    match own.unwrap_or(&upstream.limits) {
        LimitsFrom::Fixed(limits) => Some(limits.clone()),
        LimitsFrom::Headers => None,
    }
}

/// Where the logical key `key` is stored under `config`, for a process that started with
/// `base`: the key itself, or `{key}@{limits}` when its limits differ from what they were at
/// the start.
fn store_key_in(base: &Config, config: &Config, key: &str) -> String {
    if std::ptr::eq(base, config) {
        return key.to_owned();
    }
    match (limits_of_key(base, key), limits_of_key(config, key)) {
        (Some(was), Some(now)) if was != now => format!("{key}@{now}"),
        _ => key.to_owned(),
    }
}

/// The configuration in force: every request takes the one current when it arrives, and keeps
/// it to its end; a reload swaps it whole.
pub(crate) struct Current {
    shared: std::sync::RwLock<Arc<Shared>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

/// Why a reload was refused (the configuration in force stays).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadError(pub Vec<String>);

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "reload refused, the configuration in force stays: {}",
            crate::config::masked(&self.0.join("; "))
        )
    }
}

impl std::error::Error for ReloadError {}

impl Current {
    pub(crate) fn new(shared: Shared) -> Current {
        Current {
            shared: std::sync::RwLock::new(Arc::new(shared)),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    /// The configuration in force.
    pub(crate) fn get(&self) -> Arc<Shared> {
        Arc::clone(&self.shared.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Puts `config` in force: built whole first (a configuration that can't be used is
    /// refused, and the one in force stays), then keys whose limits changed are carried over
    /// (never above what they held), then it is swapped in. Calls in flight finish on the
    /// configuration they started with. What only a restart can change (the listeners, the
    /// store, the connection bounds, the drain) is kept, with a warning. Answers how many
    /// keys were carried over.
    pub(crate) async fn reload(&self, config: Config) -> Result<usize, ReloadError> {
        let _one = self.reloading.lock().await;
        let old = self.get();
        let mut config = config;
        let was = &old.config;
        let mut kept = Vec::new();
        if config.listen != was.listen {
            kept.push("listen");
            config.listen = was.listen;
        }
        if config.admin_listen != was.admin_listen {
            kept.push("admin_listen");
            config.admin_listen = was.admin_listen;
        }
        if config.redis != was.redis {
            kept.push("redis");
            config.redis.clone_from(&was.redis);
        }
        if config.bounds != was.bounds {
            kept.push("the connection and body bounds");
            config.bounds = was.bounds.clone();
        }
        if config.drain != was.drain {
            kept.push("drain_seconds");
            config.drain = was.drain;
        }
        if !kept.is_empty() {
            tracing::warn!(kept = ?kept, "reload: these take a restart to change; kept as they were");
        }
        let generation = old.generation + 1;
        let shared = Shared::new(&config, &old.lasting, generation)
            .map_err(|e| ReloadError(vec![crate::config::masked(&e.0)]))?;
        old.lasting
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(config.clone());
        let carried = shared.carry_known().await;
        *self.shared.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(shared);
        tracing::info!(carried, "reload: the new configuration is in force");
        Ok(carried)
    }
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

/// The model a call's key is named after: a listed model (the longest name or alias that
/// `model` is, or starts a family of), else, when none are listed, the profile's known model;
/// `None`: the upstream's own key.
pub(crate) fn model_entry(upstream: &Upstream, profile: &Profile, model: &str) -> Option<String> {
    if upstream.models.is_empty() {
        return profile.model(model).map(|m| m.name.to_string());
    }
    upstream
        .models
        .iter()
        .flat_map(|m| {
            std::iter::once(m.name.as_str())
                .chain(m.aliases.iter().map(String::as_str))
                .map(move |name| (name, m))
        })
        .filter(|(name, _)| family_of(model, name))
        .max_by_key(|(name, _)| name.len())
        .map(|(_, m)| m.name.clone())
}

/// The key of a call of `model` (or of none) at `upstream`: `{upstream}:{model}` for a model
/// with a key of its own, else the upstream's own key.
pub(crate) fn key_of(upstream: &Upstream, profile: &Profile, model: Option<&str>) -> String {
    if !upstream.per_model {
        return upstream.name.clone();
    }
    match model.and_then(|m| model_entry(upstream, profile, m)) {
        Some(model) => format!("{}:{model}", upstream.name),
        None => upstream.name.clone(),
    }
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
            routes: config.upstreams.clone(),
            other: config.other_paths,
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

    /// Where the logical key `key` is stored now (see [`Lasting::base`]).
    pub(crate) fn store_key(&self, key: &str) -> String {
        store_key_in(&self.lasting.base, &self.config, key)
    }

    /// The logical keys with fixed limits this configuration knows by name: upstreams',
    /// models', named tenants' at each upstream, budgets.
    fn known_keys(&self) -> Vec<String> {
        let config = &self.config;
        let mut keys = Vec::new();
        let named: Vec<&String> = config.tenants.named().collect();
        for u in &config.upstreams {
            keys.push(u.name.clone());
            keys.extend(u.models.iter().map(|m| format!("{}:{}", u.name, m.name)));
            keys.extend(named.iter().map(|t| format!("{}:{TENANT_PART}{t}", u.name)));
            keys.push(format!("{BUDGET}upstream:{}", u.name));
        }
        keys.extend(
            config
                .tenants
                .tiers
                .keys()
                .map(|t| format!("{BUDGET}tier:{t}")),
        );
        keys.extend(named.iter().map(|t| format!("{BUDGET}{TENANT_PART}{t}")));
        keys.sort();
        keys.dedup();
        keys
    }

    /// After a reload: every key the configuration names whose limits changed starts from its
    /// new limits, never above what it held; the tenants' labels follow the new names.
    /// Answers how many keys were carried over.
    pub(crate) async fn carry_known(&self) -> usize {
        let mut carried = 0;
        for key in self.known_keys() {
            if self.carry(&key).await {
                carried += 1;
            }
        }
        *self
            .lasting
            .named
            .write()
            .unwrap_or_else(PoisonError::into_inner) =
            self.config.tenants.named().cloned().collect();
        self.live
            .rename(self.config.tenants.named().cloned().collect());
        carried
    }

    /// Carries the levels of the logical key `key` over to this configuration, once: through
    /// every configuration since the first, each store key the key had starts from its limits
    /// there, never above what the one before held (per currency, the least its windows held),
    /// unless that one was full (it spent nothing to refill), so that no reload can refill
    /// anybody's windows (a key whose limits went back to the
    /// first configuration's is stored as it was, and starts from what the last one held).
    /// Answers whether anything was carried.
    pub(crate) async fn carry(&self, key: &str) -> bool {
        if self.generation == 0 {
            return false;
        }
        {
            let mut carried = self.carried.lock().unwrap_or_else(PoisonError::into_inner);
            if carried.len() >= CARRIED_KEYS {
                carried.clear();
            }
            if !carried.insert(key.to_owned()) {
                return false;
            }
        }
        let history: Vec<Config> = {
            let history = self
                .lasting
                .history
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            history[..=self.generation.min(history.len() - 1)].to_vec()
        };
        // The store keys the key had, in order, each with its limits.
        let mut chain: Vec<(String, Limits)> = Vec::new();
        for config in &history {
            let Some(limits) = limits_of_key(config, key) else {
                continue;
            };
            let stored = store_key_in(&self.lasting.base, config, key);
            if chain.last().is_none_or(|(last, _)| *last != stored) {
                chain.push((stored, limits));
            }
        }
        let mut moved = false;
        for pair in chain.windows(2) {
            let [(from, was), (to, now)] = pair else {
                continue;
            };
            let (Ok(before), Ok(after)) = (
                self.registry.limiter(from, was),
                self.registry.limiter(to, now),
            ) else {
                continue;
            };
            let Ok(held) = before.snapshot().await else {
                tracing::warn!(%key, "reload: the store did not answer; the key starts full");
                continue;
            };
            // A key full at its old limits spent nothing there (or never existed: a tenant
            // named first by this configuration): it starts full at its new ones, as it
            // would after a long enough rest. Only what was spent is carried.
            let full = held
                .windows()
                .iter()
                .all(|w| w.tokens.whole() >= i128::from(w.rate.burst()));
            if full {
                moved = true;
                continue;
            }
            let mut debt = tollgate::PerCurrency::default();
            for currency in Currency::ALL {
                if let (Some(level), false) = (held.least(currency), now.of(currency).is_empty()) {
                    let left = u64::try_from(level.whole().max(0)).unwrap_or(0);
                    if after.lower(currency, left).await.is_err() {
                        tracing::warn!(%key, "reload: could not carry a key's levels over");
                    }
                    // A debt goes with the key: a changed limit forgives nothing.
                    debt[currency] = i64::try_from(level.whole().min(0)).unwrap_or(i64::MIN);
                }
            }
            if debt.values().iter().any(|d| *d < 0) && after.adjust(debt).await.is_err() {
                tracing::warn!(%key, "reload: could not carry a key's debt over");
            }
            moved = true;
        }
        moved
    }

    /// The tier a tenant is in: its own, or the default tier.
    pub(crate) fn tier(&self, tenant: &str) -> Option<&Tier> {
        self.config.tenants.tier_of(tenant)
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
                let stored = self.store_key(&key);
                let limiter = if tenant_key {
                    let tenant = key.rsplit(TENANT_PART).next().unwrap_or_default();
                    self.tenant_limits(tenant)
                        .and_then(|limits| self.registry.limiter(&stored, limits).ok())
                } else {
                    upstream.gate.limiter_of(&stored).or_else(|| {
                        upstream
                            .gate
                            .configured_limits(&stored)
                            .and_then(|limits| self.registry.limiter(&stored, limits).ok())
                    })
                };
                let Some(limiter) = limiter else { continue };
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

impl ReadyUpstream {
    /// Remembers a key for its level in `/metrics`: model keys, and configured tenants' keys
    /// (a tenant the configuration doesn't name is never shown on its own). Kept by its
    /// logical name (without the `@limits` of a key whose limits changed at a reload).
    pub(crate) fn saw_key(&self, key: &str) {
        let key = key.split('@').next().unwrap_or(key);
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.contains(key) {
            return;
        }
        if keys.len() >= LEVEL_KEYS {
            keys.clear();
        }
        keys.insert(key.to_owned());
    }

    /// The keys seen lately (see [`saw_key`](ReadyUpstream::saw_key)), for the live view.
    pub(crate) fn seen_keys(&self) -> Vec<String> {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.iter().cloned().collect()
    }
}
