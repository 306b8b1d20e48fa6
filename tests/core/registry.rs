//! Shared keys: one limiter per key in a process, conflicts refused, idle keys dropped.

use std::time::Duration;

use tollgate::{Cost, Error, Limits, MemoryStore, Registry};

#[tokio::test(start_paused = true)]
async fn tasks_sharing_a_key_share_the_buckets() {
    let registry = Registry::new(MemoryStore::new());
    let limits = Limits::parse("10/m", "").unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let limiter = registry.limiter("shared", &limits).unwrap();
            tokio::spawn(async move {
                for _ in 0..2 {
                    limiter.acquire(Cost::call(0)).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let limiter = registry.limiter("shared", &limits).unwrap();
    assert_eq!(
        limiter.snapshot().await.unwrap().windows()[0]
            .tokens
            .whole(),
        2
    );
    // Another key is untouched.
    let other = registry.limiter("other", &limits).unwrap();
    assert_eq!(
        other.snapshot().await.unwrap().windows()[0].tokens.whole(),
        10
    );
}

#[test]
fn same_key_with_different_limits_is_an_error_naming_both() {
    let registry = Registry::new(MemoryStore::new());
    let first = Limits::parse("500/m", "200000/m").unwrap();
    let _held = registry.limiter("openai", &first).unwrap();
    let second = Limits::parse("500/m", "100000/m").unwrap();
    let err = registry.limiter("openai", &second).unwrap_err();
    assert!(matches!(err, Error::ConflictingLimits { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "key `openai` is already limited by requests 500/m, tokens 200000/m, and was now asked for with requests 500/m, tokens 100000/m; use one set of limits per key, or another key"
    );
}

#[test]
fn the_store_refuses_conflicting_limits_too() {
    // Two limiters made by hand on one store, bypassing the registry.
    let store = MemoryStore::new();
    let a = Limits::parse("5/s", "").unwrap();
    let b = Limits::parse("6/s", "").unwrap();
    tollgate_testkit::stores::try_now(&store, "k", &a, Cost::call(0)).unwrap();
    let err = tollgate_testkit::stores::try_now(&store, "k", &b, Cost::call(0)).unwrap_err();
    assert!(matches!(err, Error::ConflictingLimits { .. }), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn a_million_distinct_keys_stay_bounded_in_memory() {
    let store = MemoryStore::new();
    let registry = Registry::new(store.clone());
    let limits = Limits::parse("1/s", "").unwrap();
    let mut peak_registry = 0;
    let mut peak_store = 0;
    for i in 0..1_000_000u32 {
        let limiter = registry.limiter(&format!("tenant-{i}"), &limits).unwrap();
        assert!(
            limiter
                .try_acquire(Cost::call(0))
                .await
                .unwrap()
                .is_admitted()
        );
        drop(limiter);
        if i % 1000 == 999 {
            // A thousand new keys a second; each key's bucket is full again a second later.
            tokio::time::advance(Duration::from_secs(1)).await;
            peak_registry = peak_registry.max(registry.len());
            peak_store = peak_store.max(store.len());
        }
    }
    assert!(
        peak_registry <= 8_192,
        "registry peaked at {peak_registry} keys"
    );
    assert!(
        peak_store <= 16 * 2 * 1024,
        "store peaked at {peak_store} keys"
    );
    // A key that was dropped comes back fresh: full.
    let again = registry.limiter("tenant-0", &limits).unwrap();
    assert_eq!(
        again.snapshot().await.unwrap().windows()[0].tokens.whole(),
        1
    );
}
