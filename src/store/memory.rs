//! The in-process store: every key's buckets in sharded maps behind short, synchronous locks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::bucket::{Available, Buckets, Cost, Decision, Nanos};
use crate::clock::{Clock, ManualClock};
use crate::error::Error;
use crate::rate::Limits;
use crate::store::Store;

const SHARDS: usize = 16;
/// A shard is swept for full buckets when it has grown to twice its size after the last sweep,
/// and never below this many keys: the cost of sweeping stays O(1) per new key.
const MIN_SWEEP: usize = 1024;

/// Buckets in memory, shared by every clone and every task of the process.
///
/// The lock of a key's shard is held only for the arithmetic, never across an `.await`; the
/// clock is read under it, so a key's time never runs backwards however the tasks interleave.
/// Keys whose buckets are full again are forgotten (a full bucket is the same as a new one), so
/// memory follows the keys in use, not every key ever seen.
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::ManualClock;
/// use tollgate::store::MemoryStore;
/// use tollgate::{Cost, Decision, Limits};
///
/// let clock = ManualClock::new();
/// let store = MemoryStore::with_clock(clock.clone());
/// let limits = Limits::parse("2/s burst 3", "")?;
/// for _ in 0..3 {
///     assert_eq!(store.try_acquire_now("k", &limits, Cost::call(0))?, Decision::Admitted);
/// }
/// assert_eq!(
///     store.try_acquire_now("k", &limits, Cost::call(0))?,
///     Decision::NotYet(Duration::from_millis(500))
/// );
/// clock.advance(Duration::from_millis(500));
/// assert_eq!(store.try_acquire_now("k", &limits, Cost::call(0))?, Decision::Admitted);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    clock: Clock,
    shards: Box<[Mutex<Shard>]>,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Box<str>, Entry>,
    sweep_at: usize,
}

#[derive(Debug)]
struct Entry {
    limits: Limits,
    buckets: Buckets,
    last: Nanos,
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store on tokio's clock (so `tokio::time::pause()` drives it in tests).
    pub fn new() -> MemoryStore {
        MemoryStore::with_clock(Clock::tokio())
    }

