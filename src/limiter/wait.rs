//! Waiting for a turn: tickets, deadlines, and giving back what a call that went away took.
//!
//! A call that can't pass at once gets a ticket from the store and sleeps until it is due; a
//! [`TicketGuard`] gives the ticket up if the call is dropped. On a store that answers at once
//! (memory) every operation is synchronous, so a dropped call can't leave one half done. On a
//! remote store each operation runs in a task of its own, and a [`Delivery`] that finds its
//! caller gone gives back what the operation took: a ticket is cancelled, an admission refunded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{Limiter, Permit, unexpected};
use crate::bucket::saturate;
use crate::cost::Cost;
use crate::error::Error;
use crate::store::{Op, Outcome, Share, Store, Ticket};

/// How far past its deadline a call may still wait for a store's answer that is on its way.
const DEADLINE_GRACE: Duration = Duration::from_millis(2);

/// The store did not answer before the call's deadline.
pub(super) struct DeadlinePassed;

/// Keeps the waiter count right however the wait ends, including when the future is dropped.
struct WaiterSlot<'a>(&'a AtomicUsize);

impl<'a> WaiterSlot<'a> {
    fn new(count: &'a AtomicUsize) -> WaiterSlot<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        WaiterSlot(count)
    }
}

impl Drop for WaiterSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Gives the ticket up unless the call was admitted.
struct TicketGuard<'a, S: Store> {
    limiter: &'a Limiter<S>,
    ticket: Option<Ticket>,
    /// Its lane in the limiter's [`Line`](super::line::Line).
    lane: u64,
    /// What the call would pay, given back if its ticket was charged at its due time.
    cost: Cost,
    /// A question about the ticket is on its way: if the call goes away meanwhile, the answer's
    /// [`Delivery`] gives the ticket up (or back), knowing what came of it.
    asking: bool,
}

impl<S: Store> Drop for TicketGuard<'_, S> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            if !self.asking {
                self.limiter.give_up_in_background(ticket, self.cost);
            }
            self.limiter.inner.line.moved((self.lane, ticket.id()));
        }
    }
}

/// A store's answer on its way to a caller that may have gone: dropped undelivered, it gives
/// back what the operation took.
struct Delivery<S: Store> {
    limiter: Limiter<S>,
    op: Op,
    /// What an admission charged, to refund if nobody takes it.
    charged: Cost,
    result: Option<Result<Outcome, Error>>,
}

impl<S: Store> Delivery<S> {
    fn take(&mut self) -> Result<Outcome, Error> {
        self.result
            .take()
            .unwrap_or_else(|| Err(Error::store("an answer was delivered twice", None)))
    }
}

impl<S: Store> Drop for Delivery<S> {
    fn drop(&mut self) {
        let undo = match (&self.op, self.result.take()) {
            (_, Some(Ok(Outcome::Queued { ticket, .. }))) => {
                return self.limiter.give_up_in_background(ticket, self.charged);
            }
            // A holder that went away while it asked: its ticket is still held, or its
            // question failed and it may be.
            (
                Op::Admit { ticket, .. },
                Some(Ok(Outcome::NotYet(_) | Outcome::Behind(_)) | Err(_)),
            ) => {
                return self.limiter.give_up_in_background(*ticket, self.charged);
            }
            (Op::Acquire { .. } | Op::Admit { .. }, Some(Ok(Outcome::Admitted))) => Op::Adjust {
                delta: self.charged.per_currency().map(saturate::<u64, i64>),
            },
            // A call that never went out used nothing: all of it back, and it is done.
            (Op::Acquire { .. } | Op::Admit { .. }, Some(Ok(Outcome::Flying(flight)))) => {
                Op::Settle {
                    flight,
                    charged: self.charged,
                    used: crate::rate::PerCurrency::splat(Some(0)),
                    last: true,
                    counted_after: Duration::ZERO,
                }
            }
            _ => return,
        };
        self.limiter.settle_in_background(undo);
    }
}

