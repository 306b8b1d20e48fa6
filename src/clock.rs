//! Where "now" comes from.
//!
//! The in-process store reads the CPU's counter through `quanta` (a few nanoseconds, where the
//! system's monotonic clock costs tens on some machines), except on a runtime whose clock is
//! paused at the store's first operation: there it follows `tokio::time::Instant`, so that
//! `tokio::time::pause()` (`#[tokio::test(start_paused = true)]`) drives every window and every
//! wait in tests. [`ManualClock`] is moved by hand, for tests of the arithmetic that want exact
//! instants. Waits are measured from the store's answers (how long until a call is due), so
//! the limiter's sleeps on tokio's timer agree with any of these clocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::bucket::Nanos;

/// A source of monotonic time for a store.
#[derive(Debug, Clone)]
pub(crate) enum Clock {
    /// [`Clock::detect`]'s choice, made at the first reading that needs it, so that a store
    /// made before a test pauses tokio's clock (or outside the runtime) still follows it.
    Detect(std::sync::OnceLock<Box<Clock>>),
    /// The CPU's counter, in nanoseconds from its reading when the clock was made.
    Fast {
        /// The counter and its calibration.
        clock: quanta::Clock,
        /// The counter's raw reading at the origin.
        origin: u64,
    },
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

    /// The CPU's counter, starting now.
    pub(crate) fn fast() -> Clock {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Clock::Fast { clock, origin }
    }

    /// The clock a store made here should read: tokio's if this thread runs a runtime whose
    /// clock is paused (a test driving time), else the CPU's counter.
    pub(crate) fn detect() -> Clock {
        if tokio_is_paused() {
            Clock::tokio()
        } else {
            Clock::fast()
        }
    }

    /// The time since the clock's origin.
    ///
    /// Tokio's clock reads from [`TOKIO_BIAS`] up, so that a reading earlier than the origin
    /// (another runtime whose paused clock lags this one, in tests) is still an instant that
    /// orders correctly instead of collapsing to zero.
    #[inline]
    pub(crate) fn now(&self) -> Nanos {
        match self {
            Clock::Detect(chosen) => chosen.get_or_init(|| Box::new(Clock::detect())).now(),
            Clock::Fast { clock, origin } => {
                Nanos(TOKIO_BIAS.saturating_add(clock.delta_as_nanos(*origin, clock.raw())))
            }
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

impl Clock {
    /// The time, without choosing a clock yet: a clock not yet chosen is at its origin. For
    /// what may run before the store's first operation (binding a key, counting keys), where
    /// the origin is as good as any time: a new key's windows are full either way.
    pub(crate) fn peek(&self) -> Nanos {
        match self {
            Clock::Detect(chosen) => chosen.get().map_or(Nanos(TOKIO_BIAS), |clock| clock.now()),
            other => other.now(),
        }
    }
}

/// True when this thread is inside a tokio runtime whose clock is paused.
///
/// Tokio offers no question for it, so it is observed: an unpaused clock is the system's and
/// moves while this spins for two microseconds; a paused one moves only when the runtime
/// sleeps, which it cannot do while this thread spins.
fn tokio_is_paused() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        return false;
    }
    let before = tokio::time::Instant::now();
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_micros(2) {
        std::hint::spin_loop();
    }
    tokio::time::Instant::now() == before
}

/// Where the fast and tokio clocks start counting (2^62 ns, about 146 years): room below for readings
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
    pub fn set(&self, at: Duration) -> Result<(), crate::error::Error> {
        let at = Nanos::from_duration(at);
        self.nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (at.0 >= now).then_some(at.0)
            })
            .map(|_| ())
            .map_err(|now| crate::error::Error::ClockWentBackwards {
                from: Duration::from_nanos(now),
                to: at.as_duration(),
            })
    }
}
