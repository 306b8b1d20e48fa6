//! What the proxy serves: its address, its store, its upstreams with their profiles, models and
//! limits, its tenants, and the bounds on what a client or an upstream may hold. Read from a
//! TOML file (`--config proxy.toml`) or made from flags.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use tollgate::http::Profile;
use tollgate::http::models::Price;
use tollgate::{Limits, Rates};

pub use crate::health::Ejection;

/// A configuration that can't be used, with every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub Vec<String>);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "configuration: {}", masked(&self.0.join("; ")))
    }
}

/// `text` with the credentials of every URL in it masked: what stands between `://` and `@`
/// (`https://user:secret@host` is shown as `https://***@host`, `redis://:pw@host` as
/// `redis://***@host`). Every error and log line that may quote a URL goes through it.
pub fn masked(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // The URL ends at a space, a quote or a backtick. Its credentials end at its last `@`:
        // a password pasted with an unescaped `/`, `?` or `#` in it is masked whole (read as
        // ending at the first of them, its rest had been printed), at the price of masking a
        // path that holds an `@`.
        let end = after
            .find(|c: char| matches!(c, '`' | '"' | '\'' | '<' | '>') || c.is_whitespace())
            .unwrap_or(after.len());
        let url = &after[..end];
        match url.rfind('@') {
            Some(userinfo) => {
                out.push_str("***");
                out.push_str(&url[userinfo..]);
            }
            None => out.push_str(url),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

impl std::error::Error for ConfigError {}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the proxy listens (default `127.0.0.1:8787`).
    pub listen: SocketAddr,
    /// Where the operators' live view listens (`GET /admin/`, `GET /admin/api/keys`), apart
    /// from the clients' listener (default: nowhere, disabled).
    pub admin_listen: Option<SocketAddr>,
    /// The `Host`s the live view answers besides its own address (and, bound to loopback,
    /// `localhost` and `127.0.0.1` at its port): `host` or `host:port`. Any other `Host` is
    /// refused, so a page in an operator's browser can't read the view through DNS rebinding.
    pub admin_hosts: Vec<String>,
    /// The token `/metrics` on the clients' listener asks for (`Authorization: Bearer TOKEN`),
    /// read from the environment variable `metrics_token_env` names. Without one, `/metrics`
    /// is served only on `admin_listen`.
    pub metrics_token: Option<String>,
    /// A Redis URL: every proxy on it shares every key (default: in memory, this process).
    pub redis: Option<String>,
    /// The largest request body accepted, as sent and as decoded from its `content-encoding`;
    /// larger ones get 413 before anything is charged (default 32 MiB).
    pub max_body: usize,
    /// How long calls in flight may run on after SIGTERM (default 30 s).
    pub drain: Duration,
    /// Paths no upstream meters: refused with 404 and a hint (the default), or passed through
    /// unmetered.
    pub other_paths: OtherPaths,
    /// What a client may hold, and for how long.
    pub bounds: Bounds,
    /// Where tenants come from, and their tiers.
    pub tenants: Tenants,
    /// The upstreams, in the order they are tried for a path.
    pub upstreams: Vec<Upstream>,
    /// Deployment pools: models served by several upstreams, each call sent to the member
    /// that can admit it soonest.
    pub pools: Vec<Pool>,
}

/// A tier: the windows and budgets of each tenant in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    /// Its name (`team`, `batch`).
    pub name: String,
    /// Each tenant's windows at each upstream (requests, tokens, output tokens); `None`: none.
    pub limits: Option<Limits>,
    /// Each tenant's budget, across every upstream (`"$50/d"`); empty: none.
    pub spend: Rates,
    /// One budget every tenant of the tier shares, across every upstream; empty: none.
    pub spend_total: Rates,
}

/// A model served by several upstreams (deployments, keys, regions), each with its own
/// windows and its own key: each call goes to the member that can admit it soonest, and a
/// 429 or 5xx before the answer's first byte moves it to another member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Its name (a metrics label).
    pub name: String,
    /// The model names it serves (a family's prefix, like the upstreams' `models`); empty:
    /// every call routed to one of its members.
    pub models: Vec<String>,
    /// The upstreams that serve it, by name. They speak the same API (one profile).
    pub members: Vec<String>,
    /// When a member that keeps failing is passed over, and for how long.
    pub ejection: Ejection,
    /// How long one attempt at a member may wait for its answer's first byte before the call
    /// moves to another member (`None`: the call's time left, shared by the members it has not
    /// tried yet; the last one gets all of it).
    pub attempt_timeout: Option<Duration>,
}

/// One model an upstream lists.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Its name, or the prefix of a family of names (`gpt-4o` also holds
    /// `gpt-4o-2024-08-06`).
    pub name: String,
    /// Its own limits (`None`: the upstream's).
    pub limits: Option<LimitsFrom>,
    /// Other names counted as this model (`gpt-4o` for `gpt-4o-2024-08-06`).
    pub aliases: Vec<String>,
    /// The most output a call may write (what a call without `max_tokens` reserves); `None`:
    /// the profile's figure.
    pub max_output: Option<u64>,
    /// Its price per million tokens; `None`: the profile's figure (of the model it serves,
    /// when `model` names one).
    pub price: Option<Price>,
    /// The model it serves, when its name is not a model's: an Azure deployment
    /// (`prod-4o` serving `gpt-4o`) is priced, and its most output read, as that model.
    pub model: Option<String>,
}

/// What a client may hold, and for how long. Every limit has a default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    /// Connections open at once (default 4,096). Past it, the connection idle the longest is
    /// closed to make room; when none is idle, the new one gets 503 and is closed. Never more
    /// than the process's descriptor limit allows (raised to its hard limit at start).
    pub max_connections: usize,
    /// Request body bytes held in memory across all requests at once (default 256 MiB): a
    /// body that would pass it gets 503.
    pub max_buffered: usize,
    /// The longest a client may take to send a request's head (default 30 s).
    pub header_timeout: Duration,
    /// The longest a connection may stay open with no request in flight and nothing sent:
    /// a new one that sends nothing, a kept-alive one between requests, an HTTP/2 one with no
    /// streams (default 60 s).
    pub idle_timeout: Duration,
    /// The longest a request's body may take, whatever its rate (default 60 s).
    pub body_timeout: Duration,
    /// The slowest a body may come, after its first 5 s (default 1,024 bytes a second): a
    /// body that falls behind is answered 408.
    pub body_min_rate: u64,
    /// The longest a client may leave an answer unread (default 60 s): its connection, or an
    /// HTTP/2 stream whose window stays shut, is cut, and the upstream call with it (it stays
    /// charged).
    pub write_timeout: Duration,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            max_connections: 4_096,
            max_buffered: 256 << 20,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            body_min_rate: 1_024,
            write_timeout: Duration::from_secs(60),
        }
    }
}

