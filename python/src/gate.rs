//! The HTTP gate for Python's clients: `tollgate.httpx` drives Rust's `Gate` and `Attempts`
//! step by step (read and estimate the request, admit each attempt, read each answer), and
//! sends each attempt itself through the transport it wraps. Every rule (header sync, each
//! profile's 429s, settling from usage, streams included) is the Rust gate's.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tollgate::http::{Attempts, Call, Gate, MeteredBody, Next, Profile};
use tollgate::{Currency, Limits};

use crate::errors::{to_py, value_error};
use crate::limiter::redis_registry;
use crate::runtime::{self, Answer, InRuntime, Slot};
use crate::values::{self, Timeout};

/// The profile called `name`, as tollgate-proxy's configuration names them.
fn profile(name: &str) -> PyResult<Profile> {
    Ok(match name {
        "openai" => Profile::openai(),
        "azure-openai" | "azure" => Profile::azure_openai(),
        "anthropic" => Profile::anthropic(),
        "voyage" | "voyageai" => Profile::voyage(),
        "gemini" => Profile::gemini(),
        "groq" => Profile::groq(),
        "mistral" => Profile::mistral(),
        other => {
            return Err(value_error(format!(
                "unknown profile `{other}`; expected openai, azure-openai, anthropic, voyage, gemini, groq or mistral"
            )));
        }
    })
}

/// How to build the gate, kept until it is built (on Redis, after connecting).
struct Spec {
    profile: String,
    limits: Option<Limits>,
    key: Option<String>,
    timeout: Timeout,
    retries: u32,
    sync: bool,
    model_elsewhere: bool,
    redis: Option<String>,
}

impl Spec {
    async fn build(&self) -> Result<Gate, tollgate::Error> {
        let profile = profile(&self.profile).expect("checked when the gate was made");
        let mut builder = Gate::builder(profile)
            .retries(self.retries)
            .sync(self.sync)
            .model_spending_elsewhere(self.model_elsewhere);
        builder = match &self.limits {
            Some(limits) => builder.limits(limits.clone()),
            None => builder.limits_from_headers(Duration::from_secs(60)),
        };
        builder = match self.timeout {
            Timeout::Default => builder,
            Timeout::Never => builder.timeout(None),
            Timeout::After(d) => builder.timeout(Some(d)),
        };
        if let Some(key) = self.key.clone() {
            builder = builder.key(move |_, _| key.clone());
        }
        if let Some(url) = &self.redis {
            builder = builder.registry(redis_registry(url).await?);
        }
        builder.build()
    }
}

/// The gate in front of one provider: its profile, its limits (or those its headers state),
/// and its store.
#[pyclass(frozen, module = "tollgate._native", name = "Gate")]
pub(crate) struct PyGate {
    spec: Arc<Spec>,
    gate: Arc<tokio::sync::OnceCell<Gate>>,
}

impl PyGate {
    fn built(&self) -> PyResult<&Gate> {
        self.gate.get().ok_or_else(|| {
            PyRuntimeError::new_err("the gate is not ready: call ready() (or await aready()) first")
        })
    }

    fn ready_future(
        &self,
    ) -> impl std::future::Future<Output = Result<(), tollgate::Error>> + Send + 'static {
        let (spec, gate) = (Arc::clone(&self.spec), Arc::clone(&self.gate));
        async move {
            gate.get_or_try_init(|| spec.build()).await?;
            Ok(())
        }
    }
}

/// A request's head as `http` reads it.
fn parts(method: &str, url: &str, headers: &Bound<'_, PyList>) -> PyResult<http::request::Parts> {
    let mut request = http::Request::builder()
        .method(method)
        .uri(url)
        .body(())
        .map_err(|e| value_error(format!("request `{method} {url}`: {e}")))?;
    *request.headers_mut() = header_map(headers)?;
    Ok(request.into_parts().0)
}

/// Headers given as `(name, value)` pairs of bytes (httpx's `headers.raw`).
fn header_map(headers: &Bound<'_, PyList>) -> PyResult<HeaderMap> {
    let mut map = HeaderMap::with_capacity(headers.len());
    for pair in headers.iter() {
        let (name, value): (Vec<u8>, Vec<u8>) = pair.extract()?;
        let name =
            HeaderName::from_bytes(&name).map_err(|e| value_error(format!("header name: {e}")))?;
        let value = HeaderValue::from_bytes(&value)
            .map_err(|e| value_error(format!("header `{name}`: {e}")))?;
        map.append(name, value);
    }
    Ok(map)
}

