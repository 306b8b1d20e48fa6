//! The closed loop as it is used: answers that take seconds, counts stamped when calls arrive,
//! budgets below the provider's limits, several processes on one store, a provider that
//! exaggerates. Driven by hand on tokio's paused clock, every level exact.

use crate::{chat, parts};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tollgate::http::{Call, Gate, Profile, Reported};
use tollgate::{Currency, Error, Limits, MemoryStore, Registry};

const MODEL: &str = "openai:gpt-4o";

async fn send(gate: &Gate, body: &Value) -> Call {
    let mut call = gate
        .admit(&parts(), body.to_string().as_bytes())
        .await
        .unwrap();
    call.sending();
    call
}

fn remaining(tokens: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-remaining-tokens", tokens.into());
    headers
}

/// `remaining`, from an answer that took `took` once the call arrived (OpenAI's
/// `openai-processing-ms`): the provider counted it on arrival, with no time on the way.
fn remaining_after(tokens: u64, took: Duration) -> HeaderMap {
    let mut headers = remaining(tokens);
    headers.insert(
        "openai-processing-ms",
        u64::try_from(took.as_millis()).unwrap().into(),
    );
    headers
}

fn used(total: u64) -> Reported {
    Reported::read(
        json!({"usage": {"prompt_tokens": total, "completion_tokens": 0}})
            .to_string()
            .as_bytes(),
        false,
    )
}

fn gate_on(registry: &Arc<Registry>, limits: &str, model: bool) -> Gate {
    let (requests, tokens) = limits.split_once('|').unwrap();
    Gate::builder(Profile::openai())
        .limits(Limits::parse(requests, tokens).unwrap())
        .registry(Arc::clone(registry))
        .first_answer_wait(None)
        .model_spending_elsewhere(model)
        .timeout(Some(Duration::from_secs(5)))
        .build()
        .unwrap()
}

async fn tokens_left(registry: &Registry, limits: &str) -> i128 {
    let (requests, tokens) = limits.split_once('|').unwrap();
    let limiter = registry
        .limiter(MODEL, &Limits::parse(requests, tokens).unwrap())
        .unwrap();
    let snapshot = limiter.snapshot().await.unwrap();
    snapshot.least(Currency::Tokens).unwrap().whole()
}

/// A budget of 10,000 tokens a day, below the provider's limit, and a provider whose headers
/// say a million are left: each call used 1,000 tokens, far above its estimate. Every
/// shortfall is charged (the header lowered nothing, so it held none of them), and the eleventh
/// call waits for the budget to refill. Before: 100 calls passed, and 8,800 were shown left.
#[tokio::test(start_paused = true)]
async fn a_header_that_lowers_nothing_never_lets_a_shortfall_go_uncharged() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = "|10000/d";
    let gate = gate_on(&registry, limits, true);
    let mut admitted = 0;
    for _ in 0..100 {
        let Ok(mut call) = gate
            .admit(&parts(), chat(5, 1).to_string().as_bytes())
            .await
        else {
            break;
        };
        call.sending();
        admitted += 1;
        call.respond(StatusCode::OK, &remaining(1_000_000), None)
            .await;
        call.finish(used(1_000)).await.unwrap();
    }
    assert_eq!(admitted, 10);
    // 10 × 1,000 spent, and the refill of the five seconds the eleventh waited.
    assert_eq!(tokens_left(&registry, limits).await, 0);
}

