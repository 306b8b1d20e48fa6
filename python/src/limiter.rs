//! `tollgate.Limiter`, `Permit`, `NotYet` and the test clock: a key's windows on the in-memory
//! store of the process, a `ManualClock`'s store, or Redis.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use serde_json::Value;
use tollgate::store::Share;
use tollgate::store::redis::RedisStore;
use tollgate::{
    Attempt, Cost, Currency, Estimator, Limiter, Limits, ManualClock, MemoryStore, Permit,
    Registry, Usage,
};

use crate::errors::{to_py, value_error};
use crate::runtime::{self, Answer, Slot};
use crate::values::{self, Timeout};

/// Where a limiter's windows live.
#[derive(Clone)]
pub(crate) enum Home {
    /// The process's registry, in memory.
    Global,
    /// A registry on a `ManualClock`'s store (tests).
    Clock(Arc<Registry>),
    /// Redis at this URL, shared with every process (and proxy) that uses it.
    Redis(String),
}

/// One registry per Redis URL in this process, connected on first use.
type RedisCell = Arc<tokio::sync::OnceCell<Arc<Registry>>>;
static REDIS: Mutex<Option<HashMap<String, RedisCell>>> = Mutex::new(None);

/// Forgets the parent's Redis connections in a child after `fork`.
pub(crate) fn after_fork() {
    REDIS.clear_poison();
    if let Ok(mut redis) = REDIS.try_lock() {
        std::mem::forget(redis.take());
    }
}

/// The registry on Redis at `url`, connecting once.
pub(crate) async fn redis_registry(url: &str) -> Result<Arc<Registry>, tollgate::Error> {
    let cell = REDIS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .entry(url.to_owned())
        .or_default()
        .clone();
    cell.get_or_try_init(|| async {
        let store = RedisStore::connect(url).await?;
        Ok(Arc::new(Registry::new(store)))
    })
    .await
    .cloned()
}

impl Home {
    pub(crate) fn of(redis: Option<String>, clock: Option<&PyManualClock>) -> PyResult<Home> {
        match (redis, clock) {
            (Some(_), Some(_)) => Err(value_error(
                "a limiter on Redis follows the server's clock; give redis or clock, not both",
            )),
            (Some(url), None) => Ok(Home::Redis(url)),
            (None, Some(clock)) => Ok(Home::Clock(Arc::clone(&clock.registry))),
            (None, None) => Ok(Home::Global),
        }
    }

    /// The registry, when it needs no connection.
    pub(crate) fn at_hand(&self) -> Option<&Registry> {
        match self {
            Home::Global => Some(Registry::global()),
            Home::Clock(registry) => Some(registry),
            Home::Redis(_) => None,
        }
    }
}

/// A key's windows: every `Limiter` of the process that names the same key (on the same
/// store) shares them, and on Redis every process does.
#[pyclass(frozen, module = "tollgate._native", name = "Limiter")]
pub(crate) struct PyLimiter {
    key: String,
    limits: Limits,
    estimator_name: String,
    timeout: Timeout,
    home: Home,
    redis: Option<String>,
    limiter: tokio::sync::OnceCell<Limiter>,
    estimator: OnceLock<Arc<dyn Estimator>>,
}

impl PyLimiter {
    /// The Rust limiter, connecting to Redis on first use.
    pub(crate) async fn limiter(&self) -> Result<&Limiter, tollgate::Error> {
        self.limiter
            .get_or_try_init(|| async {
                match &self.home {
                    Home::Redis(url) => redis_registry(url).await?.limiter(&self.key, &self.limits),
                    home => home
                        .at_hand()
                        .expect("a home at hand")
                        .limiter(&self.key, &self.limits),
                }
            })
            .await
    }

    fn loaded_estimator(&self) -> Result<&Arc<dyn Estimator>, tollgate::Error> {
        if let Some(estimator) = self.estimator.get() {
            return Ok(estimator);
        }
        let estimator = tollgate::estimators::estimator_strict(&self.estimator_name)?;
        Ok(self.estimator.get_or_init(|| estimator))
    }

    /// Whether calls pay tokens (so arguments need counting).
    fn pays_tokens(&self) -> bool {
        !self.limits.tokens().is_empty() || !self.limits.output_tokens().is_empty()
    }

