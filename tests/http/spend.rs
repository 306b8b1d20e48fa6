//! Spend budgets through the gate: a call pays its price at most when admitted (its input and
//! reserved output at its model's prices), and what its usage is billed when it settles
//! (cached input at the cached price); a model without a price can't spend from a budget.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde_json::json;
use tollgate::http::models::{Model, Price};
use tollgate::http::{Gate, Profile, Reported};
use tollgate::{Currency, Error, Limits, MemoryStore, Rates, Registry};

use crate::parts;

const LIMITS: &str = "10000000/30d";

fn gate(registry: &Arc<Registry>, budget: &str, profile: Profile) -> Gate {
    Gate::builder(profile)
        .limits(Limits::parse("1000/d", LIMITS).unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .spend(Rates::parse_money(budget).unwrap())
        .registry(Arc::clone(registry))
        .first_answer_wait(None)
        .timeout(Some(Duration::from_millis(100)))
        .build()
        .unwrap()
}

async fn spend_left(registry: &Registry, key: &str, budget: &str) -> i128 {
    let limits = Limits::parse("1000/d", LIMITS)
        .unwrap()
        .with_spend(Rates::parse_money(budget).unwrap());
    let limiter = registry.limiter(key, &limits).unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    snapshot.least(Currency::Spend).unwrap().whole()
}

fn body(model: &str, max_tokens: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "one two three four five"}],
    }))
    .unwrap()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_reserves_its_price_at_most_and_settles_what_its_usage_is_billed() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry, "$1/d", Profile::openai());
    let body = body("gpt-4o-2024-08-06", 1_000);
    let mut call = gate.admit(&parts(), &body).await.unwrap();
    assert_eq!(call.key(), "openai:gpt-4o-2024-08-06");
    let input = call.input_tokens();
    // gpt-4o: $2.50 in, $10 out a million; 1,000 output tokens reserved.
    let reserved = (input * 2_500_000 + 1_000 * 10_000_000).div_ceil(1_000_000);
    assert_eq!(call.cost().unwrap().spend, reserved);
    assert_eq!(
        spend_left(&registry, call.key(), "$1/d").await,
        1_000_000 - i128::from(reserved)
    );
    call.sending();
    call.respond(StatusCode::OK, &HeaderMap::new(), None).await;
    // Billed: 3,000 prompt tokens, 2,048 of them from the cache at $1.25, and 200 out.
    let reported = Reported::read(
        br#"{"usage":{"prompt_tokens":3000,"completion_tokens":200,"total_tokens":3200,
            "prompt_tokens_details":{"cached_tokens":2048}}}"#,
        false,
    );
    let key = call.key().to_owned();
    let usage = call.finish(reported).await.unwrap();
    let billed = (952 * 2_500_000 + 2_048 * 1_250_000 + 200 * 10_000_000u64).div_ceil(1_000_000);
    assert_eq!(billed, 6_940);
    assert_eq!(usage.spend, Some(billed));
    assert_eq!(
        spend_left(&registry, &key, "$1/d").await,
        1_000_000 - i128::from(billed)
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_spent_budget_holds_calls_until_it_refills_and_a_call_dearer_than_it_never_passes() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    // $0.05 a day; each call reserves 2,000 output tokens of gpt-4o: $0.02 and its input.
    let gate = gate(&registry, "$0.05/d", Profile::openai());
    let body = body("gpt-4o", 2_000);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(gate.admit(&parts(), &body).await.unwrap());
    }
    let third = gate.admit(&parts(), &body).await.unwrap_err();
    assert!(matches!(third, Error::Timeout { .. }), "{third}");
    // Five thousand output tokens, $0.05 and more, can never pass a $0.05 budget.
    let dear = gate.admit(&parts(), &self::body("gpt-4o", 5_000)).await;
    assert!(
        matches!(
            dear,
            Err(Error::CostExceedsCapacity {
                currency: Currency::Spend,
                ..
            })
        ),
        "{dear:?}"
    );
    // The held calls settle at a tenth of their reservation: the third passes.
    for mut call in held {
        call.sending();
        call.respond(StatusCode::OK, &HeaderMap::new(), None).await;
        let reported = Reported::read(
            br#"{"usage":{"prompt_tokens":20,"completion_tokens":200}}"#,
            false,
        );
        call.finish(reported).await.unwrap();
    }
    gate.admit(&parts(), &body).await.unwrap();
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_model_without_a_price_cannot_spend_from_a_budget_until_it_is_given_one() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry, "$1/d", Profile::openai());
    let err = gate
        .admit(&parts(), &body("my-finetune", 10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unpriced { .. }), "{err}");
    assert!(
        err.to_string().contains("`my-finetune` has no price"),
        "{err}"
    );
    // Without a budget, the same call passes.
    let plain = Gate::builder(Profile::openai())
        .limits(Limits::parse("1000/d", LIMITS).unwrap())
        .estimate_margin(tollgate::Margin::NONE)
        .registry(Arc::new(Registry::new(MemoryStore::new())))
        .first_answer_wait(None)
        .build()
        .unwrap();
    plain
        .admit(&parts(), &body("my-finetune", 10))
        .await
        .unwrap();
    // Given a price, it pays it.
    let mut models = tollgate::http::models::openai();
    models.push(Model::new(
        "my-finetune",
        4_096,
        Some(Price::dollars(3.0, 1.5, 12.0)),
    ));
    let priced = gate_with(&registry, Profile::openai().models(models));
    let call = priced
        .admit(&parts(), &body("my-finetune", 10))
        .await
        .unwrap();
    let input = call.input_tokens();
    assert_eq!(
        call.cost().unwrap().spend,
        (input * 3_000_000 + 10 * 12_000_000).div_ceil(1_000_000)
    );
}

