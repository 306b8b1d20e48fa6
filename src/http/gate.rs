//! The gate and its builder: which key a request belongs to, what it costs, and its wait for
//! the toll.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use super::keys::GateKey;
use super::profile::{OutputTo, Profile};
use super::request;
use crate::backoff::Backoff;
use crate::cost::Cost;
use crate::error::Error;
use crate::rate::{Currency, Limits};
use crate::registry::Registry;
use tollgate_estimators::Estimator;

/// How a request's key is found: from the request's head and its JSON body (`Value::Null` when
/// the body is not JSON).
pub type KeyFn = dyn Fn(&http::request::Parts, &Value) -> String + Send + Sync;

/// Where a gate's keys get their limits.
#[derive(Clone)]
pub(super) enum LimitsSource {
    /// Every key has these.
    Fixed(Limits),
    /// From the responses' `limit` headers, read as so many per `period`.
    Headers(Duration),
}

/// How many keys a gate remembers before it forgets those that no call holds (per-tenant
/// keys must not grow it without bound).
const KEPT_KEYS: usize = 4_096;

/// How long, by default, a key's calls wait for the answer to its first call.
pub(super) const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(1);

/// The most a request body decodes to, by default.
const MAX_BODY: usize = 32 << 20;

/// How long, by default, a call may wait for its toll, retries included.
const TIMEOUT: Duration = Duration::from_secs(60);

pub(super) struct Inner {
    pub(super) profile: Profile,
    estimator: Arc<dyn Estimator>,
    registry: Option<Arc<Registry>>,
    key: Arc<KeyFn>,
    pub(super) limits: LimitsSource,
    /// Keys with limits of their own (a model's).
    pub(super) key_limits: HashMap<String, LimitsSource>,
    /// A budget every key keeps beside the limits learned from headers.
    pub(super) spend: crate::rate::Rates,
    pub(super) sync: bool,
    pub(super) model_elsewhere: bool,
    retries: u32,
    pub(super) backoff: Backoff,
    timeout: Option<Duration>,
    pub(super) first_answer: Option<Duration>,
    margin: crate::cost::Margin,
    off_worker_above: usize,
    max_body: usize,
    keys: Mutex<HashMap<String, Arc<GateKey>>>,
    /// A 429 came back from inside the layer once: warned.
    pub(super) warned_inside: std::sync::atomic::AtomicBool,
}

