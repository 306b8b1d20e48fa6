//! The sans-IO gate, driven by hand on an in-memory store and tokio's paused clock: exact
//! levels after header sync, settlement and 429s, with calls in flight.

use crate::{chat, parts};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tollgate::http::{Call, Gate, Profile, Reported, Verdict};
use tollgate::{Currency, Limits, MemoryStore, Registry};

fn gate(registry: &Arc<Registry>) -> Gate {
    Gate::builder(Profile::openai())
        .limits(Limits::parse("100/d", "100000/d").unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(registry))
        .build()
        .unwrap()
}

async fn admit(gate: &Gate, body: &Value) -> Call {
    gate.admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap()
}

fn remaining(tokens: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-remaining-tokens", tokens.into());
    headers
}

fn used(prompt: u64, completion: u64) -> Reported {
    Reported::read(
        json!({"usage": {"prompt_tokens": prompt, "completion_tokens": completion}})
            .to_string()
            .as_bytes(),
        false,
    )
}

async fn tokens_left(registry: &Registry) -> i128 {
    let limiter = registry
        .limiter(
            "openai:gpt-4o",
            &Limits::parse("100/d", "100000/d").unwrap(),
        )
        .unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    snapshot
        .windows()
        .iter()
        .find(|a| a.currency == Currency::Tokens)
        .unwrap()
        .tokens
        .whole()
}

#[tokio::test(start_paused = true)]
async fn the_cost_is_the_prompt_plus_the_reserved_output() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry);
    let body = chat(10, 200);
    let call = admit(&gate, &body).await;
    // 3 framing + "user" + 10 words + 3 priming, plus 200 reserved.
    assert_eq!(call.cost().unwrap().tokens, 3 + 1 + 10 + 3 + 200);
    assert_eq!(call.key(), "openai:gpt-4o");
    assert_eq!(tokens_left(&registry).await, 100_000 - 217);
}

#[tokio::test(start_paused = true)]
async fn calls_in_flight_at_a_sync_are_neither_lost_nor_counted_twice() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    // Three calls out before any answer, and exact levels: no waiting for the first answer,
    // and no margin for the neighbour (both tested on their own below).
    let gate = Gate::builder(Profile::openai())
        .limits(Limits::parse("100/d", "100000/d").unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .first_answer_wait(None)
        .model_spending_elsewhere(false)
        .build()
        .unwrap();
    // Three calls sent in order, 300 ms apart: a, b, c.
    let (a, b, c) = (chat(100, 100), chat(200, 100), chat(300, 100));
    let mut call_a = admit(&gate, &a).await;
    call_a.sending();
    tokio::time::advance(Duration::from_millis(300)).await;
    let mut call_b = admit(&gate, &b).await;
    call_b.sending();
    tokio::time::advance(Duration::from_millis(300)).await;
    let mut call_c = admit(&gate, &c).await;
    call_c.sending();
    let cost = |call: &Call| call.cost().unwrap().tokens;
    let (cost_a, cost_b, cost_c) = (cost(&call_a), cost(&call_b), cost(&call_c));
    assert_eq!(
        tokens_left(&registry).await,
        100_000 - i128::from(cost_a + cost_b + cost_c)
    );

    // b's answer: the provider has seen a and b (and a neighbour spent 5,000), not c.
    let provider_left = 100_000 - 5_000 - cost_a - cost_b;
    let verdict = call_b
        .respond(StatusCode::OK, &remaining(provider_left), None)
        .await;
    assert_eq!(verdict, Verdict::Passed);
    // c is still charged here: the sync compared the count with what the windows held when b
    // went out, and took off the 5,000 spent elsewhere (a call sent within 250 ms of b would
    // have been left out of that comparison: it may have arrived in either order).
    assert_eq!(
        tokens_left(&registry).await,
        i128::from(provider_left - cost_c)
    );

    // a used 40 more than estimated: the provider counted that already (a is in its count).
    call_a
        .respond(StatusCode::OK, &HeaderMap::new(), None)
        .await;
    let a_prompt = cost_a - 100;
    call_a.finish(used(a_prompt + 40, 100)).await.unwrap();
    assert_eq!(
        tokens_left(&registry).await,
        i128::from(provider_left - cost_c)
    );
    // b used 60 less than reserved: refunded.
    let b_prompt = cost_b - 100;
    call_b.finish(used(b_prompt, 40)).await.unwrap();
    assert_eq!(
        tokens_left(&registry).await,
        i128::from(provider_left - cost_c + 60)
    );
    // c was not in the provider's count: its shortfall of 25 is charged.
    let c_prompt = cost_c - 100;
    call_c.finish(used(c_prompt + 25, 100)).await.unwrap();
    assert_eq!(
        tokens_left(&registry).await,
        i128::from(provider_left - cost_c + 60) - 25
    );
}

