//! The bound, whatever the provider says: at any moment of a run, what the provider reports it
//! billed for the calls it accepted, plus the estimates of the calls still out, stays within
//! every window's burst plus its refill over the run, plus the window's debt. The debt is what
//! calls that were out together turned out to use beyond their estimates, charged when they
//! settled and not yet refilled; it is never left uncharged (a sync that finds the provider's
//! count already held a shortfall takes it off the windows itself, never more than it found),
//! and new calls wait until it is paid back.
//!
//! The provider here is an adversary: its `remaining` headers are random (far above or below
//! the limits, absent, garbled, zero), it refuses at random (transient 429s with any pause,
//! permanent ones), answers after random delays, and reports usage up to 100 times the
//! estimate. The gate is driven by hand (sans-IO) on tokio's paused clock, with the model of
//! spending elsewhere on or off; on the memory store (10,000 cases) and on a real Redis
//! (1,000 cases, at explicit times on the script's clock).
//!
//! The check is exact: for each window, `Σ·P ≤ B·P + N·T + D` in integers (P the period in ns,
//! D the debt in the window's units), with Σ the usage reported for the calls answered, plus
//! the estimate of each call still in flight (whose shortfall is not known yet).

use crate::parts;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;
use serde_json::json;
use tollgate::http::{Call, Gate, Profile, Reported};
use tollgate::{Currency, Limits, MemoryStore, Registry};

/// What the adversary does next.
#[derive(Debug, Clone)]
enum Event {
    /// A call with a prompt of this many words, reserving this much output.
    Call { words: usize, reserve: u64 },
    /// The oldest call still out gets an answer.
    Answer {
        which: usize,
        status: Status,
        remaining: [Header; 2],
        usage: Usage,
    },
    /// Time passes.
    Wait(u64),
}

#[derive(Debug, Clone, Copy)]
enum Status {
    Ok,
    Transient(u64),
    Permanent,
}

#[derive(Debug, Clone)]
enum Header {
    Absent,
    Value(u64),
    Garbage(&'static str),
}

/// What the body says was used: the estimate times `times / 10`, or nothing.
#[derive(Debug, Clone, Copy)]
enum Usage {
    Scaled(u64),
    Absent,
}

fn header() -> impl Strategy<Value = Header> {
    prop_oneof![
        2 => Just(Header::Absent),
        3 => (0u64..200).prop_map(Header::Value),
        3 => (0u64..5_000).prop_map(Header::Value),
        1 => Just(Header::Value(u64::MAX)),
        1 => Just(Header::Value(100_000_000_000_000_000)),
        1 => prop_oneof![Just("-5"), Just("1e9"), Just("lots"), Just(""), Just("12.5.3")]
            .prop_map(Header::Garbage),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0usize..60, 1u64..40).prop_map(|(words, reserve)| Event::Call { words, reserve }),
        4 => (
            0usize..8,
            prop_oneof![
                8 => Just(Status::Ok),
                2 => (0u64..3_000).prop_map(Status::Transient),
                1 => Just(Status::Permanent),
            ],
            [header(), header()],
            prop_oneof![
                8 => (0u64..1_000).prop_map(Usage::Scaled),
                1 => Just(Usage::Absent),
            ],
        )
            .prop_map(|(which, status, remaining, usage)| Event::Answer {
                which,
                status,
                remaining,
                usage,
            }),
        2 => prop_oneof![Just(0u64), 1u64..50, 50u64..2_000, 2_000u64..20_000].prop_map(Event::Wait),
    ]
}

/// A call out: what it was charged, and what its body would report.
struct Out {
    call: Call,
    tokens: u64,
}

fn chat(words: usize, reserve: u64) -> Vec<u8> {
    json!({
        "model": "m",
        "max_tokens": reserve,
        "messages": [{"role": "user", "content": vec!["w"; words].join(" ")}],
    })
    .to_string()
    .into_bytes()
}

fn headers(remaining: &[Header; 2], pause: Option<u64>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("x-ratelimit-remaining-requests", &remaining[0]),
        ("x-ratelimit-remaining-tokens", &remaining[1]),
    ] {
        let text = match value {
            Header::Absent => continue,
            Header::Value(n) => n.to_string(),
            Header::Garbage(g) => (*g).to_owned(),
        };
        if let Ok(value) = HeaderValue::from_str(&text) {
            headers.insert(name, value);
        }
    }
    if let Some(ms) = pause {
        headers.insert("retry-after-ms", ms.into());
    }
    headers
}

/// What the windows let through so far: per currency, what the provider billed for answered
/// calls plus the estimates of calls still out; checked against every window of the limits.
struct Ledger {
    limiter: tollgate::Limiter,
    start: tokio::time::Instant,
    billed: [u128; 2],
}

