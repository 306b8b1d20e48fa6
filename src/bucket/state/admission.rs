//! Admission: a call pays its whole cost at once, or takes a ticket and waits its turn behind
//! the calls ahead of it (acquire, admit, cancel); a call's charge is corrected afterwards
//! (adjust). The Redis script's `acquire`, `admit`, `cancel` and `adjust` port this.

use super::*;

impl KeyState {
    /// The hot path, with nobody waiting and no pause: refill, check and charge every window in
    /// one pass, committing only if all can pay. `None` when some can't (or the key has more
    /// windows than the pass keeps), for the general path to answer.
    fn admit_at_once(
        &mut self,
        limits: &Limits,
        now: Nanos,
        cost: Cost,
    ) -> Result<Option<Outcome>, BucketError> {
        if cost.is_zero() {
            return Err(BucketError::ZeroCost);
        }
        let flat = limits.flat();
        if flat.len() > FAST_WINDOWS || flat.len() != self.real.units.len() {
            return Ok(None);
        }
        let now = now.max(self.real.at);
        let elapsed = now.0 - self.real.at.0;
        let mut next = [0i128; FAST_WINDOWS];
        let mut short = false;
        for (i, (currency, rate)) in flat.iter().enumerate() {
            let amount = cost.of(*currency);
            if amount > rate.burst() {
                return Err(BucketError::CostExceedsCapacity {
                    currency: *currency,
                    rate: *rate,
                    cost: amount,
                });
            }
            let w = Window { rate: *rate };
            let level = w.refill(self.real.units[i], elapsed);
            let left = level - w.units(amount);
            short |= left < 0;
            next[i] = left;
        }
        if short {
            return Ok(None);
        }
        // Element by element: a copy of a length known only at run time is a call to memmove,
        // which costs more than the few windows it copies.
        for (level, left) in self.real.units.iter_mut().zip(next) {
            *level = left;
        }
        self.real.at = now;
        Ok(Some(Outcome::Admitted))
    }

    /// Remembers an admitted call of `cost` as gone out at `now` when `fly` (the HTTP gate's
    /// calls), answering its number.
    fn went(&mut self, limits: &Limits, now: Nanos, cost: Cost, fly: bool) -> Outcome {
        if !fly {
            return Outcome::Admitted;
        }
        let level = PerCurrency::from_fn(|c| tightest(limits, c).map_or(0, |i| self.real.units[i]));
        // The windows the call found full: charged from their capacity, they hold exactly that
        // capacity less the call now.
        let mut full = 0u32;
        for (i, ((c, w), level)) in windows(limits).zip(self.real.units.iter()).enumerate() {
            let paid = cost.of(c);
            if i < 32 && paid > 0 && *level >= w.cap() - w.units(paid) {
                full |= 1 << i;
            }
        }
        let flights = self.flights.get_or_insert_with(|| Box::new(Flights::new()));
        Outcome::Flying(flights.fly(now, cost.per_currency(), level, full))
    }