#[tokio::test(start_paused = true)]
async fn a_remaining_above_the_local_level_never_raises_it() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry);
    let mut call = admit(&gate, &chat(50, 100)).await;
    let cost = call.cost().unwrap().tokens;
    call.respond(StatusCode::OK, &remaining(100_000), None)
        .await;
    assert_eq!(tokens_left(&registry).await, 100_000 - i128::from(cost));
    // Garbage never lowers either.
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-remaining-tokens", "-5".parse().unwrap());
    let mut call = admit(&gate, &chat(50, 100)).await;
    call.respond(StatusCode::OK, &headers, None).await;
    assert_eq!(tokens_left(&registry).await, 100_000 - 2 * i128::from(cost));
}

#[tokio::test(start_paused = true)]
async fn after_a_429_calls_in_flight_charge_no_shortfall_on_the_emptied_windows() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry);
    let (call_a, call_b) = (
        admit(&gate, &chat(100, 1)).await,
        admit(&gate, &chat(100, 1)).await,
    );
    let mut refused = admit(&gate, &chat(100, 1)).await;
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", "2".parse().unwrap());
    let body = br#"{"error":{"code":"rate_limit_exceeded","type":"tokens"}}"#;
    let verdict = refused
        .respond(StatusCode::TOO_MANY_REQUESTS, &headers, Some(body))
        .await;
    assert_eq!(
        verdict,
        Verdict::Transient {
            pause: Some(Duration::from_secs(2))
        }
    );
    // The window holds what the refused call needs less two seconds of refill (100,000 a day:
    // 2.3 tokens): it fits when the pause ends.
    let need = i128::from(refused.cost().unwrap().tokens);
    assert_eq!(tokens_left(&registry).await, need - 3);
    // Both underestimated by 500: the provider's 429 already counted them.
    let prompt = call_a.cost().unwrap().tokens;
    call_a.finish(used(prompt + 500, 0)).await.unwrap();
    call_b.finish(used(prompt + 500, 0)).await.unwrap();
    assert_eq!(tokens_left(&registry).await, need - 3);
}

