//! One attempt of a metered call at the member its pool chose (its upstream, without a pool):
//! the request (the head the toll read, or the member's own; the body the gate read), sent
//! within the attempt's time, and its answer's head read, its body decoded and bounded in its
//! gaps. A member that fails the attempt (no connection, no answer in its time, a head and
//! then nothing) is told to the pool, and the call moves on while it can.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::header;
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::time::Instant;
use tollgate::http::Call;

use crate::answer::{ErrorKind, Reject};
use crate::head::upstream_head;
use crate::pool::Turn;
use crate::sending::Sending;
use crate::state::ReadyUpstream;
use crate::upstream::{Gapped, UpstreamBody};

/// An attempt's answer, its head read and its body not yet, with what the attempt was.
pub(crate) struct Answered {
    pub(crate) head: http::response::Parts,
    pub(crate) body: Gapped<UpstreamBody>,
    pub(crate) call: Call,
    pub(crate) member: Arc<ReadyUpstream>,
    /// The key the call was admitted at.
    pub(crate) key: String,
    /// Whether a member the call has not yet failed at is left beside this one.
    pub(crate) another: bool,
    pub(crate) pooled: bool,
}

/// Sends the attempt of `turn` and reads its answer's head (and, where the call could move to
/// another member, its body's first frame) in the attempt's time. `None`: the member failed
/// and the call moves on.
pub(crate) async fn send(
    sending: &mut Sending<'_, '_>,
    turn: Turn,
) -> Result<Option<Answered>, Reject> {
    let Turn {
        member,
        mut call,
        others,
        another,
        pooled,
        attempt_timeout,
    } = turn;
    sending.upstream = Arc::clone(&member);
    let key = call.key().to_owned();
    let request = request(sending, &member, &mut call)?;
    call.sending();
    let sent = Instant::now();
    let until = attempt_until(sent, sending.deadline, others, attempt_timeout);
    let Some(response) = go(sending, &member, &mut call, request, until, others).await? else {
        return Ok(None);
    };
    let took = sent.elapsed();
    sending.upstream_time += took;
    member.metrics.upstream_seconds.record(took.as_secs_f64());
    let (mut head, incoming) = response.into_parts();
    // The usage is read, and the organisation's keys masked, in the bytes as written: an
    // answer compressed though none was asked for is decoded first.
    let mut incoming = UpstreamBody::new(incoming)
        .decoding(&mut head.headers, true)
        .map_err(|codings| unreadable_coding(&member, &codings))?;
    if others > 0
        && head.status.is_success()
        && !first_frame(sending, &member, &mut incoming, until).await?
    {
        return Ok(None);
    }
    let body = Gapped::new(
        incoming,
        member.config.chunk_timeout,
        member.metrics.stalled.clone(),
    );
    Ok(Some(Answered {
        head,
        body,
        call,
        member,
        key,
        another,
        pooled,
    }))
}

/// How long an attempt sent at `sent` may wait for its answer's first byte, for a call whose
/// deadline is `deadline`, with `others` members it could move to. A member of a pool with
/// another to move to waits for its share of the call's time left (or the pool's
/// `attempt_timeout`), not all of it: a member that hangs can't hold the call to its deadline.
fn attempt_until(
    sent: Instant,
    deadline: Option<Instant>,
    others: usize,
    attempt_timeout: Option<Duration>,
) -> Option<Instant> {
    deadline.map(|deadline| {
        if others == 0 {
            return deadline;
        }
        let left = deadline.saturating_duration_since(sent);
        let share =
            attempt_timeout.unwrap_or_else(|| left / u32::try_from(others + 1).unwrap_or(u32::MAX));
        (sent + share).min(deadline)
    })
}

/// The attempt's request to `member`: its head there, and the body the gate read.
fn request(
    sending: &Sending<'_, '_>,
    member: &ReadyUpstream,
    call: &mut Call,
) -> Result<Request<Full<Bytes>>, Reject> {
    let exchange = sending.exchange;
    // The head the toll read serves its own upstream; a pool's other member gets its own.
    let mut head = if member.name == exchange.upstream.name {
        sending.head.clone()
    } else {
        let client = exchange.client.clone();
        let mut head = upstream_head(exchange.shared, member, client, &exchange.route.path)?;
        // The usage can only be read from bytes as they were written.
        head.headers.remove(header::ACCEPT_ENCODING);
        head
    };
    let body = match call.body() {
        Some(rewritten) => {
            call.rewrite_headers(&mut head.headers);
            head.headers.remove(header::CONTENT_LENGTH);
            rewritten.clone()
        }
        None => exchange.body.clone(),
    };
    Ok(Request::from_parts(head, Full::new(body)))
}