/// Attempts on their way to Python.
struct NewAttempts(Attempts);

impl Answer for NewAttempts {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, PyAttempts::new(self.0))?.into_any())
    }
}

#[pymethods]
impl PyGate {
    #[new]
    #[pyo3(signature = (profile, requests=None, tokens=None, output_tokens=None, *, from_headers=false, key=None, redis=None, timeout=None, retries=3, sync=true, model_spending_elsewhere=true, model_foreign_spending=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        profile: &str,
        requests: Option<&str>,
        tokens: Option<&str>,
        output_tokens: Option<&str>,
        from_headers: bool,
        key: Option<String>,
        redis: Option<String>,
        timeout: Option<&Bound<'_, PyAny>>,
        retries: i64,
        sync: bool,
        model_spending_elsewhere: bool,
        model_foreign_spending: Option<bool>,
    ) -> PyResult<PyGate> {
        // The keyword's old name, kept for the callers written before the rename.
        let model_spending_elsewhere = model_foreign_spending.unwrap_or(model_spending_elsewhere);
        self::profile(profile)?;
        let retries = u32::try_from(retries).map_err(|_| {
            value_error(format!(
                "retries: {retries}; how often a 429 is sent again is 0 or more (at most {})",
                u32::MAX
            ))
        })?;
        let given = requests.is_some() || tokens.is_some() || output_tokens.is_some();
        let limits = match (from_headers, given) {
            (true, true) => {
                return Err(value_error(
                    "limits given and from_headers: the gate takes its limits from one or the other",
                ));
            }
            (true, false) => None,
            (false, _) => Some(values::limits(requests, tokens, output_tokens)?),
        };
        let spec = Spec {
            profile: profile.to_owned(),
            limits,
            key,
            timeout: values::timeout(timeout)?,
            retries,
            sync,
            model_elsewhere: model_spending_elsewhere,
            redis,
        };
        let cell = tokio::sync::OnceCell::new();
        if spec.redis.is_none() {
            // In memory it is built now, so that a mistake fails here.
            let gate = runtime::runtime().block_on(spec.build()).map_err(to_py)?;
            let _ = cell.set(gate);
        }
        Ok(PyGate {
            spec: Arc::new(spec),
            gate: Arc::new(cell),
        })
    }

    /// The profile's name.
    #[getter]
    fn profile(&self) -> &str {
        &self.spec.profile
    }

    /// Builds the gate (on Redis: connects). Blocking; a no-op once done.
    fn ready(&self, py: Python<'_>) -> PyResult<()> {
        if self.gate.get().is_some() {
            return Ok(());
        }
        runtime::block(py, self.ready_future())?.map_err(to_py)
    }

    /// `ready` on the running loop.
    fn aready<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ready = self.ready_future();
        runtime::awaitable(py, async move { Ok(ready.await?) })
    }

    /// Reads and estimates a request (its head and whole body): its key, its input tokens
    /// and the output it reserves. Counts without the GIL.
    fn attempts(
        &self,
        py: Python<'_>,
        method: &str,
        url: &str,
        headers: &Bound<'_, PyList>,
        body: &[u8],
    ) -> PyResult<PyAttempts> {
        let gate = self.built()?;
        let parts = parts(method, url, headers)?;
        let attempts = py
            .detach(|| {
                let _inside = runtime::runtime().enter();
                Attempts::new(gate, &parts, body)
            })
            .map_err(to_py)?;
        Ok(PyAttempts::new(attempts))
    }

    /// `attempts` on the running loop: a long body is counted on a thread of the runtime.
    fn attempts_async<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        url: &str,
        headers: &Bound<'py, PyList>,
        body: Vec<u8>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let gate = self.built()?.clone();
        let parts = parts(method, url, headers)?;
        runtime::awaitable(py, async move {
            let attempts = tokio::task::spawn_blocking(move || Attempts::new(&gate, &parts, &body))
                .await
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))??;
            Ok(NewAttempts(attempts))
        })
    }

    /// The lowest level of each currency's windows of `key` now (whole tokens), or None when
    /// the gate has no windows for it yet. Blocking (one store call).
    fn levels<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(limiter) = self.built()?.limiter_of(key) else {
            return Ok(None);
        };
        let snapshot = runtime::block(py, async { limiter.snapshot().await })?.map_err(to_py)?;
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
        Ok(Some(dict))
    }

    fn __repr__(&self) -> String {
        format!("Gate({:?})", self.spec.profile)
    }
}

