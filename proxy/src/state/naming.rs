//! Which key a call is counted at under a configuration (`{upstream}`, `{upstream}:{model}`,
//! the model an Azure deployment serves), the limits a configuration gives a key, and where a
//! key is stored once a reload changed its limits.

use serde_json::Value;
use tollgate::Limits;
use tollgate::http::Profile;

use crate::config::{Config, Family, LimitsFrom, Upstream};
use crate::keys::{BUDGET, TENANT_PART, family_of};
use crate::route::azure_deployment;

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
pub(super) fn store_key_in(base: &Config, config: &Config, key: &str) -> String {
    if std::ptr::eq(base, config) {
        return key.to_owned();
    }
    match (limits_of_key(base, key), limits_of_key(config, key)) {
        (Some(was), Some(now)) if was != now => format!("{key}@{now}"),
        _ => key.to_owned(),
    }
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
