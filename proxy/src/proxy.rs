//! One request through the proxy, phase by phase: the service paths, the route (`route.rs`),
//! the tenant (`tenant.rs`), the body and the toll (`admit.rs`), the upstream (`forward.rs`),
//! the body the client reads (`relay.rs`), and the proxy's own answers (`answer.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tollgate::Limits;

use crate::admit::{BodyFail, content_length, prepare, read_body};
use crate::answer::{ErrorKind, answer};
use crate::config::{Family, KeyPaths};
use crate::forward::{metered, unmetered, upstream_head};
use crate::metrics::ProxyMetrics;
use crate::relay::Relay;
use crate::route::{self, NoRoute};
use crate::state::Shared;

/// How long `/readyz` trusts the store's last answer.
const READY_FOR: Duration = Duration::from_secs(1);
/// How long `/readyz` waits for the store.
const READY_WAIT: Duration = Duration::from_secs(2);

/// Serves one request. `in_flight` (the connection's mark of a request in flight) is held until
/// the client has the whole answer.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    in_flight: Box<dyn Send + Sync>,
) -> Response<Relay> {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let (response, upstream, route) = serve(&shared, request).await;
    let status = response.status().as_u16();
    ProxyMetrics::request(upstream.as_deref().unwrap_or("-"), route, status);
    if response.headers().contains_key("x-tollgate") || route == "service" {
        tracing::info!(
            %method,
            route,
            upstream = upstream.as_deref().unwrap_or("-"),
            status,
            local = true,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "request",
        );
    }
    // Nothing the organisation holds reaches a client: an upstream that echoes the real key
    // (in a header, an error, a stream) has it masked on the way.
    let (mut parts, body) = response.into_parts();
    crate::relay::mask_headers(&shared.secrets, &mut parts.headers);
    Response::from_parts(parts, body.holding(in_flight).scrubbing(&shared.secrets))
}

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

