//! `tollgate::http`: the sans-IO gate by hand, and each adapter with its real client against
//! the provider stand-in.

#[cfg(feature = "async-openai")]
mod async_openai;
mod bound;
mod closed_loop;
mod converge;
mod gate;
mod hostile;
mod metering;
mod queue;
#[cfg(feature = "reqwest-middleware")]
mod reqwest_middleware;
#[cfg(feature = "testing")]
mod scripted;
mod spend;
#[cfg(feature = "tower")]
mod tower;

use serde_json::{Value, json};

/// A chat of `words` words asking for up to `max_tokens`: what most gate tests send.
fn chat(words: usize, max_tokens: u64) -> Value {
    json!({
        "model": "gpt-4o",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": vec!["word"; words].join(" ")}],
    })
}

/// The head of a chat call to OpenAI.
fn parts() -> http::request::Parts {
    http::Request::post("http://provider.invalid/v1/chat/completions")
        .body(())
        .unwrap()
        .into_parts()
        .0
}
