//! Sending a request upstream and reading what comes back, through the library's attempt
//! step: each attempt pays its toll at the organization's key, goes out with the body the gate
//! read (decoded, or asking a stream for its usage), must get its answer's head by the call's
//! deadline, and is delivered metered, retried after the provider's pause, or handed on.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use http_body_util::Full;
use std::time::Duration;
use tokio::time::Instant;
use tollgate::Error;
use tollgate::http::{Attempts, Next, Profile, Settlement, Verdict};

use crate::admit::{Prepared, TenantView, refusal};
use crate::answer::{ErrorKind, answer};
use crate::relay::{Gapped, Relay, Unread};
use crate::state::{ReadyUpstream, Shared, TENANT_PART, key_of, model_entry};
use crate::tenant::{KEY_HEADERS, Tenant};
use crate::upstream::Upstream;

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
    upstream: &ReadyUpstream,
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
        // A header is dropped in any spelling a server may read as it: servers that read
        // headers as CGI variables (`HTTP_OPENAI_ORGANIZATION`) take `OpenAI_Organization` for
        // `OpenAI-Organization`.
        let drop_spellings = |headers: &mut HeaderMap, names: &[&str]| {
            let spelled: Vec<HeaderName> = headers
                .keys()
                .filter(|k| {
                    let k = k.as_str().replace('_', "-");
                    names.contains(&k.as_str())
                })
                .cloned()
                .collect();
            for name in spelled {
                headers.remove(name);
            }
        };
        drop_spellings(&mut parts.headers, &KEY_HEADERS);
        parts.headers.insert(name.clone(), value.clone());
        // Answers come back as written, so that an echo of the real key can be masked.
        parts.headers.remove(header::ACCEPT_ENCODING);
        // The organisation or project a call is billed to is the organisation's to choose,
        // never a tenant's, unless the upstream's configuration lets the tenant choose.
        if !upstream.config.tenant_org_headers {
            drop_spellings(
                &mut parts.headers,
                &["openai-organization", "openai-project"],
            );
        }
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
    upstream: &ReadyUpstream,
    err: &hyper_util::client::legacy::Error,
) -> Response<Relay> {
    upstream.metrics.upstream_errors.increment(1);
    tracing::warn!(upstream = %upstream.name, error = %err, "the upstream could not be reached");
    answer(
        upstream.family,
        ErrorKind::Upstream,
        &format!(
            "tollgate-proxy: upstream `{}` could not be reached",
            upstream.name
        ),
        None,
    )
}

/// An answer in a content coding the proxy must read (to mask the organisation's keys, or read
/// the usage) and can't.
fn unreadable_coding(upstream: &ReadyUpstream, codings: &str) -> Response<Relay> {
    upstream.metrics.upstream_errors.increment(1);
    tracing::warn!(upstream = %upstream.name, codings = %crate::answer::printable(codings), "the upstream answered in a content coding the proxy can't read");
    answer(
        upstream.family,
        ErrorKind::Upstream,
        &format!(
            "tollgate-proxy: upstream `{}` answered in a content coding the proxy can't read ({}), though it was asked for none",
            upstream.name,
            crate::answer::printable(codings)
        ),
        None,
    )
}