/// A family member with a name of its own is another model, at another price: `o3-pro` is
/// not billed as `o3`, nor `gpt-5-pro` as `gpt-5` (a reviewer spent 10 to 13 times a budget
/// that way); a name the table doesn't price (`o3-deep-research`) can't spend from a budget. A dated snapshot is
/// billed at its model's price, and a snapshot priced apart (`gpt-4o-2024-05-13`) at its own.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_family_member_is_billed_at_its_own_price_or_not_at_all() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry, "$100/d", Profile::openai());
    for unpriced in [
        "gpt-5-pro-x",
        "o3-deep-research",
        "gpt-4-32k",
        "gpt-4o-audio-preview",
    ] {
        let err = gate.admit(&parts(), &body(unpriced, 10)).await.unwrap_err();
        assert!(matches!(err, Error::Unpriced { .. }), "{unpriced}: {err}");
    }
    for (model, input, output) in [
        ("o3-pro", 20_000_000, 80_000_000),
        ("gpt-5-pro", 15_000_000, 120_000_000),
        ("o3", 2_000_000, 8_000_000),
        ("gpt-4o-2024-05-13", 5_000_000, 15_000_000),
        ("gpt-4o-2024-11-20", 2_500_000, 10_000_000),
    ] {
        let call = gate.admit(&parts(), &body(model, 10)).await.unwrap();
        let tokens = call.input_tokens();
        assert_eq!(
            call.cost().unwrap().spend,
            (tokens * input + 10 * output).div_ceil(1_000_000),
            "{model}"
        );
    }
}

/// A call that names no max_tokens reserves its model's most output at its price, whatever
/// the budget holds: under a budget smaller than that it is refused as too large (it had been
/// cut to the budget's size, and one call that wrote 16,000 tokens spent sixteen days of
/// `$0.01/d`).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_without_max_tokens_reserves_its_models_most_output_from_a_budget() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let without = serde_json::to_vec(&json!({
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "one two three four five"}],
    }))
    .unwrap();
    let small = gate(&registry, "$0.01/d", Profile::openai());
    let err = small.admit(&parts(), &without).await.unwrap_err();
    assert!(matches!(err, Error::CostExceedsCapacity { .. }), "{err}");
    let large = gate(
        &Arc::new(Registry::new(MemoryStore::new())),
        "$1/d",
        Profile::openai(),
    );
    let call = large.admit(&parts(), &without).await.unwrap();
    let input = call.input_tokens();
    assert_eq!(
        call.cost().unwrap().spend,
        (input * 2_500_000 + 16_384 * 10_000_000).div_ceil(1_000_000)
    );
}

