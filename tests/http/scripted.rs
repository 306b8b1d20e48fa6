//! A Redis store for tests on tokio's paused clock: the script runs at the paused clock's time,
//! in whole milliseconds. Each operation is sent to a server from a thread of its own and
//! waited for without yielding, so that no time passes on the paused clock while Redis answers
//! (a paused runtime that waits for I/O jumps to its next timer).

use std::sync::mpsc;

use tollgate::Limits;
use tollgate::store::redis::{RedisKey, RedisStore};
use tollgate::store::{Op, Outcome, Store};
use tollgate::testing::redis_apply_at;
use tollgate_testkit::redis::RedisServer;

type Job = (
    RedisKey,
    Op,
    u64,
    mpsc::Sender<Result<Outcome, tollgate::Error>>,
);

/// A Redis store whose script runs at the paused clock's time (from `start`, plus a second, so
/// that no run starts at the script's 0).
#[derive(Clone)]
pub(crate) struct Scripted {
    store: RedisStore,
    jobs: mpsc::Sender<Job>,
    start: tokio::time::Instant,
}

impl Store for Scripted {
    type Key = RedisKey;

    fn bind(&self, key: &str, limits: &Limits) -> Result<RedisKey, tollgate::Error> {
        self.store.bind(key, limits)
    }

    async fn apply(&self, key: &RedisKey, op: Op) -> Result<Outcome, tollgate::Error> {
        let now = 1_000 + u64::try_from(self.start.elapsed().as_millis()).unwrap();
        let (answer, answered) = mpsc::channel();
        self.jobs.send((key.clone(), op, now, answer)).unwrap();
        answered.recv().unwrap()
    }
}

/// A server, and the thread that runs the script on it for the [`Scripted`] stores it makes.
pub(crate) struct ScriptServer {
    _server: RedisServer,
    store: RedisStore,
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl ScriptServer {
    /// A server on a free loopback port, or `None` (the test skips) where none can start.
    pub(crate) fn start() -> Option<ScriptServer> {
        let server = RedisServer::start()?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let (connected, store) = mpsc::channel();
        let url = server.url();
        let worker = std::thread::spawn(move || {
            let runtime = tollgate_testkit::local_runtime();
            let store = runtime.block_on(RedisStore::connect(&url)).unwrap();
            connected.send(store.clone()).unwrap();
            for (key, op, now, answer) in queue {
                let outcome = runtime.block_on(redis_apply_at(&store, &key, op, Some(now)));
                let _ = answer.send(outcome.map(|(outcome, _)| outcome));
            }
        });
        let store = store.recv().unwrap();
        Some(ScriptServer {
            _server: server,
            store,
            jobs: Some(jobs),
            worker: Some(worker),
        })
    }

    /// A store whose script runs at the paused clock's time since `start`.
    pub(crate) fn store(&self, start: tokio::time::Instant) -> Scripted {
        Scripted {
            store: self.store.clone(),
            jobs: self.jobs.clone().expect("the worker runs until dropped"),
            start,
        }
    }
}

impl Drop for ScriptServer {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}
