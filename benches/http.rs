//! What the tower layer adds to a non-streaming 1 KB chat request: the same hyper-util client
//! with and without `tollgate::http::tower::GateLayer`, against a local HTTP/1.1 server with
//! keep-alive that answers at once with usage and rate-limit headers (so that the round trip
//! is as short as loopback allows, and the layer's share as visible as it can be). The layer
//! estimates the body (o200k), waits for nothing (the limits are far above the run), lowers
//! the windows from the headers and settles from the body's usage, all on the memory store.

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tollgate::http::tower::GateLayer;
use tollgate::http::{Gate, Profile};
use tollgate::{Limits, MemoryStore, Registry};
use tower::{Service, ServiceBuilder, ServiceExt};

const REPLY: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":230,"completion_tokens":12,"total_tokens":242}}"#;

async fn serve() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service =
                    service_fn(|request: http::Request<hyper::body::Incoming>| async move {
                        let _ = request.into_body().collect().await;
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/json")
                                .header("x-ratelimit-limit-tokens", "100000000")
                                .header("x-ratelimit-remaining-tokens", "99999999")
                                .body(Full::new(Bytes::from_static(REPLY)))
                                .unwrap(),
                        )
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// A chat body of about 1 KB.
fn body() -> Bytes {
    let text = "Rate limits keep agents polite and their calls cheap. ".repeat(17);
    let body = serde_json::json!({
        "model": "gpt-4o",
        "max_tokens": 100,
        "messages": [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": text.trim_end()}
        ]
    })
    .to_string();
    assert!((1_000..1_100).contains(&body.len()), "{}", body.len());
    Bytes::from(body)
}

fn limits() -> Limits {
    // Far above anything the run spends (about 25 million tokens), and slow enough to refill
    // that the check below sees one call's tokens (about a token a millisecond).
    Limits::parse("100000000/d", "100000000/d").unwrap()
}

fn registry_limiter(registry: &Registry) -> tollgate::Limiter {
    registry.limiter("openai:gpt-4o", &limits()).unwrap()
}

fn request(addr: std::net::SocketAddr, body: &Bytes) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .unwrap()
}

fn layer_cost(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = runtime.block_on(serve());
    let body = body();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(Profile::openai())
        .limits(limits())
        .registry(Arc::clone(&registry))
        .build()
        .unwrap();

    let layered = ServiceBuilder::new()
        .layer(GateLayer::new(gate.clone()))
        .service(client.clone());
    // The layer does its work: one call through it is charged, then settled to its usage.
    runtime.block_on(async {
        let limiter = registry_limiter(&registry);
        let before = limiter.snapshot().await.unwrap().windows()[1]
            .tokens
            .whole();
        let response = layered.clone().oneshot(request(addr, &body)).await.unwrap();
        let _ = response.into_body().collect().await.unwrap();
        let after = limiter.snapshot().await.unwrap().windows()[1]
            .tokens
            .whole();
        // 242 used, give or take the token or two that refill meanwhile.
        assert!(
            (240..=242).contains(&(before - after)),
            "{before} -> {after}"
        );
    });

    let mut group = c.benchmark_group("http_1kb_chat");
    group.bench_function("client_alone", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let response = client.request(request(addr, &body)).await.unwrap();
                black_box(response.into_body().collect().await.unwrap().to_bytes())
            })
        })
    });
    group.bench_function("client_with_tollgate_layer", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut service = layered.clone();
                let response = service
                    .ready()
                    .await
                    .unwrap()
                    .call(request(addr, &body))
                    .await
                    .unwrap();
                black_box(response.into_body().collect().await.unwrap().to_bytes())
            })
        })
    });
    // The layer's own work without any network: estimate, admit, sync, settle.
    let head = http::Request::post("http://provider.invalid/v1/chat/completions")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let mut headers = http::HeaderMap::new();
    // What the provider would say of limits this large: as much left as the windows hold (a
    // smaller count would read as spending elsewhere, and the gate would wait for it).
    headers.insert(
        "x-ratelimit-remaining-tokens",
        "1000000000000".parse().unwrap(),
    );
    let reported = tollgate::http::Reported::read(REPLY, false);
    // Limits no loop of this speed can exhaust (the layered runs above are slower).
    let gate = Gate::builder(Profile::openai())
        .limits(Limits::parse("1000000000000/s", "1000000000000/s").unwrap())
        .registry(Arc::new(Registry::new(MemoryStore::new())))
        .build()
        .unwrap();
    group.bench_function("gate_alone", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut call = gate.admit(&head, &body).await.unwrap();
                call.sending();
                call.respond(http::StatusCode::OK, &headers, None).await;
                black_box(call.finish(reported).await.unwrap())
            })
        })
    });
    group.bench_function("empty_block_on", |b| {
        b.iter(|| runtime.block_on(async { black_box(1) }))
    });
    group.finish();
}

criterion_group!(benches, layer_cost);
criterion_main!(benches);
