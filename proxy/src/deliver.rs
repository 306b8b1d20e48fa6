//! What becomes of an attempt's answer: delivered metered (its usage read as it passes, its
//! tenant's own rate-limit headers written), retried after the provider's pause, moved to
//! another member of its pool (a 429 or a 5xx before its first byte), or handed on as the
//! provider wrote it.

use std::sync::PoisonError;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use tokio::time::Instant;
use tollgate::http::{Call, MeteredBody, Next, Profile, Verdict};

use crate::admit::TenantView;
use crate::answer::{ErrorKind, Reject};
use crate::attempt::Answered;
use crate::relay::{Relay, relayed};
use crate::sending::Sending;
use crate::state::ReadyUpstream;
use crate::upstream::{Gapped, UpstreamBody};

/// The response the client gets of an attempt's answer, or `None` when the call goes again (a
/// retry, or another member of its pool). `waited`: how long the attempt waited for its
/// admission.
pub(crate) async fn answered(
    sending: &mut Sending<'_, '_>,
    answered: Answered,
    waited: Duration,
) -> Result<Option<Response<Relay>>, Reject> {
    let Answered {
        head,
        body,
        call,
        member,
        key,
        another,
        pooled,
    } = answered;
    log_attempt(sending, waited, &head, &member, &key);
    let refused = head.status == StatusCode::TOO_MANY_REQUESTS;
    if another && sending.in_time() && (refused || head.status.is_server_error()) {
        move_on(sending, &member, call, &head, body.into_inner(), &key).await;
        return Ok(None);
    }
    let next = match sending
        .attempts
        .answered(call, head.status, &head.headers, body)
        .await
    {
        Ok(next) => next,
        // A 429 whose body broke off: handed on without it.
        Err(_) => return Ok(Some(relayed(head, Relay::full(Bytes::new())))),
    };
    if pooled {
        if head.status.is_server_error() {
            sending.members.member_failed(&member, false);
        } else if !refused {
            member.health.served();
        }
    }
    step(sending, next, head, &member, &key, pooled).await
}

/// What the log line learns of an attempt that was answered.
fn log_attempt(
    sending: &Sending<'_, '_>,
    waited: Duration,
    head: &http::response::Parts,
    member: &ReadyUpstream,
    key: &str,
) {
    let mut log = sending.log.lock().unwrap_or_else(PoisonError::into_inner);
    log.wait_ms += waited.as_secs_f64() * 1e3;
    log.status = head.status.as_u16();
    log.retries = sending.attempts.retried();
    log.upstream = member.name.clone();
    log.key = key.to_owned();
}

/// A call of a pool with another member to try, in time: a 429 (transient, past the deadline,
/// or a spent quota: that member's) or a 5xx before the answer's first byte moves it there.
/// This member's key keeps the attempt's charge (and a 429's pause); the tenant's windows and
/// the budgets go with the call, to settle with the usage of the member that serves it.
async fn move_on(
    sending: &mut Sending<'_, '_>,
    member: &ReadyUpstream,
    mut call: Call,
    head: &http::response::Parts,
    incoming: UpstreamBody,
    key: &str,
) {
    let refused = head.status == StatusCode::TOO_MANY_REQUESTS;
    let error = if refused {
        Some(short_body(incoming, sending.deadline).await)
    } else {
        None
    };
    let verdict = call
        .respond(head.status, &head.headers, error.as_deref())
        .await;
    match verdict {
        Verdict::Permanent { .. } => {
            member.metrics.upstream_429s_permanent.increment(1);
            // Its quota is spent: passed over at once, by every call.
            sending.members.member_failed(member, true);
        }
        Verdict::Transient { pause } => {
            member.metrics.upstream_429s_transient.increment(1);
            if let Some(pause) = pause {
                paused(sending, key, pause).await;
            }
            sending.members.pass_over(member);
        }
        _ => sending.members.member_failed(member, false),
    }
    if refused {
        sending.exchange.shared.live.upstream_429(key);
    }
    // A 429 or an error before the first byte is billed nothing: the member's budget gets its
    // charge back (its windows keep the request, as its provider counts it).
    for budget in call.detach() {
        crate::admit::refund(budget).await;
    }
    member.metrics.moved.increment(1);
}

/// Records the provider's pause of `key`, for the live view and the fleet.
async fn paused(sending: &Sending<'_, '_>, key: &str, pause: Duration) {
    let shared = sending.exchange.shared;
    shared.live.paused(key, pause);
    let until = crate::tally::unix_ms()
        .saturating_add(u64::try_from(pause.as_millis()).unwrap_or(u64::MAX));
    shared.owners.record_pause(key, until, pause).await;
}

