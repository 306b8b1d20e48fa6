//! A stand-in for an LLM provider on 127.0.0.1, as unfriendly as a real one: it enforces
//! requests per period and tokens per period the way providers do (buckets that refill
//! continuously; a call's tokens are its input, counted with tiktoken-rs's o200k_base and then
//! off by up to ±3% the way a provider's own count is, the same for the same body, plus the
//! `max_tokens` it reserves, charged on arrival, with the unused reservation given back when
//! the answer is written; OpenAI-style answers say how long that took, `openai-processing-ms`),
//! takes its time to answer (20 ms, and 1 ms an output token, unless
//! told otherwise), writes at length when no `max_tokens` bounds it, counts a request it
//! refuses against the request limit (as OpenAI does), and answers 429 with `retry-after`,
//! `retry-after-ms` and a body naming the window that refused. It keeps connections alive and
//! reads chunked bodies. [`Options::exact`] makes it friendly again (its count is tiktoken's,
//! it answers at once) for tests that check levels to the token.
//!
//! It speaks OpenAI (`x-ratelimit-*` headers, `/v1/chat/completions` and `/v1/embeddings`,
//! `prompt_tokens`/`completion_tokens`) or Anthropic (`anthropic-ratelimit-*` headers with
//! remaining counts rounded to the thousand and RFC 3339 resets, `/v1/messages`, separate input
//! and output limits), streams server-sent events ending with usage when asked to, can refuse
//! every call for good (a permanent 429), and lets a neighbour spend from its quota directly
//! ([`Provider::spend`]). Also a minimal HTTP client for it. Shared by the tests and examples.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One limit, kept apart from tollgate's arithmetic on purpose: the stand-in must not share
/// the code it judges. Level in `tokens × period_ns`, refilled `limit` per nanosecond.
struct Window {
    limit: u128,
    period_ns: u128,
    level: u128,
    /// Spent by a neighbour beyond what the window held: paid from the refill first.
    debt: u128,
    last: Instant,
}

impl Window {
    fn new(limit: u64, period: Duration, now: Instant) -> Window {
        let period_ns = period.as_nanos();
        Window {
            limit: u128::from(limit),
            period_ns,
            level: u128::from(limit) * period_ns,
            debt: 0,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        // The refill pays a debt first, then fills the window up to its capacity.
        let mut refill = self.limit * elapsed;
        let paid = refill.min(self.debt);
        refill -= paid;
        self.debt -= paid;
        self.level = (self.level + refill).min(self.limit * self.period_ns);
        self.last = now;
    }

    /// Zero when `cost` fits now, else how long until it would.
    fn wait_for(&self, cost: u64) -> Duration {
        let needed = u128::from(cost) * self.period_ns;
        if self.level >= needed {
            return Duration::ZERO;
        }
        // A debt is paid from the refill before the window fills again.
        let nanos = (needed + self.debt - self.level).div_ceil(self.limit);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    fn take(&mut self, cost: u64) {
        self.level -= u128::from(cost) * self.period_ns;
    }
}

/// What the stand-in saw.
#[derive(Default)]
pub struct Stats {
    pub ok: AtomicU64,
    pub refused: AtomicU64,
    /// Of the refusals, those for want of requests (the rest were for tokens).
    pub refused_requests: AtomicU64,
    pub permanent: AtomicU64,
    pub tokens: AtomicU64,
    /// When each refusal came, from the stand-in's start, and how short the tokens were.
    pub refusals: Mutex<Vec<(Duration, i64)>>,
    /// Every request as it was counted, in order: when, from the stand-in's start, and for a
    /// refusal the pause its `retry-after-ms` told.
    pub arrivals: Mutex<Vec<(Duration, Option<Duration>)>>,
    /// Every request as the windows saw it on arrival, in order (see [`Arrival`]).
    pub trace: Mutex<Vec<Arrival>>,
}

/// One request as the stand-in's windows saw it on arrival, before it was charged: what it
/// needed and what the windows held, in whole and fractional units. A call's record beside the
/// limiter's own view of the same instant is how a divergence between the two is found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// From the stand-in's start.
    pub at: Duration,
    /// What the request window held (negative: a debt, from refused requests counted).
    pub requests: f64,
    /// What the token window held (negative: a debt).
    pub tokens: f64,
    /// Its token charge: input as the stand-in counted it, plus the output reserved.
    pub cost: u64,
    /// Refused, and the pause its `retry-after-ms` told.
    pub refused: Option<Duration>,
}

/// Whose headers, bodies and usage the stand-in speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `x-ratelimit-*` headers with Go-style resets, `prompt_tokens`/`completion_tokens`, one
    /// token limit for input plus reserved output.
    OpenAi,
    /// `anthropic-ratelimit-*` headers (remaining rounded to the thousand, RFC 3339 resets),
    /// `input_tokens`/`output_tokens`, separate input and output limits.
    Anthropic,
}

