//! Jittered exponential backoff, floored at the store's own "ready in" hint.
//!
//! A waiter never wakes before its tokens can exist: every sleep is the hint plus a random
//! jitter. The jitter's ceiling starts at `base` and doubles each time the waiter wakes and
//! still can't pass (someone else took the tokens, or another process shares the key), up to
//! `cap`. Jitter spreads waiters that share a key across processes, so that they don't all wake
//! at the same instant and race for the same tokens.

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
/// assert_eq!(backoff.delay(hint, 2, 1.0), hint + backoff.base * 4);
/// // The ceiling stops growing at `cap`.
/// assert_eq!(backoff.delay(hint, 30, 1.0), hint + backoff.cap);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The jitter ceiling of the first sleep. Default 5 ms.
    pub base: Duration,
    /// The largest jitter ceiling. Default 1 s.
    pub cap: Duration,
    /// Whether to add jitter at all; without it every sleep is exactly the hint. Default true.
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_millis(5),
            cap: Duration::from_secs(1),
            jitter: true,
        }
    }
}

impl Backoff {
    /// No jitter: sleep exactly the hint each time.
    pub fn exact() -> Backoff {
        Backoff {
            jitter: false,
            ..Backoff::default()
        }
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
