//! `/metrics` in Prometheus's text format: the library's own meters (admissions, waits,
//! timeouts, 429s by kind, settled and refunded tokens, per key) and the proxy's (local 429s,
//! upstream 429s, bodies too large, streams cut short, settled tokens, per upstream; each
//! key's level, read at each scrape). Tenant keys are hashed before any meter sees them.

use std::sync::OnceLock;

use metrics::Counter;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus recorder (installed once; `None` when another recorder was
/// installed first, as an embedding program may do).
#[derive(Debug, Clone)]
pub struct Metrics {
    handle: Option<PrometheusHandle>,
}

impl Metrics {
    /// Installs the recorder, once per process.
    pub fn new() -> Metrics {
        let handle = HANDLE
            .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
            .clone();
        Metrics { handle }
    }

    /// The text of every meter.
    pub fn render(&self) -> String {
        match &self.handle {
            Some(handle) => handle.render(),
            None => "# another metrics recorder was installed before the proxy's\n".to_owned(),
        }
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// One upstream's meters.
#[derive(Debug, Clone)]
pub struct UpstreamMetrics {
    /// Calls answered 429 here because their wait would pass the deadline.
    pub local_429s: Counter,
    /// The upstream's transient 429s (retried here, or handed on).
    pub upstream_429s_transient: Counter,
    /// The upstream's permanent 429s (a spent quota).
    pub upstream_429s_permanent: Counter,
    /// Bodies refused with 413.
    pub too_large: Counter,
    /// Bodies the client stopped reading before the usage passed.
    pub cut_short: Counter,
    /// Tokens settled at the upstream's keys.
    pub settled_tokens: Counter,
    /// Upstreams that could not be reached.
    pub upstream_errors: Counter,
}

impl UpstreamMetrics {
    /// The meters of upstream `name`.
    pub fn new(name: &str) -> UpstreamMetrics {
        let named = |metric: &'static str| metrics::counter!(metric, "upstream" => name.to_owned());
        UpstreamMetrics {
            local_429s: named("tollgate_proxy_local_429s_total"),
            upstream_429s_transient: metrics::counter!("tollgate_proxy_upstream_429s_total", "upstream" => name.to_owned(), "kind" => "transient"),
            upstream_429s_permanent: metrics::counter!("tollgate_proxy_upstream_429s_total", "upstream" => name.to_owned(), "kind" => "permanent"),
            too_large: named("tollgate_proxy_too_large_total"),
            cut_short: named("tollgate_proxy_cut_short_total"),
            settled_tokens: named("tollgate_proxy_settled_tokens_total"),
            upstream_errors: named("tollgate_proxy_upstream_errors_total"),
        }
    }
}