/// How the stand-in behaves.
#[derive(Debug, Clone)]
pub struct Options {
    pub style: Style,
    pub requests: u64,
    /// OpenAI: input plus reserved output. Anthropic: input tokens.
    pub tokens: u64,
    /// Anthropic's output tokens per period.
    pub output_tokens: Option<u64>,
    pub period: Duration,
    /// Every call is refused for good (OpenAI's `insufficient_quota`; Anthropic's spend-limit
    /// 429, which has no `retry-after`).
    pub permanent: bool,
    /// How long an answer takes: a fixed part, then this much per output token. The call is
    /// counted (and its `remaining` headers stamped) when it arrives; a plain answer's head
    /// comes with its body, at the end; a stream's head comes after the fixed part, its events
    /// as the tokens are written. The unused part of a reservation comes back when the answer
    /// is done.
    pub latency: Duration,
    pub per_output_token: Duration,
    /// How far the stand-in's count of a call's input strays from tiktoken's, at most (0.03 is
    /// ±3%): the same for the same body, chosen by `seed`.
    pub error: f64,
    pub seed: u64,
    /// A refused call still spends its request (OpenAI and Gemini count unsuccessful requests).
    pub refusals_count: bool,
    /// The most a call that names no `max_tokens` writes: its model's limit.
    pub model_limit: u64,
}

/// The latency of a stand-in that was not told otherwise.
const LATENCY: Duration = Duration::from_millis(20);
const PER_TOKEN: Duration = Duration::from_millis(1);

impl Options {
    pub fn openai(requests: u64, tokens: u64, period: Duration) -> Options {
        Options {
            style: Style::OpenAi,
            requests,
            tokens,
            output_tokens: None,
            period,
            permanent: false,
            latency: LATENCY,
            per_output_token: PER_TOKEN,
            error: 0.03,
            seed: 1,
            refusals_count: true,
            model_limit: 4_096,
        }
    }

    pub fn anthropic(requests: u64, input: u64, output: u64, period: Duration) -> Options {
        Options {
            style: Style::Anthropic,
            requests,
            tokens: input,
            output_tokens: Some(output),
            ..Options::openai(requests, input, period)
        }
    }

    /// A friendly stand-in, for tests that check levels to the token: its count is tiktoken's
    /// exactly, and it answers at once (unless `latency` says otherwise after this).
    pub fn exact(self) -> Options {
        Options {
            error: 0.0,
            latency: Duration::ZERO,
            per_output_token: Duration::ZERO,
            ..self
        }
    }

    /// Its count strays up to `error` (a fraction) from tiktoken's, chosen by `seed`.
    pub fn error(self, error: f64, seed: u64) -> Options {
        Options {
            error,
            seed,
            ..self
        }
    }

    /// Answers that take `fixed` plus `per_token` per output token.
    pub fn latency(self, fixed: Duration, per_token: Duration) -> Options {
        Options {
            latency: fixed,
            per_output_token: per_token,
            ..self
        }
    }

    pub fn permanent(self) -> Options {
        Options {
            permanent: true,
            ..self
        }
    }
}

pub struct Provider {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn o200k() -> &'static tiktoken_rs::CoreBPE {
    static BPE: std::sync::OnceLock<tiktoken_rs::CoreBPE> = std::sync::OnceLock::new();
    BPE.get_or_init(|| tiktoken_rs::o200k_base().expect("the o200k vocabulary"))
}

fn text_tokens(text: &str) -> u64 {
    o200k().encode_ordinary(text).len() as u64
}

/// The tokens the provider bills for a chat body: prompt (as OpenAI counts messages) plus the
/// output reserved by `max_tokens`.
pub fn billed_tokens(body: &Value) -> u64 {
    chat_prompt(body) + reserved(body)
}

