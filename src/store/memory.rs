//! The in-process store: each key's state behind a short, synchronous lock of its own, found
//! through sharded maps only when a limiter binds it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::bucket::{KeyState, Nanos};
use crate::clock::{Clock, ManualClock};
use crate::error::Error;
use crate::rate::Limits;
use crate::store::{Op, Outcome, Store};

const SHARDS: usize = 16;
/// A shard is swept for forgettable keys when it has grown to twice its size after the last
/// sweep, and never below this many keys: the cost of sweeping stays O(1) per new key.
const MIN_SWEEP: usize = 1024;
/// How long a ticket stays valid past its due time without its holder asking for it. In one
/// process a holder only fails to ask when its runtime is blocked, so this is generous.
const LEASE: Duration = Duration::from_secs(10);

/// Ticket numbers, unique in the process: a ticket that lapsed can never be mistaken for a
/// newer one.
static NEXT_TICKET: AtomicU64 = AtomicU64::new(1);

/// Windows in memory, shared by every clone and every task of the process.
///
/// A limiter binds its key once and then reaches the key's state directly, behind that key's
/// own lock; the lock is held only for the arithmetic, never across an `.await`. Keys that no
/// limiter holds and whose windows are full again are forgotten (a full window is the same as a
/// new one), so memory follows the keys in use, not every key ever seen.
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::{MemoryStore, Op, Outcome, Store};
/// use tollgate::{Cost, Limits, ManualClock};
///
/// let clock = ManualClock::new();
/// let store = MemoryStore::with_clock(clock.clone());
/// let key = store.bind("k", &Limits::parse("2/s burst 3", "")?)?;
/// let try_one = Op::Acquire { cost: Cost::call(0), max_wait: Some(Duration::ZERO), fly: false, share: None };
/// for _ in 0..3 {
///     assert_eq!(store.apply_now(&key, try_one.clone()).unwrap()?, Outcome::Admitted);
/// }
/// assert_eq!(
///     store.apply_now(&key, try_one.clone()).unwrap()?,
///     Outcome::NotYet(Duration::from_millis(500))
/// );
/// clock.advance(Duration::from_millis(500));
/// assert_eq!(store.apply_now(&key, try_one.clone()).unwrap()?, Outcome::Admitted);
/// # Ok::<(), tollgate::Error>(())
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
    entries: HashMap<Arc<str>, Arc<Entry>>,
    sweep_at: usize,
}

#[derive(Debug)]
struct Entry {
    key: Arc<str>,
    limits: Limits,
    state: Mutex<KeyState>,
}

