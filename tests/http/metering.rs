//! What the gate meters, whatever the body (issue 23, items 1 and 2, in the library so that
//! every adapter has it): bodies read as their upstream reads them, output reserved when no
//! `max_tokens` says how much, generated text counted when no usage comes, the usage chunk the
//! gate asked for taken out, impossible usage clamped, a body cut short keeping its charge, and
//! other windows given back when no call is delivered.

use std::io::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tollgate::http::{Attempts, Gate, Next, Profile};
use tollgate::{Cost, Currency, Limits, MemoryStore, Registry};

use crate::parts;

/// 30 days of tokens: no refill a test could see.
const SLOW: &str = "10000000/30d";

fn gate(registry: &Arc<Registry>, tokens: &str) -> Gate {
    Gate::builder(Profile::openai())
        .limits(Limits::parse("1000/d", tokens).unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(registry))
        .first_answer_wait(None)
        .build()
        .unwrap()
}

async fn tokens_left(registry: &Registry, key: &str, tokens: &str) -> i128 {
    let limiter = registry
        .limiter(key, &Limits::parse("1000/d", tokens).unwrap())
        .unwrap();
    limiter
        .snapshot()
        .await
        .unwrap()
        .least(Currency::Tokens)
        .unwrap()
        .whole()
}

/// A body that yields `bytes` in pieces of `every` bytes.
struct Pieces {
    bytes: Bytes,
    every: usize,
}

impl Body for Pieces {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.bytes.is_empty() {
            return Poll::Ready(None);
        }
        let take = self.every.min(self.bytes.len());
        let piece = self.bytes.split_to(take);
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }
}

async fn read_all<B: Body<Data = Bytes>>(body: B) -> Vec<u8>
where
    B::Error: std::fmt::Debug,
{
    body.collect().await.unwrap().to_bytes().to_vec()
}

fn event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn delta(delta: Value) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})
}

fn stream_body(words: usize) -> Vec<u8> {
    json!({"model": "gpt-4o", "stream": true, "max_tokens": 5000,
        "messages": [{"role": "user", "content": vec!["word"; words].join(" ")}]})
    .to_string()
    .into_bytes()
}

/// A stream without usage settles from what it generated when that is more than its
/// reservation: content, tool-call arguments and reasoning, each counted as the provider's
/// tokenizer counts it; names, ids, roles and reasons are not. (With less, the reservation
/// stands: an answer without usage is never read as "little was written".)
#[tokio::test(start_paused = true)]
async fn a_stream_without_usage_settles_from_everything_it_generated() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    // A model the profile doesn't know, with no `max_tokens`: it reserves the profile's
    // default, 16 here, and writes more than that.
    let gate = Gate::builder(Profile::openai().default_output(16))
        .limits(Limits::parse("1000/d", SLOW).unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .first_answer_wait(None)
        .build()
        .unwrap();
    let body = json!({"model": "my-model", "stream": true,
        "messages": [{"role": "user", "content": "word word word"}]});
    let mut attempts = Attempts::new(&gate, &parts(), body.to_string().as_bytes()).unwrap();
    assert_eq!(attempts.estimated().most_output(), 16);
    let input = attempts.estimated().input_tokens();
    let mut call = attempts.admit().await.unwrap();
    call.sending();
    let arguments = r#"{"city": "Lisbon", "days": 3, "units": "metric"}"#;
    let reasoning = "The user wants the weather; I should call the tool.";
    let content = "Here is the forecast.";
    let mut stream = String::new();
    stream += &event(&delta(json!({"role": "assistant", "content": ""})));
    stream += &event(&delta(json!({"reasoning_content": reasoning})));
    for piece in arguments.as_bytes().chunks(7) {
        stream += &event(&delta(
            json!({"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
            "function": {"arguments": String::from_utf8_lossy(piece)}}]}),
        ));
    }
    stream += &event(&delta(json!({"content": content})));
    stream +=
        &event(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}));
    stream += "data: [DONE]\n\n";
    let next = attempts
        .answered(
            call,
            StatusCode::OK,
            &HeaderMap::new(),
            Pieces {
                bytes: Bytes::from(stream.clone()),
                every: 13,
            },
        )
        .await
        .unwrap();
    let Next::Deliver(body) = next else {
        panic!("not delivered");
    };
    assert_eq!(read_all(*body).await, stream.into_bytes());
    let bpe = tiktoken_rs::o200k_base().unwrap();
    // Counted as one text: the pieces of one delta field join before they are counted.
    let generated = bpe
        .encode_ordinary(&format!("{reasoning}{arguments}{content}"))
        .len() as i128;
    let left = tokens_left(&registry, "openai:my-model", SLOW).await;
    assert!(generated > 16);
    assert_eq!(10_000_000 - left, i128::from(input) + generated);
}