    /// What a call with these arguments pays, by the Rust macro's rule: one request, the input
    /// tokens of the arguments, and the output its `max_tokens` reserves (to the output-token
    /// windows where the limits have them, else to the token windows).
    fn cost_of_arguments(&self, arguments: &Value) -> Result<Cost, tollgate::Error> {
        if !self.pays_tokens() {
            return Ok(Cost::call(0));
        }
        let estimate = tollgate::estimators::estimate(&**self.loaded_estimator()?, arguments)?;
        let named = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .filter_map(|name| arguments.get(*name).and_then(Value::as_u64))
            .max()
            .unwrap_or(0);
        let reserve = estimate.reserved_output.max(named);
        Ok(self.cost(estimate.input_tokens, reserve))
    }

    /// A call of `input` tokens that reserves `output`, in this key's currencies.
    fn cost(&self, input: u64, output: u64) -> Cost {
        let limits = &self.limits;
        if !limits.output_tokens().is_empty() {
            let input = if limits.tokens().is_empty() { 0 } else { input };
            Cost::call(input).with_output_tokens(output)
        } else if !limits.tokens().is_empty() {
            Cost::call(input.saturating_add(output))
        } else {
            Cost::call(0)
        }
    }

    fn explicit_cost(
        &self,
        tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Cost> {
        let tokens = values::amount("tokens", tokens)?;
        let output = values::amount("output_tokens", output_tokens)?;
        Ok(Cost::call(tokens).with_output_tokens(output))
    }

    fn timeout_or_own(&self, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Timeout> {
        match values::timeout(timeout)? {
            Timeout::Default => Ok(self.timeout),
            other => Ok(other),
        }
    }

    fn output_apart(&self) -> bool {
        !self.limits.output_tokens().is_empty()
    }
}

/// Waits for `cost` on `limiter` within `timeout`, as `share`'s tenant if given.
async fn acquire(
    limiter: &Limiter,
    cost: Cost,
    timeout: Timeout,
    share: Option<&Share>,
) -> Result<Permit, tollgate::Error> {
    let Some(share) = share else {
        return match timeout {
            Timeout::Default => limiter.acquire(cost).await,
            Timeout::Never => limiter.acquire_timeout(cost, None).await,
            Timeout::After(d) => limiter.acquire_timeout(cost, Some(d)).await,
        };
    };
    match timeout {
        Timeout::Default => limiter.acquire_as(share, cost).await,
        Timeout::Never => limiter.acquire_as_until(share, cost, None).await,
        Timeout::After(d) => {
            let deadline = tokio::time::Instant::now().checked_add(d);
            limiter.acquire_as_until(share, cost, deadline).await
        }
    }
}

/// The share of `tenant` of `weight`, when a tenant is named.
fn share_of(tenant: Option<String>, weight: i64) -> PyResult<Option<Share>> {
    let weight = u32::try_from(weight)
        .ok()
        .filter(|w| *w >= 1)
        .ok_or_else(|| {
            value_error(format!(
                "weight: {weight}; a tenant's weight is 1 to {}",
                u32::MAX
            ))
        })?;
    Ok(tenant.map(|tenant| Share::new(tenant, weight)))
}

/// A permit on its way to Python: one that nobody receives (its task was cancelled as it was
/// admitted) gives its charge back.
pub(crate) struct Admitted {
    permit: Permit,
    output_apart: bool,
}

impl Answer for Admitted {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, PyPermit::new(self.permit, self.output_apart))?.into_any())
    }

    fn undelivered(self) {
        give_back(self.permit);
    }
}

/// Everything `permit` was charged comes back: the call it admitted never happened.
pub(crate) fn give_back(permit: Permit) {
    let limiter = permit.limiter().clone();
    let delta = permit
        .cost()
        .per_currency()
        .map(|amount| i64::try_from(amount).unwrap_or(i64::MAX));
    drop(permit);
    runtime::runtime().spawn(async move {
        if let Err(err) = limiter.adjust(delta).await {
            tracing_warn(&err);
        }
    });
}

fn tracing_warn(err: &tollgate::Error) {
    // The extension has no logger of its own; a failed refund shows on stderr once per
    // failure, as Python's warnings would.
    eprintln!("tollgate: could not give a cancelled call's charge back: {err}");
}