/// The limiter in front of a provider's HTTP API, without any HTTP client of its own: adapters
/// (the `tower` layer, async-openai, reqwest-middleware) drive it, and so can any other client.
///
/// For each request: [`admit`](Gate::admit) finds its key and cost from the request and waits
/// for its toll; [`Call::respond`](super::Call::respond) reads the response's status and headers (header sync, 429s);
/// [`Call::finish`](super::Call::finish) settles the permit with the usage the body reported.
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
/// call.sending();
/// // ... send it; then:
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-ratelimit-remaining-tokens", "29000".parse()?);
/// let verdict = call.respond(http::StatusCode::OK, &headers, None).await;
/// assert_eq!(verdict, Verdict::Passed);
/// call.finish(Reported::default()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Gate {
    pub(super) inner: Arc<Inner>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("profile", &self.inner.profile.name())
            .field("sync", &self.inner.sync)
            .field("retries", &self.inner.retries)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Gate`].
#[must_use]
pub struct GateBuilder {
    profile: Profile,
    registry: Option<Arc<Registry>>,
    key: Option<Arc<KeyFn>>,
    limits: Option<LimitsSource>,
    key_limits: HashMap<String, LimitsSource>,
    spend: crate::rate::Rates,
    sync: bool,
    model_elsewhere: bool,
    retries: u32,
    backoff: Backoff,
    timeout: Option<Duration>,
    first_answer: Option<Duration>,
    margin: crate::cost::Margin,
    off_worker_above: usize,
    max_body: usize,
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
        self.limits = Some(LimitsSource::Fixed(limits));
        self
    }

    /// Each key takes its limits from the responses' `limit` headers, read as so many per
    /// `period` (OpenAI and Anthropic state theirs per minute): each currency when its headers
    /// first come, and again when the provider's limit changes. Until a key has a limit, its
    /// calls go one at a time. A limit of zero, or above a trillion, is not learned.
    pub fn limits_from_headers(mut self, period: Duration) -> GateBuilder {
        self.limits = Some(LimitsSource::Headers(period));
        self
    }

    /// `key` gets these limits instead of the gate's: a model whose limits differ from the
    /// others' (OpenAI states its limits per model).
    ///
    /// ```
    /// use tollgate::Limits;
    /// use tollgate::http::{Gate, Profile};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let gate = Gate::builder(Profile::openai())
    ///     .limits(Limits::parse("500/m", "30000/m")?)
    ///     .key_limits("openai:gpt-4o-mini", Limits::parse("500/m", "200000/m")?)
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn key_limits(mut self, key: impl Into<String>, limits: Limits) -> GateBuilder {
        self.key_limits
            .insert(key.into(), LimitsSource::Fixed(limits));
        self
    }

    /// `key` takes its limits from its responses' `limit` headers (see
    /// [`limits_from_headers`](GateBuilder::limits_from_headers)), whatever the gate's.
    pub fn key_limits_from_headers(
        mut self,
        key: impl Into<String>,
        period: Duration,
    ) -> GateBuilder {
        self.key_limits
            .insert(key.into(), LimitsSource::Headers(period));
        self
    }

    /// A spend budget every key keeps, in micro-dollars (`Rates::parse_money("$50/d")`),
    /// beside its limits (given, or learned from the headers): each call pays its price at
    /// most when it is admitted (its model's prices, from the profile's table) and what its
    /// usage is billed when it settles. A call whose model has no price is refused
    /// ([`Error::Unpriced`]).
    ///
    /// ```
    /// use tollgate::{Limits, Rates};
    /// use tollgate::http::{Gate, Profile};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let gate = Gate::builder(Profile::openai())
    ///     .limits(Limits::parse("500/m", "30000/m")?)
    ///     .spend(Rates::parse_money("$5/d")?)
    ///     .build()?;
    /// let body = br#"{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"Hi"}]}"#;
    /// let (parts, ()) = http::Request::post("https://api.openai.com/v1/chat/completions").body(())?.into_parts();
    /// let call = gate.admit(&parts, body).await?;
    /// // Its input (8 tokens, 9 with the 3% estimate margin) at $2.50 a million and
    /// // 100 output tokens at $10 a million, rounded up.
    /// assert_eq!(call.cost().unwrap().spend, 1_023);
    /// # Ok(())
    /// # }
    /// ```
    pub fn spend(mut self, budget: crate::rate::Rates) -> GateBuilder {
        self.spend = budget;
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
    /// finds the windows held more than the provider said was left (after the refill since
    /// the provider counted, and the calls it had not seen yet), that shortfall over the time
    /// since the last sync is taken as a rate of spending elsewhere (a neighbour on the same
    /// quota), and the key is charged at that rate between syncs, corrected by each sync.
    /// While such spending is seen (from the first sync that finds it, for a few seconds after
    /// the last), syncs leave the windows 4% of their capacity below the provider's count, so
    /// that a call admitted the moment its tokens exist here finds them there too. Without
    /// it, the windows refill at the configured rate between syncs although part of it goes
    /// to the neighbour, so calls leave early and meet 429s.
    pub fn model_spending_elsewhere(mut self, model: bool) -> GateBuilder {
        self.model_elsewhere = model;
        self
    }

    /// The old name of [`model_spending_elsewhere`](GateBuilder::model_spending_elsewhere).
    #[deprecated(note = "renamed `model_spending_elsewhere`: one name, elsewhere, for the idea")]
    pub fn model_foreign_spending(self, model: bool) -> GateBuilder {
        self.model_spending_elsewhere(model)
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

    /// The longest a call may take to be let through, from its first admission: its wait for
    /// the toll, its retries after transient 429s and their pauses (default 60 s; `None`: no
    /// deadline). A retry whose pause would end past the deadline fails at once with
    /// [`Error::Timeout`] carrying the pause.
    pub fn timeout(mut self, timeout: Option<Duration>) -> GateBuilder {
        self.timeout = timeout;
        self
    }

    /// Bodies with at least this many bytes of text are counted off the async worker, on a
    /// multi-threaded tokio runtime (default 256 KB). `usize::MAX` counts everything where it
    /// is.
    pub fn count_off_worker_above(mut self, bytes: usize) -> GateBuilder {
        self.off_worker_above = bytes;
        self
    }

    /// The most bytes a request body may decode to from its `content-encoding` (default
    /// 32 MiB): a larger one is refused with [`Error::Body`] before it is estimated, so that a
    /// few kilobytes of gzip can't make the gate read gigabytes.
    pub fn max_body(mut self, bytes: usize) -> GateBuilder {
        self.max_body = bytes;
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

    /// What is added to each request's estimated input before it is charged (default
    /// [`Margin::DEFAULT`](crate::Margin::DEFAULT), 3%), given back when the call settles with
    /// its usage: the provider's own count strays from the estimate, and the calls in flight
    /// carry that error unseen until their answers come. [`Margin::NONE`](crate::Margin::NONE)
    /// charges the estimate as it is.
    pub fn estimate_margin(mut self, margin: crate::cost::Margin) -> GateBuilder {
        self.margin = margin;
        self
    }

    /// The gate; fails when no limits were given, or the profile's estimator does not exist.
    pub fn build(self) -> Result<Gate, Error> {
        let no_limits = || Error::NoLimits {
            key: format!("{} (http gate)", self.profile.name()),
        };
        let limits = self.limits.clone().ok_or_else(no_limits)?;
        let with_spend = |limits: LimitsSource| -> Result<LimitsSource, Error> {
            match limits {
                LimitsSource::Fixed(limits) if limits.is_empty() && self.spend.is_empty() => {
                    Err(no_limits())
                }
                LimitsSource::Fixed(limits) if !self.spend.is_empty() => {
                    Ok(LimitsSource::Fixed(limits.with_spend(self.spend.clone())))
                }
                other => Ok(other),
            }
        };
        let limits = with_spend(limits)?;
        let key_limits = self
            .key_limits
            .iter()
            .map(|(key, limits)| Ok((key.clone(), with_spend(limits.clone())?)))
            .collect::<Result<HashMap<_, _>, Error>>()?;
        let estimator = crate::counting::estimator_named(self.profile.estimator_name())?;
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
                key_limits,
                spend: self.spend,
                sync: self.sync,
                model_elsewhere: self.model_elsewhere,
                retries: self.retries,
                backoff: self.backoff,
                timeout: self.timeout,
                first_answer: self.first_answer,
                margin: self.margin,
                off_worker_above: self.off_worker_above,
                max_body: self.max_body,
                keys: Mutex::new(HashMap::new()),
                warned_inside: std::sync::atomic::AtomicBool::new(false),
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
            key_limits: HashMap::new(),
            spend: crate::rate::Rates::none(),
            sync: true,
            model_elsewhere: true,
            retries: 3,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            timeout: Some(TIMEOUT),
            first_answer: Some(FIRST_ANSWER_WAIT),
            margin: crate::cost::Margin::DEFAULT,
            off_worker_above: crate::counting::DEFAULT_OFF_WORKER_ABOVE,
            max_body: MAX_BODY,
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

    /// The limiter that holds `key`'s windows now: the one of the fixed limits, or the one of
    /// the limits last learned from the headers. `None` while a key's limits are still being
    /// learned, or for a key the gate doesn't remember (it forgets keys no call holds once it
    /// remembers thousands). For a status page: read its levels with
    /// [`Limiter::snapshot`](crate::Limiter::snapshot) and its queue with
    /// [`Limiter::waiters`](crate::Limiter::waiters).
    pub fn limiter_of(&self, key: &str) -> Option<crate::limiter::Limiter> {
        self.inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .and_then(|keyed| keyed.limiter())
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.inner.profile
    }

    /// How many times adapters retry a transient 429.
    pub fn retries(&self) -> u32 {
        self.inner.retries
    }

    /// The longest a call may take to be let through, retries included.
    pub fn timeout(&self) -> Option<Duration> {
        self.inner.timeout
    }

    /// How long to wait before retry `attempt` (0 for the first) of a transient 429: the
    /// jittered exponential backoff, never shorter than the provider's pause.
    pub fn retry_delay(&self, attempt: u32, pause: Option<Duration>) -> Duration {
        let backoff = self.inner.backoff.sleep_for(Duration::ZERO, attempt);
        backoff.max(pause.unwrap_or(Duration::ZERO))
    }

    /// The deadline of a call whose first admission starts now (`None`: no deadline).
    pub fn deadline(&self) -> Option<tokio::time::Instant> {
        self.inner
            .timeout
            .and_then(|t| tokio::time::Instant::now().checked_add(t))
    }

    /// How long an adapter sleeps before retry `attempt` after a transient 429 with `pause`,
    /// or [`Error::Timeout`] (carrying the pause) when that sleep would end past `deadline`.
    pub(crate) fn retry_within(
        &self,
        key: &str,
        attempt: u32,
        pause: Option<Duration>,
        deadline: Option<tokio::time::Instant>,
        started: tokio::time::Instant,
    ) -> Result<Duration, Error> {
        let delay = self.retry_delay(attempt, pause);
        match deadline {
            Some(deadline) if tokio::time::Instant::now() + delay > deadline => {
                Err(Error::Timeout {
                    key: key.to_owned(),
                    waited: started.elapsed(),
                    needed: Some(delay),
                })
            }
            _ => Ok(delay),
        }
    }

    /// Where `key` gets its limits: its own, or the gate's.
    pub(super) fn limits_of(&self, key: &str) -> &LimitsSource {
        self.inner.key_limits.get(key).unwrap_or(&self.inner.limits)
    }

    /// The limits `key` is configured with (`None`: they come from its responses' headers).
    pub fn configured_limits(&self, key: &str) -> Option<&Limits> {
        match self.limits_of(key) {
            LimitsSource::Fixed(limits) => Some(limits),
            LimitsSource::Headers(_) => None,
        }
    }

    pub(super) fn estimator(&self) -> Arc<dyn Estimator> {
        Arc::clone(&self.inner.estimator)
    }

    pub(super) fn registry(&self) -> &Registry {
        self.inner.registry.as_deref().unwrap_or(Registry::global())
    }

    pub(super) fn state(&self, key: String) -> Result<Arc<GateKey>, Error> {
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
        let limiter = match self.limits_of(&key) {
            LimitsSource::Fixed(limits) => Some(self.registry().limiter(&key, limits)?),
            LimitsSource::Headers(_) => None,
        };
        let state = Arc::new(GateKey::new(key.clone(), limiter));
        keys.insert(key, Arc::clone(&state));
        Ok(state)
    }

    /// Reads a request the way its upstream will (its `content-encoding` undone, its JSON read
    /// as a Python or JavaScript server reads it), finds its key, and estimates it: its input
    /// tokens, the output it reserves (`max_tokens` × `n`, or its model's most output when it
    /// names none), and, for a stream that did not ask for its usage on a profile that can,
    /// the body that asks for it.
    ///
    /// A body that no server would read as JSON is priced at the most tokens its bytes can
    /// make (one a byte), never nothing. Fails with [`Error::Body`] for a `content-encoding`
    /// the gate can't undo or a body that decodes past [`max_body`](GateBuilder::max_body).
    pub fn read(&self, parts: &http::request::Parts, body: &[u8]) -> Result<Estimated, Error> {
        let decoded = request::decode_content(&parts.headers, body, self.inner.max_body)?;
        let changed = match &decoded {
            Cow::Owned(bytes) => Some(Bytes::from(bytes.clone())),
            Cow::Borrowed(_) => None,
        };
        let read = request::read(changed, &decoded);
        let key = (self.inner.key)(parts, &read.value);
        let path = parts.uri.path();
        let stream = read.value.get("stream").and_then(Value::as_bool) == Some(true);
        let model = read
            .value
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let generative = generative(path);
        // What the request says it may write: the largest of its output limits (an upstream
        // may read any of them), times the copies it asks for. A limit of 0, or one that is not
        // a number, bounds nothing (vLLM and SGLang read 0 as "no limit").
        let named = MAX_TOKENS
            .iter()
            .filter_map(|name| read.value.get(*name).and_then(count_of))
            .filter(|n| *n > 0)
            .max();
        let copies = ["n", "best_of"]
            .iter()
            .filter_map(|name| read.value.get(*name).and_then(count_of))
            .max()
            .unwrap_or(1)
            .clamp(1, MOST_COPIES);
        let explicit = named.is_some();
        let (input, reserved) = if read.unreadable {
            (request::bound_of(read.len), 0)
        } else if read.value.is_null() {
            (0, 0)
        } else {
            let estimator = &self.inner.estimator;
            let above = self.inner.off_worker_above;
            let value = &read.value;
            // Images at the request's model's own rule (gpt-4o-mini bills a tile 33 times
            // what gpt-4o does), else the estimator's.
            let billing = match model
                .as_deref()
                .and_then(tollgate_estimators::ImageRule::for_model)
            {
                Some(rule) => tollgate_estimators::Billing::default().image_rule(rule),
                None => tollgate_estimators::Billing::default(),
            };
            let estimate =
                crate::counting::count(above, tollgate_estimators::text_len(value), || {
                    tollgate_estimators::estimate_with(&**estimator, value, &billing)
                })?;
            (estimate.input_tokens, estimate.reserved_output)
        };
        let _ = reserved;
        let most_output = match named {
            Some(named) => named.saturating_mul(copies),
            None if generative && self.inner.profile.output != OutputTo::Nowhere => self
                .inner
                .profile
                .output_without_max_tokens(model.as_deref())
                .saturating_mul(copies),
            None => 0,
        };
        let asks_usage = read
            .value
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            == Some(true);
        let usage_path = path.ends_with("/chat/completions") || path.ends_with("/completions");
        let with_usage = (stream && !asks_usage && usage_path && self.inner.profile.stream_usage)
            .then(|| request::with_stream_usage(&read, &decoded))
            .flatten();
        let usage_added = with_usage.is_some();
        let model_most = self
            .inner
            .profile
            .output_without_max_tokens(model.as_deref())
            .saturating_mul(copies);
        // Azure bills a deployment at the model it serves, whatever the body's `model` says:
        // priced by the deployment's name (a table entry the caller gives it), never the body's.
        let deployment = (self.inner.profile.name == "azure-openai")
            .then(|| {
                let at = path.find("/openai/deployments/")?;
                let rest = &path[at + "/openai/deployments/".len()..];
                rest.split('/').next().filter(|name| !name.is_empty())
            })
            .flatten();
        let price = match deployment {
            Some(deployment) => self.inner.profile.price_of(deployment),
            None => model
                .as_deref()
                .and_then(|m| self.inner.profile.price_of(m)),
        };
        let (fees, fee_each) = tool_fees(&self.inner.profile, &read.value);
        Ok(Estimated {
            key,
            model,
            stream,
            input,
            output: most_output,
            explicit,
            model_most,
            send: with_usage.or(read.decoded),
            usage_added,
            price,
            unseen: 0,
            fees,
            fee_each,
            share: None,
        })
    }

    /// The input a request is charged: its estimate and the gate's margin (given back when it
    /// settles with its usage), never past a token window the estimate alone fits in.
    pub(super) fn charged_input(&self, estimated: &Estimated, limits: Option<&Limits>) -> u64 {
        if self.inner.estimator.errs_high() {
            return estimated.input;
        }
        let input = self.inner.margin.on(estimated.input);
        let Some(cap) = limits.and_then(|l| l.tokens().as_slice().iter().map(|r| r.burst()).min())
        else {
            return input;
        };
        // The output reserved in the token window comes after the input, cut to the room it
        // leaves: the margin takes none of the room a call would have had without it.
        let reserved = match self.inner.profile.output {
            OutputTo::Tokens => estimated.output,
            _ => 0,
        };
        let room = cap.saturating_sub(estimated.input.saturating_add(reserved));
        input.min(estimated.input.saturating_add(room))
    }

    /// What an estimated request costs on a key with `limits` (`None`: before any limits are
    /// known): its input, plus its output where the profile charges it, and, where the key
    /// keeps a spend budget, its price at most (its input and reserved output at its model's
    /// prices), the input with the gate's [estimate margin](GateBuilder::estimate_margin). A reservation the request did not ask for (no `max_tokens`) is cut to what the
    /// key's windows can hold beside its input, so that a call naming none is never refused as
    /// too large for them.
    ///
    /// Fails with [`Error::Unpriced`] when the key keeps a spend budget and the profile has no
    /// price for the request's model: a budget can't be kept for a call nobody can price.
    pub fn cost_of(&self, estimated: &Estimated, limits: Option<&Limits>) -> Result<Cost, Error> {
        let smallest = |currency: Currency| {
            limits.and_then(|l| l.of(currency).as_slice().iter().map(|r| r.burst()).min())
        };
        let input = self.charged_input(estimated, limits);
        let fit = |output: u64, room: Option<u64>| match room {
            Some(room) if !estimated.explicit => output.min(room),
            _ => output,
        };
        let (cost, output) = match self.inner.profile.output {
            OutputTo::Tokens => {
                let room = smallest(Currency::Tokens).map(|cap| cap.saturating_sub(input));
                let output = fit(estimated.output, room);
                (Cost::call(input.saturating_add(output)), output)
            }
            OutputTo::OutputTokens if limits.is_none_or(|l| !l.output_tokens().is_empty()) => {
                let output = fit(estimated.output, smallest(Currency::OutputTokens));
                (Cost::call(input).with_output_tokens(output), output)
            }
            OutputTo::OutputTokens => (Cost::call(input), estimated.output),
            OutputTo::Nowhere => (Cost::call(input), 0),
        };
        if limits.is_none_or(|l| l.spend().is_empty()) {
            return Ok(cost);
        }
        let price = estimated.price.ok_or_else(|| Error::Unpriced {
            key: estimated.key.clone(),
            model: estimated.model.clone().unwrap_or_default(),
        })?;
        // The whole reservation, asked for or not: a call without max_tokens may write its
        // model's most output, and a budget too small for that refuses it (cut to the
        // budget's size, one such call had spent sixteen days of a small budget at once).
        let spend = price
            .estimate(
                input.saturating_add(estimated.unseen),
                output.max(estimated.output),
            )
            .saturating_add(estimated.fees);
        Ok(cost.with_spend(spend))
    }
}

/// How many calls of a server-side tool a request is taken to make when it names no bound
/// (`max_uses` on the tool, Anthropic's; `max_tool_calls`, OpenAI's).
pub(crate) const TOOL_CALLS_UNBOUNDED: u64 = 5;

/// The fees of the server-side tools a request declares, in micro-dollars: each priced tool's
/// fee times the calls it may make (its `max_uses`, the request's `max_tool_calls`, else
/// [`TOOL_CALLS_UNBOUNDED`]); a chat call's `web_search_options`, one search. And the dearest
/// fee of one call, what each call the answer reports is settled at.
fn tool_fees(profile: &super::Profile, value: &Value) -> (u64, u64) {
    let bound = value.get("max_tool_calls").and_then(count_of);
    let mut fees: u64 = 0;
    let mut each: u64 = 0;
    if let Some(tools) = value.get("tools").and_then(Value::as_array) {
        for tool in tools.iter().take(1_000) {
            let Some(kind) = tool.get("type").and_then(Value::as_str) else {
                continue;
            };
            let Some(fee) = profile.tool_fee(kind) else {
                continue;
            };
            let calls = tool
                .get("max_uses")
                .and_then(count_of)
                .or(bound)
                .unwrap_or(TOOL_CALLS_UNBOUNDED)
                .clamp(1, 10_000);
            fees = fees.saturating_add(fee.saturating_mul(calls));
            each = each.max(fee);
        }
    }
    if value
        .get("web_search_options")
        .is_some_and(|o| !o.is_null())
        && let Some(fee) = profile.tool_fee("web_search_options")
    {
        fees = fees.saturating_add(fee);
        each = each.max(fee);
    }
    (fees, each)
}

/// The fields that name the output a request may write.
const MAX_TOKENS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// The most copies (`n`, `best_of`) a request is taken to ask for.
const MOST_COPIES: u64 = 128;

/// A count as servers read it: a whole number, a float (truncated), or a numeric string.
fn count_of(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f.min(u64::MAX as f64) as u64)
        }),
        Value::String(text) => {
            let text = text.trim();
            text.parse::<u64>().ok().or_else(|| {
                text.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .map(|f| f.min(u64::MAX as f64) as u64)
            })
        }
        _ => None,
    }
}

