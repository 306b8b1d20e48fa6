//! The Rust side of the Python package's tests (`python/tests`): the provider stand-in, and a
//! Rust process on a Redis key beside a Python one.
//!
//! ```text
//! python_peers stand-in openai REQUESTS TOKENS PERIOD_SECONDS [exact|honest] [permanent]
//! python_peers stand-in anthropic REQUESTS INPUT OUTPUT PERIOD_SECONDS [exact|honest] [permanent]
//!     prints {"addr": "127.0.0.1:PORT"}, then answers one JSON line per line read:
//!     `stats` (what the stand-in counted), `burst N` (N chat bodies, OpenAI's or Anthropic's,
//!     and their ideal time);
//!     ends when its input ends
//! python_peers redis-calls URL KEY REQUESTS TOKENS CALLS TOKENS_EACH
//!     tries CALLS calls of 1 request and TOKENS_EACH tokens on KEY, without waiting, and
//!     prints {"admitted": N, "ready_in": SECONDS or null, "levels": {...}}
//! ```

use std::io::BufRead;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tollgate::store::redis::RedisStore;
use tollgate::{Attempt, Cost, Currency, Limits, Registry};
use tollgate_testkit::provider::{self, Options, Provider};

fn arg(args: &[String], at: usize) -> &str {
    args.get(at).map(String::as_str).unwrap_or_else(|| {
        eprintln!("missing argument {at}; see the comment at the top of examples/python_peers.rs");
        std::process::exit(2)
    })
}

fn number(args: &[String], at: usize) -> u64 {
    arg(args, at).parse().unwrap_or_else(|_| {
        eprintln!("argument {at} is not a whole number");
        std::process::exit(2)
    })
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match arg(&args, 1) {
        "stand-in" => stand_in(&args).await,
        "redis-calls" => redis_calls(&args).await,
        other => {
            eprintln!("unknown command `{other}`: stand-in or redis-calls");
            std::process::exit(2)
        }
    }
}

async fn stand_in(args: &[String]) {
    let mut options = match arg(args, 2) {
        "openai" => Options::openai(
            number(args, 3),
            number(args, 4),
            Duration::from_secs(number(args, 5)),
        ),
        "anthropic" => Options::anthropic(
            number(args, 3),
            number(args, 4),
            number(args, 5),
            Duration::from_secs(number(args, 6)),
        ),
        other => {
            eprintln!("unknown style `{other}`: openai or anthropic");
            std::process::exit(2)
        }
    };
    let flags = if arg(args, 2) == "openai" { 6 } else { 7 };
    for flag in args.iter().skip(flags) {
        options = match flag.as_str() {
            "exact" => options.exact(),
            // Its counts are tiktoken's exactly (no stray), its answers as slow as ever.
            "honest" => options.error(0.0, 1),
            "permanent" => options.permanent(),
            other => {
                eprintln!("unknown flag `{other}`: exact, honest or permanent");
                std::process::exit(2)
            }
        };
    }
    let stand_in = Provider::start_with(options.clone()).await;
    println!("{}", json!({"addr": stand_in.addr.to_string()}));
    let (lines, mut commands) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = commands.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["stats"] => {
                let stats = &stand_in.stats;
                json!({
                    "ok": stats.ok.load(Ordering::Relaxed),
                    "refused": stats.refused.load(Ordering::Relaxed),
                    "refused_requests": stats.refused_requests.load(Ordering::Relaxed),
                    "arrivals": stats.arrivals.lock().unwrap().iter()
                        .map(|(at, retry)| json!([at.as_secs_f64(), retry.map(|r| r.as_secs_f64())]))
                        .collect::<Vec<_>>(),
                    "refusals": stats.refusals.lock().unwrap().iter()
                        .map(|(at, short_by)| json!([at.as_secs_f64(), short_by]))
                        .collect::<Vec<_>>(),
                    "permanent": stats.permanent.load(Ordering::Relaxed),
                    "tokens": stats.tokens.load(Ordering::Relaxed),
                })
            }
            ["burst", count] if options.output_tokens.is_none() => {
                let bodies = provider::chats(0, count.parse().unwrap_or(0));
                let ideal = provider::ideal_seconds(&bodies, &options, 0.0);
                json!({"bodies": bodies, "ideal": ideal})
            }
            ["burst", count] => {
                // The same calls, as Anthropic's messages API takes them.
                let bodies: Vec<Value> = provider::chats(0, count.parse().unwrap_or(0))
                    .into_iter()
                    .map(|chat| {
                        json!({
                            "model": "claude-sonnet-4-5",
                            "max_tokens": chat["max_tokens"],
                            "system": chat["messages"][0]["content"],
                            "messages": [chat["messages"][1]],
                        })
                    })
                    .collect();
                let ideal = provider::ideal_seconds_anthropic(&bodies, &options);
                json!({"bodies": bodies, "ideal": ideal})
            }
            _ => json!({"error": format!("unknown command `{line}`")}),
        };
        println!("{answer}");
    }
}

async fn redis_calls(args: &[String]) {
    let (url, key) = (arg(args, 2), arg(args, 3));
    let limits = Limits::parse(arg(args, 4), arg(args, 5)).expect("the limits parse");
    let (calls, each) = (number(args, 6), number(args, 7));
    let store = RedisStore::connect(url).await.expect("Redis answers");
    let registry = Registry::new(store);
    let limiter = registry.limiter(key, &limits).expect("a limiter");
    let mut admitted = 0;
    let mut ready_in = Value::Null;
    for _ in 0..calls {
        match limiter
            .try_acquire(Cost::call(each))
            .await
            .expect("the store answers")
        {
            Attempt::Admitted(_) => admitted += 1,
            Attempt::NotYet(wait) => {
                ready_in = json!(wait.as_secs_f64());
                break;
            }
        }
    }
    let snapshot = limiter.snapshot().await.expect("the store answers");
    let mut levels = serde_json::Map::new();
    for (name, currency) in [
        ("requests", Currency::Requests),
        ("tokens", Currency::Tokens),
    ] {
        if let Some(least) = snapshot.least(currency) {
            levels.insert(name.to_owned(), json!(least.whole() as i64));
        }
    }
    println!(
        "{}",
        json!({"admitted": admitted, "ready_in": ready_in, "levels": levels})
    );
}