#[pymethods]
impl PyLimiter {
    #[new]
    #[pyo3(signature = (key, requests=None, tokens=None, output_tokens=None, redis=None, *, estimator="openai", timeout=None, clock=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        key: String,
        requests: Option<&str>,
        tokens: Option<&str>,
        output_tokens: Option<&str>,
        redis: Option<String>,
        estimator: &str,
        timeout: Option<&Bound<'_, PyAny>>,
        clock: Option<PyRef<'_, PyManualClock>>,
    ) -> PyResult<PyLimiter> {
        let limits = values::limits(requests, tokens, output_tokens)?;
        tollgate::estimators::check_name(estimator).map_err(|e| value_error(e.to_string()))?;
        let timeout = values::timeout(timeout)?;
        let home = Home::of(redis.clone(), clock.as_deref())?;
        let cell = tokio::sync::OnceCell::new();
        if let Some(registry) = home.at_hand() {
            // In memory the limiter is made now, so that conflicting limits fail here.
            let limiter = registry.limiter(&key, &limits).map_err(to_py)?;
            let _ = cell.set(limiter);
        }
        Ok(PyLimiter {
            key,
            limits,
            estimator_name: estimator.to_owned(),
            timeout,
            home,
            redis,
            limiter: cell,
            estimator: OnceLock::new(),
        })
    }

    /// The key.
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// The limits, as rate strings by currency.
    #[getter]
    fn limits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, rates) in [
            ("requests", self.limits.requests()),
            ("tokens", self.limits.tokens()),
            ("output_tokens", self.limits.output_tokens()),
        ] {
            if !rates.is_empty() {
                dict.set_item(name, rates.to_string())?;
            }
        }
        Ok(dict)
    }

    /// The Redis URL, or None (in memory).
    #[getter]
    fn redis(&self) -> Option<&str> {
        self.redis.as_deref()
    }

    /// The estimator's name.
    #[getter]
    fn estimator(&self) -> &str {
        &self.estimator_name
    }

    /// Whether calls pay tokens, so that their arguments need counting.
    #[getter]
    fn counts_tokens(&self) -> bool {
        self.pays_tokens()
    }

    /// Calls of this process waiting their turn on the key now.
    #[getter]
    fn waiting(&self) -> usize {
        self.limiter.get().map_or(0, Limiter::waiters)
    }

    /// Admits a call now if every window can pay, else answers `NotYet` (falsy) with the
    /// seconds until it could; never waits.
    #[pyo3(signature = (tokens=None, output_tokens=None))]
    fn try_acquire(
        &self,
        py: Python<'_>,
        tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let cost = self.explicit_cost(tokens, output_tokens)?;
        let attempt = match self.limiter.get() {
            Some(limiter) => {
                // In memory the answer comes at once: no trip through the runtime.
                let mut future = Box::pin(limiter.try_acquire(cost));
                match runtime::now_or_later(&mut future) {
                    Some(attempt) => attempt,
                    None => runtime::block(py, future)?,
                }
            }
            None => runtime::block(py, async { self.limiter().await?.try_acquire(cost).await })?,
        };
        match attempt.map_err(to_py)? {
            Attempt::Admitted(permit) => {
                Ok(Py::new(py, PyPermit::new(permit, self.output_apart()))?.into_any())
            }
            Attempt::NotYet(ready_in) => Ok(Py::new(
                py,
                NotYet {
                    ready_in: ready_in.as_secs_f64(),
                },
            )?
            .into_any()),
        }
    }

    /// Waits (on this thread, without the GIL) until every window can pay, then charges it;
    /// with `tenant`, as that tenant of a key tenants share (fair order by `weight`).
    #[pyo3(signature = (tokens=None, output_tokens=None, timeout=None, *, tenant=None, weight=1))]
    #[allow(clippy::too_many_arguments)]
    fn acquire_blocking(
        &self,
        py: Python<'_>,
        tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        tenant: Option<String>,
        weight: i64,
    ) -> PyResult<PyPermit> {
        let cost = self.explicit_cost(tokens, output_tokens)?;
        let timeout = self.timeout_or_own(timeout)?;
        let share = share_of(tenant, weight)?;
        let permit = runtime::block(py, async {
            acquire(self.limiter().await?, cost, timeout, share.as_ref()).await
        })?
        .map_err(to_py)?;
        Ok(PyPermit::new(permit, self.output_apart()))
    }

    /// `await limiter.acquire(...)` or `async with limiter.acquire(...) as permit:` waits on
    /// the running loop until every window can pay, then charges it; with `tenant`, as that
    /// tenant of a key tenants share (fair order by `weight`).
    #[pyo3(signature = (tokens=None, output_tokens=None, timeout=None, *, tenant=None, weight=1))]
    fn acquire(
        slf: Bound<'_, Self>,
        tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        tenant: Option<String>,
        weight: i64,
    ) -> PyResult<Acquire> {
        let this = slf.get();
        let cost = this.explicit_cost(tokens, output_tokens)?;
        let timeout = this.timeout_or_own(timeout)?;
        let share = share_of(tenant, weight)?;
        Ok(Acquire {
            limiter: slf.unbind(),
            cost,
            timeout,
            share,
        })
    }

    /// What a call with these arguments would pay: `(tokens, output_tokens)`, by the Rust
    /// macro's rule (the decorator's count).
    fn cost_of(&self, py: Python<'_>, arguments: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
        let value = values::json_of(arguments)?.unwrap_or(Value::Null);
        let cost = py
            .detach(|| self.cost_of_arguments(&value))
            .map_err(to_py)?;
        Ok((cost.tokens, cost.output_tokens))
    }

    /// The decorator's admission, blocking: count `arguments`, then wait for the toll.
    #[pyo3(signature = (arguments, timeout=None))]
    fn _admit_blocking(
        &self,
        py: Python<'_>,
        arguments: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyPermit> {
        let timeout = self.timeout_or_own(timeout)?;
        let value = match self.pays_tokens() {
            true => values::json_of(arguments)?.unwrap_or(Value::Null),
            false => Value::Null,
        };
        let permit = runtime::block(py, async {
            let cost = self.cost_of_arguments(&value)?;
            acquire(self.limiter().await?, cost, timeout, None).await
        })?
        .map_err(to_py)?;
        Ok(PyPermit::new(permit, self.output_apart()))
    }

    /// The decorator's admission on the running loop: the arguments are read here, counted
    /// and waited for in the runtime.
    #[pyo3(signature = (arguments, timeout=None))]
    fn _admit<'py>(
        slf: Bound<'py, Self>,
        arguments: &Bound<'py, PyAny>,
        timeout: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let timeout = this.timeout_or_own(timeout)?;
        let value = match this.pays_tokens() {
            true => values::json_of(arguments)?.unwrap_or(Value::Null),
            false => Value::Null,
        };
        let counter = slf.clone().unbind();
        let owned = slf.unbind();
        runtime::awaitable_now(py, async move {
            let this = owned.get();
            // A long text is counted off the runtime's workers.
            let long = tollgate::estimators::text_len(&value) >= COUNT_APART_FROM;
            let cost = if long {
                tokio::task::spawn_blocking(move || counter.get().cost_of_arguments(&value))
                    .await
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
            } else {
                this.cost_of_arguments(&value)
            }?;
            let limiter = this.limiter().await?;
            let permit = acquire(limiter, cost, timeout, None).await?;
            Ok(Admitted {
                permit,
                output_apart: this.output_apart(),
            })
        })
    }

    /// The lowest level of each currency's windows now, in whole tokens (negative: in debt):
    /// `{"requests": 59, "tokens": 19_000}`. One store call (a round trip on Redis).
    fn levels<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot =
            runtime::block(py, async { self.limiter().await?.snapshot().await })?.map_err(to_py)?;
        let dict = PyDict::new(py);
        for (name, currency) in [
            ("requests", Currency::Requests),
            ("tokens", Currency::Tokens),
            ("output_tokens", Currency::OutputTokens),
        ] {
            if let Some(least) = snapshot.least(currency) {
                dict.set_item(name, least.whole())?;
            }
        }
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        format!(
            "Limiter({:?}, {}{})",
            self.key,
            self.limits,
            self.redis
                .as_deref()
                .map(|_| ", on Redis".to_owned())
                .unwrap_or_default()
        )
    }
}