fn silent_upstream(upstream: &ReadyUpstream) -> Response<Relay> {
    upstream.metrics.upstream_timeouts.increment(1);
    tracing::warn!(upstream = %upstream.name, "the upstream said nothing by the call's deadline");
    answer(
        upstream.family,
        ErrorKind::UpstreamTimeout,
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
    shared: &Shared,
    upstream: &ReadyUpstream,
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
            let (mut head, incoming) = response.into_parts();
            // The organisation's keys are masked in what the client reads: in the bytes as
            // written, so a compressed answer is decoded first.
            let masking = !shared.secrets.is_empty();
            let incoming = match Upstream::new(incoming).decoding(&mut head.headers, masking) {
                Ok(body) => body,
                Err(codings) => return unreadable_coding(upstream, &codings),
            };
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
    /// The key the delivered attempt was admitted at.
    pub(crate) key: String,
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

/// How a call is sent: to its upstream, or to the member of its pool that can admit it
/// soonest.
struct Sending<'a> {
    shared: &'a Shared,
    /// The client's head, the path on the upstream, the body.
    client: http::request::Parts,
    path: String,
    /// The pool's members (empty: no pool) and those that failed this call.
    members: Vec<Arc<ReadyUpstream>>,
    failed: Vec<String>,
    /// The pool's ejection rule, and how long one attempt may wait for its first byte.
    ejection: crate::health::Ejection,
    attempt_timeout: Option<Duration>,
}

impl Sending<'_> {
    /// The model a member's key is named after.
    fn model<'m>(
        &'m self,
        attempts: &'m Attempts,
        family: crate::config::Family,
    ) -> Option<&'m str> {
        match family {
            crate::config::Family::Azure => {
                crate::state::model_of(family, &self.client, &serde_json::Value::Null)
            }
            _ => attempts.estimated().model(),
        }
    }

    /// The next attempt's member and call: the first member (from a rotating start) that can
    /// admit it now, else the one that can soonest (a member paused by its provider waits
    /// out its pause there). Members ejected for failing are passed over while another can
    /// take the call, and so are members whose own budget can't pay for it; the member chosen
    /// pays its budget with the call.
    async fn admit(
        &mut self,
        attempts: &mut Attempts,
        current: &Arc<ReadyUpstream>,
    ) -> Result<(Arc<ReadyUpstream>, tollgate::http::Call), NotAdmitted> {
        if self.members.is_empty() {
            let key = attempts.estimated().key();
            self.shared
                .carry(key.split('@').next().unwrap_or(key))
                .await;
            return Ok((
                Arc::clone(current),
                attempts.admit().await.map_err(NotAdmitted::Gate)?,
            ));
        }
        let now = Instant::now();
        let untried: Vec<Arc<ReadyUpstream>> = self
            .members
            .iter()
            .filter(|m| !self.failed.contains(&m.name))
            .cloned()
            .collect();
        let healthy: Vec<Arc<ReadyUpstream>> = untried
            .iter()
            .filter(|m| !m.health.ejected(now))
            .cloned()
            .collect();
        // Every member ejected: they are tried all the same (a pool never refuses for that).
        let mut candidates = if !healthy.is_empty() {
            healthy
        } else if !untried.is_empty() {
            untried
        } else {
            self.members.clone()
        };
        let start = self
            .shared
            .next_member
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let count = candidates.len();
        candidates.rotate_left(start % count);
        let mut best: Option<(Arc<ReadyUpstream>, Duration)> = None;
        let mut failure = None;
        let mut spent = None;
        for member in candidates {
            let budget = match crate::admit::member_budget(self.shared, &member, attempts).await {
                Ok(budget) => budget,
                Err(refused) => {
                    spent = Some(refused);
                    continue;
                }
            };
            let key = key_of(
                &member.config,
                &member.profile,
                self.model(attempts, member.family),
            );
            attempts.switch(&member.gate, key);
            match attempts.admit_now().await {
                Ok(mut call) => {
                    if let Some(budget) = budget {
                        call.attach(budget);
                    }
                    return Ok((member, call));
                }
                Err(tollgate::Error::Timeout { needed, .. }) => {
                    if let Some(budget) = budget {
                        crate::admit::refund(budget).await;
                    }
                    // Without `needed`, the store's answer came too late for "now" (a round
                    // trip to a busy Redis): the member may well have room, and is as good a
                    // choice as any. (Read as never, it sent the call to a member that had
                    // none, and a fleet's test saw 429s with a member free.) Calls that chose
                    // the member a moment ago and are still on their way to its line wait
                    // ahead of this one too: in a burst every call asks before any joins, and
                    // without them most of a burst chose the same member.
                    let ahead = member.choosing.load(std::sync::atomic::Ordering::Acquire);
                    let wait = needed.unwrap_or(Duration::ZERO).saturating_add(
                        call_time(&member, attempts)
                            .saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX)),
                    );
                    if best.as_ref().is_none_or(|(_, b)| wait < *b) {
                        best = Some((member, wait));
                    }
                }
                Err(err) => {
                    if let Some(budget) = budget {
                        crate::admit::refund(budget).await;
                    }
                    failure = Some(err);
                }
            }
        }
        let Some((member, _)) = best else {
            return Err(match (failure, spent) {
                (Some(err), _) => NotAdmitted::Gate(err),
                (None, Some(spent)) => NotAdmitted::Budget(spent),
                (None, None) => NotAdmitted::Gate(tollgate::Error::NoLimits {
                    key: "pool".to_owned(),
                }),
            });
        };
        let budget = crate::admit::member_budget(self.shared, &member, attempts)
            .await
            .map_err(NotAdmitted::Budget)?;
        let key = key_of(
            &member.config,
            &member.profile,
            self.model(attempts, member.family),
        );
        attempts.switch(&member.gate, key);
        let admitted = {
            let _choosing = Choosing::new(&member);
            attempts.admit().await
        };
        match admitted {
            Ok(mut call) => {
                if let Some(budget) = budget {
                    call.attach(budget);
                }
                Ok((member, call))
            }
            Err(err) => {
                if let Some(budget) = budget {
                    crate::admit::refund(budget).await;
                }
                Err(NotAdmitted::Gate(err))
            }
        }
    }

    /// Members other than `member` this call could still move to (not failed it, not ejected).
    fn others(&self, member: &ReadyUpstream) -> usize {
        let now = Instant::now();
        self.members
            .iter()
            .filter(|m| m.name != member.name && !self.failed.contains(&m.name))
            .filter(|m| !m.health.ejected(now))
            .count()
    }

    /// The member failed this call (a 5xx, no first byte in time, no connection): it is passed
    /// over by this call, and counted toward its ejection.
    fn member_failed(&mut self, member: &ReadyUpstream, spent_quota: bool) {
        self.failed.push(member.name.clone());
        let now = Instant::now();
        let ejected = if spent_quota {
            member.health.spent(now, self.ejection)
        } else {
            member.health.failed(now, self.ejection)
        };
        if let Some(time) = ejected {
            member.metrics.ejected.increment(1);
            tracing::warn!(upstream = %member.name, ?time, "a pool member keeps failing: passed over for a while");
        }
    }
}

