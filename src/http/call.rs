//! One request on its way: sent, answered (header sync, 429s), settled.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::elsewhere::start_charger;
use super::gate::{Estimated, Gate, LimitsSource};
use super::headers::{RateHeader, rate_headers, retry_pause};
use super::keys::GateKey;
use super::usage::Reported;
use super::verdict::Verdict;
use super::verdict::{error_detail, spent};
use crate::bucket::{Refusal, SyncArgs, Synced};
use crate::cost::{Cost, Usage};
use crate::error::Error;
use crate::limiter::{Limiter, Permit};
use crate::rate::Currency;

/// One request on its way: admitted, and waiting for its response.
///
/// Dropping it after [`sending`](Call::sending) without [`finish`](Call::finish) keeps what
/// was charged (the estimate); dropping it before gives the charge back (the call never went
/// out).
pub struct Call {
    gate: Gate,
    state: Arc<GateKey>,
    permit: Option<Permit>,
    /// The key's turn to go alone (its first call, or one while its limits are unknown),
    /// shared with a task that hands it on if the answer is slow in coming.
    learning: Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>,
    /// The request as the gate read it: its estimate, model, price, fees and body to send.
    estimated: Estimated,
    sent: Option<Instant>,
    /// When the key charged it: its windows started refilling from then.
    admitted: Instant,
    /// The input as charged: the estimate and its margin (what stands when the answer reports
    /// no input count).
    charged_input: u64,
    /// Other windows the call was charged in (a tenant's), settled with the same usage.
    extras: Vec<Permit>,
    /// Told how the call settled, once.
    on_settled: Option<SettledFn>,
    /// The answer ended before its end.
    cut: bool,
    /// The provider answered with an error (a 4xx other than 429, or a 5xx): it bills no
    /// tokens for it.
    errored: bool,
    /// The header sync of a whole (not streamed) answer, put off until the call settles, so
    /// that both take one step of the store (one round trip to Redis, not two).
    pending_sync: Option<SyncArgs>,
    /// Its answer will be read whole and settled at once ([`Call::whole_answer`]).
    whole: bool,
}

/// Told how a call settled (see [`Call::on_settled`]).
pub type SettledFn = Box<dyn FnOnce(&Settlement) + Send + Sync>;

/// How a call settled: for a caller's logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settlement {
    /// What the call was charged up front (`None` while its key's limits were unknown).
    pub charged: Option<Cost>,
    /// The usage it settled with, as charged to the key's windows (`None`: the charge stands,
    /// because the answer reported nothing or the call was cut short within its reservation).
    pub usage: Option<Usage>,
    /// What the answer reported (after the generated text was counted, before any clamp).
    pub reported: Reported,
    /// The answer ended before its end: the caller went away, or the upstream broke off.
    pub cut: bool,
    /// The answer said what its input was billed (an input count, or a total): where it did
    /// not, `reported.input` is what the call was charged for it, filled in.
    pub input_reported: bool,
    /// The usage reported was more than the request could have produced, and was cut.
    pub clamped: bool,
    /// What the call cost, in micro-dollars, at its model's prices (`None`: its model has no
    /// price in the profile's table): its billed usage, or, when the charge stands, the most
    /// it could have cost.
    pub spend: Option<u64>,
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("key", &self.state.key)
            .field("cost", &self.permit.as_ref().map(Permit::cost))
            .field("stream", &self.estimated.stream)
            .finish_non_exhaustive()
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let charged = self.cost();
        self.tell(Settlement {
            charged,
            ..Settlement::default()
        });
        // A whole answer whose body never settled: its sync goes on in the background, and
        // settles the call as charged.
        if let (Some(sync), Some(permit)) = (self.pending_sync.take(), self.permit.take()) {
            let sent = self.sent.unwrap_or_else(Instant::now);
            self.state.elsewhere.restore(sent, sync.returnable);
            permit.sync_in_background(SyncArgs {
                returnable: crate::rate::PerCurrency::default(),
                ..sync
            });
        }
        if self.sent.is_none() {
            if let Some(permit) = self.permit.take() {
                permit.give_back();
            }
            for permit in self.extras.drain(..) {
                permit.give_back();
            }
        }
    }
}