    /// A call arrives: admitted at once if the key can pay for it on top of every waiting
    /// ticket; else queued, unless it would be due more than `max_wait` from now (then
    /// nothing changes and the answer says when it could pass). With `fly`, an admitted call is
    /// remembered as in flight.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acquire(
        &mut self,
        limits: &Limits,
        now: Nanos,
        cost: Cost,
        max_wait: Option<Duration>,
        fly: bool,
        share: Option<&Share>,
        lease: Duration,
        id: impl FnOnce() -> u64,
    ) -> Result<Outcome, BucketError> {
        if self.queue.is_none()
            && now >= self.paused_until
            && let Some(Outcome::Admitted) = self.admit_at_once(limits, now, cost)?
        {
            let now = now.max(self.real.at);
            return Ok(self.went(limits, now, cost, fly));
        }
        validate(limits, cost)?;
        let now = self.refilled(limits, now);
        self.expire_head(now);
        let pending = self.pending();
        if now >= self.paused_until && self.real.wait(limits, pending, cost) == 0 {
            self.real.charge(limits, cost);
            if let Some(shadow) = self.queue.as_mut().and_then(|q| q.shadow.as_mut()) {
                shadow.charge(limits, cost);
            }
            return Ok(self.went(limits, now, cost, fly));
        }
        let paused_until = self.paused_until;
        let queued = self.queue.as_ref().map_or(0, |q| q.tickets.len());
        let (tenant, weight) = share.map_or((0, 1), |s| (s.id(), s.weight()));
        let step = fair_step(limits, cost, weight);
        let (tag, at) = self
            .queue
            .get_or_insert_with(|| Box::new(Queue::new()))
            .fair_place(tenant, step);
        if at < queued {
            return self.acquire_ahead(limits, now, cost, max_wait, (tenant, tag, at), lease, id);
        }
        let shadow = self.shadow(limits, now);
        let start = shadow.at.max(now).max(paused_until);
        let mut at_start = shadow.clone();
        at_start.advance(limits, start);
        // Exact, in nanoseconds from now: never shortened by the end of the clock.
        let due_in = u128::from(start.0 - now.0) + at_start.wait(limits, Cost::default(), cost);
        if max_wait.is_some_and(|w| due_in > w.as_nanos()) {
            self.forget_empty_queue();
            return Ok(Outcome::NotYet(Duration::from_nanos(saturate(due_in))));
        }
        if queued >= MAX_QUEUE {
            return Err(BucketError::QueueFull);
        }
        let due = Nanos(saturate(u128::from(now.0) + due_in));
        at_start.advance(limits, due);
        at_start.charge(limits, cost);
        *shadow = at_start;
        let id = id();
        let queue = self.queue.as_mut().expect("the shadow made the queue");
        let promise = !fly && queue.all_promised();
        let place = Place {
            id,
            cost,
            lease_until: due.plus(lease),
            due,
            promise,
            tag,
            tenant,
        };
        queue.insert(queued, place);
        Ok(Outcome::Queued {
            ticket: Ticket::new(id).due_at(due.0),
            due_in: Duration::from_nanos(saturate(due_in)),
        })
    }

    /// A call whose fair place is ahead of tickets already waiting (`at`, with its tenant and
    /// tag): due when the key can pay for it after the tickets ahead of that place, on a plan
    /// that keeps no promise (its place breaks them all: the tickets behind it are due later
    /// than they were told). Queued there unless it would be due more than `max_wait` from now.
    #[allow(clippy::too_many_arguments)]
    fn acquire_ahead(
        &mut self,
        limits: &Limits,
        now: Nanos,
        cost: Cost,
        max_wait: Option<Duration>,
        (tenant, tag, at): (u64, u64, usize),
        lease: Duration,
        id: impl FnOnce() -> u64,
    ) -> Result<Outcome, BucketError> {
        let queue = self
            .queue
            .as_mut()
            .expect("tickets wait ahead of this place");
        let mut plan = self.real.clone();
        plan.advance(limits, now.max(self.paused_until));
        for ticket in queue.tickets.range(..at) {
            let due = plan.wait(limits, Cost::default(), ticket.cost);
            plan.advance(limits, Nanos(saturate(u128::from(plan.at.0) + due)));
            plan.charge(limits, ticket.cost);
        }
        let due_in = u128::from(plan.at.0 - now.0) + plan.wait(limits, Cost::default(), cost);
        if max_wait.is_some_and(|w| due_in > w.as_nanos()) {
            return Ok(Outcome::NotYet(Duration::from_nanos(saturate(due_in))));
        }
        if queue.tickets.len() >= MAX_QUEUE {
            return Err(BucketError::QueueFull);
        }
        let due = Nanos(saturate(u128::from(now.0) + due_in));
        let id = id();
        queue.break_promises();
        queue.shadow = None;
        let place = Place {
            id,
            cost,
            lease_until: due.plus(lease),
            due,
            promise: false,
            tag,
            tenant,
        };
        queue.insert(at, place);
        Ok(Outcome::Queued {
            ticket: Ticket::new(id).due_at(due.0),
            due_in: Duration::from_nanos(saturate(due_in)),
        })
    }

    /// The holder of ticket `id` asks to pass: admitted if the key can pay for it on top of the
    /// live tickets ahead of it (which it must not delay), else told when to ask again (and its
    /// lease is extended past then). With `fly`, an admitted call is remembered as in flight.
    ///
    /// A promised ticket is told to come back at its due time if it asks sooner (passing
    /// sooner would take what later promises count on); at or after it, it was charged then
    /// ([`charge_due`](KeyState::charge_due)), and its holder, who says when it was `due`,
    /// passes.
    pub(crate) fn admit(
        &mut self,
        limits: &Limits,
        now: Nanos,
        id: u64,
        due: Option<Nanos>,
        fly: bool,
        lease: Duration,
    ) -> Result<Outcome, BucketError> {
        let now = self.refilled(limits, now);
        let gone = if !fly && due.is_some_and(|due| passed_at_due(now, due, lease)) {
            Outcome::Admitted
        } else {
            Outcome::Lost
        };
        let Some(queue) = self.queue.as_mut() else {
            return Ok(gone);
        };
        let Some(mut index) = queue.find(id) else {
            return Ok(gone);
        };
        let ticket = queue.tickets[index];
        if queue.promised(&ticket) {
            // Not due yet (a due one was charged before this operation).
            return Ok(Outcome::NotYet(Duration::from_nanos(
                ticket.due.0.saturating_sub(now.0),
            )));
        }
        // A holder that comes back after its ticket's lease has lost its place: it lapsed, and
        // may already be gone (a store forgets a key no ticket can still claim).
        if queue.tickets[index].lease_until < now {
            queue.remove(index);
            queue.shadow = None;
            self.forget_empty_queue();
            return Ok(Outcome::Lost);
        }
        // Only the nearest tickets ahead are looked at, so that asking costs the same however
        // long the line; lapsed ones among them are dropped now (they would only block this
        // one). With more ahead, this ticket can't pass yet, and their cost is a lower bound.
        let from = index.saturating_sub(SCAN_AHEAD);
        let mut kept = from;
        for i in from..index {
            let t = queue.tickets[i];
            if t.lease_until >= now {
                queue.tickets[kept] = t;
                kept += 1;
            } else {
                queue.left(&t);
            }
        }
        if kept != index {
            queue.tickets.drain(kept..index);
            index = kept;
            queue.shadow = None;
        }
        let unseen = from > 0;
        let ahead = queue
            .tickets
            .range(from..index)
            .fold(Cost::default(), |sum, t| add(sum, t.cost));
        let ticket = queue.tickets[index];
        let wait = self.real.wait(limits, ahead, ticket.cost);
        let paused = now < self.paused_until;
        let ready_in = if paused {
            u128::from(self.paused_until.0 - now.0).max(wait)
        } else if wait == 0 && !unseen {
            self.real.charge(limits, ticket.cost);
            queue.remove(index);
            self.forget_empty_queue();
            return Ok(self.went(limits, now, ticket.cost, fly));
        } else if unseen {
            // Calls this ticket did not look at are ahead. Guess their cost from those it saw,
            // and ask again when half of the guess has passed: a waiter deep in the line asks
            // a few times on its way to the front, not once per call ahead of it.
            let guess = scale(ahead, index as u64, 2 * SCAN_AHEAD as u64);
            self.real
                .wait(limits, guess, ticket.cost)
                .max(self.real.refill_time(limits, ticket.cost))
                .max(MS_NANOS)
        } else {
            wait
        };
        let ready = Nanos(saturate(u128::from(now.0) + ready_in));
        let lease_until = ready.plus(lease);
        let ticket = &mut queue.tickets[index];
        ticket.lease_until = ticket.lease_until.max(lease_until);
        let wait = saturate(ready_in);
        // In line behind calls that have yet to pass, and not held up by a pause: nothing
        // failed here, the line is just not there yet.
        if index > 0 && !paused {
            return Ok(Outcome::Behind(Duration::from_nanos(wait)));
        }
        Ok(Outcome::NotYet(Duration::from_nanos(wait)))
    }

    /// Gives up ticket `id`: nothing was charged for it ([`Outcome::Done`]), unless it was
    /// promised and charged at its `due` time already ([`Outcome::Admitted`]: the caller gives
    /// its charge back).
    pub(crate) fn cancel(
        &mut self,
        now: Nanos,
        id: u64,
        due: Option<Nanos>,
        lease: Duration,
    ) -> Outcome {
        let mut found = false;
        if let Some(queue) = self.queue.as_mut()
            && let Some(index) = queue.find(id)
        {
            found = true;
            queue.remove(index);
            // The tickets behind it may pass sooner than they were promised: planned again
            // (a cancelled waiter frees its place in line).
            queue.break_promises();
            queue.shadow = None;
            self.forget_empty_queue();
        }
        self.expire_head(now);
        let now = now.max(self.real.at);
        if !found && due.is_some_and(|due| passed_at_due(now, due, lease)) {
            return Outcome::Admitted;
        }
        Outcome::Done
    }

    /// Adds `delta` to every window of each currency (positive: a refund, never above capacity;
    /// negative: a charge that may go into debt, down to 64 bursts).
    pub(crate) fn adjust(&mut self, limits: &Limits, now: Nanos, delta: Delta) -> Outcome {
        self.refilled(limits, now);
        self.add_delta(limits, delta);
        Outcome::Done
    }
}