/// The prompt of an OpenAI chat body, as `num_tokens_from_messages` counts it. A top-level
/// `system` string (Anthropic's form) counts as a first message of role `system`.
pub fn chat_prompt(body: &Value) -> u64 {
    let system = body["system"]
        .as_str()
        .map(|text| tiktoken_rs::ChatCompletionRequestMessage {
            role: "system".to_owned(),
            content: Some(text.to_owned()),
            ..Default::default()
        });
    let listed = body["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let messages: Vec<tiktoken_rs::ChatCompletionRequestMessage> = system
        .into_iter()
        .chain(
            listed
                .iter()
                .map(|m| tiktoken_rs::ChatCompletionRequestMessage {
                    role: m["role"].as_str().unwrap_or("user").to_owned(),
                    content: m["content"].as_str().map(str::to_owned),
                    name: m["name"].as_str().map(str::to_owned),
                    ..Default::default()
                }),
        )
        .collect();
    tiktoken_rs::num_tokens_from_messages("gpt-4o", &messages).unwrap_or(0) as u64
}

/// The input of an embeddings body: a string or a list of strings.
pub fn embedding_input(body: &Value) -> u64 {
    match &body["input"] {
        Value::String(text) => text_tokens(text),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .map(text_tokens)
            .sum(),
        _ => 0,
    }
}

/// The input of an Anthropic messages body, counted the stand-in's own way: the text of the
/// system prompt and of every message, plus 3 per message.
pub fn anthropic_input(body: &Value) -> u64 {
    fn text_of(value: &Value) -> u64 {
        match value {
            Value::String(text) => text_tokens(text),
            Value::Array(blocks) => blocks.iter().map(|b| text_of(&b["text"])).sum(),
            _ => 0,
        }
    }
    let messages = body["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    text_of(&body["system"])
        + messages
            .iter()
            .map(|m| 3 + text_of(&m["content"]))
            .sum::<u64>()
}

fn reserved(body: &Value) -> u64 {
    body["max_tokens"].as_u64().unwrap_or(0) * body["n"].as_u64().unwrap_or(1)
}

fn named_reservation(body: &Value) -> Option<u64> {
    body.get("max_tokens")
        .and_then(Value::as_u64)
        .map(|_| reserved(body))
}

/// What the model "writes": a few tokens, never more than reserved; at length (up to the
/// model's limit) when nothing bounds it.
fn completion(prompt: u64, reserved: Option<u64>, options: &Options) -> u64 {
    match reserved {
        Some(reserved) => reserved.min(10 + prompt % 40),
        None => options.model_limit.min(200 + prompt * 7 % 600),
    }
}

/// The stand-in's count of `tokens` of input in `body`: off by up to `error` of it, the same
/// for the same body (a hash of the seed and the body picks the error).
fn strayed(tokens: u64, body: &Value, options: &Options) -> u64 {
    if options.error == 0.0 || tokens == 0 {
        return tokens;
    }
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    options.seed.hash(&mut hasher);
    body.to_string().hash(&mut hasher);
    let unit = (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64;
    let factor = 1.0 + options.error * (2.0 * unit - 1.0);
    ((tokens as f64) * factor).round().max(1.0) as u64
}

struct State {
    started: Instant,
    options: Options,
    windows: Mutex<Windows>,
}

struct Windows {
    requests: Window,
    tokens: Window,
    output: Option<Window>,
}

impl Provider {
    /// Starts enforcing `requests` and `tokens` per `period`, both starting full, OpenAI-style.
    pub async fn start(requests: u64, tokens: u64, period: Duration) -> Provider {
        Provider::start_with(Options::openai(requests, tokens, period)).await
    }

    /// Starts a stand-in with these options, every window full.
    pub async fn start_with(options: Options) -> Provider {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().unwrap();
        let now = Instant::now();
        let state = Arc::new(State {
            started: now,
            windows: Mutex::new(Windows {
                requests: Window::new(options.requests, options.period, now),
                tokens: Window::new(options.tokens, options.period, now),
                output: options
                    .output_tokens
                    .map(|o| Window::new(o, options.period, now)),
            }),
            options,
        });
        let stats = Arc::new(Stats::default());
        let task = {
            let stats = Arc::clone(&stats);
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (state, stats) = (Arc::clone(&state), Arc::clone(&stats));
                    // Connections are kept alive, and bodies read however they come (a length
                    // or chunks), as a provider's server does.
                    let service = hyper::service::service_fn(move |request| {
                        let (state, stats) = (Arc::clone(&state), Arc::clone(&stats));
                        async move {
                            Ok::<_, std::convert::Infallible>(serve(request, state, stats).await)
                        }
                    });
                    tokio::spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            })
        };
        Provider {
            addr,
            stats,
            state,
            task,
        }
    }

    /// The base URL, for clients that take one (`http://127.0.0.1:port/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// What the token window holds now (whole tokens).
    pub fn tokens_left(&self) -> u64 {
        let mut windows = self.state.windows.lock().unwrap();
        windows.tokens.refill(Instant::now());
        windows.tokens.whole()
    }

    /// Spends `tokens` from the token window as another program sharing the quota would,
    /// without any HTTP, whether or not they fit now: what doesn't is paid from the refill
    /// before anyone else gets it (a neighbour that always gets its share).
    pub fn spend_always(&self, tokens: u64) {
        let mut windows = self.state.windows.lock().unwrap();
        windows.tokens.refill(Instant::now());
        let units = u128::from(tokens) * windows.tokens.period_ns;
        let taken = windows.tokens.level.min(units);
        windows.tokens.level -= taken;
        windows.tokens.debt += units - taken;
    }

    /// Spends `tokens` from the token window (and a request) as another program sharing the
    /// quota would, without any HTTP. Answers false (spending nothing) when they don't fit.
    pub fn spend(&self, tokens: u64) -> bool {
        let mut windows = self.state.windows.lock().unwrap();
        let now = Instant::now();
        windows.requests.refill(now);
        windows.tokens.refill(now);
        if windows.requests.wait_for(1).is_zero() && windows.tokens.wait_for(tokens).is_zero() {
            windows.requests.take(1);
            windows.tokens.take(tokens);
            true
        } else {
            false
        }
    }
}

/// What one request costs the stand-in, by path: (input, reserved output).
fn bill(path: &str, style: Style, body: &Value) -> (u64, u64) {
    if path.ends_with("/embeddings") {
        (embedding_input(body), 0)
    } else if style == Style::Anthropic || path.ends_with("/messages") {
        (anthropic_input(body), reserved(body))
    } else {
        (chat_prompt(body), reserved(body))
    }
}

/// A time `ahead` from now, as RFC 3339 in UTC (for Anthropic's resets).
fn rfc3339_in(ahead: Duration) -> String {
    let at = std::time::SystemTime::now() + ahead;
    let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest / 60 % 60,
        rest % 60
    )
}