/// One request's attempts: admit, send, read the answer, and again after a retryable 429.
#[pyclass(frozen, module = "tollgate._native", name = "Attempts")]
pub(crate) struct PyAttempts {
    attempts: Slot<Attempts>,
    key: String,
    input_tokens: u64,
    most_output: u64,
    stream: bool,
}

impl PyAttempts {
    fn new(attempts: Attempts) -> PyAttempts {
        let estimated = attempts.estimated();
        PyAttempts {
            key: estimated.key().to_owned(),
            input_tokens: estimated.input_tokens(),
            most_output: estimated.most_output(),
            stream: estimated.is_stream(),
            attempts: runtime::slot(attempts),
        }
    }

    fn taken(&self) -> PyResult<Attempts> {
        runtime::take(&self.attempts).ok_or_else(|| {
            PyRuntimeError::new_err("these attempts are busy (one step at a time) or over")
        })
    }
}

/// A call on its way to Python: one nobody receives was never sent, and gives its charge back
/// when dropped.
struct Admitted(Call);

impl Answer for Admitted {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, PyCall::new(self.0))?.into_any())
    }
}

/// What an answer means, on its way to Python.
struct Answered(Next<FedBody>, FedBody, bool);

impl Answer for Answered {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let Answered(next, fed, usage_added) = self;
        Ok(Py::new(py, PyNext::new(py, next, fed, usage_added)?)?.into_any())
    }
}

#[pymethods]
impl PyAttempts {
    /// The request's key.
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// The input tokens estimated.
    #[getter]
    fn input_tokens(&self) -> u64 {
        self.input_tokens
    }

    /// The most output the request may write (what it reserves).
    #[getter]
    fn most_output(&self) -> u64 {
        self.most_output
    }

    /// True when the request asked for a stream.
    #[getter]
    fn stream(&self) -> bool {
        self.stream
    }

    /// Waits for the next attempt's toll (without the GIL); raises `tollgate.Timeout` when
    /// its turn would come past the deadline.
    fn admit_blocking(&self, py: Python<'_>) -> PyResult<PyCall> {
        let mut attempts = self.taken()?;
        let admitted = runtime::block(py, attempts.admit());
        runtime::put(&self.attempts, attempts);
        Ok(PyCall::new(admitted?.map_err(to_py)?))
    }

    /// `admit_blocking` on the running loop; cancelling it gives up the attempt's place.
    fn admit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut attempts = self.taken()?;
        let slot = Arc::clone(&self.attempts);
        runtime::awaitable_now(py, async move {
            let admitted = attempts.admit().await;
            runtime::put(&slot, attempts);
            Ok(Admitted(admitted?))
        })
    }

    /// Reads an answer: its status, headers (`(name, value)` pairs of bytes) and, for a 429,
    /// its whole body; says what comes next. Blocking.
    #[pyo3(signature = (call, status, headers, body=None))]
    fn answered_blocking(
        &self,
        py: Python<'_>,
        call: &PyCall,
        status: u16,
        headers: &Bound<'_, PyList>,
        body: Option<Vec<u8>>,
    ) -> PyResult<PyNext> {
        let (call, status, headers, fed) = answer_parts(call, status, headers, body)?;
        let usage_added = call.usage_added();
        let mut attempts = self.taken()?;
        let next = runtime::block(py, async {
            attempts.answered(call, status, &headers, fed.clone()).await
        });
        runtime::put(&self.attempts, attempts);
        let next = match next? {
            Ok(next) => next,
            Err(never) => match never {},
        };
        PyNext::new(py, next, fed, usage_added)
    }

    /// `answered_blocking` on the running loop.
    #[pyo3(signature = (call, status, headers, body=None))]
    fn answered<'py>(
        &self,
        py: Python<'py>,
        call: &PyCall,
        status: u16,
        headers: &Bound<'py, PyList>,
        body: Option<Vec<u8>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (call, status, headers, fed) = answer_parts(call, status, headers, body)?;
        let usage_added = call.usage_added();
        let mut attempts = self.taken()?;
        let slot = Arc::clone(&self.attempts);
        runtime::awaitable(py, async move {
            let next = attempts.answered(call, status, &headers, fed.clone()).await;
            runtime::put(&slot, attempts);
            match next {
                Ok(next) => Ok(Answered(next, fed, usage_added)),
                Err(never) => match never {},
            }
        })
    }
}

type AnswerParts = (Call, StatusCode, HeaderMap, FedBody);

