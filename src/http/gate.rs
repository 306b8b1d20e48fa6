//! The sans-IO gate: a request's key and cost before it goes, and what its response means
//! after: settlement, header sync, and whether a 429 is worth retrying.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::foreign::{Foreign, start_charger};
use super::headers::{RateHeader, rate_headers, retry_pause};
use super::profile::{OutputTo, Profile};
use super::usage::{Reported, error_code};
use crate::{
    Backoff, Cost, Currency, Error, Estimator, Limiter, Limits, Permit, Rate, Rates, Registry,
    Usage,
};

/// How a request's key is found: from the request's head and its JSON body (`Value::Null` when
/// the body is not JSON).
pub type KeyFn = dyn Fn(&http::request::Parts, &Value) -> String + Send + Sync;

/// Where a gate's keys get their limits.
#[derive(Clone)]
enum LimitsFrom {
    /// Every key has these.
    Fixed(Limits),
    /// From the first response's `limit` headers, read as so many per `period`.
    Headers(Duration),
}

/// What a response meant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Not a 429: the call went through (whatever its status).
    Passed,
    /// A rate limit: worth retrying after the pause (the key is paused for it already).
    Transient {
        /// The provider's pause, when it gave one.
        pause: Option<Duration>,
    },
    /// A 429 no retry can fix: a spent quota or a spend limit.
    Permanent {
        /// The error code the body gave, if any.
        code: Option<String>,
    },
}

/// The error an adapter answers for a permanent 429: retrying it only burns time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{profile} refused the call for good (429{}): the quota or spend limit is used up; retrying will not help", .code.as_ref().map(|c| format!(" {c}")).unwrap_or_default())]
pub struct PermanentRefusal {
    /// The provider profile's name.
    pub profile: String,
    /// The error code the body gave, if any.
    pub code: Option<String>,
}

/// How many keys a gate remembers before it forgets those that no call holds (per-tenant
/// keys must not grow it without bound).
const KEPT_KEYS: usize = 4_096;

/// How far apart two calls must have been sent for the later to be taken as unseen by the
/// provider when it answered the earlier: calls sent closer together may reach it in either
/// order. Taking one as seen when it was not lowers the windows too little, which the next
/// response corrects; the other way round would lower them for good.
const SEND_SKEW: Duration = Duration::from_millis(20);

/// One call in flight: what it was charged, and when it was sent (or admitted, until sent).
#[derive(Debug, Clone, Copy)]
struct Flight {
    cost: Cost,
    sent: tokio::time::Instant,
}

/// Calls on one key that are in flight, numbered in the order they were sent.
#[derive(Debug, Default)]
struct Ledger {
    next: u64,
    in_flight: BTreeMap<u64, Flight>,
    /// Calls numbered up to this one were already seen by the provider when a response's
    /// headers or a 429 brought the windows in line: their shortfalls are in the provider's
    /// count, and must not be charged again when they settle.
    seen_through: Option<u64>,
}

impl Ledger {
    /// A call of `cost` goes out now: its number, after every call already in flight.
    fn push(&mut self, cost: Cost) -> u64 {
        let number = self.next;
        self.next += 1;
        let sent = tokio::time::Instant::now();
        self.in_flight.insert(number, Flight { cost, sent });
        number
    }

    /// What the calls sent well after `number` (see [`SEND_SKEW`]), still in flight, were
    /// charged in `currency`: the provider had not seen them when it answered `number`.
    fn unseen_after(&self, number: u64, currency: Currency) -> u64 {
        let Some(this) = self.in_flight.get(&number) else {
            return 0;
        };
        let after = this.sent + SEND_SKEW;
        self.in_flight
            .range(number + 1..)
            .filter(|(_, flight)| flight.sent > after)
            .map(|(_, flight)| flight.cost.of(currency))
            .fold(0, u64::saturating_add)
    }

    /// Whether another call in flight was sent within [`SEND_SKEW`] of `number`: the
    /// provider's count may or may not hold it, so the count says little of spending elsewhere.
    fn ambiguous(&self, number: u64) -> bool {
        let Some(this) = self.in_flight.get(&number) else {
            return true;
        };
        self.in_flight.iter().any(|(&other, flight)| {
            other != number && flight.sent.max(this.sent) - flight.sent.min(this.sent) <= SEND_SKEW
        })
    }

