//! Each key's counts since the proxy started (admitted, 429s here and upstream, budget
//! refusals, spend, the last pause heard of), and the tenants the configuration doesn't name,
//! kept for their queue: what the live view shows. The counts are this process's own (a fleet
//! on Redis shares levels, not counts).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tollgate::Limiter;

use crate::config::Config;
use crate::keys::TENANT_PART;
use crate::metrics::OTHER;

/// The most keys with counts of their own (labels are bounded by the configuration; this only
/// guards against a bug that would make them unbounded).
const COUNTED_KEYS: usize = 4_096;
/// The most tenants not named in the configuration remembered per upstream, for the
/// aggregate's queue.
const OTHER_TENANTS: usize = 1_024;

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A key's counts, since the proxy started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Counts {
    /// Calls admitted at the key (each attempt: a retry after an upstream 429 is admitted
    /// again).
    pub(crate) admitted: u64,
    /// Calls answered 429 by the proxy: they would have waited past their deadline, or the
    /// key's queue was full.
    pub(crate) local_429s: u64,
    /// 429s from the upstream (retried here, handed on, or a spent quota).
    pub(crate) upstream_429s: u64,
    /// Calls refused because a budget was spent.
    pub(crate) budget_refusals: u64,
    /// What the key's calls cost, in micro-dollars at their models' prices.
    #[serde(skip)]
    pub(crate) spent_micros: u64,
    /// Until when the key's provider paused it, as this process last heard (Unix ms).
    #[serde(skip)]
    pub(crate) paused_until: u64,
}

/// Each key's counts, and the tenants the configuration doesn't name (kept only for their
/// queue, never listed).
pub(crate) struct Tally {
    /// The tenants the configuration names (virtual keys' tenants, the default).
    named: std::sync::RwLock<BTreeSet<String>>,
    /// `memory` or `redis`.
    pub(crate) store: &'static str,
    counts: Mutex<HashMap<String, Counts>>,
    /// When the counts began (Unix ms).
    pub(crate) started: u64,
    /// Per upstream: the limiters of tenants not named in the configuration.
    others: Mutex<HashMap<String, HashMap<String, Limiter>>>,
    /// Each tenant's waits and admitted tokens at the organisation's keys, lately.
    pub(crate) fair: crate::fair::Fair,
}

impl Tally {
    pub(crate) fn new(config: &Config) -> Tally {
        Tally {
            named: std::sync::RwLock::new(config.tenants.named().cloned().collect()),
            store: if config.redis.is_some() {
                "redis"
            } else {
                "memory"
            },
            counts: Mutex::new(HashMap::new()),
            started: unix_ms(),
            others: Mutex::new(HashMap::new()),
            fair: crate::fair::Fair::default(),
        }
    }

    /// The entry a key is counted under: itself (less a learned limit's `@limits` suffix), or
    /// `{upstream}:tenant:other` for a tenant the configuration doesn't name.
    fn entry(&self, key: &str) -> String {
        let key = key.split('@').next().unwrap_or(key);
        match key.split_once(&format!(":{TENANT_PART}")) {
            Some((_, tenant))
                if self
                    .named
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains(tenant) =>
            {
                key.to_owned()
            }
            Some((upstream, _)) => format!("{upstream}:{TENANT_PART}{OTHER}"),
            None => key.to_owned(),
        }
    }

    fn count(&self, key: &str, add: impl FnOnce(&mut Counts)) {
        let entry = self.entry(key);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(counts) = counts.get_mut(&entry) {
            add(counts);
        } else if counts.len() < COUNTED_KEYS {
            add(counts.entry(entry).or_default());
        }
    }

    /// After a reload: the tenants the configuration names now.
    pub(crate) fn rename(&self, named: BTreeSet<String>) {
        *self.named.write().unwrap_or_else(PoisonError::into_inner) = named;
    }

    /// A call was admitted at `key`.
    pub(crate) fn admitted(&self, key: &str) {
        self.count(key, |c| c.admitted += 1);
    }

    /// A call was answered 429 here, waiting at `key`.
    pub(crate) fn local_429(&self, key: &str) {
        self.count(key, |c| c.local_429s += 1);
    }

    /// The upstream answered a call of `key` with 429.
    pub(crate) fn upstream_429(&self, key: &str) {
        self.count(key, |c| c.upstream_429s += 1);
    }

    /// The upstream paused `key` for `pause` (its 429's retry-after).
    pub(crate) fn paused(&self, key: &str, pause: Duration) {
        let until = unix_ms().saturating_add(u64::try_from(pause.as_millis()).unwrap_or(u64::MAX));
        self.count(key, |c| c.paused_until = c.paused_until.max(until));
    }

    /// A call at `key` cost `micros` micro-dollars.
    pub(crate) fn spent(&self, key: &str, micros: u64) {
        self.count(key, |c| {
            c.spent_micros = c.spent_micros.saturating_add(micros)
        });
    }

    /// A call was refused at the budget `key`.
    pub(crate) fn budget_refused(&self, key: &str) {
        self.count(key, |c| c.budget_refusals += 1);
    }

    /// A tenant the configuration doesn't name waits at `limiter` (its key is never shown).
    pub(crate) fn other_tenant(&self, upstream: &str, limiter: &Limiter) {
        let mut others = self.others.lock().unwrap_or_else(PoisonError::into_inner);
        let tenants = others.entry(upstream.to_owned()).or_default();
        if tenants.contains_key(limiter.key()) {
            return;
        }
        if tenants.len() >= OTHER_TENANTS {
            tenants.clear();
        }
        tenants.insert(limiter.key().to_owned(), limiter.clone());
    }

    pub(crate) fn counts(&self) -> HashMap<String, Counts> {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many other tenants an upstream has seen lately, and how many of their calls wait.
    pub(crate) fn others_of(&self, upstream: &str) -> (usize, usize) {
        let others = self.others.lock().unwrap_or_else(PoisonError::into_inner);
        others.get(upstream).map_or((0, 0), |tenants| {
            (tenants.len(), tenants.values().map(Limiter::waiters).sum())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_the_configuration_does_not_name_are_counted_together() {
        let config = Config::from_toml(
            r#"
            [tenants]
            from = "key"
            requests = "10/m"
            default = "anonymous"
            "#,
        )
        .unwrap();
        let tally = Tally::new(&config);
        tally.admitted("openai:tenant:k0123456789abcdef");
        tally.admitted("openai:tenant:kfedcba9876543210");
        tally.local_429("openai:tenant:anonymous");
        tally.upstream_429("openai:gpt-4o@requests 10/m");
        let counts = tally.counts();
        assert_eq!(counts["openai:tenant:other"].admitted, 2);
        assert_eq!(counts["openai:tenant:anonymous"].local_429s, 1);
        assert_eq!(counts["openai:gpt-4o"].upstream_429s, 1);
        assert_eq!(counts.len(), 3);
    }
}
