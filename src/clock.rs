//! Where "now" comes from.
//!
//! The in-process store reads [`Clock`] under its lock, so the time a key sees never runs
//! backwards. [`Clock::tokio`] follows `tokio::time::Instant`, which means that
//! `tokio::time::pause()` drives every bucket and every wait in tests; [`ManualClock`] is moved
//! by hand, for tests of the arithmetic that want exact instants.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::bucket::Nanos;

/// A source of monotonic time for a store.
#[derive(Debug, Clone)]
pub enum Clock {
    /// `tokio::time::Instant`, measured from the instant the clock was made.
    Tokio(tokio::time::Instant),
    /// Time that moves only when told to.
    Manual(ManualClock),
}

impl Clock {
    /// Tokio's clock, starting now.
    pub fn tokio() -> Clock {
        Clock::Tokio(tokio::time::Instant::now())
    }

    /// The time since the clock's origin.
    pub fn now(&self) -> Nanos {
        match self {
            Clock::Tokio(origin) => {
                Nanos::from_duration(tokio::time::Instant::now().saturating_duration_since(*origin))
            }
            Clock::Manual(manual) => manual.now(),
        }
    }

    /// The tokio instant that corresponds to `at` on this clock, for sleeping until it; `None`
    /// for a manual clock, whose time no sleep can reach.
    pub fn instant_of(&self, at: Nanos) -> Option<tokio::time::Instant> {
        match self {
            Clock::Tokio(origin) => Some(*origin + at.as_duration()),
            Clock::Manual(_) => None,
        }
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::tokio()
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Clock {
        Clock::Manual(manual)
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::ManualClock;
///
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_millis(250));
/// assert_eq!(clock.elapsed(), Duration::from_millis(250));
/// assert!(clock.set(Duration::from_millis(100)).is_err()); // never backwards
/// assert_eq!(clock.elapsed(), Duration::from_millis(250));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at its origin.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// The current time since the origin.
    pub fn now(&self) -> Nanos {
        Nanos(self.nanos.load(Ordering::SeqCst))
    }

    /// The current time as a duration since the origin.
    pub fn elapsed(&self) -> Duration {
        self.now().as_duration()
    }

    /// Moves the clock forward by `by` (saturating at about 584 years).
    pub fn advance(&self, by: Duration) {
        let by = Nanos::from_duration(by).0;
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(by))
            });
    }

    /// Sets the clock to `at` since the origin. Moving it backwards is an error that names both
    /// times and leaves the clock where it was.
    pub fn set(&self, at: Duration) -> Result<(), crate::Error> {
        let at = Nanos::from_duration(at);
        self.nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (at.0 >= now).then_some(at.0)
            })
            .map(|_| ())
            .map_err(|now| crate::Error::ClockWentBackwards {
                from: Duration::from_nanos(now),
                to: at.as_duration(),
            })
    }
}
