//! The macro's process-wide registry pointed at Redis once at startup. A file of its own: the
//! global store can be chosen only once per process.

use tollgate::store::redis::RedisStore;
use tollgate::{Limiter, Limits, testing};

#[tollgate::limit(
    key = "macro-on-redis",
    requests = "100/m",
    tokens = "10000/d",
    estimator = "words"
)]
async fn summarise(text: &str) -> Result<usize, tollgate::Error> {
    Ok(text.len())
}

#[tokio::test]
async fn the_global_registry_uses_the_installed_redis_store() {
    let Some(server) = tollgate_testkit::redis::RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    tollgate::install_store(store.clone()).unwrap();

    summarise("four words of text").await.unwrap();
    summarise("two more").await.unwrap();

    // The charges are in Redis, where another process would see them (10000/d refills one
    // token in 8.6 s, so none has come back yet).
    let limits = Limits::parse("100/m", "10000/d").unwrap();
    let reader = Limiter::new("macro-on-redis", limits, store.clone()).unwrap();
    let snapshot = reader.snapshot().await.unwrap();
    let whole: Vec<i128> = snapshot
        .windows()
        .iter()
        .map(|a| a.tokens.whole())
        .collect();
    assert_eq!(whole, vec![98, 10_000 - 4 - 2]);
    let (hash, _) = testing::redis_names(&store, "macro-on-redis");
    assert_eq!(hash, "{8:tollgate:macro-on-redis}");
    assert!(server.command(&["EXISTS", &hash]).contains(":1"));
}
