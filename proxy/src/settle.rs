//! What a metered call's settlement does once its usage is known: its log line, its spend
//! counted at every key it spent from, its settled tokens counted, and, for a call with inputs
//! the proxy can't see, the ceiling its bill teaches (and the turn it held, given back).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedSemaphorePermit;
use tollgate::http::{Attempts, Settlement};

use crate::admit::Prepared;
use crate::exchange::Exchange;
use crate::keys::{BUDGET, TENANT_PART};

/// What a metered call's log line says, filled as it becomes known.
#[derive(Debug, Default)]
pub(crate) struct CallLog {
    pub(crate) upstream: String,
    /// The key the delivered attempt was admitted at.
    pub(crate) key: String,
    pub(crate) route: &'static str,
    pub(crate) tenant: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) estimated: u64,
    pub(crate) wait_ms: f64,
    pub(crate) status: u16,
    pub(crate) retries: u32,
}

impl CallLog {
    /// The line of the exchange's call, as far as its estimate tells.
    pub(crate) fn of(exchange: &Exchange<'_>, attempts: &Attempts) -> CallLog {
        let estimated = attempts.estimated();
        CallLog {
            upstream: exchange.upstream.name.clone(),
            route: exchange.route.name,
            tenant: exchange.tenant.as_ref().map(|t| t.name.clone()),
            model: estimated.model().map(crate::answer::printable),
            estimated: estimated.input_tokens() + estimated.most_output(),
            ..CallLog::default()
        }
    }

    /// Writes the line, once the call settled.
    fn write(&self, settlement: &Settlement) {
        let settled = settlement
            .usage
            .map(|u| u.tokens.unwrap_or(0) + u.output_tokens.unwrap_or(0));
        tracing::info!(
            upstream = %self.upstream,
            route = self.route,
            tenant = self.tenant.as_deref().unwrap_or("-"),
            model = self.model.as_deref().unwrap_or("-"),
            estimated = self.estimated,
            settled = settled.map_or_else(|| "estimate".to_owned(), |s| s.to_string()),
            cut = settlement.cut,
            clamped = settlement.clamped,
            wait_ms = self.wait_ms,
            upstream_status = self.status,
            retries = self.retries,
            "call",
        );
    }
}

/// Everything a call's settlement needs, taken when the call starts.
struct Settling {
    log: Arc<Mutex<CallLog>>,
    settled: metrics::Counter,
    model_label: String,
    tenant_label: String,
    live: Arc<crate::tally::Tally>,
    tenant_key: Option<String>,
    /// The tenant's and tier's budgets; the upstream's is the serving member's.
    budgets: Vec<String>,
    upstream_budget: String,
    /// The upstreams that keep a budget of their own.
    member_budgets: HashSet<String>,
    learned: Arc<crate::hidden::Hidden>,
    records: Arc<crate::owners::Owners>,
    /// The tenant and model of a call with inputs the proxy can't see.
    hidden: Option<(String, String)>,
    /// Its turn, while such calls go one at a time.
    alone: Option<OwnedSemaphorePermit>,
}

