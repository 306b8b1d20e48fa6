//! Outlier ejection for a pool's members, as Envoy's outlier detection does it: a member that
//! fails `eject_after` calls in a row (a 5xx answer, no first byte within its attempt's time, a
//! connection refused) is passed over for a base time, longer each time it is ejected again
//! while it keeps failing (base × ejections, at most a maximum); a spent quota ejects it at
//! once. A call it serves well clears its record. The state is this process's own (a fleet's
//! proxies each learn it from their own calls).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// When a pool ejects its members, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// Failures in a row that eject a member (default 3).
    pub after: u32,
    /// How long its first ejection lasts (default 10 s); the n-th in a row lasts n times this.
    pub base: Duration,
    /// The longest an ejection lasts (default 300 s).
    pub most: Duration,
}

impl Default for Ejection {
    fn default() -> Ejection {
        Ejection {
            after: 3,
            base: Duration::from_secs(10),
            most: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Failures in a row since the last success (or ejection).
    failures: u32,
    /// Ejections in a row (cleared by a success).
    ejections: u32,
    /// Passed over until then.
    until: Option<Instant>,
}

/// One member's record.
#[derive(Debug, Default)]
pub(crate) struct Health {
    state: Mutex<State>,
}

impl Health {
    /// Whether the member is passed over at `now`.
    pub(crate) fn ejected(&self, now: Instant) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.until.is_some_and(|until| now < until)
    }

    /// A call failed at `now`: answers how long the member is ejected for, if this ejects it.
    pub(crate) fn failed(&self, now: Instant, rule: Ejection) -> Option<Duration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.until.is_some_and(|until| now < until) {
            return None;
        }
        state.failures += 1;
        if state.failures < rule.after.max(1) {
            return None;
        }
        Some(eject(&mut state, now, rule))
    }

    /// The member's quota is spent (a permanent 429): ejected at once.
    pub(crate) fn spent(&self, now: Instant, rule: Ejection) -> Option<Duration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.until.is_some_and(|until| now < until) {
            return None;
        }
        Some(eject(&mut state, now, rule))
    }

    /// A call was served: the record is clear.
    pub(crate) fn served(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.failures = 0;
        state.ejections = 0;
    }
}

fn eject(state: &mut State, now: Instant, rule: Ejection) -> Duration {
    state.failures = 0;
    state.ejections = state.ejections.saturating_add(1);
    let time = rule.base.saturating_mul(state.ejections).min(rule.most);
    state.until = Some(now + time);
    time
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_that_keeps_failing_is_ejected_for_longer_each_time() {
        let rule = Ejection {
            after: 3,
            base: Duration::from_secs(10),
            most: Duration::from_secs(25),
        };
        let health = Health::default();
        let t0 = Instant::now();
        assert_eq!(health.failed(t0, rule), None);
        assert_eq!(health.failed(t0, rule), None);
        assert_eq!(health.failed(t0, rule), Some(Duration::from_secs(10)));
        assert!(health.ejected(t0 + Duration::from_secs(9)));
        // Failures of calls that were on their way when it was ejected don't add to it.
        assert_eq!(health.failed(t0 + Duration::from_secs(1), rule), None);
        let back = t0 + Duration::from_secs(10);
        assert!(!health.ejected(back));
        // Back, it fails three in a row again: twice the base, then the most.
        for _ in 0..2 {
            assert_eq!(health.failed(back, rule), None);
        }
        assert_eq!(health.failed(back, rule), Some(Duration::from_secs(20)));
        let again = back + Duration::from_secs(20);
        for _ in 0..2 {
            health.failed(again, rule);
        }
        assert_eq!(health.failed(again, rule), Some(Duration::from_secs(25)));
        // A call served clears the record: the next ejection is the base again.
        health.served();
        let later = again + Duration::from_secs(25);
        assert_eq!(health.spent(later, rule), Some(Duration::from_secs(10)));
        // A success between failures restarts the count.
        let health = Health::default();
        health.failed(t0, rule);
        health.failed(t0, rule);
        health.served();
        assert_eq!(health.failed(t0, rule), None);
    }
}