/// What the attempt step decided: the response, or `None` to go again.
async fn step(
    sending: &mut Sending<'_, '_>,
    next: Next<Gapped<UpstreamBody>>,
    head: http::response::Parts,
    member: &ReadyUpstream,
    key: &str,
    pooled: bool,
) -> Result<Option<Response<Relay>>, Reject> {
    let live = &sending.exchange.shared.live;
    match next {
        Next::Deliver(metered) => Ok(Some(deliver(sending, metered, head, member))),
        Next::Retry(delay) => {
            member.metrics.upstream_429s_transient.increment(1);
            live.upstream_429(key);
            paused(sending, key, delay).await;
            if pooled {
                // The member is paused for its provider's pause: the next pick weighs it.
                member.metrics.moved.increment(1);
            } else {
                tokio::time::sleep(delay).await;
            }
            Ok(None)
        }
        Next::HandOn { body, .. } => {
            member.metrics.upstream_429s_transient.increment(1);
            live.upstream_429(key);
            Ok(Some(give_up(head, body, true)))
        }
        Next::Refused { body, .. } => {
            if pooled {
                sending.members.member_failed(member, true);
            }
            member.metrics.upstream_429s_permanent.increment(1);
            live.upstream_429(key);
            Ok(Some(give_up(head, body, false)))
        }
        _ => Err(Reject::new(
            ErrorKind::Upstream,
            "tollgate-proxy: an answer this version can't handle",
        )),
    }
}

/// The answer delivered metered: its usage read as it passes, the call settled at its end.
fn deliver(
    sending: &Sending<'_, '_>,
    metered: Box<MeteredBody<Gapped<UpstreamBody>>>,
    mut head: http::response::Parts,
    member: &ReadyUpstream,
) -> Response<Relay> {
    let total = sending.started.elapsed();
    let waited = sending
        .log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .wait_ms
        / 1e3;
    let added = total.as_secs_f64() - waited - sending.upstream_time.as_secs_f64();
    member.metrics.added_seconds.record(added.max(0.0));
    let stream =
        tollgate::http::is_event_stream(&head.headers) || sending.attempts.estimated().is_stream();
    if stream {
        // The stream may lose the usage chunk the gate asked for on the way.
        head.headers.remove(header::CONTENT_LENGTH);
    }
    if let Some(view) = &sending.tenant_view {
        tenant_headers(&member.profile, view, &mut head.headers);
    }
    let cut_short = member.metrics.cut_short.clone();
    let body = Relay::metered(
        metered,
        stream,
        cut_short,
        sending.unread.clone(),
        sending.drain,
    );
    relayed(head, body)
}
/// The rate-limit headers of a tenant's answer: for each currency, the tighter of its own
/// windows (as they stand now) and the organization's count the upstream sent, in the
/// provider's own header names.
fn tenant_headers(profile: &Profile, view: &TenantView, headers: &mut HeaderMap) {
    let elapsed = view.at.elapsed().as_secs_f64();
    let now = std::time::SystemTime::now();
    for names in profile.header_names() {
        let currency = names.currency;
        // The window of the currency that holds least now, refilled since the snapshot.
        let tightest = view
            .snapshot
            .of(currency)
            .map(|window| {
                let rate = window.rate;
                let per_second = rate.amount() as f64 / rate.period().as_secs_f64();
                let level =
                    (window.tokens.as_f64() + per_second * elapsed).min(rate.burst() as f64);
                let to_full = (rate.burst() as f64 - level).max(0.0) / per_second;
                (rate, level, to_full)
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((rate, level, to_full)) = tightest else {
            continue;
        };
        let remaining = level.max(0.0).floor() as u64;
        let theirs = headers
            .get(names.remaining.as_ref())
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if theirs.is_some_and(|theirs| theirs <= remaining) {
            continue;
        }
        let reset = Duration::from_secs_f64(to_full.min(1e9));
        profile.write_rate_headers(headers, currency, rate.amount(), remaining, reset, now);
    }
}

/// An answer handed on as the provider wrote it; `retry: false` for a spent quota, which the
/// SDKs must not retry.
fn give_up(mut head: http::response::Parts, body: Bytes, retry: bool) -> Response<Relay> {
    if !retry {
        head.headers
            .insert("x-should-retry", HeaderValue::from_static("false"));
    }
    head.headers.remove(header::CONTENT_LENGTH);
    relayed(head, Relay::full(body))
}

/// The start of an error body (a 429's, for its code), read by the call's deadline and within
/// 2 s, at most 64 KiB: what came by then.
async fn short_body<B>(body: B, deadline: Option<Instant>) -> Bytes
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt;
    let until = Instant::now() + Duration::from_secs(2);
    let until = deadline.map_or(until, |d| d.min(until));
    let read = http_body_util::Limited::new(body, 64 << 10).collect();
    match tokio::time::timeout_at(until, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        _ => Bytes::new(),
    }
}