/// What happens to a path that no upstream meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OtherPaths {
    /// Sent on to the first upstream whose mount matches, unmetered (and never with a
    /// virtual key's stand-in, which reaches only the metered routes unless its tenant is
    /// allowed more).
    Pass,
    /// Answered 404 in the provider's shape, naming the likely mistake.
    Refuse,
}

/// How a call's tenant is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantFrom {
    /// Every call is one tenant's: no tenant windows.
    None,
    /// The API key the client sent (`Authorization: Bearer`, `x-api-key`, `api-key`,
    /// `x-goog-api-key`), hashed: the key itself is never logged, shown in metrics, or kept.
    Key,
    /// A request header's value (a name like `team-a`; anything else is hashed), set by a
    /// trusted proxy in front: trusted only with the shared secret, or on a trusted network.
    Header(http::HeaderName),
}

/// Tenants inside the organization's quota.
#[derive(Debug, Clone)]
pub struct Tenants {
    /// How a call's tenant is found.
    pub from: TenantFrom,
    /// The tiers, by name. The windows written in `[tenants]` itself (`requests`, `tokens`,
    /// `output_tokens`, `spend`) are the tier `default`.
    pub tiers: BTreeMap<String, Tier>,
    /// The tier of a tenant no virtual key or `[tenants.tier_of]` places (default: `default`,
    /// when there is such a tier; else such tenants have no windows of their own).
    pub default_tier: Option<String>,
    /// Each named tenant's tier (from `[tenants.tier_of]` and the virtual keys').
    pub tier_of: BTreeMap<String, String>,
    /// Virtual keys: the key a client presents → its tenant's name. When any are given, only
    /// these keys are accepted, and the upstream's own key (`api_key_env`) replaces them.
    pub virtual_keys: BTreeMap<String, String>,
    /// The tenant of a call that names none; without one, such a call is refused (401).
    pub default: Option<String>,
    /// With header tenants: the shared secret (read from the environment variable named in
    /// `header_secret_env`) that the proxy in front sends in `tollgate-tenant-secret`. A call
    /// without it is refused.
    pub header_secret: Option<String>,
    /// With header tenants and no secret: the network is trusted (anyone who can reach the
    /// proxy may name any tenant). Must be said explicitly.
    pub trusted_network: bool,
    /// What virtual keys may reach: the metered routes (and the free ones that spend nothing,
    /// such as `count_tokens`) by default, or every route.
    pub virtual_key_paths: KeyPaths,
}

/// What a virtual key may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyPaths {
    /// The metered routes, and the free routes that spend nothing.
    Metered,
    /// Every route, including paths passed through unmetered (`other_paths = "pass"`).
    Any,
}

/// Where an upstream's keys get their limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitsFrom {
    /// These, for every key (model or deployment) of the upstream.
    Fixed(Limits),
    /// From the responses' `limit` headers, read per minute.
    Headers,
}

/// What happens to a call for a model the upstream does not list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownModels {
    /// It shares the upstream's own key (one set of windows for every unlisted model).
    Shared,
    /// It is refused with 400.
    Refuse,
}

/// One upstream API.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Its name: the first part of its keys (`openai:gpt-4o`) and a metrics label.
    pub name: String,
    /// Its base URL (`https://api.openai.com`, `http://127.0.0.1:8000`): the client's path is
    /// appended to it (less `strip`).
    pub url: http::Uri,
    /// The profile's name (`openai`, `azure-openai`, `anthropic`, `voyage`, `gemini`, `groq`,
    /// `mistral`, `generic`).
    pub profile: String,
    /// The estimator for `generic` (default `openai`).
    pub estimator: Option<String>,
    /// The limits.
    pub limits: LimitsFrom,
    /// Only paths under this prefix go here; it is taken off before forwarding (default none).
    pub mount: String,
    /// A prefix taken off the client's path before it is appended to `url` (Gemini's
    /// OpenAI-compatible endpoint has no `/v1`).
    pub strip: String,
    /// One key per model, or one for the whole upstream. The models with keys of their own
    /// are those listed in `models`, else the profile's known models (gpt-4o, claude-sonnet-4
    /// ...; a dated name shares its family's key); any other name shares the upstream's key
    /// (or is refused: `unknown_models`). Clients choose model names: they can never make
    /// keys of their own.
    pub per_model: bool,
    /// The models with keys of their own (names, or prefixes of families of names), each
    /// with its own limits, aliases, most output and price where given.
    pub models: Vec<ModelConfig>,
    /// A budget of the whole upstream, across its models (`"$500/d"`); empty: none.
    pub spend: Rates,
    /// What happens to a model not listed (default: it shares the upstream's key).
    pub unknown_models: UnknownModels,
    /// What a call that names no `max_tokens` reserves for a model the profile doesn't know
    /// (default: the profile's, 4,096).
    pub default_max_tokens: Option<u64>,
    /// The longest a call may take to get an answer's head: its wait for its toll, retries
    /// included, and the upstream's first byte (default 120 s). Past it: 429 while waiting,
    /// 504 while the upstream is silent.
    pub timeout: Duration,
    /// The longest a connection to the upstream may take (default 10 s).
    pub connect_timeout: Duration,
    /// The longest an answer's body may go without a byte (default 300 s): a stream that
    /// stalls longer is cut.
    pub chunk_timeout: Duration,
    /// How many times a transient 429 from the upstream is retried here before it is handed
    /// to the client (default 3).
    pub retries: u32,
    /// What is added to each request's estimated input before it is charged, given back when
    /// the answer reports its usage (`estimate_margin = "3%"`, the default): the upstream's own
    /// count strays from the estimate, and calls in flight carry that error unseen.
    pub estimate_margin: tollgate::Margin,
    /// HTTP/2 without TLS (h2c, prior knowledge), for upstreams such as vLLM behind an h2
    /// load balancer. Over `https` HTTP/2 is negotiated (ALPN) without this.
    pub http2_only: bool,
    /// The environment variable holding the upstream's real API key, sent in place of a
    /// virtual key.
    pub api_key_env: Option<String>,
    /// With virtual keys: a tenant's `OpenAI-Organization` and `OpenAI-Project` headers go up
    /// beside the real key (default false: they are dropped, so a tenant can't choose the
    /// organisation or project billed).
    pub tenant_org_headers: bool,
}

impl Upstream {
    /// The library's profile for this upstream.
    pub fn library_profile(&self) -> Result<Profile, String> {
        let profile = match self.profile.as_str() {
            "openai" => Profile::openai(),
            "azure-openai" | "azure" => Profile::azure_openai(),
            "anthropic" => Profile::anthropic(),
            "voyage" | "voyageai" => Profile::voyage(),
            "gemini" => Profile::gemini(),
            "groq" => Profile::groq(),
            "mistral" => Profile::mistral(),
            "generic" => Profile::generic(self.name.clone()),
            other => {
                return Err(format!(
                    "upstream `{}`: unknown profile `{other}`; expected openai, azure-openai, anthropic, voyage, gemini, groq, mistral or generic",
                    self.name
                ));
            }
        };
        let profile = match &self.estimator {
            Some(name) => profile.estimator(name.clone()),
            None => profile,
        };
        Ok(match self.default_max_tokens {
            Some(tokens) => profile.default_output(tokens),
            None => profile,
        })
    }

