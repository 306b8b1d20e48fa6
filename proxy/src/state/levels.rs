//! The levels `/metrics` shows: the keys each upstream saw lately, and their windows' levels
//! at each scrape.

use std::sync::PoisonError;

use tollgate::Currency;

use super::{ReadyUpstream, Shared};
use crate::keys::TENANT_PART;

/// The most keys per upstream whose levels `/metrics` shows.
const LEVEL_KEYS: usize = 1_024;
impl Shared {
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
