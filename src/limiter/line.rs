//! The tickets of one limiter's waiters, in order, and which of them were told they are behind.
//!
//! A ticket's due time assumes every call ahead of it passes on time. When one is late (its
//! timer fired a little after it was due, or its task was busy), those behind it ask too early
//! and hear [`Outcome::Behind`](crate::store::Outcome::Behind). They could sleep for the hint
//! and ask again, but a timer only fires on its next tick (a millisecond in tokio, often more),
//! so on a fast key each late call would make the next later still. Instead a waiter that is
//! behind waits here to be nudged: when a ticket of this limiter passes (or gives up its
//! place), the ticket right after it, if it is waiting to be nudged, asks again at once. A
//! line due within one tick then passes within that tick, and a ticket deep in the line is
//! never woken early. The hint's timer stays armed, for calls ahead that belong to other
//! processes.
//!
//! A refund (a call settled below its estimate) makes tokens exist sooner than the line's
//! schedule says, and a penalty makes the schedule wrong the other way: either way the line is
//! *planned again*. The first waiter is rung and asks at once; while the line is being planned
//! again, each waiter that passes rings the one behind it, which asks at once instead of at its
//! old due time (and, if it can't pass yet, hears exactly when it can). So after a refund every
//! waiter passes as soon as every window can pay it and the calls ahead of it have passed, at
//! the cost of at most one early question per waiter.
//!
//! Tenants sharing a key ([`Share`](crate::store::Share)) wait in fair order, not in the order
//! their tickets were issued; but each tenant's own tickets keep their order. So the line is
//! kept per *lane* (one per tenant): a ticket is ahead of another only in the same lane, and a
//! call passing nudges the next of its own tenant. Across lanes, the store's hints are all there
//! is, as for calls of other processes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

/// A waiter's place: its lane (0 for calls without a share, else its tenant's name hashed)
/// and its ticket's id (ids grow in the order tickets are issued).
pub(super) type Spot = (u64, u64);

/// The lane of calls of `share`'s tenant: its id at the key (0 for calls without a share).
pub(super) fn lane(share: Option<&crate::store::Share>) -> u64 {
    share.map_or(0, crate::store::Share::id)
}

/// The tickets of this limiter's waiters, by lane and id.
#[derive(Debug, Default)]
pub(super) struct Line {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    tickets: BTreeMap<Spot, Seat>,
    /// Set by a refund or a penalty until the line is empty: each waiter that passes rings the
    /// next.
    replanning: bool,
}

/// One waiter's place.
#[derive(Debug, Default)]
struct Seat {
    /// Set while it waits to be nudged; `None` while it sleeps until it is due.
    nudge: Option<Arc<Notify>>,
    /// When it will next ask the store (at the latest).
    wake: Option<Instant>,
    /// How to ring it whatever it waits for (a refund).
    bell: Option<Arc<Notify>>,
}

impl Line {
    /// A waiter holds `ticket` and sleeps until it is due; `bell` rings it early.
    pub(super) fn join(&self, ticket: Spot, bell: &Arc<Notify>) {
        let place = Seat {
            bell: Some(Arc::clone(bell)),
            ..Seat::default()
        };
        self.lock().tickets.insert(ticket, place);
    }

    /// The windows changed other than by the line's own schedule (a refund, a penalty): the
    /// first waiter of each lane asks again now, and the line is planned again (see the module
    /// docs).
    pub(super) fn replan(&self) {
        let mut state = self.lock();
        state.replanning = !state.tickets.is_empty();
        // Rung under the lock: a notification only marks the waiter's task to run, and this
        // way a refund (which replans) allocates nothing.
        let mut lane = None;
        for (&(l, _), place) in &state.tickets {
            if lane != Some(l) {
                lane = Some(l);
                if let Some(bell) = &place.bell {
                    bell.notify_one();
                }
            }
        }
    }

    /// The tickets ahead of `ticket` in its lane.
    fn ahead(state: &State, (lane, id): Spot) -> bool {
        state.tickets.range((lane, 0)..(lane, id)).next().is_some()
    }

    /// The waiter of `ticket` will ask the store again at `wake` at the latest.
    pub(super) fn wakes_at(&self, ticket: Spot, wake: Instant) {
        if let Some(place) = self.lock().tickets.get_mut(&ticket) {
            place.wake = Some(wake);
        }
    }

    /// Whether some waiter will ask the store between `now` and `now + within`: its question
    /// is then the sign of life the health watchdog would otherwise ask for.
    pub(super) fn asks_within(&self, now: Instant, within: std::time::Duration) -> bool {
        self.lock()
            .tickets
            .values()
            .filter_map(|place| place.wake)
            .any(|wake| wake >= now && wake.saturating_duration_since(now) < within)
    }