    /// Which kind of API the profile speaks, for its routes and its error shapes.
    pub fn family(&self) -> Family {
        match self.profile.as_str() {
            "anthropic" => Family::Anthropic,
            "azure-openai" | "azure" => Family::Azure,
            "voyage" | "voyageai" => Family::Voyage,
            _ => Family::OpenAi,
        }
    }
}

/// The kind of API an upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// OpenAI's paths and error bodies (OpenAI, Groq, Mistral, Gemini's endpoint, generic
    /// hosts).
    OpenAi,
    /// Azure OpenAI's deployment paths, OpenAI's error bodies.
    Azure,
    /// Anthropic's messages API and error bodies.
    Anthropic,
    /// Voyage AI's embeddings and reranking, OpenAI-style errors.
    Voyage,
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
const DEFAULT_MAX_BODY: usize = 32 << 20;
const DEFAULT_DRAIN: Duration = Duration::from_secs(30);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
const DEFAULT_CONNECT: Duration = Duration::from_secs(10);
const DEFAULT_CHUNK: Duration = Duration::from_secs(300);
/// The environment variable a header tenant's shared secret is read from by default.
pub const SECRET_HEADER: &str = "tollgate-tenant-secret";

/// The file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    admin_listen: Option<String>,
    #[serde(default)]
    admin_hosts: Vec<String>,
    metrics_token_env: Option<String>,
    redis: Option<String>,
    max_body_bytes: Option<usize>,
    drain_seconds: Option<f64>,
    other_paths: Option<OtherPaths>,
    max_connections: Option<usize>,
    max_buffered_bytes: Option<usize>,
    header_timeout_seconds: Option<f64>,
    idle_timeout_seconds: Option<f64>,
    body_timeout_seconds: Option<f64>,
    body_min_bytes_per_second: Option<u64>,
    write_timeout_seconds: Option<f64>,
    tenants: Option<TenantsFile>,
    #[serde(default)]
    tiers: BTreeMap<String, TierFile>,
    #[serde(default, rename = "upstream")]
    upstreams: Vec<UpstreamFile>,
    #[serde(default, rename = "pool")]
    pools: Vec<PoolFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TierFile {
    requests: Option<String>,
    tokens: Option<String>,
    output_tokens: Option<String>,
    spend: Option<String>,
    spend_total: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    name: String,
    #[serde(default)]
    models: Vec<String>,
    members: Vec<String>,
    eject_after: Option<u32>,
    eject_seconds: Option<f64>,
    eject_max_seconds: Option<f64>,
    attempt_timeout_seconds: Option<f64>,
}

/// A virtual key's tenant: its name, or its name and tier.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum VirtualKeyFile {
    Tenant(String),
    WithTier {
        tenant: String,
        tier: Option<String>,
    },
}

/// An upstream's models: names only, or a table of each model's settings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ModelsFile {
    Names(Vec<String>),
    Table(BTreeMap<String, ModelFile>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    limits: Option<String>,
    requests: Option<String>,
    tokens: Option<String>,
    output_tokens: Option<String>,
    #[serde(default)]
    aliases: Vec<String>,
    max_output: Option<u64>,
    price: Option<PriceFile>,
    model: Option<String>,
}

/// Dollars per million tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    input: f64,
    cached_input: Option<f64>,
    output: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    from: Option<String>,
    requests: Option<String>,
    tokens: Option<String>,
    output_tokens: Option<String>,
    spend: Option<String>,
    #[serde(default)]
    virtual_keys: BTreeMap<String, VirtualKeyFile>,
    default: Option<String>,
    default_tier: Option<String>,
    #[serde(default)]
    tier_of: BTreeMap<String, String>,
    header_secret_env: Option<String>,
    trusted_network: Option<bool>,
    virtual_key_paths: Option<KeyPaths>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamFile {
    name: Option<String>,
    url: String,
    profile: Option<String>,
    estimator: Option<String>,
    limits: Option<String>,
    requests: Option<String>,
    tokens: Option<String>,
    output_tokens: Option<String>,
    mount: Option<String>,
    strip: Option<String>,
    per_model: Option<bool>,
    models: Option<ModelsFile>,
    spend: Option<String>,
    unknown_models: Option<UnknownModels>,
    default_max_tokens: Option<u64>,
    timeout_seconds: Option<f64>,
    connect_timeout_seconds: Option<f64>,
    chunk_timeout_seconds: Option<f64>,
    retries: Option<u32>,
    estimate_margin: Option<String>,
    http2_only: Option<bool>,
    api_key_env: Option<String>,
    tenant_org_headers: Option<bool>,
}

/// A percentage from 0% to 100% (`"3%"`, `"0.5%"`), or `None`.
fn percent(text: &str) -> Option<tollgate::Margin> {
    text.trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<f64>().ok())
        .filter(|p| (0.0..=100.0).contains(p))
        .map(tollgate::Margin::percent)
}

/// Limits from three optional rate strings; none at all is `None`.
pub fn limits_from(
    requests: Option<&str>,
    tokens: Option<&str>,
    output_tokens: Option<&str>,
) -> Result<Option<Limits>, String> {
    if requests.is_none() && tokens.is_none() && output_tokens.is_none() {
        return Ok(None);
    }
    let mut limits =
        Limits::parse(requests.unwrap_or(""), tokens.unwrap_or("")).map_err(|e| e.to_string())?;
    if let Some(output) = output_tokens {
        let rates: Rates = output
            .parse()
            .map_err(|e: tollgate::RateError| e.to_string())?;
        limits = limits.with_output_tokens(rates);
    }
    if limits.is_empty() {
        return Err("no window at all".to_owned());
    }
    Ok(Some(limits))
}

fn seconds(value: f64, what: &str, problems: &mut Vec<String>) -> Duration {
    if value.is_finite() && (0.0..=86_400.0 * 365.0).contains(&value) {
        Duration::from_secs_f64(value)
    } else {
        problems.push(format!(
            "{what}: {value} is not a number of seconds from 0 to a year"
        ));
        Duration::ZERO
    }
}

/// A timeout of at least a millisecond (0 would close everything at once).
fn timeout(
    value: Option<f64>,
    default: Duration,
    what: &str,
    problems: &mut Vec<String>,
) -> Duration {
    match value {
        None => default,
        Some(v) if v > 0.0 => seconds(v, what, problems),
        Some(v) => {
            problems.push(format!("{what}: {v}; a timeout must be above 0"));
            default
        }
    }
}