/// The chunk a gate asked for (`stream_options.include_usage`) is taken out, however the
/// stream is cut into pieces, and the call settles from it; the other events pass unchanged.
#[tokio::test(start_paused = true)]
async fn the_usage_chunk_the_gate_asked_for_is_taken_out_wherever_the_stream_is_cut() {
    let head = event(&delta(json!({"role": "assistant", "content": "Hi"})));
    let usage = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":345,\"total_tokens\":357}}\r\n\r\n";
    let tail = "data: [DONE]\n\n";
    let stream = format!("{head}{usage}{tail}");
    for every in [1, 2, 3, 7, 64, 1 << 20] {
        let registry = Arc::new(Registry::new(MemoryStore::new()));
        let gate = gate(&registry, SLOW);
        let mut attempts = Attempts::new(&gate, &parts(), &stream_body(3)).unwrap();
        let sent: Value = serde_json::from_slice(attempts.estimated().body().unwrap()).unwrap();
        assert_eq!(sent["stream_options"]["include_usage"], true);
        let mut call = attempts.admit().await.unwrap();
        assert!(call.usage_added());
        call.sending();
        let Next::Deliver(body) = attempts
            .answered(
                call,
                StatusCode::OK,
                &HeaderMap::new(),
                Pieces {
                    bytes: Bytes::from(stream.clone()),
                    every,
                },
            )
            .await
            .unwrap()
        else {
            panic!("not delivered");
        };
        let seen = String::from_utf8(read_all(*body).await).unwrap();
        assert_eq!(seen, format!("{head}{tail}"), "pieces of {every}");
        let left = tokens_left(&registry, "openai:gpt-4o", SLOW).await;
        assert_eq!(10_000_000 - left, 357, "pieces of {every}");
    }
}

/// Usage no request could have produced is cut to what it could: output to what its model can
/// write (a provider that writes past `max_tokens` is billed for it), input to twice its body
/// and 8,192 tokens of context, or a whole window.
#[tokio::test(start_paused = true)]
async fn usage_no_request_could_produce_is_clamped() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let window = "20000/d";
    let gate = gate(&registry, window);
    let body = json!({"model": "gpt-4o", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]});
    let send = || async {
        let mut call = gate
            .admit(&parts(), body.to_string().as_bytes())
            .await
            .unwrap();
        call.sending();
        call
    };
    let report = |input: u64, output: u64| {
        tollgate::http::Reported::read(
            json!({"usage": {"prompt_tokens": input, "completion_tokens": output}})
                .to_string()
                .as_bytes(),
            false,
        )
    };
    // 10 in and 900 out, where the request allowed 50 out: billed as reported.
    let usage = send().await.finish(report(10, 900)).await.unwrap();
    assert_eq!(usage.tokens, Some(910));
    // An input of u64::MAX: no more than twice the body's estimate (8 tokens) and 8,192 of
    // context, or the window (20,000), whichever is more.
    let call = send().await;
    assert_eq!(call.input_tokens(), 8);
    let usage = call.finish(report(u64::MAX, 0)).await.unwrap();
    assert_eq!(usage.tokens, Some(20_000));
    assert_eq!(
        tokens_left(&registry, "openai:gpt-4o", window).await,
        20_000 - 910 - 20_000
    );
    // On a window of a day's 10,000: 10 in and 10^18 out is cut to what gpt-4o writes, 16,384.
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = self::gate(&registry, "10000/d");
    let mut call = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    call.sending();
    let usage = call
        .finish(report(10, 1_000_000_000_000_000_000))
        .await
        .unwrap();
    assert_eq!(usage.tokens, Some(10 + 16_384));
}

