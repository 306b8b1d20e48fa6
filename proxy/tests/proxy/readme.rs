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
    assert_eq!(blocks.len(), 2);
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