/// Checks that a base URL has a scheme the proxy speaks and a host.
pub fn upstream_url(text: &str) -> Result<http::Uri, String> {
    let url: http::Uri = text
        .parse()
        .map_err(|e| format!("url `{text}` can't be read: {e}"))?;
    match url.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("url `{text}`: the scheme must be http or https")),
    }
    if url.host().is_none_or(str::is_empty) {
        return Err(format!("url `{text}` has no host"));
    }
    if url.query().is_some() {
        return Err(format!("url `{text}`: a base URL takes no query"));
    }
    Ok(url)
}

fn prefix(text: Option<String>, what: &str, problems: &mut Vec<String>) -> String {
    let text = text.unwrap_or_default();
    let text = text.trim_end_matches('/').to_owned();
    if !text.is_empty() && !text.starts_with('/') {
        problems.push(format!("{what} `{text}` must start with `/`"));
    }
    text
}

/// A name shown in metrics and logs as it is: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub(crate) fn plain_name(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Config {
    /// The configuration in a TOML text; every problem is reported at once.
    ///
    /// ```
    /// let config = tollgate_proxy::Config::from_toml(r#"
    ///     listen = "127.0.0.1:9000"
    ///     [[upstream]]
    ///     name = "openai"
    ///     url = "https://api.openai.com"
    ///     profile = "openai"
    ///     requests = "500/m"
    ///     tokens = "200000/m"
    /// "#)?;
    /// assert_eq!(config.listen.port(), 9000);
    /// assert_eq!(config.upstreams[0].name, "openai");
    /// # Ok::<(), tollgate_proxy::ConfigError>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let file: File =
            toml::from_str(text).map_err(|e| ConfigError(vec![masked(&e.to_string())]))?;
        let mut problems = Vec::new();
        let listen = file
            .listen
            .as_deref()
            .unwrap_or(DEFAULT_LISTEN)
            .parse()
            .unwrap_or_else(|e| {
                problems.push(format!("listen: {e}"));
                DEFAULT_LISTEN.parse().expect("a valid default")
            });
        let admin_listen = file.admin_listen.as_deref().and_then(|text| {
            text.parse()
                .map_err(|e| problems.push(format!("admin_listen: `{text}`: {e}")))
                .ok()
        });
        let metrics_token =
            file.metrics_token_env
                .as_deref()
                .and_then(|var| match std::env::var(var) {
                    Ok(token) if token.len() >= 16 => Some(token),
                    Ok(_) => {
                        problems.push(format!(
                            "metrics_token_env: the token in {var} must be at least 16 characters"
                        ));
                        None
                    }
                    Err(_) => {
                        problems.push(format!(
                            "metrics_token_env: the environment variable {var} is not set"
                        ));
                        None
                    }
                });
        for host in &file.admin_hosts {
            if host.is_empty() || host.contains(['/', ' ', '@']) {
                problems.push(format!(
                    "admin_hosts: `{}` is not a host or host:port",
                    host.escape_debug()
                ));
            }
        }
        let drain = file.drain_seconds.map_or(DEFAULT_DRAIN, |s| {
            seconds(s, "drain_seconds", &mut problems)
        });
        let defaults = Bounds::default();
        let bounds = Bounds {
            max_connections: match file.max_connections {
                Some(0) => {
                    problems.push("max_connections: 0 admits no client".to_owned());
                    defaults.max_connections
                }
                Some(n) => n,
                None => defaults.max_connections,
            },
            max_buffered: file.max_buffered_bytes.unwrap_or(defaults.max_buffered),
            header_timeout: timeout(
                file.header_timeout_seconds,
                defaults.header_timeout,
                "header_timeout_seconds",
                &mut problems,
            ),
            idle_timeout: timeout(
                file.idle_timeout_seconds,
                defaults.idle_timeout,
                "idle_timeout_seconds",
                &mut problems,
            ),
            body_timeout: timeout(
                file.body_timeout_seconds,
                defaults.body_timeout,
                "body_timeout_seconds",
                &mut problems,
            ),
            body_min_rate: file
                .body_min_bytes_per_second
                .unwrap_or(defaults.body_min_rate),
            write_timeout: timeout(
                file.write_timeout_seconds,
                defaults.write_timeout,
                "write_timeout_seconds",
                &mut problems,
            ),
        };
        let tenants = tenants(file.tenants, file.tiers, &mut problems);
        let mut upstreams = Vec::new();
        for (i, u) in file.upstreams.into_iter().enumerate() {
            upstreams.push(upstream(i, u, &mut problems));
        }
        let mut names: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            problems.push("two upstreams have the same name".to_owned());
        }
        if upstreams.is_empty() {
            upstreams = Config::public_upstreams();
        }
        let pools = pools(file.pools, &upstreams, &mut problems);
        if !tenants.virtual_keys.is_empty() {
            for u in &upstreams {
                if u.api_key_env.is_none() {
                    problems.push(format!(
                        "upstream `{}`: virtual keys are configured: give the upstream its real key with api_key_env",
                        u.name
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(ConfigError(problems.iter().map(|p| masked(p)).collect()));
        }
        Ok(Config {
            listen,
            admin_listen,
            admin_hosts: file.admin_hosts,
            metrics_token,
            redis: file.redis,
            max_body: file.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY),
            drain,
            other_paths: file.other_paths.unwrap_or(OtherPaths::Refuse),
            bounds,
            tenants,
            upstreams,
            pools,
        })
    }

    /// The configuration in a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(vec![format!("{}: {e}", path.display())]))?;
        Config::from_toml(&text)
    }

    /// What an operator should know of this configuration before it serves: paths that
    /// spend at the provider and go out unmetered with the organisation's key (`other_paths =
    /// "pass"` with `virtual_key_paths = "any"`: images, audio, batches, fine-tuning, ...).
    /// Logged as warnings at start and at each reload.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.other_paths == OtherPaths::Pass
            && !self.tenants.virtual_keys.is_empty()
            && self.tenants.virtual_key_paths == KeyPaths::Any
        {
            let upstreams: Vec<&str> = self
                .upstreams
                .iter()
                .filter(|u| u.api_key_env.is_some())
                .map(|u| u.name.as_str())
                .collect();
            out.push(format!(
                "other_paths = \"pass\" with virtual_key_paths = \"any\": paths the proxy doesn't meter (images, audio, batches, fine-tuning, realtime, ...) go out unmetered with the organisation's key (upstreams {}); every tenant with a virtual key can spend on them outside its windows and budgets",
                upstreams.join(", ")
            ));
        } else if self.other_paths == OtherPaths::Pass
            && self.tenants.virtual_keys.is_empty()
            && self.upstreams.iter().any(|u| u.api_key_env.is_some())
        {
            out.push(
                "other_paths = \"pass\": paths the proxy doesn't meter (images, audio, batches, fine-tuning, ...) go out unmetered, outside every window and budget".to_owned(),
            );
        }
        out
    }

    /// The pool `upstream` is a member of, for a call of `model`.
    pub fn pool_of(&self, upstream: &str, model: Option<&str>) -> Option<&Pool> {
        self.pools.iter().find(|pool| {
            pool.members.iter().any(|m| m == upstream)
                && (pool.models.is_empty()
                    || model.is_some_and(|model| {
                        pool.models
                            .iter()
                            .any(|name| crate::keys::family_of(model, name))
                    }))
        })
    }

    /// The configuration with no file and no flags: 127.0.0.1:8787, OpenAI's and
    /// Anthropic's public APIs with limits learned from their headers.
    pub fn public() -> Config {
        Config {
            listen: DEFAULT_LISTEN.parse().expect("a valid default"),
            admin_listen: None,
            admin_hosts: Vec::new(),
            metrics_token: None,
            redis: None,
            max_body: DEFAULT_MAX_BODY,
            drain: DEFAULT_DRAIN,
            other_paths: OtherPaths::Refuse,
            bounds: Bounds::default(),
            tenants: Tenants::none(),
            upstreams: Config::public_upstreams(),
            pools: Vec::new(),
        }
    }

    fn public_upstreams() -> Vec<Upstream> {
        vec![
            Upstream::new(
                "openai",
                http::Uri::from_static("https://api.openai.com"),
                "openai",
                LimitsFrom::Headers,
            ),
            Upstream::new(
                "anthropic",
                http::Uri::from_static("https://api.anthropic.com"),
                "anthropic",
                LimitsFrom::Headers,
            ),
        ]
    }

    /// One upstream from flags: `url` (default: the profile's public API), `profile`, limits.
    pub fn single(
        url: Option<&str>,
        profile: &str,
        limits: Option<Limits>,
    ) -> Result<Config, ConfigError> {
        // An unknown profile is named as such, whether or not a URL was given.
        Upstream::new(
            profile,
            http::Uri::from_static("http://invalid"),
            profile,
            LimitsFrom::Headers,
        )
        .library_profile()
        .map_err(|e| ConfigError(vec![e]))?;
        let url = match url {
            Some(url) => upstream_url(url).map_err(|e| ConfigError(vec![e]))?,
            None => http::Uri::from_static(match profile {
                "anthropic" => "https://api.anthropic.com",
                "voyage" | "voyageai" => "https://api.voyageai.com",
                "groq" => "https://api.groq.com/openai",
                "mistral" => "https://api.mistral.ai",
                "gemini" => "https://generativelanguage.googleapis.com/v1beta/openai",
                "openai" => "https://api.openai.com",
                other => {
                    return Err(ConfigError(vec![format!(
                        "profile `{other}` has no public API to default to: give --upstream URL"
                    )]));
                }
            }),
        };
        let limits = limits.map_or(LimitsFrom::Headers, LimitsFrom::Fixed);
        let mut upstream = Upstream::new(profile, url, profile, limits);
        if profile == "gemini" {
            upstream.strip = "/v1".to_owned();
        }
        upstream
            .library_profile()
            .map_err(|e| ConfigError(vec![e]))?;
        Ok(Config {
            upstreams: vec![upstream],
            ..Config::public()
        })
    }
}