impl Call {
    pub(super) fn new(
        gate: Gate,
        state: Arc<GateKey>,
        permit: Option<Permit>,
        learning: Option<OwnedSemaphorePermit>,
        estimated: &Estimated,
    ) -> Call {
        let charged_input = permit.as_ref().map_or(estimated.input, |p| {
            gate.charged_input(estimated, Some(p.limiter().limits()))
        });
        Call {
            gate,
            state,
            permit,
            learning: Arc::new(std::sync::Mutex::new(learning)),
            estimated: estimated.clone(),
            sent: None,
            admitted: Instant::now(),
            charged_input,
            extras: Vec::new(),
            on_settled: None,
            cut: false,
            errored: false,
            pending_sync: None,
            whole: false,
        }
    }

    /// Says that the answer's body will be read whole and the call [`finish`](Call::finish)ed
    /// at once (an answer that is not a stream): [`respond`](Call::respond) then leaves its
    /// header sync for the settlement, and both take one step of the store (one round trip
    /// to Redis instead of two). The tower layer and the proxy do this for every answer that
    /// is not an event stream. A call dropped before it finishes syncs in the background.
    pub fn whole_answer(&mut self) {
        self.whole = true;
    }

    /// Calls `told` once, when the call settles (or is dropped without settling), with what
    /// it came to.
    pub fn on_settled(&mut self, told: SettledFn) {
        self.on_settled = Some(told);
    }

    fn tell(&mut self, settlement: Settlement) {
        if let Some(told) = self.on_settled.take() {
            told(&settlement);
        }
    }

    /// The body to send in place of the caller's, when the gate changed it (decoded from its
    /// `content-encoding`, or asking a stream for its usage): send it without
    /// `content-encoding`, with its own length. `None`: send the caller's bytes.
    pub fn body(&self) -> Option<&Bytes> {
        self.estimated.send.as_ref()
    }

    /// Fixes the request's headers for the body the gate rewrote ([`body`](Call::body)): no
    /// `content-encoding`, and the new body's `content-length`. Does nothing when the body
    /// was not rewritten.
    pub fn rewrite_headers(&self, headers: &mut HeaderMap) {
        if let Some(body) = &self.estimated.send {
            headers.remove(http::header::CONTENT_ENCODING);
            headers.insert(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from(body.len()),
            );
        }
    }

    /// True when the gate asked the stream for its usage (`stream_options.include_usage`) on
    /// the caller's behalf: [`MeteredBody`](super::MeteredBody) takes that extra chunk out of the
    /// stream before the caller reads it.
    pub fn usage_added(&self) -> bool {
        self.estimated.usage_added
    }

    /// The body's `model`, if it named one.
    pub fn model(&self) -> Option<&str> {
        self.estimated.model.as_deref()
    }

    /// The input tokens the gate estimated.
    pub fn input_tokens(&self) -> u64 {
        self.estimated.input
    }

    /// Charges the call in other windows too (a tenant's): `permit` is settled with the same
    /// usage when the call settles, given back if the call is dropped before it is sent, and
    /// kept as charged if it is dropped after.
    pub fn attach(&mut self, permit: Permit) {
        self.extras.push(permit);
    }

    /// Takes back the permits [`attach`](Call::attach)ed (to attach them to the next attempt).
    pub fn detach(&mut self) -> Vec<Permit> {
        std::mem::take(&mut self.extras)
    }