/// Whether a path's calls write output (embeddings, reranking, moderation and token counts
/// don't).
fn generative(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    ![
        "/embeddings",
        "/multimodalembeddings",
        "/rerank",
        "/moderations",
        "/count_tokens",
    ]
    .iter()
    .any(|end| path.ends_with(end))
}

/// A request read and estimated by [`Gate::read`], not yet admitted.
#[derive(Debug, Clone)]
pub struct Estimated {
    pub(super) key: String,
    pub(super) model: Option<String>,
    pub(super) stream: bool,
    /// Input tokens (or, for a body no server reads, the bound of its bytes).
    pub(super) input: u64,
    /// The most output the call may write: `max_tokens` × `n`, or the model's most.
    pub(super) output: u64,
    /// Whether the request named its `max_tokens`.
    pub(super) explicit: bool,
    /// The most its model can write, times the copies asked for.
    pub(super) model_most: u64,
    /// The body to send in place of the caller's, when the gate changed it.
    pub(super) send: Option<Bytes>,
    /// The gate asked the stream for its usage: the extra chunk is the gate's to take out.
    pub(super) usage_added: bool,
    /// Its model's price, when the profile's table knows it.
    pub(super) price: Option<super::models::Price>,
    /// Input the provider adds that the request doesn't show, priced into a budget's
    /// reservation only (see [`Estimated::with_unseen_input`]).
    pub(super) unseen: u64,
    /// The fees of the server-side tools it declares, in micro-dollars.
    pub(super) fees: u64,
    /// The dearest fee of one of its tools' calls.
    pub(super) fee_each: u64,
    /// Whose call it is, where tenants share the key (see [`Estimated::with_share`]).
    pub(super) share: Option<crate::store::Share>,
}