/// A budget written in dollars, or none.
fn budget(text: Option<&str>, what: &str, problems: &mut Vec<String>) -> Rates {
    match text.map(Rates::parse_money) {
        None => Rates::none(),
        Some(Ok(rates)) => rates,
        Some(Err(e)) => {
            problems.push(format!("{what}: {e}"));
            Rates::none()
        }
    }
}

fn tier(name: &str, t: TierFile, problems: &mut Vec<String>) -> Tier {
    let what = format!("tiers.{name}");
    if !plain_name(name) {
        problems.push(format!(
            "{what}: a tier's name must be 1 to 64 of A-Z a-z 0-9 . _ -"
        ));
    }
    let limits = limits_from(
        t.requests.as_deref(),
        t.tokens.as_deref(),
        t.output_tokens.as_deref(),
    )
    .unwrap_or_else(|e| {
        problems.push(format!("{what}: {e}"));
        None
    });
    Tier {
        name: name.to_owned(),
        limits,
        spend: budget(t.spend.as_deref(), &format!("{what}.spend"), problems),
        spend_total: budget(
            t.spend_total.as_deref(),
            &format!("{what}.spend_total"),
            problems,
        ),
    }
}

fn tenants(
    t: Option<TenantsFile>,
    tier_files: BTreeMap<String, TierFile>,
    problems: &mut Vec<String>,
) -> Tenants {
    let mut tiers: BTreeMap<String, Tier> = tier_files
        .into_iter()
        .map(|(name, t)| (name.clone(), tier(&name, t, problems)))
        .collect();
    let Some(t) = t else {
        if !tiers.is_empty() {
            problems.push(
                "tiers are configured but no [tenants] says where tenants come from".to_owned(),
            );
        }
        return Tenants {
            tiers,
            ..Tenants::none()
        };
    };
    let from = match t.from.as_deref() {
        None | Some("none") => TenantFrom::None,
        Some("key") => TenantFrom::Key,
        Some(other) => match other.strip_prefix("header:") {
            Some(name) => match http::HeaderName::try_from(name.trim()) {
                Ok(name) => TenantFrom::Header(name),
                Err(_) => {
                    problems.push(format!("tenants.from: `{name}` is not a header name"));
                    TenantFrom::None
                }
            },
            None => {
                problems.push(format!(
                    "tenants.from: `{other}`; expected none, key or header:NAME"
                ));
                TenantFrom::None
            }
        },
    };
    // The windows written in [tenants] itself are the tier `default`.
    let own = TierFile {
        requests: t.requests,
        tokens: t.tokens,
        output_tokens: t.output_tokens,
        spend: t.spend,
        spend_total: None,
    };
    if own.requests.is_some()
        || own.tokens.is_some()
        || own.output_tokens.is_some()
        || own.spend.is_some()
    {
        if tiers.contains_key("default") {
            problems.push(
                "tenants: rates in [tenants] are the tier `default`, and [tiers.default] gives it too; write them once".to_owned(),
            );
        }
        tiers.insert("default".to_owned(), tier("default", own, problems));
    }
    let mut virtual_keys = BTreeMap::new();
    let mut tier_of = t.tier_of;
    // Tenants placed by [tenants.tier_of]: a key of theirs that names no tier has that one.
    let placed: std::collections::BTreeSet<String> = tier_of.keys().cloned().collect();
    let mut untiered = std::collections::BTreeSet::new();
    for (key, entry) in t.virtual_keys {
        let (name, tier) = match entry {
            VirtualKeyFile::Tenant(name) => (name, None),
            VirtualKeyFile::WithTier { tenant, tier } => (tenant, tier),
        };
        if tier.is_none() && !placed.contains(&name) {
            untiered.insert(name.clone());
        }
        if let Some(tier) = tier {
            match tier_of.get(&name) {
                Some(other) if *other != tier => problems.push(format!(
                    "tenants.virtual_keys: the tenant `{name}` is given the tiers `{other}` and `{tier}`; one tenant, one tier"
                )),
                _ => {
                    tier_of.insert(name.clone(), tier);
                }
            }
        }
        virtual_keys.insert(key, name);
    }
    let from = if !virtual_keys.is_empty() && from == TenantFrom::None {
        TenantFrom::Key
    } else {
        from
    };
    for (key, name) in &virtual_keys {
        if !plain_name(name) {
            problems.push(format!(
                "tenants.virtual_keys: the tenant name `{name}` must be 1 to 64 of A-Z a-z 0-9 . _ -"
            ));
        }
        if key.len() < 8 || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            problems.push(
                "tenants.virtual_keys: a key must be at least 8 characters, without spaces"
                    .to_owned(),
            );
        }
    }
    let default_tier = match t.default_tier {
        Some(tier) => Some(tier),
        None => tiers.contains_key("default").then(|| "default".to_owned()),
    };
    // A key without a tier stands for the default tier; another key of the same tenant that
    // names a tier would silently give it that one.
    for name in &untiered {
        if let Some(tier) = tier_of.get(name)
            && Some(tier) != default_tier.as_ref()
        {
            problems.push(format!(
                "tenants.virtual_keys: the tenant `{name}` has a key with the tier `{tier}` and one without (the default tier{}); one tenant, one tier: name it on every key",
                default_tier
                    .as_deref()
                    .map(|d| format!(" `{d}`"))
                    .unwrap_or_default()
            ));
        }
    }
    let named = tier_of
        .iter()
        .map(|(tenant, tier)| (format!("the tenant `{tenant}`"), tier))
        .chain(
            default_tier
                .iter()
                .map(|tier| ("default_tier".to_owned(), tier)),
        );
    for (who, tier) in named {
        if !tiers.contains_key(tier) {
            problems.push(format!(
                "tenants: {who} names the tier `{tier}`, which no [tiers.{tier}] gives"
            ));
        }
    }
    if let Some(default) = &t.default
        && !plain_name(default)
    {
        problems.push(format!(
            "tenants.default: `{default}` must be 1 to 64 of A-Z a-z 0-9 . _ -"
        ));
    }
    let header_secret = match &t.header_secret_env {
        Some(var) => match std::env::var(var) {
            Ok(secret) if secret.len() >= 16 => Some(secret),
            Ok(_) => {
                problems.push(format!(
                    "tenants.header_secret_env: the secret in {var} must be at least 16 characters"
                ));
                None
            }
            Err(_) => {
                problems.push(format!(
                    "tenants.header_secret_env: the environment variable {var} is not set"
                ));
                None
            }
        },
        None => None,
    };
    let trusted_network = t.trusted_network.unwrap_or(false);
    if matches!(from, TenantFrom::Header(_)) && header_secret.is_none() && !trusted_network {
        problems.push(format!(
            "tenants.from = \"header:...\": anyone could name any tenant; give header_secret_env (the proxy in front sends the secret in `{SECRET_HEADER}`), or say trusted_network = true"
        ));
    }
    Tenants {
        from,
        tiers,
        default_tier,
        tier_of,
        virtual_keys,
        default: t.default,
        header_secret,
        trusted_network,
        virtual_key_paths: t.virtual_key_paths.unwrap_or(KeyPaths::Metered),
    }
}

