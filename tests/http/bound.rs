//! The bound, whatever the provider says: over every interval `[t1, t2]` of a run, what a key
//! let through (the costs of the calls it admitted in the interval, less the refunds of the
//! calls it settled in it) is at most `B + r·(t2 − t1)` of each of its windows. Shortfalls are
//! the documented allowance beyond it: a call in flight counts at its estimate (its shortfall
//! is not known yet), and a settlement's charge beyond the estimate is debt the windows carry
//! (new calls wait until it is paid back); neither is counted against the bound here, and
//! nothing else is allowed.
//!
//! The ledger is the test's own: a call's cost when the gate admitted it, and what the provider
//! reported for it, cut as the gate documents (`Call::finish`: output past what the request or
//! its model could write, or a window, is cut; input past twice its estimate and 8,192 tokens,
//! or a window; an answer without an output count keeps its reservation; a 429 keeps the
//! request and gives the rest back). Nothing is read from the limiter under test. The check is
//! exact, in integers: `Σ·P ≤ B·P + N·(t2 − t1)` for a window of `N` per `P` nanoseconds.
//!
//! The provider here is an adversary: its `remaining` headers are random (far above or below
//! the limits, absent, garbled, zero), it refuses at random (transient 429s with any pause,
//! naming any window, and permanent ones), answers in any order, and reports usage from nothing
//! to 100 times the estimate, or more than any request could produce. The gate is driven by
//! hand (sans-IO), with the model of spending elsewhere on or off, for OpenAI (requests and
//! tokens) and Anthropic (requests, input tokens and output tokens): on the memory store on
//! tokio's paused clock, and on a real Redis at explicit times on the script's clock (the calls
//! there may not wait: a clock the test moves does not move while a call sleeps).
//!
//! A gate that refused everything would keep any bound: each run's first call must pass (every
//! window is full then), and most calls of all runs must.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;
use tollgate::http::{Call, Gate, Profile, Reported};
use tollgate::{Currency, Limits, MemoryStore, Registry};

/// Whose gate: OpenAI meters input and reserved output as tokens; Anthropic meters output
/// apart, in output-token windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    OpenAi,
    Anthropic,
}

/// What the adversary does next.
#[derive(Debug, Clone)]
enum Event {
    /// A call with a prompt of this many words, reserving this much output.
    Call { words: usize, reserve: u64 },
    /// A call still out gets an answer.
    Answer {
        which: usize,
        status: Status,
        remaining: [Header; 3],
        usage: Usage,
    },
    /// Time passes.
    Wait(u64),
}

#[derive(Debug, Clone, Copy)]
enum Status {
    Ok,
    /// A rate limit with this pause, naming this window (0 requests, 1 tokens, 2 output
    /// tokens, 3 none).
    Transient(u64, u8),
    Permanent,
}

