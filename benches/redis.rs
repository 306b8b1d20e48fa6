//! One acquire round trip against a local Redis, beside a plain `PING` round trip in the same
//! group, and the throughput of acquires with 1 and 50 concurrent tasks.
//!
//! Uses `TOLLGATE_BENCH_REDIS` (a URL) when set; otherwise starts a redis-server of its own on
//! a free loopback port.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redis_server::RedisServer;
use tollgate::store::redis::RedisStore;
use tollgate::store::{Op, Outcome};
use tollgate::{Cost, Limits, Store};

/// An admission that never waits.
const TRY: Op = Op::Acquire {
    cost: Cost::call(700),
    max_wait: Some(Duration::ZERO),
};

/// The server to measure: `TOLLGATE_BENCH_REDIS`, or one started for the run.
fn server() -> (Option<RedisServer>, String) {
    if let Ok(url) = std::env::var("TOLLGATE_BENCH_REDIS") {
        return (None, url);
    }
    let server =
        RedisServer::start().expect("redis-server is installed (or set TOLLGATE_BENCH_REDIS)");
    let url = server.url();
    (Some(server), url)
}

fn round_trips(c: &mut Criterion) {
    let (_server, url) = server();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = runtime.block_on(async {
        for _ in 0..200 {
            if let Ok(store) = RedisStore::connect(&url).await {
                return store;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("redis at {url} did not answer");
    });
    let client = redis::Client::open(url.as_str()).unwrap();
    let ping_connection = runtime
        .block_on(client.get_multiplexed_async_connection())
        .unwrap();
    // Never refused: the bench measures the round trip, not waiting.
    let limits = Limits::parse("1000000000/s", "1000000000/s").unwrap();
    let key = Arc::new(store.bind("bench", &limits).unwrap());

    let mut group = c.benchmark_group("redis_round_trip");
    group.bench_function("ping", |b| {
        b.iter_custom(|iters| {
            let mut connection = ping_connection.clone();
            runtime.block_on(async move {
                let start = Instant::now();
                for _ in 0..iters {
                    let _: String = redis::cmd("PING")
                        .query_async(&mut connection)
                        .await
                        .unwrap();
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("acquire_two_buckets", |b| {
        b.iter_custom(|iters| {
            let (store, key) = (store.clone(), Arc::clone(&key));
            runtime.block_on(async move {
                let start = Instant::now();
                for _ in 0..iters {
                    let outcome = store.apply(&key, TRY).await.unwrap();
                    assert_eq!(outcome, Outcome::Admitted);
                }
                start.elapsed()
            })
        })
    });
    group.finish();

    let mut group = c.benchmark_group("redis_acquire_throughput");
    group.throughput(Throughput::Elements(1));
    for tasks in [1u64, 50] {
        group.bench_function(format!("{tasks}_tasks"), |b| {
            b.iter_custom(|iters| {
                let (store, key) = (store.clone(), Arc::clone(&key));
                runtime.block_on(async move {
                    let per_task = iters.div_ceil(tasks);
                    let start = Instant::now();
                    let handles: Vec<_> = (0..tasks)
                        .map(|_| {
                            let (store, key) = (store.clone(), Arc::clone(&key));
                            tokio::spawn(async move {
                                for _ in 0..per_task {
                                    store.apply(&key, TRY).await.unwrap();
                                }
                            })
                        })
                        .collect();
                    for handle in handles {
                        handle.await.unwrap();
                    }
                    // Time per acquire, as if exactly `iters` were made.
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (per_task * tasks) as f64)
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, round_trips);
criterion_main!(benches);
