//! One uncontended admission on the in-memory store with two buckets (a request window and a
//! token window), beside the `governor` crate's direct `check` (one GCRA cell) in the same
//! group as the reference.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate::{Attempt, Cost, Limiter, Limits, MemoryStore};

/// Polls a future that is expected to be ready at once (the memory store never waits).
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the memory store's future should be ready at once"),
    }
}

fn uncontended(c: &mut Criterion) {
    // Rates high enough that no admission in the run is ever refused.
    let limits = Limits::parse("1000000000/s", "1000000000000/s").unwrap();
    let store = MemoryStore::new();
    let limiter = Limiter::new("bench", limits.clone(), store.clone()).unwrap();
    let governor = RateLimiter::direct(Quota::per_second(NonZeroU32::MAX));

    let mut group = c.benchmark_group("uncontended_admission");
    group.bench_function("governor_direct_check", |b| {
        b.iter(|| black_box(governor.check().is_ok()))
    });
    group.bench_function("tollgate_store_two_buckets", |b| {
        b.iter(|| {
            black_box(
                store
                    .try_acquire_now(black_box("bench"), &limits, Cost::call(black_box(700)))
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

criterion_group!(benches, uncontended);
criterion_main!(benches);