/// Has the prepared call settle as the module says; the log line it writes, which the
/// attempts fill.
pub(crate) fn on_settled(exchange: &Exchange<'_>, prepared: &mut Prepared) -> Arc<Mutex<CallLog>> {
    let log = Arc::new(Mutex::new(CallLog::of(exchange, &prepared.attempts)));
    let (shared, upstream, tenant) = (exchange.shared, &exchange.upstream, &exchange.tenant);
    let upstream_budget = format!("{}upstream:", BUDGET);
    let attempts = &prepared.attempts;
    let settling = Settling {
        log: Arc::clone(&log),
        settled: upstream.metrics.settled_tokens.clone(),
        model_label: attempts
            .estimated()
            .model()
            .and_then(|m| crate::state::model_entry(&upstream.config, &upstream.profile, m))
            .unwrap_or_else(|| crate::metrics::OTHER.to_owned()),
        tenant_label: tenant.as_ref().map_or_else(
            || "-".to_owned(),
            |t| {
                if t.configured {
                    t.name.clone()
                } else {
                    crate::metrics::OTHER.to_owned()
                }
            },
        ),
        live: Arc::clone(&shared.live),
        tenant_key: tenant
            .as_ref()
            .map(|t| format!("{}:{TENANT_PART}{}", upstream.name, t.name)),
        budgets: prepared
            .budgets
            .iter()
            .filter(|key| !key.starts_with(&upstream_budget))
            .cloned()
            .collect(),
        upstream_budget,
        member_budgets: shared
            .upstreams
            .iter()
            .filter(|u| !u.config.spend.is_empty())
            .map(|u| u.name.clone())
            .collect(),
        learned: Arc::clone(&shared.hidden),
        records: Arc::clone(&shared.owners),
        hidden: prepared.hidden.clone(),
        alone: prepared.alone.take(),
    };
    prepared
        .attempts
        .on_settled(Box::new(move |settlement: &Settlement| {
            settling.settle(settlement);
        }));
    log
}

impl Settling {
    fn settle(self, settlement: &Settlement) {
        let status = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .status;
        // Whether the provider said what the input was billed. An answer that reports none is
        // settled with what was charged in its place (`Call::finish`): that is no bill, and
        // teaches nothing (learnt, it had made the ceiling the estimate).
        let billed = settlement.input_reported;
        self.learn(settlement, billed, status);
        match self.alone {
            // The call that went alone, answered without its bill (its usage never came: an
            // upstream that reports none, a stream cut before its end even when read on):
            // nothing was learned, and the next such call would go alone as blind as it did.
            // The turn is kept, so such calls of this tenant and model wait (429 past their
            // deadline) until a ceiling is learned, here or by the fleet.
            Some(turn) if !billed && (200..300).contains(&status) => {
                turn.forget();
                if let Some((tenant, model)) = &self.hidden {
                    tracing::warn!(
                        tenant = %crate::answer::printable(tenant),
                        model = %crate::answer::printable(model),
                        "a call with inputs the proxy can't see was answered without its usage; such calls of this tenant and model are held until one is billed"
                    );
                }
            }
            turn => drop(turn),
        }
        if let Some(usage) = settlement.usage {
            self.settled
                .increment(usage.tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0));
        }
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(spend) = settlement.spend {
            crate::metrics::spent(&log.upstream, &self.model_label, &self.tenant_label, spend);
            let served_budget = self
                .member_budgets
                .contains(&log.upstream)
                .then(|| format!("{}{}", self.upstream_budget, log.upstream));
            for key in std::iter::once(&log.key)
                .chain(self.tenant_key.iter())
                .chain(self.budgets.iter())
                .chain(served_budget.iter())
            {
                self.live.spent(key, spend);
            }
        }
        log.write(settlement);
    }

    /// A call with inputs the proxy can't see teaches what such calls are billed (an error's
    /// usage, the estimate, teaches nothing).
    fn learn(&self, settlement: &Settlement, billed: bool, status: u16) {
        let Some((tenant, model)) = &self.hidden else {
            return;
        };
        if !billed || !(200..400).contains(&status) {
            return;
        }
        let reported = settlement.reported;
        let input = reported
            .input
            .unwrap_or(0)
            .saturating_add(reported.cache_read.unwrap_or(0))
            .saturating_add(reported.cache_write.unwrap_or(0));
        let most = self.learned.learned(tenant, model, input);
        // The fleet learns it too (in a task: the settlement doesn't wait on Redis).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (records, tenant, model) =
                (Arc::clone(&self.records), tenant.clone(), model.clone());
            runtime.spawn(async move {
                records.share_ceiling(&tenant, &model, most).await;
            });
        }
    }
}