/// Why a pool's call was not admitted at any member.
enum NotAdmitted {
    /// The gate's refusal (the wait would pass the deadline, the store is down, ...).
    Gate(tollgate::Error),
    /// Every member's own budget is spent.
    Budget(crate::admit::Refusal),
}

/// A call that chose a pool member to wait for, counted until it is admitted (or gives up).
struct Choosing<'a>(&'a ReadyUpstream);

impl<'a> Choosing<'a> {
    fn new(member: &'a ReadyUpstream) -> Choosing<'a> {
        member
            .choosing
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Choosing(member)
    }
}

impl Drop for Choosing<'_> {
    fn drop(&mut self) {
        self.0
            .choosing
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// How long `member`'s windows take to refill what the call in `attempts` costs there: what
/// each call ahead of it in the member's line adds to its wait.
fn call_time(member: &ReadyUpstream, attempts: &Attempts) -> Duration {
    let estimated = attempts.estimated();
    let Some(limits) = member.gate.configured_limits(estimated.key()) else {
        return Duration::ZERO;
    };
    let Ok(cost) = member.gate.cost_of(estimated, Some(limits)) else {
        return Duration::ZERO;
    };
    tollgate::Currency::ALL
        .into_iter()
        .flat_map(|currency| {
            let amount = cost.of(currency);
            limits.of(currency).as_slice().iter().map(move |rate| {
                let nanos = u128::from(amount) * u128::from(rate.period_nanos())
                    / u128::from(rate.amount().max(1));
                Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            })
        })
        .max()
        .unwrap_or(Duration::ZERO)
}

/// Sends a metered request: each attempt pays its toll, goes out, and is delivered metered,
/// retried, or handed on. A call of a pool goes to the member that can admit it soonest, and
/// moves to another after a 429 or a 5xx before its answer's first byte, within its deadline.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn metered(
    shared: &Shared,
    upstream: Arc<ReadyUpstream>,
    client: http::request::Parts,
    path: &str,
    body: Bytes,
    prepared: Prepared,
    tenant: Option<&Tenant>,
    route: &'static str,
) -> Response<Relay> {
    let Prepared {
        mut attempts,
        tenant_view,
        hidden,
        alone,
    } = prepared;
    let family = upstream.family;
    // Its bill teaches what such calls cost: read to its end even if the client leaves it.
    let drain = hidden.is_some();
    let deadline = attempts.deadline();
    let started = Instant::now();
    let model = attempts.estimated().model().map(crate::answer::printable);
    let pool = shared
        .config
        .pool_of(&upstream.name, attempts.estimated().model())
        .cloned();
    let mut sending = Sending {
        shared,
        client,
        path: path.to_owned(),
        members: pool
            .iter()
            .flat_map(|p| p.members.iter())
            .filter_map(|name| shared.upstream_named(name).cloned())
            .collect(),
        failed: Vec::new(),
        ejection: pool.as_ref().map(|p| p.ejection).unwrap_or_default(),
        attempt_timeout: pool.as_ref().and_then(|p| p.attempt_timeout),
    };
    let line = Arc::new(Mutex::new(Line {
        upstream: upstream.name.clone(),
        route,
        tenant: tenant.map(|t| t.name.clone()),
        model: model.clone(),
        estimated: attempts.estimated().input_tokens() + attempts.estimated().most_output(),
        ..Line::default()
    }));
    {
        let line = Arc::clone(&line);
        let settled = upstream.metrics.settled_tokens.clone();
        let model_label = attempts
            .estimated()
            .model()
            .and_then(|m| model_entry(&upstream.config, &upstream.profile, m))
            .unwrap_or_else(|| crate::metrics::OTHER.to_owned());
        let tenant_label = tenant.map_or_else(
            || "-".to_owned(),
            |t| {
                if t.configured {
                    t.name.clone()
                } else {
                    crate::metrics::OTHER.to_owned()
                }
            },
        );
        let live = Arc::clone(&shared.live);
        let tenant_key = tenant.map(|t| format!("{}:{TENANT_PART}{}", upstream.name, t.name));
        // The tenant's and tier's budgets; the upstream's is the serving member's (below).
        let upstream_budget = format!("{}upstream:", crate::state::BUDGET);
        let budgets: Vec<String> = crate::admit::budgets(shared, &upstream, tenant)
            .into_iter()
            .map(|(key, _, _)| key)
            .filter(|key| !key.starts_with(&upstream_budget))
            .collect();
        let member_budgets: std::collections::HashSet<String> = shared
            .upstreams
            .iter()
            .filter(|u| !u.config.spend.is_empty())
            .map(|u| u.name.clone())
            .collect();
        let learned = Arc::clone(&shared.hidden);
        let records = Arc::clone(&shared.owners);
        attempts.on_settled(Box::new(move |settlement: &Settlement| {
            // A call with inputs the proxy can't see teaches what such calls are billed (an
            // error's usage, the estimate, teaches nothing); its turn ends with it.
            let status = line.lock().unwrap_or_else(PoisonError::into_inner).status;
            let reported = settlement.reported;
            // Whether the provider said what the input was billed. An answer that reports
            // none is settled with what was charged in its place (`Call::finish`): that is no
            // bill, and teaches nothing (learnt, it had made the ceiling the estimate).
            let billed = settlement.input_reported;
            if let Some((tenant, model)) = &hidden
                && billed
                && (200..400).contains(&status)
            {
                let input = reported
                    .input
                    .unwrap_or(0)
                    .saturating_add(reported.cache_read.unwrap_or(0))
                    .saturating_add(reported.cache_write.unwrap_or(0));
                let most = learned.learned(tenant, model, input);
                // The fleet learns it too (in a task: the settlement doesn't wait on Redis).
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let (records, tenant, model) =
                        (Arc::clone(&records), tenant.clone(), model.clone());
                    runtime.spawn(async move {
                        records.share_ceiling(&tenant, &model, most).await;
                    });
                }
            }
            match alone {
                // The call that went alone, answered without its bill (its usage never came:
                // an upstream that reports none, a stream cut before its end even when read
                // on): nothing was learned, and the next such call would go alone as blind as
                // it did. The turn is kept, so such calls of this tenant and model wait (429
                // past their deadline) until a ceiling is learned, here or by the fleet.
                Some(turn) if !billed && (200..300).contains(&status) => {
                    turn.forget();
                    if let Some((tenant, model)) = &hidden {
                        tracing::warn!(
                            tenant = %crate::answer::printable(tenant),
                            model = %crate::answer::printable(model),
                            "a call with inputs the proxy can't see was answered without its usage; such calls of this tenant and model are held until one is billed"
                        );
                    }
                }
                turn => drop(turn),
            }
            if let Some(usage) = settlement.usage {
                settled.increment(usage.tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0));
            }
            let line = line.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(spend) = settlement.spend {
                crate::metrics::spent(&line.upstream, &model_label, &tenant_label, spend);
                let served_budget = member_budgets
                    .contains(&line.upstream)
                    .then(|| format!("{upstream_budget}{}", line.upstream));
                for key in std::iter::once(&line.key)
                    .chain(tenant_key.iter())
                    .chain(budgets.iter())
                    .chain(served_budget.iter())
                {
                    live.spent(key, spend);
                }
            }
            line.write(settlement);
        }));
    }
    let mut upstream_time = std::time::Duration::ZERO;
    let mut upstream = upstream;
    loop {
        let admission = Instant::now();
        let (member, mut call) = match sending.admit(&mut attempts, &upstream).await {
            Ok(admitted) => admitted,
            Err(NotAdmitted::Budget(refused)) => {
                return answer(family, refused.kind, &refused.message, refused.retry_after);
            }
            Err(NotAdmitted::Gate(err)) => {
                // Refused for want of time: which window could not pay, by the key's levels.
                let estimated = attempts.estimated();
                let gate = attempts.gate();
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
                let refused = refusal(shared, &upstream, &err, short);
                return answer(family, refused.kind, &refused.message, refused.retry_after);
            }
        };
        upstream = member;
        let waited = admission.elapsed();
        upstream.saw_key(call.key());
        shared.live.admitted(call.key());
        let key = call.key().to_owned();
        let Some(mut head) =
            upstream_head(shared, &upstream, sending.client.clone(), &sending.path)
        else {
            return answer(
                family,
                ErrorKind::Invalid,
                "tollgate-proxy: the path can't be forwarded",
                None,
            );
        };
        // The usage can only be read from bytes as they were written.
        head.headers.remove(header::ACCEPT_ENCODING);
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
        // A member of a pool with another to move to waits for its first byte for its share
        // of the call's time left (or the pool's attempt_timeout), not all of it: a member
        // that hangs can't hold the call to its deadline.
        let pooled = !sending.members.is_empty();
        let others = if pooled { sending.others(&upstream) } else { 0 };
        let attempt_deadline = deadline.map(|deadline| {
            if others == 0 {
                return deadline;
            }
            let left = deadline.saturating_duration_since(sent);
            let share = sending
                .attempt_timeout
                .unwrap_or_else(|| left / u32::try_from(others + 1).unwrap_or(u32::MAX));
            (sent + share).min(deadline)
        });
        let response = match attempt_deadline {
            Some(until) => {
                match tokio::time::timeout_at(until, upstream.client.request(request)).await {
                    Ok(response) => response,
                    Err(_) if others > 0 && deadline.is_none_or(|d| Instant::now() < d) => {
                        // The member said nothing in its time: the call moves on. It went out,
                        // and its charges at the member stay (its provider may bill it).
                        upstream.metrics.upstream_timeouts.increment(1);
                        upstream.metrics.moved.increment(1);
                        tracing::warn!(upstream = %upstream.name, "a pool member said nothing in its attempt's time; the call moves on");
                        sending.member_failed(&upstream, false);
                        drop(call);
                        continue;
                    }
                    Err(_) => {
                        if pooled {
                            sending.member_failed(&upstream, false);
                        }
                        return silent_upstream(&upstream);
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
                    sending.member_failed(&upstream, false);
                }
                if sending.members.len() > sending.failed.len() {
                    // Another member may be reachable: this one failed the call.
                    upstream.metrics.upstream_errors.increment(1);
                    upstream.metrics.moved.increment(1);
                    drop(call);
                    continue;
                }
                return unreachable_upstream(&upstream, &err);
            }
        };
        let took = sent.elapsed();
        upstream_time += took;
        upstream.metrics.upstream_seconds.record(took.as_secs_f64());
        let (mut head, incoming) = response.into_parts();
        // The usage is read, and the organisation's keys masked, in the bytes as written: an
        // answer compressed though none was asked for is decoded first.
        let mut incoming = match Upstream::new(incoming).decoding(&mut head.headers, true) {
            Ok(body) => body,
            Err(codings) => return unreadable_coding(&upstream, &codings),
        };
        // A member of a pool with another to move to has answered when its body's first frame
        // comes, within the attempt's time: a head and then nothing (a stalled stream behind
        // a live front) is a member that hangs, and the call moves on.
        if others > 0 && head.status.is_success() {
            let ahead = match attempt_deadline {
                Some(until) => tokio::time::timeout_at(until, incoming.read_ahead())
                    .await
                    .unwrap_or_else(|_| Err("no first byte in the attempt's time".into())),
                None => incoming.read_ahead().await,
            };
            if let Err(err) = ahead {
                upstream.metrics.upstream_timeouts.increment(1);
                sending.member_failed(&upstream, false);
                drop(call);
                if deadline.is_none_or(|d| Instant::now() < d) {
                    upstream.metrics.moved.increment(1);
                    tracing::warn!(upstream = %upstream.name, error = %err, "a pool member sent a head and then nothing in its attempt's time; the call moves on");
                    continue;
                }
                return silent_upstream(&upstream);
            }
        }
        {
            let mut line = line.lock().unwrap_or_else(PoisonError::into_inner);
            line.wait_ms += waited.as_secs_f64() * 1e3;
            line.status = head.status.as_u16();
            line.retries = attempts.retried();
            line.upstream = upstream.name.clone();
            line.key = key.clone();
        }
        // A call of a pool with another member to try, in time: a 429 (transient, past the
        // deadline, or a spent quota: that member's) or a 5xx before the answer's first byte
        // moves it there. This member's key keeps the attempt's charge (and a 429's pause); the
        // tenant's windows and the budgets go with the call, to settle with the usage of the
        // member that serves it.
        let another = sending.members.len() > sending.failed.len() + 1
            && deadline.is_none_or(|d| Instant::now() < d);
        let refused = head.status == http::StatusCode::TOO_MANY_REQUESTS;
        if another && (refused || head.status.is_server_error()) {
            let error = if refused {
                Some(short_body(incoming, deadline).await)
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
                    sending.member_failed(&upstream, true);
                }
                Verdict::Transient { pause } => {
                    upstream.metrics.upstream_429s_transient.increment(1);
                    if let Some(pause) = pause {
                        shared.live.paused(&key, pause);
                        let until = crate::tally::unix_ms()
                            .saturating_add(u64::try_from(pause.as_millis()).unwrap_or(u64::MAX));
                        shared.owners.record_pause(&key, until, pause).await;
                    }
                    sending.failed.push(upstream.name.clone());
                }
                _ => sending.member_failed(&upstream, false),
            }
            if refused {
                shared.live.upstream_429(&key);
            }
            // A 429 or an error before the first byte is billed nothing: the member's budget
            // gets its charge back (its windows keep the request, as its provider counts it).
            for budget in call.detach() {
                crate::admit::refund(budget).await;
            }
            upstream.metrics.moved.increment(1);
            drop(call);
            continue;
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
        if pooled {
            if head.status.is_server_error() {
                sending.member_failed(&upstream, false);
            } else if head.status != http::StatusCode::TOO_MANY_REQUESTS {
                upstream.health.served();
            }
        }
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
                if let Some(view) = &tenant_view {
                    tenant_headers(&upstream.profile, view, &mut head.headers);
                }
                let cut_short = upstream.metrics.cut_short.clone();
                let unread = Unread {
                    timeout: shared.bounds.write_timeout,
                    counter: shared.proxy_metrics.unread_closed.clone(),
                };
                return relayed(
                    head,
                    Relay::metered(metered, stream, cut_short, unread, drain),
                );
            }
            Next::Retry(delay) => {
                upstream.metrics.upstream_429s_transient.increment(1);
                shared.live.upstream_429(&key);
                shared.live.paused(&key, delay);
                let until = crate::tally::unix_ms()
                    .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
                shared.owners.record_pause(&key, until, delay).await;
                if sending.members.is_empty() {
                    tokio::time::sleep(delay).await;
                } else {
                    // The member is paused for its provider's pause: the next pick weighs it.
                    upstream.metrics.moved.increment(1);
                }
            }
            Next::HandOn { body, .. } => {
                upstream.metrics.upstream_429s_transient.increment(1);
                shared.live.upstream_429(&key);
                return give_up(head, body, true);
            }
            Next::Refused { body, .. } => {
                if pooled {
                    sending.member_failed(&upstream, true);
                }
                upstream.metrics.upstream_429s_permanent.increment(1);
                shared.live.upstream_429(&key);
                return give_up(head, body, false);
            }
            _ => {
                return answer(
                    family,
                    ErrorKind::Upstream,
                    "tollgate-proxy: an answer this version can't handle",
                    None,
                );
            }
        }
    }
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

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}
