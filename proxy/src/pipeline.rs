//! One request through the proxy, phase by phase, each in a file of its own and each answering
//! a [`Reject`] when it refuses: the route (`route.rs`), the tenant (`tenant.rs`), the body
//! (`body.rs`), the stored objects it names (`owned.rs`), its head upstream (`head.rs`); for a
//! metered call, the gate's estimate and its pool (`estimate.rs`), the toll (`admit.rs`) and its
//! settlement (`settle.rs`); then the sending (`send.rs`: each attempt's turn from `pool.rs`,
//! the attempt in `attempt.rs`, its answer in `deliver.rs`), and the body the client reads
//! (`relay.rs`). A rejection becomes an answer in one place, here, through
//! [`Reject::answer`]; the labels a request is counted and logged under are filled here as the
//! phases learn them.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::answer::Reject;
use crate::config::Family;
use crate::exchange::Exchange;
use crate::metrics::ProxyMetrics;
use crate::relay::Relay;
use crate::route::RouteKind;
use crate::state::Shared;

/// Serves one request. `in_flight` (the connection's mark of a request in flight) is held until
/// the client has the whole answer.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    in_flight: Box<dyn Send + Sync>,
) -> Response<Relay> {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let mut labels = Labels::default();
    let response = match through(&shared, request, &mut labels).await {
        Ok(response) => response,
        Err(reject) => reject.answer(labels.family),
    };
    // Nothing the organisation holds reaches a client: an upstream that echoes the real key
    // (in a header, an error, a stream) has it masked on the way.
    let (mut parts, body) = response.into_parts();
    let local = parts.headers.contains_key("x-tollgate") || labels.route == "service";
    crate::relay::mask_headers(&shared.secrets, &mut parts.headers);
    let response = Response::from_parts(parts, body.holding(in_flight).scrubbing(&shared.secrets));
    let upstream = labels.upstream.as_deref().unwrap_or("-");
    let status = response.status().as_u16();
    ProxyMetrics::request(upstream, labels.route, status);
    if local {
        tracing::info!(
            %method,
            route = labels.route,
            upstream,
            status,
            local = true,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "request",
        );
    }
    response
}

/// What a request is counted and logged under, and the shape a rejection is answered in.
struct Labels {
    /// The upstream's name, once the route chose one.
    upstream: Option<String>,
    /// The route's name: `service`, `refused` before a route is found, `chat`, ...
    route: &'static str,
    family: Family,
}

impl Default for Labels {
    fn default() -> Labels {
        Labels {
            upstream: None,
            route: "refused",
            family: Family::OpenAi,
        }
    }
}

/// The request through its phases (a service path is answered at once), filling `labels` as
/// they learn them.
async fn through(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
    labels: &mut Labels,
) -> Result<Response<Relay>, Reject> {
    let service = crate::service::answer(shared, request.uri().path(), request.headers()).await;
    if let Some(response) = service {
        labels.route = "service";
        return Ok(response);
    }
    let (client, incoming) = request.into_parts();
    let route = shared.routes.phase(&client)?;
    let upstream = Arc::clone(&shared.upstreams[route.upstream]);
    labels.upstream = Some(upstream.name.clone());
    labels.route = route.name;
    labels.family = upstream.family;
    // Who the tenant is costs nothing and changes nothing; a body larger than the proxy takes
    // is refused first, before a byte of it is read and before anything is charged.
    let tenant = shared
        .tenancy
        .phase(&client, route.kind, shared.virtual_key_paths);
    crate::body::declared(shared, &upstream, &client.headers)?;
    let tenant = tenant?;
    // The body's room in the memory for bodies is held until the answer's head is out.
    let (body, _held) = crate::body::read(shared, &upstream, &client.headers, incoming).await?;
    let exchange = Exchange {
        shared,
        upstream,
        route,
        tenant,
        client,
        body,
    };
    let mut creates = crate::owned::check_unmetered(&exchange).await?;
    let head = crate::head::upstream_head(
        shared,
        &exchange.upstream,
        exchange.client.clone(),
        &exchange.route.path,
    )?;
    let response = match exchange.route.kind {
        RouteKind::Free | RouteKind::Passed => crate::send::unmetered(&exchange, head).await?,
        RouteKind::Metered => {
            let estimate = crate::estimate::phase(&exchange, head)?;
            let mut prepared = crate::admit::toll(&exchange, estimate).await?;
            if exchange.tenant.is_some() {
                // Nothing is sent if it is refused: the tenant's charges come back.
                let read = prepared.attempts.estimated().body();
                creates = crate::owned::check(&exchange, read.unwrap_or(&exchange.body)).await?;
            }
            let log = crate::settle::on_settled(&exchange, &mut prepared);
            crate::send::metered(&exchange, prepared, log).await?
        }
    };
    Ok(match (creates, exchange.tenant) {
        // A metered call to a collection the proxy doesn't know (embeddings, Anthropic's
        // messages) stores nothing the proxy must follow.
        (Some(any_id), Some(tenant))
            if response.status().is_success()
                && !(any_id && exchange.route.kind == RouteKind::Metered) =>
        {
            let (parts, body) = response.into_parts();
            let owners = Arc::clone(&shared.owners);
            Response::from_parts(parts, body.catching(owners, tenant.name, any_id))
        }
        _ => response,
    })
}