fn pools(files: Vec<PoolFile>, upstreams: &[Upstream], problems: &mut Vec<String>) -> Vec<Pool> {
    let mut pools = Vec::new();
    for p in files {
        let what = format!("pool `{}`", p.name);
        if !plain_name(&p.name) {
            problems.push(format!(
                "{what}: a pool's name must be 1 to 64 of A-Z a-z 0-9 . _ -"
            ));
        }
        if p.members.len() < 2 {
            problems.push(format!("{what}: a pool needs two members or more"));
        }
        let mut profile: Option<&str> = None;
        for member in &p.members {
            match upstreams.iter().find(|u| &u.name == member) {
                None => problems.push(format!("{what}: no upstream is named `{member}`")),
                Some(u) => match profile {
                    Some(first) if first != u.profile => problems.push(format!(
                        "{what}: its members speak different APIs (`{first}` and `{}`); a pool's members share one profile",
                        u.profile
                    )),
                    _ => profile = Some(&u.profile),
                },
            }
            let others = pools
                .iter()
                .chain(std::iter::empty())
                .filter(|other: &&Pool| other.members.contains(member))
                .count();
            if others > 0 {
                problems.push(format!(
                    "{what}: `{member}` is a member of another pool too; an upstream is in one pool at most"
                ));
            }
        }
        let defaults = Ejection::default();
        if p.eject_after == Some(0) {
            problems.push(format!(
                "{what}: eject_after = 0 would eject a member that never failed"
            ));
        }
        let ejection = Ejection {
            after: p.eject_after.unwrap_or(defaults.after).max(1),
            base: timeout(
                p.eject_seconds,
                defaults.base,
                &format!("{what}: eject_seconds"),
                problems,
            ),
            most: timeout(
                p.eject_max_seconds,
                defaults.most,
                &format!("{what}: eject_max_seconds"),
                problems,
            ),
        };
        let attempt_timeout = p.attempt_timeout_seconds.map(|s| {
            timeout(
                Some(s),
                Duration::ZERO,
                &format!("{what}: attempt_timeout_seconds"),
                problems,
            )
        });
        pools.push(Pool {
            name: p.name,
            models: p.models,
            members: p.members,
            ejection,
            attempt_timeout,
        });
    }
    pools
}

fn price(p: &PriceFile, what: &str, problems: &mut Vec<String>) -> Option<Price> {
    let fine = |v: f64| v.is_finite() && (0.0..=1_000_000.0).contains(&v);
    let input = p.input;
    let cached = p.cached_input.unwrap_or(input);
    let Some(output) = p.output else {
        // Left out, it would make output free.
        problems.push(format!(
            "{what}: a price names `output` too (0 for a model that writes nothing)"
        ));
        return None;
    };
    if !(fine(input) && fine(cached) && fine(output)) {
        problems.push(format!(
            "{what}: prices are dollars per million tokens, from 0 to 1,000,000"
        ));
        return None;
    }
    Some(Price {
        input: (input * 1e6).round() as u64,
        cached_input: (cached * 1e6).round() as u64,
        output: (output * 1e6).round() as u64,
    })
}

fn model_limits(f: &ModelFile, what: &str, problems: &mut Vec<String>) -> Option<LimitsFrom> {
    let fixed = limits_from(
        f.requests.as_deref(),
        f.tokens.as_deref(),
        f.output_tokens.as_deref(),
    )
    .unwrap_or_else(|e| {
        problems.push(format!("{what}: {e}"));
        None
    });
    match (f.limits.as_deref(), fixed) {
        (None, None) => None,
        (Some("from-headers"), None) => Some(LimitsFrom::Headers),
        (None, Some(limits)) => Some(LimitsFrom::Fixed(limits)),
        (Some("from-headers"), Some(_)) => {
            problems.push(format!(
                "{what}: limits = \"from-headers\" and rates at once; choose one"
            ));
            None
        }
        (Some(other), _) => {
            problems.push(format!(
                "{what}: limits = `{other}`; the only word it takes is \"from-headers\""
            ));
            None
        }
    }
}

