//! Sending a request upstream and reading what comes back. An unmetered request goes once. A
//! metered one goes through the library's attempt step: each attempt pays its toll at the
//! organization's key (at its upstream, or at the member of its pool that `pool.rs` chooses),
//! goes out with the body the gate read (decoded, or asking a stream for its usage), must get
//! its answer's head by the call's deadline, and is delivered metered, retried after the
//! provider's pause, moved to another member, or handed on.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tollgate::Error;
use tollgate::http::{Attempts, Call, MeteredBody, Next, Profile, Verdict};

use crate::admit::{Prepared, TenantView};
use crate::answer::{ErrorKind, Reject};
use crate::exchange::Exchange;
use crate::head::upstream_head;
use crate::pool::{Members, NotAdmitted};
use crate::relay::{Relay, Unread, relayed};
use crate::settle::CallLog;
use crate::state::ReadyUpstream;
use crate::upstream::Gapped;
use crate::upstream::UpstreamBody;

fn unreachable_upstream(
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
fn unreadable_coding(upstream: &ReadyUpstream, codings: &str) -> Reject {
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

fn silent_upstream(upstream: &ReadyUpstream) -> Reject {
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

/// Sends a metered request: each attempt pays its toll, goes out, and is delivered metered,
/// retried, or handed on. A call of a pool goes to the member that can admit it soonest, and
/// moves to another after a 429 or a 5xx before its answer's first byte, within its deadline.
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
    // Its bill teaches what such calls cost: read to its end even if the client leaves it.
    let drain = hidden.is_some();
    let mut sender = Sender {
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
        drain,
        started,
        upstream_time: Duration::ZERO,
    };
    loop {
        if let Some(response) = sender.attempt().await? {
            return Ok(response);
        }
    }
}

/// A metered call on its way: its attempts, where it is now, and what its log line and
/// metrics will say.
struct Sender<'e, 's> {
    exchange: &'e Exchange<'s>,
    members: Members<'e>,
    attempts: Attempts,
    /// The request's head at its own upstream, as the toll read it.
    head: http::request::Parts,
    /// The upstream (or pool member) of the latest attempt.
    upstream: Arc<ReadyUpstream>,
    deadline: Option<Instant>,
    log: Arc<Mutex<CallLog>>,
    tenant_view: Option<TenantView>,
    /// Whether the answer is read to its end if the client leaves it.
    drain: bool,
    started: Instant,
    /// The time the upstreams took to answer, over every attempt.
    upstream_time: Duration,
}

/// An attempt's answer, its head read and its body not yet.
type Answered = (http::response::Parts, UpstreamBody);

impl Sender<'_, '_> {
    /// One attempt: the response the client gets, or `None` when the call goes again (a
    /// retry, or another member of its pool).
    async fn attempt(&mut self) -> Result<Option<Response<Relay>>, Reject> {
        let admission = Instant::now();
        let (member, mut call) = self.admit().await?;
        self.upstream = member;
        let upstream = Arc::clone(&self.upstream);
        let waited = admission.elapsed();
        upstream.saw_key(call.key());
        self.exchange.shared.live.admitted(call.key());
        let key = call.key().to_owned();
        let request = self.request(&upstream, &mut call)?;
        call.sending();
        let Some((head, incoming)) = self.send(&upstream, &mut call, request).await? else {
            return Ok(None);
        };
        self.log_attempt(waited, &head, &upstream, &key);
        let refused = head.status == StatusCode::TOO_MANY_REQUESTS;
        if self.members.another() && self.in_time() && (refused || head.status.is_server_error()) {
            self.move_on(&upstream, call, &head, incoming, &key).await;
            return Ok(None);
        }
        let gapped = Gapped::new(
            incoming,
            upstream.config.chunk_timeout,
            upstream.metrics.stalled.clone(),
        );
        let next = match self
            .attempts
            .answered(call, head.status, &head.headers, gapped)
            .await
        {
            Ok(next) => next,
            // A 429 whose body broke off: handed on without it.
            Err(_) => return Ok(Some(relayed(head, Relay::full(Bytes::new())))),
        };
        if self.members.pooled() {
            if head.status.is_server_error() {
                self.members.member_failed(&upstream, false);
            } else if !refused {
                upstream.health.served();
            }
        }
        self.next(next, head, &upstream, &key).await
    }

    /// Whether the call's deadline is still ahead.
    fn in_time(&self) -> bool {
        self.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// The attempt's member and call, or why the call is refused.
    async fn admit(&mut self) -> Result<(Arc<ReadyUpstream>, Call), Reject> {
        let err = match self.members.admit(&mut self.attempts, &self.upstream).await {
            Ok(admitted) => return Ok(admitted),
            Err(NotAdmitted::Budget(refused)) => return Err(refused),
            Err(NotAdmitted::Gate(err)) => err,
        };
        // Refused for want of time: which window could not pay, by the key's levels.
        let shared = self.exchange.shared;
        let estimated = self.attempts.estimated();
        let gate = self.attempts.gate();
        let short = match (&err, gate.configured_limits(estimated.key())) {
            (Error::Timeout { .. }, Some(limits)) => {
                match (
                    shared.registry.limiter(estimated.key(), limits),
                    gate.cost_of(estimated, Some(limits)),
                ) {
                    (Ok(limiter), Ok(cost)) => crate::admit::short_of(&limiter, cost).await,
                    _ => None,
                }
            }
            _ => None,
        };
        Err(crate::admit::refusal(shared, &self.upstream, &err, short))
    }

    /// The attempt's request to `upstream`: its head there, and the body the gate read.
    fn request(
        &self,
        upstream: &ReadyUpstream,
        call: &mut Call,
    ) -> Result<Request<Full<Bytes>>, Reject> {
        let exchange = self.exchange;
        // The head the toll read serves its own upstream; a pool's other member gets its own.
        let mut head = if upstream.name == exchange.upstream.name {
            self.head.clone()
        } else {
            let client = exchange.client.clone();
            let mut head = upstream_head(exchange.shared, upstream, client, &exchange.route.path)?;
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

    /// Sends the attempt and reads its answer's head (and, where the call could move to
    /// another member, its body's first frame) in the attempt's time. `None`: the member
    /// failed and the call moves on.
    async fn send(
        &mut self,
        upstream: &ReadyUpstream,
        call: &mut Call,
        request: Request<Full<Bytes>>,
    ) -> Result<Option<Answered>, Reject> {
        let sent = Instant::now();
        let (until, others) = self.members.attempt_deadline(upstream, sent, self.deadline);
        let pooled = self.members.pooled();
        let response = match until {
            Some(until) => {
                match tokio::time::timeout_at(until, upstream.client.request(request)).await {
                    Ok(response) => response,
                    Err(_) if others > 0 && self.in_time() => {
                        // The member said nothing in its time: the call moves on. It went out,
                        // and its charges at the member stay (its provider may bill it).
                        upstream.metrics.upstream_timeouts.increment(1);
                        upstream.metrics.moved.increment(1);
                        tracing::warn!(upstream = %upstream.name, "a pool member said nothing in its attempt's time; the call moves on");
                        self.members.member_failed(upstream, false);
                        return Ok(None);
                    }
                    Err(_) => {
                        if pooled {
                            self.members.member_failed(upstream, false);
                        }
                        return Err(silent_upstream(upstream));
                    }
                }
            }
            None => upstream.client.request(request).await,
        };
        let response = match response {
            Ok(response) => response,
            Err(err) => {
                // Nothing reached the provider: nothing was billed.
                for budget in call.detach() {
                    crate::admit::refund(budget).await;
                }
                if pooled {
                    self.members.member_failed(upstream, false);
                }
                if self.members.any_left() {
                    // Another member may be reachable: this one failed the call.
                    upstream.metrics.upstream_errors.increment(1);
                    upstream.metrics.moved.increment(1);
                    return Ok(None);
                }
                return Err(unreachable_upstream(upstream, &err));
            }
        };
        let took = sent.elapsed();
        self.upstream_time += took;
        upstream.metrics.upstream_seconds.record(took.as_secs_f64());
        let (mut head, incoming) = response.into_parts();
        // The usage is read, and the organisation's keys masked, in the bytes as written: an
        // answer compressed though none was asked for is decoded first.
        let mut incoming = UpstreamBody::new(incoming)
            .decoding(&mut head.headers, true)
            .map_err(|codings| unreadable_coding(upstream, &codings))?;
        if others > 0
            && head.status.is_success()
            && !self.first_frame(upstream, &mut incoming, until).await?
        {
            return Ok(None);
        }
        Ok(Some((head, incoming)))
    }

    /// Whether the body's first frame came within the attempt's time. A member of a pool with
    /// another to move to has answered only then: a head and then nothing (a stalled stream
    /// behind a live front) is a member that hangs, and the call moves on.
    async fn first_frame(
        &mut self,
        upstream: &ReadyUpstream,
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
        upstream.metrics.upstream_timeouts.increment(1);
        self.members.member_failed(upstream, false);
        if !self.in_time() {
            return Err(silent_upstream(upstream));
        }
        upstream.metrics.moved.increment(1);
        tracing::warn!(upstream = %upstream.name, error = %err, "a pool member sent a head and then nothing in its attempt's time; the call moves on");
        Ok(false)
    }

    /// What the log line learns of an attempt that was answered.
    fn log_attempt(
        &self,
        waited: Duration,
        head: &http::response::Parts,
        upstream: &ReadyUpstream,
        key: &str,
    ) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.wait_ms += waited.as_secs_f64() * 1e3;
        log.status = head.status.as_u16();
        log.retries = self.attempts.retried();
        log.upstream = upstream.name.clone();
        log.key = key.to_owned();
    }

    /// A call of a pool with another member to try, in time: a 429 (transient, past the
    /// deadline, or a spent quota: that member's) or a 5xx before the answer's first byte
    /// moves it there. This member's key keeps the attempt's charge (and a 429's pause); the
    /// tenant's windows and the budgets go with the call, to settle with the usage of the
    /// member that serves it.
    async fn move_on(
        &mut self,
        upstream: &ReadyUpstream,
        mut call: Call,
        head: &http::response::Parts,
        incoming: UpstreamBody,
        key: &str,
    ) {
        let refused = head.status == StatusCode::TOO_MANY_REQUESTS;
        let error = if refused {
            Some(short_body(incoming, self.deadline).await)
        } else {
            None
        };
        let verdict = call
            .respond(head.status, &head.headers, error.as_deref())
            .await;
        match verdict {
            Verdict::Permanent { .. } => {
                upstream.metrics.upstream_429s_permanent.increment(1);
                // Its quota is spent: passed over at once, by every call.
                self.members.member_failed(upstream, true);
            }
            Verdict::Transient { pause } => {
                upstream.metrics.upstream_429s_transient.increment(1);
                if let Some(pause) = pause {
                    self.paused(key, pause).await;
                }
                self.members.pass_over(upstream);
            }
            _ => self.members.member_failed(upstream, false),
        }
        if refused {
            self.exchange.shared.live.upstream_429(key);
        }
        // A 429 or an error before the first byte is billed nothing: the member's budget gets
        // its charge back (its windows keep the request, as its provider counts it).
        for budget in call.detach() {
            crate::admit::refund(budget).await;
        }
        upstream.metrics.moved.increment(1);
    }

    /// Records the provider's pause of `key`, for the live view and the fleet.
    async fn paused(&self, key: &str, pause: Duration) {
        let shared = self.exchange.shared;
        shared.live.paused(key, pause);
        let until = crate::tally::unix_ms()
            .saturating_add(u64::try_from(pause.as_millis()).unwrap_or(u64::MAX));
        shared.owners.record_pause(key, until, pause).await;
    }

    /// What the attempt step decided: the response, or `None` to go again.
    async fn next(
        &mut self,
        next: Next<Gapped<UpstreamBody>>,
        head: http::response::Parts,
        upstream: &ReadyUpstream,
        key: &str,
    ) -> Result<Option<Response<Relay>>, Reject> {
        let live = &self.exchange.shared.live;
        match next {
            Next::Deliver(metered) => Ok(Some(self.deliver(metered, head, upstream))),
            Next::Retry(delay) => {
                upstream.metrics.upstream_429s_transient.increment(1);
                live.upstream_429(key);
                self.paused(key, delay).await;
                if self.members.pooled() {
                    // The member is paused for its provider's pause: the next pick weighs it.
                    upstream.metrics.moved.increment(1);
                } else {
                    tokio::time::sleep(delay).await;
                }
                Ok(None)
            }
            Next::HandOn { body, .. } => {
                upstream.metrics.upstream_429s_transient.increment(1);
                live.upstream_429(key);
                Ok(Some(give_up(head, body, true)))
            }
            Next::Refused { body, .. } => {
                if self.members.pooled() {
                    self.members.member_failed(upstream, true);
                }
                upstream.metrics.upstream_429s_permanent.increment(1);
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
        &self,
        metered: Box<MeteredBody<Gapped<UpstreamBody>>>,
        mut head: http::response::Parts,
        upstream: &ReadyUpstream,
    ) -> Response<Relay> {
        let total = self.started.elapsed();
        let waited = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .wait_ms
            / 1e3;
        let added = total.as_secs_f64() - waited - self.upstream_time.as_secs_f64();
        upstream.metrics.added_seconds.record(added.max(0.0));
        let stream =
            tollgate::http::is_event_stream(&head.headers) || self.attempts.estimated().is_stream();
        if stream {
            // The stream may lose the usage chunk the gate asked for on the way.
            head.headers.remove(header::CONTENT_LENGTH);
        }
        if let Some(view) = &self.tenant_view {
            tenant_headers(&upstream.profile, view, &mut head.headers);
        }
        let cut_short = upstream.metrics.cut_short.clone();
        let body = Relay::metered(
            metered,
            stream,
            cut_short,
            unread(self.exchange),
            self.drain,
        );
        relayed(head, body)
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
