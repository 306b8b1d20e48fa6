//! What the proxy adds: latency of a non-streaming chat call with a 1 KB body at 1, 100 and
//! 1,000 concurrent connections, time to first byte of a stream, and resident memory with
//! 1,000 streams open. The upstream, in this process, answers at once; the proxy is the
//! release binary, a child process with its default settings (JSON logs at info, here to
//! /dev/null) and limits too high to ever wait, so each call pays for the whole path:
//! estimate, admit, send, header sync, settle.
//!
//! Each load runs straight at the upstream and through the proxy in alternating rounds, in
//! the same run: "added" is the percentile through the proxy less the same percentile
//! straight. Run with `cargo bench -p tollgate-proxy` on a quiet machine (1,000 connections
//! take some 4,000 descriptors; raise `ulimit -n` if it is below that).
//!
//! `cargo bench -p tollgate-proxy -- capacity` runs the capacity rows alone (issue 26): the
//! first calls of freshly started proxies, 100 connections saturated, and 100 connections
//! paced at rates up to 30,000 calls/s. `TOLLGATE_BENCH_PROXY=path` measures another build
//! of the binary (an older commit's, for a before-and-after in one sitting).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// The upstream's chat answer, with the headers a provider sends.
const ANSWER: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":230,"completion_tokens":1,"total_tokens":231}}"#;
const FIRST_EVENT: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"},\"finish_reason\":null}]}\n\n";
const LAST_EVENTS: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":230,\"completion_tokens\":1,\"total_tokens\":231}}\n\ndata: [DONE]\n\n";

/// Numbers the bodies: every call's prompt is new, as in a real workload, so the estimator
/// counts it instead of finding it in its cache.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// A chat body of about 1 KB, its user prompt never sent before.
fn chat_body(stream: bool) -> Bytes {
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let words = [
        "rate", "limits", "keep", "agents", "polite", "and", "calls", "cheap",
    ];
    let mut text = format!("call {n}: ");
    let mut i = 0;
    while text.len() < 900 {
        text.push_str(words[i % words.len()]);
        text.push(' ');
        i += 1;
    }
    let stream = if stream {
        r#""stream":true,"stream_options":{"include_usage":true},"#
    } else {
        ""
    };
    Bytes::from(format!(
        r#"{{"model":"gpt-4o","max_tokens":16,{stream}"messages":[{{"role":"system","content":"Answer in one line."}},{{"role":"user","content":"{}"}}]}}"#,
        text.trim_end()
    ))
}

/// A body fed by a channel: a stream the upstream writes as it likes.
struct Channel(mpsc::Receiver<Bytes>);

impl Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

type Either = http_body_util::Either<Full<Bytes>, Channel>;