impl Window {
    fn whole(&self) -> u64 {
        (self.level / self.period_ns) as u64
    }

    /// What the window holds, less its debt, in tokens (for the trace).
    fn held(&self) -> f64 {
        (self.level as f64 - self.debt as f64) / self.period_ns as f64
    }

    /// How long until full again.
    fn reset(&self) -> Duration {
        let missing = self.limit * self.period_ns - self.level;
        Duration::from_nanos(missing.div_ceil(self.limit) as u64)
    }

    /// Spends `tokens` whether or not they are there: what is missing is paid from the refill.
    fn spend(&mut self, tokens: u64) {
        let units = u128::from(tokens) * self.period_ns;
        let taken = self.level.min(units);
        self.level -= taken;
        self.debt += units - taken;
    }

    fn give(&mut self, tokens: u64) {
        self.level =
            (self.level + u128::from(tokens) * self.period_ns).min(self.limit * self.period_ns);
    }
}

/// The rate-limit headers after a call was (or was not) charged.
fn rate_headers(style: Style, windows: &Windows) -> String {
    let mut out = String::new();
    match style {
        Style::OpenAi => {
            for (word, window) in [("requests", &windows.requests), ("tokens", &windows.tokens)] {
                out += &format!(
                    "x-ratelimit-limit-{word}: {}\r\nx-ratelimit-remaining-{word}: {}\r\nx-ratelimit-reset-{word}: {}ms\r\n",
                    window.limit,
                    window.whole(),
                    window.reset().as_millis()
                );
            }
        }
        Style::Anthropic => {
            let mut all = vec![
                ("requests", &windows.requests),
                ("input-tokens", &windows.tokens),
            ];
            if let Some(output) = &windows.output {
                all.push(("output-tokens", output));
            }
            for (word, window) in all {
                let remaining = if word == "requests" {
                    window.whole()
                } else {
                    (window.whole() + 500) / 1_000 * 1_000
                };
                out += &format!(
                    "anthropic-ratelimit-{word}-limit: {}\r\nanthropic-ratelimit-{word}-remaining: {remaining}\r\nanthropic-ratelimit-{word}-reset: {}\r\n",
                    window.limit,
                    rfc3339_in(window.reset())
                );
            }
        }
    }
    out
}

/// A response body written by a task: what the channel brings, in order.
struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Channel {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|bytes| bytes.map(|b| Ok(http_body::Frame::data(b))))
    }
}

type Answer = hyper::Response<http_body_util::Either<Full<Bytes>, Channel>>;

fn whole(status: u16, headers: &str, body: &Value) -> Answer {
    let mut response = hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json");
    for line in headers.split("\r\n").filter(|l| !l.is_empty()) {
        if let Some((name, value)) = line.split_once(':') {
            response = response.header(name.trim(), value.trim());
        }
    }
    response
        .body(http_body_util::Either::Left(Full::new(Bytes::from(
            body.to_string(),
        ))))
        .expect("a valid response")
}

/// The window that refused a call, and how long until it would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Short {
    Requests,
    Tokens,
    Output,
}