impl Estimated {
    /// The key the request belongs to.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The body's `model`, if it names one.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The input tokens estimated.
    pub fn input_tokens(&self) -> u64 {
        self.input
    }

    /// The most output the call may write: what its `max_tokens` reserves, or, when it names
    /// none, its model's most output (the profile's table).
    pub fn most_output(&self) -> u64 {
        self.output
    }

    /// True when the request asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream
    }

    /// Input the provider will add that the request doesn't show (a previous response, a file
    /// by id or by URL, what a search finds), reserved from a spend budget beside the input
    /// estimated: `tokens` at the model's input price. Token windows are not charged it (they
    /// settle with the usage); the call settles its bill as reported.
    pub fn with_unseen_input(mut self, tokens: u64) -> Estimated {
        self.unseen = tokens;
        self
    }

    /// The same request, made by a tenant of a key tenants share: while calls of several
    /// tenants wait at the key, they pass in fair order by weight (see
    /// [`Limiter::acquire_as`](crate::Limiter::acquire_as)), not in arrival order.
    pub fn with_share(mut self, share: crate::store::Share) -> Estimated {
        self.share = Some(share);
        self
    }

    /// Whose call it is, if tenants share its key.
    pub fn share(&self) -> Option<&crate::store::Share> {
        self.share.as_ref()
    }

    /// The fees of the server-side tools the request declares (web search, file search, code
    /// execution), in micro-dollars, from the profile's table: reserved from a spend budget, and
    /// settled at the calls the answer reports (`Reported::tool_calls`, each at the dearest fee
    /// of the request's tools), or as reserved when it reports none.
    pub fn tool_fees(&self) -> u64 {
        self.fees
    }

    /// The body to send in place of the caller's, when the gate changed it: decoded from its
    /// `content-encoding` (send it without that header), or asking a stream for its usage.
    /// `None`: send the caller's bytes as they are.
    pub fn body(&self) -> Option<&Bytes> {
        self.send.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::{Limits, MemoryStore, Registry};

    /// A transient 429 asking for a pause past the gate's deadline fails at once, with the pause,
    /// instead of sleeping it.
    #[tokio::test(start_paused = true)]
    async fn a_retry_whose_pause_passes_the_deadline_fails_at_once_with_the_pause() {
        let registry = Arc::new(Registry::new(MemoryStore::new()));
        let gate = Gate::builder(Profile::openai())
            .limits(Limits::parse("100/m", "100000/m").unwrap())
            .registry(registry)
            .first_answer_wait(None)
            .timeout(Some(Duration::from_secs(60)))
            .build()
            .unwrap();
        let started = tokio::time::Instant::now();
        let deadline = gate.deadline();
        let failed = gate.retry_within("k", 0, Some(crate::MAX_RETRY_AFTER), deadline, started);
        match failed {
            Err(Error::Timeout { needed, waited, .. }) => {
                assert_eq!(needed, Some(crate::MAX_RETRY_AFTER));
                assert_eq!(waited, Duration::ZERO);
            }
            other => panic!("expected a timeout with the pause, got {other:?}"),
        }
        // Within the deadline the pause is slept, floored by the backoff.
        let delay = gate
            .retry_within("k", 0, Some(Duration::from_secs(2)), deadline, started)
            .unwrap();
        assert!(delay >= Duration::from_secs(2));
    }
}