/// Texts at least this long (bytes) are counted on a blocking thread rather than a worker.
const COUNT_APART_FROM: usize = 64 << 10;

/// One wait for a toll: awaitable, or an async context manager.
#[pyclass(frozen, module = "tollgate._native")]
pub(crate) struct Acquire {
    limiter: Py<PyLimiter>,
    cost: Cost,
    timeout: Timeout,
    share: Option<Share>,
}

impl Acquire {
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let limiter = self.limiter.clone_ref(py);
        let (cost, timeout, share) = (self.cost, self.timeout, self.share.clone());
        runtime::awaitable_now(py, async move {
            let this = limiter.get();
            let permit = acquire(this.limiter().await?, cost, timeout, share.as_ref()).await?;
            Ok(Admitted {
                permit,
                output_apart: this.output_apart(),
            })
        })
    }
}

#[pymethods]
impl Acquire {
    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.start(py)?.call_method0(pyo3::intern!(py, "__await__"))
    }

    fn __aenter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.start(py)
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _exc: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // Done at once: leaving the block doesn't yield to the loop.
        runtime::awaitable_now(py, async { Ok(()) })
    }
}

/// Proof that a call paid its toll; `settle` corrects the charge to what the provider billed.
#[pyclass(frozen, module = "tollgate._native", name = "Permit")]
pub(crate) struct PyPermit {
    permit: Slot<Permit>,
    cost: Cost,
    waited: Duration,
    key: String,
    output_apart: bool,
}