#[tokio::test(start_paused = true)]
async fn permanent_429s_are_told_apart_from_rate_limits() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry);
    let mut call = admit(&gate, &chat(5, 1)).await;
    let quota = br#"{"error":{"code":"insufficient_quota","type":"insufficient_quota"}}"#;
    let verdict = call
        .respond(
            StatusCode::TOO_MANY_REQUESTS,
            &HeaderMap::new(),
            Some(quota),
        )
        .await;
    assert_eq!(
        verdict,
        Verdict::Permanent {
            code: Some("insufficient_quota".into()),
            message: None,
        }
    );

    let anthropic = Gate::builder(Profile::anthropic())
        .limits(Limits::parse("100/d", "100000/d").unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .build()
        .unwrap();
    let body = json!({"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let spend = br#"{"type":"error","error":{"type":"rate_limit_error"}}"#;
    let mut call = admit(&anthropic, &body).await;
    let verdict = call
        .respond(
            StatusCode::TOO_MANY_REQUESTS,
            &HeaderMap::new(),
            Some(spend),
        )
        .await;
    assert!(matches!(verdict, Verdict::Permanent { .. }), "{verdict:?}");
    let mut with_pause = HeaderMap::new();
    with_pause.insert("retry-after", "3".parse().unwrap());
    let mut call = admit(&anthropic, &body).await;
    let verdict = call
        .respond(StatusCode::TOO_MANY_REQUESTS, &with_pause, Some(spend))
        .await;
    assert_eq!(
        verdict,
        Verdict::Transient {
            pause: Some(Duration::from_secs(3))
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_without_limits_takes_them_from_its_first_response_one_call_at_a_time() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(Profile::openai())
        .limits_from_headers(Duration::from_secs(60))
        .registry(Arc::clone(&registry))
        .build()
        .unwrap();
    let body = chat(10, 100);
    let mut first = admit(&gate, &body).await;
    assert_eq!(first.cost(), None);
    // A second call waits while the first is out.
    let second = {
        let gate = gate.clone();
        let body = body.clone();
        tokio::spawn(async move { admit(&gate, &body).await })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!second.is_finished());
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("x-ratelimit-limit-requests", "500"),
        ("x-ratelimit-remaining-requests", "499"),
        ("x-ratelimit-limit-tokens", "30000"),
        ("x-ratelimit-remaining-tokens", "29000"),
    ] {
        headers.insert(name, value.parse().unwrap());
    }
    first.respond(StatusCode::OK, &headers, None).await;
    drop(first);
    let second = second.await.unwrap();
    let cost = second
        .cost()
        .expect("charged now that the limits are known");
    // The learned limits are exactly the headers', per minute: asking for them is no conflict.
    let limiter = registry
        .limiter("openai:gpt-4o", &Limits::parse("500/m", "30000/m").unwrap())
        .unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    assert_eq!(snapshot.windows()[0].tokens.whole(), 499 - 1);
    assert_eq!(
        snapshot.windows()[1].tokens.whole(),
        29_000 - i128::from(cost.tokens)
    );
}

/// Each currency is learned on its own: an answer with the request headers and not the token
/// headers leaves the tokens unknown, and calls still go one at a time (450,350 tokens once
/// passed at once after such an answer); when the token limit comes, a call larger than it is
/// refused, and a changed limit is followed.
#[tokio::test(start_paused = true)]
async fn a_currency_whose_limit_is_unknown_holds_its_calls_one_at_a_time() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(Profile::openai())
        .limits_from_headers(Duration::from_secs(60))
        .registry(Arc::clone(&registry))
        .build()
        .unwrap();
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    };
    let big = chat(10, 45_000);
    let mut first = admit(&gate, &big).await;
    first.sending();
    first
        .respond(
            StatusCode::OK,
            &headers(&[
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "499"),
            ]),
            None,
        )
        .await;
    drop(first);
    // Requests are known, tokens are not: the next call goes alone, and the one after it
    // waits for its answer (or its first second out).
    let mut second = admit(&gate, &big).await;
    assert_eq!(second.cost().map(|c| c.requests), Some(1));
    second.sending();
    let third = {
        let (gate, body) = (gate.clone(), big.clone());
        tokio::spawn(async move { gate.admit(&parts(), body.to_string().as_bytes()).await })
    };
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        !third.is_finished(),
        "a third call passed beside the second"
    );
    second
        .respond(
            StatusCode::OK,
            &headers(&[
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "498"),
                ("x-ratelimit-limit-tokens", "30000"),
                ("x-ratelimit-remaining-tokens", "29000"),
            ]),
            None,
        )
        .await;
    drop(second);
    // The token limit is known now: 45,000 tokens can never pass a window of 30,000.
    let refused = third.await.unwrap();
    assert!(
        matches!(refused, Err(tollgate::Error::CostExceedsCapacity { .. })),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_gate_forgets_keys_no_call_holds() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = Limits::parse("100/d", "100000/d").unwrap();
    let gate = Gate::builder(Profile::openai())
        .limits(limits.clone())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .key(|head, _| head.uri.path().to_owned())
        // No blind margin when the first answer is late: the levels below are the calls'.
        .model_spending_elsewhere(false)
        .build()
        .unwrap();
    // The key's first call goes alone: it holds the key's turn until its answer comes (or a
    // second passes), and the key's state knows it.
    let held = admit(&gate, &chat(1, 1)).await;
    for tenant in 0..10_000 {
        let head = http::Request::post(format!("http://provider.invalid/tenant/{tenant}"))
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let call = gate.admit(&head, b"{}").await.unwrap();
        drop(call);
    }
    assert!(
        gate.remembered_keys() <= 4_097,
        "{}",
        gate.remembered_keys()
    );
    // The key a call holds is kept: the next call on it meets the same state, whose turn the
    // held call still has, so it waits the first answer's second (a key forgotten and made
    // again would let it go at once, beside a call the provider has not answered).
    let started = tokio::time::Instant::now();
    let again = admit(&gate, &chat(1, 1)).await;
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // And the store holds both calls' charges on the key's windows: one request each.
    let limiter = registry.limiter("/v1/chat/completions", &limits).unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    let requests = snapshot.least(Currency::Requests).unwrap();
    // 100 a day: the second the second call waited refilled 100 / 86,400 of a request.
    assert!(requests.is(98 * 864 + 1, 864), "{requests}");
    drop((held, again));
}