/// A body cut short (the client left, the upstream broke off) keeps what the call was charged,
/// unless it had generated more, which is then charged: never less than was generated. (A call
/// without `max_tokens` can generate past its reservation when its model writes more than the
/// table says.)
#[tokio::test(start_paused = true)]
async fn a_body_cut_short_keeps_its_reservation_or_what_was_generated_if_more() {
    for (max_tokens, words_generated) in [(Some(500u64), 20usize), (None, 20_000)] {
        let registry = Arc::new(Registry::new(MemoryStore::new()));
        let gate = gate(&registry, SLOW);
        let mut body = json!({"model": "gpt-4o", "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]});
        if let Some(max_tokens) = max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        let mut attempts = Attempts::new(&gate, &parts(), body.to_string().as_bytes()).unwrap();
        let input = attempts.estimated().input_tokens();
        let mut call = attempts.admit().await.unwrap();
        call.sending();
        let generated = vec!["tok"; words_generated].join(" ");
        let stream = event(&delta(json!({"content": generated})));
        let Next::Deliver(mut body) = attempts
            .answered(
                call,
                StatusCode::OK,
                &HeaderMap::new(),
                Pieces {
                    bytes: Bytes::from(stream),
                    every: 1 << 20,
                },
            )
            .await
            .unwrap()
        else {
            panic!("not delivered");
        };
        // The client reads the one event, then goes away before the end.
        let frame = body.frame().await.unwrap().unwrap();
        assert!(frame.is_data());
        drop(body);
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let counted = tiktoken_rs::o200k_base()
            .unwrap()
            .encode_ordinary(&generated)
            .len() as u64;
        let charged = 10_000_000 - tokens_left(&registry, "openai:gpt-4o", SLOW).await;
        let reserved = max_tokens.unwrap_or(16_384);
        assert!(counted > 16_384 || max_tokens.is_some());
        let expected = input + reserved.max(counted);
        assert_eq!(charged, i128::from(expected), "max_tokens {max_tokens:?}");
    }
}

/// A call that names no `max_tokens` reserves its model's most output (gpt-4o: 16,384),
/// within what the key's windows hold beside its input; one that names it reserves that;
/// embeddings reserve nothing.
#[tokio::test(start_paused = true)]
async fn a_call_without_max_tokens_reserves_its_models_most_output() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry, SLOW);
    let read = |body: Value, path: &str| {
        let (parts, ()) = http::Request::post(format!("http://p.invalid{path}"))
            .body(())
            .unwrap()
            .into_parts();
        gate.read(&parts, body.to_string().as_bytes()).unwrap()
    };
    let messages = json!([{"role": "user", "content": "hi"}]);
    let open = read(
        json!({"model": "gpt-4o", "messages": messages}),
        "/v1/chat/completions",
    );
    assert_eq!(open.most_output(), 16_384);
    let input = open.input_tokens();
    let big = Limits::parse("10/m", "1000000/m").unwrap();
    assert_eq!(
        gate.cost_of(&open, Some(&big)).unwrap(),
        Cost::call(input + 16_384)
    );
    let small = Limits::parse("10/m", "3000/m").unwrap();
    assert_eq!(
        gate.cost_of(&open, Some(&small)).unwrap(),
        Cost::call(3_000)
    );
    let unknown = read(
        json!({"model": "my-finetune", "messages": messages}),
        "/v1/chat/completions",
    );
    assert_eq!(unknown.most_output(), 4_096);
    let named = read(
        json!({"model": "gpt-4o", "max_tokens": 20, "n": 2, "messages": messages}),
        "/v1/chat/completions",
    );
    assert_eq!(
        gate.cost_of(&named, Some(&small)).unwrap(),
        Cost::call(input + 40)
    );
    let embeddings = read(
        json!({"model": "text-embedding-3-small", "input": "hi"}),
        "/v1/embeddings",
    );
    assert_eq!(embeddings.most_output(), 0);
}

