//! An OpenAI-shaped chat function behind `#[tollgate::limit]`, called by 40 concurrent tasks.
//!
//! The "API" is a stand-in that sleeps instead of calling the network. Every second the
//! example prints how many requests and tokens were admitted, which stay inside the limits:
//! 10 requests a second (burst 10) and 3,000 tokens a second (burst 6,000).
//!
//! ```text
//! cargo run --release --example chat
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use serde::Serialize;
use tokio::time::Instant;

#[derive(Debug, Serialize, Clone)]
struct Message {
    role: &'static str,
    content: String,
}

#[derive(Debug)]
enum ChatError {
    RateLimited(tollgate::Error),
}

impl From<tollgate::Error> for ChatError {
    fn from(err: tollgate::Error) -> ChatError {
        ChatError::RateLimited(err)
    }
}

/// Counts what the stand-in API saw, per second since the start.
struct Meter {
    start: Instant,
    seconds: Vec<(AtomicU64, AtomicU64)>,
}

/// The client is not `Serialize`, so the macro skips it: only the messages are counted.
struct Client {
    meter: Arc<Meter>,
}

#[tollgate::limit(
    key = "example-chat",
    requests = "10/s",
    tokens = "3000/s burst 6000",
    estimator = "openai",
    timeout = "2m"
)]
async fn chat(client: &Client, messages: &[Message]) -> Result<String, ChatError> {
    // What the admission charged is what the provider would count; record it as it arrives.
    let tokens = tollgate::estimators::estimate(
        &*tollgate::estimators::estimator("openai").unwrap(),
        messages,
    )
    .map(|e| e.input_tokens)
    .unwrap_or(0);
    let second = client.meter.start.elapsed().as_secs() as usize;
    if let Some((requests, counted)) = client.meter.seconds.get(second) {
        requests.fetch_add(1, Ordering::Relaxed);
        counted.fetch_add(tokens, Ordering::Relaxed);
    }
    let latency = rand::rng().random_range(200..800);
    tokio::time::sleep(Duration::from_millis(latency)).await;
    Ok(format!("answer to {} messages", messages.len()))
}

fn conversation(size: usize) -> Vec<Message> {
    let words = "the limiter pays every toll before the call goes out ";
    vec![
        Message {
            role: "system",
            content: "You are terse.".into(),
        },
        Message {
            role: "user",
            content: words.repeat(size),
        },
    ]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let meter = Arc::new(Meter {
        start: Instant::now(),
        seconds: (0..120)
            .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
            .collect(),
    });
    let client = Arc::new(Client {
        meter: Arc::clone(&meter),
    });
    let tasks: Vec<_> = (0..40)
        .map(|task| {
            let client = Arc::clone(&client);
            tokio::spawn(async move {
                for call in 0..3 {
                    let size = 5 + (task * 7 + call * 13) % 40;
                    chat(&client, &conversation(size)).await?;
                }
                Ok::<(), ChatError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await?.map_err(|ChatError::RateLimited(err)| err)?;
    }
    let elapsed = meter.start.elapsed().as_secs_f64();
    println!("second  requests  tokens");
    let (mut requests, mut tokens) = (0, 0);
    for (second, (r, t)) in meter.seconds.iter().enumerate() {
        let (r, t) = (r.load(Ordering::Relaxed), t.load(Ordering::Relaxed));
        if second as f64 > elapsed {
            break;
        }
        requests += r;
        tokens += t;
        println!("{second:>6}  {r:>8}  {t:>6}");
    }
    println!(
        "chat: {requests} requests and {tokens} tokens in {elapsed:.1} s from 40 tasks; limits 10 requests/s (burst 10), 3000 tokens/s (burst 6000)"
    );
    Ok(())
}