async fn serve(
    request: hyper::Request<hyper::body::Incoming>,
    state: Arc<State>,
    stats: Arc<Stats>,
) -> Answer {
    let path = request.uri().path().to_owned();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let options = &state.options;
    let style = options.style;
    let (exact, reserved) = bill(&path, style, &body);
    let input = strayed(exact, &body, options);
    let model = body["model"].as_str().unwrap_or("model").to_owned();
    if options.permanent {
        stats.permanent.fetch_add(1, Ordering::Relaxed);
        let reply = match style {
            Style::OpenAi => {
                json!({"error": {"code": "insufficient_quota", "type": "insufficient_quota", "message": "You exceeded your current quota, please check your plan and billing details."}})
            }
            Style::Anthropic => {
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": "You have reached your specified API usage limits."}})
            }
        };
        return whole(429, "", &reply);
    }
    // Charged on arrival: the input, and the output reserved (OpenAI into the tokens,
    // Anthropic into its output window).
    let (token_cost, output_cost) = match style {
        Style::OpenAi => (input + reserved, 0),
        Style::Anthropic => (input, reserved),
    };
    let arrived = state.started.elapsed();
    let (wait, short, short_by, headers) = {
        let mut windows = state.windows.lock().unwrap();
        let now = Instant::now();
        windows.requests.refill(now);
        windows.tokens.refill(now);
        let held = (windows.requests.held(), windows.tokens.held());
        let mut wait = Duration::ZERO;
        let mut short = None;
        for (kind, window_wait) in [
            (Short::Requests, windows.requests.wait_for(1)),
            (Short::Tokens, windows.tokens.wait_for(token_cost)),
        ] {
            if window_wait > wait {
                wait = window_wait;
                short = Some(kind);
            }
        }
        if let Some(output) = windows.output.as_mut() {
            output.refill(now);
            let window_wait = output.wait_for(output_cost);
            if window_wait > wait {
                wait = window_wait;
                short = Some(Short::Output);
            }
        }
        if wait.is_zero() {
            windows.requests.take(1);
            windows.tokens.take(token_cost);
            if let Some(output) = windows.output.as_mut() {
                output.take(output_cost);
            }
        } else if options.refusals_count {
            // A refused request still counts against the request limit, and its pause says so.
            windows.requests.spend(1);
            let requests = windows.requests.wait_for(1);
            if requests > wait {
                wait = requests;
                short = Some(Short::Requests);
            }
        }
        let short_by = i64::try_from(token_cost).unwrap_or(0)
            - i64::try_from(windows.tokens.whole()).unwrap_or(0);
        let told = (!wait.is_zero()).then(|| {
            Duration::from_millis(
                u64::try_from(wait.as_nanos().div_ceil(1_000_000).max(1)).unwrap_or(u64::MAX),
            )
        });
        stats.trace.lock().unwrap().push(Arrival {
            at: arrived,
            requests: held.0,
            tokens: held.1,
            cost: token_cost,
            refused: told,
        });
        (wait, short, short_by, rate_headers(style, &windows))
    };
    let output = completion(input, named_reservation(&body), options);
    if !wait.is_zero() {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        if short == Some(Short::Requests) {
            stats.refused_requests.fetch_add(1, Ordering::Relaxed);
        }
        stats
            .refusals
            .lock()
            .unwrap()
            .push((state.started.elapsed(), short_by));
        // Whole seconds, rounded up, as providers send them; and the milliseconds.
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let told = wait.as_nanos().div_ceil(1_000_000).max(1);
        stats.arrivals.lock().unwrap().push((
            arrived,
            Some(Duration::from_millis(
                u64::try_from(told).unwrap_or(u64::MAX),
            )),
        ));
        let (kind, openai_words, anthropic_words, limit) = match short {
            Some(Short::Requests) | None => (
                "requests",
                "requests per min (RPM)",
                "requests",
                options.requests,
            ),
            Some(Short::Tokens) => (
                "tokens",
                "tokens per min (TPM)",
                "input tokens",
                options.tokens,
            ),
            Some(Short::Output) => (
                "tokens",
                "output tokens per min",
                "output tokens",
                options.output_tokens.unwrap_or(0),
            ),
        };
        let reply = match style {
            Style::OpenAi => {
                json!({"error": {"type": kind, "code": "rate_limit_exceeded", "param": null,
                "message": format!("Rate limit reached for {model} in organization org-standin on {openai_words}: Limit {limit}. Please try again in {:.3}s.", wait.as_secs_f64())}})
            }
            Style::Anthropic => json!({"type": "error", "error": {"type": "rate_limit_error",
                "message": format!("This request would exceed the rate limit for your organization of {limit} {anthropic_words} per minute.")}}),
        };
        let headers = format!(
            "{headers}retry-after: {seconds}\r\nretry-after-ms: {}\r\n",
            told
        );
        return whole(429, &headers, &reply);
    }
    stats.arrivals.lock().unwrap().push((arrived, None));
    stats.ok.fetch_add(1, Ordering::Relaxed);
    let writing = options.per_output_token * u32::try_from(output).unwrap_or(u32::MAX);
    stats.tokens.fetch_add(input + output, Ordering::Relaxed);
    let answered = {
        let state = Arc::clone(&state);
        move || {
            // The answer is done: the unused part of the reservation comes back; what was
            // written past it (no `max_tokens` bounded it) is charged now.
            let mut windows = state.windows.lock().unwrap();
            let now = Instant::now();
            windows.requests.refill(now);
            windows.tokens.refill(now);
            let window = match (style, windows.output.as_mut()) {
                (Style::Anthropic, Some(window)) => {
                    window.refill(now);
                    window
                }
                _ => &mut windows.tokens,
            };
            if output <= reserved {
                window.give(reserved - output);
            } else {
                window.spend(output - reserved);
            }
        }
    };
    let streaming = body["stream"].as_bool() == Some(true);
    if streaming {
        let include_usage = body["stream_options"]["include_usage"].as_bool() == Some(true);
        let events = stream_events(style, &model, input, output, include_usage);
        let (send, receive) = tokio::sync::mpsc::channel(16);
        let latency = options.latency;
        tokio::spawn(async move {
            let last = events.len().saturating_sub(1);
            for (i, event) in events.into_iter().enumerate() {
                if i == last {
                    // The tokens are written before the stream's last events.
                    tokio::time::sleep(writing).await;
                    answered();
                }
                if send.send(Bytes::from(event)).await.is_err() {
                    return;
                }
            }
        });
        // The head comes after the fixed part of the latency.
        tokio::time::sleep(latency).await;
        let mut response = hyper::Response::builder()
            .status(200)
            .header("content-type", "text/event-stream");
        let headers = processed(style, &headers, latency);
        for line in headers.split("\r\n").filter(|l| !l.is_empty()) {
            if let Some((name, value)) = line.split_once(':') {
                response = response.header(name.trim(), value.trim());
            }
        }
        return response
            .body(http_body_util::Either::Right(Channel(receive)))
            .expect("a valid response");
    }
    let reply = if path.ends_with("/embeddings") {
        let count = match &body["input"] {
            Value::Array(items) => items.len(),
            _ => 1,
        };
        let data: Vec<Value> = (0..count)
            .map(|i| json!({"object": "embedding", "index": i, "embedding": [0.0, 0.5, 1.0]}))
            .collect();
        json!({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": input, "total_tokens": input}})
    } else if style == Style::Anthropic {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": model,
               "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
               "usage": {"input_tokens": input, "output_tokens": output}})
    } else {
        json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}})
    };
    tokio::time::sleep(options.latency + writing).await;
    answered();
    whole(
        200,
        &processed(style, &headers, options.latency + writing),
        &reply,
    )
}

