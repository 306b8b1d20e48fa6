//! A Redis store that records the server time of every admission: how the multi-process test
//! and the workers example check the window bound on Redis's own clock.

use std::sync::Mutex;
use std::time::Duration;

use tollgate::bucket::Available;
use tollgate::store::redis::RedisStore;
use tollgate::{Cost, Decision, Error, Limits, Store};

pub struct Recording {
    store: RedisStore,
    admitted_at: Mutex<Vec<u64>>,
}

impl Recording {
    pub fn new(store: RedisStore) -> Recording {
        Recording {
            store,
            admitted_at: Mutex::new(Vec::new()),
        }
    }

    /// The server times (ms) of the admissions so far.
    pub fn admitted_at(&self) -> Vec<u64> {
        self.admitted_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Store for Recording {
    async fn try_acquire(&self, key: &str, limits: &Limits, cost: Cost) -> Result<Decision, Error> {
        let (decision, now_ms) = self.store.try_acquire_at(key, limits, cost, None).await?;
        if decision.is_admitted() {
            self.admitted_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(now_ms);
        }
        Ok(decision)
    }
    async fn adjust(&self, key: &str, limits: &Limits, delta: i64) -> Result<(), Error> {
        self.store.adjust(key, limits, delta).await
    }
    async fn drain(&self, key: &str, limits: &Limits) -> Result<(), Error> {
        self.store.drain(key, limits).await
    }
    async fn penalize(&self, key: &str, limits: &Limits, pause: Duration) -> Result<(), Error> {
        self.store.penalize(key, limits, pause).await
    }
    async fn snapshot(&self, key: &str, limits: &Limits) -> Result<Vec<Available>, Error> {
        self.store.snapshot(key, limits).await
    }
}
