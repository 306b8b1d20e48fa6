//! After a provider's 429 the loop converges (issue 30): the key's picture of the window comes
//! down to the provider's, so the next call it lets out is not refused again unless something
//! else spends the window.
//!
//! A model of the provider here counts what OpenAI counts, on its own clock: a call's tokens
//! (its input as the provider counts it, up to 3% away from the estimate either way, the same
//! for the same call, plus the output it reserves) when it *arrives*, a request for every call,
//! refused ones included (a refusal can leave the request window in debt, and its pause says
//! so), and the unused part of a reservation back when the answer is done. Its answers carry
//! `x-ratelimit-remaining-*`, and a 429 `retry-after-ms` (rounded up) and `retry-after` (whole
//! seconds, rounded up).
//!
//! Random schedules: calls arriving alone and in bursts, each taking a few ms to reach the
//! provider and 0 to 3 s to be answered (so answers come back in any order), clients that give
//! up at a random moment (waiting in line, or with the call out), prompts the provider counts
//! up to 3% away from the estimate. Driven through the gate's [`Attempts`] (what the proxy and
//! every adapter drive: each retry pays its own toll) on tokio's paused clock, on the memory
//! store and on a real Redis whose script runs at the paused clock's time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;
use tokio::time::Instant;
use tollgate::http::{Attempts, Gate, Next, Profile};
use tollgate::{Limits, MemoryStore, Registry};

/// The provider's limits, and the key's: 60 requests and 20,000 tokens per 10 s.
const REQUESTS: u64 = 60;
const TOKENS: u64 = 20_000;
const PERIOD: Duration = Duration::from_secs(10);

/// One window of the provider's, in `tokens × period_ns` units, refilled `limit` a nanosecond;
/// a debt (what it spent beyond what it held) is paid from the refill first.
#[derive(Debug, Clone)]
struct Window {
    limit: u128,
    level: u128,
    debt: u128,
    at: Duration,
}

impl Window {
    fn full(limit: u64) -> Window {
        Window {
            limit: u128::from(limit),
            level: u128::from(limit) * PERIOD.as_nanos(),
            debt: 0,
            at: Duration::ZERO,
        }
    }

    fn refill(&mut self, now: Duration) {
        let mut gain = self.limit * now.saturating_sub(self.at).as_nanos();
        let paid = gain.min(self.debt);
        gain -= paid;
        self.debt -= paid;
        self.level = (self.level + gain).min(self.limit * PERIOD.as_nanos());
        self.at = self.at.max(now);
    }

    /// How long until `cost` fits (zero: it does).
    fn wait_for(&self, cost: u64) -> Duration {
        let needed = u128::from(cost) * PERIOD.as_nanos();
        if self.level >= needed {
            return Duration::ZERO;
        }
        Duration::from_nanos(
            u64::try_from((needed + self.debt - self.level).div_ceil(self.limit)).unwrap(),
        )
    }

    fn take(&mut self, cost: u64) {
        let units = u128::from(cost) * PERIOD.as_nanos();
        let taken = self.level.min(units);
        self.level -= taken;
        self.debt += units - taken;
    }

    fn give(&mut self, cost: u64) {
        let cap = self.limit * PERIOD.as_nanos();
        self.level = (self.level + u128::from(cost) * PERIOD.as_nanos()).min(cap);
    }

    fn whole(&self) -> u64 {
        u64::try_from(self.level / PERIOD.as_nanos()).unwrap()
    }
}

/// What the provider saw, in the order calls arrived: `true` for a 429.
#[derive(Debug)]
struct ProviderModel {
    start: Instant,
    requests: Window,
    tokens: Window,
    arrivals: Vec<bool>,
}

impl ProviderModel {
    fn new(start: Instant) -> ProviderModel {
        ProviderModel {
            start,
            requests: Window::full(REQUESTS),
            tokens: Window::full(TOKENS),
            arrivals: Vec::new(),
        }
    }

    fn now(&mut self) -> Duration {
        let now = self.start.elapsed();
        self.requests.refill(now);
        self.tokens.refill(now);
        now
    }