/// The headers with OpenAI's `openai-processing-ms`: how long the answer took once the call had
/// arrived (and been counted).
fn processed(style: Style, headers: &str, took: Duration) -> String {
    match style {
        Style::OpenAi => format!("{headers}openai-processing-ms: {}\r\n", took.as_millis()),
        Style::Anthropic => headers.to_owned(),
    }
}

/// The events of a streamed answer.
fn stream_events(
    style: Style,
    model: &str,
    input: u64,
    output: u64,
    include_usage: bool,
) -> Vec<String> {
    match style {
        Style::OpenAi => {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            };
            let mut events = vec![
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                chunk(json!({"content": "ok"}), Value::Null),
                chunk(json!({}), json!("stop")),
            ];
            if include_usage {
                events.push(json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [],
                    "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}}));
            }
            events
                .into_iter()
                .map(|e| format!("data: {e}\n\n"))
                .chain(["data: [DONE]\n\n".to_owned()])
                .collect()
        }
        Style::Anthropic => [
            ("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": model, "usage": {"input_tokens": input, "output_tokens": 1}}})),
            ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}})),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output}})),
            ("message_stop", json!({"type": "message_stop"})),
        ]
        .into_iter()
        .map(|(name, e)| format!("event: {name}\ndata: {e}\n\n"))
        .collect(),
    }
}

/// Reads one HTTP message: its head and its body (by Content-Length).
async fn read_message(stream: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    Ok((head, buffer[head_end..].to_vec()))
}

/// The provider's answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// `retry-after`, in whole seconds as it is sent.
    pub retry_after: Option<Duration>,
    /// `retry-after-ms`, where it was sent (as the official SDKs read it first).
    pub retry_after_ms: Option<Duration>,
    pub body: Value,
}

/// POSTs a chat body to the stand-in.
pub async fn post(addr: SocketAddr, body: &Value) -> std::io::Result<Response> {
    post_with(addr, body, &[]).await
}

