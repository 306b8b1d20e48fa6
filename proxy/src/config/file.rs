//! The configuration file's shape: structs that mirror the TOML as written, every field
//! optional and every unknown one refused. Nothing here judges a value; `validate.rs` does.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{KeyPaths, OtherPaths, UnknownModels};

/// The file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub(super) listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    #[serde(default)]
    pub(super) admin_hosts: Vec<String>,
    pub(super) metrics_token_env: Option<String>,
    pub(super) redis: Option<String>,
    pub(super) max_body_bytes: Option<usize>,
    pub(super) drain_seconds: Option<f64>,
    pub(super) other_paths: Option<OtherPaths>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_buffered_bytes: Option<usize>,
    pub(super) header_timeout_seconds: Option<f64>,
    pub(super) idle_timeout_seconds: Option<f64>,
    pub(super) body_timeout_seconds: Option<f64>,
    pub(super) body_min_bytes_per_second: Option<u64>,
    pub(super) write_timeout_seconds: Option<f64>,
    pub(super) tenants: Option<TenantsFile>,
    #[serde(default)]
    pub(super) tiers: BTreeMap<String, TierFile>,
    #[serde(default, rename = "upstream")]
    pub(super) upstreams: Vec<UpstreamFile>,
    #[serde(default, rename = "pool")]
    pub(super) pools: Vec<PoolFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TierFile {
    pub(super) requests: Option<String>,
    pub(super) tokens: Option<String>,
    pub(super) output_tokens: Option<String>,
    pub(super) spend: Option<String>,
    pub(super) spend_total: Option<String>,
    /// Read wide, so that 0 and a negative weight are named as such rather than as a type.
    pub(super) weight: Option<i64>,
    pub(super) priority: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PoolFile {
    pub(super) name: String,
    #[serde(default)]
    pub(super) models: Vec<String>,
    pub(super) members: Vec<String>,
    pub(super) eject_after: Option<u32>,
    pub(super) eject_seconds: Option<f64>,
    pub(super) eject_max_seconds: Option<f64>,
    pub(super) attempt_timeout_seconds: Option<f64>,
}

/// A virtual key's tenant: its name, or its name and tier.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum VirtualKeyFile {
    Tenant(String),
    WithTier {
        tenant: String,
        tier: Option<String>,
    },
}

/// An upstream's models: names only, or a table of each model's settings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ModelsFile {
    Names(Vec<String>),
    Table(BTreeMap<String, ModelFile>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ModelFile {
    pub(super) limits: Option<String>,
    pub(super) requests: Option<String>,
    pub(super) tokens: Option<String>,
    pub(super) output_tokens: Option<String>,
    #[serde(default)]
    pub(super) aliases: Vec<String>,
    pub(super) max_output: Option<u64>,
    pub(super) price: Option<PriceFile>,
    pub(super) model: Option<String>,
}

/// Dollars per million tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PriceFile {
    pub(super) input: f64,
    pub(super) cached_input: Option<f64>,
    pub(super) output: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TenantsFile {
    pub(super) from: Option<String>,
    pub(super) requests: Option<String>,
    pub(super) tokens: Option<String>,
    pub(super) output_tokens: Option<String>,
    pub(super) spend: Option<String>,
    #[serde(default)]
    pub(super) virtual_keys: BTreeMap<String, VirtualKeyFile>,
    pub(super) default: Option<String>,
    pub(super) default_tier: Option<String>,
    #[serde(default)]
    pub(super) tier_of: BTreeMap<String, String>,
    pub(super) header_secret_env: Option<String>,
    pub(super) trusted_network: Option<bool>,
    pub(super) virtual_key_paths: Option<KeyPaths>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpstreamFile {
    pub(super) name: Option<String>,
    pub(super) url: String,
    pub(super) profile: Option<String>,
    pub(super) estimator: Option<String>,
    pub(super) limits: Option<String>,
    pub(super) requests: Option<String>,
    pub(super) tokens: Option<String>,
    pub(super) output_tokens: Option<String>,
    pub(super) mount: Option<String>,
    pub(super) strip: Option<String>,
    pub(super) per_model: Option<bool>,
    pub(super) models: Option<ModelsFile>,
    pub(super) spend: Option<String>,
    pub(super) unknown_models: Option<UnknownModels>,
    pub(super) default_max_tokens: Option<u64>,
    pub(super) timeout_seconds: Option<f64>,
    pub(super) connect_timeout_seconds: Option<f64>,
    pub(super) chunk_timeout_seconds: Option<f64>,
    pub(super) retries: Option<u32>,
    pub(super) estimate_margin: Option<String>,
    pub(super) http2_only: Option<bool>,
    pub(super) api_key_env: Option<String>,
    pub(super) tenant_org_headers: Option<bool>,
}
