//! A stand-in for an LLM provider on 127.0.0.1: it enforces requests per period and tokens per
//! period the way providers do (buckets that refill continuously; a call's tokens are its
//! prompt, counted with tiktoken-rs's o200k_base as OpenAI bills chat messages, plus the
//! `max_tokens` it reserves), and answers 429 with `Retry-After` when a call would exceed
//! either. Also a minimal HTTP client for it. Shared by `tests/provider.rs` and
//! `examples/provider.rs`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One limit, kept apart from tollgate's arithmetic on purpose: the stand-in must not share
/// the code it judges. Level in `tokens × period_ns`, refilled `limit` per nanosecond.
struct Window {
    limit: u128,
    period_ns: u128,
    level: u128,
    last: Instant,
}

impl Window {
    fn new(limit: u64, period: Duration, now: Instant) -> Window {
        let period_ns = period.as_nanos();
        Window {
            limit: u128::from(limit),
            period_ns,
            level: u128::from(limit) * period_ns,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        self.level = (self.level + self.limit * elapsed).min(self.limit * self.period_ns);
        self.last = now;
    }

    /// Zero when `cost` fits now, else how long until it would.
    fn wait_for(&self, cost: u64) -> Duration {
        let needed = u128::from(cost) * self.period_ns;
        if self.level >= needed {
            return Duration::ZERO;
        }
        let nanos = (needed - self.level).div_ceil(self.limit);
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
    pub tokens: AtomicU64,
}

pub struct Provider {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The tokens the provider bills for a chat body: prompt (as OpenAI counts messages) plus the
/// output reserved by `max_tokens`.
pub fn billed_tokens(body: &Value) -> u64 {
    let messages: Vec<tiktoken_rs::ChatCompletionRequestMessage> = body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|m| tiktoken_rs::ChatCompletionRequestMessage {
                    role: m["role"].as_str().unwrap_or("user").to_owned(),
                    content: m["content"].as_str().map(str::to_owned),
                    name: m["name"].as_str().map(str::to_owned),
                    ..Default::default()
                })
                .collect()
        })
        .unwrap_or_default();
    let prompt = tiktoken_rs::num_tokens_from_messages("gpt-4o", &messages).unwrap_or(0) as u64;
    prompt + body["max_tokens"].as_u64().unwrap_or(0)
}

impl Provider {
    /// Starts enforcing `requests` and `tokens` per `period`, both starting full.
    pub async fn start(requests: u64, tokens: u64, period: Duration) -> Provider {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().unwrap();
        let now = Instant::now();
        let windows = Arc::new(Mutex::new((
            Window::new(requests, period, now),
            Window::new(tokens, period, now),
        )));
        let stats = Arc::new(Stats::default());
        let task = {
            let stats = Arc::clone(&stats);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (windows, stats) = (Arc::clone(&windows), Arc::clone(&stats));
                    tokio::spawn(async move {
                        let _ = serve(stream, &windows, &stats).await;
                    });
                }
            })
        };
        Provider { addr, stats, task }
    }
}

type Windows = Mutex<(Window, Window)>;

async fn serve(mut stream: TcpStream, windows: &Windows, stats: &Stats) -> std::io::Result<()> {
    let body = read_message(&mut stream).await?.1;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let cost = billed_tokens(&body);
    let verdict = {
        let mut guard = windows.lock().unwrap();
        let (requests, tokens) = &mut *guard;
        let now = Instant::now();
        requests.refill(now);
        tokens.refill(now);
        let wait = requests.wait_for(1).max(tokens.wait_for(cost));
        if wait.is_zero() {
            requests.take(1);
            tokens.take(cost);
        }
        wait
    };
    let (status, headers, reply) = if verdict.is_zero() {
        stats.ok.fetch_add(1, Ordering::Relaxed);
        stats.tokens.fetch_add(cost, Ordering::Relaxed);
        let reserved = body["max_tokens"].as_u64().unwrap_or(0);
        let prompt = cost - reserved;
        let completion = reserved.min(10 + prompt % 40);
        let reply = json!({
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        });
        ("200 OK", String::new(), reply)
    } else {
        stats.refused.fetch_add(1, Ordering::Relaxed);
        // Whole seconds, rounded up, as providers send them.
        let seconds = verdict.as_secs() + u64::from(verdict.subsec_nanos() > 0);
        let reply =
            json!({"error": {"type": "rate_limit_exceeded", "message": "Rate limit reached"}});
        (
            "429 Too Many Requests",
            format!("Retry-After: {seconds}\r\n"),
            reply,
        )
    };
    let reply = reply.to_string();
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{reply}",
        reply.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
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
    pub retry_after: Option<Duration>,
    pub body: Value,
}

/// POSTs a chat body to the stand-in.
pub async fn post(addr: SocketAddr, body: &Value) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let body = body.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let (head, body) = read_message(&mut stream).await?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let retry_after = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| tollgate::parse_retry_after(v, std::time::SystemTime::now()));
    Ok(Response {
        status,
        retry_after,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

/// The workload: an agent's 60 chat calls of mixed sizes, each reserving 100 output tokens.
pub fn workload() -> Vec<Value> {
    let words = [
        "rate", "limits", "keep", "agents", "polite", "and", "calls", "cheap",
    ];
    (0..60u64)
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

/// The provider's limits, with the burst trimmed by one request and 500 tokens: the provider
/// counts a call when it arrives, a little after tollgate admitted it, and calls admitted in
/// one order may arrive in another. The trimmed burst absorbs that; the refill rates are the
/// provider's own.
#[tollgate::limit(
    key = "provider-stand-in",
    requests = "120/10s burst 119",
    tokens = "20000/10s burst 19500",
    estimator = "openai",
    tokens_from = [body],
    reserve_output,
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
