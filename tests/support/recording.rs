//! A Redis store that records the server time of every admission: how the multi-process test
//! and the workers example check the window bound on Redis's own clock.

use std::sync::{Arc, Mutex};

use tollgate::store::redis::{RedisKey, RedisStore};
use tollgate::store::{Op, Outcome};
use tollgate::{Error, Limits, Store, testing};

pub struct Recording {
    store: RedisStore,
    admitted_at: Arc<Mutex<Vec<u64>>>,
}

impl Recording {
    pub fn new(store: RedisStore) -> Recording {
        Recording {
            store,
            admitted_at: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Where the server times are recorded, to read after the store has moved into a limiter.
    #[allow(dead_code)] // not every user of this file reads it this way
    pub fn log(&self) -> Arc<Mutex<Vec<u64>>> {
        Arc::clone(&self.admitted_at)
    }

    /// The server times (ms) of the admissions so far.
    #[allow(dead_code)] // not every user of this file reads it this way
    pub fn admitted_at(&self) -> Vec<u64> {
        self.admitted_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Store for Recording {
    type Key = RedisKey;

    fn bind(&self, key: &str, limits: &Limits) -> Result<RedisKey, Error> {
        self.store.bind(key, limits)
    }

    async fn apply(&self, key: &RedisKey, op: Op) -> Result<Outcome, Error> {
        let (outcome, now_ms) = testing::redis_apply_at(&self.store, key, op, None).await?;
        if outcome == Outcome::Admitted {
            self.admitted_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(now_ms);
        }
        Ok(outcome)
    }

    fn health_interval(&self) -> Option<std::time::Duration> {
        self.store.health_interval()
    }
}