fn models(file: Option<ModelsFile>, what: &str, problems: &mut Vec<String>) -> Vec<ModelConfig> {
    let check = |name: &str, problems: &mut Vec<String>| {
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            problems.push(format!(
                "{what}: models: `{}` is not a model name",
                name.escape_debug()
            ));
        }
    };
    let listed = match file {
        None => Vec::new(),
        Some(ModelsFile::Names(names)) => names
            .into_iter()
            .map(|name| (name, ModelFile::default()))
            .collect(),
        Some(ModelsFile::Table(table)) => table.into_iter().collect(),
    };
    let mut out = Vec::new();
    for (name, f) in listed {
        check(&name, problems);
        for alias in &f.aliases {
            check(alias, problems);
        }
        let at = format!("{what}: models.{name}");
        out.push(ModelConfig {
            limits: model_limits(&f, &at, problems),
            aliases: f.aliases.clone(),
            max_output: f.max_output,
            price: f.price.as_ref().and_then(|p| price(p, &at, problems)),
            model: f.model.clone(),
            name,
        });
    }
    let mut names: Vec<&str> = out
        .iter()
        .flat_map(|m| std::iter::once(m.name.as_str()).chain(m.aliases.iter().map(String::as_str)))
        .collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        problems.push(format!(
            "{what}: the model name `{}` is listed twice (as a model or an alias)",
            twice[0].escape_debug()
        ));
    }
    out
}

fn upstream(i: usize, u: UpstreamFile, problems: &mut Vec<String>) -> Upstream {
    let profile = u.profile.unwrap_or_else(|| "openai".to_owned());
    let name = u.name.unwrap_or_else(|| profile.clone());
    let what = format!("upstream `{name}`");
    let url = upstream_url(&u.url).unwrap_or_else(|e| {
        problems.push(format!("{what}: {e}"));
        http::Uri::from_static("http://invalid")
    });
    let fixed = limits_from(
        u.requests.as_deref(),
        u.tokens.as_deref(),
        u.output_tokens.as_deref(),
    )
    .unwrap_or_else(|e| {
        problems.push(format!("{what}: {e}"));
        None
    });
    let limits = match (u.limits.as_deref(), fixed) {
        (Some("from-headers"), None) | (None, None) => LimitsFrom::Headers,
        (None, Some(limits)) => LimitsFrom::Fixed(limits),
        (Some("from-headers"), Some(_)) => {
            problems.push(format!(
                "{what}: limits = \"from-headers\" and rates at once; choose one"
            ));
            LimitsFrom::Headers
        }
        (Some(other), _) => {
            problems.push(format!(
                "{what}: limits = `{other}`; the only word it takes is \"from-headers\" (give rates with requests, tokens, output_tokens)"
            ));
            LimitsFrom::Headers
        }
    };
    let models = models(u.models, &what, problems);
    let spend = budget(u.spend.as_deref(), &format!("{what}: spend"), problems);
    let upstream = Upstream {
        name: name.clone(),
        url,
        profile,
        estimator: u.estimator,
        limits,
        mount: prefix(u.mount, &format!("{what}: mount"), problems),
        strip: prefix(u.strip, &format!("{what}: strip"), problems),
        per_model: u.per_model.unwrap_or(true),
        models,
        spend,
        unknown_models: u.unknown_models.unwrap_or(UnknownModels::Shared),
        default_max_tokens: u.default_max_tokens,
        timeout: timeout(
            u.timeout_seconds,
            DEFAULT_TIMEOUT,
            &format!("{what}: timeout_seconds"),
            problems,
        ),
        connect_timeout: timeout(
            u.connect_timeout_seconds,
            DEFAULT_CONNECT,
            &format!("{what}: connect_timeout_seconds"),
            problems,
        ),
        chunk_timeout: timeout(
            u.chunk_timeout_seconds,
            DEFAULT_CHUNK,
            &format!("{what}: chunk_timeout_seconds"),
            problems,
        ),
        retries: u.retries.unwrap_or(3),
        estimate_margin: match u.estimate_margin.as_deref().map(percent) {
            None => tollgate::Margin::DEFAULT,
            Some(Some(margin)) => margin,
            Some(None) => {
                problems.push(format!(
                    "{what}: estimate_margin `{}`: expected a percentage from 0% to 100%, like \"3%\" or \"0%\"",
                    u.estimate_margin.as_deref().unwrap_or_default()
                ));
                tollgate::Margin::DEFAULT
            }
        },
        http2_only: u.http2_only.unwrap_or(false),
        api_key_env: u.api_key_env,
        tenant_org_headers: u.tenant_org_headers.unwrap_or(false),
    };
    if let Err(e) = upstream.library_profile() {
        problems.push(e);
    }
    if name.is_empty() || name.contains([':', ' ']) || !plain_name(&name) {
        problems.push(format!(
            "upstream {i}: name `{name}` must be 1 to 64 of A-Z a-z 0-9 . _ -"
        ));
    }
    // Budgets are kept under `budget:...`: an upstream of that name would share their keys.
    if name == crate::keys::BUDGET.trim_end_matches(':') {
        problems.push(format!(
            "upstream {i}: the name `{name}` is kept for budgets; choose another"
        ));
    }
    upstream
}

impl Upstream {
    /// An upstream with the defaults: no mount, one key per known model, 120 s, 3 retries.
    pub fn new(name: &str, url: http::Uri, profile: &str, limits: LimitsFrom) -> Upstream {
        Upstream {
            name: name.to_owned(),
            url,
            profile: profile.to_owned(),
            estimator: None,
            limits,
            mount: String::new(),
            strip: String::new(),
            per_model: true,
            models: Vec::new(),
            spend: Rates::none(),
            unknown_models: UnknownModels::Shared,
            default_max_tokens: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT,
            chunk_timeout: DEFAULT_CHUNK,
            retries: 3,
            estimate_margin: tollgate::Margin::DEFAULT,
            http2_only: false,
            api_key_env: None,
            tenant_org_headers: false,
        }
    }
}

impl Tenants {
    /// No tenants: every call is the organization's.
    pub fn none() -> Tenants {
        Tenants {
            from: TenantFrom::None,
            tiers: BTreeMap::new(),
            default_tier: None,
            tier_of: BTreeMap::new(),
            virtual_keys: BTreeMap::new(),
            default: None,
            header_secret: None,
            trusted_network: false,
            virtual_key_paths: KeyPaths::Metered,
        }
    }

    /// Whether calls have tenants at all.
    pub fn any(&self) -> bool {
        self.from != TenantFrom::None || !self.virtual_keys.is_empty()
    }

    /// The tenants the configuration names: virtual keys' tenants, the default tenant, and
    /// those given a tier.
    pub fn named(&self) -> impl Iterator<Item = &String> {
        self.virtual_keys
            .values()
            .chain(self.default.iter())
            .chain(self.tier_of.keys())
    }