    /// What the call was charged for its output up front (its reservation, as far as the
    /// windows took it).
    fn reserved_charged(&self) -> u64 {
        let Some(cost) = self.cost() else {
            return self.estimated.output;
        };
        match self.gate.inner.profile.output {
            super::OutputTo::Tokens => cost.tokens.saturating_sub(self.charged_input),
            super::OutputTo::OutputTokens => cost.output_tokens,
            super::OutputTo::Nowhere => 0,
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// What the call paid (`None` while its key's limits are unknown).
    pub fn cost(&self) -> Option<Cost> {
        self.permit.as_ref().map(Permit::cost)
    }

    /// Marks the call as sent now. Adapters call this right before sending: a call dropped
    /// before it was sent gives its charge back, one dropped after keeps it. (The store takes
    /// the call's admission as the instant it went out, for every process.)
    pub fn sending(&mut self) {
        self.sent = Some(Instant::now());
        // A call that goes alone hands the key's turn to the next one when its answer is slow
        // in coming (an upstream that hangs must not hold every other call of the key).
        let held = self
            .learning
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some();
        if held && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let turn = Arc::clone(&self.learning);
            let wait = self
                .gate
                .inner
                .first_answer
                .unwrap_or(super::gate::FIRST_ANSWER_WAIT);
            runtime.spawn(async move {
                tokio::time::sleep(wait).await;
                drop(
                    turn.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take(),
                );
            });
        }
    }

    /// The estimator of the gate that admitted the call.
    pub(super) fn gate_estimator(&self) -> Arc<dyn tollgate_estimators::Estimator> {
        self.gate.estimator()
    }

    /// True when the request asked for a stream (`"stream": true`): its usage comes in
    /// server-sent events.
    pub fn is_stream(&self) -> bool {
        self.estimated.stream
    }

    /// The limiter that admitted the call, or the key's (learned) one.
    fn limiter(&self) -> Option<Limiter> {
        match &self.permit {
            Some(permit) => Some(permit.limiter().clone()),
            None => self.state.limiter(),
        }
    }

    /// Reads the response's status and headers: brings the key's windows in line with the
    /// `remaining` headers (only ever lowering them; see the [module docs](super) for how),
    /// learns a key's limits from them when the gate takes its limits from the headers, and
    /// for a 429 says whether it is worth retrying, pausing the key for a transient one.
    /// `error_body` is the body of a 429, for its error code and message.
    ///
    /// The provider has answered, and billed the call: nothing that goes wrong here (a store
    /// that fails, limits that can't be learned) takes the answer's place. It is logged, and
    /// counted in `tollgate_gate_errors_total`.
    pub async fn respond(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
        error_body: Option<&[u8]>,
    ) -> Verdict {
        let gate = Arc::clone(&self.gate.inner);
        let now = SystemTime::now();
        let (read, malformed) = rate_headers_checked(&gate.profile, headers, now);
        if malformed && !self.state.warned_malformed.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                key = %self.state.key,
                "a rate-limit header of the provider can't be read; this answer does not sync it",
            );
        }
        if let LimitsSource::Headers(period) = *self.gate.limits_of(&self.state.key)
            && let Err(err) =
                self.state
                    .learn(self.gate.registry(), period, &read, &self.gate.inner.spend)
        {
            self.failed("learning the limits", &err);
        }
        let refused = status == StatusCode::TOO_MANY_REQUESTS;
        self.errored = !refused && (status.is_client_error() || status.is_server_error());
        // What the refused call needed, and what went out after it, as this process saw it
        // (before the sync marks the call done).
        let refused_call = self.permit.as_ref().map(|permit| {
            let refusal = Refusal::new(Duration::ZERO, permit.cost(), permit.admitted_since());
            match permit.flight() {
                Some(flight) => refusal.of_flight(flight),
                None => refusal,
            }
        });
        if let Some(limiter) = self.limiter() {
            // When the provider counted the call, from its admission: what a sync (or, without
            // one, its settlement) credits.
            let sent = self.sent.unwrap_or_else(Instant::now);
            let counted = sent.saturating_duration_since(self.admitted)
                + counted_after(sent.elapsed(), processing_time(headers));
            if let Some(permit) = self.permit.as_mut() {
                permit.counted_after(counted);
            }
            // A whole answer's body follows its head at once: its sync waits for the call's
            // settlement, and goes with it.
            let whole = self.whole
                && !refused
                && !self.estimated.stream
                && self.permit.as_ref().is_some_and(|p| p.flight().is_some());
            match self.sync_args(&limiter, &read, refused, counted) {
                Some(args) if whole => self.pending_sync = Some(args),
                Some(args) => match self.sync(&limiter, args).await {
                    // The call is done: the sync read the provider's count without it where the
                    // provider's rules say it counted nothing of it.
                    Ok(()) if refused => {
                        if let Some(permit) = self.permit.as_mut() {
                            permit.refused();
                        }
                    }
                    Ok(()) => {}
                    Err(err) => self.failed("the header sync", &err),
                },
                None => {}
            }
        }
        // The provider has answered: the calls waiting for this one's answer go on.
        self.state.heard.store(true, Ordering::Release);
        drop(
            self.learning
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        if !refused {
            if let Some(limiter) = self.limiter() {
                limiter.answered();
            }
            return Verdict::Passed;
        }
        let (code, message, _) = error_body.map(error_detail).unwrap_or_default();
        // Gemini says when only in its body (`RetryInfo.retryDelay`).
        let pause = retry_pause(headers, now)
            .or_else(|| error_body.and_then(super::retry_info::retry_info_delay));
        let said_when = headers.contains_key("retry-after")
            || headers.contains_key("retry-after-ms")
            || pause.is_some();
        let permanent = code
            .as_deref()
            .is_some_and(|c| gate.profile.permanent_codes.iter().any(|p| p == c))
            || (!said_when && gate.profile.permanent_without_retry_after);
        let limiter = self.limiter();
        if permanent {
            if let Some(limiter) = &limiter {
                limiter.meters().permanent_429s.increment(1);
            }
            return Verdict::Permanent { code, message };
        }
        // The reset of a spent currency stands in for a missing Retry-After.
        let pause = pause.or_else(|| {
            read.iter()
                .filter(|r| r.remaining == Some(0))
                .filter_map(|r| r.reset)
                .max()
        });
        let Some(limiter) = limiter else {
            return Verdict::Transient { pause };
        };
        limiter.meters().transient_429s.increment(1);
        let cost = self.cost().unwrap_or_default();
        let spent = spent(&read, cost, limiter.limits(), error_body);
        // With the provider's pause, the key's windows are brought to where the provider's
        // are: the refused call's need is there when the pause ends.
        let refusal = pause.and_then(|hint| refused_call.map(|r| Refusal { hint, ..r }));
        let base = pause.unwrap_or_else(|| gate.backoff.base());
        self.warn_if_retried_inside(pause);
        let number = self.permit.as_ref().map_or(0, Permit::number);
        match limiter.refused(base, spent, refusal, number).await {
            Ok(paused) => Verdict::Transient {
                pause: Some(paused),
            },
            Err(err) => {
                self.failed("the penalty", &err);
                Verdict::Transient { pause }
            }
        }
    }