/// POSTs a chat body with these headers besides (an `Authorization`, say).
pub async fn post_with(
    addr: SocketAddr,
    body: &Value,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let body = body.to_string();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let (head, body) = read_message(&mut stream).await?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let header = |wanted: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case(wanted))
            .map(|(_, v)| v.trim().to_owned())
    };
    let retry_after = header("retry-after")
        .and_then(|v| tollgate::parse_retry_after(&v, std::time::SystemTime::now()));
    let retry_after_ms = header("retry-after-ms")
        .and_then(|ms| ms.parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| Duration::from_secs_f64(ms / 1e3));
    Ok(Response {
        status,
        retry_after,
        retry_after_ms,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

/// The workload: an agent's 60 chat calls of mixed sizes, each reserving 100 output tokens.
pub fn workload() -> Vec<Value> {
    chats(0, 60)
}

/// How one client fared.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub calls: u64,
    pub refused: u64,
    pub retries: u64,
    pub seconds: f64,
}

/// Sends `body` until the stand-in accepts it, sleeping each Retry-After; answers how many
/// times it was refused.
async fn until_accepted(addr: SocketAddr, body: Value) -> u64 {
    let mut refused = 0;
    loop {
        let response = post(addr, &body).await.expect("the stand-in answers");
        if response.status != 429 {
            return refused;
        }
        refused += 1;
        tokio::time::sleep(response.retry_after.unwrap_or(Duration::from_secs(1))).await;
    }
}

/// Waits for every call, adding up their refusals.
async fn outcome(start: Instant, tasks: Vec<tokio::task::JoinHandle<u64>>) -> Outcome {
    let mut outcome = Outcome::default();
    for task in tasks {
        let refused = task.await.unwrap();
        outcome.calls += 1;
        outcome.refused += refused;
        outcome.retries += refused;
    }
    outcome.seconds = start.elapsed().as_secs_f64();
    outcome
}

/// Fires every call at once; a refused call sleeps its Retry-After and tries again.
pub async fn unthrottled(addr: SocketAddr, bodies: &[Value]) -> Outcome {
    let start = Instant::now();
    let tasks = bodies
        .iter()
        .map(|body| tokio::spawn(until_accepted(addr, body.clone())))
        .collect();
    outcome(start, tasks).await
}

/// Starts one call every `delay`; a refused call retries like the unthrottled one.
pub async fn fixed_delay(addr: SocketAddr, bodies: &[Value], delay: Duration) -> Outcome {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for body in bodies {
        tasks.push(tokio::spawn(until_accepted(addr, body.clone())));
        tokio::time::sleep(delay).await;
    }
    outcome(start, tasks).await
}

/// Where the tollgate client sends, and what it counted.
pub struct Target {
    pub addr: SocketAddr,
    pub refused: AtomicU64,
}

/// Why a call through tollgate failed.
#[derive(Debug)]
pub enum CallError {
    /// The provider said 429.
    Refused(Option<Duration>),
    /// The connection failed.
    Io(String),
    /// tollgate gave up (timeout, queue full, ...).
    Limited(tollgate::Error),
}

impl From<tollgate::Error> for CallError {
    fn from(err: tollgate::Error) -> CallError {
        CallError::Limited(err)
    }
}

impl tollgate::RateLimited for CallError {
    fn is_rate_limited(&self) -> bool {
        matches!(self, CallError::Refused(_))
    }
    fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Refused(after) => *after,
            _ => None,
        }
    }
}

/// The provider's own limits, bursts included; each call settles with the usage the provider
/// reports (its own count, which strays from tiktoken's by up to 3%, and the output written).
#[tollgate::limit(
    key = "provider-stand-in",
    requests = "120/10s",
    tokens = "20000/10s",
    estimator = "openai",
    tokens_from = [body],
    reserve_output,
    settle = |response| response.body["usage"]["total_tokens"].as_u64(),
    retries = 3,
    timeout = "2m"
)]
pub async fn call(target: &Target, body: &Value) -> Result<Response, CallError> {
    let response = post(target.addr, body)
        .await
        .map_err(|e| CallError::Io(e.to_string()))?;
    if response.status == 429 {
        target.refused.fetch_add(1, Ordering::Relaxed);
        return Err(CallError::Refused(response.retry_after));
    }
    Ok(response)
}

/// Fires every call at once through `#[tollgate::limit]`.
pub async fn with_tollgate(addr: SocketAddr, bodies: &[Value]) -> Outcome {
    let target = Arc::new(Target {
        addr,
        refused: AtomicU64::new(0),
    });
    let start = Instant::now();
    let tasks: Vec<_> = bodies
        .iter()
        .cloned()
        .map(|body| {
            let target = Arc::clone(&target);
            tokio::spawn(async move { call(&target, &body).await })
        })
        .collect();
    let mut outcome = Outcome::default();
    for task in tasks {
        let response = task
            .await
            .unwrap()
            .expect("every call passes through tollgate");
        assert_eq!(response.status, 200);
        outcome.calls += 1;
    }
    outcome.refused = target.refused.load(Ordering::Relaxed);
    outcome.retries = outcome.refused;
    outcome.seconds = start.elapsed().as_secs_f64();
    outcome
}

/// The tokens a chat body is billed on arrival (its prompt plus the output it reserves), what
/// the stand-in's model writes for it, and so how long its answer takes under `options`.
fn billing(body: &Value, options: &Options) -> (u64, u64, f64) {
    let (exact, reserved) = bill("/v1/chat/completions", options.style, body);
    let input = strayed(exact, body, options);
    let output = completion(input, named_reservation(body), options);
    let took =
        options.latency.as_secs_f64() + options.per_output_token.as_secs_f64() * output as f64;
    (input + reserved, reserved.saturating_sub(output), took)
}