/// The sleep before asking again after `attempt` earlier failed asks. The first retry is
/// exact: the waiter is first in line (those behind hear [`Outcome::Behind`]), so there is no
/// herd to spread, and the usual reason is that the call ahead passed a little late, which
/// jitter would only make worse. From the second on, jitter grows as
/// [`Backoff`](crate::Backoff) says: something keeps taking what the schedule promised (a
/// settlement in debt, a provider's lower count, another process), or a pause holds the key.
fn retry_sleep(backoff: crate::backoff::Backoff, hint: Duration, attempt: u32) -> Duration {
    match attempt {
        0 => hint,
        n => backoff.sleep_for(hint, n - 1),
    }
}

/// A tokio timer fires on a millisecond tick, and on a busy or virtual machine often later
/// (here a 3.7 ms sleep overshot by 1.5 ms at the median and up to 5 ms). The sleep that must
/// end when tokens exist (the first in line asking again, whose hint is exact) arms its timer
/// this long before its end and yields the rest of the way: on a fast key with a small burst
/// every millisecond late is throughput lost, and the lateness adds up along the line. The
/// price is one task per key yielding for a few milliseconds per retry; those behind it sleep
/// on timers (and are nudged), so that a long line never spins.
const YIELD_WITHIN: Duration = Duration::from_millis(4);

/// How long past its hint a waiter behind a call of its own limiter waits for that call's
/// nudge before asking anyway (the nudge normally comes first). A ticket's lease runs from its
/// hint, so any lease longer than this keeps the place.
const LINE_PATIENCE: Duration = Duration::from_millis(100);

/// Why a waiter woke.
#[derive(Debug)]
enum Woke {
    /// Its sleep (or the deadline) ran out.
    Timer,
    /// The call ahead of it passed.
    Nudged,
}

