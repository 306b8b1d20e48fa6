//! Sending a request upstream. An unmetered request goes once. A metered one goes attempt
//! after attempt until one is delivered: each asks its pool for its turn (`pool.rs`: the
//! member, its toll paid at the organization's key there), goes out and has its answer's head
//! read (`attempt.rs`), and its answer is delivered metered, retried after the provider's
//! pause, moved to another member, or handed on (`deliver.rs`). The call on its way is a
//! [`Sending`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use http_body_util::Full;
use tokio::time::Instant;
use tollgate::Error;

use crate::admit::Prepared;
use crate::answer::Reject;
use crate::attempt::{silent_upstream, unreachable_upstream, unreadable_coding};
use crate::exchange::Exchange;
use crate::pool::{Members, NotAdmitted};
use crate::relay::{Relay, Unread, relayed};
use crate::sending::Sending;
use crate::settle::CallLog;
use crate::upstream::UpstreamBody;

/// Sends an unmetered request (a free route, or a path passed on) with its `head` upstream, bounded by the upstream's
/// timeout for its head and its chunk timeout for its body.
pub(crate) async fn unmetered(
    exchange: &Exchange<'_>,
    head: http::request::Parts,
) -> Result<Response<Relay>, Reject> {
    let (shared, upstream) = (exchange.shared, &exchange.upstream);
    let request = Request::from_parts(head, Full::new(exchange.body.clone()));
    let deadline = Instant::now() + upstream.config.timeout;
    let response = match tokio::time::timeout_at(deadline, upstream.client.request(request)).await {
        Err(_) => return Err(silent_upstream(upstream)),
        Ok(Err(err)) => return Err(unreachable_upstream(upstream, &err)),
        Ok(Ok(response)) => response,
    };
    let (mut head, incoming) = response.into_parts();
    // The organisation's keys are masked in what the client reads: in the bytes as written,
    // so a compressed answer is decoded first.
    let masking = !shared.secrets.is_empty();
    let incoming = UpstreamBody::new(incoming)
        .decoding(&mut head.headers, masking)
        .map_err(|codings| unreadable_coding(upstream, &codings))?;
    let body = Relay::plain(
        incoming,
        upstream.config.chunk_timeout,
        upstream.metrics.stalled.clone(),
        unread(exchange),
    );
    Ok(relayed(head, body))
}

/// How long the client may leave an answer unread.
fn unread(exchange: &Exchange<'_>) -> Unread {
    Unread {
        timeout: exchange.shared.bounds.write_timeout,
        counter: exchange.shared.proxy_metrics.unread_closed.clone(),
    }
}

/// Sends a metered request: each attempt pays its toll, goes out, and is delivered metered,
/// retried, or handed on. A call of a pool goes to the member that can admit it soonest, and
/// moves to another after a 429 or a 5xx before its answer's first byte, within its deadline.
/// `log` is the call's log line, which its settlement writes.
pub(crate) async fn metered(
    exchange: &Exchange<'_>,
    prepared: Prepared,
    log: Arc<Mutex<CallLog>>,
) -> Result<Response<Relay>, Reject> {
    let Prepared {
        head,
        attempts,
        tenant_view,
        hidden,
        pool,
        ..
    } = prepared;
    let started = Instant::now();
    let mut sending = Sending {
        exchange,
        members: Members {
            shared: exchange.shared,
            client: &exchange.client,
            pool,
            failed: Vec::new(),
        },
        deadline: attempts.deadline(),
        attempts,
        head,
        upstream: Arc::clone(&exchange.upstream),
        log,
        tenant_view,
        // Its bill teaches what such calls cost: read to its end even if the client leaves it.
        drain: hidden.is_some(),
        started,
        upstream_time: Duration::ZERO,
        unread: unread(exchange),
    };
    loop {
        let admission = Instant::now();
        let turn = match sending
            .members
            .admit(&mut sending.attempts, &sending.upstream)
            .await
        {
            Ok(turn) => turn,
            Err(not) => return Err(refused(&sending, not).await),
        };
        let waited = admission.elapsed();
        if let Some(tenant) = &exchange.tenant {
            let label = if tenant.configured {
                tenant.name.as_str()
            } else {
                crate::metrics::OTHER
            };
            let tokens = turn.call.cost().map_or(0, |c| c.tokens);
            exchange.shared.live.fair.admitted(
                Instant::now(),
                turn.call.key(),
                label,
                tokens,
                waited,
            );
        }
        let Some(answered) = crate::attempt::send(&mut sending, turn).await? else {
            continue;
        };
        if let Some(response) = crate::deliver::answered(&mut sending, answered, waited).await? {
            return Ok(response);
        }
    }
}

/// Why the call was not admitted, as the client is told: for want of time, with the window
/// that could not pay, by the key's levels.
async fn refused(sending: &Sending<'_, '_>, not: NotAdmitted) -> Reject {
    let err = match not {
        NotAdmitted::Budget(refused) => return refused,
        NotAdmitted::Gate(err) => err,
    };
    let shared = sending.exchange.shared;
    let estimated = sending.attempts.estimated();
    let gate = sending.attempts.gate();
    let short = match (&err, gate.configured_limits(estimated.key())) {
        (Error::Timeout { .. }, Some(limits)) => {
            match (
                shared.registry.limiter(estimated.key(), limits),
                gate.cost_of(estimated, Some(limits)),
            ) {
                (Ok(limiter), Ok(cost)) => crate::refusal::short_of(&limiter, cost).await,
                _ => None,
            }
        }
        _ => None,
    };
    crate::refusal::refusal(shared, &sending.upstream, &err, short)
}