impl PyPermit {
    pub(crate) fn new(permit: Permit, output_apart: bool) -> PyPermit {
        PyPermit {
            cost: permit.cost(),
            waited: permit.waited(),
            key: permit.limiter().key().to_owned(),
            permit: runtime::slot(permit),
            output_apart,
        }
    }

    fn usage(
        &self,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Usage> {
        let given = |name, v: Option<&Bound<'_, PyAny>>| -> PyResult<Option<u64>> {
            match v.filter(|v| !v.is_none()) {
                Some(v) => values::amount(name, Some(v)).map(Some),
                None => Ok(None),
            }
        };
        let input = given("input_tokens", input_tokens)?;
        let output = given("output_tokens", output_tokens)?;
        let total = given("tokens", tokens)?;
        let usage = if self.output_apart {
            let usage = Usage::tokens_only(total.or(input));
            match output {
                Some(output) => usage.with_output_tokens(output),
                None => usage,
            }
        } else {
            Usage::tokens_only(
                total.or_else(|| input.map(|input| input.saturating_add(output.unwrap_or(0)))),
            )
        };
        Ok(usage)
    }

    fn taken(&self) -> PyResult<Permit> {
        runtime::take(&self.permit).ok_or_else(|| {
            PyRuntimeError::new_err(format!(
                "key `{}`: this permit is already settled (a permit settles once)",
                self.key
            ))
        })
    }
}

/// What a settlement moved, per currency (positive: refunded).
fn settled_dict(py: Python<'_>, settled: tollgate::Settled) -> PyResult<Py<PyAny>> {
    let dict = PyDict::new(py);
    dict.set_item("tokens", settled.tokens)?;
    dict.set_item("output_tokens", settled.output_tokens)?;
    Ok(dict.into_any().unbind())
}

struct SettledAnswer(tollgate::Settled);

impl Answer for SettledAnswer {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        settled_dict(py, self.0)
    }
}

/// Reads a response's `usage` (a dict of the SDKs' fields) as the windows count it: the
/// Anthropic profile's rules where the key meters output apart, OpenAI's otherwise.
pub(crate) fn reported_usage(usage: &Value, output_apart: bool, limits: &Limits) -> Usage {
    let body = serde_json::json!({ "usage": usage });
    let reported = tollgate::http::Reported::read(body.to_string().as_bytes(), false);
    let profile = if output_apart {
        tollgate::http::Profile::anthropic()
    } else {
        tollgate::http::Profile::openai()
    };
    reported.usage(&profile, limits)
}

#[pymethods]
impl PyPermit {
    /// The key.
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// Requests charged (1).
    #[getter]
    fn requests(&self) -> u64 {
        self.cost.requests
    }

    /// Tokens charged.
    #[getter]
    fn tokens(&self) -> u64 {
        self.cost.tokens
    }

    /// Output tokens charged.
    #[getter]
    fn output_tokens(&self) -> u64 {
        self.cost.output_tokens
    }

