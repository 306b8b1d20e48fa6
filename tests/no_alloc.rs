//! The admission path allocates nothing per call once a key exists (metrics off, no tracing
//! subscriber). One test in the file: the allocation count is process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use tollgate::{Cost, Limiter, Limits, MemoryStore, Registry};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Polls a future that must be ready at once (the memory store never waits).
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("expected a ready future"),
    }
}

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
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..1_000 {
        admit_on_both();
    }
    let after = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(
        after - before,
        0,
        "{} allocations in 4,000 admissions",
        after - before
    );
}