    /// A call of `tokens` arrives: answered (its headers), or refused (its headers and pause).
    fn arrive(&mut self, tokens: u64) -> (StatusCode, HeaderMap) {
        self.now();
        let wait = self.requests.wait_for(1).max(self.tokens.wait_for(tokens));
        let status = if wait.is_zero() {
            self.requests.take(1);
            self.tokens.take(tokens);
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        let mut pause = wait;
        if !wait.is_zero() {
            // A refused request still counts against the request limit.
            self.requests.take(1);
            pause = pause.max(self.requests.wait_for(1));
        }
        self.arrivals.push(!wait.is_zero());
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-ratelimit-remaining-requests",
            self.requests.whole().into(),
        );
        headers.insert("x-ratelimit-remaining-tokens", self.tokens.whole().into());
        if !pause.is_zero() {
            let ms = pause.as_nanos().div_ceil(1_000_000);
            headers.insert("retry-after-ms", u64::try_from(ms).unwrap().into());
            headers.insert("retry-after", pause.as_secs().saturating_add(1).into());
        }
        (status, headers)
    }

    /// An answer is done: the reservation it did not use comes back.
    fn done(&mut self, unused: u64) {
        self.now();
        self.tokens.give(unused);
    }
}

/// One call of a schedule.
#[derive(Debug, Clone)]
struct Planned {
    /// When it starts, from the run's start.
    at_ms: u64,
    words: usize,
    max_tokens: u64,
    /// How far the provider's count of its prompt strays from the estimate, in thousandths
    /// (-30 to 30).
    error: i64,
    /// How long it takes to reach the provider, and to be answered once there.
    up_ms: u64,
    answer_ms: u64,
    /// The client gives up after this long, if it does.
    give_up_ms: Option<u64>,
}

/// A call of a schedule: half of them in the burst at the start, the rest arriving over 6 s;
/// `small` calls (a few words, a few tokens reserved) run out of requests before tokens.
fn planned(small: bool) -> impl Strategy<Value = Planned> {
    let (words, reserve) = if small {
        (1..20usize, 1..10u64)
    } else {
        (40..900usize, 1..200u64)
    };
    (
        prop_oneof![Just(0u64), 0..6_000u64],
        words,
        reserve,
        -30..=30i64,
        0..6u64,
        0..3_000u64,
        prop::option::weighted(0.15, 0..4_000u64),
    )
        .prop_map(
            |(at_ms, words, max_tokens, error, up_ms, answer_ms, give_up_ms)| Planned {
                at_ms,
                words,
                max_tokens,
                error,
                up_ms,
                answer_ms,
                give_up_ms,
            },
        )
}

fn body(plan: &Planned) -> serde_json::Value {
    json!({
        "model": "gpt-4o",
        "max_tokens": plan.max_tokens,
        "messages": [{"role": "user", "content": vec!["word"; plan.words].join(" ")}],
    })
}

/// The provider's count of a call: its prompt, strayed, and what it reserves.
fn provider_count(plan: &Planned) -> u64 {
    let prompt = tollgate_testkit::provider::chat_prompt(&body(plan));
    let strayed = (prompt as i64 * (1_000 + plan.error) + 500) / 1_000;
    u64::try_from(strayed.max(1)).unwrap() + plan.max_tokens
}

/// What the provider's model writes for a call (never more than reserved).
fn written(plan: &Planned) -> u64 {
    plan.max_tokens.min(5 + plan.words as u64 % 40)
}

/// One call through the gate's attempts, as an adapter drives them.
async fn one_call(gate: Gate, provider: Arc<Mutex<ProviderModel>>, plan: Planned) {
    tokio::time::sleep(Duration::from_millis(plan.at_ms)).await;
    let body = body(&plan).to_string();
    let parts = crate::parts();
    let mut attempts = Attempts::new(&gate, &parts, body.as_bytes()).unwrap();
    loop {
        let Ok(mut call) = attempts.admit().await else {
            return;
        };
        call.sending();
        tokio::time::sleep(Duration::from_millis(plan.up_ms)).await;
        let count = provider_count(&plan);
        let (status, headers) = provider.lock().unwrap().arrive(count);
        if status == StatusCode::OK {
            // The provider writes the answer whether or not the client is still there.
            let provider = Arc::clone(&provider);
            let unused = plan.max_tokens - written(&plan);
            let answer_ms = plan.answer_ms;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(answer_ms)).await;
                provider.lock().unwrap().done(unused);
            });
            tokio::time::sleep(Duration::from_millis(plan.answer_ms)).await;
        }
        let answer = if status == StatusCode::OK {
            json!({"usage": {"prompt_tokens": count - plan.max_tokens, "completion_tokens": written(&plan)}})
        } else {
            json!({"error": {"type": "tokens", "code": "rate_limit_exceeded", "message": "Rate limit reached on tokens per min (TPM)."}})
        };
        let next = attempts
            .answered(
                call,
                status,
                &headers,
                Full::new(Bytes::from(answer.to_string())),
            )
            .await
            .unwrap();
        match next {
            Next::Deliver(metered) => {
                let _ = metered.collect().await;
                return;
            }
            Next::Retry(delay) => tokio::time::sleep(delay).await,
            _ => return,
        }
    }
}

