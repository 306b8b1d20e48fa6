//! Jittered exponential backoff, floored at the store's own "ready in" hint.
//!
//! A waiter never wakes before its tokens can exist: every sleep after a failed attempt is the
//! hint plus a random jitter. The jitter's ceiling starts at `base` and doubles each time the
//! waiter, first in line, wakes and still can't pass (a settlement went into debt, a
//! provider's header lowered the count, another process took the tokens, a pause holds the
//! key), up to `cap`. Jitter spreads waiters that would otherwise wake at the same instant and
//! race for the same tokens. A sleep to a ticket's due time has none, nor does the first retry
//! after a hint, nor a wait behind a late call ahead: each of those waiters has a time of its
//! own, so there is no herd to spread, and jitter there would only cost throughput.

use std::time::Duration;

use rand::Rng;

/// How a waiter sleeps between attempts.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Backoff;
///
/// let backoff = Backoff::default();
/// let hint = Duration::from_millis(200);
/// // With the random draw at its extremes, the sleep spans hint ..= hint + base·2^attempt.
/// assert_eq!(backoff.delay(hint, 0, 0.0), hint);
/// assert_eq!(backoff.delay(hint, 2, 1.0), hint + backoff.base() * 4);
/// // The ceiling stops growing at `cap`.
/// assert_eq!(backoff.delay(hint, 30, 1.0), hint + backoff.cap());
///
/// let patient = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
/// assert_eq!(patient.ceiling(3), Duration::from_millis(400));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: bool,
}

impl Default for Backoff {
    /// Base 5 ms, cap 1 s, with jitter.
    fn default() -> Backoff {
        Backoff::new(Duration::from_millis(5), Duration::from_secs(1))
    }
}

impl Backoff {
    /// A jitter ceiling of `base` on the first retry, doubling up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            jitter: true,
        }
    }

    /// No jitter: sleep exactly the hint each time.
    pub fn exact() -> Backoff {
        Backoff::default().with_jitter(false)
    }

    /// The same backoff with jitter on or off.
    pub fn with_jitter(self, jitter: bool) -> Backoff {
        Backoff { jitter, ..self }
    }

    /// The jitter ceiling of the first retry.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest jitter ceiling.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// Whether sleeps get jitter at all.
    pub fn jitter(&self) -> bool {
        self.jitter
    }

    /// The jitter ceiling after `attempt` failed wake-ups: `min(cap, base · 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The sleep for `hint` after `attempt` failed wake-ups, with `draw` in `[0, 1]` as the
    /// random part (pure, for tests; [`Backoff::sleep_for`] draws it).
    pub fn delay(&self, hint: Duration, attempt: u32, draw: f64) -> Duration {
        if !self.jitter {
            return hint;
        }
        let draw = if draw.is_finite() {
            draw.clamp(0.0, 1.0)
        } else {
            0.0
        };
        hint.saturating_add(self.ceiling(attempt).mul_f64(draw))
    }

    /// The sleep for `hint` after `attempt` failed wake-ups, with a fresh random draw.
    pub fn sleep_for(&self, hint: Duration, attempt: u32) -> Duration {
        let draw = if self.jitter {
            rand::rng().random::<f64>()
        } else {
            0.0
        };
        self.delay(hint, attempt, draw)
    }
}