/// The upstream: answers a chat at once; a stream's head and first event at once, its end
/// at once too, or, while `hold` is true, when `hold` turns false.
async fn upstream(hold: watch::Receiver<bool>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let hold = hold.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let mut hold = hold.clone();
                async move {
                    let body = request.into_body().collect().await.unwrap().to_bytes();
                    let stream = body.windows(13).any(|w| w == b"\"stream\":true");
                    let response = Response::builder()
                        .header("x-ratelimit-limit-requests", "100000000")
                        .header("x-ratelimit-remaining-requests", "99999999")
                        .header("x-ratelimit-reset-requests", "1ms")
                        .header("x-ratelimit-limit-tokens", "100000000000")
                        .header("x-ratelimit-remaining-tokens", "99999999999")
                        .header("x-ratelimit-reset-tokens", "1ms");
                    if !stream {
                        let response = response
                            .header("content-type", "application/json")
                            .body(Either::Left(Full::new(Bytes::from_static(
                                ANSWER.as_bytes(),
                            ))))
                            .unwrap();
                        return Ok::<_, Infallible>(response);
                    }
                    let (send, receive) = mpsc::channel(4);
                    tokio::spawn(async move {
                        let _ = send.send(Bytes::from_static(FIRST_EVENT.as_bytes())).await;
                        let _ = hold.wait_for(|held| !held).await;
                        let _ = send.send(Bytes::from_static(LAST_EVENTS.as_bytes())).await;
                    });
                    Ok(response
                        .header("content-type", "text/event-stream")
                        .body(Either::Right(Channel(receive)))
                        .unwrap())
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// The proxy's process, ended when this is dropped (a panic here included).
struct Proxied(Child);

impl Drop for Proxied {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The proxy binary in front of `upstream`, once it answers `/healthz`.
async fn start_proxy(upstream: SocketAddr) -> (Proxied, SocketAddr) {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let binary = std::env::var_os("TOLLGATE_BENCH_PROXY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_tollgate-proxy").into());
    let child = Command::new(binary)
        .args(["--listen", &addr.to_string()])
        .args(["--upstream", &format!("http://{upstream}")])
        .args(["--profile", "openai"])
        .args(["--requests", "100000000/m", "--tokens", "100000000000/m"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the proxy binary starts");
    let child = Proxied(child);
    for _ in 0..500 {
        if let Ok(stream) = TcpStream::connect(addr).await {
            let mut sender = connect_stream(stream).await;
            let request = Request::get(format!("http://{addr}/healthz"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            if sender.send_request(request).await.is_ok() {
                return (child, addr);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the proxy did not start");
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect_stream(stream: TcpStream) -> Sender {
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

async fn connect(addr: SocketAddr) -> Option<Sender> {
    let stream = TcpStream::connect(addr).await.ok()?;
    Some(connect_stream(stream).await)
}

fn chat_request(addr: SocketAddr, body: &Bytes) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .body(Full::new(body.clone()))
        .unwrap()
}

/// `connections` connections to `addr`, each sending `each` chat calls one after the other,
/// at once (closed loop) or, with `every`, one call every `every` on each connection (the
/// connections' starts spread over one `every`); the latency of every call, in
/// microseconds, the number of failures, and how long the whole load took.
async fn load(
    addr: SocketAddr,
    connections: usize,
    each: usize,
    every: Option<Duration>,
) -> (Vec<u64>, u64, Duration) {
    let errors = Arc::new(AtomicU64::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(connections));
    let began = Arc::new(std::sync::OnceLock::new());
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            let (errors, start) = (Arc::clone(&errors), Arc::clone(&start));
            let began = Arc::clone(&began);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(each);
                let mut sender = connect(addr).await;
                start.wait().await;
                let began: Instant = *began.get_or_init(Instant::now);
                let mut next = every.map(|every| {
                    tokio::time::Instant::from_std(began) + every * i as u32 / connections as u32
                });
                for _ in 0..each {
                    if let (Some(at), Some(every)) = (next.as_mut(), every) {
                        tokio::time::sleep_until(*at).await;
                        *at += every;
                    }
                    let Some(s) = sender.as_mut() else {
                        errors.fetch_add(1, Ordering::Relaxed);
                        sender = connect(addr).await;
                        continue;
                    };
                    if s.ready().await.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                        sender = connect(addr).await;
                        continue;
                    }
                    let request = chat_request(addr, &chat_body(false));
                    let sent = Instant::now();
                    let ok = match s.send_request(request).await {
                        Ok(response) => {
                            let status = response.status();
                            response.into_body().collect().await.is_ok() && status == 200
                        }
                        Err(_) => false,
                    };
                    if ok {
                        latencies.push(sent.elapsed().as_micros() as u64);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                        sender = connect(addr).await;
                    }
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let took = began.get().map_or(Duration::ZERO, Instant::elapsed);
    (all, errors.load(Ordering::Relaxed), took)
}

/// The time to the first byte of a stream's body, in microseconds.
async fn first_byte(sender: &mut Sender, addr: SocketAddr) -> u64 {
    // The last stream's end may not have been processed by the connection yet.
    sender.ready().await.unwrap();
    let request = chat_request(addr, &chat_body(true));
    let sent = Instant::now();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        if frame.unwrap().is_data() {
            first.get_or_insert_with(|| sent.elapsed().as_micros() as u64);
        }
    }
    first.expect("a stream with data")
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at] as f64
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("VmRSS:")?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

/// One row: the load straight at the upstream and through the proxy, in alternating rounds
/// after a warm-up of each.
async fn latency_row(
    upstream: SocketAddr,
    proxy: SocketAddr,
    connections: usize,
    each: usize,
    every: Option<Duration>,
) {
    let _ = load(upstream, connections, 2, None).await;
    let _ = load(proxy, connections, 2, None).await;
    let (mut straight, mut through) = (Vec::new(), Vec::new());
    let (mut errors_straight, mut errors_through) = (0, 0);
    let (mut took_straight, mut took_through) = (Duration::ZERO, Duration::ZERO);
    let rounds = 4;
    for _ in 0..rounds {
        let (l, e, t) = load(upstream, connections, each / rounds, every).await;
        straight.extend(l);
        errors_straight += e;
        took_straight += t;
        let (l, e, t) = load(proxy, connections, each / rounds, every).await;
        through.extend(l);
        errors_through += e;
        took_through += t;
    }
    straight.sort_unstable();
    through.sort_unstable();
    let ms = |us: f64| us / 1e3;
    let (s50, s99) = (percentile(&straight, 0.5), percentile(&straight, 0.99));
    let (t50, t99) = (percentile(&through, 0.5), percentile(&through, 0.99));
    let rate = |n: usize, took: Duration| n as f64 / took.as_secs_f64();
    println!(
        "| {connections:>5} | {:>6.0} / {:>6.0} | {:>6} | {:>7.3} / {:>7.3} | {:>7.3} / {:>7.3} | {:>6.3} | {:>6.3} | {errors_straight} / {errors_through} |",
        rate(straight.len(), took_straight),
        rate(through.len(), took_through),
        through.len(),
        ms(s50),
        ms(s99),
        ms(t50),
        ms(t99),
        ms(t50 - s50),
        ms(t99 - s99),
    );
}

const HEADER: &str = "| connections | calls/s straight / through | calls through | straight p50 / p99 | through p50 / p99 | added p50 | added p99 | errors straight / through |\n|---:|---:|---:|---:|---:|---:|---:|---:|";

/// The first calls of freshly started proxies, each on a connection opened (and its
/// `/healthz` answered) before it: the first call's latency, the second's, and the median of
/// calls 901 to 1,000, in ms; the median of `starts` proxies.
async fn first_calls(upstream: SocketAddr, starts: usize) {
    let (mut first, mut second, mut later) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..starts {
        let (child, proxy) = start_proxy(upstream).await;
        let mut sender = connect(proxy).await.unwrap();
        let mut latencies = Vec::with_capacity(1_000);
        for _ in 0..1_000 {
            sender.ready().await.unwrap();
            let request = chat_request(proxy, &chat_body(false));
            let sent = Instant::now();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), 200);
            response.into_body().collect().await.unwrap();
            latencies.push(sent.elapsed().as_micros() as u64);
        }
        drop(child);
        first.push(latencies[0]);
        second.push(latencies[1]);
        let mut tail = latencies[900..].to_vec();
        tail.sort_unstable();
        later.push(percentile(&tail, 0.5) as u64);
    }
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        percentile(&v, 0.5) / 1e3
    };
    println!(
        "first calls of a fresh proxy, ms (median of {starts} starts): the first {:.3} (each: {}), the second {:.3}, calls 901-1,000 p50 {:.3}",
        median(first.clone()),
        first
            .iter()
            .map(|us| format!("{:.3}", *us as f64 / 1e3))
            .collect::<Vec<_>>()
            .join(", "),
        median(second),
        median(later),
    );
}

/// Issue 26's rows: a fresh proxy's first calls, 100 connections saturated, and 100
/// connections paced at rising rates.
async fn capacity(upstream: SocketAddr) {
    first_calls(upstream, 5).await;
    let (child, proxy) = start_proxy(upstream).await;
    println!();
    println!("100 connections saturated, then paced at a rate in all, ms");
    println!();
    println!("{HEADER}");
    latency_row(upstream, proxy, 100, 400, None).await;
    for rate in [2_000u64, 5_000, 10_000, 20_000, 30_000] {
        let every = Duration::from_micros(100 * 1_000_000 / rate);
        // Two seconds of calls at each rate.
        let each = (2 * rate / 100) as usize;
        latency_row(upstream, proxy, 100, each, Some(every)).await;
    }
    drop(child);
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; the one filter read is `capacity`.
    let (hold_tx, hold_rx) = watch::channel(false);
    let upstream = upstream(hold_rx).await;
    if std::env::args().skip(1).any(|arg| arg == "capacity") {
        capacity(upstream).await;
        return;
    }
    first_calls(upstream, 3).await;
    println!();
    let (child, proxy) = start_proxy(upstream).await;
    let pid = child.0.id();

    println!(
        "tollgate-proxy: added latency of a non-streaming chat call (1 KB body), ms; 2,000 calls/s in all, spread over the connections (1: one call after another)"
    );
    println!();
    println!("{HEADER}");
    latency_row(upstream, proxy, 1, 4_000, None).await;
    latency_row(upstream, proxy, 100, 80, Some(Duration::from_millis(50))).await;
    latency_row(upstream, proxy, 1_000, 8, Some(Duration::from_millis(500))).await;
    println!();
    println!(
        "the same, every connection sending its next call as soon as the last is answered (the CPU saturated: latency is connections / throughput)"
    );
    println!();
    println!("{HEADER}");
    latency_row(upstream, proxy, 100, 200, None).await;
    latency_row(upstream, proxy, 1_000, 24, None).await;

    let mut straight_sender = connect(upstream).await.unwrap();
    let mut through_sender = connect(proxy).await.unwrap();
    for _ in 0..50 {
        first_byte(&mut straight_sender, upstream).await;
        first_byte(&mut through_sender, proxy).await;
    }
    let (mut straight, mut through) = (Vec::new(), Vec::new());
    for _ in 0..2_000 {
        straight.push(first_byte(&mut straight_sender, upstream).await);
        through.push(first_byte(&mut through_sender, proxy).await);
    }
    straight.sort_unstable();
    through.sort_unstable();
    println!();
    println!(
        "time to first byte of a stream, ms (2,000 each): straight p50 {:.3} p99 {:.3}; through proxy p50 {:.3} p99 {:.3}; added p50 {:.3} p99 {:.3}",
        percentile(&straight, 0.5) / 1e3,
        percentile(&straight, 0.99) / 1e3,
        percentile(&through, 0.5) / 1e3,
        percentile(&through, 0.99) / 1e3,
        (percentile(&through, 0.5) - percentile(&straight, 0.5)) / 1e3,
        (percentile(&through, 0.99) - percentile(&straight, 0.99)) / 1e3,
    );

    let after_loads = rss_kib(pid);
    drop(child);

    // 1,000 streams held open through a fresh proxy: each has had its first event; their
    // ends wait for `hold`.
    let (child, proxy) = start_proxy(upstream).await;
    let pid = child.0.id();
    // One stream first, so that the tokenizer and the pools are loaded before the count.
    first_byte(&mut connect(proxy).await.unwrap(), proxy).await;
    let before = rss_kib(pid);
    hold_tx.send_replace(true);
    let opened = Arc::new(tokio::sync::Barrier::new(1_001));
    let failures = Arc::new(AtomicU64::new(0));
    let streams: Vec<_> = (0..1_000)
        .map(|_| {
            let (body, opened, failures) =
                (chat_body(true), Arc::clone(&opened), Arc::clone(&failures));
            tokio::spawn(async move {
                let mut ok = false;
                if let Some(mut sender) = connect(proxy).await
                    && let Ok(response) = sender.send_request(chat_request(proxy, &body)).await
                    && response.status() == 200
                {
                    let mut body = response.into_body();
                    let first = body.frame().await;
                    opened.wait().await;
                    if matches!(first, Some(Ok(_))) {
                        let mut rest = Vec::new();
                        while let Some(Ok(frame)) = body.frame().await {
                            if let Ok(data) = frame.into_data() {
                                rest.extend_from_slice(&data);
                            }
                        }
                        ok = rest.ends_with(b"data: [DONE]\n\n");
                    }
                } else {
                    opened.wait().await;
                }
                if !ok {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    opened.wait().await;
    // Let the proxy finish whatever it does for a new stream before it is measured.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let open = rss_kib(pid);
    hold_tx.send_replace(false);
    for stream in streams {
        stream.await.unwrap();
    }
    println!();
    println!(
        "resident memory of the proxy (VmRSS): {:.1} MiB after the loads above; a fresh proxy {:.1} MiB after one stream, {:.1} MiB with 1,000 streams open ({:.1} KiB a stream); {} of the 1,000 streams failed",
        after_loads as f64 / 1024.0,
        before as f64 / 1024.0,
        open as f64 / 1024.0,
        open.saturating_sub(before) as f64 / 1000.0,
        failures.load(Ordering::Relaxed),
    );
    drop(child);
}
