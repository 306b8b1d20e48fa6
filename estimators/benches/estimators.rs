//! Estimator throughput, tollgate's counter against tiktoken-rs and bpe-openai on the same
//! vocabulary (`proxy_prompt_900b` is the proxy bench's new prompt of every call), what text
//! extraction adds to the raw count, and what the count cache saves on a growing conversation
//! (and costs on a text seen for the first time). The throughput groups measure estimators
//! without their cache, since they count the same text again and again.
//!
//! The Hugging Face estimator is measured when `TOLLGATE_TOKENIZERS` names the fixtures folder
//! and the `huggingface` feature is on.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde::Serialize;
use tollgate_estimators::{Cached, Estimator, Tiktoken, Voyage, Words, estimate};

fn sample() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");
    ["english.txt", "code_rs.txt", "chinese.txt", "japanese.txt"]
        .iter()
        .map(|f| std::fs::read_to_string(format!("{dir}{f}")).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` from the first character boundary at or after `at`.
fn from(text: &str, mut at: usize) -> &str {
    while !text.is_char_boundary(at) {
        at += 1;
    }
    &text[at..]
}

/// A prefix of `text` of about `bytes` bytes, cut at a character boundary.
fn prefix(text: &str, bytes: usize) -> String {
    let mut out = text.repeat(bytes / text.len() + 1);
    let mut cut = bytes;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    out.truncate(cut);
    out
}

/// The estimators to measure, without their cache, each timed on its first count (which
/// loads its vocabulary).
fn estimators() -> Vec<Arc<dyn Estimator>> {
    #[cfg_attr(not(feature = "huggingface"), allow(unused_mut))]
    let mut made: Vec<Arc<dyn Estimator>> = vec![
        Arc::new(Tiktoken::default()),
        Arc::new(Voyage::new()),
        Arc::new(Words),
    ];
    #[cfg(feature = "huggingface")]
    if let Some(dir) = std::env::var_os("TOLLGATE_TOKENIZERS") {
        let path = std::path::Path::new(&dir).join("gpt-4o/tokenizer.json");
        made.push(Arc::new(
            tollgate_estimators::HuggingFace::from_file(path).unwrap(),
        ));
    }
    for est in &made {
        let started = Instant::now();
        est.count("load");
        eprintln!("first use of {}: {:?}", est.name(), started.elapsed());
    }
    made
}

fn counting(c: &mut Criterion) {
    let text = sample();
    let ests = estimators();
    let o200k = Tiktoken::default();
    for size in [1 << 10, 100 << 10] {
        let input = prefix(&text, size);
        assert_eq!(o200k.count(&input), o200k.count_with_tiktoken_rs(&input));
        let mut group = c.benchmark_group(format!("count_{}kb", size >> 10));
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_function("tiktoken-rs_o200k", |b| {
            b.iter(|| o200k.count_with_tiktoken_rs(black_box(&input)))
        });
        group.bench_function("bpe-openai_o200k", |b| {
            b.iter(|| bpe_openai::o200k_base().count(black_box(input.as_str())))
        });
        for est in &ests {
            let id = match est.name() {
                "openai" => "tollgate_o200k (openai)".to_owned(),
                name if name.starts_with("hf:") => "hf_gpt-4o_tokenizer.json".to_owned(),
                name => name.to_owned(),
            };
            group.bench_function(id, |b| b.iter(|| est.count(black_box(&input))));
        }
        group.finish();
    }
}

/// The proxy bench's prompt (`proxy/benches/proxy.rs`): about 900 bytes of English words after
/// a call number, new every call. The three counters give the same count.
fn prompt(c: &mut Criterion) {
    let words = [
        "rate", "limits", "keep", "agents", "polite", "and", "calls", "cheap",
    ];
    let mut text = "call 123456: ".to_owned();
    let mut i = 0;
    while text.len() < 900 {
        text.push_str(words[i % words.len()]);
        text.push(' ');
        i += 1;
    }
    let text = text.trim_end().to_owned();
    // The first estimator of the process: making it loads the vocabulary.
    let started = Instant::now();
    let o200k = Tiktoken::default();
    eprintln!("loading o200k_base: {:?}", started.elapsed());
    let bpe = bpe_openai::o200k_base();
    assert_eq!(o200k.count(&text), o200k.count_with_tiktoken_rs(&text));
    assert_eq!(o200k.count(&text), bpe.count(text.as_str()));
    let mut group = c.benchmark_group("proxy_prompt_900b");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("tiktoken-rs_o200k", |b| {
        b.iter(|| o200k.count_with_tiktoken_rs(black_box(&text)))
    });
    group.bench_function("bpe-openai_o200k", |b| {
        b.iter(|| bpe.count(black_box(text.as_str())))
    });
    group.bench_function("tollgate_o200k", |b| {
        b.iter(|| o200k.count(black_box(&text)))
    });
    group.finish();
}

fn no_whitespace(c: &mut Criterion) {
    let ests = estimators();
    let o200k = Tiktoken::default();
    let mut group = c.benchmark_group("no_whitespace");
    group.sample_size(10);
    // tiktoken-rs merges one pre-tokenized piece in quadratic time: 64 KB is already slow.
    for size in [16 << 10, 64 << 10] {
        let input = "a".repeat(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(
            BenchmarkId::new("tiktoken-rs_o200k", size),
            &input,
            |b, s| b.iter(|| o200k.count_with_tiktoken_rs(s)),
        );
        group.bench_with_input(
            BenchmarkId::new("bpe-openai_o200k", size),
            &input,
            |b, s| b.iter(|| bpe_openai::o200k_base().count(s.as_str())),
        );
        group.bench_with_input(BenchmarkId::new("tollgate_o200k", size), &input, |b, s| {
            b.iter(|| o200k.count(s))
        });
    }
    let input = "a".repeat(10 << 20);
    group.throughput(Throughput::Bytes(input.len() as u64));
    for est in ests.iter().filter(|e| !e.name().starts_with("hf:")) {
        group.bench_with_input(BenchmarkId::new(est.name(), "10MB"), &input, |b, s| {
            b.iter(|| est.count(s))
        });
    }
    group.finish();
}

#[derive(Serialize)]
struct Message {
    role: &'static str,
    content: String,
}

fn extraction(c: &mut Criterion) {
    let text = sample();
    let est: Arc<dyn Estimator> = Arc::new(Tiktoken::default());
    // 20 messages of 40..800 bytes each, alternating roles.
    let messages: Vec<Message> = (0..20)
        .map(|i| Message {
            role: if i % 2 == 0 { "user" } else { "assistant" },
            content: prefix(&text[(i * 97)..], 40 + i * 40),
        })
        .collect();
    let body = serde_json::json!({
        "model": "gpt-4o",
        "max_tokens": 512,
        "messages": serde_json::to_value(&messages).unwrap(),
    });
    let raw = |est: &dyn Estimator| {
        messages
            .iter()
            .map(|m| est.count(m.role) + est.count(&m.content) + 3)
            .sum::<usize>()
            + 3
    };
    assert_eq!(
        raw(&*est) as u64,
        estimate(&*est, &body).unwrap().input_tokens
    );
    assert_eq!(
        raw(&*est) as u64,
        estimate(&*est, &messages).unwrap().input_tokens
    );

    let mut group = c.benchmark_group("extraction_20_messages");
    group.bench_function("raw_count", |b| b.iter(|| raw(black_box(&*est))));
    group.bench_function("estimate_json_body", |b| {
        b.iter(|| estimate(&*est, black_box(&body)).unwrap())
    });
    group.bench_function("estimate_typed_structs", |b| {
        b.iter(|| estimate(&*est, black_box(&messages)).unwrap())
    });
    group.finish();
}

/// A conversation of 200 turns of about 500 tokens each, estimated after every turn, as an
/// agent re-sends its whole history with each call.
fn conversation(c: &mut Criterion) {
    let text = sample();
    let raw = Tiktoken::default();
    let turns: Vec<Message> = (0..200)
        .map(|i| Message {
            role: if i % 2 == 0 { "user" } else { "assistant" },
            // About 2,000 bytes (about 500 tokens) a turn, each turn its own text.
            content: format!("turn {i}: {}", prefix(from(&text, (i * 131) % 4000), 2_000)),
        })
        .collect();
    let per_turn =
        turns.iter().map(|m| raw.count(&m.content)).sum::<usize>() as f64 / turns.len() as f64;
    eprintln!("conversation: 200 turns of {per_turn:.0} tokens on average");
    let session = |est: &dyn Estimator| {
        (1..=turns.len())
            .map(|k| estimate(est, &turns[..k]).unwrap().input_tokens)
            .sum::<u64>()
    };
    let mut group = c.benchmark_group("conversation_200_turns");
    group.sample_size(10);
    group.bench_function("without_cache", |b| b.iter(|| session(black_box(&raw))));
    group.bench_function("with_cache", |b| {
        // A fresh cache for each session: it starts empty and fills as the session goes.
        b.iter_batched(
            || Cached::new(Tiktoken::default()),
            |cached| session(black_box(&cached)),
            BatchSize::LargeInput,
        )
    });
    group.finish();

    // The price of the cache on a text it has never seen: a 2 KB turn, counted once.
    let cached = Cached::new(Tiktoken::default());
    let mut fresh = 0u64;
    let mut next_text = || {
        fresh += 1;
        format!("{fresh} {}", turns[(fresh % 200) as usize].content)
    };
    let mut group = c.benchmark_group("first_sight_2kb");
    group.bench_function("without_cache", |b| {
        b.iter_batched(&mut next_text, |t| raw.count(&t), BatchSize::SmallInput)
    });
    group.bench_function("with_cache", |b| {
        b.iter_batched(&mut next_text, |t| cached.count(&t), BatchSize::SmallInput)
    });
    group.finish();
}

criterion_group!(
    benches,
    prompt,
    counting,
    no_whitespace,
    extraction,
    conversation
);
criterion_main!(benches);
