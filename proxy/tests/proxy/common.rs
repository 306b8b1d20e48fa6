//! What the tests share: a proxy on a free port, a plain HTTP client, a scripted upstream.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tollgate_proxy::{Config, Proxy, Running};

/// The token the tests' proxies ask for on `/metrics` at the clients' listener.
pub const METRICS_TOKEN: &str = "tests-metrics-token-0123";

/// A proxy on a free loopback port with this configuration (its `listen` is overridden; its
/// `/metrics` on the clients' listener takes [`METRICS_TOKEN`], which [`get`] sends).
pub async fn proxy(toml: &str) -> Running {
    let mut config = Config::from_toml(toml).expect("a valid configuration");
    config.listen = "127.0.0.1:0".parse().unwrap();
    config
        .metrics_token
        .get_or_insert_with(|| METRICS_TOKEN.to_owned());
    Proxy::bind(config).await.expect("the proxy starts").spawn()
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// What came back.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What key `key`'s tightest `currency` window holds now, from `/metrics` (whole tokens).
pub async fn level(addr: SocketAddr, key: &str, currency: &str) -> i64 {
    let text = get(addr, "/metrics").await.body_str();
    let series = format!(r#"tollgate_proxy_level{{key="{key}",currency="{currency}"}}"#);
    metric(&text, &series).unwrap_or_else(|| panic!("no {series} in:\n{text}")) as i64
}

/// Sends `body` to `path` with `headers`, and reads the whole answer.
pub async fn send(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: Bytes) -> Answer {
    let mut request =
        Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client()
        .request(request.body(Full::new(body)).unwrap())
        .await
        .expect("the proxy answers");
    let (head, body) = response.into_parts();
    Answer {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.expect("a whole body").to_bytes(),
    }
}

pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> Answer {
    send(addr, path, &[], Bytes::from(body.to_string())).await
}

/// A GET; `/metrics` with the tests' token.
pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    let mut request = Request::get(format!("http://{addr}{path}"));
    if path == "/metrics" {
        request = request.header("authorization", format!("Bearer {METRICS_TOKEN}"));
    }
    let response = client()
        .request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("the proxy answers");
    let (head, body) = response.into_parts();
    Answer {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// What a scripted upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

type Script = dyn Fn(u64, &Seen) -> Response<Full<Bytes>> + Send + Sync;

/// An upstream that answers each request with a function of its number (from 0) and of
/// what it sent, and remembers what it saw.
pub struct Scripted {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub count: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Scripted {
    pub async fn start(
        script: impl Fn(u64, &Seen) -> Response<Full<Bytes>> + Send + Sync + 'static,
    ) -> Scripted {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicU64::new(0));
        let script: Arc<Script> = Arc::new(script);
        let task = {
            let (seen, count) = (Arc::clone(&seen), Arc::clone(&count));
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (seen, count, script) =
                        (Arc::clone(&seen), Arc::clone(&count), Arc::clone(&script));
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let (seen, count, script) =
                            (Arc::clone(&seen), Arc::clone(&count), Arc::clone(&script));
                        async move {
                            let (head, body) = request.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|c| c.to_bytes())
                                .unwrap_or_default();
                            let request = Seen {
                                path: head
                                    .uri
                                    .path_and_query()
                                    .map_or("/", |p| p.as_str())
                                    .to_owned(),
                                headers: head.headers,
                                body,
                            };
                            let n = count.fetch_add(1, Ordering::SeqCst);
                            let response = script(n, &request);
                            seen.lock().unwrap().push(request);
                            Ok::<_, Infallible>(response)
                        }
                    });
                    tokio::spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            })
        };
        Scripted {
            addr,
            seen,
            count,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A JSON answer with these headers.
pub fn json_response(status: u16, headers: &[(&str, &str)], body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    for (name, value) in headers {
        response = response.header(*name, *value);
    }
    response
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// An OpenAI chat answer that reports this usage.
pub fn chat_answer(prompt: u64, completion: u64) -> Value {
    serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    })
}

/// The value of one series in Prometheus text (`name{labels}` as written), if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