/// The service paths: liveness, readiness, metrics.
async fn service(
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

/// The request through its phases; with the upstream's name and the route's, for metrics.
async fn serve(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
) -> (Response<Relay>, Option<String>, &'static str) {
    if let Some(response) = service(shared, request.uri().path(), request.headers()).await {
        return (response, None, "service");
    }
    let path_and_query = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let route = match route::route(
        &shared.routes,
        shared.other,
        request.method(),
        request.headers(),
        &path_and_query,
    ) {
        Ok(route) => route,
        Err(NoRoute::Malformed) => {
            let family = route::speaks(request.headers()).unwrap_or(Family::OpenAi);
            let response = answer(
                family,
                ErrorKind::Invalid,
                "tollgate-proxy: this path is never forwarded (`..`, `//`, `;`, or a percent-encoding of anything but a letter, a digit or -._~)",
                None,
            );
            return (response, None, "refused");
        }
        Err(NoRoute::Refused { hint, family }) => {
            return (
                answer(family, ErrorKind::NotFound, &hint, None),
                None,
                "refused",
            );
        }
    };
    let upstream = Arc::clone(&shared.upstreams[route.upstream]);
    let name = Some(upstream.name.clone());
    let family = upstream.family;
    let local = |kind: ErrorKind, message: &str| answer(family, kind, message, None);
    // Refused before a byte of the body is read, and before anything is charged.
    if content_length(request.headers()).is_some_and(|n| n > shared.max_body as u64) {
        upstream.metrics.too_large.increment(1);
        return (
            local(ErrorKind::TooLarge, &too_large(shared.max_body)),
            name,
            route.name,
        );
    }
    let tenant = match shared.tenancy.tenant(request.headers()) {
        Ok(tenant) => tenant,
        Err(refused) => {
            return (
                local(ErrorKind::Unauthorized, refused.message()),
                name,
                route.name,
            );
        }
    };
    // A virtual key reaches the routes it is allowed: metered and free ones by default.
    if tenant.as_ref().is_some_and(|t| t.virtual_key)
        && route.kind == route::RouteKind::Passed
        && shared.virtual_key_paths == KeyPaths::Metered
    {
        let message = format!(
            "tollgate-proxy: `{}` is not metered, and virtual keys reach only the metered routes (virtual_key_paths = \"any\" allows more)",
            request.uri().path()
        );
        return (local(ErrorKind::NotFound, &message), name, route.name);
    }
    let (parts, incoming) = request.into_parts();
    let (body, _held) = match read_body(shared, &parts.headers, incoming).await {
        Ok(read) => read,
        Err(fail) => {
            let (kind, message) = match fail {
                BodyFail::TooLarge => {
                    upstream.metrics.too_large.increment(1);
                    (ErrorKind::TooLarge, too_large(shared.max_body))
                }
                BodyFail::Slow => {
                    shared.proxy_metrics.slow_bodies.increment(1);
                    (
                        ErrorKind::SlowBody,
                        format!(
                            "tollgate-proxy: the request body came too slowly (it must come within {:?}, at least {} bytes a second after 5 s)",
                            shared.bounds.body_timeout, shared.bounds.body_min_rate
                        ),
                    )
                }
                BodyFail::Busy => {
                    shared.proxy_metrics.busy.increment(1);
                    (
                        ErrorKind::Unavailable,
                        "tollgate-proxy: too many request bodies are held at once; retry shortly"
                            .to_owned(),
                    )
                }
                BodyFail::Draining => (
                    ErrorKind::Unavailable,
                    "tollgate-proxy: the proxy is shutting down; nothing was sent".to_owned(),
                ),
                BodyFail::Broken => (
                    ErrorKind::Invalid,
                    "tollgate-proxy: the request body could not be read".to_owned(),
                ),
            };
            return (local(kind, &message), name, route.name);
        }
    };
    let client = parts.clone();
    // The stored objects the call names must be its tenant's (a metered body is checked as
    // the gate decodes it, below).
    let object_path =
        route::normalize(path_and_query.split('?').next().unwrap_or("/")).unwrap_or_default();
    let mut creates = None;
    if let Some(tenant) = tenant.as_ref()
        && route.kind != route::RouteKind::Metered
    {
        let encoded = parts
            .headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        if encoded && !body.is_empty() {
            return (
                local(
                    ErrorKind::UnsupportedEncoding,
                    "tollgate-proxy: with tenants, a body on this path is read as sent: send it without content-encoding",
                ),
                name,
                route.name,
            );
        }
        match owned(shared, tenant, family, &parts.method, &object_path, &body).await {
            Ok(create) => creates = create,
            Err(refused) => return (refused, name, route.name),
        }
    }
    let Some(mut parts) = upstream_head(shared, &upstream, parts, &route.path) else {
        return (
            local(
                ErrorKind::Invalid,
                "tollgate-proxy: the path can't be forwarded",
            ),
            name,
            route.name,
        );
    };
    let response = match route.kind {
        route::RouteKind::Free | route::RouteKind::Passed => {
            let unread = crate::relay::Unread {
                timeout: shared.bounds.write_timeout,
                counter: shared.proxy_metrics.unread_closed.clone(),
            };
            unmetered(shared, &upstream, parts, body, &unread).await
        }
        route::RouteKind::Metered => {
            // The usage can only be read from bytes as they were written.
            parts.headers.remove(header::ACCEPT_ENCODING);
            match prepare(shared, &upstream, tenant.as_ref(), &parts, &body).await {
                Ok(prepared) => {
                    if let Some(tenant) = tenant.as_ref() {
                        let read = prepared.attempts.estimated().body().unwrap_or(&body);
                        match owned(shared, tenant, family, &parts.method, &object_path, read).await
                        {
                            Ok(create) => creates = create,
                            // Nothing was sent: the tenant's charges come back.
                            Err(refused) => return (refused, name, route.name),
                        }
                    }
                    metered(
                        shared,
                        Arc::clone(&upstream),
                        client,
                        &route.path,
                        body,
                        prepared,
                        tenant.as_ref(),
                        route.name,
                    )
                    .await
                }
                Err(refused) => answer(family, refused.kind, &refused.message, refused.retry_after),
            }
        }
    };
    let response = match (creates, tenant) {
        // A metered call to a collection the proxy doesn't know (embeddings, Anthropic's
        // messages) stores nothing the proxy must follow.
        (Some(any_id), Some(tenant))
            if response.status().is_success()
                && !(any_id && route.kind == route::RouteKind::Metered) =>
        {
            let (parts, body) = response.into_parts();
            Response::from_parts(
                parts,
                body.catching(Arc::clone(&shared.owners), tenant.name, any_id),
            )
        }
        _ => response,
    };
    (response, name, route.name)
}

/// Whether `tenant` may make this call, as far as stored objects go: every object it names
/// (in its path or its body) must be the tenant's, and it may not list the organisation's.
/// Answers whether the call may create objects (their ids are then recorded as the tenant's):
/// `Some(any_id)`, `any_id` when the collection is one the proxy doesn't know (its answer's id
/// is the tenant's whatever its prefix).
async fn owned(
    shared: &Shared,
    tenant: &crate::tenant::Tenant,
    family: Family,
    method: &http::Method,
    path: &str,
    body: &[u8],
) -> Result<Option<bool>, Response<Relay>> {
    // Read as the upstream will read it: a body a strict parser refuses (a byte-order mark,
    // UTF-16, a `NaN`) still names the ids it names.
    let value = crate::lenient::read(body);
    let touches = crate::owners::touches(method, path, &value);
    if touches.lists {
        return Err(answer(
            family,
            ErrorKind::Forbidden,
            "tollgate-proxy: listing stored objects is refused here: the organisation's list holds every tenant's; keep the ids your calls create",
            None,
        ));
    }
    for id in &touches.names {
        match shared.owners.owner(id).await {
            Ok(Some(owner)) if owner == tenant.name => {}
            Ok(_) => {
                return Err(answer(
                    family,
                    ErrorKind::NoSuchObject,
                    &format!(
                        "No object found with id '{}'.",
                        crate::answer::printable(id)
                    ),
                    None,
                ));
            }
            Err(err) => {
                shared.proxy_metrics.store_errors.increment(1);
                tracing::warn!(error = %err, "the owner of a stored object could not be read");
                return Err(answer(
                    family,
                    ErrorKind::Unavailable,
                    "tollgate-proxy: the store can't be reached; nothing was sent",
                    None,
                ));
            }
        }
    }
    Ok(touches.creates.then_some(touches.any_id))
}

fn too_large(most: usize) -> String {
    format!(
        "tollgate-proxy: the request body is larger than {most} bytes, the most this proxy takes"
    )
}