/// A compressed body is estimated decoded (as the plain body is) and sent decoded, without
/// its `content-encoding`, so that the upstream reads what was metered.
#[tokio::test(start_paused = true)]
async fn a_compressed_body_is_estimated_and_sent_decoded() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry, SLOW);
    let plain = crate::chat(300, 10).to_string();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(plain.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let (mut parts, ()) = http::Request::post("http://p.invalid/v1/chat/completions")
        .header("content-encoding", "gzip")
        .header("content-length", gz.len())
        .body(())
        .unwrap()
        .into_parts();
    let read = gate.read(&parts, &gz).unwrap();
    let clean = gate.read(&crate::parts(), plain.as_bytes()).unwrap();
    assert_eq!(read.input_tokens(), clean.input_tokens());
    assert_eq!(read.body().unwrap(), plain.as_bytes());
    let call = gate.admit_estimated(&read, None).await.unwrap();
    call.rewrite_headers(&mut parts.headers);
    assert!(!parts.headers.contains_key("content-encoding"));
    assert_eq!(parts.headers["content-length"], plain.len().to_string());
}

/// Other windows attached to a request (a tenant's) come back when no call of it is
/// delivered (a 429 handed on), and stay charged when one is.
#[tokio::test(start_paused = true)]
async fn other_windows_come_back_when_no_call_is_delivered() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(Profile::openai())
        .limits(Limits::parse("1000/d", SLOW).unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .first_answer_wait(None)
        .retries(0)
        .build()
        .unwrap();
    let tenant = registry
        .limiter("tenant", &Limits::parse("10/d", "").unwrap())
        .unwrap();
    let body = crate::chat(3, 5).to_string();
    for status in [StatusCode::TOO_MANY_REQUESTS, StatusCode::OK] {
        let mut attempts = Attempts::new(&gate, &parts(), body.as_bytes()).unwrap();
        attempts.attach(tenant.acquire(Cost::call(0)).await.unwrap());
        let mut call = attempts.admit().await.unwrap();
        call.sending();
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "1".parse().unwrap());
        // Every window can still pay: the 429 empties nothing.
        headers.insert("x-ratelimit-remaining-requests", "900".parse().unwrap());
        headers.insert("x-ratelimit-remaining-tokens", "9000000".parse().unwrap());
        let next = attempts
            .answered(
                call,
                status,
                &headers,
                http_body_util::Full::new(Bytes::from_static(b"{}")),
            )
            .await
            .unwrap();
        drop(next);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let requests = tenant
        .snapshot()
        .await
        .unwrap()
        .least(Currency::Requests)
        .unwrap()
        .whole();
    // The 429's request came back; the delivered call's stays.
    assert_eq!(requests, 9);
}

