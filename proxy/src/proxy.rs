//! One request through the proxy: route, size, tenant, toll, upstream, answer.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tollgate::http::{Gate, UsageScanner, Verdict};
use tollgate::{Currency, Error, Estimator, Limits, Permit, Registry, Usage};

use crate::config::{Config, Family, LimitsFrom, OtherPaths, TenantFrom, Upstream};
use crate::errors::{Kind, answer};
use crate::metrics::{Metrics, UpstreamMetrics};
use crate::relay::{Meter, Relay, Seen};
use crate::route::{self, NoRoute, azure_deployment};
use crate::tenant::{KEY_HEADERS, Tenancy};

/// The client the proxy sends with.
pub(crate) type UpstreamClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The most of an upstream 429's body that is read (its error code and pause are in it).
const ERROR_BODY_MOST: usize = 1 << 20;
/// The longest an upstream 429's body is waited for.
const ERROR_BODY_WAIT: Duration = Duration::from_secs(10);
/// The most keys per upstream whose levels `/metrics` shows.
const LEVEL_KEYS: usize = 1_024;
/// The longest a model name may be in a key; longer ones are cut (clients choose them).
const MODEL_MOST: usize = 128;
/// What follows an upstream's name in its tenants' keys: `{upstream}:tenant:{tenant}`.
const TENANT_PART: &str = "tenant:";

/// An upstream, ready: its gate, its client, its metrics.
pub struct Upstreamed {
    /// Its name.
    pub name: String,
    pub(crate) config: Upstream,
    pub(crate) family: Family,
    pub(crate) gate: Gate,
    pub(crate) estimator: Arc<dyn Estimator>,
    client: UpstreamClient,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// The real key, in the header the family sends it in (with virtual keys).
    real_key: Option<(HeaderName, HeaderValue)>,
    tenant_limits: Option<Limits>,
    pub(crate) metrics: UpstreamMetrics,
    /// Keys seen lately, for their levels in `/metrics`.
    keys: Mutex<HashSet<String>>,
}

/// Everything the requests share.
pub struct Shared {
    pub(crate) upstreams: Vec<Arc<Upstreamed>>,
    routes: Vec<Upstream>,
    other: OtherPaths,
    max_body: usize,
    tenancy: Tenancy,
    tenant_header: Option<HeaderName>,
    registry: Arc<Registry>,
    pub(crate) draining: AtomicBool,
    pub(crate) metrics: Metrics,
}

/// Why the proxy can't start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

fn client(http2_only: bool) -> Result<UpstreamClient, StartError> {
    // rustls needs one crypto provider for the process; ring is the one built in.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    // The platform's roots, or webpki's where the platform has none (a bare container).
    let builder = match builder.with_native_roots() {
        Ok(builder) => builder,
        Err(_) => hyper_rustls::HttpsConnectorBuilder::new().with_webpki_roots(),
    };
    let connector = builder
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    let mut client = Client::builder(TokioExecutor::new());
    client
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1_024)
        .http2_only(http2_only);
    Ok(client.build(connector))
}

fn key_fn(
    upstream: &Upstream,
) -> impl Fn(&http::request::Parts, &Value) -> String + Send + Sync + 'static {
    let name = upstream.name.clone();
    let per_model = upstream.per_model;
    let azure = upstream.family() == Family::Azure;
    move |parts, body| {
        if !per_model {
            return name.clone();
        }
        let path = parts.uri.path();
        let model = if azure {
            path.find("/openai/deployments/")
                .and_then(|at| azure_deployment(&path[at..]))
                .map(|(deployment, _)| deployment)
        } else {
            body.get("model").and_then(Value::as_str)
        };
        match model {
            Some(model) => {
                let cut = model
                    .char_indices()
                    .nth(MODEL_MOST)
                    .map_or(model, |(at, _)| &model[..at]);
                // Clients choose model names: one that starts like a tenant's key
                // (`{name}:tenant:...`) is moved aside, so that it can never be that key.
                if cut.starts_with(TENANT_PART) {
                    format!("{name}:model:{cut}")
                } else {
                    format!("{name}:{cut}")
                }
            }
            None => name.clone(),
        }
    }
}