/// Whether a ticket due at `due`, no longer in the queue at `now`, passed at its due time: a
/// ticket leaves the queue by its holder's own question or cancellation, by being charged at
/// its due time (promised), or by lapsing a lease after it; between its due time and then,
/// only the charge can have taken it.
pub(crate) fn passed_at_due(now: Nanos, due: Nanos, lease: Duration) -> bool {
    due <= now && now <= due.plus(lease)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::Amount;
    use crate::bucket::op::Op;

    const MS: u64 = 1_000_000;
    const LEASE: Duration = Duration::from_secs(1);

    fn limits(requests: &str, tokens: &str) -> Limits {
        Limits::parse(requests, tokens).unwrap()
    }

    fn ids() -> impl FnMut() -> u64 {
        let mut next = 0;
        move || {
            next += 1;
            next
        }
    }

    #[test]
    fn a_newcomer_never_passes_ahead_of_a_ticket() {
        let l = limits("", "10/s");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let big = Cost::new(0, 10);
        let small = Cost::new(0, 1);
        assert_eq!(
            state.acquire(
                &l,
                Nanos(0),
                Cost::new(0, 9),
                None,
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::Admitted)
        );
        // 1 token left: the big call is due when 10 exist, at 0.9 s.
        assert_eq!(
            state.acquire(&l, Nanos(0), big, None, false, None, LEASE, &mut id),
            Ok(Outcome::Queued {
                ticket: Ticket::new(1),
                due_in: Duration::from_nanos(900 * MS),
            })
        );
        // The token that exists now is promised: the small call queues behind, due at 1.0 s.
        assert_eq!(
            state.acquire(&l, Nanos(0), small, None, false, None, LEASE, &mut id),
            Ok(Outcome::Queued {
                ticket: Ticket::new(2),
                due_in: Duration::from_nanos(1_000 * MS),
            })
        );
        // Asking early changes nothing but says when to come back.
        assert_eq!(
            state.admit(&l, Nanos(500 * MS), 1, None, false, LEASE),
            Ok(Outcome::NotYet(Duration::from_nanos(400 * MS)))
        );
        // Promised, each is charged at its due time, and its holder, saying when that was,
        // passes.
        for (ticket, due) in [(1, 900), (2, 1_000)] {
            state.charge_due(&l, Nanos(due * MS));
            assert_eq!(
                state.admit(
                    &l,
                    Nanos(due * MS),
                    ticket,
                    Some(Nanos(due * MS)),
                    false,
                    LEASE
                ),
                Ok(Outcome::Admitted)
            );
        }
        assert_eq!(state.queued(), 0);
    }

    #[test]
    fn a_cancelled_ticket_was_never_charged() {
        let l = limits("1/s", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let call = Cost::call(0);
        assert_eq!(
            state.acquire(&l, Nanos(0), call, None, false, None, LEASE, &mut id),
            Ok(Outcome::Admitted)
        );
        let Ok(Outcome::Queued { ticket, .. }) =
            state.acquire(&l, Nanos(0), call, None, false, None, LEASE, &mut id)
        else {
            panic!("expected a ticket")
        };
        state.cancel(Nanos(300 * MS), ticket.id(), None, LEASE);
        assert!(state.snapshot(&l, Nanos(300 * MS))[0].tokens.is(3, 10));
        assert_eq!(
            state.admit(&l, Nanos(2_000 * MS), ticket.id(), None, false, LEASE),
            Ok(Outcome::Lost)
        );
        // With the queue empty, the next call is due at once when the token exists.
        assert_eq!(
            state.acquire(
                &l,
                Nanos(1_000 * MS),
                call,
                None,
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::Admitted)
        );
    }

    #[test]
    fn a_lapsed_ticket_stops_blocking_those_behind_it() {
        let l = limits("", "10/s");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        state
            .acquire(
                &l,
                Nanos(0),
                Cost::new(0, 10),
                None,
                false,
                None,
                LEASE,
                &mut id,
            )
            .unwrap();
        // Two tickets: the first (due 1 s, to fly, so never promised) is never claimed; the
        // second (behind it, so not promised either) is due at 1.5 s.
        state
            .acquire(
                &l,
                Nanos(0),
                Cost::new(0, 10),
                None,
                true,
                None,
                LEASE,
                &mut id,
            )
            .unwrap();
        assert_eq!(
            state.acquire(
                &l,
                Nanos(0),
                Cost::new(0, 5),
                None,
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::Queued {
                ticket: Ticket::new(2),
                due_in: Duration::from_nanos(1_500 * MS),
            })
        );
        // At 1.5 s the dead ticket still holds its 10 tokens: the second must wait, behind it.
        assert!(matches!(
            state.admit(&l, Nanos(1_500 * MS), 2, None, false, LEASE),
            Ok(Outcome::Behind(_))
        ));
        // Its lease (1 s past its due) runs out at 2 s: then the second passes.
        assert_eq!(
            state.admit(&l, Nanos(2_000 * MS + 1), 2, None, false, LEASE),
            Ok(Outcome::Admitted)
        );
        assert_eq!(state.queued(), 0);
    }

    #[test]
    fn a_ticket_behind_a_late_call_is_told_so_and_a_pause_is_not_a_line() {
        let l = limits("10/s burst 1", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let call = Cost::call(0);
        state
            .acquire(&l, Nanos(0), call, None, false, None, LEASE, &mut id)
            .unwrap();
        // Tickets to fly, never promised: they ask to pass.
        for (ticket, due) in [(1, 100), (2, 200)] {
            assert_eq!(
                state.acquire(&l, Nanos(0), call, None, true, None, LEASE, &mut id),
                Ok(Outcome::Queued {
                    ticket: Ticket::new(ticket),
                    due_in: Duration::from_nanos(due * MS),
                })
            );
        }
        // The head of the line asking early is not behind anyone.
        assert_eq!(
            state.admit(&l, Nanos(50 * MS), 1, None, false, LEASE),
            Ok(Outcome::NotYet(Duration::from_nanos(50 * MS)))
        );
        // Ticket 2 is due at 200 ms, but ticket 1 has not come: were it to pass now, ticket 2
        // could pass one refill later.
        assert_eq!(
            state.admit(&l, Nanos(200 * MS), 2, None, false, LEASE),
            Ok(Outcome::Behind(Duration::from_nanos(100 * MS)))
        );
        // Nor is a ticket held up by a pause, even with calls ahead of it.
        state.penalize(
            &l,
            Nanos(200 * MS),
            Nanos(1_000 * MS),
            Currencies::ALL,
            None,
        );
        assert_eq!(
            state.admit(&l, Nanos(200 * MS), 2, None, false, LEASE),
            Ok(Outcome::NotYet(Duration::from_nanos(800 * MS)))
        );
    }

    #[test]
    fn max_wait_refuses_without_queueing() {
        let l = limits("1/m", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let mut id = ids();
        let call = Cost::call(0);
        state
            .acquire(&l, Nanos(0), call, None, false, None, LEASE, &mut id)
            .unwrap();
        assert_eq!(
            state.acquire(
                &l,
                Nanos(0),
                call,
                Some(Duration::from_secs(10)),
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::NotYet(Duration::from_nanos(60_000 * MS)))
        );
        assert_eq!(state.queued(), 0);
        assert!(state.queue.is_none());
    }

    #[test]
    fn an_empty_prompt_pays_its_request_but_a_cost_of_nothing_is_refused() {
        let l = limits("10/s", "100/m");
        let mut state = KeyState::new(&l, Nanos(0));
        assert_eq!(
            state.acquire(
                &l,
                Nanos(0),
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                None,
                LEASE,
                || 1
            ),
            Ok(Outcome::Admitted)
        );
        assert_eq!(validate(&l, Cost::new(0, 0)), Err(BucketError::ZeroCost));
    }

    #[test]
    fn debt_stops_at_64_bursts_and_extreme_rates_never_overflow() {
        let l = limits("", "18446744073709551615/730d");
        let mut state = KeyState::new(&l, Nanos(0));
        for step in 0..1_000u64 {
            state.adjust(&l, Nanos(step), Delta::from([0, i64::MIN, 0, 0]));
        }
        let w = Window {
            rate: *l.tokens().as_slice().first().unwrap(),
        };
        assert_eq!(state.real.units[0], w.floor());
        for step in 0..1_000u64 {
            state.adjust(&l, Nanos(1_000 + step), Delta::from([0, i64::MAX, 0, 0]));
        }
        assert_eq!(state.real.units[0], w.cap());
        let waited = state.acquire(
            &l,
            Nanos(u64::MAX),
            Cost::new(0, u64::MAX),
            None,
            false,
            None,
            LEASE,
            || 1,
        );
        assert_eq!(waited, Ok(Outcome::Admitted));
    }

    #[test]
    fn at_the_end_of_the_clock_a_call_that_may_not_wait_is_never_queued() {
        let l = limits("1/s", "");
        let mut state = KeyState::new(&l, Nanos(u64::MAX - 1));
        let mut id = ids();
        let end = Nanos(u64::MAX);
        assert_eq!(
            state.acquire(
                &l,
                end,
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::Admitted)
        );
        // The next token exists a second after the end of the clock: not now, and no ticket.
        assert_eq!(
            state.acquire(
                &l,
                end,
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::NotYet(Duration::from_nanos(1_000 * MS)))
        );
        assert_eq!(state.queued(), 0);
    }

    #[test]
    fn a_wait_beyond_the_clock_is_never_hinted_shorter_than_it_is() {
        // One token a year: after the burst, the next is a year away, 10^16 nanoseconds and
        // more; from 2^64 - 1 ns, far past the end of the clock.
        let l = limits("1/365d", "");
        let mut state = KeyState::new(&l, Nanos(u64::MAX));
        let mut id = ids();
        let end = Nanos(u64::MAX);
        assert!(matches!(
            state.acquire(
                &l,
                end,
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::Admitted)
        ));
        let year = 365 * 86_400 * 1_000 * MS;
        assert_eq!(
            state.acquire(
                &l,
                end,
                Cost::call(0),
                Some(Duration::ZERO),
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::NotYet(Duration::from_nanos(year)))
        );
        // Two years of debt: the exact wait passes 2^64 ns only with a long enough debt, so
        // take the window 64 bursts into debt on a rate whose refill is one unit a period.
        let slow = limits("", "1/365d burst 1000000000");
        let mut state = KeyState::new(&slow, Nanos(u64::MAX));
        state.adjust(&slow, Nanos(u64::MAX), Delta::from([0, i64::MIN, 0, 0]));
        assert_eq!(
            state.acquire(
                &slow,
                end,
                Cost::new(0, 1),
                Some(Duration::ZERO),
                false,
                None,
                LEASE,
                &mut id
            ),
            Ok(Outcome::NotYet(Duration::from_nanos(u64::MAX)))
        );
    }

    /// `op` at `at` ms, as a store runs it (promises due first).
    fn run(state: &mut KeyState, l: &Limits, at: u64, op: Op) -> Outcome {
        let mut next = 100;
        state
            .apply(l, "k", Nanos(at * MS), op, LEASE, || {
                next += 1;
                next
            })
            .unwrap()
    }

    fn requests_at(state: &mut KeyState, l: &Limits, at: u64) -> Amount {
        match run(state, l, at, Op::Snapshot) {
            Outcome::Snapshot(levels) => levels[0].tokens,
            other => panic!("a snapshot answers levels, not {other:?}"),
        }
    }

    /// A ticket at `10/s burst 1`, due at 100 ms, issued at 0 behind a call that took the
    /// burst.
    fn promised_ticket(state: &mut KeyState, l: &Limits) -> Ticket {
        let call = || Op::Acquire {
            cost: Cost::call(0),
            max_wait: None,
            fly: false,
            share: None,
        };
        assert_eq!(run(state, l, 0, call()), Outcome::Admitted);
        match run(state, l, 0, call()) {
            Outcome::Queued { ticket, due_in } => {
                assert_eq!(due_in, Duration::from_millis(100));
                assert_eq!(ticket.due(), Some(100 * MS));
                ticket
            }
            other => panic!("expected a ticket, got {other:?}"),
        }
    }

    #[test]
    fn a_promised_ticket_is_charged_at_its_due_time_and_its_holder_passes_without_a_second_charge()
    {
        let l = limits("10/s burst 1", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let ticket = promised_ticket(&mut state, &l);
        // Asking early, it hears its due time.
        assert_eq!(
            run(&mut state, &l, 40, Op::Admit { ticket, fly: false }),
            Outcome::NotYet(Duration::from_millis(60))
        );
        // Nobody asked at 100 ms, yet the snapshot at 150 ms finds it charged then: half a
        // token, not the full one a window that was never charged would hold.
        assert!(requests_at(&mut state, &l, 150).is(1, 2));
        assert_eq!(state.queued(), 0);
        // Its holder, late, passes, and is not charged again.
        assert_eq!(
            run(&mut state, &l, 160, Op::Admit { ticket, fly: false }),
            Outcome::Admitted
        );
        assert!(requests_at(&mut state, &l, 160).is(6, 10));
        // A holder that does not say when it was due can't be told it passed.
        assert_eq!(
            run(
                &mut state,
                &l,
                160,
                Op::Admit {
                    ticket: Ticket::new(ticket.id()),
                    fly: false
                }
            ),
            Outcome::Lost
        );
    }

    #[test]
    fn a_lowered_count_before_a_tickets_due_time_breaks_its_promise() {
        let l = limits("10/s burst 1", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let ticket = promised_ticket(&mut state, &l);
        run(
            &mut state,
            &l,
            50,
            Op::Lower {
                currency: Currency::Requests,
                remaining: 0,
            },
        );
        // Not charged at 100 ms: the window, emptied at 50, holds one token at 150.
        assert!(requests_at(&mut state, &l, 150).is(1, 1));
        assert_eq!(state.queued(), 1);
        // Its holder asks, as any other, and pays then.
        assert_eq!(
            run(&mut state, &l, 150, Op::Admit { ticket, fly: false }),
            Outcome::Admitted
        );
        assert!(requests_at(&mut state, &l, 150).is(0, 1));
    }

    #[test]
    fn a_pause_a_charge_or_a_refund_before_a_tickets_due_time_breaks_its_promise() {
        let l = limits("10/s burst 1", "");
        // What changed at 50 ms, whether the promise held, and what its holder hears at 100.
        let cases = [
            // A refund: its holder may ask sooner than it was due (and pass, here).
            (
                Op::Adjust {
                    delta: Delta::from([1, 0, 0, 0]),
                },
                false,
                Outcome::Admitted,
            ),
            // Half a token at 50 ms, less one: the holder asks, and hears when it can pass.
            (
                Op::Adjust {
                    delta: Delta::from([-1, 0, 0, 0]),
                },
                false,
                Outcome::NotYet(Duration::from_millis(100)),
            ),
            // A pause of 10 ms that empties nothing: over by 100 ms, and the holder, asking,
            // passes on the token there is.
            (
                Op::Penalize {
                    pause: Duration::from_millis(10),
                    spent: Currencies::NONE,
                    refusal: None,
                },
                false,
                Outcome::Admitted,
            ),
        ];
        for (op, promise_kept, heard) in cases {
            let mut state = KeyState::new(&l, Nanos(0));
            let ticket = promised_ticket(&mut state, &l);
            run(&mut state, &l, 50, op.clone());
            run(&mut state, &l, 100, Op::Ping);
            assert_eq!(state.queued() == 0, promise_kept, "{op:?}");
            assert_eq!(
                run(&mut state, &l, 100, Op::Admit { ticket, fly: false }),
                heard,
                "{op:?}"
            );
        }
    }

    #[test]
    fn a_ticket_given_up_after_it_was_charged_at_its_due_time_is_given_back() {
        let l = limits("10/s burst 1", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let ticket = promised_ticket(&mut state, &l);
        // Given up at 120 ms: charged at 100, so the caller is told to give the charge back.
        assert_eq!(
            run(&mut state, &l, 120, Op::Cancel { ticket }),
            Outcome::Admitted
        );
        // Given up before its due time, it was never charged.
        let mut state = KeyState::new(&l, Nanos(0));
        let ticket = promised_ticket(&mut state, &l);
        assert_eq!(
            run(&mut state, &l, 80, Op::Cancel { ticket }),
            Outcome::Done
        );
        assert!(requests_at(&mut state, &l, 150).is(1, 1));
    }

    #[test]
    fn a_ticket_behind_one_to_fly_is_not_promised() {
        let l = limits("10/s burst 1", "");
        let mut state = KeyState::new(&l, Nanos(0));
        let call = Cost::call(0);
        run(
            &mut state,
            &l,
            0,
            Op::Acquire {
                cost: call,
                max_wait: None,
                fly: false,
                share: None,
            },
        );
        run(
            &mut state,
            &l,
            0,
            Op::Acquire {
                cost: call,
                max_wait: None,
                fly: true,
                share: None,
            },
        );
        let Outcome::Queued { ticket, .. } = run(
            &mut state,
            &l,
            0,
            Op::Acquire {
                cost: call,
                max_wait: None,
                fly: false,
                share: None,
            },
        ) else {
            panic!("expected a ticket");
        };
        // Due at 200 ms, but the call to fly ahead has not asked: it must wait its turn.
        assert!(matches!(
            run(&mut state, &l, 200, Op::Admit { ticket, fly: false }),
            Outcome::Behind(_)
        ));
    }
}