/// The output a request may write is read as its upstream may read it: the largest of its
/// output limits (vLLM and SGLang read `max_completion_tokens or max_tokens`), a limit of 0 or
/// one that is not a number as no limit (the model's most), counts written as strings, and the
/// copies `n` or `best_of` ask for.
#[tokio::test(start_paused = true)]
async fn the_output_a_request_may_write_is_read_as_its_upstream_reads_it() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry, SLOW);
    let most = |extra: Value| {
        let mut body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        gate.read(&parts(), body.to_string().as_bytes())
            .unwrap()
            .most_output()
    };
    assert_eq!(
        most(json!({"max_tokens": 1, "max_completion_tokens": 1500})),
        1_500
    );
    assert_eq!(most(json!({"max_tokens": 0})), 16_384);
    assert_eq!(most(json!({"max_tokens": null})), 16_384);
    assert_eq!(most(json!({"max_tokens": "100"})), 100);
    assert_eq!(most(json!({"max_tokens": 100, "n": "20"})), 2_000);
    assert_eq!(most(json!({"max_tokens": 100, "n": 2, "best_of": 5})), 500);
    assert_eq!(most(json!({"max_tokens": 100.7})), 100);
    assert_eq!(most(json!({"max_tokens": 100, "n": 1_000_000})), 12_800);
}

/// An answer without usage is never read as "nothing was written": a queued background
/// response (no output yet, no usage), or an Anthropic stream that ends without its final
/// `message_delta` (its `message_start` carries a placeholder of 1), keeps its reservation.
#[tokio::test(start_paused = true)]
async fn an_answer_without_usage_keeps_its_reservation() {
    // The responses API, in the background.
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry, SLOW);
    let (parts, ()) = http::Request::post("http://p.invalid/v1/responses")
        .body(())
        .unwrap()
        .into_parts();
    let body =
        json!({"model": "gpt-4o", "background": true, "max_output_tokens": 1000, "input": "hi"});
    let mut attempts = Attempts::new(&gate, &parts, body.to_string().as_bytes()).unwrap();
    let input = attempts.estimated().input_tokens();
    let mut call = attempts.admit().await.unwrap();
    call.sending();
    let queued = json!({"object": "response", "status": "queued", "output": [], "usage": null});
    let Next::Deliver(body) = attempts
        .answered(
            call,
            StatusCode::OK,
            &HeaderMap::new(),
            Pieces {
                bytes: Bytes::from(queued.to_string()),
                every: 1 << 20,
            },
        )
        .await
        .unwrap()
    else {
        panic!("not delivered");
    };
    read_all(*body).await;
    let left = tokens_left(&registry, "openai:gpt-4o", SLOW).await;
    assert_eq!(10_000_000 - left, i128::from(input) + 1_000);

    // Anthropic, a stream that ends without the usage of its end.
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = Limits::parse("1000/d", SLOW)
        .unwrap()
        .with_output_tokens(SLOW.parse::<tollgate::Rates>().unwrap());
    let gate = Gate::builder(Profile::anthropic())
        .limits(limits.clone())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .first_answer_wait(None)
        .build()
        .unwrap();
    let (parts, ()) = http::Request::post("http://p.invalid/v1/messages")
        .body(())
        .unwrap()
        .into_parts();
    let body = json!({"model": "claude-sonnet-4", "stream": true, "max_tokens": 1000,
        "messages": [{"role": "user", "content": "hi"}]});
    let mut attempts = Attempts::new(&gate, &parts, body.to_string().as_bytes()).unwrap();
    let mut call = attempts.admit().await.unwrap();
    call.sending();
    let stream = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hello there\"}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let Next::Deliver(body) = attempts
        .answered(
            call,
            StatusCode::OK,
            &HeaderMap::new(),
            Pieces {
                bytes: Bytes::from_static(stream.as_bytes()),
                every: 1 << 20,
            },
        )
        .await
        .unwrap()
    else {
        panic!("not delivered");
    };
    read_all(*body).await;
    let limiter = registry
        .limiter("anthropic:claude-sonnet-4", &limits)
        .unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    assert_eq!(
        snapshot.least(Currency::OutputTokens).unwrap().whole(),
        10_000_000 - 1_000
    );
    assert_eq!(
        snapshot.least(Currency::Tokens).unwrap().whole(),
        10_000_000 - 9
    );
}
