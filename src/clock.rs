//! Where "now" comes from.
//!
//! The in-process store follows `tokio::time::Instant`, which means that `tokio::time::pause()`
//! drives every window and every wait in tests; [`ManualClock`] is moved by hand, for tests of
//! the arithmetic that want exact instants.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::bucket::Nanos;

/// A source of monotonic time for a store.
#[derive(Debug, Clone)]
pub(crate) enum Clock {
    /// `tokio::time::Instant`, measured from the instant the clock was made.
    Tokio(tokio::time::Instant),
    /// Time that moves only when told to.
    Manual(ManualClock),
}

impl Clock {
    /// Tokio's clock, starting now.
    pub(crate) fn tokio() -> Clock {
        Clock::Tokio(tokio::time::Instant::now())
    }

    /// The time since the clock's origin.
    ///
    /// Tokio's clock reads from [`TOKIO_BIAS`] up, so that a reading earlier than the origin
    /// (another runtime whose paused clock lags this one, in tests) is still an instant that
    /// orders correctly instead of collapsing to zero.
    pub(crate) fn now(&self) -> Nanos {
        match self {
            Clock::Tokio(origin) => {
                let now = tokio::time::Instant::now();
                let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(TOKIO_BIAS);
                Nanos(if now >= *origin {
                    TOKIO_BIAS.saturating_add(nanos(now - *origin))
                } else {
                    TOKIO_BIAS.saturating_sub(nanos(*origin - now))
                })
            }
            Clock::Manual(manual) => manual.now(),
        }
    }
}

/// Where tokio's clock starts counting (2^62 ns, about 146 years): room below for readings
/// before the origin, and above for centuries after it.
const TOKIO_BIAS: u64 = 1 << 62;

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use tollgate::ManualClock;
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
    pub(crate) fn now(&self) -> Nanos {
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