/// Sleeps until `wake`, cut short by a store failure (answered with it) or by `nudge`. A
/// `precise` sleep (the first in line, whose tokens exist at `wake`) arms its timer
/// [`YIELD_WITHIN`] early and yields the rest of the way.
async fn doze(
    wake: Instant,
    mut failures: Option<&mut watch::Receiver<Option<Arc<Error>>>>,
    nudge: Option<&Notify>,
    precise: bool,
) -> Result<Woke, Error> {
    let now = Instant::now();
    let timer = if precise {
        wake.checked_sub(YIELD_WITHIN).unwrap_or(wake).max(now)
    } else {
        wake
    };
    if timer > now {
        let sleep = tokio::time::sleep_until(timer);
        tokio::pin!(sleep);
        let nudged = async {
            match nudge {
                Some(nudge) => nudge.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(nudged);
        loop {
            let failed = async {
                match failures.as_deref_mut() {
                    Some(rx) => rx
                        .changed()
                        .await
                        .ok()
                        .map(|()| rx.borrow_and_update().clone()),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                failure = failed => match failure {
                    Some(Some(err)) => return Err(err.duplicate()),
                    // A recovery, or the sender gone: nothing to hear any more.
                    Some(None) => {}
                    None => failures = None,
                },
                () = &mut nudged => return Ok(Woke::Nudged),
                () = &mut sleep => break,
            }
        }
    }
    if timer < wake && !yield_until(wake).await {
        tokio::time::sleep_until(wake).await;
    }
    Ok(Woke::Timer)
}

/// Yields until `wake`, and answers whether it got there. A clock that does not move across a
/// yield is paused (a test's): then it answers `false` at once, and the caller's timer
/// advances it.
async fn yield_until(wake: Instant) -> bool {
    let mut last = Instant::now();
    while last < wake {
        tokio::task::yield_now().await;
        let now = Instant::now();
        if now == last {
            return false;
        }
        last = now;
    }
    true
}

impl<S: Store> Limiter<S> {
    /// Runs `op` on the store, within `deadline` (plus a hair for an answer on its way). On a
    /// remote store the operation runs in a task of its own, so that a caller that goes away
    /// midway leaves nothing taken: see [`Delivery`].
    pub(super) async fn call(
        &self,
        op: Op,
        charged: Cost,
        deadline: Option<Instant>,
    ) -> Result<Result<Outcome, Error>, DeadlinePassed> {
        let inner = &self.inner;
        if let Some(result) = inner.store.apply_now(&inner.bound, op.clone()) {
            return Ok(result);
        }
        if tokio::runtime::Handle::try_current().is_err() {
            // Not on a tokio runtime: no task to finish the operation if the caller leaves, but
            // the operation itself still runs.
            let result = inner.store.apply(&inner.bound, op).await;
            inner.note(&result);
            return Ok(result);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let limiter = self.clone();
        tokio::spawn(async move {
            let result = limiter
                .inner
                .store
                .apply(&limiter.inner.bound, op.clone())
                .await;
            limiter.inner.note(&result);
            // If the caller went away, the delivery comes back here and is dropped, giving back
            // what the operation took.
            let _ = tx.send(Delivery {
                limiter,
                op,
                charged,
                result: Some(result),
            });
        });
        let delivered = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline + DEADLINE_GRACE, rx).await {
                Ok(delivered) => delivered,
                Err(_) => return Err(DeadlinePassed),
            },
            None => rx.await,
        };
        Ok(match delivered {
            Ok(mut delivery) => delivery.take(),
            Err(_) => Err(Error::store(
                "the task running the store call ended without an answer",
                None,
            )),
        })
    }

    /// Runs `op` with no deadline but the store's own timeout.
    pub(super) async fn call_bounded(&self, op: Op) -> Result<Outcome, Error> {
        let charged = match op {
            Op::Acquire { cost, .. } => cost,
            _ => Cost::default(),
        };
        match self.call(op, charged, None).await {
            Ok(result) => result,
            Err(DeadlinePassed) => Err(Error::store("no deadline, yet one passed", None)),
        }
    }

    /// Runs `op` without waiting for it: at once on a store that answers at once, else in a
    /// task of its own (when there is a runtime to run it).
    pub(crate) fn settle_in_background(&self, op: Op) {
        let inner = &self.inner;
        if inner.store.apply_now(&inner.bound, op.clone()).is_some() {
            return;
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            let limiter = self.clone();
            tokio::spawn(async move {
                let result = limiter.inner.store.apply(&limiter.inner.bound, op).await;
                limiter.inner.note(&result);
                if let Err(err) = result {
                    tracing::warn!(key = %limiter.inner.key, error = %err, "could not give back what a dropped call took");
                }
            });
        }
    }

    /// Gives `ticket` up without waiting for it: cancelled, and, if it was promised and
    /// charged at its due time already, `cost` given back.
    fn give_up_in_background(&self, ticket: Ticket, cost: Cost) {
        let refund = Op::Adjust {
            delta: cost.per_currency().map(saturate::<u64, i64>),
        };
        let inner = &self.inner;
        if let Some(result) = inner.store.apply_now(&inner.bound, Op::Cancel { ticket }) {
            if let Ok(Outcome::Admitted) = result {
                self.settle_in_background(refund);
            }
            return;
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            let limiter = self.clone();
            tokio::spawn(async move {
                let bound = &limiter.inner.bound;
                let result = limiter
                    .inner
                    .store
                    .apply(bound, Op::Cancel { ticket })
                    .await;
                limiter.inner.note(&result);
                let result = match result {
                    Ok(Outcome::Admitted) => limiter.inner.store.apply(bound, refund).await,
                    other => other,
                };
                if let Err(err) = result {
                    tracing::warn!(key = %limiter.inner.key, error = %err, "could not give back what a dropped call took");
                }
            });
        }
    }

    pub(super) fn timeout(&self, start: Instant, needed: Option<Duration>) -> Error {
        self.meters().timeouts.increment(1);
        Error::Timeout {
            key: self.inner.key.clone(),
            waited: Instant::now().saturating_duration_since(start),
            needed,
        }
    }

    /// The answer of a call, or the timeout it turned into.
    fn answer(
        &self,
        called: Result<Result<Outcome, Error>, DeadlinePassed>,
        start: Instant,
    ) -> Result<Outcome, Error> {
        match called {
            Ok(result) => result,
            Err(DeadlinePassed) => Err(self.timeout(start, None)),
        }
    }

    fn remaining(deadline: Option<Instant>) -> Option<Duration> {
        deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether a wait of `hint` passes the deadline for sure: it does not when calls in
    /// flight will still settle, since their refunds may make the tokens exist sooner.
    fn certainly_late(&self, hint: Duration, deadline: Option<Instant>) -> bool {
        Self::remaining(deadline).is_some_and(|left| hint > left) && !self.refunds_may_come()
    }

    /// The permit for an admission (with its number among the calls in flight, if any).
    pub(super) fn passed(
        &self,
        outcome: &Outcome,
        cost: Cost,
        waited: Duration,
    ) -> Option<Permit<S>> {
        match outcome {
            Outcome::Admitted => Some(self.admitted(cost, waited, None)),
            Outcome::Flying(flight) => Some(self.admitted(cost, waited, Some(*flight))),
            _ => None,
        }
    }

    /// Waits for a turn (see [`Limiter::acquire_until`]); with `fly`, the admitted call is
    /// remembered as in flight. The first question takes a ticket or passes at once; a call
    /// given a ticket then runs the [`Stage`]s of a [`Waiter`] until it passes or gives up.
    pub(super) async fn wait(
        &self,
        cost: Cost,
        start: Instant,
        deadline: Option<Instant>,
        fly: bool,
        share: Option<&Share>,
    ) -> Result<Permit<S>, Error> {
        let full = self.waiters() >= self.inner.policy.max_waiters();
        let max_wait = if full {
            Some(Duration::ZERO)
        } else {
            self.max_wait(deadline)
        };
        let op = Op::Acquire {
            cost,
            max_wait,
            fly,
            share: share.cloned(),
        };
        let outcome = self.answer(self.call(op, cost, deadline).await, start)?;
        // Admitted at the first answer: it did not wait.
        if let Some(permit) = self.passed(&outcome, cost, Duration::ZERO) {
            return Ok(permit);
        }
        let (ticket, due_in) = match outcome {
            Outcome::NotYet(_) if full => {
                return Err(Error::QueueFull {
                    key: self.inner.key.clone(),
                    limit: self.inner.policy.max_waiters(),
                });
            }
            Outcome::NotYet(needed) => return Err(self.timeout(start, Some(needed))),
            Outcome::Queued { ticket, due_in } => (ticket, due_in),
            other => return Err(unexpected(&other)),
        };
        let _slot = WaiterSlot::new(&self.inner.waiters);
        // How the call ahead tells this one it passed (see `Line`), and how a refund rings it.
        let nudge = Arc::new(Notify::new());
        let lane = super::line::lane(share);
        self.inner.line.join((lane, ticket.id()), &nudge);
        self.ensure_watchdog();
        let mut waiter = Waiter {
            limiter: self,
            cost,
            start,
            deadline,
            fly,
            share: share.cloned(),
            guard: TicketGuard {
                limiter: self,
                ticket: Some(ticket),
                lane,
                cost,
                asking: false,
            },
            failures: self.inner.health().map(|h| h.subscribe()),
            nudge,
            attempt: 0,
        };
        // A ticket not to fly may be promised: at its due time it asks at once, whoever is
        // ahead of it, and passes without the store's transitions if the promise held.
        let first = if fly {
            Stage::Sleeping {
                sleep: due_in,
                precise: false,
            }
        } else {
            Stage::Due { sleep: due_in }
        };
        waiter.run(first).await
    }

    /// The longest a call may be queued for: none while refunds may still come (the schedule
    /// assumes none, and calls in flight may give some back), else until the deadline.
    fn max_wait(&self, deadline: Option<Instant>) -> Option<Duration> {
        if self.refunds_may_come() {
            None
        } else {
            Self::remaining(deadline)
        }
    }
}

/// Where a waiting call stands between two questions to the store. Every stage but
/// [`Asking`](Stage::Asking) and [`Rejoining`](Stage::Rejoining) is a sleep that the deadline
/// cuts short (a [`Error::Timeout`]) and a store failure ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Sleeps until its new ticket is due, then asks, whoever is ahead: a promised ticket
    /// passes at its due time, and its holder is told so. A ring makes it ask at once.
    Due { sleep: Duration },
    /// Sleeps until its ticket is due, or until an answer's hint: `precise` when it is first
    /// in line and its tokens exist at the hint. A ring (a refund or a penalty planning the
    /// line again) makes it ask at once.
    Sleeping { sleep: Duration, precise: bool },
    /// Told it is behind calls that have yet to pass: sleeps until the hint, or until the call
    /// ahead of it (of this limiter) nudges it as it passes.
    Behind { sleep: Duration },
    /// Due, but a call of this limiter is still ahead, so asking would only hear `Behind`: it
    /// waits for that call's nudge instead. The timer ([`LINE_PATIENCE`]) only keeps the
    /// ticket's lease alive if that call is held up; when it fires, the waiter asks anyway.
    Standing,
    /// Asks to pass. `rung`: it asks because the windows changed, not because it was due, so
    /// a "not yet" is no failed attempt and its hint is exact.
    Asking { rung: bool },
    /// Its ticket lapsed (its runtime was too busy to ask in time): it takes a new place, at
    /// the back.
    Rejoining,
}

impl Stage {
    /// The stage after a sleep that ended by `woke` (not by the deadline). `stand_if_behind`
    /// answers whether a call of this limiter is ahead, and if so stands for its nudge.
    fn woke(self, woke: Woke, stand_if_behind: impl FnOnce() -> bool) -> Stage {
        match (self, woke) {
            // Sleeping until due (or a hint), a nudge is a ring: the line is planned again.
            (Stage::Sleeping { .. } | Stage::Due { .. }, Woke::Nudged) => {
                Stage::Asking { rung: true }
            }
            (Stage::Due { .. }, Woke::Timer) => Stage::Asking { rung: false },
            // Behind or standing, the nudge is the call ahead passing: its turn.
            (Stage::Behind { .. } | Stage::Standing, Woke::Nudged) => Stage::Asking { rung: false },
            // Stood once already: ask, which renews the lease however long the call ahead takes.
            (Stage::Standing, Woke::Timer) => Stage::Asking { rung: false },
            (_, Woke::Timer) if stand_if_behind() => Stage::Standing,
            _ => Stage::Asking { rung: false },
        }
    }

    /// The stage after a question the store answered with `outcome` (neither admitted nor
    /// lost), for a waiter that has failed `attempt` times; `ours_ahead`: a call of this
    /// limiter is ahead of it.
    fn answered(
        rung: bool,
        outcome: Waited,
        ours_ahead: bool,
        backoff: crate::backoff::Backoff,
        attempt: &mut u32,
    ) -> Stage {
        match outcome {
            // Not a failed attempt: the line is slower than its schedule. Behind a call of
            // this limiter, its nudge will come, and the timer only keeps the ticket's lease;
            // behind one of another process, the hint is all there is.
            Waited::Behind(hint) if ours_ahead => Stage::Behind {
                sleep: hint.saturating_add(LINE_PATIENCE),
            },
            Waited::Behind(hint) => Stage::Behind { sleep: hint },
            // Rung because the windows changed, and not enough yet: the hint is exact.
            Waited::NotYet(hint) if rung => Stage::Sleeping {
                sleep: hint,
                precise: true,
            },
            Waited::NotYet(hint) => {
                let stage = Stage::Sleeping {
                    sleep: retry_sleep(backoff, hint, *attempt),
                    precise: *attempt == 0,
                };
                *attempt = attempt.saturating_add(1);
                stage
            }
        }
    }
}

/// An answer that leaves a waiter waiting, with its hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    Behind(Duration),
    NotYet(Duration),
}

/// One call holding a ticket, and what it needs to run its [`Stage`]s.
struct Waiter<'a, S: Store> {
    limiter: &'a Limiter<S>,
    cost: Cost,
    start: Instant,
    deadline: Option<Instant>,
    fly: bool,
    /// Whose call it is, at a key tenants share.
    share: Option<Share>,
    guard: TicketGuard<'a, S>,
    failures: Option<watch::Receiver<Option<Arc<Error>>>>,
    /// How the call ahead (or a ring) wakes it.
    nudge: Arc<Notify>,
    /// Questions answered "not yet" without a ring, for the backoff.
    attempt: u32,
}