    /// A 429 whose call took longer than its own pause to come back was most likely retried
    /// by something between the gate and the network: every attempt must pass the gate.
    fn warn_if_retried_inside(&self, pause: Option<std::time::Duration>) {
        let (Some(sent), Some(pause)) = (self.sent, pause) else {
            return;
        };
        let took = sent.elapsed();
        if took > pause + std::time::Duration::from_secs(1)
            && !self.gate.inner.warned_inside.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                key = %self.state.key,
                ?took,
                ?pause,
                "a 429 came back after longer than its own pause: a retry layer may sit between the gate and the network, sending attempts the gate never sees; put the gate inside it (closest to the network), or let the gate retry",
            );
        }
    }

    /// Logs and counts an error that happened after the provider answered.
    fn failed(&self, what: &str, err: &Error) {
        metrics::counter!("tollgate_gate_errors_total", "key" => self.state.key.clone())
            .increment(1);
        tracing::warn!(key = %self.state.key, error = %err, "{what} failed after the provider answered; the answer stands");
    }

    /// The header sync of this call's answer, or `None` where there is nothing to sync.
    fn sync_args(
        &self,
        limiter: &Limiter,
        read: &[RateHeader],
        refused: bool,
        counted: Duration,
    ) -> Option<SyncArgs> {
        let gate = &self.gate.inner;
        let limits = limiter.limits();
        let model = gate.sync && gate.model_elsewhere;
        // A call never marked as sent counts as sent now.
        let sent = self.sent.unwrap_or_else(Instant::now);
        let mut args = SyncArgs {
            flight: self.permit.as_ref().and_then(Permit::flight).unwrap_or(0),
            charged: self.cost().unwrap_or_default(),
            refused: refused.then(|| gate.profile.refusal_returns()),
            // From the admission: the key's windows refilled from then, through the wait
            // before the call went out (an event loop's other work) and its way there.
            counted_after: counted,
            ..SyncArgs::default()
        };
        for header in read {
            let configured = limits.of(header.currency);
            if configured.is_empty() {
                continue;
            }
            if let (Some(limit), Some(capacity)) = (header.limit, configured.capacity())
                && limit != capacity
                && !self.state.warned_limit.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(
                    key = %self.state.key,
                    currency = %header.currency,
                    provider = limit,
                    configured = capacity,
                    "the provider's limit differs from the configured one",
                );
            }
            let (Some(remaining), true) = (header.remaining, gate.sync) else {
                continue;
            };
            // A rounded count is read as the most it could be (Anthropic rounds its token
            // counts, not its request counts).
            let rounding = gate.profile.rounding;
            let remaining = if rounding > 0 && header.currency != Currency::Requests {
                remaining.saturating_add(rounding.div_ceil(2) - 1)
            } else {
                remaining
            };
            let i = header.currency;
            args.remaining[i] = Some(remaining);
            if model {
                let capacity = configured.capacity().unwrap_or(0);
                let (margin, if_above) = self.state.elsewhere.margin(header.currency, capacity);
                args.margin[i] = margin;
                args.margin_if_above[i] = if_above;
            }
        }
        if model {
            args.elsewhere = self.state.elsewhere.due();
            args.returnable = self.state.elsewhere.returnable(sent);
        }
        let nothing = args.remaining.iter().all(|(_, r)| r.is_none())
            && args.elsewhere == crate::rate::PerCurrency::default();
        if nothing && !(refused && args.flight > 0) {
            self.state.elsewhere.restore(sent, args.returnable);
            return None;
        }
        Some(args)
    }

    /// Runs the header sync `args` on the store.
    async fn sync(&self, limiter: &Limiter, args: SyncArgs) -> Result<(), Error> {
        match limiter.sync(args).await {
            Ok(synced) => {
                self.synced(limiter, &args, &synced);
                Ok(())
            }
            Err(err) => {
                self.sync_failed(&args);
                Err(err)
            }
        }
    }

    /// A sync that did not happen: what the model of spending elsewhere could have given
    /// back stays its own.
    fn sync_failed(&self, args: &SyncArgs) {
        let sent = self.sent.unwrap_or_else(Instant::now);
        self.state.elsewhere.restore(sent, args.returnable);
    }

    /// After the sync `args`: the model of spending elsewhere learns what it found.
    fn synced(&self, limiter: &Limiter, args: &SyncArgs, synced: &Synced) {
        let gate = &self.gate.inner;
        let limits = limiter.limits();
        if !(gate.sync && gate.model_elsewhere) {
            return;
        }
        let sent = self.sent.unwrap_or_else(Instant::now);
        for currency in Currency::ALL {
            let i = currency;
            let compared = synced.spent[i].is_some();
            self.state.elsewhere.settled(
                currency,
                sent,
                args.returnable[i],
                synced.returned[i],
                compared,
            );
            let Some(spent) = synced.spent[i] else {
                continue;
            };
            let most = limits
                .of(currency)
                .as_slice()
                .iter()
                .map(|r| r.amount() as f64 / r.period().as_secs_f64())
                .fold(f64::INFINITY, f64::min);
            // Spending elsewhere found beyond what was corrected (the least there can be, calls
            // close to this one left out): the margin holds.
            let found_more = synced.lowered[i] > args.margin[i];
            let start =
                self.state
                    .elsewhere
                    .sample(currency, spent, synced.since, found_more, most);
            if start {
                start_charger(Arc::downgrade(&self.state.elsewhere), limiter.clone());
            }
            if currency == Currency::Tokens {
                limiter
                    .meters()
                    .elsewhere_rate
                    .set(self.state.elsewhere.rate_of(currency));
            }
        }
    }

    /// Settles the input a stream reported at its start (Anthropic's `message_start`) while
    /// the output is still being written: a cached prefix is charged for what it really cost
    /// from then on, not its estimate. The output settles at the end, in
    /// [`finish`](Call::finish).
    pub async fn settle_input(&mut self, reported: Reported) -> Result<(), Error> {
        let Some(permit) = self.permit.as_mut() else {
            return Ok(());
        };
        let usage = reported.usage(&self.gate.inner.profile, permit.limiter().limits());
        if usage.tokens.is_none() {
            return Ok(());
        }
        permit
            .settle_part(Usage::tokens_only(usage.tokens))
            .await
            .map(|_| ())
    }

    /// Settles the call with the usage its response reported: a refund for an overestimate;
    /// for an underestimate, a charge, less what a header sync or a 429 that counted this call
    /// already took off the windows (never more than it took). Answers the usage settled.
    ///
    /// A response that reported no output count is settled with the output counted from the
    /// text it generated ([`Reported::generated`]) if that is more than its reservation (else
    /// the reservation stands), and its input estimate. Usage no request could have produced
    /// (more output than its model can write; more input than twice its body and 8,192 tokens
    /// of context, or a whole window) is cut to that bound, with a warning and
    /// `tollgate_usage_clamped_total`.
    pub async fn finish(mut self, reported: Reported) -> Result<Usage, Error> {
        self.sent.get_or_insert_with(Instant::now);
        let mut reported = reported;
        // An error answer that reports no usage is billed nothing: its price goes back to
        // every budget (the windows keep their charge: what a provider counts of a failed
        // call is its own). A failing upstream had spent a tenant's budget a reservation a
        // retry.
        if self.errored
            && reported.output.is_none()
            && reported.total.is_none()
            && let Some(price) = self.estimated.price.as_mut()
        {
            *price = super::models::Price::default();
            self.estimated.fees = 0;
        }
        // An input count that is missing or can't be read (`null`, `1e30`, `NaN`) is what was
        // charged for it, and what the gate could not see, never nothing (unless a total
        // stands for it).
        let input_reported = reported.input.is_some() || reported.total.is_some();
        if !input_reported {
            reported.input = Some(self.charged_input.saturating_add(self.estimated.unseen));
        }
        if reported.output.is_none() && reported.total.is_none() {
            // No output count: the reservation stands, or what was generated if more. An
            // answer without usage is never read as "nothing was written" (a queued background
            // response, hidden reasoning, audio: output nobody saw here).
            let generated = reported.generated.unwrap_or(0);
            reported.output = Some(generated.max(self.reserved_charged()));
        }
        let extras = std::mem::take(&mut self.extras);
        let mut settled = Ok(Usage::default());
        let charged = self.cost();
        let mut clamped = false;
        let mut usage_settled = None;
        if let Some(permit) = self.permit.take() {
            let (usage, cut) = self.clamped(&reported, permit.limiter());
            clamped = cut;
            usage_settled = Some(usage);
            settled = match self.pending_sync.take() {
                // The answer's sync and the settlement, in one step of the store.
                Some(sync) => {
                    let limiter = permit.limiter().clone();
                    match permit.sync_and_settle(sync, usage).await {
                        Ok((synced, _)) => {
                            self.synced(&limiter, &sync, &synced);
                            Ok(usage)
                        }
                        Err(err) => {
                            self.sync_failed(&sync);
                            Err(err)
                        }
                    }
                }
                None => permit.settle_usage(usage).await.map(|_| usage),
            };
        }
        for permit in extras {
            let (usage, _) = self.clamped(&reported, permit.limiter());
            let key = permit_key(&permit).to_owned();
            if let Err(err) = permit.settle_usage(usage).await {
                tracing::warn!(%key, error = %err, "could not settle a call's other windows");
            }
        }
        let cut = self.cut;
        let fees = self.fees_billed(&reported);
        let spend = self
            .estimated
            .price
            .map(|price| price.billed(&reported).saturating_add(fees));
        self.tell(Settlement {
            charged,
            usage: usage_settled,
            reported,
            cut,
            clamped,
            spend,
            input_reported,
        });
        settled
    }

    /// Settles a call whose response ended before its end (the caller went away, or the
    /// upstream broke off): the reservation stands, unless more was generated than it held
    /// (as far as the response was read), which is then charged. Never less than was
    /// generated, as far as anyone saw.
    pub async fn finish_cut(mut self, reported: Reported) -> Result<Usage, Error> {
        self.sent.get_or_insert_with(Instant::now);
        // An error answer is billed nothing whether or not its body was read to its end (a
        // server writes an error's last byte, and its client stops reading there, before the
        // body reports its end): settled as a whole one, its price goes back to every budget.
        if self.errored && reported.output.is_none() && reported.total.is_none() {
            return self.finish(reported).await;
        }
        let seen = reported
            .output
            .unwrap_or(0)
            .max(reported.generated.unwrap_or(0));
        self.cut = true;
        if seen <= self.reserved_charged() {
            // Dropped after sending: every window keeps what it was charged.
            let charged = self.cost();
            let spend = self.estimated.price.map(|price| {
                price
                    .estimate(self.estimated.input, self.estimated.output.max(seen))
                    .saturating_add(self.estimated.fees)
            });
            self.tell(Settlement {
                charged,
                reported,
                cut: true,
                spend,
                ..Settlement::default()
            });
            return Ok(Usage::default());
        }
        let mut reported = reported;
        reported.output = Some(seen);
        reported.total = None;
        self.finish(reported).await
    }

    /// `reported` as usage for `limiter`'s windows, cut to what the request could have
    /// produced; and whether anything was cut.
    fn clamped(&self, reported: &Reported, limiter: &Limiter) -> (Usage, bool) {
        let profile = &self.gate.inner.profile;
        let limits = limiter.limits();
        let largest = |currency: Currency| {
            limits
                .of(currency)
                .as_slice()
                .iter()
                .map(|r| r.burst())
                .max()
        };
        // Usage no request could have produced is a lie. Input: more than twice what the body
        // holds and 8,192 tokens of context besides, or a whole window, whichever is more.
        // Output: more than its model can write (or than the request allowed, or a window,
        // whichever is most). An upstream that writes past `max_tokens` is billed for it: it
        // spent the tokens.
        let input_most = largest(Currency::Tokens)
            .unwrap_or(0)
            .max(self.estimated.input.saturating_mul(2).saturating_add(8_192));
        let window_output = match profile.output {
            super::OutputTo::OutputTokens => largest(Currency::OutputTokens),
            _ => largest(Currency::Tokens),
        }
        .unwrap_or(0);
        let output_most = self
            .estimated
            .output
            .max(self.estimated.model_most)
            .max(window_output);
        let mut cut = *reported;
        let mut clamped = false;
        let mut bound = |slot: &mut Option<u64>, most: u64| {
            if let Some(value) = slot
                && *value > most
            {
                *value = most;
                clamped = true;
            }
        };
        bound(&mut cut.input, input_most);
        bound(&mut cut.cache_write, input_most);
        bound(&mut cut.cache_read, input_most);
        bound(&mut cut.cached, input_most);
        bound(&mut cut.output, output_most);
        bound(&mut cut.total, input_most.saturating_add(output_most));
        if clamped {
            limiter.meters().clamped.increment(1);
            if !self.state.warned_clamped.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    key = %self.state.key,
                    reported = ?reported,
                    "the provider reported usage no request could have produced (more than a whole window holds); it is settled at that bound",
                );
            }
        }
        let mut usage = cut.usage(profile, limits);
        // Money is what the provider bills, as reported: a model that wrote past the output
        // its entry says, or input held by the provider (a previous response, a conversation,
        // a search), is billed in full (cut to the request's bounds, a reviewer's calls were
        // charged 1/435 of their bill). The floor of a budget's debt bounds a lie.
        if !limits.spend().is_empty()
            && let Some(price) = self.estimated.price
        {
            usage = usage.with_spend(
                price
                    .billed(reported)
                    .saturating_add(self.fees_billed(reported)),
            );
        }
        (usage, clamped)
    }
}

