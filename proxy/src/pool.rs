//! Choosing where a call goes: its upstream, or the member of its pool that can admit it
//! soonest. Members that failed the call are passed over by it; members that keep failing are
//! ejected for a while; a member's own budget is paid by the member that serves the call.
//! Each attempt asks once, and is handed its turn: the member, the call admitted there, and
//! how many other members it could still move to.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::http::{Attempts, Call};

use crate::answer::Reject;
use crate::config::Family;
use crate::exchange::CallPool;
use crate::state::{ReadyUpstream, Shared, key_of};

/// A call's pool, as that call sees it: its members, those that failed it, and the pool's
/// rules.
pub(crate) struct Members<'a> {
    pub(crate) shared: &'a Shared,
    /// The client's head (an Azure member's key is named after the deployment in its path).
    pub(crate) client: &'a http::request::Parts,
    pub(crate) pool: CallPool,
    /// The members that failed the call.
    pub(crate) failed: Vec<String>,
}

/// An attempt's turn at a member, as the pool hands it back.
pub(crate) struct Turn {
    pub(crate) member: Arc<ReadyUpstream>,
    /// The call, admitted at the member's key (and paid from its budget).
    pub(crate) call: Call,
    /// Members other than this one the call could still move to (not failed it, not
    /// ejected); none without a pool.
    pub(crate) others: usize,
    /// Whether a member the call has not yet failed at is left beside this one.
    pub(crate) another: bool,
    /// Whether the call has a pool.
    pub(crate) pooled: bool,
    /// How long one attempt may wait for its first byte, where the pool says.
    pub(crate) attempt_timeout: Option<Duration>,
}

/// Why a call was not admitted at its upstream, or at any member of its pool.
pub(crate) enum NotAdmitted {
    /// The gate's refusal (the wait would pass the deadline, the store is down, ...).
    Gate(tollgate::Error),
    /// Every member's own budget is spent.
    Budget(Reject),
}

impl<'a> Members<'a> {
    /// Whether a member the call has not yet failed at is left.
    pub(crate) fn any_left(&self) -> bool {
        self.pool.members.len() > self.failed.len()
    }

    /// The model a member's key is named after.
    fn model<'m>(&'m self, attempts: &'m Attempts, family: Family) -> Option<&'m str> {
        match family {
            Family::Azure => crate::state::model_of(family, self.client, &serde_json::Value::Null),
            _ => attempts.estimated().model(),
        }
    }

    /// The next attempt's turn: its member (the call's upstream, without a pool), its call
    /// there, admitted, and how many other members it could still move to. The key it was
    /// admitted at is counted as seen and admitted.
    pub(crate) async fn admit(
        &mut self,
        attempts: &mut Attempts,
        current: &Arc<ReadyUpstream>,
    ) -> Result<Turn, NotAdmitted> {
        let pooled = !self.pool.members.is_empty();
        // Whether a member the call has not yet failed at is left beside the one it goes to.
        let another = self.pool.members.len() > self.failed.len() + 1;
        let (member, call) = if pooled {
            self.choose(attempts).await?
        } else {
            let key = attempts.estimated().key();
            self.shared
                .carry(key.split('@').next().unwrap_or(key))
                .await;
            let call = attempts.admit().await.map_err(NotAdmitted::Gate)?;
            (Arc::clone(current), call)
        };
        let others = if pooled { self.others(&member) } else { 0 };
        member.saw_key(call.key());
        self.shared.live.admitted(call.key());
        Ok(Turn {
            member,
            call,
            others,
            another,
            pooled,
            attempt_timeout: self.pool.attempt_timeout,
        })
    }

    /// The member of a pool the next attempt goes to, and its call there: the first member
    /// (from a rotating start) that can admit it now, else the one that can soonest (a member
    /// paused by its provider waits out its pause there). Members ejected for failing are
    /// passed over while another can take the call, and so are members whose own budget can't
    /// pay for it; the member chosen pays its budget with the call.
    async fn choose(
        &mut self,
        attempts: &mut Attempts,
    ) -> Result<(Arc<ReadyUpstream>, Call), NotAdmitted> {
        let mut best: Option<(Arc<ReadyUpstream>, Duration)> = None;
        let mut failure = None;
        let mut spent = None;
        for member in self.candidates() {
            let budget = match crate::admit::member_budget(self.shared, &member, attempts).await {
                Ok(budget) => budget,
                Err(refused) => {
                    spent = Some(refused);
                    continue;
                }
            };
            self.switch(attempts, &member);
            match attempts.admit_now().await {
                Ok(call) => return Ok((member, paid(call, budget))),
                Err(tollgate::Error::Timeout { needed, .. }) => {
                    refund(budget).await;
                    let wait = soonest(&member, attempts, needed);
                    if best.as_ref().is_none_or(|(_, b)| wait < *b) {
                        best = Some((member, wait));
                    }
                }
                Err(err) => {
                    refund(budget).await;
                    failure = Some(err);
                }
            }
        }
        let Some((member, _)) = best else {
            return Err(match (failure, spent) {
                (Some(err), _) => NotAdmitted::Gate(err),
                (None, Some(spent)) => NotAdmitted::Budget(spent),
                (None, None) => NotAdmitted::Gate(tollgate::Error::NoLimits {
                    key: "pool".to_owned(),
                }),
            });
        };
        self.wait_at(attempts, member).await
    }