/// The best schedule the stand-in allows for `bodies` sent in order by one client that knows
/// everything: each call goes out the moment the provider can pay it (its prompt and its
/// reservation, with a neighbour taking `neighbour_share` of the token refill), the unused
/// part of its reservation comes back when its answer is done, and the run ends when the last
/// answer does. In seconds from the start. (OpenAI style: one token window.)
pub fn ideal_seconds(bodies: &[Value], options: &Options, neighbour_share: f64) -> f64 {
    let period = options.period.as_secs_f64();
    let token_rate = options.tokens as f64 / period * (1.0 - neighbour_share);
    let request_rate = options.requests as f64 / period;
    let (token_cap, request_cap) = (options.tokens as f64, options.requests as f64);
    let (mut tokens, mut requests, mut now) = (token_cap, request_cap, 0.0f64);
    // Refunds to come: (when, tokens), kept sorted by time.
    let mut refunds: Vec<(f64, f64)> = Vec::new();
    let mut end = 0.0f64;
    let advance = |tokens: &mut f64, requests: &mut f64, by: f64| {
        *tokens = (*tokens + token_rate * by).min(token_cap);
        *requests = (*requests + request_rate * by).min(request_cap);
    };
    for body in bodies {
        let (cost, unused, took) = billing(body, options);
        let cost = cost as f64;
        loop {
            let wait = ((cost - tokens).max(0.0) / token_rate)
                .max((1.0 - requests).max(0.0) / request_rate);
            match refunds.first().copied() {
                Some((when, amount)) if when <= now + wait => {
                    advance(&mut tokens, &mut requests, (when - now).max(0.0));
                    now = now.max(when);
                    tokens = (tokens + amount).min(token_cap);
                    refunds.remove(0);
                }
                _ => {
                    advance(&mut tokens, &mut requests, wait);
                    now += wait;
                    break;
                }
            }
        }
        tokens -= cost;
        requests -= 1.0;
        let done = now + took;
        let at = refunds.partition_point(|(when, _)| *when <= done);
        refunds.insert(at, (done, unused as f64));
        end = end.max(done);
    }
    end
}

/// [`ideal_seconds`] for an Anthropic-style stand-in (`Options::anthropic`): each call's input
/// from the input window and its reservation from the output window, the unused part of the
/// reservation coming back when its answer is done. In seconds from the start.
pub fn ideal_seconds_anthropic(bodies: &[Value], options: &Options) -> f64 {
    let period = options.period.as_secs_f64();
    let output_limit = options.output_tokens.unwrap_or(u64::MAX) as f64;
    let rates = [
        options.requests as f64 / period,
        options.tokens as f64 / period,
        output_limit / period,
    ];
    let caps = [options.requests as f64, options.tokens as f64, output_limit];
    let mut levels = caps;
    let (mut now, mut end) = (0.0f64, 0.0f64);
    // Output to come back: (when, tokens), kept sorted by time.
    let mut refunds: Vec<(f64, f64)> = Vec::new();
    let advance = |levels: &mut [f64; 3], by: f64| {
        for i in 0..3 {
            levels[i] = (levels[i] + rates[i] * by).min(caps[i]);
        }
    };
    for body in bodies {
        let input = strayed(anthropic_input(body), body, options) as f64;
        let reserved = reserved(body);
        let written = completion(input as u64, named_reservation(body), options);
        let costs = [1.0, input, reserved as f64];
        loop {
            let wait = (0..3)
                .map(|i| (costs[i] - levels[i]).max(0.0) / rates[i])
                .fold(0.0, f64::max);
            match refunds.first().copied() {
                Some((when, amount)) if when <= now + wait => {
                    advance(&mut levels, (when - now).max(0.0));
                    now = now.max(when);
                    levels[2] = (levels[2] + amount).min(caps[2]);
                    refunds.remove(0);
                }
                _ => {
                    advance(&mut levels, wait);
                    now += wait;
                    break;
                }
            }
        }
        for i in 0..3 {
            levels[i] -= costs[i];
        }
        let took =
            options.latency.as_secs_f64() + options.per_output_token.as_secs_f64() * written as f64;
        let done = now + took;
        let at = refunds.partition_point(|(when, _)| *when <= done);
        refunds.insert(at, (done, reserved.saturating_sub(written) as f64));
        end = end.max(done);
    }
    end
}

/// `count` chat calls like the agent's of [`workload`] (prompts of 40 to 940 words, 100
/// output tokens reserved), numbered from `first`.
pub fn chats(first: u64, count: u64) -> Vec<Value> {
    let words = [
        "rate", "limits", "keep", "agents", "polite", "and", "calls", "cheap",
    ];
    (first..first + count)
        .map(|i| {
            let length = 40 + (i * 97) % 900;
            let text: Vec<&str> = (0..length)
                .map(|w| words[(w + i) as usize % words.len()])
                .collect();
            json!({
                "model": "gpt-4o",
                "max_tokens": 100,
                "messages": [
                    {"role": "system", "content": "Answer in one line."},
                    {"role": "user", "content": text.join(" ")}
                ]
            })
        })
        .collect()
}