impl<S: Store> Waiter<'_, S> {
    /// Runs the stages from `stage` until the call passes or fails.
    async fn run(&mut self, mut stage: Stage) -> Result<Permit<S>, Error> {
        loop {
            stage = match stage {
                Stage::Due { sleep } => self.sleep(stage, sleep, false).await?,
                Stage::Sleeping { sleep, precise } => self.sleep(stage, sleep, precise).await?,
                Stage::Behind { sleep } => self.sleep(stage, sleep, false).await?,
                Stage::Standing => self.sleep(stage, LINE_PATIENCE, false).await?,
                Stage::Asking { rung } => match self.ask(rung).await? {
                    Ok(permit) => return Ok(permit),
                    Err(next) => next,
                },
                Stage::Rejoining => match self.rejoin().await? {
                    Ok(permit) => return Ok(permit),
                    Err(next) => next,
                },
            };
        }
    }

    fn ticket(&self) -> Result<Ticket, Error> {
        self.guard
            .ticket
            .ok_or_else(|| Error::store("a waiting call lost its ticket", None))
    }

    /// Its ticket's place in the limiter's line.
    fn spot(&self) -> Result<super::line::Spot, Error> {
        Ok((self.guard.lane, self.ticket()?.id()))
    }

    /// Sleeps `sleep` in `stage` (cut short by the deadline, a failure or a nudge), and
    /// answers the stage after it.
    async fn sleep(
        &mut self,
        stage: Stage,
        sleep: Duration,
        precise: bool,
    ) -> Result<Stage, Error> {
        let ticket = self.spot()?;
        let target = Instant::now().checked_add(sleep);
        let wake = match (target, self.deadline) {
            (Some(t), Some(d)) => t.min(d),
            (Some(t), None) => t,
            (None, Some(d)) => d,
            (None, None) => Instant::now() + Duration::from_secs(86_400 * 365),
        };
        let line = &self.limiter.inner.line;
        line.wakes_at(ticket, wake);
        let woke = doze(wake, self.failures.as_mut(), Some(&*self.nudge), precise).await?;
        if matches!(woke, Woke::Timer) && target.is_none_or(|t| t > wake) {
            // Woken by the deadline before the turn came: it will not come in time.
            let needed = target.map(|t| t.saturating_duration_since(wake));
            return Err(self.limiter.timeout(self.start, needed));
        }
        Ok(stage.woke(woke, || line.stand_if_behind(ticket, &self.nudge)))
    }

    /// Asks to pass: the permit, or the stage after the answer.
    async fn ask(&mut self, rung: bool) -> Result<Result<Permit<S>, Stage>, Error> {
        let limiter = self.limiter;
        let ticket = self.ticket()?;
        let spot = self.spot()?;
        // Standing before asking: a call ahead that passes while the answer is on its way
        // leaves its nudge, and a waiter told it is behind acts on it at once.
        limiter.inner.line.stand(spot, &self.nudge);
        let op = Op::Admit {
            ticket,
            fly: self.fly,
        };
        self.guard.asking = true;
        let called = limiter.call(op, self.cost, self.deadline).await;
        // A deadline that passed before the answer leaves the ticket to the answer's delivery.
        if called.is_err() {
            self.guard.ticket = None;
            limiter.inner.line.moved(spot);
        }
        self.guard.asking = false;
        let outcome = limiter.answer(called, self.start)?;
        if let Some(permit) = limiter.passed(&outcome, self.cost, self.start.elapsed()) {
            self.guard.ticket = None;
            limiter.inner.line.moved(spot);
            return Ok(Ok(permit));
        }
        let waited = match outcome {
            Outcome::Behind(hint) => Waited::Behind(hint),
            Outcome::NotYet(hint) => {
                limiter.inner.line.sit(spot);
                Waited::NotYet(hint)
            }
            Outcome::Lost => return Ok(Err(Stage::Rejoining)),
            other => return Err(unexpected(&other)),
        };
        let (Waited::Behind(hint) | Waited::NotYet(hint)) = waited;
        if limiter.certainly_late(hint, self.deadline) {
            return Err(limiter.timeout(self.start, Some(hint)));
        }
        let ours_ahead = limiter.inner.line.has_ahead(spot);
        let backoff = limiter.inner.policy.backoff();
        Ok(Err(Stage::answered(
            rung,
            waited,
            ours_ahead,
            backoff,
            &mut self.attempt,
        )))
    }

    /// Gives up the lapsed ticket and takes a new place: the permit if it passes at once, or
    /// the stage of the new ticket.
    async fn rejoin(&mut self) -> Result<Result<Permit<S>, Stage>, Error> {
        let limiter = self.limiter;
        if let Some(lapsed) = self.guard.ticket.take() {
            limiter.inner.line.moved((self.guard.lane, lapsed.id()));
        }
        let op = Op::Acquire {
            cost: self.cost,
            max_wait: limiter.max_wait(self.deadline),
            fly: self.fly,
            share: self.share.clone(),
        };
        let called = limiter.call(op, self.cost, self.deadline).await;
        let outcome = limiter.answer(called, self.start)?;
        if let Some(permit) = limiter.passed(&outcome, self.cost, self.start.elapsed()) {
            return Ok(Ok(permit));
        }
        match outcome {
            Outcome::Queued { ticket, due_in } => {
                limiter
                    .inner
                    .line
                    .join((self.guard.lane, ticket.id()), &self.nudge);
                self.guard.ticket = Some(ticket);
                let backoff = limiter.inner.policy.backoff();
                let sleep = backoff.sleep_for(due_in, self.attempt);
                self.attempt = self.attempt.saturating_add(1);
                Ok(Err(Stage::Sleeping {
                    sleep,
                    precise: false,
                }))
            }
            Outcome::NotYet(needed) => Err(limiter.timeout(self.start, Some(needed))),
            other => Err(unexpected(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_waiter_due_behind_a_call_of_its_own_limiter_stands_once_then_asks() {
        let due = Stage::Sleeping {
            sleep: MS,
            precise: false,
        };
        assert_eq!(due.woke(Woke::Timer, || true), Stage::Standing);
        assert_eq!(
            due.woke(Woke::Timer, || false),
            Stage::Asking { rung: false }
        );
        // Standing, it asks when nudged, and when its patience runs out, without standing
        // again (so that the ticket's lease is renewed).
        let stood = Stage::Standing;
        assert_eq!(
            stood.woke(Woke::Nudged, || true),
            Stage::Asking { rung: false }
        );
        assert_eq!(
            stood.woke(Woke::Timer, || true),
            Stage::Asking { rung: false }
        );
        // Told it is behind, a nudge is its turn, not a ring.
        let behind = Stage::Behind { sleep: MS };
        assert_eq!(
            behind.woke(Woke::Nudged, || false),
            Stage::Asking { rung: false }
        );
        assert_eq!(behind.woke(Woke::Timer, || true), Stage::Standing);
    }

    #[test]
    fn a_rung_waiter_that_hears_not_yet_sleeps_the_exact_hint_and_no_attempt_is_counted() {
        let due = Stage::Sleeping {
            sleep: MS,
            precise: false,
        };
        assert_eq!(
            due.woke(Woke::Nudged, || true),
            Stage::Asking { rung: true }
        );
        let backoff = crate::backoff::Backoff::default();
        let mut attempt = 3;
        let hint = 7 * MS;
        assert_eq!(
            Stage::answered(true, Waited::NotYet(hint), false, backoff, &mut attempt),
            Stage::Sleeping {
                sleep: hint,
                precise: true,
            }
        );
        assert_eq!(attempt, 3);
    }

    #[test]
    fn a_first_not_yet_retries_at_the_exact_hint_and_later_ones_back_off() {
        let backoff = crate::backoff::Backoff::default();
        let mut attempt = 0;
        let hint = 7 * MS;
        assert_eq!(
            Stage::answered(false, Waited::NotYet(hint), false, backoff, &mut attempt),
            Stage::Sleeping {
                sleep: hint,
                precise: true,
            }
        );
        assert_eq!(attempt, 1);
        let Stage::Sleeping { sleep, precise } =
            Stage::answered(false, Waited::NotYet(hint), false, backoff, &mut attempt)
        else {
            panic!("a waiter told not yet sleeps");
        };
        assert!(sleep >= hint && !precise);
        assert_eq!(attempt, 2);
    }

    #[test]
    fn a_waiter_behind_a_call_of_its_own_limiter_keeps_its_lease_past_the_hint() {
        let backoff = crate::backoff::Backoff::default();
        let mut attempt = 0;
        let hint = 7 * MS;
        assert_eq!(
            Stage::answered(false, Waited::Behind(hint), true, backoff, &mut attempt),
            Stage::Behind {
                sleep: hint + LINE_PATIENCE
            }
        );
        assert_eq!(
            Stage::answered(true, Waited::Behind(hint), false, backoff, &mut attempt),
            Stage::Behind { sleep: hint }
        );
        assert_eq!(attempt, 0);
    }
}
