//! Sending a request upstream and reading what comes back, through the library's attempt
//! step: each attempt pays its toll at the organization's key, goes out with the body the gate
//! read (decoded, or asking a stream for its usage), must get its answer's head by the call's
//! deadline, and is delivered metered, retried after the provider's pause, or handed on.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use http_body_util::Full;
use tokio::time::Instant;
use tollgate::Error;
use tollgate::http::{Attempts, Next, Settlement};

use crate::admit::refusal;
use crate::answer::{Kind, answer};
use crate::config::LimitsFrom;
use crate::relay::{Gapped, Relay, Unread};
use crate::state::{Shared, Upstreamed};
use crate::tenant::{KEY_HEADERS, Tenant};

/// The headers that belong to one connection, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The request's head as it goes upstream: its URI on the upstream, no hop-by-hop headers, no
/// tenant header or secret, the real key in place of a virtual one.
pub(crate) fn upstream_head(
    shared: &Shared,
    upstream: &Upstreamed,
    mut parts: http::request::Parts,
    path: &str,
) -> Option<http::request::Parts> {
    let uri = Uri::builder()
        .scheme(upstream.scheme.clone())
        .authority(upstream.authority.clone())
        .path_and_query(path)
        .build()
        .ok()?;
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(crate::config::SECRET_HEADER);
    if let Some(name) = &shared.tenant_header {
        parts.headers.remove(name);
    }
    if let Some((name, value)) = &upstream.real_key {
        for key_header in KEY_HEADERS {
            parts.headers.remove(key_header);
        }
        parts.headers.insert(name.clone(), value.clone());
    }
    Some(parts)
}

/// The upstream's answer as the client gets it.
fn relayed(head: http::response::Parts, body: Relay) -> Response<Relay> {
    let mut response = Response::new(body);
    *response.status_mut() = head.status;
    let mut headers = head.headers;
    strip_hop_by_hop(&mut headers);
    *response.headers_mut() = headers;
    response
}

fn unreachable_upstream(
    upstream: &Upstreamed,
    err: &hyper_util::client::legacy::Error,
) -> Response<Relay> {
    upstream.metrics.upstream_errors.increment(1);
    tracing::warn!(upstream = %upstream.name, error = %err, "the upstream could not be reached");
    answer(
        upstream.family,
        Kind::Upstream,
        &format!(
            "tollgate-proxy: upstream `{}` could not be reached",
            upstream.name
        ),
        None,
    )
}

fn silent_upstream(upstream: &Upstreamed) -> Response<Relay> {
    upstream.metrics.upstream_timeouts.increment(1);
    tracing::warn!(upstream = %upstream.name, "the upstream said nothing by the call's deadline");
    answer(
        upstream.family,
        Kind::UpstreamTimeout,
        &format!(
            "tollgate-proxy: upstream `{}` did not answer by the call's deadline ({:?}); the call was sent and stays charged",
            upstream.name, upstream.config.timeout
        ),
        None,
    )
}

/// Sends an unmetered request (a free route, or a path passed on), bounded by the upstream's
/// timeout for its head and its chunk timeout for its body.
pub(crate) async fn unmetered(
    upstream: &Upstreamed,
    parts: http::request::Parts,
    body: Bytes,
    unread: &Unread,
) -> Response<Relay> {
    let request = Request::from_parts(parts, Full::new(body));
    let deadline = Instant::now() + upstream.config.timeout;
    match tokio::time::timeout_at(deadline, upstream.client.request(request)).await {
        Err(_) => silent_upstream(upstream),
        Ok(Err(err)) => unreachable_upstream(upstream, &err),
        Ok(Ok(response)) => {
            let (head, incoming) = response.into_parts();
            let body = Relay::plain(
                incoming,
                upstream.config.chunk_timeout,
                upstream.metrics.stalled.clone(),
                unread.clone(),
            );
            relayed(head, body)
        }
    }
}

/// What a metered request's log line says, filled as it becomes known.
#[derive(Debug, Default)]
pub(crate) struct Line {
    pub(crate) upstream: String,
    pub(crate) route: &'static str,
    pub(crate) tenant: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) estimated: u64,
    pub(crate) wait_ms: f64,
    pub(crate) status: u16,
    pub(crate) retries: u32,
}