    /// The tier of the tenant `name`: its own, or the default tier.
    pub fn tier_of(&self, name: &str) -> Option<&Tier> {
        self.tier_of
            .get(name)
            .or(self.default_tier.as_ref())
            .and_then(|tier| self.tiers.get(tier))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_of_a_file_is_named_at_once() {
        let err = Config::from_toml(
            r#"
            listen = "nowhere"
            [tenants]
            from = "cookie"
            [[upstream]]
            url = "ftp://x"
            profile = "claude"
            requests = "5/q"
            "#,
        )
        .unwrap_err();
        assert_eq!(err.0.len(), 5, "{err}");
        assert!(err.0[0].starts_with("listen:"), "{err}");
        assert!(err.0[1].contains("tenants.from: `cookie`"), "{err}");
        assert!(err.0[2].contains("scheme must be http or https"), "{err}");
        assert!(
            err.0[3].contains("`5/q`") || err.0[3].contains("unknown unit"),
            "{err}"
        );
        assert!(err.0[4].contains("unknown profile `claude`"), "{err}");
    }

    #[test]
    fn an_empty_file_serves_the_public_apis_from_their_headers_and_refuses_other_paths() {
        let config = Config::from_toml("").unwrap();
        assert_eq!(config.listen, "127.0.0.1:8787".parse().unwrap());
        let names: Vec<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["openai", "anthropic"]);
        assert!(matches!(config.upstreams[0].limits, LimitsFrom::Headers));
        assert_eq!(config.max_body, 32 << 20);
        assert_eq!(config.other_paths, OtherPaths::Refuse);
        assert_eq!(config.bounds, Bounds::default());
    }

    #[test]
    fn an_unknown_profile_from_flags_is_named_as_such() {
        let err = Config::single(None, "claude", None).unwrap_err();
        assert!(
            err.to_string().contains("unknown profile `claude`"),
            "{err}"
        );
        let err = Config::single(Some("http://127.0.0.1:9"), "claude", None).unwrap_err();
        assert!(
            err.to_string().contains("unknown profile `claude`"),
            "{err}"
        );
        let err = Config::single(None, "generic", None).unwrap_err();
        assert!(err.to_string().contains("give --upstream URL"), "{err}");
    }

    #[test]
    fn a_price_without_output_is_refused() {
        let err = Config::from_toml(
            "[[upstream]]\nurl = \"http://127.0.0.1:1\"\nprofile = \"openai\"\n[upstream.models.\"m\"]\nprice = { input = 2.5 }\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("names `output` too"), "{err}");
    }

    #[test]
    fn an_upstream_named_budget_is_refused() {
        let err = Config::from_toml(
            "[[upstream]]\nname = \"budget\"\nurl = \"http://127.0.0.1:1\"\nprofile = \"openai\"\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("kept for budgets"), "{err}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = Config::from_toml("[[upstream]]\nurl = \"http://a\"\nrpm = 5\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `rpm`"), "{err}");
    }

    #[test]
    fn a_tenant_with_a_tiered_key_and_a_key_without_is_refused() {
        let file = |keys: &str| {
            format!(
                r#"
                [tiers.small]
                requests = "3/m"
                [tiers.large]
                requests = "1000/m"
                [tenants]
                default_tier = "small"
                virtual_keys = {{ {keys} }}
                [[upstream]]
                url = "http://127.0.0.1:1"
                profile = "openai"
                api_key_env = "PATH"
                "#
            )
        };
        let err = Config::from_toml(&file(
            r#""vk-x-small-1" = "x", "vk-x-large-1" = { tenant = "x", tier = "large" }"#,
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("the tenant `x` has a key with the tier `large` and one without"),
            "{err}"
        );
        // Naming the default tier on the other key is the same tier: fine.
        Config::from_toml(&file(
            r#""vk-y-small-1" = "y", "vk-y-small-2" = { tenant = "y", tier = "small" }"#,
        ))
        .unwrap();
    }

    #[test]
    fn virtual_keys_make_tenants_come_from_keys_and_need_the_real_key() {
        let err = Config::from_toml(
            r#"
            [tenants]
            requests = "10/m"
            virtual_keys = { "vk-1-long-enough" = "alice" }
            "#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("api_key_env"), "{err}");
        let config = Config::from_toml(
            r#"
            [tenants]
            requests = "10/m"
            virtual_keys = { "vk-1-long-enough" = "alice" }
            [[upstream]]
            url = "http://127.0.0.1:1"
            api_key_env = "X"
            "#,
        )
        .unwrap();
        assert_eq!(config.tenants.from, TenantFrom::Key);
        assert_eq!(config.tenants.virtual_keys["vk-1-long-enough"], "alice");
        let tier = config.tenants.tier_of("alice").unwrap();
        assert_eq!(tier.name, "default");
        assert_eq!(tier.limits.as_ref().unwrap().to_string(), "requests 10/m");
        assert_eq!(config.tenants.virtual_key_paths, KeyPaths::Metered);
    }

    #[test]
    fn a_header_tenant_needs_a_secret_or_a_trusted_network() {
        let err = Config::from_toml("[tenants]\nfrom = \"header:x-team\"\n").unwrap_err();
        assert!(
            err.to_string().contains("anyone could name any tenant"),
            "{err}"
        );
        let config =
            Config::from_toml("[tenants]\nfrom = \"header:x-team\"\ntrusted_network = true\n")
                .unwrap();
        assert!(config.tenants.trusted_network);
        let err = Config::from_toml(
            "[tenants]\nfrom = \"header:x-team\"\nheader_secret_env = \"TOLLGATE_NO_SUCH_VARIABLE\"\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("is not set"), "{err}");
    }

    #[test]
    fn bounds_and_timeouts_have_defaults_and_refuse_zero() {
        let err = Config::from_toml(
            "max_connections = 0\nidle_timeout_seconds = 0\n[[upstream]]\nurl = \"http://a\"\ntimeout_seconds = -1\n",
        )
        .unwrap_err();
        assert_eq!(err.0.len(), 3, "{err}");
        let config = Config::from_toml(
            "idle_timeout_seconds = 5\nmax_buffered_bytes = 1000\n[[upstream]]\nurl = \"http://a\"\nchunk_timeout_seconds = 7\nmodels = [\"m1\"]\nunknown_models = \"refuse\"\n",
        )
        .unwrap();
        assert_eq!(config.bounds.idle_timeout, Duration::from_secs(5));
        assert_eq!(config.bounds.max_buffered, 1000);
        let u = &config.upstreams[0];
        assert_eq!(u.chunk_timeout, Duration::from_secs(7));
        assert_eq!(u.timeout, Duration::from_secs(120));
        assert_eq!(u.models.len(), 1);
        assert_eq!(u.models[0].name, "m1");
        assert_eq!(u.unknown_models, UnknownModels::Refuse);
    }
}