impl Ledger {
    async fn check(&self, out: &[Out], what: &str) -> Result<(), TestCaseError> {
        let elapsed = self.start.elapsed().as_nanos();
        let in_flight = [
            out.len() as u128,
            out.iter().map(|o| u128::from(o.tokens)).sum(),
        ];
        let snapshot = self.limiter.snapshot().await.unwrap();
        for (i, currency) in [Currency::Requests, Currency::Tokens]
            .into_iter()
            .enumerate()
        {
            let total = self.billed[i] + in_flight[i];
            for window in snapshot.of(currency) {
                let rate = window.rate;
                let period = u128::from(rate.period_nanos());
                // The debt, in units of 1/P token.
                let level = window.tokens;
                let debt = if level.units() < 0 {
                    ((-level.units()) as u128 * period).div_ceil(u128::from(level.scale()))
                } else {
                    0
                };
                let allowed =
                    u128::from(rate.burst()) * period + u128::from(rate.amount()) * elapsed + debt;
                prop_assert!(
                    total * period <= allowed,
                    "{what}: {total} {currency} through `{rate}` in {elapsed} ns, {level} left"
                );
            }
        }
        Ok(())
    }
}

/// Runs the events against a gate on `registry`, checking the bound after each.
async fn run(
    registry: Arc<Registry>,
    limits: Limits,
    model: bool,
    events: Vec<Event>,
) -> Result<(), TestCaseError> {
    let limiter = registry.limiter("openai:m", &limits).unwrap();
    let gate = Gate::builder(Profile::openai())
        .limits(limits.clone())
        .registry(registry)
        .model_foreign_spending(model)
        .first_answer_wait(None)
        .timeout(Some(Duration::from_secs(30)))
        .build()
        .unwrap();
    let mut ledger = Ledger {
        limiter,
        start: tokio::time::Instant::now(),
        billed: [0, 0],
    };
    let mut out: Vec<Out> = Vec::new();
    for event in events {
        match event {
            Event::Call { words, reserve } => {
                // A call that can't be let through in time is refused, which bills nothing.
                if let Ok(mut call) = gate.admit(&parts(), &chat(words, reserve)).await {
                    call.sending();
                    let tokens = call.cost().unwrap().tokens;
                    out.push(Out { call, tokens });
                }
            }
            Event::Answer {
                which,
                status,
                remaining,
                usage,
            } => {
                if out.is_empty() {
                    continue;
                }
                let Out { mut call, tokens } = out.remove(which % out.len());
                let (code, body, pause): (StatusCode, &[u8], Option<u64>) = match status {
                    Status::Ok => (StatusCode::OK, b"", None),
                    Status::Transient(ms) => (
                        StatusCode::TOO_MANY_REQUESTS,
                        br#"{"error":{"type":"tokens","code":"rate_limit_exceeded"}}"#,
                        Some(ms),
                    ),
                    Status::Permanent => (
                        StatusCode::TOO_MANY_REQUESTS,
                        br#"{"error":{"code":"insufficient_quota"}}"#,
                        None,
                    ),
                };
                let refused = code == StatusCode::TOO_MANY_REQUESTS;
                call.respond(code, &headers(&remaining, pause), refused.then_some(body))
                    .await;
                if refused {
                    // Refused: the provider billed nothing for it.
                    drop(call);
                } else {
                    let used = match usage {
                        Usage::Scaled(times) => Some(tokens * times / 10),
                        Usage::Absent => None,
                    };
                    let reported = match used {
                        Some(total) => Reported::read(
                            json!({"usage": {"prompt_tokens": total, "completion_tokens": 0}})
                                .to_string()
                                .as_bytes(),
                            false,
                        ),
                        None => Reported::default(),
                    };
                    let _ = call.finish(reported).await;
                    // A usage above a whole window's burst is one no request could have
                    // produced: the gate settles it at that bound.
                    let most = limits.tokens().as_slice().iter().map(|r| r.burst()).max();
                    let billed = used.unwrap_or(tokens).min(most.unwrap_or(u64::MAX));
                    ledger.billed[0] += 1;
                    ledger.billed[1] += u128::from(billed);
                }
            }
            Event::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
        ledger.check(&out, "after an event").await?;
    }
    Ok(())
}

/// Small limits, so that the adversary spends them; estimates are at most a hundredth of the
/// token burst, so that usage of 100 times them stays far from the debt floor.
fn limits() -> impl Strategy<Value = Limits> {
    (1u64..20, 1u64..6, 6_000u64..20_000, 1u64..60).prop_map(|(requests, secs, tokens, minutes)| {
        Limits::parse(
            &format!("{requests}/{secs}s"),
            &format!("{tokens}/{minutes}m"),
        )
        .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("TOLLGATE_BOUND_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
    ))]

    #[test]
    fn whatever_the_provider_says_the_billed_usage_stays_within_the_bound_in_memory(
        limits in limits(),
        model in any::<bool>(),
        events in prop::collection::vec(event(), 1..40),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        // Made outside the runtime, so told to follow its paused clock.
        let registry = Arc::new(Registry::new(MemoryStore::on_tokio_clock()));
        runtime.block_on(run(registry, limits, model, events))?;
    }
}