/// The provider counts a call when it arrives, and its answer comes back 3 s later. The sync
/// compares the count with what the windows held when the call went out: the 1,000 tokens a
/// neighbour had spent by then are taken off, and nothing else: the 300 tokens refilled while
/// the answer was on its way, and the call sent meanwhile, are the same on both sides.
#[tokio::test(start_paused = true)]
async fn a_late_answer_takes_off_what_was_spent_elsewhere_and_keeps_the_refill_since() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = "|6000/m";
    let gate = gate_on(&registry, limits, false);
    let (a, b) = (chat(300, 1), chat(200, 1));
    let mut call_a = send(&gate, &a).await;
    let cost_a = call_a.cost().unwrap().tokens;
    // What the provider said on a's arrival: full, less the neighbour's 1,000 and a.
    let counted = 6_000 - 1_000 - cost_a;
    tokio::time::advance(Duration::from_millis(500)).await;
    let call_b = send(&gate, &b).await;
    let cost_b = call_b.cost().unwrap().tokens;
    tokio::time::advance(Duration::from_millis(2_500)).await;
    call_a
        .respond(
            StatusCode::OK,
            &remaining_after(counted, Duration::from_secs(3)),
            None,
        )
        .await;
    // 100 tokens a second for 3 s.
    assert_eq!(
        tokens_left(&registry, limits).await,
        i128::from(6_000 - cost_a - cost_b + 300 - 1_000)
    );
    // A count no lower than what was already corrected takes off nothing more.
    let mut call_c = send(&gate, &chat(10, 1)).await;
    let cost_c = call_c.cost().unwrap().tokens;
    let before = tokens_left(&registry, limits).await;
    call_c
        .respond(
            StatusCode::OK,
            &remaining(before as u64 + 50), // the provider refilled a little more
            None,
        )
        .await;
    assert_eq!(tokens_left(&registry, limits).await, before);
    let _ = (cost_c, call_b);
}

/// Two processes on one store (two gates, two registries, one memory store): a sync in one
/// reads the other's calls in flight from the store's ledger. A neighbour's 800 tokens are
/// taken off once, exactly, although the other process's call went out while the answer was on
/// its way.
#[tokio::test(start_paused = true)]
async fn a_fleet_shares_its_calls_in_flight_and_its_corrections() {
    let store = MemoryStore::new();
    let (first, second) = (
        Arc::new(Registry::new(store.clone())),
        Arc::new(Registry::new(store.clone())),
    );
    let limits = "|6000/m";
    let (gate_1, gate_2) = (
        gate_on(&first, limits, false),
        gate_on(&second, limits, false),
    );
    let mut call_1 = send(&gate_1, &chat(300, 1)).await;
    let cost_1 = call_1.cost().unwrap().tokens;
    tokio::time::advance(Duration::from_millis(400)).await;
    let mut call_2 = send(&gate_2, &chat(250, 1)).await;
    let cost_2 = call_2.cost().unwrap().tokens;
    tokio::time::advance(Duration::from_millis(600)).await;
    // Process 1's answer: the neighbour had spent 800 when call 1 arrived.
    call_1
        .respond(
            StatusCode::OK,
            &remaining_after(6_000 - 800 - cost_1, Duration::from_secs(1)),
            None,
        )
        .await;
    let after_first = tokens_left(&first, limits).await;
    assert_eq!(after_first, i128::from(6_000 - cost_1 - cost_2 + 100 - 800));
    // Process 2's answer a moment later says the same of its own arrival: the 800 were
    // corrected already, in the store, by the other process.
    call_2
        .respond(
            StatusCode::OK,
            &remaining_after(
                6_000 - 800 - cost_1 - cost_2 + 40,
                Duration::from_millis(600),
            ),
            None,
        )
        .await;
    assert_eq!(tokens_left(&second, limits).await, after_first);
}