    fn seen(&mut self, through: u64) {
        self.seen_through = Some(self.seen_through.map_or(through, |t| t.max(through)));
    }
}

/// How long, by default, a key's calls wait for the answer to its first call.
const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(1);

/// One key's state in a gate.
struct KeyState {
    key: String,
    limiter: OnceLock<Limiter>,
    /// Until a key's limits are known (from its first response), one call at a time; with
    /// sync on, until its first response, whatever its limits.
    learning: Arc<Semaphore>,
    /// Whether the provider has answered a call on this key.
    heard: AtomicBool,
    ledger: Mutex<Ledger>,
    warned: AtomicBool,
    foreign: Arc<Foreign>,
}

impl KeyState {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Inner {
    profile: Profile,
    estimator: Arc<dyn Estimator>,
    registry: Option<Arc<Registry>>,
    key: Arc<KeyFn>,
    limits: LimitsFrom,
    sync: bool,
    foreign: bool,
    retries: u32,
    backoff: Backoff,
    learn_timeout: Option<Duration>,
    first_answer: Option<Duration>,
    keys: Mutex<HashMap<String, Arc<KeyState>>>,
}

/// The limiter in front of a provider's HTTP API, without any HTTP client of its own: adapters
/// (the `tower` layer, async-openai, reqwest-middleware) drive it, and so can any other client.
///
/// For each request: [`admit`](Gate::admit) finds its key and cost from the request and waits
/// for its toll; [`Call::respond`] reads the response's status and headers (header sync, 429s);
/// [`Call::finish`] settles the permit with the usage the body reported.
///
/// ```
/// use tollgate::Limits;
/// use tollgate::http::{Gate, Profile, Reported, Verdict};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let gate = Gate::builder(Profile::openai())
///     .limits(Limits::parse("500/m", "30000/m")?)
///     .build()?;
/// let body = br#"{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"Hi"}]}"#;
/// let request = http::Request::post("https://api.openai.com/v1/chat/completions").body(())?;
/// let (parts, ()) = request.into_parts();
/// let mut call = gate.admit(&parts, body).await?;
/// assert_eq!(call.key(), "openai:gpt-4o");
/// // ... send it; then:
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-ratelimit-remaining-tokens", "29000".parse()?);
/// let verdict = call.respond(http::StatusCode::OK, &headers, None).await?;
/// assert_eq!(verdict, Verdict::Passed);
/// call.finish(Reported::default()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("profile", &self.inner.profile.name())
            .field("sync", &self.inner.sync)
            .field("retries", &self.inner.retries)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Gate`].
#[must_use]
pub struct GateBuilder {
    profile: Profile,
    registry: Option<Arc<Registry>>,
    key: Option<Arc<KeyFn>>,
    limits: Option<LimitsFrom>,
    sync: bool,
    foreign: bool,
    retries: u32,
    backoff: Backoff,
    learn_timeout: Option<Duration>,
    first_answer: Option<Duration>,
}

impl fmt::Debug for GateBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateBuilder")
            .field("profile", &self.profile.name())
            .finish_non_exhaustive()
    }
}

impl GateBuilder {
    /// Every key gets these limits.
    pub fn limits(mut self, limits: Limits) -> GateBuilder {
        self.limits = Some(LimitsFrom::Fixed(limits));
        self
    }

    /// Each key takes its limits from its first response's `limit` headers, read as so many
    /// per `period` (OpenAI and Anthropic state theirs per minute); until then its calls go one
    /// at a time.
    pub fn limits_from_headers(mut self, period: Duration) -> GateBuilder {
        self.limits = Some(LimitsFrom::Headers(period));
        self
    }

    /// The key of each request (per deployment, model, tenant). The default is the profile's
    /// name and the body's `model`: `openai:gpt-4o`.
    pub fn key(
        mut self,
        key: impl Fn(&http::request::Parts, &Value) -> String + Send + Sync + 'static,
    ) -> GateBuilder {
        self.key = Some(Arc::new(key));
        self
    }

    /// The registry (and so the store) the keys live in; the default is
    /// [`Registry::global`].
    pub fn registry(mut self, registry: Arc<Registry>) -> GateBuilder {
        self.registry = Some(registry);
        self
    }

    /// Whether `remaining` headers lower the windows (on by default).
    pub fn sync(mut self, sync: bool) -> GateBuilder {
        self.sync = sync;
        self
    }

    /// Whether header sync also models spending it can't see (on by default): when a sync
    /// finds the windows held more than the provider said was left, that shortfall over the
    /// time since the last sync is taken as a rate of spending elsewhere (a neighbour on the
    /// same quota), and the key is charged at that rate between syncs, corrected by each sync.
    /// While such spending is seen (from the first sync that finds it, for a few seconds after
    /// the last), syncs leave the windows 4% of their capacity below the provider's count, so
    /// that a call admitted the moment its tokens exist here finds them there too. Without it, the windows refill at the configured rate between syncs although part of it
    /// goes to the neighbour, so calls leave early and meet 429s.
    pub fn model_foreign_spending(mut self, model: bool) -> GateBuilder {
        self.foreign = model;
        self
    }

    /// How many times an adapter sends a request again after a transient 429 (default 3).
    pub fn retries(mut self, retries: u32) -> GateBuilder {
        self.retries = retries;
        self
    }

    /// The backoff between retries (floored at the provider's pause).
    pub fn backoff(mut self, backoff: Backoff) -> GateBuilder {
        self.backoff = backoff;
        self
    }

    /// How long a call may wait for its turn while a key's limits are still unknown
    /// (default 60 s; `None`: no deadline).
    pub fn learn_timeout(mut self, timeout: Option<Duration>) -> GateBuilder {
        self.learn_timeout = timeout;
        self
    }

    /// With sync on, how long a key's calls wait for the answer to its first call before they
    /// go anyway (default 1 s; `None`: they don't wait). The first answer tells what others
    /// have already spent from the quota; calls sent before it are admitted against a level
    /// the provider may not have.
    pub fn first_answer_wait(mut self, wait: Option<Duration>) -> GateBuilder {
        self.first_answer = wait;
        self
    }

    /// The gate; fails when no limits were given, or the profile's estimator does not exist.
    pub fn build(self) -> Result<Gate, Error> {
        let no_limits = || Error::NoLimits {
            key: format!("{} (http gate)", self.profile.name()),
        };
        let limits = self.limits.clone().ok_or_else(no_limits)?;
        if let LimitsFrom::Fixed(limits) = &limits
            && limits.is_empty()
        {
            return Err(no_limits());
        }
        let estimator = tollgate_estimators::estimator_strict(self.profile.estimator_name())?;
        let key = self.key.unwrap_or_else(|| {
            let name = self.profile.name().to_owned();
            Arc::new(move |_: &http::request::Parts, body: &Value| {
                match body.get("model").and_then(Value::as_str) {
                    Some(model) => format!("{name}:{model}"),
                    None => name.clone(),
                }
            })
        });
        Ok(Gate {
            inner: Arc::new(Inner {
                profile: self.profile,
                estimator,
                registry: self.registry,
                key,
                limits,
                sync: self.sync,
                foreign: self.foreign,
                retries: self.retries,
                backoff: self.backoff,
                learn_timeout: self.learn_timeout,
                first_answer: self.first_answer,
                keys: Mutex::new(HashMap::new()),
            }),
        })
    }
}

impl Gate {
    /// A gate for `profile`; give it limits (or [`limits_from_headers`](GateBuilder::limits_from_headers)).
    pub fn builder(profile: Profile) -> GateBuilder {
        GateBuilder {
            profile,
            registry: None,
            key: None,
            limits: None,
            sync: true,
            foreign: true,
            retries: 3,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            learn_timeout: Some(Duration::from_secs(60)),
            first_answer: Some(FIRST_ANSWER_WAIT),
        }
    }

    /// How many keys the gate remembers now (at most a few thousand beyond those that calls
    /// in flight hold).
    pub fn remembered_keys(&self) -> usize {
        self.inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.inner.profile
    }

    /// How many times adapters retry a transient 429.
    pub fn retries(&self) -> u32 {
        self.inner.retries
    }

    /// How long to wait before retry `attempt` (0 for the first) of a transient 429: the
    /// jittered exponential backoff, never shorter than the provider's pause.
    pub fn retry_delay(&self, attempt: u32, pause: Option<Duration>) -> Duration {
        let backoff = self.inner.backoff.sleep_for(Duration::ZERO, attempt);
        backoff.max(pause.unwrap_or(Duration::ZERO))
    }

    fn registry(&self) -> &Registry {
        self.inner.registry.as_deref().unwrap_or(Registry::global())
    }

    fn state(&self, key: String) -> Result<Arc<KeyState>, Error> {
        let mut keys = self
            .inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = keys.get(&key) {
            return Ok(Arc::clone(state));
        }
        if keys.len() >= KEPT_KEYS {
            // Forget the keys no call holds: their windows live on in the store, and what is
            // lost (the model of spending elsewhere, limits learned from headers, the warning
            // already given) is learned again on their next call.
            keys.retain(|_, state| Arc::strong_count(state) > 1);
        }
        let limiter = OnceLock::new();
        if let LimitsFrom::Fixed(limits) = &self.inner.limits {
            let _ = limiter.set(self.registry().limiter(&key, limits)?);
        }
        let state = Arc::new(KeyState {
            key: key.clone(),
            limiter,
            learning: Arc::new(Semaphore::new(1)),
            heard: AtomicBool::new(false),
            ledger: Mutex::new(Ledger::default()),
            warned: AtomicBool::new(false),
            foreign: Arc::new(Foreign::default()),
        });
        keys.insert(key, Arc::clone(&state));
        Ok(state)
    }

    /// What a request body costs under the profile, before any limits are applied: its input
    /// tokens, plus the output it reserves where the profile charges it.
    pub fn cost_of(&self, body: &Value, limits: Option<&Limits>) -> Result<Cost, Error> {
        if body.is_null() {
            return Ok(Cost::call(0));
        }
        let estimator = &self.inner.estimator;
        let estimate = crate::counting::count(tollgate_estimators::text_len(body), || {
            tollgate_estimators::estimate(&**estimator, body)
        })?;
        Ok(match self.inner.profile.output {
            OutputTo::Tokens => Cost::call(estimate.total()),
            OutputTo::OutputTokens if limits.is_none_or(|l| !l.output_tokens().is_empty()) => {
                Cost::call(estimate.input_tokens).with_output_tokens(estimate.reserved_output)
            }
            OutputTo::OutputTokens | OutputTo::Nowhere => Cost::call(estimate.input_tokens),
        })
    }

    /// Finds the request's key and cost, and waits for its toll (or, on a key whose limits are
    /// still unknown, for its turn to go alone).
    pub async fn admit(&self, parts: &http::request::Parts, body: &[u8]) -> Result<Call, Error> {
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let key = (self.inner.key)(parts, &value);
        let state = self.state(key)?;
        let stream = value.get("stream").and_then(Value::as_bool) == Some(true);
        loop {
            if let Some(limiter) = state.limiter.get() {
                // With sync on, a key's first call goes alone: the windows can't know what
                // others spent from the quota until the provider has said so once, and calls
                // sent meanwhile would be admitted against a level nobody has.
                let alone = match self.inner.first_answer {
                    Some(wait) if self.inner.sync && !state.heard.load(Ordering::Acquire) => {
                        let turn = Arc::clone(&state.learning).acquire_owned();
                        match tokio::time::timeout(wait, turn).await {
                            Ok(turn) => {
                                let turn = turn.expect("the semaphore is never closed");
                                (!state.heard.load(Ordering::Acquire)).then_some(turn)
                            }
                            // The first answer is slow in coming: go without it.
                            Err(_) => None,
                        }
                    }
                    _ => None,
                };
                let cost = self.cost_of(&value, Some(limiter.limits()))?;
                let permit = limiter.acquire(cost).await?;
                let number = state.ledger().push(cost);
                return Ok(Call {
                    gate: self.clone(),
                    state,
                    number: Some(number),
                    permit: Some(permit),
                    _learning: alone,
                    stream,
                });
            }
            let turn = self.turn(&state).await?;
            if state.limiter.get().is_some() {
                continue;
            }
            return Ok(Call {
                gate: self.clone(),
                state,
                number: None,
                permit: None,
                _learning: Some(turn),
                stream,
            });
        }
    }

    /// The key's turn to go alone, within the gate's learning timeout.
    async fn turn(&self, state: &KeyState) -> Result<OwnedSemaphorePermit, Error> {
        let turn = Arc::clone(&state.learning).acquire_owned();
        let turn = match self.inner.learn_timeout {
            Some(timeout) => {
                tokio::time::timeout(timeout, turn)
                    .await
                    .map_err(|_| Error::Timeout {
                        key: state.key.clone(),
                        waited: timeout,
                        needed: None,
                    })?
            }
            None => turn.await,
        };
        Ok(turn.expect("the semaphore is never closed"))
    }

    fn learn(&self, state: &KeyState, read: &[RateHeader]) -> Result<(), Error> {
        let LimitsFrom::Headers(period) = self.inner.limits else {
            return Ok(());
        };
        let rates = |currency| -> Result<Rates, Error> {
            match read
                .iter()
                .find(|r| r.currency == currency)
                .and_then(|r| r.limit)
                .filter(|&n| n > 0)
            {
                Some(limit) => Ok(Rates::from(Rate::new(limit, period)?)),
                None => Ok(Rates::none()),
            }
        };
        let limits = Limits::new(rates(Currency::Requests)?, rates(Currency::Tokens)?)
            .with_output_tokens(rates(Currency::OutputTokens)?);
        if limits.is_empty() {
            return Ok(());
        }
        let limiter = self.registry().limiter(&state.key, &limits)?;
        tracing::info!(key = %state.key, %limits, "limits taken from the provider's headers");
        let _ = state.limiter.set(limiter);
        Ok(())
    }
}

/// One request on its way: admitted, and waiting for its response.
///
/// Dropping it without [`finish`](Call::finish) keeps what was charged (the estimate).
pub struct Call {
    gate: Gate,
    state: Arc<KeyState>,
    number: Option<u64>,
    permit: Option<Permit>,
    _learning: Option<OwnedSemaphorePermit>,
    stream: bool,
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("key", &self.state.key)
            .field("cost", &self.permit.as_ref().map(Permit::cost))
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Some(number) = self.number {
            self.state.ledger().in_flight.remove(&number);
        }
    }
}

impl Call {
    /// The key.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// What the call paid (`None` while its key's limits are unknown).
    pub fn cost(&self) -> Option<Cost> {
        self.permit.as_ref().map(Permit::cost)
    }

    /// Marks the call as sent now: calls are taken to reach the provider in the order they are
    /// sent, and a response's `remaining` to count the calls sent before it (its own
    /// included) and none sent after. Adapters call this right before sending; a call never
    /// marked keeps its place in the order of admission.
    pub fn sending(&mut self) {
        if let Some(number) = self.number.as_mut() {
            let mut ledger = self.state.ledger();
            if let Some(flight) = ledger.in_flight.remove(number) {
                *number = ledger.push(flight.cost);
            }
        }
    }

    /// True when the request asked for a stream (`"stream": true`): its usage comes in
    /// server-sent events.
    pub fn is_stream(&self) -> bool {
        self.stream
    }

    /// Reads the response's status and headers: brings the key's windows in line with the
    /// `remaining` headers (only ever lowering them), takes a key's limits from its first
    /// response when it has none, and for a 429 says whether it is worth retrying, pausing the
    /// key for a transient one. `error_body` is the body of a 429, for its error code.
    pub async fn respond(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
        error_body: Option<&[u8]>,
    ) -> Result<Verdict, Error> {
        let gate = &self.gate.inner;
        let now = SystemTime::now();
        let read = rate_headers(&gate.profile, headers, now);
        if self.state.limiter.get().is_none() {
            self.gate.learn(&self.state, &read)?;
        }
        if let Some(limiter) = self.state.limiter.get() {
            self.sync(limiter, &read, status == StatusCode::TOO_MANY_REQUESTS)
                .await?;
        }
        // The provider has answered: the calls waiting for this one's answer go on (those
        // still learning limits that weren't in these headers still go one at a time).
        self.state.heard.store(true, Ordering::Release);
        self._learning = None;
        if status != StatusCode::TOO_MANY_REQUESTS {
            return Ok(Verdict::Passed);
        }
        let code = error_body.and_then(error_code);
        let pause = retry_pause(headers, now);
        let permanent = code
            .as_deref()
            .is_some_and(|c| gate.profile.permanent_codes.iter().any(|p| p == c))
            || (pause.is_none() && gate.profile.permanent_without_retry_after);
        if permanent {
            return Ok(Verdict::Permanent { code });
        }
        // The reset of a spent currency stands in for a missing Retry-After.
        let pause = pause.or_else(|| {
            read.iter()
                .filter(|r| r.remaining == Some(0))
                .filter_map(|r| r.reset)
                .max()
        });
        if let Some(limiter) = self.state.limiter.get() {
            limiter
                .penalize(pause.unwrap_or_else(|| gate.backoff.base()))
                .await?;
            self.state.foreign.penalized();
            // Every call in flight was either seen by the provider before this 429 or will be
            // refused too; none may charge a shortfall on top of the emptied windows.
            let mut ledger = self.state.ledger();
            if let Some(&last) = ledger.in_flight.keys().next_back() {
                ledger.seen(last);
            }
        }
        Ok(Verdict::Transient { pause })
    }

    async fn sync(
        &self,
        limiter: &Limiter,
        read: &[RateHeader],
        refused: bool,
    ) -> Result<(), Error> {
        let gate = &self.gate.inner;
        let limits = limiter.limits();
        let model = gate.sync && gate.foreign;
        if model {
            // What the model says was spent elsewhere is charged first, so that a sync
            // measures only what the model missed.
            self.state.foreign.charge(limiter).await?;
        }
        for header in read {
            let configured = limits.of(header.currency);
            if configured.is_empty() {
                continue;
            }
            if let (Some(limit), Some(capacity)) = (header.limit, configured.capacity())
                && limit != capacity
                && !self.state.warned.swap(true, Ordering::Relaxed)
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
            // A rounded count is read as the most it could be.
            let rounding = gate.profile.rounding;
            let remaining = if rounding > 0 {
                remaining.saturating_add(rounding.div_ceil(2) - 1)
            } else {
                remaining
            };
            let (target, clear) = match self.number {
                Some(number) => {
                    let mut ledger = self.state.ledger();
                    ledger.seen(number);
                    let mut unseen = ledger.unseen_after(number, header.currency);
                    // A refused call is charged here and was not there.
                    if refused && let Some(flight) = ledger.in_flight.get(&number) {
                        unseen = unseen.saturating_add(flight.cost.of(header.currency));
                    }
                    (remaining.saturating_sub(unseen), !ledger.ambiguous(number))
                }
                // The call that taught the limits was never charged here, and nothing else
                // was in flight.
                None => (remaining, false),
            };
            let capacity = configured.capacity().unwrap_or(0);
            let margin = if model {
                self.state.foreign.margin(header.currency, capacity)
            } else {
                0
            };
            let lowered = limiter
                .lower(header.currency, target.saturating_sub(margin))
                .await?;
            let target = target.saturating_sub(margin);
            if model && clear && lowered > 0 {
                self.state.foreign.spent_elsewhere(header.currency);
                if margin == 0 {
                    // Seen for the first time: the margin holds from this sync on.
                    let margin = self.state.foreign.margin(header.currency, capacity);
                    limiter
                        .lower(header.currency, target.saturating_sub(margin))
                        .await?;
                }
            }
            let most = configured
                .as_slice()
                .iter()
                .map(|r| r.amount() as f64 / r.period().as_secs_f64())
                .fold(f64::INFINITY, f64::min);
            if model
                && self
                    .state
                    .foreign
                    .synced(header.currency, lowered, target, most, clear)
            {
                start_charger(Arc::downgrade(&self.state.foreign), limiter.clone());
            }
        }
        Ok(())
    }

    /// Settles the call with the usage its response reported: a refund for an overestimate;
    /// a charge for an underestimate, unless the provider had already counted this call when
    /// a header sync or a 429 brought the windows in line (it is in that count: charging it
    /// again would count it twice). Answers the usage settled.
    pub async fn finish(mut self, reported: Reported) -> Result<Usage, Error> {
        let Some(permit) = self.permit.take() else {
            return Ok(Usage::default());
        };
        let charged = permit.cost();
        let mut usage = reported.usage(&self.gate.inner.profile, permit.limiter().limits());
        let seen = {
            let ledger = self.state.ledger();
            matches!((self.number, ledger.seen_through), (Some(n), Some(t)) if n <= t)
        };
        if seen {
            usage.tokens = usage.tokens.map(|t| t.min(charged.tokens));
            usage.output_tokens = usage.output_tokens.map(|t| t.min(charged.output_tokens));
        }
        permit.settle_usage(usage).await?;
        Ok(usage)
    }
}
