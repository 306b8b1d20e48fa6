//! The admission path allocates nothing per call once a key exists (metrics off, no tracing
//! subscriber). The count is this thread's own (see `main.rs`).

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