/// A provider answering honestly after 2 to 4 s, with no neighbour: over two minutes of calls
/// the windows show the provider's count to the token after every answer, the model of
/// spending elsewhere stays at zero, and no margin is held (no sync takes anything off).
#[tokio::test(start_paused = true)]
async fn with_an_honest_provider_and_no_neighbour_the_windows_do_not_drift() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    // This thread's recorder: the test runs on one thread, on tokio's paused clock.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = "|20000/m";
    let gate = gate_on(&registry, limits, true);
    // The provider's own window, in tokens × 60 s (exact), refilled 20,000 a minute.
    let mut provider: i128 = 20_000 * 60;
    let mut last = tokio::time::Instant::now();
    let refill = |provider: &mut i128, last: &mut tokio::time::Instant| {
        let now = tokio::time::Instant::now();
        let ms = now.duration_since(*last).as_millis() as i128;
        *provider = (*provider + ms * 20).min(20_000 * 60);
        *last = now;
    };
    // Calls in flight: the call, what the provider counted when it arrived, when it went out
    // (and arrived), and when its answer comes.
    type Out = (Call, u64, u64, tokio::time::Instant, tokio::time::Instant);
    let mut out: Vec<Out> = Vec::new();
    let mut answers = 0;
    for i in 0..400u64 {
        let body = chat(50 + (i * 37 % 400) as usize, 1);
        let mut call = gate
            .admit(&parts(), body.to_string().as_bytes())
            .await
            .unwrap();
        call.sending();
        let cost = call.cost().unwrap().tokens;
        refill(&mut provider, &mut last);
        provider -= i128::from(cost) * 60;
        assert!(provider >= 0, "the provider refused call {i}");
        let counted = (provider / 60) as u64;
        let took = Duration::from_millis(2_000 + i * 131 % 2_000);
        let sent = tokio::time::Instant::now();
        out.push((call, cost, counted, sent, sent + took));
        // Answer every call whose time has come, in the order their answers come back.
        tokio::time::advance(Duration::from_millis(150)).await;
        out.sort_by_key(|(_, _, _, _, at)| *at);
        while out
            .first()
            .is_some_and(|(_, _, _, _, at)| *at <= tokio::time::Instant::now())
        {
            let (mut call, cost, counted, sent, _) = out.remove(0);
            // It arrived (and was counted) when it was sent: the whole round trip was the
            // provider's work on it.
            let took = tokio::time::Instant::now() - sent;
            call.respond(StatusCode::OK, &remaining_after(counted, took), None)
                .await;
            call.finish(used(cost)).await.unwrap();
            refill(&mut provider, &mut last);
            let ours = tokens_left(&registry, limits).await;
            let theirs = provider / 60;
            assert_eq!(ours, theirs, "after answer {answers}");
            answers += 1;
        }
    }
    assert!(answers > 300, "{answers} answers");
    let mut seen = std::collections::HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let value = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(_) => continue,
        };
        seen.insert(key.key().name().to_owned(), value);
    }
    // Nothing was taken off for spending elsewhere or a margin, and the model's rate is 0.
    assert_eq!(
        seen.get("tollgate_tokens_lowered_total"),
        Some(&0.0),
        "{seen:?}"
    );
    assert_eq!(
        seen.get("tollgate_elsewhere_tokens_per_second"),
        Some(&0.0),
        "{seen:?}"
    );
}