/// Sends `request` to `member` and waits for its answer's head until `until`. `None`: the
/// member failed and the call moves on.
async fn go(
    sending: &mut Sending<'_, '_>,
    member: &ReadyUpstream,
    call: &mut Call,
    request: Request<Full<Bytes>>,
    until: Option<Instant>,
    others: usize,
) -> Result<Option<http::Response<Incoming>>, Reject> {
    let pooled = !sending.members.pool.members.is_empty();
    let response = match until {
        Some(until) => match tokio::time::timeout_at(until, member.client.request(request)).await {
            Ok(response) => response,
            Err(_) if others > 0 && sending.in_time() => {
                // The member said nothing in its time: the call moves on. It went out, and
                // its charges at the member stay (its provider may bill it).
                member.metrics.upstream_timeouts.increment(1);
                member.metrics.moved.increment(1);
                tracing::warn!(upstream = %member.name, "a pool member said nothing in its attempt's time; the call moves on");
                sending.members.member_failed(member, false);
                return Ok(None);
            }
            Err(_) => {
                if pooled {
                    sending.members.member_failed(member, false);
                }
                return Err(silent_upstream(member));
            }
        },
        None => member.client.request(request).await,
    };
    match response {
        Ok(response) => Ok(Some(response)),
        Err(err) => {
            // Nothing reached the provider: nothing was billed.
            for budget in call.detach() {
                crate::admit::refund(budget).await;
            }
            if pooled {
                sending.members.member_failed(member, false);
            }
            if sending.members.any_left() {
                // Another member may be reachable: this one failed the call.
                member.metrics.upstream_errors.increment(1);
                member.metrics.moved.increment(1);
                return Ok(None);
            }
            Err(unreachable_upstream(member, &err))
        }
    }
}

/// Whether the body's first frame came within the attempt's time. A member of a pool with
/// another to move to has answered only then: a head and then nothing (a stalled stream
/// behind a live front) is a member that hangs, and the call moves on.
async fn first_frame(
    sending: &mut Sending<'_, '_>,
    member: &ReadyUpstream,
    incoming: &mut UpstreamBody,
    until: Option<Instant>,
) -> Result<bool, Reject> {
    let ahead = match until {
        Some(until) => tokio::time::timeout_at(until, incoming.read_ahead())
            .await
            .unwrap_or_else(|_| Err("no first byte in the attempt's time".into())),
        None => incoming.read_ahead().await,
    };
    let Err(err) = ahead else {
        return Ok(true);
    };
    member.metrics.upstream_timeouts.increment(1);
    sending.members.member_failed(member, false);
    if !sending.in_time() {
        return Err(silent_upstream(member));
    }
    member.metrics.moved.increment(1);
    tracing::warn!(upstream = %member.name, error = %err, "a pool member sent a head and then nothing in its attempt's time; the call moves on");
    Ok(false)
}

/// An upstream that could not be reached.
pub(crate) fn unreachable_upstream(
    upstream: &ReadyUpstream,
    err: &hyper_util::client::legacy::Error,
) -> Reject {
    tracing::warn!(upstream = %upstream.name, error = %err, "the upstream could not be reached");
    Reject::new(
        ErrorKind::Upstream,
        format!(
            "tollgate-proxy: upstream `{}` could not be reached",
            upstream.name
        ),
    )
    .counted(&upstream.metrics.upstream_errors)
}

/// An answer in a content coding the proxy must read (to mask the organisation's keys, or read
/// the usage) and can't.
pub(crate) fn unreadable_coding(upstream: &ReadyUpstream, codings: &str) -> Reject {
    let codings = crate::answer::printable(codings);
    tracing::warn!(upstream = %upstream.name, %codings, "the upstream answered in a content coding the proxy can't read");
    Reject::new(
        ErrorKind::Upstream,
        format!(
            "tollgate-proxy: upstream `{}` answered in a content coding the proxy can't read ({codings}), though it was asked for none",
            upstream.name,
        ),
    )
    .counted(&upstream.metrics.upstream_errors)
}

/// An upstream that said nothing by the call's deadline.
pub(crate) fn silent_upstream(upstream: &ReadyUpstream) -> Reject {
    tracing::warn!(upstream = %upstream.name, "the upstream said nothing by the call's deadline");
    Reject::new(
        ErrorKind::UpstreamTimeout,
        format!(
            "tollgate-proxy: upstream `{}` did not answer by the call's deadline ({:?}); the call was sent and stays charged",
            upstream.name, upstream.config.timeout
        ),
    )
    .counted(&upstream.metrics.upstream_timeouts)
}