    /// The members to ask, from a rotating start: those that have not failed the call and are
    /// not ejected; every member ejected, they are tried all the same (a pool never refuses
    /// for that).
    fn candidates(&self) -> Vec<Arc<ReadyUpstream>> {
        let now = Instant::now();
        let untried: Vec<Arc<ReadyUpstream>> = self
            .pool
            .members
            .iter()
            .filter(|m| !self.failed.contains(&m.name))
            .cloned()
            .collect();
        let healthy: Vec<Arc<ReadyUpstream>> = untried
            .iter()
            .filter(|m| !m.health.ejected(now))
            .cloned()
            .collect();
        let mut candidates = if !healthy.is_empty() {
            healthy
        } else if !untried.is_empty() {
            untried
        } else {
            self.pool.members.clone()
        };
        let start = self.shared.next_member.fetch_add(1, Ordering::Relaxed);
        let count = candidates.len();
        candidates.rotate_left(start % count);
        candidates
    }

    /// Points the call's attempts at `member`'s gate and key.
    fn switch(&self, attempts: &mut Attempts, member: &ReadyUpstream) {
        let key = key_of(
            &member.config,
            &member.profile,
            self.model(attempts, member.family),
        );
        attempts.switch(&member.gate, key);
    }

    /// Waits in `member`'s line, its budget paid first.
    async fn wait_at(
        &self,
        attempts: &mut Attempts,
        member: Arc<ReadyUpstream>,
    ) -> Result<(Arc<ReadyUpstream>, Call), NotAdmitted> {
        let budget = crate::admit::member_budget(self.shared, &member, attempts)
            .await
            .map_err(NotAdmitted::Budget)?;
        self.switch(attempts, &member);
        let admitted = {
            let _choosing = Choosing::new(&member);
            attempts.admit().await
        };
        match admitted {
            Ok(call) => Ok((member, paid(call, budget))),
            Err(err) => {
                refund(budget).await;
                Err(NotAdmitted::Gate(err))
            }
        }
    }

    /// Members other than `member` this call could still move to (not failed it, not ejected).
    fn others(&self, member: &ReadyUpstream) -> usize {
        let now = Instant::now();
        self.pool
            .members
            .iter()
            .filter(|m| m.name != member.name && !self.failed.contains(&m.name))
            .filter(|m| !m.health.ejected(now))
            .count()
    }

    /// The call moves on from `member` without counting it toward its ejection (a 429 that
    /// will pass: the member is paused, not failing).
    pub(crate) fn pass_over(&mut self, member: &ReadyUpstream) {
        self.failed.push(member.name.clone());
    }

    /// The member failed this call (a 5xx, no first byte in time, no connection): it is passed
    /// over by this call, and counted toward its ejection.
    pub(crate) fn member_failed(&mut self, member: &ReadyUpstream, spent_quota: bool) {
        self.failed.push(member.name.clone());
        let now = Instant::now();
        let ejected = if spent_quota {
            member.health.spent(now, self.pool.ejection)
        } else {
            member.health.failed(now, self.pool.ejection)
        };
        if let Some(time) = ejected {
            member.metrics.ejected.increment(1);
            tracing::warn!(upstream = %member.name, ?time, "a pool member keeps failing: passed over for a while");
        }
    }
}

/// The call, carrying the member's budget permit when it keeps one.
fn paid(mut call: Call, budget: Option<tollgate::Permit>) -> Call {
    if let Some(budget) = budget {
        call.attach(budget);
    }
    call
}

async fn refund(budget: Option<tollgate::Permit>) {
    if let Some(budget) = budget {
        crate::admit::refund(budget).await;
    }
}

/// How soon `member` could admit the call it just refused "now". Without `needed`, the
/// store's answer came too late for "now" (a round trip to a busy Redis): the member may well
/// have room, and is as good a choice as any. (Read as never, it sent the call to a member
/// that had none, and a fleet's test saw 429s with a member free.) Calls that chose the member
/// a moment ago and are still on their way to its line wait ahead of this one too: in a burst
/// every call asks before any joins, and without them most of a burst chose the same member.
fn soonest(member: &ReadyUpstream, attempts: &Attempts, needed: Option<Duration>) -> Duration {
    let ahead = member.choosing.load(Ordering::Acquire);
    needed.unwrap_or(Duration::ZERO).saturating_add(
        call_time(member, attempts).saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX)),
    )
}

/// A call that chose a pool member to wait for, counted until it is admitted (or gives up).
struct Choosing<'a>(&'a ReadyUpstream);

impl<'a> Choosing<'a> {
    fn new(member: &'a ReadyUpstream) -> Choosing<'a> {
        member
            .choosing
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Choosing(member)
    }
}

impl Drop for Choosing<'_> {
    fn drop(&mut self) {
        self.0
            .choosing
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// How long `member`'s windows take to refill what the call in `attempts` costs there: what
/// each call ahead of it in the member's line adds to its wait.
fn call_time(member: &ReadyUpstream, attempts: &Attempts) -> Duration {
    let estimated = attempts.estimated();
    let Some(limits) = member.gate.configured_limits(estimated.key()) else {
        return Duration::ZERO;
    };
    let Ok(cost) = member.gate.cost_of(estimated, Some(limits)) else {
        return Duration::ZERO;
    };
    tollgate::Currency::ALL
        .into_iter()
        .flat_map(|currency| {
            let amount = cost.of(currency);
            limits.of(currency).as_slice().iter().map(move |rate| {
                let nanos = u128::from(amount) * u128::from(rate.period_nanos())
                    / u128::from(rate.amount().max(1));
                Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            })
        })
        .max()
        .unwrap_or(Duration::ZERO)
}
