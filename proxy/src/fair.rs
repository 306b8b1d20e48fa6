//! What the fair share looks like from here: each tenant's waits at the organisation's keys
//! (upstream and model keys, where tenants share a line) and the tokens admitted there, as
//! `/metrics` counts them (`tollgate_wait_seconds{key, tenant}`,
//! `tollgate_proxy_admitted_tokens_total{key, tenant}`) and as the live view shows them over
//! the last minute (each tenant's calls, waits and share of the tokens admitted).
//!
//! A call's wait is its attempt's admission at the organisation's key (after its tenant's own
//! windows and budgets): the time the fair order decides. The counts are this process's own.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// How far back the live view looks.
pub(crate) const RECENT: Duration = Duration::from_secs(60);
/// The most admissions remembered for it (the oldest go first).
const REMEMBERED: usize = 8_192;

/// One admission at an organisation key.
#[derive(Debug, Clone)]
struct Admission {
    at: Instant,
    /// The tenant's label: its name when the configuration names it, else `other`.
    tenant: Arc<str>,
    tokens: u64,
    wait: Duration,
}

/// The admissions of the last minute.
#[derive(Debug, Default)]
pub(crate) struct Fair {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    recent: VecDeque<Admission>,
    /// Each key's (without its limits) and tenant's label and meters, made once: an admission
    /// looks them up without allocating (the labels are the configured tenants and `other`).
    meters: HashMap<String, HashMap<Arc<str>, Meters>>,
}

/// A tenant's meters at one key.
#[derive(Debug, Clone)]
struct Meters {
    label: Arc<str>,
    wait: metrics::Histogram,
    tokens: metrics::Counter,
}

impl Meters {
    fn new(key: &str, tenant: &str) -> Meters {
        let (key, label) = (key.to_owned(), tenant.to_owned());
        Meters {
            wait: metrics::histogram!("tollgate_wait_seconds", "key" => key.clone(), "tenant" => label.clone()),
            tokens: metrics::counter!("tollgate_proxy_admitted_tokens_total", "key" => key, "tenant" => label.clone()),
            label: label.into(),
        }
    }
}

/// A tenant's last minute at the organisation's keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Recent {
    /// Calls admitted (each attempt).
    pub(crate) calls: u64,
    /// Tokens admitted (the calls' estimates as charged).
    pub(crate) tokens: u64,
    /// Its part of the tokens every tenant was admitted, from 0 to 1.
    pub(crate) share: f64,
    /// Its waits for admission, in seconds: the median, the 99th percentile (nearest rank),
    /// the mean and the longest.
    pub(crate) wait_p50: f64,
    pub(crate) wait_p99: f64,
    pub(crate) wait_mean: f64,
    pub(crate) wait_max: f64,
}

/// The `q` quantile of sorted `values`, by nearest rank.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Fair {
    /// A call of `tenant` (its label) was admitted at the organisation key `key` at `at`,
    /// paying `tokens`, after waiting `wait`.
    pub(crate) fn admitted(
        &self,
        at: Instant,
        key: &str,
        tenant: &str,
        tokens: u64,
        wait: Duration,
    ) {
        let key = key.split('@').next().unwrap_or(key);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !state.meters.contains_key(key) {
            state.meters.insert(key.to_owned(), HashMap::new());
        }
        let by_tenant = state.meters.get_mut(key).expect("inserted above");
        if !by_tenant.contains_key(tenant) {
            by_tenant.insert(tenant.into(), Meters::new(key, tenant));
        }
        let meters = &by_tenant[tenant];
        meters.wait.record(wait.as_secs_f64());
        meters.tokens.increment(tokens);
        let tenant = Arc::clone(&meters.label);
        if state.recent.len() >= REMEMBERED {
            state.recent.pop_front();
        }
        state.recent.push_back(Admission {
            at,
            tenant,
            tokens,
            wait,
        });
    }

    /// Each tenant's last minute before `now`.
    pub(crate) fn recent(&self, now: Instant) -> BTreeMap<String, Recent> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let recent = &mut state.recent;
        while recent
            .front()
            .is_some_and(|a| now.saturating_duration_since(a.at) > RECENT)
        {
            recent.pop_front();
        }
        let mut by_tenant: BTreeMap<String, (u64, Vec<Duration>)> = BTreeMap::new();
        for a in recent.iter() {
            let entry = by_tenant.entry(a.tenant.to_string()).or_default();
            entry.0 += a.tokens;
            entry.1.push(a.wait);
        }
        drop(state);
        let total: u64 = by_tenant.values().map(|(tokens, _)| tokens).sum();
        by_tenant
            .into_iter()
            .map(|(tenant, (tokens, mut waits))| {
                waits.sort_unstable();
                let sum: Duration = waits.iter().sum();
                let calls = waits.len() as u64;
                let recent = Recent {
                    calls,
                    tokens,
                    share: if total == 0 {
                        0.0
                    } else {
                        tokens as f64 / total as f64
                    },
                    wait_p50: quantile(&waits, 0.5).as_secs_f64(),
                    wait_p99: quantile(&waits, 0.99).as_secs_f64(),
                    wait_mean: sum.as_secs_f64() / calls.max(1) as f64,
                    wait_max: waits.last().copied().unwrap_or_default().as_secs_f64(),
                };
                (tenant, recent)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn shares_and_waits_are_the_last_minutes() {
        let fair = Fair::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // A minute and more ago: forgotten.
        fair.admitted(t0, "o:gpt-4o", "a", 1_000, ms(9_000));
        let t1 = t0 + Duration::from_secs(30);
        for (i, wait) in [100, 300, 200, 400].into_iter().enumerate() {
            fair.admitted(t1 + ms(i as u64), "o:gpt-4o", "a", 100, ms(wait));
        }
        fair.admitted(t1, "o:gpt-4o@requests 5/m", "b", 200, ms(1_000));
        fair.admitted(t1, "o:gpt-4o", "b", 400, ms(3_000));
        let view = fair.recent(t0 + Duration::from_secs(61));
        assert_eq!(
            view["a"],
            Recent {
                calls: 4,
                tokens: 400,
                share: 0.4,
                wait_p50: 0.2,
                wait_p99: 0.4,
                wait_mean: 0.25,
                wait_max: 0.4,
            }
        );
        assert_eq!(
            view["b"],
            Recent {
                calls: 2,
                tokens: 600,
                share: 0.6,
                wait_p50: 1.0,
                wait_p99: 3.0,
                wait_mean: 2.0,
                wait_max: 3.0,
            }
        );
        // A minute after the last: nothing.
        assert!(fair.recent(t1 + Duration::from_secs(61)).is_empty());
    }
}
