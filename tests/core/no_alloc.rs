//! The admission path allocates nothing per call once a key exists: with metrics off and no
//! tracing subscriber, and with a recorder and a subscriber at info level as a service runs
//! them. The count is this thread's own (see `main.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use tollgate::{Cost, Limiter, Limits, MemoryStore, Registry};
use tollgate_testkit::ready;

use crate::allocations;

#[test]
fn admissions_allocate_nothing_per_call() {
    let limits = Limits::parse("1000000/s", "1000000000/s").unwrap();
    let limiter = Limiter::new("hot", limits.clone(), MemoryStore::new()).unwrap();
    let registry = Registry::new(MemoryStore::new());
    let shared = registry.limiter("hot", &limits).unwrap();
    let admit_on_both = || {
        let call = Cost::call(10);
        assert!(ready(limiter.try_acquire(call)).unwrap().is_admitted());
        ready(limiter.acquire(call)).unwrap();
        assert!(ready(shared.try_acquire(call)).unwrap().is_admitted());
        ready(shared.acquire(call)).unwrap();
    };
    // The first calls create the key's state and register the metric handles.
    admit_on_both();
    let before = allocations();
    for _ in 0..1_000 {
        admit_on_both();
    }
    let after = allocations();
    assert_eq!(
        after - before,
        0,
        "{} allocations in 4,000 admissions",
        after - before
    );
}

/// A subscriber as a service runs one: info and above are recorded (nothing the admission path
/// says at that level), debug spans are off.
struct AtInfo;

impl tracing::Subscriber for AtInfo {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::INFO
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::INFO)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A recorder as an exporter keeps one: each handle registered once, updated in place. (The
/// debugging recorder keeps every histogram sample in a growing list, which allocates on its
/// own account.)
#[derive(Default)]
struct InPlace {
    counters: std::sync::Mutex<Vec<(String, Arc<AtomicU64>)>>,
}

/// A histogram that keeps a count and nothing else.
struct Tally(AtomicU64);

impl metrics::HistogramFn for Tally {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl metrics::Recorder for InPlace {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let handle = Arc::new(AtomicU64::new(0));
        self.counters
            .lock()
            .unwrap()
            .push((key.name().to_owned(), Arc::clone(&handle)));
        Counter::from_arc(handle)
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(AtomicU64::new(0)))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Tally(AtomicU64::new(0))))
    }
}

#[test]
fn admissions_allocate_nothing_with_metrics_and_a_subscriber() {
    let recorder = InPlace::default();
    let _logging = tracing::subscriber::set_default(AtInfo);
    metrics::with_local_recorder(&recorder, || {
        let limits = Limits::parse("1000000/s", "1000000000/s").unwrap();
        let registry = Registry::new(MemoryStore::new());
        let shared = registry.limiter("hot-metered", &limits).unwrap();
        let admit = || {
            let call = Cost::call(10);
            assert!(ready(shared.try_acquire(call)).unwrap().is_admitted());
            ready(shared.acquire(call)).unwrap();
        };
        // The first calls register the metric handles.
        admit();
        let before = allocations();
        for _ in 0..1_000 {
            admit();
        }
        let after = allocations();
        assert_eq!(
            after - before,
            0,
            "{} allocations in 2,000 admissions",
            after - before
        );
    });
    // The recorder was in use: every admission was counted.
    let admitted: u64 = recorder
        .counters
        .lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| name == "tollgate_calls_admitted_total")
        .map(|(_, n)| n.load(Ordering::Relaxed))
        .sum();
    assert_eq!(admitted, 2_002);
}
