//! The configuration in proxy/README.md is one the proxy starts with.

use tollgate_proxy::Config;
use tollgate_proxy::config::{LimitsFrom, TenantFrom};

use crate::common::*;

/// The README's ```toml blocks, in order.
fn toml_blocks() -> Vec<String> {
    let readme = include_str!("../../README.md");
    readme
        .split("```toml\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn the_readmes_configuration_starts_a_proxy() {
    let blocks = toml_blocks();
    assert_eq!(blocks.len(), 4);
    let text = format!("{}\n{}", blocks[0], blocks[1]);
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["openai", "anthropic", "vllm"]);
    assert!(matches!(config.upstreams[2].limits, LimitsFrom::Headers));
    assert_eq!(config.upstreams[2].mount, "/vllm");
    assert_eq!(config.tenants.from, TenantFrom::Key);
    let running = proxy(&text).await;
    assert_eq!(get(running.addr, "/healthz").await.status, 200);
}

#[tokio::test]
async fn the_readmes_organisation_starts_a_proxy() {
    let blocks = toml_blocks();
    // The real keys' variables: any variable that is set stands for them here.
    let text = blocks[2]
        .replace("OPENAI_API_KEY", "PATH")
        .replace("AZURE_EAST_KEY", "PATH")
        .replace("AZURE_WEST_KEY", "PATH")
        .replace("0.0.0.0:8787", "127.0.0.1:0")
        .replace("127.0.0.1:8788", "127.0.0.1:0");
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.tenants.tiers.len(), 2);
    assert_eq!(config.tenants.tier_of("nightly").unwrap().name, "batch");
    assert_eq!(
        config.tenants.tier_of("nightly").unwrap().share_weight(),
        1,
        "a batch tier of weight 1"
    );
    assert_eq!(config.tenants.tier_of("alice").unwrap().name, "team");
    assert_eq!(config.upstreams[0].models.len(), 3);
    assert_eq!(config.pools[0].members, ["azure-east", "azure-west"]);
    let running = proxy(&text).await;
    assert_eq!(get(running.addr, "/healthz").await.status, 200);
    for example in [
        include_str!("../../deploy/examples/openai-tier-1.toml"),
        include_str!("../../deploy/examples/anthropic-tier-1.toml"),
    ] {
        let config = Config::from_toml(example).unwrap_or_else(|e| panic!("{e}"));
        assert!(config.upstreams[0].models.len() >= 4);
    }
}

#[tokio::test]
async fn the_readmes_fair_share_tiers_weigh_as_it_says() {
    let blocks = toml_blocks();
    let config = Config::from_toml(&blocks[3]).unwrap_or_else(|e| panic!("{e}"));
    let weight = |tenant: &str| config.tenants.tier_of(tenant).unwrap().share_weight();
    assert_eq!(weight("reports"), 1, "weight 1, batch");
    assert_eq!(weight("anyone"), 20, "weight 2, interactive");
}