fn answer_parts(
    call: &PyCall,
    status: u16,
    headers: &Bound<'_, PyList>,
    body: Option<Vec<u8>>,
) -> PyResult<AnswerParts> {
    let status = StatusCode::from_u16(status)
        .map_err(|_| value_error(format!("status {status} is not an HTTP status")))?;
    let headers = header_map(headers)?;
    let call = runtime::take(&call.call)
        .ok_or_else(|| PyRuntimeError::new_err("this call was already answered"))?;
    let fed = FedBody::default();
    if let Some(body) = body {
        fed.push(Bytes::from(body));
        fed.end();
    }
    Ok((call, status, headers, fed))
}

/// One attempt, admitted: mark it `sending()` right before it goes out.
#[pyclass(frozen, module = "tollgate._native", name = "Call")]
pub(crate) struct PyCall {
    call: Slot<Call>,
    /// When it went out.
    body: Option<Bytes>,
    key: String,
    tokens: u64,
    output_tokens: u64,
}

impl PyCall {
    fn new(call: Call) -> PyCall {
        let cost = call.cost().unwrap_or_default();
        PyCall {
            body: call.body().cloned(),
            key: call.key().to_owned(),
            tokens: cost.tokens,
            output_tokens: cost.output_tokens,
            call: runtime::slot(call),
        }
    }
}

#[pymethods]
impl PyCall {
    /// The body to send in place of the caller's, when the gate changed it (decoded from its
    /// `content-encoding`, or asking a stream for its usage): send it without
    /// `content-encoding`. None: send the caller's.
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.body.as_ref().map(|b| PyBytes::new(py, b))
    }

    /// The key.
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// Tokens charged up front (0 while the key's limits are still unknown).
    #[getter]
    fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Output tokens charged up front.
    #[getter]
    fn output_tokens(&self) -> u64 {
        self.output_tokens
    }

    /// The attempt goes out now: dropped from here on, it keeps its charge.
    fn sending(&self) -> PyResult<()> {
        let mut slot = self.call.lock().unwrap_or_else(PoisonError::into_inner);
        let _inside = runtime::runtime().enter();
        match slot.0.as_mut() {
            Some(call) => {
                call.sending();
                Ok(())
            }
            None => Err(PyRuntimeError::new_err("this call was already answered")),
        }
    }
}

/// What comes after an answer.
#[pyclass(frozen, module = "tollgate._native", name = "Next")]
pub(crate) struct PyNext {
    /// `"deliver"`, `"retry"`, `"hand_on"` or `"refused"`.
    #[pyo3(get)]
    kind: &'static str,
    /// Seconds to wait before sending again (`"retry"`).
    #[pyo3(get)]
    delay: Option<f64>,
    /// The 429's body (`"hand_on"`, `"refused"`).
    #[pyo3(get)]
    body: Option<Py<PyBytes>>,
    /// What the gate says of it: the refusal, or the deadline a retry would pass.
    #[pyo3(get)]
    message: Option<String>,
    /// The body to hand on (`"deliver"`): feed it the upstream's bytes.
    #[pyo3(get)]
    metered: Option<Py<PyMetered>>,
    /// The gate takes a chunk out of the stream (the usage it asked for): its length changes.
    #[pyo3(get)]
    length_changes: bool,
}

impl PyNext {
    fn new(
        py: Python<'_>,
        next: Next<FedBody>,
        fed: FedBody,
        usage_added: bool,
    ) -> PyResult<PyNext> {
        let mut out = PyNext {
            kind: "deliver",
            delay: None,
            body: None,
            message: None,
            metered: None,
            length_changes: usage_added,
        };
        match next {
            Next::Deliver(metered) => {
                out.metered = Some(Py::new(py, PyMetered::new(*metered, fed))?);
            }
            Next::Retry(delay) => {
                out.kind = "retry";
                out.delay = Some(delay.as_secs_f64());
            }
            Next::HandOn {
                body,
                past_deadline,
            } => {
                out.kind = "hand_on";
                out.body = Some(PyBytes::new(py, &body).unbind());
                out.message = past_deadline.map(|e| e.to_string());
            }
            Next::Refused { refusal, body } => {
                out.kind = "refused";
                out.body = Some(PyBytes::new(py, &body).unbind());
                out.message = Some(refusal.to_string());
            }
            _ => {
                return Err(PyRuntimeError::new_err(
                    "an answer this version doesn't know",
                ));
            }
        }
        Ok(out)
    }
}

/// The upstream's body, fed in by Python as it arrives.
#[derive(Debug, Default)]
struct Fed {
    chunks: VecDeque<Bytes>,
    ended: bool,
    /// The last poll found nothing to read: the body waits for Python, not for a settlement.
    starved: bool,
}

