//! From the file's shape to the configuration the proxy runs on: every value read, checked
//! and defaulted, and every problem reported at once.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate::http::models::Price;
use tollgate::{Limits, Rates};

use super::file::*;
use super::*;

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
    let weight = match t.weight {
        None => 1,
        Some(w) if (1..=i64::from(MAX_WEIGHT)).contains(&w) => u32::try_from(w).unwrap_or(1),
        Some(w) => {
            problems.push(format!(
                "{what}.weight: {w}; expected a whole number from 1 to {MAX_WEIGHT} (a tier's share of a contended key, against the other tiers' weights)"
            ));
            1
        }
    };
    let priority = match t.priority.as_deref() {
        None | Some("interactive") => Priority::Interactive,
        Some("batch") => Priority::Batch,
        Some(other) => {
            problems.push(format!(
                "{what}.priority: `{other}`; expected interactive or batch"
            ));
            Priority::Interactive
        }
    };
    Tier {
        name: name.to_owned(),
        limits,
        weight,
        priority,
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
        weight: None,
        priority: None,
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

    #[test]
    fn a_tiers_weight_is_1_and_its_priority_interactive_unless_said() {
        let config = Config::from_toml(
            r#"
            [tiers.team]
            requests = "60/m"
            [tiers.nightly]
            weight = 4
            priority = "batch"
            [tiers.vip]
            weight = 1000000
            priority = "interactive"
            [tenants]
            from = "key"
            default_tier = "team"
            "#,
        )
        .unwrap();
        let tier = |name: &str| config.tenants.tiers[name].clone();
        let shown = |t: Tier| (t.weight, t.priority, t.share_weight());
        assert_eq!(shown(tier("team")), (1, Priority::Interactive, 10));
        assert_eq!(shown(tier("nightly")), (4, Priority::Batch, 4));
        assert_eq!(
            shown(tier("vip")),
            (1_000_000, Priority::Interactive, 10_000_000)
        );
    }

    #[test]
    fn a_weight_of_0_or_past_a_million_and_an_unknown_priority_are_refused() {
        let err = Config::from_toml(
            r#"
            [tiers.none]
            weight = 0
            [tiers.negative]
            weight = -2
            [tiers.huge]
            weight = 1000001
            [tiers.urgent]
            priority = "urgent"
            [tenants]
            from = "key"
            "#,
        )
        .unwrap_err();
        assert_eq!(
            err.0,
            [
                "tiers.huge.weight: 1000001; expected a whole number from 1 to 1000000 (a tier's share of a contended key, against the other tiers' weights)",
                "tiers.negative.weight: -2; expected a whole number from 1 to 1000000 (a tier's share of a contended key, against the other tiers' weights)",
                "tiers.none.weight: 0; expected a whole number from 1 to 1000000 (a tier's share of a contended key, against the other tiers' weights)",
                "tiers.urgent.priority: `urgent`; expected interactive or batch",
            ]
        );
        let err =
            Config::from_toml("[tiers.x]\nweight = 1.5\n[tenants]\nfrom = \"key\"\n").unwrap_err();
        assert!(err.to_string().contains("weight"), "{err}");
    }
}
