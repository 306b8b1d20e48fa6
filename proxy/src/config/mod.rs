//! What the proxy serves: its address, its store, its upstreams with their profiles, models and
//! limits, its tenants, and the bounds on what a client or an upstream may hold. Read from a
//! TOML file (`--config proxy.toml`) or made from flags.
//!
//! This module holds the configuration the proxy runs on; the file's shape is in `file.rs`,
//! and the reading and checking that turn one into the other in `validate.rs`.

mod file;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use tollgate::http::Profile;
use tollgate::http::models::Price;
use tollgate::{Limits, Rates};

pub use crate::health::Ejection;
pub(crate) use validate::plain_name;
pub use validate::{limits_from, upstream_url};

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
    /// Each tenant's weight at a contended key (1 to [`MAX_WEIGHT`], default 1): while calls of
    /// several tenants wait at one organisation key, each tenant gets its capacity in proportion
    /// to its weight (times its priority's factor).
    pub weight: u32,
    /// `interactive` (the default) or `batch`: interactive tenants weigh ten times their weight.
    pub priority: Priority,
}

/// The largest `weight` a tier may have.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// Whether a tier's calls go first at a contended key (`interactive`) or take what is left
/// (`batch`). Done with weights: a batch tenant is never starved, it gets 1 part in 11 of a key
/// beside one interactive tenant of the same weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// Weighs ten times its tier's weight (the default).
    #[default]
    Interactive,
    /// Weighs its tier's weight.
    Batch,
}

impl Priority {
    /// What the tier's weight is multiplied by.
    pub const fn factor(self) -> u32 {
        match self {
            Priority::Interactive => 10,
            Priority::Batch => 1,
        }
    }

    /// `interactive` or `batch`.
    pub const fn name(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }
}

impl Tier {
    /// The weight its tenants wait with at an organisation key: its `weight` times its
    /// priority's factor (at most 10,000,000).
    pub fn share_weight(&self) -> u32 {
        self.weight.saturating_mul(self.priority.factor())
    }
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

impl Config {
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