impl Call {
    /// What its server-side tools cost: the calls the answer reports at the dearest fee of the
    /// request's tools, or what was reserved when it reports none.
    fn fees_billed(&self, reported: &Reported) -> u64 {
        match reported.tool_calls {
            Some(calls) if self.estimated.fees > 0 => self.estimated.fee_each.saturating_mul(calls),
            _ => self.estimated.fees,
        }
    }
}

/// How long the provider says it worked on the call (OpenAI's `openai-processing-ms`).
fn processing_time(headers: &HeaderMap) -> Option<Duration> {
    let ms: f64 = headers
        .get("openai-processing-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Duration::try_from_secs_f64(ms / 1e3).ok()
}

/// How long after it went out the provider counted a call answered `round_trip` after: half the
/// round trip less the provider's work on it where it says how long that took (it counts a
/// call when it arrives, and answers when it is done), else half the round trip.
fn counted_after(round_trip: Duration, processing: Option<Duration>) -> Duration {
    round_trip.saturating_sub(processing.unwrap_or_default().min(round_trip)) / 2
}

fn permit_key(permit: &Permit) -> &str {
    permit.limiter().key()
}

/// The rate-limit headers, and whether one of them was there but could not be read.
fn rate_headers_checked(
    profile: &super::Profile,
    headers: &HeaderMap,
    now: SystemTime,
) -> (Vec<RateHeader>, bool) {
    let read = rate_headers(profile, headers, now);
    let malformed = profile.headers.iter().any(|names| {
        let unread = |name: &str, got: Option<&RateHeader>, field: fn(&RateHeader) -> bool| {
            headers.contains_key(name) && !got.is_some_and(field)
        };
        let got = read.iter().find(|r| r.currency == names.currency);
        unread(&names.remaining, got, |r| r.remaining.is_some())
            || unread(&names.limit, got, |r| r.limit.is_some())
    });
    (read, malformed)
}