impl Shared {
    /// Builds every upstream's gate and client on `registry`.
    pub fn new(config: &Config, registry: Arc<Registry>) -> Result<Shared, StartError> {
        // The recorder first: the counters made below must be its.
        let metrics = Metrics::new();
        let tenancy = Tenancy::new(&config.tenants);
        let mut upstreams = Vec::new();
        for u in &config.upstreams {
            let profile = u.library_profile().map_err(StartError)?;
            let builder = Gate::builder(profile.clone())
                .registry(Arc::clone(&registry))
                .key(key_fn(u))
                .timeout(Some(u.timeout))
                .retries(u.retries);
            let builder = match &u.limits {
                LimitsFrom::Fixed(limits) => builder.limits(limits.clone()),
                LimitsFrom::Headers => builder.limits_from_headers(Duration::from_secs(60)),
            };
            let what =
                |e: &dyn std::fmt::Display| StartError(format!("upstream `{}`: {e}", u.name));
            let gate = builder.build().map_err(|e| what(&e))?;
            let estimator =
                tollgate::estimators::estimator(profile.estimator_name()).map_err(|e| what(&e))?;
            let real_key = match &u.api_key_env {
                Some(var) if tenancy.has_virtual_keys() => {
                    let key = std::env::var(var).map_err(|_| {
                        what(&format!(
                            "the environment variable {var} (api_key_env) is not set"
                        ))
                    })?;
                    let (name, value) = match u.family() {
                        Family::Anthropic => (HeaderName::from_static("x-api-key"), key),
                        Family::Azure => (HeaderName::from_static("api-key"), key),
                        Family::OpenAi => (header::AUTHORIZATION, format!("Bearer {key}")),
                    };
                    let mut value = HeaderValue::try_from(value)
                        .map_err(|_| what(&format!("{var} is not a valid header value")))?;
                    value.set_sensitive(true);
                    Some((name, value))
                }
                _ => None,
            };
            if tenancy.has_virtual_keys() && real_key.is_none() {
                return Err(what(
                    &"virtual keys are configured: give the upstream its real key with api_key_env",
                ));
            }
            let scheme = u.url.scheme().cloned().unwrap_or(http::uri::Scheme::HTTPS);
            let authority = u
                .url
                .authority()
                .cloned()
                .ok_or_else(|| what(&"the url has no host"))?;
            upstreams.push(Arc::new(Upstreamed {
                name: u.name.clone(),
                config: u.clone(),
                family: u.family(),
                gate,
                estimator,
                client: client(u.http2_only)?,
                scheme,
                authority,
                real_key,
                tenant_limits: config.tenants.limits.clone(),
                metrics: UpstreamMetrics::new(&u.name),
                keys: Mutex::new(HashSet::new()),
            }));
        }
        let tenant_header = match &config.tenants.from {
            TenantFrom::Header(name) => Some(name.clone()),
            _ => None,
        };
        Ok(Shared {
            upstreams,
            routes: config.upstreams.clone(),
            other: config.other_paths,
            max_body: config.max_body,
            tenancy,
            tenant_header,
            registry,
            draining: AtomicBool::new(false),
            metrics,
        })
    }

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
                let limits = if tenant_key {
                    upstream.tenant_limits.clone()
                } else {
                    match &upstream.config.limits {
                        LimitsFrom::Fixed(limits) => Some(limits.clone()),
                        LimitsFrom::Headers => None,
                    }
                };
                let Some(limits) = limits else { continue };
                let Ok(limiter) = self.registry.limiter(&key, &limits) else {
                    continue;
                };
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

impl Upstreamed {
    fn saw_key(&self, key: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.contains(key) {
            return;
        }
        if keys.len() >= LEVEL_KEYS {
            keys.clear();
        }
        keys.insert(key.to_owned());
    }
}

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

fn strip_hop_by_hop(headers: &mut HeaderMap) {
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

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// The upstream's answer as the client gets it.
fn relay_response(head: http::response::Parts, body: Relay) -> Response<Relay> {
    let mut response = Response::new(body);
    *response.status_mut() = head.status;
    let mut headers = head.headers;
    strip_hop_by_hop(&mut headers);
    *response.headers_mut() = headers;
    response
}

/// What a refusal of the gate (or a tenant's window) is answered with.
fn refusal(family: Family, err: &Error, metrics: &UpstreamMetrics) -> Response<Relay> {
    match err {
        Error::Timeout { needed, .. } => {
            metrics.local_429s.increment(1);
            let wait = needed.unwrap_or(Duration::from_secs(1));
            answer(
                family,
                Kind::RateLimited,
                &format!(
                    "tollgate-proxy: this call would wait past its deadline for its share of the rate limit; retry after {:.1} s ({err})",
                    wait.as_secs_f64()
                ),
                Some(wait),
            )
        }
        Error::QueueFull { .. } => {
            metrics.local_429s.increment(1);
            answer(
                family,
                Kind::RateLimited,
                &format!("tollgate-proxy: {err}"),
                Some(Duration::from_secs(1)),
            )
        }
        Error::CostExceedsCapacity { .. } | Error::InvalidCost { .. } => answer(
            family,
            Kind::Invalid,
            &format!("tollgate-proxy: this call can never pass: {err}"),
            None,
        ),
        _ => answer(
            family,
            Kind::Unavailable,
            &format!("tollgate-proxy: {err}"),
            None,
        ),
    }
}

/// A tenant's charge comes back: the call never reached the provider.
fn give_back(permit: Option<Permit>) {
    if let Some(permit) = permit {
        tokio::spawn(async move {
            let mut nothing = Usage::default();
            nothing.tokens = Some(0);
            nothing.output_tokens = Some(0);
            let _ = permit.settle_usage(nothing).await;
        });
    }
}

/// Reads an upstream 429's body: at most 1 MiB, for at most 10 s.
async fn read_error(body: Incoming) -> Bytes {
    let read = Limited::new(body, ERROR_BODY_MOST).collect();
    match tokio::time::timeout(ERROR_BODY_WAIT, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        _ => Bytes::new(),
    }
}

/// Serves one request.
pub async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Response<Relay> {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = serve(&shared, request).await;
    tracing::info!(
        %method,
        path = %path,
        status = response.status().as_u16(),
        local = response.headers().contains_key("x-tollgate"),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "request",
    );
    response
}

async fn serve(shared: &Arc<Shared>, request: Request<Incoming>) -> Response<Relay> {
    match request.uri().path() {
        "/healthz" => {
            let draining = shared.draining.load(Ordering::Relaxed);
            let mut response = Response::new(Relay::full(Bytes::from_static(if draining {
                b"draining\n"
            } else {
                b"ok\n"
            })));
            if draining {
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            return response;
        }
        "/metrics" => {
            shared.record_levels().await;
            let mut response = Response::new(Relay::full(Bytes::from(shared.metrics.render())));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            return response;
        }
        _ => {}
    }
    let path_and_query = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let route = match route::route(&shared.routes, shared.other, &path_and_query) {
        Ok(route) => route,
        Err(NoRoute::Malformed) => {
            return answer(
                Family::OpenAi,
                Kind::Invalid,
                "tollgate-proxy: this path is never forwarded",
                None,
            );
        }
        Err(_) => {
            return answer(
                Family::OpenAi,
                Kind::NotFound,
                &format!(
                    "tollgate-proxy: no upstream serves {}",
                    request.uri().path()
                ),
                None,
            );
        }
    };
    let upstream = Arc::clone(&shared.upstreams[route.upstream]);
    let family = upstream.family;
    // Refused before a byte of the body is read, and before anything is charged.
    if content_length(request.headers()).is_some_and(|n| n > shared.max_body as u64) {
        upstream.metrics.too_large.increment(1);
        return answer(family, Kind::TooLarge, &too_large(shared.max_body), None);
    }
    let tenant = match shared.tenancy.tenant(request.headers()) {
        Ok(tenant) => tenant,
        Err(_) => {
            return answer(
                family,
                Kind::Unauthorized,
                "tollgate-proxy: unknown API key",
                None,
            );
        }
    };
    let (mut parts, body) = request.into_parts();
    let body = match Limited::new(body, shared.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err)
            if err
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            upstream.metrics.too_large.increment(1);
            return answer(family, Kind::TooLarge, &too_large(shared.max_body), None);
        }
        Err(_) => {
            return answer(
                family,
                Kind::Invalid,
                "tollgate-proxy: the request body could not be read",
                None,
            );
        }
    };
    let uri = Uri::builder()
        .scheme(upstream.scheme.clone())
        .authority(upstream.authority.clone())
        .path_and_query(route.path.as_str())
        .build();
    let Ok(uri) = uri else {
        return answer(
            family,
            Kind::Invalid,
            "tollgate-proxy: the path can't be forwarded",
            None,
        );
    };
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some(name) = &shared.tenant_header {
        parts.headers.remove(name);
    }
    if let Some((name, value)) = &upstream.real_key {
        for key_header in KEY_HEADERS {
            parts.headers.remove(key_header);
        }
        parts.headers.insert(name.clone(), value.clone());
    }
    match route.kind {
        route::Kind::Unmetered => {
            let request = Request::from_parts(parts, Full::new(body));
            match upstream.client.request(request).await {
                Ok(response) => {
                    let (head, incoming) = response.into_parts();
                    relay_response(head, Relay::plain(incoming))
                }
                Err(err) => unreachable_upstream(&upstream, &err),
            }
        }
        route::Kind::Metered => {
            // The usage can only be read from bytes as they were written.
            parts.headers.remove(header::ACCEPT_ENCODING);
            metered(shared, upstream, tenant, parts, body).await
        }
    }
}

fn too_large(most: usize) -> String {
    format!(
        "tollgate-proxy: the request body is larger than {most} bytes, the most this proxy takes"
    )
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

async fn metered(
    shared: &Arc<Shared>,
    upstream: Arc<Upstreamed>,
    tenant: Option<String>,
    parts: http::request::Parts,
    body: Bytes,
) -> Response<Relay> {
    let family = upstream.family;
    let gate = &upstream.gate;
    let started = tokio::time::Instant::now();
    let deadline = gate.deadline();
    // The tenant's own windows first: while it waits at the organization's key it holds
    // only its own tokens, never the organization's, so no order of waiting can deadlock,
    // and a tenant past its windows can't take the organization's line from the others.
    let mut tenant_permit = None;
    if let (Some(tenant), Some(limits)) = (&tenant, &upstream.tenant_limits) {
        let key = format!("{}:{TENANT_PART}{tenant}", upstream.name);
        let limiter = match shared.registry.limiter(&key, limits) {
            Ok(limiter) => limiter,
            Err(err) => return refusal(family, &err, &upstream.metrics),
        };
        upstream.saw_key(&key);
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let cost = match gate.cost_of(&value, Some(limits)) {
            Ok(cost) => cost,
            Err(err) => return refusal(family, &err, &upstream.metrics),
        };
        match limiter.acquire_until(cost, deadline).await {
            Ok(permit) => tenant_permit = Some(permit),
            Err(err) => return refusal(family, &err, &upstream.metrics),
        }
    }
    let mut attempt = 0;
    loop {
        let mut call = match gate.admit_until(&parts, &body, deadline).await {
            Ok(call) => call,
            Err(err) => {
                give_back(tenant_permit);
                return refusal(family, &err, &upstream.metrics);
            }
        };
        upstream.saw_key(call.key());
        let request = Request::from_parts(parts.clone(), Full::new(body.clone()));
        call.sending();
        let response = match upstream.client.request(request).await {
            Ok(response) => response,
            Err(err) => return unreachable_upstream(&upstream, &err),
        };
        let (head, incoming) = response.into_parts();
        if head.status != StatusCode::TOO_MANY_REQUESTS {
            call.respond(head.status, &head.headers, None).await;
            let stream = is_event_stream(&head.headers) || call.is_stream();
            let meter = Meter {
                call,
                tenant: tenant_permit,
                scanner: UsageScanner::new(stream),
                upstream: Arc::clone(&upstream),
                request: stream.then(|| body.clone()),
                seen: stream.then(Seen::default),
            };
            return relay_response(head, Relay::metered(incoming, meter));
        }
        let error = read_error(incoming).await;
        let mut headers = head.headers.clone();
        // Gemini says when only in the body: the gate reads pauses from headers.
        if !headers.contains_key(header::RETRY_AFTER)
            && !headers.contains_key("retry-after-ms")
            && let Some(delay) = tollgate::headers::retry_info_delay(&error)
        {
            let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            headers.insert("retry-after-ms", HeaderValue::from(ms));
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(delay.as_secs() + u64::from(delay.subsec_nanos() > 0)),
            );
        }
        let verdict = call.respond(head.status, &headers, Some(&error)).await;
        let give_up = |mut head: http::response::Parts, headers: HeaderMap, retry: bool| {
            head.headers = headers;
            if !retry {
                // A spent quota: the SDKs must not retry it.
                head.headers
                    .insert("x-should-retry", HeaderValue::from_static("false"));
            }
            relay_response(head, Relay::full(error.clone()))
        };
        match verdict {
            Verdict::Permanent { .. } => {
                upstream.metrics.upstream_429s_permanent.increment(1);
                give_back(tenant_permit);
                return give_up(head, headers, false);
            }
            Verdict::Transient { pause } if attempt < gate.retries() => {
                upstream.metrics.upstream_429s_transient.increment(1);
                let key = call.key().to_owned();
                drop(call);
                match gate.retry_within(&key, attempt, pause, deadline, started) {
                    Ok(delay) => tokio::time::sleep(delay).await,
                    Err(_) => {
                        give_back(tenant_permit);
                        return give_up(head, headers, true);
                    }
                }
                attempt += 1;
            }
            _ => {
                upstream.metrics.upstream_429s_transient.increment(1);
                give_back(tenant_permit);
                return give_up(head, headers, true);
            }
        }
    }
}