/// A waiter whose turn is 50 s away under a per-minute budget, with calls out whose estimates
/// hold most of it: refunds may come, so it is not refused at once although its deadline is
/// 5 s; the refunds come at 2 s, and it passes then.
#[tokio::test(start_paused = true)]
async fn a_wait_that_refunds_still_to_come_may_shorten_is_not_refused_early() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = "|1200/m";
    let gate = gate_on(&registry, limits, false);
    // Two calls reserve 500 output tokens each (and use 10).
    let mut big = Vec::new();
    for _ in 0..2 {
        big.push(send(&gate, &chat(20, 500)).await);
    }
    let start = tokio::time::Instant::now();
    let waiter = {
        let gate = gate.clone();
        tokio::spawn(async move { send(&gate, &chat(300, 200)).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiter.is_finished());
    for call in big {
        let estimate = call.cost().unwrap().tokens;
        call.finish(used(estimate - 490)).await.unwrap();
    }
    let call = waiter.await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(call.cost().unwrap().tokens > 400);
}

/// Without refunds to come, the same wait is refused at once with the time it would need.
#[tokio::test(start_paused = true)]
async fn a_wait_past_the_deadline_with_nothing_to_come_is_refused_at_once() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = "|1200/m";
    let gate = gate_on(&registry, limits, false);
    let call = send(&gate, &chat(20, 1_000)).await;
    call.finish(used(1_023)).await.unwrap();
    let start = tokio::time::Instant::now();
    match gate
        .admit(&parts(), chat(300, 200).to_string().as_bytes())
        .await
    {
        Err(Error::Timeout { waited, needed, .. }) => {
            assert_eq!(waited, Duration::ZERO);
            assert!(needed.unwrap() > Duration::from_secs(5), "{needed:?}");
        }
        other => panic!("expected a timeout at once, got {other:?}"),
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// The gate's deadline is its own setting: 0.5 s here, where the limiter's default is 60 s
/// (the first call is still out and may give tokens back, so the second waits for its whole
/// deadline before it fails).
#[tokio::test(start_paused = true)]
async fn the_gates_deadline_is_a_builder_setting() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let gate = Gate::builder(Profile::openai())
        .limits(Limits::parse("1/m", "").unwrap())
        .registry(registry)
        .first_answer_wait(None)
        .timeout(Some(Duration::from_millis(500)))
        .build()
        .unwrap();
    assert_eq!(gate.timeout(), Some(Duration::from_millis(500)));
    let _first = send(&gate, &chat(1, 1)).await;
    let start = tokio::time::Instant::now();
    let second = gate
        .admit(&parts(), chat(1, 1).to_string().as_bytes())
        .await;
    assert!(matches!(second, Err(Error::Timeout { .. })), "{second:?}");
    assert_eq!(start.elapsed(), Duration::from_millis(500));
}

/// Refill is credited from when the provider counted a call, not from when it went out: a
/// call into a full window, answered 2 s later after 1.8 s of the provider's own work
/// (`openai-processing-ms`), reached it 100 ms after it went out (half the 0.2 s left of the
/// round trip). The key's window started refilling when the call went out, the provider's
/// when it counted it: those 100 ms of refill (10 tokens) are the key's alone, taken off once,
/// and the count (exactly the call, on a full window) finds nothing else spent. Both windows
/// then hold the same: 190 tokens of refill since the call. Before, the key kept the 10
/// tokens, and a count read against the send time found them spent elsewhere instead.
#[tokio::test(start_paused = true)]
async fn refill_is_credited_from_when_the_provider_counted_the_call() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = "|6000/m";
    let gate = gate_on(&registry, limits, false);
    let mut call = send(&gate, &chat(300, 1)).await;
    let cost = call.cost().unwrap().tokens;
    tokio::time::advance(Duration::from_secs(2)).await;
    call.respond(
        StatusCode::OK,
        &remaining_after(6_000 - cost, Duration::from_millis(1_800)),
        None,
    )
    .await;
    assert_eq!(
        tokens_left(&registry, limits).await,
        i128::from(6_000 - cost + 190)
    );
    // Taken off once: the settlement gives nothing more back, nor takes it again.
    call.finish(used(cost)).await.unwrap();
    assert_eq!(
        tokens_left(&registry, limits).await,
        i128::from(6_000 - cost + 190)
    );
}

/// Without a sync (the macro, a gate whose answers carry no counts), a call that found its
/// window full gives the same refill back when it settles: here half the time from its
/// admission to its settlement (1 s of 2 s: 100 tokens).
#[tokio::test(start_paused = true)]
async fn without_a_sync_the_settlement_credits_from_half_the_round_trip() {
    let registry = Arc::new(Registry::new(MemoryStore::new()));
    let limits = "|6000/m";
    let gate = gate_on(&registry, limits, false);
    let mut call = send(&gate, &chat(300, 1)).await;
    let cost = call.cost().unwrap().tokens;
    tokio::time::advance(Duration::from_secs(2)).await;
    call.respond(StatusCode::OK, &HeaderMap::new(), None).await;
    call.finish(used(cost)).await.unwrap();
    assert_eq!(
        tokens_left(&registry, limits).await,
        i128::from(6_000 - cost + 200 - 100)
    );
}