#[tokio::test(start_paused = true)]
async fn a_keys_first_call_goes_alone_and_its_answer_can_show_spending_elsewhere() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry);
    let (a, b) = (chat(100, 100), chat(200, 100));
    let mut call_a = admit(&gate, &a).await;
    call_a.sending();
    let cost_a = call_a.cost().unwrap().tokens;
    // b waits for a's answer: until it, the windows can't know what others spent.
    let second = {
        let gate = gate.clone();
        tokio::spawn(async move { admit(&gate, &b).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!second.is_finished());
    // The provider says a neighbour spent 5,000: the windows go down to its count, and 4% of
    // the capacity further (4,000), since spending elsewhere is now known to happen.
    let provider_left = 100_000 - 5_000 - cost_a;
    call_a
        .respond(StatusCode::OK, &remaining(provider_left), None)
        .await;
    let call_b = second.await.unwrap();
    let cost_b = call_b.cost().unwrap().tokens;
    assert_eq!(
        tokens_left(&registry).await,
        i128::from(provider_left - 4_000 - cost_b)
    );
}

#[tokio::test(start_paused = true)]
async fn the_first_answer_is_waited_for_one_second_at_most() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry);
    let body = chat(10, 10);
    let first = admit(&gate, &body).await;
    let started = tokio::time::Instant::now();
    let second = admit(&gate, &body).await;
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // Without a wait configured, nobody waits.
    let eager = Gate::builder(Profile::openai())
        .limits(Limits::parse("100/d", "100000/d").unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::new(Registry::new(MemoryStore::new())))
        .first_answer_wait(None)
        .build()
        .unwrap();
    let _one = admit(&eager, &body).await;
    let started = tokio::time::Instant::now();
    let _two = admit(&eager, &body).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    drop((first, second));
}

/// What each window of `limits` on `key` holds, in whole tokens: requests, tokens, output.
async fn levels(registry: &Registry, key: &str, limits: &Limits) -> Vec<i128> {
    let snapshot = registry
        .limiter(key, limits)
        .unwrap()
        .snapshot()
        .await
        .unwrap();
    Currency::ALL
        .into_iter()
        .filter_map(|c| snapshot.least(c).map(|l| l.whole()))
        .collect()
}

