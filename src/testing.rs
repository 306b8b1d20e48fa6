//! Entry points for tests, of tollgate and of programs that use it: what a test needs and a
//! program should not (feature `testing`, which brings `redis`).
//!
//! - [`redis_apply_at`] runs the Redis script at an explicit time (so that its decisions can
//!   be compared with the memory store's on the same trace) and answers the server time an
//!   operation used (so that a test can check the window bound on the server's clock).
//! - [`Recording`] is a Redis store that keeps the server time of every admission.
//! - [`redis_apply_traced`] does the same and says whether the script's fast path answered.
//! - [`redis_names`] gives the names a key has in Redis.
//! - [`RuleBook`] runs the rule book every store follows (what the memory store runs, what the
//!   Redis script ports) on one key at explicit times, with the script's ticket lease: the
//!   reference a differential test compares the script with.
//!
//! A [`MemoryStore`](crate::MemoryStore) on a [`ManualClock`](crate::ManualClock) needs none
//! of this: it moves only when told to, and [`Store::apply_now`] runs
//! one operation on it at once, without a runtime.
//!
//! Nothing here is needed to use tollgate; it may change more freely than the rest.

use std::sync::{Arc, Mutex, PoisonError};

use std::time::Duration;

use crate::bucket::{KeyState, Nanos};
use crate::error::Error;
use crate::rate::Limits;
use crate::store::redis::{RedisKey, RedisStore};
use crate::store::{Op, Outcome, Store, Ticket};

/// Runs `op` on `key` at `now_ms` milliseconds (`None`: the server's `TIME`), answering the
/// outcome and the time in milliseconds the script used.
pub async fn redis_apply_at(
    store: &RedisStore,
    key: &RedisKey,
    op: Op,
    now_ms: Option<u64>,
) -> Result<(Outcome, u64), Error> {
    store.apply_at(key, op, now_ms).await
}

/// Which part of the Redis script answered an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptPath {
    /// A fast path: an acquire that passed at once on a key where nobody waits, no pause is
    /// in force and no call in flight is remembered, and that was not itself a call to fly; or
    /// the holder of the ticket first in line asking (not to fly) on such a key, admitted or
    /// told when it can pass.
    Fast,
    /// The full script.
    Full,
}

/// [`redis_apply_at`], answering also which part of the script answered: what a differential
/// test needs to show that its traces go through both.
pub async fn redis_apply_traced(
    store: &RedisStore,
    key: &RedisKey,
    op: Op,
    now_ms: Option<u64>,
) -> Result<(Outcome, u64, ScriptPath), Error> {
    let (outcome, now_ms, fast) = store.apply_traced(key, op, now_ms).await?;
    let path = if fast {
        ScriptPath::Fast
    } else {
        ScriptPath::Full
    };
    Ok((outcome, now_ms, path))
}

/// The Lua script the Redis store runs, as sent to the server (its constants filled in).
pub fn redis_script() -> &'static str {
    crate::store::redis::script_text()
}

/// The names of `key`'s hash and of its queue in Redis.
pub fn redis_names(store: &RedisStore, key: &str) -> (String, String) {
    store.names(key)
}

/// A Redis store that records the server time (in milliseconds) of every admission, so that
/// a test or an example can check the window bound on Redis's own clock.
#[derive(Debug, Clone)]
pub struct Recording {
    store: RedisStore,
    admitted_at: Arc<Mutex<Vec<u64>>>,
}

impl Recording {
    /// Records the admissions made through `store`.
    pub fn new(store: RedisStore) -> Recording {
        Recording {
            store,
            admitted_at: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Where the server times are recorded, to read after the store has moved into a limiter.
    pub fn log(&self) -> Arc<Mutex<Vec<u64>>> {
        Arc::clone(&self.admitted_at)
    }

    /// The server times (ms) of the admissions so far.
    pub fn admitted_at(&self) -> Vec<u64> {
        self.admitted_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Store for Recording {
    type Key = RedisKey;

    fn bind(&self, key: &str, limits: &Limits) -> Result<RedisKey, Error> {
        self.store.bind(key, limits)
    }

    async fn apply(&self, key: &RedisKey, op: Op) -> Result<Outcome, Error> {
        let (outcome, now_ms) = self.store.apply_at(key, op, None).await?;
        if outcome == Outcome::Admitted {
            self.admitted_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(now_ms);
        }
        Ok(outcome)
    }

    fn health_interval(&self) -> Option<std::time::Duration> {
        self.store.health_interval()
    }
}

/// One key under the rule book, at explicit times: exactly what the memory store runs, with
/// tickets that lapse one `lease` past their due time (as the Redis store's do) and numbered
/// 1, 2, 3, ...
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::{Op, Outcome};
/// use tollgate::testing::RuleBook;
/// use tollgate::{Cost, Limits};
///
/// let limits = Limits::parse("10/s", "")?;
/// let mut key = RuleBook::new(&limits, Duration::ZERO, Duration::from_secs(1));
/// let try_one = Op::Acquire { cost: Cost::call(0), max_wait: Some(Duration::ZERO), fly: false, share: None };
/// for _ in 0..10 {
///     assert_eq!(key.apply(try_one.clone(), Duration::ZERO)?, Outcome::Admitted);
/// }
/// assert_eq!(key.apply(try_one.clone(), Duration::ZERO)?, Outcome::NotYet(Duration::from_millis(100)));
/// # Ok::<(), tollgate::Error>(())
/// ```
#[derive(Debug)]
pub struct RuleBook {
    limits: Limits,
    state: KeyState,
    lease: Duration,
    tickets: u64,
}

impl RuleBook {
    /// A key whose windows are full at `now`.
    pub fn new(limits: &Limits, now: Duration, lease: Duration) -> RuleBook {
        RuleBook {
            limits: limits.clone(),
            state: KeyState::new(limits, Nanos::from_duration(now)),
            lease,
            tickets: 0,
        }
    }

    /// True when nobody waits on the key (every ticket left, if any, has lapsed) and no pause
    /// is in force at `now`: where an arriving call needs to look at nothing but the windows
    /// (the Redis script's fast path).
    pub fn is_quiet(&self, now: Duration) -> bool {
        self.state.is_quiet(Nanos::from_duration(now))
    }

    /// How many tickets wait behind `ticket` in the key's queue (`None`: it does not wait): a
    /// ticket just issued with some behind it was placed ahead of them by the fair order.
    pub fn behind(&self, ticket: Ticket) -> Option<usize> {
        self.state.behind(ticket.id())
    }

    /// Runs `op` at `now` (time only moves forward: an earlier `now` counts as no time
    /// passing).
    pub fn apply(&mut self, op: Op, now: Duration) -> Result<Outcome, Error> {
        let tickets = &mut self.tickets;
        self.state.apply(
            &self.limits,
            "rule-book",
            Nanos::from_duration(now),
            op,
            self.lease,
            || {
                *tickets += 1;
                *tickets
            },
        )
    }
}
