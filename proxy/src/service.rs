//! The proxy's own paths, answered before any route: liveness (`/healthz`), readiness
//! (`/readyz`, the store's last answer) and, with its token, `/metrics`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use tollgate::Limits;

use crate::relay::Relay;
use crate::state::Shared;

/// How long `/readyz` trusts the store's last answer.
const READY_FOR: Duration = Duration::from_secs(1);
/// How long `/readyz` waits for the store.
const READY_WAIT: Duration = Duration::from_secs(2);

/// Whether a request may read `/metrics` on the clients' listener: only with the configured
/// token (compared by hash, in no time that depends on how much of it matched). Without a
/// token configured, `/metrics` is the admin listener's alone.
fn may_read_metrics(shared: &Shared, headers: &http::HeaderMap) -> bool {
    use sha2::{Digest, Sha256};
    let Some(token) = &shared.config.metrics_token else {
        return false;
    };
    let Ok(Some(given)) = crate::tenant::presented_key(headers) else {
        return false;
    };
    Sha256::digest(given.as_bytes()) == Sha256::digest(token.as_bytes())
}

/// `/metrics` as Prometheus reads it.
pub(crate) async fn metrics_page(shared: &Shared) -> (Bytes, HeaderValue) {
    shared.record_levels().await;
    (
        Bytes::from(shared.metrics.render()),
        HeaderValue::from_static("text/plain; version=0.0.4"),
    )
}

/// The answer to a service path (liveness, readiness, metrics); `None` for any other path.
pub(crate) async fn answer(
    shared: &Shared,
    path: &str,
    headers: &http::HeaderMap,
) -> Option<Response<Relay>> {
    let draining = shared.draining.load(Ordering::Relaxed);
    let plain = |status: StatusCode, text: &'static str| {
        let mut response = Response::new(Relay::full(Bytes::from_static(text.as_bytes())));
        *response.status_mut() = status;
        response
    };
    match path {
        "/healthz" => Some(if draining {
            plain(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        } else {
            plain(StatusCode::OK, "ok\n")
        }),
        "/readyz" => Some(if draining {
            plain(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        } else if ready(shared).await {
            plain(StatusCode::OK, "ready\n")
        } else {
            plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the store can't be reached\n",
            )
        }),
        // Every tenant's name, spend and levels: for operators only.
        "/metrics" if may_read_metrics(shared, headers) => {
            let (text, content_type) = metrics_page(shared).await;
            let mut response = Response::new(Relay::full(text));
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type);
            Some(response)
        }
        "/metrics" => Some(plain(
            StatusCode::NOT_FOUND,
            "not here: /metrics is served on admin_listen, or here with the token metrics_token_env names\n",
        )),
        _ => None,
    }
}

/// Whether the store answers: a snapshot of a key of the proxy's own, at most once a second.
async fn ready(shared: &Shared) -> bool {
    let now = tokio::time::Instant::now();
    if let Some((at, ready)) = *shared.ready.lock().unwrap_or_else(|e| e.into_inner())
        && now.duration_since(at) < READY_FOR
    {
        return ready;
    }
    let limits = Limits::parse("1000000/s", "").expect("a valid rate");
    let answered = match shared.registry.limiter("tollgate-proxy:ready", &limits) {
        Ok(limiter) => matches!(
            tokio::time::timeout(READY_WAIT, limiter.snapshot()).await,
            Ok(Ok(_))
        ),
        Err(_) => false,
    };
    if !answered {
        shared.proxy_metrics.store_errors.increment(1);
        tracing::warn!("readiness: the store can't be reached");
    }
    *shared.ready.lock().unwrap_or_else(|e| e.into_inner()) = Some((now, answered));
    answered
}