/// A call refused with `body` (and a pause of a second, so that it is a rate limit), on a
/// gate of `profile` with `limits`: the levels after it, and what the call was charged.
async fn refused_with(
    profile: Profile,
    path: &str,
    limits: &Limits,
    body: &str,
) -> (Vec<i128>, tollgate::Cost) {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(profile)
        .limits(limits.clone())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::clone(&registry))
        .first_answer_wait(None)
        .model_spending_elsewhere(false)
        .build()
        .unwrap();
    let head = http::Request::post(format!("http://provider.invalid{path}"))
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let mut call = gate
        .admit(&head, chat(50, 100).to_string().as_bytes())
        .await
        .unwrap();
    call.sending();
    let cost = call.cost().unwrap();
    let key = call.key().to_owned();
    let mut headers = HeaderMap::new();
    headers.insert("retry-after-ms", 1_000.into());
    let verdict = call
        .respond(
            StatusCode::TOO_MANY_REQUESTS,
            &headers,
            Some(body.as_bytes()),
        )
        .await;
    assert!(matches!(verdict, Verdict::Transient { .. }), "{verdict:?}");
    drop(call);
    (levels(&registry, &key, limits).await, cost)
}

/// A 429 brings down the windows of the currencies it says are spent, and only those: each to
/// what the refused call needed there less what refills during the provider's pause (so that
/// the call fits exactly when the pause ends, as the provider said), never above where it was.
/// The others keep what they held, the refused call's charge included (a 429 never raises a
/// window). With no `remaining` headers, the gate reads the error's words: OpenAI's `type` and
/// its "tokens per min (TPM)", "requests per min (RPM)"; Anthropic's "input tokens per
/// minute", "output tokens per minute", "requests per minute". A 429 that names nothing brings
/// down everything.
#[tokio::test(start_paused = true)]
async fn a_429_brings_down_only_the_currencies_its_words_name() {
    // A second refills 1 request, 1,000 tokens and 500 output tokens.
    let openai = Limits::parse("60/m", "60000/m").unwrap();
    let chat_path = "/v1/chat/completions";
    let openai_tokens = r#"{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29500, Requested 900. Please try again in 1.8s."}}"#;
    let openai_requests = r#"{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms."}}"#;
    let openai_type = r#"{"error":{"type":"tokens","code":"rate_limit_exceeded","message":"Rate limit reached."}}"#;
    let nothing = r#"{"error":{"code":"rate_limit_exceeded","message":"Slow down."}}"#;
    let tokens = |c: tollgate::Cost| i128::from(c.tokens);
    let (levels, cost) = refused_with(Profile::openai(), chat_path, &openai, openai_tokens).await;
    assert_eq!(levels, [59, tokens(cost) - 1_000]);
    let (levels, cost) = refused_with(Profile::openai(), chat_path, &openai, openai_requests).await;
    assert_eq!(levels, [0, 60_000 - tokens(cost)]);
    let (levels, cost) = refused_with(Profile::openai(), chat_path, &openai, openai_type).await;
    assert_eq!(levels, [59, tokens(cost) - 1_000]);
    let (levels, cost) = refused_with(Profile::openai(), chat_path, &openai, nothing).await;
    assert_eq!(levels, [0, tokens(cost) - 1_000]);
    let anthropic = Limits::parse("60/m", "60000/m")
        .unwrap()
        .with_output_tokens("30000/m".parse::<tollgate::Rates>().unwrap());
    let messages = "/v1/messages";
    let words = |limit: &str| {
        format!(
            r#"{{"type":"error","error":{{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization (org-x) of {limit} per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."}}}}"#
        )
    };
    let output = |c: tollgate::Cost| i128::from(c.output_tokens);
    let (levels, cost) = refused_with(
        Profile::anthropic(),
        messages,
        &anthropic,
        &words("50,000 input tokens"),
    )
    .await;
    assert_eq!(levels, [59, tokens(cost) - 1_000, 30_000 - output(cost)]);
    let (levels, cost) = refused_with(
        Profile::anthropic(),
        messages,
        &anthropic,
        &words("10,000 output tokens"),
    )
    .await;
    assert_eq!(levels, [59, 60_000 - tokens(cost), output(cost) - 500]);
    let (levels, cost) = refused_with(
        Profile::anthropic(),
        messages,
        &anthropic,
        &words("50 requests"),
    )
    .await;
    assert_eq!(levels, [0, 60_000 - tokens(cost), 30_000 - output(cost)]);
    let anthropic_nothing = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit."}}"#;
    let (levels, cost) = refused_with(
        Profile::anthropic(),
        messages,
        &anthropic,
        anthropic_nothing,
    )
    .await;
    assert_eq!(levels, [0, tokens(cost) - 1_000, output(cost) - 500]);
}