    /// A store on the given clock: pass a [`ManualClock`] to test with exact instants.
    pub fn with_clock(clock: impl Into<Clock>) -> MemoryStore {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    entries: HashMap::new(),
                    sweep_at: MIN_SWEEP,
                })
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner {
                clock: clock.into(),
                shards,
            }),
        }
    }

    /// The clock this store reads.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The manual clock, if the store runs on one.
    pub fn manual_clock(&self) -> Option<&ManualClock> {
        match &self.inner.clock {
            Clock::Manual(manual) => Some(manual),
            Clock::Tokio(_) => None,
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        // FNV-1a: cheap, and good enough to spread keys over a handful of shards.
        let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        self.inner.shards[(hash as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Charges `cost` to every bucket of `key` if all can pay now; otherwise charges nothing
    /// and answers how long until they could. This is the whole of [`Store::try_acquire`] for
    /// this store, without a future around it.
    pub fn try_acquire_now(
        &self,
        key: &str,
        limits: &Limits,
        cost: Cost,
    ) -> Result<Decision, Error> {
        // `Buckets::try_take` validates the cost before it changes anything, and a new key's
        // state is kept only when the call succeeds: bad input leaves no trace either way.
        self.with_entry(key, limits, cost, |buckets, now| {
            buckets.try_take(now, cost)
        })
    }

    /// Applies `f` to the buckets of `key` at the current time, creating them full if needed
    /// (`cost` is for the context of an error).
    fn with_entry<T>(
        &self,
        key: &str,
        limits: &Limits,
        cost: Cost,
        f: impl FnOnce(&mut Buckets, Nanos) -> Result<T, crate::bucket::BucketError>,
    ) -> Result<T, Error> {
        let mut shard = self.shard(key);
        let now = self.inner.clock.now();
        let apply = |entry: &mut Entry| {
            if entry.limits != *limits {
                return Err(conflict(key, &entry.limits, limits));
            }
            // Readers of tokio's clock in different runtimes may disagree slightly; a key's
            // time only moves forward, so an earlier reading counts as no time passing.
            let now = now.max(entry.last);
            let out = f(&mut entry.buckets, now).map_err(|e| Error::from_bucket(key, cost, e))?;
            entry.last = now;
            Ok(out)
        };
        // Look up before inserting, so that a key that exists costs no allocation; a new key's
        // state is kept only if the operation succeeded.
        match shard.entries.get_mut(key) {
            Some(entry) => apply(entry),
            None => {
                shard.sweep(now);
                let mut entry = Entry {
                    limits: limits.clone(),
                    buckets: Buckets::new(limits, now),
                    last: now,
                };
                let out = apply(&mut entry)?;
                shard.entries.insert(key.into(), entry);
                Ok(out)
            }
        }
    }

    /// The tokens each window of `key` holds now (full windows for a key never seen).
    pub fn snapshot_now(&self, key: &str, limits: &Limits) -> Result<Vec<Available>, Error> {
        let shard = self.shard(key);
        let now = self.inner.clock.now();
        match shard.entries.get(key) {
            Some(entry) if entry.limits != *limits => Err(conflict(key, &entry.limits, limits)),
            Some(entry) => entry
                .buckets
                .snapshot(now.max(entry.last))
                .map_err(|e| Error::from_bucket(key, Cost::default(), e)),
            None => Buckets::new(limits, now)
                .snapshot(now)
                .map_err(|e| Error::from_bucket(key, Cost::default(), e)),
        }
    }

    /// Adds `delta` tokens to every token window of `key` (see [`Buckets::adjust`]).
    pub fn adjust_now(&self, key: &str, limits: &Limits, delta: i64) -> Result<(), Error> {
        self.with_entry(key, limits, Cost::default(), |buckets, now| {
            buckets.adjust(now, crate::rate::Currency::Tokens, delta)
        })
    }

    /// Empties every window of `key`.
    pub fn drain_now(&self, key: &str, limits: &Limits) -> Result<(), Error> {
        self.with_entry(key, limits, Cost::default(), |buckets, now| {
            buckets.drain(now)
        })
    }

    /// Empties every window of `key` and admits nothing on it for `pause` (a longer pause
    /// already in force wins).
    pub fn penalize_now(&self, key: &str, limits: &Limits, pause: Duration) -> Result<(), Error> {
        self.with_entry(key, limits, Cost::default(), |buckets, now| {
            let until = Nanos(now.0.saturating_add(Nanos::from_duration(pause).0));
            buckets.penalize(now, until)
        })
    }

    /// How many keys the store holds state for: keys whose buckets are full may already have
    /// been forgotten, and are forgotten at the latest when their shard next grows.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entries
                    .len()
            })
            .sum()
    }

    /// True when the store holds no state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every key whose buckets are full now.
    pub fn sweep(&self) {
        let now = self.inner.clock.now();
        for shard in self.inner.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.sweep_at = 0;
            shard.sweep(now);
        }
    }
}

impl Shard {
    /// Forgets full buckets once the shard has doubled since the last sweep.
    fn sweep(&mut self, now: Nanos) {
        if self.entries.len() < self.sweep_at {
            return;
        }
        self.entries
            .retain(|_, entry| !entry.buckets.is_full(now.max(entry.last)));
        self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
    }
}

fn conflict(key: &str, existing: &Limits, requested: &Limits) -> Error {
    Error::ConflictingLimits {
        key: key.to_owned(),
        existing: existing.clone(),
        requested: requested.clone(),
    }
}

impl Store for MemoryStore {
    async fn try_acquire(&self, key: &str, limits: &Limits, cost: Cost) -> Result<Decision, Error> {
        self.try_acquire_now(key, limits, cost)
    }

    async fn adjust(&self, key: &str, limits: &Limits, delta: i64) -> Result<(), Error> {
        self.adjust_now(key, limits, delta)
    }

    async fn drain(&self, key: &str, limits: &Limits) -> Result<(), Error> {
        self.drain_now(key, limits)
    }

    async fn penalize(&self, key: &str, limits: &Limits, pause: Duration) -> Result<(), Error> {
        self.penalize_now(key, limits, pause)
    }

    async fn snapshot(&self, key: &str, limits: &Limits) -> Result<Vec<Available>, Error> {
        self.snapshot_now(key, limits)
    }
}