#[derive(Debug, Clone)]
enum Header {
    Absent,
    Value(u64),
    Garbage(&'static str),
}

/// What the body says was used.
#[derive(Debug, Clone, Copy)]
enum Usage {
    /// The input estimate times `input / 10`, and the reservation times `output / 10`.
    Scaled { input: u64, output: u64 },
    /// More than any request could produce.
    Impossible,
    /// No usage at all.
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
                2 => (0u64..3_000, 0u8..4).prop_map(|(ms, named)| Status::Transient(ms, named)),
                1 => Just(Status::Permanent),
            ],
            [header(), header(), header()],
            prop_oneof![
                6 => (0u64..20, 0u64..20)
                    .prop_map(|(input, output)| Usage::Scaled { input, output }),
                2 => (0u64..1_000, 0u64..1_000)
                    .prop_map(|(input, output)| Usage::Scaled { input, output }),
                1 => Just(Usage::Impossible),
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

/// Small limits, so that the adversary spends them: requests per seconds, and token windows
/// that hold from 3 to 50 calls (rates that refill a fraction of a token a nanosecond or
/// millisecond).
fn limits(provider: Provider) -> impl Strategy<Value = Limits> {
    (
        (1u64..20, 1u64..6),
        (300u64..5_000, 1u64..90),
        (100u64..2_000, 1u64..90),
    )
        .prop_map(
            move |((requests, secs), (tokens, tokens_secs), (output, output_secs))| {
                let limits = Limits::parse(
                    &format!("{requests}/{secs}s"),
                    &format!("{tokens}/{tokens_secs}s"),
                )
                .unwrap();
                match provider {
                    Provider::OpenAi => limits,
                    Provider::Anthropic => limits.with_output_tokens(
                        tollgate::Rate::new(output, Duration::from_secs(output_secs)).unwrap(),
                    ),
                }
            },
        )
}

/// Where the run's time comes from: tokio's paused clock, in nanoseconds from the run's start
/// (the memory store's clock), or in whole milliseconds (what the Redis script is told).
#[derive(Clone, Copy)]
struct Clock {
    start: tokio::time::Instant,
    whole_ms: bool,
}

impl Clock {
    /// Nanoseconds since the run began, as the store counts them.
    fn now(&self) -> u128 {
        let ns = self.start.elapsed().as_nanos();
        if self.whole_ms {
            ns / 1_000_000 * 1_000_000
        } else {
            ns
        }
    }
}

/// One entry of the ledger, per currency: at `at` ns, a call admitted at this cost (positive)
/// or a refund settled (negative).
#[derive(Debug, Clone, Copy)]
struct Entry {
    at: u128,
    amount: i128,
}

/// The test's own record of a run.
#[derive(Default)]
struct Ledger {
    entries: [Vec<Entry>; 3],
}

fn slot(currency: Currency) -> usize {
    match currency {
        Currency::Requests => 0,
        Currency::Tokens => 1,
        Currency::OutputTokens => 2,
        Currency::Spend => unreachable!("the runs keep no budget"),
    }
}

impl Ledger {
    fn push(&mut self, at: u128, amounts: [i128; 3]) {
        for (entries, amount) in self.entries.iter_mut().zip(amounts) {
            if amount != 0 {
                entries.push(Entry { at, amount });
            }
        }
    }

    /// Over every interval between two entries, for every window: `Σ·P ≤ B·P + N·dt`.
    fn check(&self, limits: &Limits) -> Result<(), TestCaseError> {
        // The runs keep no budget: the currencies a provider counts.
        for currency in [Currency::Requests, Currency::Tokens, Currency::OutputTokens] {
            let entries = &self.entries[slot(currency)];
            for rate in limits.of(currency).as_slice() {
                let (n, p, b) = (
                    i128::from(rate.amount()),
                    i128::from(rate.period_nanos()),
                    i128::from(rate.burst()),
                );
                for i in 0..entries.len() {
                    let mut sum = 0i128;
                    for entry in &entries[i..] {
                        sum += entry.amount;
                        let dt = (entry.at - entries[i].at) as i128;
                        prop_assert!(
                            sum * p <= b * p + n * dt,
                            "{currency}: {sum} let through `{rate}` in [{} ns, {} ns]",
                            entries[i].at,
                            entry.at
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// A call out: the call, and what the ledger needs to settle it.
struct Out {
    call: Call,
    /// Its cost at admission, per currency.
    cost: [u64; 3],
    /// The input the gate estimated, and the output the request named.
    input: u64,
    reserve: u64,
}

fn body(words: usize, reserve: u64) -> Vec<u8> {
    json!({
        "model": "m",
        "max_tokens": reserve,
        "messages": [{"role": "user", "content": vec!["w"; words].join(" ")}],
    })
    .to_string()
    .into_bytes()
}

fn head(provider: Provider) -> http::request::Parts {
    let path = match provider {
        Provider::OpenAi => "/v1/chat/completions",
        Provider::Anthropic => "/v1/messages",
    };
    http::Request::post(format!("http://provider.invalid{path}"))
        .body(())
        .unwrap()
        .into_parts()
        .0
}

fn headers(provider: Provider, remaining: &[Header; 3], pause: Option<u64>) -> HeaderMap {
    let names: [&str; 3] = match provider {
        Provider::OpenAi => [
            "x-ratelimit-remaining-requests",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-remaining-output-tokens",
        ],
        Provider::Anthropic => [
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-output-tokens-remaining",
        ],
    };
    let mut headers = HeaderMap::new();
    for (name, value) in names.into_iter().zip(remaining) {
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

/// A 429's body in the provider's words, naming window `named` (3: none).
fn refusal(provider: Provider, status: Status) -> Vec<u8> {
    let body = match (provider, status) {
        (Provider::OpenAi, Status::Permanent) => {
            json!({"error": {"code": "insufficient_quota", "message": "You exceeded your current quota."}})
        }
        (Provider::Anthropic, Status::Permanent) => {
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "You have reached your specified API usage limits."}})
        }
        (Provider::OpenAi, Status::Transient(_, named)) => {
            let (kind, words) = [
                ("requests", "requests per min (RPM)"),
                ("tokens", "tokens per min (TPM)"),
                ("tokens", "output tokens per min"),
                ("", "something"),
            ][usize::from(named)];
            json!({"error": {"type": kind, "code": "rate_limit_exceeded", "message": format!("Rate limit reached on {words}.")}})
        }
        (Provider::Anthropic, Status::Transient(_, named)) => {
            let words =
                ["requests", "input tokens", "output tokens", "something"][usize::from(named)];
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": format!("This request would exceed the rate limit for your organization of 100 {words} per minute.")}})
        }
        (_, Status::Ok) => unreachable!("not a refusal"),
    };
    body.to_string().into_bytes()
}

/// What the gate settles a call at, per currency, computed here from its documented rules:
/// input cut to the most of twice its estimate and 8,192 tokens, or the largest token window;
/// output cut to the most of what the request named, what an unknown model may write (4,096,
/// the profiles' default), or the largest window its currency has.
fn settled(provider: Provider, limits: &Limits, out: &Out, input: u64, output: u64) -> [u64; 3] {
    let largest = |currency: Currency| {
        limits
            .of(currency)
            .as_slice()
            .iter()
            .map(|r| r.burst())
            .max()
            .unwrap_or(0)
    };
    let input_most = largest(Currency::Tokens).max(out.input * 2 + 8_192);
    let output_window = match provider {
        Provider::OpenAi => largest(Currency::Tokens),
        Provider::Anthropic => largest(Currency::OutputTokens),
    };
    let output_most = out.reserve.max(4_096).max(output_window);
    let (input, output) = (input.min(input_most), output.min(output_most));
    match provider {
        Provider::OpenAi => [1, input + output, 0],
        Provider::Anthropic => [1, input, output],
    }
}

/// Runs the events against a gate on `registry` (every call on `key`), keeping the ledger, and
/// checks it. Answers how many calls were asked for, and how many passed.
#[allow(clippy::too_many_arguments)]
async fn run(
    provider: Provider,
    registry: Arc<Registry>,
    key: String,
    clock: Clock,
    limits: Limits,
    model: bool,
    events: Vec<Event>,
) -> Result<(u64, u64), TestCaseError> {
    let profile = match provider {
        Provider::OpenAi => Profile::openai(),
        Provider::Anthropic => Profile::anthropic(),
    };
    let gate = Gate::builder(profile)
        .limits(limits.clone())
        .registry(registry)
        .key(move |_, _| key.clone())
        .model_spending_elsewhere(model)
        .first_answer_wait(None)
        .timeout(Some(Duration::from_secs(30)))
        .build()
        .unwrap();
    let mut ledger = Ledger::default();
    let mut out: Vec<Out> = Vec::new();
    let (mut asked, mut passed) = (0u64, 0u64);
    for event in events {
        match event {
            Event::Call { words, reserve } => {
                asked += 1;
                // A call that can't be let through in time is refused, which bills nothing.
                match gate.admit(&head(provider), &body(words, reserve)).await {
                    Ok(mut call) => {
                        passed += 1;
                        call.sending();
                        let cost = call.cost().unwrap();
                        let cost = [cost.requests, cost.tokens, cost.output_tokens];
                        ledger.push(clock.now(), cost.map(i128::from));
                        out.push(Out {
                            input: call.input_tokens(),
                            call,
                            cost,
                            reserve,
                        });
                    }
                    Err(err) => {
                        // Every window is full at the start: the first call passes.
                        prop_assert!(asked > 1, "the first call was refused: {err}");
                    }
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
                let mut one = out.remove(which % out.len());
                let answer = headers(
                    provider,
                    &remaining,
                    match status {
                        Status::Transient(ms, _) => Some(ms),
                        _ => None,
                    },
                );
                if let Status::Ok = status {
                    one.call.respond(StatusCode::OK, &answer, None).await;
                    let (reported, used) = match usage {
                        Usage::Scaled { input, output } => {
                            let used = (one.input * input / 10, one.reserve * output / 10);
                            (Some(used), used)
                        }
                        Usage::Impossible => {
                            let used = (1_000_000_000_000, 1_000_000_000_000);
                            (Some(used), used)
                        }
                        // No usage: the charge stands.
                        Usage::Absent => (None, (one.input, one.reserve)),
                    };
                    let body = reported.map(|(input, output)| match provider {
                        Provider::OpenAi => {
                            json!({"usage": {"prompt_tokens": input, "completion_tokens": output}})
                        }
                        Provider::Anthropic => {
                            json!({"usage": {"input_tokens": input, "output_tokens": output}})
                        }
                    });
                    let reported = body.map_or_else(Reported::default, |body| {
                        Reported::read(body.to_string().as_bytes(), false)
                    });
                    let settled = match usage {
                        Usage::Absent => one.cost,
                        _ => settled(provider, &limits, &one, used.0, used.1),
                    };
                    let cost = one.cost;
                    let _ = one.call.finish(reported).await;
                    // Only refunds are counted: a charge beyond the estimate is debt, allowed.
                    let refund: [i128; 3] =
                        std::array::from_fn(|i| -i128::from(cost[i].saturating_sub(settled[i])));
                    ledger.push(clock.now(), refund);
                } else {
                    let body = refusal(provider, status);
                    one.call
                        .respond(StatusCode::TOO_MANY_REQUESTS, &answer, Some(&body))
                        .await;
                    // Refused: the request is kept (both profiles' rule), the rest comes back.
                    let cost = one.cost;
                    drop(one.call);
                    ledger.push(clock.now(), [0, -i128::from(cost[1]), -i128::from(cost[2])]);
                }
            }
            Event::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }
    ledger.check(&limits)?;
    Ok((asked, passed))
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec(event(), 1..40)
}

fn cases(default: u32) -> u32 {
    std::env::var("TOLLGATE_BOUND_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `cases` runs of `provider` on tokio's paused clock, each on the registry `registry`
/// makes for it (given the run's number and the clock's start).
fn runs(
    provider: Provider,
    cases: u32,
    whole_ms: bool,
    registry: impl Fn(u64, tokio::time::Instant) -> Registry,
) {
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::with_cases(cases)
    });
    let (asked, passed, case) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    runner
        .run(
            &(limits(provider), any::<bool>(), events()),
            |(limits, model, events)| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .start_paused(true)
                    .build()
                    .unwrap();
                let n = case.fetch_add(1, Ordering::Relaxed);
                let (a, p) = runtime.block_on(async {
                    let start = tokio::time::Instant::now();
                    // Made inside the runtime, so that it follows the paused clock.
                    let registry = Arc::new(registry(n, start));
                    let clock = Clock { start, whole_ms };
                    // Each run on a key of its own (a shared store keeps the others').
                    let key = format!("bound-{provider:?}-{n}");
                    run(provider, registry, key, clock, limits, model, events).await
                })?;
                asked.fetch_add(a, Ordering::Relaxed);
                passed.fetch_add(p, Ordering::Relaxed);
                Ok(())
            },
        )
        .unwrap();
    enough_passed(asked.into_inner(), passed.into_inner());
}

fn on_memory(provider: Provider, cases: u32) {
    runs(provider, cases, false, |_, _| {
        Registry::new(MemoryStore::on_tokio_clock())
    });
}

/// Most calls pass: the adversary asks for far less than the windows hold, on average.
fn enough_passed(asked: u64, passed: u64) {
    println!("{passed} of {asked} calls passed");
    assert!(
        passed * 5 >= asked * 3,
        "only {passed} of {asked} calls passed"
    );
}

#[test]
fn whatever_the_provider_says_what_passes_stays_within_the_bound_in_memory() {
    on_memory(Provider::OpenAi, cases(6_000));
}

#[test]
fn whatever_the_provider_says_output_windows_keep_the_bound_too_in_memory() {
    on_memory(Provider::Anthropic, cases(3_000));
}

/// On Redis the script runs at the time of the run's paused clock, in whole milliseconds (see
/// [`Scripted`](crate::scripted::Scripted)).
#[cfg(feature = "testing")]
mod on_redis {
    use super::*;
    use crate::scripted::ScriptServer;
    use tollgate::store::AnyStore;

    fn on_redis(provider: Provider, cases: u32) {
        let Some(server) = ScriptServer::start() else {
            return;
        };
        runs(provider, cases, true, |_, start| {
            Registry::new(AnyStore::custom(server.store(start)))
        });
    }

    #[test]
    fn whatever_the_provider_says_what_passes_stays_within_the_bound_on_redis() {
        on_redis(Provider::OpenAi, cases(1_000));
    }

    #[test]
    fn whatever_the_provider_says_output_windows_keep_the_bound_too_on_redis() {
        on_redis(Provider::Anthropic, cases(1_000));
    }
}