    /// Seconds the call waited for its turn.
    #[getter]
    fn waited(&self) -> f64 {
        self.waited.as_secs_f64()
    }

    /// Settles the charge with what the provider billed: `input_tokens` and `output_tokens`
    /// (or `tokens` in all). Returns what moved per currency (positive: given back).
    /// Blocking (one store call); `asettle` is the same on the running loop.
    #[pyo3(signature = (input_tokens=None, output_tokens=None, tokens=None))]
    fn settle(
        &self,
        py: Python<'_>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let usage = self.usage(input_tokens, output_tokens, tokens)?;
        let permit = self.taken()?;
        let settled = runtime::block(py, permit.settle_usage(usage))?.map_err(to_py)?;
        settled_dict(py, settled)
    }

    /// `settle` on the running loop.
    #[pyo3(signature = (input_tokens=None, output_tokens=None, tokens=None))]
    fn asettle<'py>(
        &self,
        py: Python<'py>,
        input_tokens: Option<&Bound<'py, PyAny>>,
        output_tokens: Option<&Bound<'py, PyAny>>,
        tokens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let usage = self.usage(input_tokens, output_tokens, tokens)?;
        let permit = self.taken()?;
        runtime::awaitable(py, async move {
            Ok(SettledAnswer(permit.settle_usage(usage).await?))
        })
    }

    /// Settles with a response's `usage` (a dict with the SDKs' field names); the decorator's
    /// settlement. Blocking.
    fn _settle_reported(&self, py: Python<'_>, usage: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let usage = values::json_of(usage)?.unwrap_or(Value::Null);
        let permit = self.taken()?;
        let usage = reported_usage(&usage, self.output_apart, permit.limiter().limits());
        let settled = runtime::block(py, permit.settle_usage(usage))?.map_err(to_py)?;
        settled_dict(py, settled)
    }

    /// `_settle_reported` on the running loop.
    fn _asettle_reported<'py>(
        &self,
        py: Python<'py>,
        usage: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let usage = values::json_of(usage)?.unwrap_or(Value::Null);
        let permit = self.taken()?;
        let usage = reported_usage(&usage, self.output_apart, permit.limiter().limits());
        runtime::awaitable(py, async move {
            Ok(SettledAnswer(permit.settle_usage(usage).await?))
        })
    }

    /// True: a permit is an admission (a `NotYet` is false).
    fn __bool__(&self) -> bool {
        true
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Permit(key={:?}, requests={}, tokens={}, output_tokens={}, waited={:.3})",
            self.key,
            self.cost.requests,
            self.cost.tokens,
            self.cost.output_tokens,
            self.waited.as_secs_f64()
        )
    }
}

/// `try_acquire`'s "not yet": false, with the seconds until the call could pass.
#[pyclass(frozen, module = "tollgate._native", name = "NotYet")]
pub(crate) struct NotYet {
    /// Seconds until the call could pass.
    #[pyo3(get)]
    ready_in: f64,
}

#[pymethods]
impl NotYet {
    fn __bool__(&self) -> bool {
        false
    }

    fn __repr__(&self) -> String {
        format!("NotYet(ready_in={})", self.ready_in)
    }
}

/// A clock that moves only when told to, for tests: limiters made with `clock=` keep their
/// windows on a store of their own that reads it.
#[pyclass(frozen, module = "tollgate._native", name = "ManualClock")]
pub(crate) struct PyManualClock {
    clock: ManualClock,
    registry: Arc<Registry>,
}

#[pymethods]
impl PyManualClock {
    #[new]
    fn new() -> PyManualClock {
        let clock = ManualClock::new();
        PyManualClock {
            registry: Arc::new(Registry::new(MemoryStore::with_clock(clock.clone()))),
            clock,
        }
    }

    /// Moves the clock forward by `seconds`.
    fn advance(&self, seconds: f64) -> PyResult<()> {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(value_error(format!(
                "advance: {seconds} seconds; a clock moves forward by a finite time"
            )));
        }
        let by = Duration::try_from_secs_f64(seconds)
            .map_err(|_| value_error(format!("advance: {seconds} seconds is too far")))?;
        self.clock.advance(by);
        Ok(())
    }

    /// Seconds since the clock's origin.
    #[getter]
    fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }
}
