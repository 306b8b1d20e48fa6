//! One acquire round trip against a local Redis, beside a plain `PING` round trip in the same
//! group, and the throughput of acquires with 1 and 50 concurrent tasks (on one key, and over
//! 1,000 keys); then the same on a local Redis Cluster of 3 masters and 3 replicas.
//!
//! Uses `TOLLGATE_BENCH_REDIS` (a URL) when set; otherwise starts a redis-server of its own on
//! a free loopback port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::store::redis::RedisStore;
use tollgate::store::{Op, Outcome};
use tollgate::{Cost, Limits, Store};
use tollgate_testkit::redis::RedisServer;

/// An admission that never waits.
const TRY: Op = Op::Acquire {
    cost: Cost::call(700),
    max_wait: Some(Duration::ZERO),
    fly: false,
    share: None,
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(url: &str) -> RedisStore {
    for _ in 0..200 {
        if let Ok(store) = RedisStore::connect(url).await {
            return store;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("redis at {url} did not answer");
}

/// `PING` and one acquire, one after another; then acquires per second from 1 and 50 tasks on
/// one key, and from 50 tasks over 1,000 keys.
fn measure<C>(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    store: RedisStore,
    ping: C,
) where
    C: redis::aio::ConnectionLike + Clone + Send + 'static,
{
    // Never refused: the bench measures the round trip, not waiting.
    let limits = Limits::parse("1000000000/s", "1000000000/s").unwrap();
    let key = Arc::new(store.bind("bench", &limits).unwrap());
    let keys: Arc<Vec<_>> = Arc::new(
        (0..1000)
            .map(|k| store.bind(&format!("bench-{k}"), &limits).unwrap())
            .collect(),
    );

    let mut group = c.benchmark_group(format!("{name}_round_trip"));
    group.bench_function("ping", |b| {
        b.iter_custom(|iters| {
            let mut connection = ping.clone();
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

    let mut group = c.benchmark_group(format!("{name}_acquire_throughput"));
    group.throughput(Throughput::Elements(1));
    for (tasks, spread) in [(1u64, false), (50, false), (50, true)] {
        let label = if spread {
            format!("{tasks}_tasks_1000_keys")
        } else {
            format!("{tasks}_tasks")
        };
        group.bench_function(label, |b| {
            b.iter_custom(|iters| {
                let (store, key, keys) = (store.clone(), Arc::clone(&key), Arc::clone(&keys));
                runtime.block_on(async move {
                    let per_task = iters.div_ceil(tasks);
                    let start = Instant::now();
                    let handles: Vec<_> = (0..tasks)
                        .map(|task| {
                            let (store, key, keys) =
                                (store.clone(), Arc::clone(&key), Arc::clone(&keys));
                            tokio::spawn(async move {
                                for n in 0..per_task {
                                    let key = if spread {
                                        &keys[((task * per_task + n) % 1000) as usize]
                                    } else {
                                        &*key
                                    };
                                    store.apply(key, TRY).await.unwrap();
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

fn one_node(c: &mut Criterion) {
    let (_server, url) = server();
    // One runtime for the connections and the measuring: a connection's task lives on it.
    let runtime = runtime();
    let store = runtime.block_on(connect(&url));
    let client = redis::Client::open(url.as_str()).unwrap();
    let ping = runtime
        .block_on(client.get_multiplexed_async_connection())
        .unwrap();
    measure(c, &runtime, "redis", store, ping);
}

/// The same on a Redis Cluster of 3 masters and 3 replicas on this machine (skipped with
/// `TOLLGATE_BENCH_REDIS`, which names one server).
fn cluster(c: &mut Criterion) {
    if std::env::var_os("TOLLGATE_BENCH_REDIS").is_some() {
        return;
    }
    let cluster =
        tollgate_testkit::redis::RedisCluster::start().expect("redis-server and redis-cli");
    let url = cluster.url();
    let runtime = runtime();
    let store = runtime.block_on(connect(&url));
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}", n.port))
        .collect();
    let client = redis::cluster::ClusterClient::new(nodes).unwrap();
    let ping = runtime.block_on(client.get_async_connection()).unwrap();
    measure(c, &runtime, "cluster", store, ping);
}

criterion_group!(benches, one_node, cluster);
criterion_main!(benches);
