//! One uncontended admission in memory with two windows (a request window and a token window),
//! beside the `governor` crate in the same groups as the reference: its direct `check` (one
//! GCRA cell) against tollgate's store and `Limiter::try_acquire`, and its keyed `check_key`
//! against a registry lookup plus an admission.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate::store::Op;
use tollgate::{Attempt, Cost, Limiter, Limits, MemoryStore, Registry, Store};
use tollgate_testkit::ready;

fn limits() -> Limits {
    // Rates high enough that no admission in the run is ever refused.
    Limits::parse("1000000000/s", "1000000000000/s").unwrap()
}

fn uncontended(c: &mut Criterion) {
    let limits = limits();
    let store = MemoryStore::new();
    let key = store.bind("bench", &limits).unwrap();
    let limiter = Limiter::new("bench", limits.clone(), store.clone()).unwrap();
    let governor = RateLimiter::direct(Quota::per_second(NonZeroU32::MAX));
    let op = Op::Acquire {
        cost: Cost::call(700),
        max_wait: Some(Duration::ZERO),
        fly: false,
        share: None,
    };

    let mut group = c.benchmark_group("uncontended_admission");
    group.bench_function("governor_direct_check", |b| {
        b.iter(|| black_box(governor.check().is_ok()))
    });
    group.bench_function("tollgate_store_two_buckets", |b| {
        b.iter(|| {
            black_box(
                store
                    .apply_now(&key, black_box(op.clone()))
                    .unwrap()
                    .unwrap(),
            )
        })
    });
    group.bench_function("tollgate_limiter_try_acquire", |b| {
        b.iter(|| {
            let attempt = ready(limiter.try_acquire(Cost::call(black_box(700)))).unwrap();
            black_box(matches!(attempt, Attempt::Admitted(_)))
        })
    });
    group.finish();
}

fn keyed(c: &mut Criterion) {
    let limits = limits();
    let registry = Registry::new(MemoryStore::new());
    let keys: Vec<String> = (0..1_000).map(|i| format!("tenant-{i}")).collect();
    // The limiters are held, as a program that uses its keys holds them.
    let held: Vec<Limiter> = keys
        .iter()
        .map(|k| registry.limiter(k, &limits).unwrap())
        .collect();
    let governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX));
    for key in &keys {
        let _ = governor.check_key(key);
    }

    let mut group = c.benchmark_group("keyed_admission");
    let mut i = 0;
    group.bench_function("governor_keyed_check_key", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(governor.check_key(&keys[i]).is_ok())
        })
    });
    let mut i = 0;
    group.bench_function("tollgate_registry_lookup_and_try_acquire", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            let limiter = registry.limiter(&keys[i], &limits).unwrap();
            let attempt = ready(limiter.try_acquire(Cost::call(black_box(700)))).unwrap();
            black_box(matches!(attempt, Attempt::Admitted(_)))
        })
    });
    group.finish();
    drop(held);
}

criterion_group!(benches, uncontended, keyed);
criterion_main!(benches);
