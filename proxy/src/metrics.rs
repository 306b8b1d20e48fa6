//! `/metrics` in Prometheus's text format: the library's own meters (admissions, waits,
//! timeouts, 429s by kind, settled and refunded tokens, per key) and the proxy's (requests by
//! status and route, local and upstream 429s, bodies refused, streams a client left, upstreams
//! that stalled, settled tokens, latency of the upstream and of the proxy itself; each key's
//! level, read at each scrape). Waits and latencies are histograms (`_bucket` series), so that a
//! fleet's can be summed. Labels are bounded: upstreams, routes and models from the
//! configuration (and the profiles' known models), configured tenants; everything a client
//! invents is aggregated under one label.

use std::sync::OnceLock;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The buckets of every histogram, in seconds: from a millisecond (the proxy's own work) to two
/// minutes (a long wait for the toll, or a slow answer).
const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The label of tenants and keys the configuration doesn't name.
pub(crate) const OTHER: &str = "other";

/// The process's Prometheus recorder (installed once; `None` when another recorder was
/// installed first, as an embedding program may do).
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    handle: Option<PrometheusHandle>,
}

impl Metrics {
    /// Installs the recorder, once per process.
    pub(crate) fn new() -> Metrics {
        let handle = HANDLE
            .get_or_init(|| {
                PrometheusBuilder::new()
                    .set_buckets(&BUCKETS)
                    .ok()?
                    .install_recorder()
                    .ok()
            })
            .clone();
        Metrics { handle }
    }

    /// The text of every meter.
    pub(crate) fn render(&self) -> String {
        match &self.handle {
            Some(handle) => handle.render(),
            None => "# another metrics recorder was installed before the proxy's\n".to_owned(),
        }
    }
}

/// The proxy's own meters that belong to no upstream.
#[derive(Debug, Clone)]
pub(crate) struct ProxyMetrics {
    /// Requests the store could not serve (Redis down).
    pub(crate) store_errors: Counter,
    /// Bodies answered 408: too slow, or past their deadline.
    pub(crate) slow_bodies: Counter,
    /// Bodies answered 503 because the memory for bodies was full.
    pub(crate) busy: Counter,
    /// Connections closed for having nothing in flight too long.
    pub(crate) idle_closed: Counter,
    /// Connections closed to make room for a new one, or refused for want of room.
    pub(crate) crowded_closed: Counter,
    pub(crate) crowded_refused: Counter,
    /// Connections closed, or answers cut, because the client stopped reading.
    pub(crate) unread_closed: Counter,
}

impl ProxyMetrics {
    pub(crate) fn new() -> ProxyMetrics {
        ProxyMetrics {
            store_errors: metrics::counter!("tollgate_proxy_store_errors_total"),
            slow_bodies: metrics::counter!("tollgate_proxy_slow_bodies_total"),
            busy: metrics::counter!("tollgate_proxy_busy_total"),
            idle_closed: metrics::counter!("tollgate_proxy_connections_closed_total", "reason" => "idle"),
            crowded_closed: metrics::counter!("tollgate_proxy_connections_closed_total", "reason" => "crowded"),
            crowded_refused: metrics::counter!("tollgate_proxy_connections_closed_total", "reason" => "refused"),
            unread_closed: metrics::counter!("tollgate_proxy_connections_closed_total", "reason" => "unread"),
        }
    }

    /// Counts a request answered with `status` on `route` of `upstream` (`-` when it had
    /// none).
    pub(crate) fn request(upstream: &str, route: &'static str, status: u16) {
        metrics::counter!(
            "tollgate_proxy_requests_total",
            "upstream" => upstream.to_owned(),
            "route" => route,
            "status" => status.to_string()
        )
        .increment(1);
    }
}

/// One upstream's meters.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamMetrics {
    /// Calls answered 429 here because their wait would pass the deadline.
    pub(crate) local_429s: Counter,
    /// The upstream's transient 429s (retried here, or handed on).
    pub(crate) upstream_429s_transient: Counter,
    /// The upstream's permanent 429s (a spent quota).
    pub(crate) upstream_429s_permanent: Counter,
    /// Bodies refused with 413.
    pub(crate) too_large: Counter,
    /// Streams the client left before their end.
    pub(crate) cut_short: Counter,
    /// Answers whose body went silent past the chunk timeout.
    pub(crate) stalled: Counter,
    /// Tokens settled at the upstream's keys.
    pub(crate) settled_tokens: Counter,
    /// Upstreams that could not be reached, or said nothing by the deadline.
    pub(crate) upstream_errors: Counter,
    pub(crate) upstream_timeouts: Counter,
    /// How long the upstream took to answer's head (each attempt).
    pub(crate) upstream_seconds: Histogram,
    /// What the proxy added to a call: its time to the answer's head, less the wait for the
    /// toll and the upstream's own time.
    pub(crate) added_seconds: Histogram,
    /// Calls refused because a budget they spend from was spent.
    pub(crate) budget_refusals: Counter,
    /// Pool calls moved to another member after a 429 or a 5xx.
    pub(crate) moved: Counter,
    /// Times the member was ejected from its pool (failures in a row, or a spent quota).
    pub(crate) ejected: Counter,
}

impl UpstreamMetrics {
    /// The meters of upstream `name`.
    pub(crate) fn new(name: &str) -> UpstreamMetrics {
        let named = |metric: &'static str| metrics::counter!(metric, "upstream" => name.to_owned());
        UpstreamMetrics {
            local_429s: named("tollgate_proxy_local_429s_total"),
            upstream_429s_transient: metrics::counter!("tollgate_proxy_upstream_429s_total", "upstream" => name.to_owned(), "kind" => "transient"),
            upstream_429s_permanent: metrics::counter!("tollgate_proxy_upstream_429s_total", "upstream" => name.to_owned(), "kind" => "permanent"),
            too_large: named("tollgate_proxy_too_large_total"),
            cut_short: named("tollgate_proxy_cut_short_total"),
            stalled: named("tollgate_proxy_upstream_stalled_total"),
            settled_tokens: named("tollgate_proxy_settled_tokens_total"),
            upstream_errors: named("tollgate_proxy_upstream_errors_total"),
            upstream_timeouts: named("tollgate_proxy_upstream_timeouts_total"),
            upstream_seconds: metrics::histogram!("tollgate_proxy_upstream_seconds", "upstream" => name.to_owned()),
            added_seconds: metrics::histogram!("tollgate_proxy_added_seconds", "upstream" => name.to_owned()),
            budget_refusals: named("tollgate_proxy_budget_refusals_total"),
            moved: named("tollgate_proxy_pool_moves_total"),
            ejected: named("tollgate_proxy_pool_ejections_total"),
        }
    }
}

/// Counts what a call cost, in micro-dollars at its model's prices, by upstream, model and
/// tenant (labels bounded: the configuration's models and the profile's known ones, the
/// configured tenants; the rest `other`).
pub(crate) fn spent(upstream: &str, model: &str, tenant: &str, micros: u64) {
    metrics::counter!(
        "tollgate_proxy_spend_micros_total",
        "upstream" => upstream.to_owned(),
        "model" => model.to_owned(),
        "tenant" => tenant.to_owned()
    )
    .increment(micros);
}