/// Runs the schedule against a gate on `registry`, on a key of its own (a shared store keeps the
/// others'); answers the provider's arrivals.
async fn run(registry: Registry, key: String, plans: Vec<Planned>) -> Vec<bool> {
    let start = Instant::now();
    let provider = Arc::new(Mutex::new(ProviderModel::new(start)));
    let gate = Gate::builder(Profile::openai())
        .limits(Limits::new(
            tollgate::Rate::new(REQUESTS, PERIOD).unwrap(),
            tollgate::Rate::new(TOKENS, PERIOD).unwrap(),
        ))
        .registry(Arc::new(registry))
        .key(move |_, _| key.clone())
        .timeout(Some(Duration::from_secs(60)))
        .build()
        .unwrap();
    let tasks: Vec<_> = plans
        .into_iter()
        .map(|plan| {
            let (gate, provider) = (gate.clone(), Arc::clone(&provider));
            let give_up = plan.give_up_ms.map(Duration::from_millis);
            tokio::spawn(async move {
                let call = one_call(gate, provider, plan);
                match give_up {
                    Some(after) => {
                        let _ = tokio::time::timeout(after, call).await;
                    }
                    None => call.await,
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // The answers still being written.
    tokio::time::sleep(Duration::from_secs(4)).await;
    provider.lock().unwrap().arrivals.clone()
}

/// The promise: a 429 is followed by at most one more before the run ends.
fn converged(arrivals: &[bool]) -> Result<(), TestCaseError> {
    let refused = arrivals.iter().filter(|r| **r).count();
    prop_assert!(
        refused <= 2,
        "{refused} 429s in {} arrivals: {:?}",
        arrivals.len(),
        arrivals
            .iter()
            .enumerate()
            .filter(|(_, r)| **r)
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// `default` cases, or `TOLLGATE_CONVERGE_CASES` (for a long run by hand).
fn cases(default: u32) -> u32 {
    std::env::var("TOLLGATE_CONVERGE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runs(cases: u32, registry: impl Fn(Instant) -> Registry) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let total = std::sync::atomic::AtomicUsize::new(0);
    let case = std::sync::atomic::AtomicUsize::new(0);
    let refused = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(
            &prop::bool::ANY.prop_flat_map(|small| prop::collection::vec(planned(small), 1..90)),
            |plans| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .start_paused(true)
                    .build()
                    .unwrap();
                let key = format!(
                    "converge-{}",
                    case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                );
                let arrivals = runtime.block_on(async {
                    let registry = registry(Instant::now());
                    run(registry, key, plans).await
                });
                total.fetch_add(arrivals.len(), std::sync::atomic::Ordering::Relaxed);
                refused.fetch_add(
                    arrivals.iter().filter(|r| **r).count(),
                    std::sync::atomic::Ordering::Relaxed,
                );
                converged(&arrivals)
            },
        )
        .unwrap();
    println!(
        "{} arrivals in all, {} of them refused",
        total.into_inner(),
        refused.into_inner()
    );
}

#[test]
fn after_a_429_the_next_call_is_not_refused_again_in_memory() {
    runs(cases(64), |_| Registry::new(MemoryStore::on_tokio_clock()));
}

#[cfg(feature = "testing")]
#[test]
fn after_a_429_the_next_call_is_not_refused_again_on_redis() {
    let Some(server) = crate::scripted::ScriptServer::start() else {
        return;
    };
    runs(cases(64), |start| {
        Registry::new(tollgate::store::AnyStore::custom(server.store(start)))
    });
}

fn gate_on(registry: &Arc<Registry>, profile: Profile, limits: Limits) -> Gate {
    Gate::builder(profile)
        .limits(limits)
        .registry(Arc::clone(registry))
        .first_answer_wait(None)
        .model_spending_elsewhere(false)
        .estimate_margin(tollgate::Margin::NONE)
        .retries(10)
        .timeout(Some(Duration::from_secs(600)))
        .build()
        .unwrap()
}

fn pause_of(next: &Next<Full<Bytes>>) -> Duration {
    match next {
        Next::Retry(delay) => *delay,
        other => panic!("not a retry: {other:?}"),
    }
}

async fn refused_once(attempts: &mut Attempts, headers: &HeaderMap) -> Duration {
    let mut call = attempts.admit().await.unwrap();
    call.sending();
    let body = json!({"error": {"type": "requests", "code": "rate_limit_exceeded", "message": "Rate limit reached on requests per min (RPM)."}});
    let next = attempts
        .answered(
            call,
            StatusCode::TOO_MANY_REQUESTS,
            headers,
            Full::new(Bytes::from(body.to_string())),
        )
        .await
        .unwrap();
    pause_of(&next)
}

/// Every attempt of a request pays its toll: a retry after a 429 is charged again (the refused
/// attempt keeps its own charge: the provider counted its request, and a 429 never raises a
/// window).
#[tokio::test(start_paused = true)]
async fn a_retry_pays_its_own_toll() {
    let registry = Arc::new(Registry::new(MemoryStore::on_tokio_clock()));
    let limits = Limits::parse("100/d", "100000/d").unwrap();
    let gate = gate_on(&registry, Profile::openai(), limits.clone());
    let body = crate::chat(10, 5).to_string();
    let mut attempts = Attempts::new(&gate, &crate::parts(), body.as_bytes()).unwrap();
    // Refused for something else than its windows (both counts say it can pay): the key is
    // paused, and nothing lowered.
    let mut headers = HeaderMap::new();
    headers.insert("retry-after-ms", 10.into());
    headers.insert("x-ratelimit-remaining-requests", 1_000.into());
    headers.insert("x-ratelimit-remaining-tokens", 1_000_000.into());
    let pause = refused_once(&mut attempts, &headers).await;
    tokio::time::sleep(pause).await;
    let mut call = attempts.admit().await.unwrap();
    let cost = call.cost().unwrap();
    call.sending();
    let limiter = registry.limiter("openai:gpt-4o", &limits).unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    // Two requests paid, and the tokens twice.
    assert_eq!(snapshot.requests().unwrap().whole(), 98);
    assert_eq!(
        snapshot.tokens().unwrap().whole(),
        100_000 - 2 * i128::from(cost.tokens)
    );
}

/// 429s in a row on a key pause it longer each time: the provider's pause, then twice it, four
/// times it, each give or take a fifth (never below the provider's); an answer that is not a
/// 429 starts again from the provider's pause.
#[tokio::test(start_paused = true)]
async fn consecutive_429s_back_off_exponentially_with_jitter_and_reset_on_an_answer() {
    let registry = Arc::new(Registry::new(MemoryStore::on_tokio_clock()));
    let gate = gate_on(
        &registry,
        Profile::openai(),
        Limits::parse("100000/d", "").unwrap(),
    );
    let mut headers = HeaderMap::new();
    headers.insert("retry-after-ms", 300.into());
    let body = crate::chat(10, 5).to_string();
    let answer = |status| {
        let (gate, headers, body) = (gate.clone(), headers.clone(), body.clone());
        async move {
            let mut call = gate.admit(&crate::parts(), body.as_bytes()).await.unwrap();
            call.sending();
            let verdict = call.respond(status, &headers, None).await;
            match verdict {
                tollgate::http::Verdict::Transient { pause: Some(pause) } => {
                    tokio::time::sleep(pause).await;
                    pause.as_millis()
                }
                tollgate::http::Verdict::Passed => 0,
                other => panic!("{other:?}"),
            }
        }
    };
    let mut seen = Vec::new();
    for _ in 0..20 {
        let mut pauses = Vec::new();
        for _ in 0..4 {
            pauses.push(answer(StatusCode::TOO_MANY_REQUESTS).await);
        }
        assert_eq!(pauses[0], 300, "{pauses:?}");
        assert!((480..=720).contains(&pauses[1]), "{pauses:?}");
        assert!((960..=1_440).contains(&pauses[2]), "{pauses:?}");
        assert!((1_920..=2_880).contains(&pauses[3]), "{pauses:?}");
        seen.push(pauses[1]);
        // An answer: the next 429 pauses for the provider's own pause again.
        assert_eq!(answer(StatusCode::OK).await, 0);
    }
    // Jitter: twenty second pauses are not all the same.
    seen.sort_unstable();
    seen.dedup();
    assert!(seen.len() > 10, "{seen:?}");
}

/// The pause a 429 with `headers` gives `call`.
async fn refused_pause(call: &mut tollgate::http::Call, headers: &HeaderMap) -> Duration {
    match call
        .respond(StatusCode::TOO_MANY_REQUESTS, headers, None)
        .await
    {
        tollgate::http::Verdict::Transient { pause: Some(pause) } => pause,
        other => panic!("{other:?}"),
    }
}

/// A provider that says "retry now" (`retry-after-ms: 0`) 429 after 429 still meets growing
/// pauses: from the limiter's backoff base (5 ms by default), doubled each time with jitter.
/// Before, every pause was the hint, nothing, and the key was never paused.
#[tokio::test(start_paused = true)]
async fn repeated_429s_that_say_retry_now_back_off_from_the_backoff_base() {
    let registry = Arc::new(Registry::new(MemoryStore::on_tokio_clock()));
    let gate = gate_on(
        &registry,
        Profile::openai(),
        Limits::parse("100000/d", "").unwrap(),
    );
    let mut headers = HeaderMap::new();
    headers.insert("retry-after-ms", 0.into());
    let body = crate::chat(10, 5).to_string();
    let mut pauses = Vec::new();
    for _ in 0..5 {
        let mut call = gate.admit(&crate::parts(), body.as_bytes()).await.unwrap();
        call.sending();
        let pause = refused_pause(&mut call, &headers).await;
        tokio::time::sleep(pause).await;
        pauses.push(pause.as_micros());
    }
    assert_eq!(pauses[0], 0, "{pauses:?}");
    for (n, pause) in pauses.iter().enumerate().skip(1) {
        // 5 ms · 2^n, give or take a fifth.
        let middle = 5_000u128 << n;
        assert!(
            (middle * 4 / 5..=middle * 6 / 5).contains(pause),
            "{pauses:?}"
        );
    }
}

/// Calls in flight together and refused together are one strike, not six: each pauses the
/// provider's hint (the first refusal corrected the windows; the rest add nothing to learn),
/// and the next call waits that second, not the 28 s six strikes in a row made it. A call
/// admitted after them and refused again is the second strike.
#[tokio::test(start_paused = true)]
async fn calls_refused_together_are_one_strike() {
    let registry = Arc::new(Registry::new(MemoryStore::on_tokio_clock()));
    // A request window that refills fast: the five refused after the first leave it five
    // requests in debt (OpenAI counts a refused request), 3 ms of refill.
    let gate = gate_on(
        &registry,
        Profile::openai(),
        Limits::parse("100000/m", "").unwrap(),
    );
    let mut headers = HeaderMap::new();
    headers.insert("retry-after-ms", 1_000.into());
    let body = crate::chat(10, 5).to_string();
    let mut calls = Vec::new();
    for _ in 0..6 {
        let mut call = gate.admit(&crate::parts(), body.as_bytes()).await.unwrap();
        call.sending();
        calls.push(call);
    }
    let mut pauses = Vec::new();
    for call in &mut calls {
        pauses.push(refused_pause(call, &headers).await);
    }
    assert_eq!(pauses, vec![Duration::from_secs(1); 6]);
    let start = tokio::time::Instant::now();
    let mut next = gate.admit(&crate::parts(), body.as_bytes()).await.unwrap();
    // The pause, then the five refused requests' debt: 5 at 100,000 a minute, 3 ms.
    assert_eq!(start.elapsed(), Duration::from_millis(1_003));
    next.sending();
    let second = refused_pause(&mut next, &headers).await;
    assert!(
        (Duration::from_millis(1_600)..=Duration::from_millis(2_400)).contains(&second),
        "{second:?}"
    );
}

/// A 429 that says nothing (no headers, no body) never raises a window, on either profile, even
/// one in debt: the refused call's charge stays (before, it came back and lifted a window in
/// debt towards zero).
#[tokio::test(start_paused = true)]
async fn a_bare_429_never_raises_a_window() {
    for (profile, path) in [
        (Profile::openai(), "/v1/chat/completions"),
        (Profile::anthropic(), "/v1/messages"),
    ] {
        let registry = Arc::new(Registry::new(MemoryStore::on_tokio_clock()));
        let limits = Limits::parse("100/d", "10000/d")
            .unwrap()
            .with_output_tokens("10000/d".parse::<tollgate::Rates>().unwrap());
        let gate = gate_on(&registry, profile, limits.clone());
        let head = http::Request::post(format!("http://provider.invalid{path}"))
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let body = crate::chat(100, 50).to_string();
        // A call that used far more than its estimate leaves the windows in debt.
        let mut big = gate.admit(&head, body.as_bytes()).await.unwrap();
        big.sending();
        let key = big.key().to_owned();
        big.respond(StatusCode::OK, &HeaderMap::new(), None).await;
        big.finish(tollgate::http::Reported::read(
            br#"{"usage":{"prompt_tokens":30000,"completion_tokens":50,"input_tokens":30000,"output_tokens":50}}"#,
            false,
        ))
        .await
        .unwrap();
        let limiter = registry.limiter(&key, &limits).unwrap();
        let levels = |s: tollgate::Snapshot| {
            s.windows()
                .iter()
                .map(|a| a.tokens.whole())
                .collect::<Vec<_>>()
        };
        let mut call = gate.admit(&head, body.as_bytes()).await;
        // The debt holds the next call back: charge it by hand, then refuse it bare.
        if call.is_err() {
            tokio::time::sleep(Duration::from_secs(86_400)).await;
            call = gate.admit(&head, body.as_bytes()).await;
        }
        let mut call = call.unwrap();
        call.sending();
        let before = levels(limiter.snapshot().await.unwrap());
        call.respond(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), None)
            .await;
        drop(call);
        let after = levels(limiter.snapshot().await.unwrap());
        for (b, a) in before.iter().zip(&after) {
            assert!(a <= b, "{path}: {before:?} became {after:?}");
        }
    }
}

/// The cascade's own step: the provider counted a refused request, so its request window is in
/// debt, and its pause says how long until one request is there. The key's window holds exactly
/// one request when that pause ends (not the pause's refill on top of an emptied window): the
/// next call goes when the provider can take it, and the one after a full request's refill
/// later.
#[tokio::test(start_paused = true)]
async fn after_a_429_the_request_window_holds_one_request_when_the_pause_ends() {
    let registry = Arc::new(Registry::new(MemoryStore::on_tokio_clock()));
    let limits = Limits::parse("6/s", "").unwrap();
    let gate = gate_on(&registry, Profile::openai(), limits.clone());
    let body = crate::chat(10, 5).to_string();
    let start = Instant::now();
    let mut refused = gate.admit(&crate::parts(), body.as_bytes()).await.unwrap();
    refused.sending();
    let mut headers = HeaderMap::new();
    // One request at 6 a second, from a debt of 0.8: 300 ms.
    headers.insert("retry-after-ms", 300.into());
    headers.insert("x-ratelimit-remaining-requests", 0.into());
    let verdict = refused
        .respond(StatusCode::TOO_MANY_REQUESTS, &headers, None)
        .await;
    assert_eq!(
        verdict,
        tollgate::http::Verdict::Transient {
            pause: Some(Duration::from_millis(300))
        }
    );
    drop(refused);
    let limiter = registry.limiter("openai:gpt-4o", &limits).unwrap();
    let admit = || async {
        let mut call = gate.admit(&crate::parts(), body.as_bytes()).await.unwrap();
        call.sending();
        (call, start.elapsed())
    };
    let (_retry, at) = admit().await;
    assert_eq!(at, Duration::from_millis(300));
    let held = limiter.snapshot().await.unwrap().requests().unwrap();
    assert!(held.is(0, 1), "{held:?}");
    // A request's refill later (166.67 ms), on tokio's millisecond timer.
    let (_next, at) = admit().await;
    assert_eq!(at, Duration::from_millis(467));
}