    /// The waiter of `ticket` is behind: `nudge` is notified when the ticket ahead of it
    /// passes.
    pub(super) fn stand(&self, ticket: Spot, nudge: &Arc<Notify>) {
        self.lock().tickets.entry(ticket).or_default().nudge = Some(Arc::clone(nudge));
    }

    /// The waiter of `ticket` woke (and asks again).
    pub(super) fn sit(&self, ticket: Spot) {
        if let Some(place) = self.lock().tickets.get_mut(&ticket) {
            place.nudge = None;
        }
    }

    /// If a ticket of this limiter is ahead of `ticket`, waits for its nudge (as
    /// [`stand`](Line::stand)) and answers true; else changes nothing. One step, so that the
    /// ticket ahead can't pass unseen in between.
    pub(super) fn stand_if_behind(&self, ticket: Spot, nudge: &Arc<Notify>) -> bool {
        let mut state = self.lock();
        if !Self::ahead(&state, ticket) {
            return false;
        }
        state.tickets.entry(ticket).or_default().nudge = Some(Arc::clone(nudge));
        true
    }

    /// Whether a ticket of this limiter is ahead of `ticket`.
    pub(super) fn has_ahead(&self, ticket: Spot) -> bool {
        Self::ahead(&self.lock(), ticket)
    }

    /// Ticket `ticket` passed or gave up its place: the ticket right after it asks again, if
    /// it was waiting to be nudged, or if the line is being planned again.
    pub(super) fn moved(&self, ticket: Spot) {
        let next = {
            let mut state = self.lock();
            state.tickets.remove(&ticket);
            let replanning = state.replanning;
            let next = state
                .tickets
                .range_mut((ticket.0, ticket.1.saturating_add(1))..=(ticket.0, u64::MAX))
                .next()
                .and_then(|(_, place)| {
                    place
                        .nudge
                        .take()
                        .or_else(|| replanning.then(|| place.bell.clone()).flatten())
                });
            if state.tickets.is_empty() {
                state.replanning = false;
            }
            next
        };
        if let Some(nudge) = next {
            nudge.notify_one();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The map is consistent between statements; a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn nudged(n: &Arc<Notify>) -> bool {
        tokio::time::timeout(std::time::Duration::ZERO, n.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn only_the_ticket_right_behind_a_moved_one_is_nudged() {
        let line = Line::default();
        let (a, b, c) = (
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        let bell = Arc::new(Notify::new());
        line.join((0, 3), &bell);
        line.stand((0, 5), &a);
        assert!(line.has_ahead((0, 5)));
        assert!(!line.has_ahead((0, 3)));
        assert!(!line.stand_if_behind((0, 3), &c));
        line.join((0, 7), &bell);
        line.stand((0, 9), &b);
        // Ticket 3 passing nudges 5, right behind it.
        line.moved((0, 3));
        assert!(nudged(&a).await);
        line.sit((0, 5));
        // Ticket 5 passing reaches 7, which sleeps until due: 9, behind 7, is not woken early.
        line.moved((0, 5));
        assert!(!nudged(&b).await);
        line.moved((0, 7));
        assert!(nudged(&b).await);
        // A ticket given up nudges the one behind it too; a waiter that sat down is not.
        line.stand((0, 11), &c);
        line.sit((0, 11));
        line.moved((0, 9));
        assert!(!nudged(&c).await);
        line.moved((0, 11));
        line.moved((0, u64::MAX));
        assert!(line.lock().tickets.is_empty());
    }

    #[tokio::test]
    async fn a_ticket_is_behind_only_the_tickets_of_its_own_tenant() {
        let line = Line::default();
        let (a, b, bell_a, bell_b) = (
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        // Lane 1 holds tickets 3 and 9, lane 2 ticket 5: in fair order 5 may pass first.
        line.join((1, 3), &bell_a);
        line.join((2, 5), &bell_b);
        line.stand((1, 9), &a);
        line.stand((2, 7), &b);
        assert!(line.has_ahead((1, 9)));
        assert!(!line.has_ahead((2, 5)));
        assert!(line.has_ahead((2, 7)));
        // Ticket 3 passing nudges 9, its tenant's next, not 5 or 7 of the other tenant.
        line.moved((1, 3));
        assert!(nudged(&a).await);
        assert!(!nudged(&b).await);
        // A replan rings the first waiter of every lane.
        line.replan();
        assert!(nudged(&bell_b).await);
        line.moved((2, 5));
        assert!(nudged(&b).await);
    }
}