/// A provider bills nothing for an error answer: a 500 or a 400 without usage gives every
/// cent of the call's reservation back to the budget (a failing upstream had spent a tenant's
/// budget a reservation per retry). An input count that can't be read (`1e30`, `null`) is the
/// estimate, not nothing (it had settled the input at 0).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_error_answer_spends_nothing_and_unreadable_input_is_the_estimate() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = gate(&registry, "$1/d", Profile::openai());
    for status in [StatusCode::INTERNAL_SERVER_ERROR, StatusCode::BAD_REQUEST] {
        let mut call = gate.admit(&parts(), &body("gpt-4o", 1_000)).await.unwrap();
        let key = call.key().to_owned();
        call.sending();
        call.respond(status, &HeaderMap::new(), Some(br#"{"error":{}}"#))
            .await;
        let usage = call
            .finish(Reported::read(br#"{"error":{}}"#, false))
            .await
            .unwrap();
        assert_eq!(usage.spend, Some(0), "{status}");
        assert_eq!(
            spend_left(&registry, &key, "$1/d").await,
            1_000_000,
            "{status}"
        );
    }
    for usage in [
        r#"{"usage":{"prompt_tokens":1e30,"completion_tokens":10}}"#,
        r#"{"usage":{"prompt_tokens":null,"completion_tokens":10}}"#,
        r#"{"usage":{"completion_tokens":10}}"#,
    ] {
        let mut call = gate.admit(&parts(), &body("gpt-4o", 10)).await.unwrap();
        let input = call.input_tokens();
        call.sending();
        call.respond(StatusCode::OK, &HeaderMap::new(), None).await;
        let settled = call
            .finish(Reported::read(usage.as_bytes(), false))
            .await
            .unwrap();
        assert_eq!(
            settled.spend,
            Some((input * 2_500_000 + 10 * 10_000_000).div_ceil(1_000_000)),
            "{usage}"
        );
    }
}

/// A budget is charged what the provider bills, as reported, past the bounds the windows cut
/// impossible usage to: a model that writes more than its entry says it can (here 16,000
/// tokens against a `max_output` of 100), or input the provider held for the call, costs its
/// bill (it had been charged at the bound, 1/435 of the bill).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_budget_is_charged_the_whole_bill_past_the_windows_bounds() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let mut models = tollgate::http::models::openai();
    models.push(Model::new(
        "small-writer",
        100,
        Some(Price::dollars(2.5, 1.25, 10.0)),
    ));
    let gate = gate_with(&registry, Profile::openai().models(models));
    let without = serde_json::to_vec(&json!({
        "model": "small-writer",
        "messages": [{"role": "user", "content": "one two three four five"}],
    }))
    .unwrap();
    let mut call = gate.admit(&parts(), &without).await.unwrap();
    call.sending();
    call.respond(StatusCode::OK, &HeaderMap::new(), None).await;
    let usage = call
        .finish(Reported::read(
            br#"{"usage":{"prompt_tokens":100000,"completion_tokens":16000}}"#,
            false,
        ))
        .await
        .unwrap();
    assert_eq!(
        usage.spend,
        Some((100_000 * 2_500_000 + 16_000 * 10_000_000u64).div_ceil(1_000_000))
    );
}

fn gate_with(registry: &Arc<Registry>, profile: Profile) -> Gate {
    gate(registry, "$1/d", profile)
}

#[test]
fn anthropic_cache_reads_and_writes_are_billed_at_their_own_prices() {
    let sonnet = Price::dollars(3.0, 0.30, 15.0);
    let reported = Reported::read(
        br#"{"type":"message","usage":{"input_tokens":100,"cache_creation_input_tokens":1000,
            "cache_read_input_tokens":4000,"output_tokens":50}}"#,
        false,
    );
    // 100 at $3, 1,000 written at $3.75, 4,000 read at $0.30, 50 out at $15.
    assert_eq!(sonnet.billed(&reported), 300 + 3_750 + 1_200 + 750);
    // A total alone is priced at the dearer rate.
    let total = Reported::read(br#"{"usage":{"total_tokens":1000}}"#, false);
    assert_eq!(sonnet.billed(&total), 15_000);
    // Rounded up to the micro-dollar, never down.
    let one = Reported::read(
        br#"{"usage":{"prompt_tokens":1,"completion_tokens":0}}"#,
        false,
    );
    assert_eq!(Price::dollars(0.15, 0.075, 0.6).billed(&one), 1);
}