#[derive(Debug, Default, Clone)]
struct FedBody(Arc<Mutex<Fed>>);

impl FedBody {
    fn lock(&self) -> std::sync::MutexGuard<'_, Fed> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, chunk: Bytes) {
        self.lock().chunks.push_back(chunk);
    }

    fn end(&self) {
        self.lock().ended = true;
    }
}

impl Body for FedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        // Nothing wakes this body: the metered body is polled again after each push.
        let mut fed = self.lock();
        if let Some(chunk) = fed.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if fed.ended {
            return Poll::Ready(None);
        }
        fed.starved = true;
        Poll::Pending
    }
}

type Metering = Arc<Mutex<InRuntime<MeteredBody<FedBody>>>>;

/// An answer's body on its way to the caller: `push` each chunk from the upstream, then `pull`
/// what to hand on (the usage is read as it passes; the call settles at its end).
#[pyclass(frozen, module = "tollgate._native", name = "Metered")]
pub(crate) struct PyMetered {
    fed: FedBody,
    body: Metering,
}

impl PyMetered {
    fn new(body: MeteredBody<FedBody>, fed: FedBody) -> PyMetered {
        PyMetered {
            fed,
            body: Arc::new(Mutex::new(InRuntime(Some(body)))),
        }
    }
}

/// Polls the metered body for what it can hand on now: `Ready(ended)` once it needs more from
/// Python (or ended), `Pending` while a settlement is under way.
fn drain(body: &Metering, fed: &FedBody, out: &mut Vec<Bytes>, cx: &mut Context<'_>) -> Poll<bool> {
    let mut guard = body.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(metered) = guard.0.as_mut() else {
        return Poll::Ready(true);
    };
    loop {
        fed.lock().starved = false;
        match Pin::new(&mut *metered).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data()
                    && !data.is_empty()
                {
                    out.push(data);
                }
            }
            Poll::Ready(Some(Err(never))) => match never {},
            Poll::Ready(None) => {
                // Settled and ended: dropped here, in the runtime.
                guard.0 = None;
                return Poll::Ready(true);
            }
            Poll::Pending if fed.lock().starved => return Poll::Ready(false),
            Poll::Pending => return Poll::Pending,
        }
    }
}

fn chunks<'py>(py: Python<'py>, out: Vec<Bytes>) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, out.iter().map(|b| PyBytes::new(py, b)))
}

struct Drained(Vec<Bytes>);

impl Answer for Drained {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(chunks(py, self.0)?.into_any().unbind())
    }
}

#[pymethods]
impl PyMetered {
    /// A chunk of the upstream's body.
    fn push(&self, chunk: &[u8]) {
        self.fed.push(Bytes::copy_from_slice(chunk));
    }

    /// The upstream's body has ended.
    fn end(&self) {
        self.fed.end();
    }

    /// What can be handed on now, or None when a settlement is under way (then
    /// `pull_blocking()`, or `await pull_async()`).
    fn pull<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let mut out = Vec::new();
        let mut cx = Context::from_waker(Waker::noop());
        let polled = {
            let _inside = runtime::runtime().enter();
            drain(&self.body, &self.fed, &mut out, &mut cx)
        };
        match polled {
            Poll::Ready(_) => Ok(Some(chunks(py, out)?)),
            Poll::Pending if out.is_empty() => Ok(None),
            // What came before the settlement goes out now; the rest on the next pull.
            Poll::Pending => Ok(Some(chunks(py, out)?)),
        }
    }

    /// Waits (without the GIL) for what can be handed on.
    fn pull_blocking<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let (body, fed) = (Arc::clone(&self.body), self.fed.clone());
        let out = runtime::block(py, async move {
            let mut out = Vec::new();
            std::future::poll_fn(|cx| drain(&body, &fed, &mut out, cx)).await;
            out
        })?;
        chunks(py, out)
    }

    /// `pull_blocking` on the running loop.
    fn pull_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (body, fed) = (Arc::clone(&self.body), self.fed.clone());
        runtime::awaitable(py, async move {
            let mut out = Vec::new();
            std::future::poll_fn(|cx| drain(&body, &fed, &mut out, cx)).await;
            Ok(Drained(out))
        })
    }

    /// True once the body ended and the call settled.
    #[getter]
    fn done(&self) -> bool {
        self.body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .is_none()
    }

    /// The caller is done with the body: a call cut short keeps its charge (or what it
    /// generated, if more), in the background.
    fn close(&self) {
        let body = self
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .take();
        let _inside = runtime::runtime().enter();
        drop(body);
    }
}