impl Line {
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

/// Sends a metered request: each attempt pays its toll, goes out, and is delivered metered,
/// retried, or handed on.
pub(crate) async fn metered(
    shared: &Shared,
    upstream: Arc<Upstreamed>,
    parts: http::request::Parts,
    body: Bytes,
    mut attempts: Attempts,
    tenant: Option<&Tenant>,
    route: &'static str,
) -> Response<Relay> {
    let family = upstream.family;
    let deadline = attempts.deadline();
    let started = Instant::now();
    let line = Arc::new(Mutex::new(Line {
        upstream: upstream.name.clone(),
        route,
        tenant: tenant.map(|t| t.name.clone()),
        model: attempts.estimated().model().map(crate::proxy::printable),
        estimated: attempts.estimated().input_tokens() + attempts.estimated().most_output(),
        ..Line::default()
    }));
    {
        let line = Arc::clone(&line);
        let settled = upstream.metrics.settled_tokens.clone();
        attempts.on_settled(Box::new(move |settlement: &Settlement| {
            if let Some(usage) = settlement.usage {
                settled.increment(usage.tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0));
            }
            line.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .write(settlement);
        }));
    }
    let mut upstream_time = std::time::Duration::ZERO;
    loop {
        let admission = Instant::now();
        let mut call = match attempts.admit().await {
            Ok(call) => call,
            Err(err) => {
                // Refused for want of time: which window could not pay, by the key's levels.
                let short = match (&err, &upstream.config.limits) {
                    (Error::Timeout { .. }, LimitsFrom::Fixed(limits)) => {
                        let estimated = attempts.estimated();
                        match shared.registry.limiter(estimated.key(), limits) {
                            Ok(limiter) => {
                                let cost = upstream.gate.cost_of(estimated, Some(limits));
                                crate::admit::short_of(&limiter, cost).await
                            }
                            Err(_) => None,
                        }
                    }
                    _ => None,
                };
                let refused = refusal(shared, &upstream, &err, short);
                return answer(family, refused.kind, &refused.message, refused.retry_after);
            }
        };
        let waited = admission.elapsed();
        upstream.saw_key(call.key());
        let mut head = parts.clone();
        let sent_body = match call.body() {
            Some(rewritten) => {
                call.rewrite_headers(&mut head.headers);
                head.headers.remove(header::CONTENT_LENGTH);
                rewritten.clone()
            }
            None => body.clone(),
        };
        let request = Request::from_parts(head, Full::new(sent_body));
        call.sending();
        let sent = Instant::now();
        let response = match deadline {
            Some(deadline) => {
                match tokio::time::timeout_at(deadline, upstream.client.request(request)).await {
                    Ok(response) => response,
                    Err(_) => return silent_upstream(&upstream),
                }
            }
            None => upstream.client.request(request).await,
        };
        let response = match response {
            Ok(response) => response,
            Err(err) => return unreachable_upstream(&upstream, &err),
        };
        let took = sent.elapsed();
        upstream_time += took;
        upstream.metrics.upstream_seconds.record(took.as_secs_f64());
        let (head, incoming) = response.into_parts();
        {
            let mut line = line.lock().unwrap_or_else(PoisonError::into_inner);
            line.wait_ms += waited.as_secs_f64() * 1e3;
            line.status = head.status.as_u16();
            line.retries = attempts.retried();
        }
        let gapped = Gapped::new(
            incoming,
            upstream.config.chunk_timeout,
            upstream.metrics.stalled.clone(),
        );
        let next = match attempts
            .answered(call, head.status, &head.headers, gapped)
            .await
        {
            Ok(next) => next,
            Err(_) => {
                // A 429 whose body broke off: handed on without it.
                return relayed(head, Relay::full(Bytes::new()));
            }
        };
        let give_up = |mut head: http::response::Parts, body: Bytes, retry: bool| {
            if !retry {
                // A spent quota: the SDKs must not retry it.
                head.headers
                    .insert("x-should-retry", HeaderValue::from_static("false"));
            }
            head.headers.remove(header::CONTENT_LENGTH);
            relayed(head, Relay::full(body))
        };
        match next {
            Next::Deliver(metered) => {
                let total = started.elapsed();
                let waited = line.lock().unwrap_or_else(PoisonError::into_inner).wait_ms / 1e3;
                let added = total.as_secs_f64() - waited - upstream_time.as_secs_f64();
                upstream.metrics.added_seconds.record(added.max(0.0));
                let stream = is_event_stream(&head.headers) || attempts.estimated().is_stream();
                let mut head = head;
                if stream {
                    // The stream may lose the usage chunk the gate asked for on the way.
                    head.headers.remove(header::CONTENT_LENGTH);
                }
                let cut_short = upstream.metrics.cut_short.clone();
                let unread = Unread {
                    timeout: shared.bounds.write_timeout,
                    counter: shared.proxy_metrics.unread_closed.clone(),
                };
                return relayed(head, Relay::metered(metered, stream, cut_short, unread));
            }
            Next::Retry(delay) => {
                upstream.metrics.upstream_429s_transient.increment(1);
                tokio::time::sleep(delay).await;
            }
            Next::HandOn { body, .. } => {
                upstream.metrics.upstream_429s_transient.increment(1);
                return give_up(head, body, true);
            }
            Next::Refused { body, .. } => {
                upstream.metrics.upstream_429s_permanent.increment(1);
                return give_up(head, body, false);
            }
            _ => {
                return answer(
                    family,
                    Kind::Upstream,
                    "tollgate-proxy: an answer this version can't handle",
                    None,
                );
            }
        }
    }
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}
