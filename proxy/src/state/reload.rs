//! What outlives a reload, and the reload itself: the configuration in force is swapped whole,
//! and each key whose limits changed is carried over to its new limits, never above what it
//! held.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Semaphore;
use tollgate::{Currency, Limits, Registry};

use super::naming::{limits_of_key, store_key_in};
use super::{BUFFER_UNIT, Shared};
use crate::config::Config;
use crate::keys::{BUDGET, TENANT_PART};
use crate::metrics::{Metrics, OTHER, ProxyMetrics};

/// The most keys a configuration remembers having carried over (past it, it forgets them:
/// carrying again is harmless, only a few store operations).
const CARRIED_KEYS: usize = 10_000;

/// What outlives a reload: the store and its keys' limiters, the counts, the memory for
/// bodies, the drain, and the configuration the process started with.
pub(crate) struct Lasting {
    pub(super) registry: Arc<Registry>,
    /// The tenants with labels of their own (read by the registry's label function).
    pub(super) named: Arc<std::sync::RwLock<BTreeSet<String>>>,
    pub(super) live: Arc<crate::tally::Tally>,
    pub(super) buffered: Arc<Semaphore>,
    pub(super) draining: Arc<AtomicBool>,
    pub(super) drain_started: Arc<tokio::sync::Notify>,
    pub(super) metrics: Metrics,
    pub(super) proxy_metrics: ProxyMetrics,
    /// Who owns each stored object (`owners.rs`).
    pub(super) owners: Arc<crate::owners::Owners>,
    /// What calls with inputs the proxy can't see were billed (`hidden.rs`).
    pub(super) hidden: Arc<crate::hidden::Hidden>,
    /// The configuration the process started with: a key whose limits differ from what they
    /// were in it is stored as `{key}@{limits}` (a store keeps one set of limits per key).
    pub(super) base: Config,
    /// Every configuration put in force since, the first one first.
    pub(super) history: Mutex<Vec<Config>>,
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

impl Shared {
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
}
