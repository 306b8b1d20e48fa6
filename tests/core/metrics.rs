//! Metrics through the `metrics` facade, per key. The recorder is
//! this thread's own (`metrics::with_local_recorder`), so the rest of the binary runs beside it.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tollgate::{Cost, Limiter, Limits};

#[test]
fn admissions_tokens_waits_timeouts_penalties_and_settlements_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(calls()));
    check(&snapshotter);
}

/// Three admissions (one waits half a second), a settlement, a timeout and a penalty.
async fn calls() {
    let limiter = Limiter::builder("metered", Limits::parse("2/s", "1000/m").unwrap())
        .build()
        .unwrap();
    limiter.acquire(Cost::call(100)).await.unwrap();
    let permit = limiter.acquire(Cost::call(200)).await.unwrap();
    permit.settle(150).await.unwrap();
    // The third call waits 0.5 s for a request.
    limiter.acquire(Cost::call(50)).await.unwrap();
    // One that can't make its deadline.
    assert!(
        limiter
            .acquire_timeout(Cost::call(900), Some(Duration::from_secs(1)))
            .await
            .is_err()
    );
    limiter.penalize(Duration::from_secs(1)).await.unwrap();
}

fn check(snapshotter: &metrics_util::debugging::Snapshotter) {
    let mut counters = std::collections::HashMap::new();
    let mut waits = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<_> = key
            .key()
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        assert_eq!(labels[0], ("key".to_owned(), "metered".to_owned()));
        let name = match labels.get(1) {
            Some((label, kind)) => format!("{}{{{label}={kind}}}", key.key().name()),
            None => key.key().name().to_owned(),
        };
        match value {
            DebugValue::Counter(n) => {
                counters.insert(name, n);
            }
            DebugValue::Histogram(values) => {
                waits = values.into_iter().map(|v| v.into_inner()).collect()
            }
            DebugValue::Gauge(_) => {}
        }
    }
    let count = |name: &str| counters.get(name).copied().unwrap_or(0);
    assert_eq!(count("tollgate_calls_admitted_total"), 3);
    assert_eq!(count("tollgate_tokens_charged_total"), 350);
    assert_eq!(count("tollgate_timeouts_total"), 1);
    assert_eq!(count("tollgate_penalties_total"), 1);
    assert_eq!(count("tollgate_settlements_total"), 1);
    // The settlement gave back 50 of the 200 tokens charged.
    assert_eq!(count("tollgate_tokens_refunded_total"), 50);
    assert_eq!(count("tollgate_tokens_settled_total"), 0);
    // No provider here: no sync, no 429 counted (a penalty by hand is not one).
    assert_eq!(count("tollgate_tokens_lowered_total"), 0);
    assert_eq!(count("tollgate_provider_429s_total{kind=transient}"), 0);
    assert_eq!(waits.len(), 3);
    assert_eq!(waits.iter().filter(|w| **w > 0.0).count(), 1);
    assert!(
        (0.5..0.51).contains(&waits.iter().copied().fold(0.0, f64::max)),
        "{waits:?}"
    );
}