/// A key bound to a [`MemoryStore`]: its state, reached without a lookup.
#[derive(Debug, Clone)]
pub struct MemoryKey(Arc<Entry>);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state is consistent after every operation (they don't panic midway), so a panic
    // elsewhere while the lock was held leaves nothing half-done.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Entry {
    /// True when nothing holds the entry but its shard, and its state says nothing a fresh one
    /// wouldn't.
    fn forgettable(self: &Arc<Entry>, now: Nanos) -> bool {
        Arc::strong_count(self) == 1
            && self
                .state
                .try_lock()
                .is_ok_and(|state| state.is_idle(&self.limits, now))
    }
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store on the CPU's counter (read through `quanta`: a few nanoseconds a reading).
    ///
    /// The clock is chosen at the store's first operation on a key (binding one doesn't
    /// count): if that runs on a tokio runtime whose clock is paused
    /// (`#[tokio::test(start_paused = true)]`, or `tokio::time::pause()` before the first
    /// call), the store follows tokio's clock for good, so that the test drives its windows
    /// and waits. A store first used before the clock is paused, or shared by tests that pause
    /// and tests that don't, should be made with
    /// [`on_tokio_clock`](MemoryStore::on_tokio_clock). The first store of a process also
    /// calibrates the counter against the system's clock, once (a few milliseconds).
    pub fn new() -> MemoryStore {
        MemoryStore::on(Clock::Detect(std::sync::OnceLock::new()))
    }

    /// A store that follows `tokio::time::Instant`, paused or not: what `tokio::time::pause()`
    /// drives. Each reading costs what the system's monotonic clock costs (tens of nanoseconds
    /// on some machines) where [`new`](MemoryStore::new)'s costs a few.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use tollgate::{Cost, Limiter, Limits, MemoryStore};
    ///
    /// let store = MemoryStore::on_tokio_clock();
    /// tokio::time::pause();
    /// let limiter = Limiter::new("k", Limits::parse("1/s", "").unwrap(), store).unwrap();
    /// let _first = limiter.acquire(Cost::call(0)).await.unwrap();
    /// let start = tokio::time::Instant::now();
    /// let _second = limiter.acquire(Cost::call(0)).await.unwrap();
    /// // A second on the paused clock (rounded up to tokio's millisecond timer), in no time.
    /// let waited = start.elapsed();
    /// assert!(waited >= Duration::from_secs(1) && waited <= Duration::from_millis(1_001));
    /// # }
    /// ```
    pub fn on_tokio_clock() -> MemoryStore {
        MemoryStore::on(Clock::tokio())
    }

    /// A store on a clock that moves only when told to: for tests with exact instants.
    pub fn with_clock(clock: ManualClock) -> MemoryStore {
        MemoryStore::on(Clock::Manual(clock))
    }

    fn on(clock: Clock) -> MemoryStore {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    entries: HashMap::new(),
                    sweep_at: MIN_SWEEP,
                })
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner { clock, shards }),
        }
    }

    /// The manual clock, if the store runs on one.
    pub fn manual_clock(&self) -> Option<&ManualClock> {
        match &self.inner.clock {
            Clock::Manual(manual) => Some(manual),
            _ => None,
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        // FNV-1a: cheap, and good enough to spread keys over a handful of shards.
        let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        lock(&self.inner.shards[(hash as usize) % SHARDS])
    }

    /// One operation on a bound key, at the clock's current time.
    pub(crate) fn run(&self, key: &MemoryKey, op: Op) -> Result<Outcome, Error> {
        let entry = &key.0;
        let now = self.inner.clock.now();
        let limits = &entry.limits;
        let mut state = lock(&entry.state);
        state.apply(limits, &entry.key, now, op, LEASE, || {
            NEXT_TICKET.fetch_add(1, Ordering::Relaxed)
        })
    }

    /// How many keys hold state worth keeping: bound by a limiter, in debt or below capacity,
    /// paused, or with calls waiting. Other keys may still be in memory until their shard is
    /// next swept.
    pub fn len(&self) -> usize {
        let now = self.inner.clock.peek();
        self.inner
            .shards
            .iter()
            .map(|s| {
                lock(s)
                    .entries
                    .values()
                    .filter(|e| !e.forgettable(now))
                    .count()
            })
            .sum()
    }

    /// True when no key holds state worth keeping.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every key that nobody holds and whose state is that of a fresh one.
    pub fn sweep(&self) {
        let now = self.inner.clock.peek();
        for shard in self.inner.shards.iter() {
            let mut shard = lock(shard);
            shard.sweep_at = 0;
            shard.sweep(now);
        }
    }
}

impl Shard {
    /// Forgets what can be forgotten once the shard has doubled since the last sweep.
    fn sweep(&mut self, now: Nanos) {
        if self.entries.len() < self.sweep_at {
            return;
        }
        self.entries.retain(|_, entry| !entry.forgettable(now));
        self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
        // After a wave of keys has gone, give the room back too.
        if self.entries.capacity() > 4 * self.sweep_at {
            self.entries.shrink_to(self.sweep_at);
        }
    }
}

impl Store for MemoryStore {
    type Key = MemoryKey;

    fn bind(&self, key: &str, limits: &Limits) -> Result<MemoryKey, Error> {
        let now = self.inner.clock.peek();
        let mut shard = self.shard(key);
        if let Some(entry) = shard.entries.get(key) {
            if entry.limits.same(limits) {
                return Ok(MemoryKey(Arc::clone(entry)));
            }
            // A key with other limits conflicts while it says anything; once it is as good as
            // new, the new limits take it.
            if !entry.forgettable(now) {
                return Err(Error::ConflictingLimits {
                    key: key.to_owned(),
                    existing: entry.limits.clone(),
                    requested: limits.clone(),
                });
            }
        } else {
            shard.sweep(now);
        }
        let name: Arc<str> = Arc::from(key);
        let entry = Arc::new(Entry {
            key: Arc::clone(&name),
            limits: limits.clone(),
            state: Mutex::new(KeyState::new(limits, now)),
        });
        shard.entries.insert(name, Arc::clone(&entry));
        Ok(MemoryKey(entry))
    }

    async fn apply(&self, key: &MemoryKey, op: Op) -> Result<Outcome, Error> {
        self.run(key, op)
    }

    fn apply_now(&self, key: &MemoryKey, op: Op) -> Option<Result<Outcome, Error>> {
        Some(self.run(key, op))
    }
}