/// Calls sent within 250 ms of a synced call, on either side, may reach the provider before
/// it: its count may hold them, so the sync leaves them out of what it takes off (an honest
/// provider is never double counted). A call sent 251 ms after it is outside: a count that
/// holds it shows that much spent elsewhere, and that much is taken off.
#[tokio::test(start_paused = true)]
async fn a_sync_leaves_out_calls_sent_within_250_ms_of_its_call() {
    for (after_ms, taken_off) in [(250u64, false), (251, true)] {
        let registry = Arc::new(Registry::new(MemoryStore::new()));
        let gate = Gate::builder(Profile::openai())
            .limits(Limits::parse("100/d", "100000/d").unwrap())
            .estimate_margin(tollgate::Margin::NONE)
            .registry(Arc::clone(&registry))
            .first_answer_wait(None)
            .model_spending_elsewhere(false)
            .build()
            .unwrap();
        let mut first = admit(&gate, &chat(300, 100)).await;
        first.sending();
        let a = first.cost().unwrap().tokens;
        tokio::time::advance(Duration::from_millis(after_ms)).await;
        let mut second = admit(&gate, &chat(200, 100)).await;
        second.sending();
        let b = second.cost().unwrap().tokens;
        // The provider counted the second call before the first: its count holds both.
        first
            .respond(StatusCode::OK, &remaining(100_000 - a - b), None)
            .await;
        let expected = 100_000 - a - b - if taken_off { b } else { 0 };
        assert_eq!(
            tokens_left(&registry).await,
            i128::from(expected),
            "second call {after_ms} ms after the first"
        );
        drop(second);
    }
}

/// Two processes of a fleet on one store, each with its own gate, whose keys' first answers
/// are slow in coming: both go without them, keeping a quarter of the window back once
/// between them (the windows are lowered to three quarters of their capacity), not a quarter
/// each. Each kept its own charge of a quarter before, and eight processes held back two
/// windows' worth.
#[tokio::test(start_paused = true)]
async fn a_fleet_going_blind_keeps_back_one_quarter_not_one_per_process() {
    let store = MemoryStore::new();
    let registries = [
        Arc::new(Registry::new(store.clone())),
        Arc::new(Registry::new(store.clone())),
    ];
    let gates = registries.each_ref().map(gate);
    // Each process's first call goes alone; its others wait for its answer.
    let mut firsts = Vec::new();
    for (i, gate) in gates.iter().enumerate() {
        firsts.push(admit(gate, &chat(10 + i, 100)).await);
    }
    let charged_first: u64 = firsts.iter().map(|c| c.cost().unwrap().tokens).sum();
    assert_eq!(
        tokens_left(&registries[0]).await,
        i128::from(100_000 - charged_first)
    );
    let seconds: Vec<_> = gates
        .iter()
        .enumerate()
        .map(|(i, gate)| {
            let (gate, body) = (gate.clone(), chat(20 + i, 100));
            tokio::spawn(async move { admit(&gate, &body).await })
        })
        .collect();
    // The first calls go out a moment later, and no answer comes within the second the
    // others wait: they go without it.
    tokio::time::sleep(Duration::from_millis(1)).await;
    for call in &mut firsts {
        call.sending();
    }
    let mut charged_second = 0;
    let mut held = Vec::new();
    for second in seconds {
        let call = second.await.unwrap();
        charged_second += call.cost().unwrap().tokens;
        held.push(call);
    }
    // 100,000 a day: the second refilled 1.16 tokens, under the lowering.
    assert_eq!(
        tokens_left(&registries[0]).await,
        i128::from(75_000 - charged_second),
        "the windows kept back more than a quarter (first calls {charged_first}, second {charged_second})"
    );
    drop((firsts, held));
}
