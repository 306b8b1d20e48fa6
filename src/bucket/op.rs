//! The rule book's one face: the operations a key's state takes ([`Op`]), what each came to
//! ([`Outcome`]), and a waiting call's place ([`Ticket`]). Every store speaks these: the memory
//! store runs the rule book (`KeyState::apply`) itself, the Redis store's script is its port (checked against
//! it by the differential tests), and a custom store does one or the other.

use std::time::Duration;

use super::{Available, KeyState, Nanos, Refusal, SyncArgs, Synced};
use crate::cost::Cost;
use crate::error::Error;
use crate::rate::{Currencies, Currency, Limits, PerCurrency};

/// A waiting call's place in a key's queue, as the store issued it. Two tickets are the same
/// when their identifiers are.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    id: u64,
    /// When it is due, on the store's own clock and in its own unit (the rule book's
    /// nanoseconds, the Redis script's milliseconds), where the store issued it: what lets its
    /// holder claim a promised ticket (see [`Op::Admit`]).
    due: Option<u64>,
}

impl Ticket {
    /// A ticket with the store's own identifier (for implementations of [`Store`](crate::Store)).
    pub fn new(id: u64) -> Ticket {
        Ticket { id, due: None }
    }

    /// The store's identifier.
    pub fn id(self) -> u64 {
        self.id
    }

    /// The same ticket, due at `due` on the store's clock.
    pub(crate) fn due_at(self, due: u64) -> Ticket {
        Ticket {
            due: Some(due),
            ..self
        }
    }

    /// When it is due, on the store's clock and in its unit, if the store said (the memory
    /// store counts nanoseconds, Redis milliseconds).
    pub fn due(self) -> Option<u64> {
        self.due
    }
}

impl PartialEq for Ticket {
    fn eq(&self, other: &Ticket) -> bool {
        self.id == other.id
    }
}

impl Eq for Ticket {}

impl std::hash::Hash for Ticket {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

/// A tenant's claim on a key it shares with others: its name, and its weight.
///
/// When calls of several tenants wait at the same key, the key's capacity goes to them in
/// proportion to their weights (weighted fair queueing by cost, see [`Op::Acquire`]); within a
/// tenant, calls pass in arrival order. A tenant alone at a key gets all of it, and calls
/// without a share are one tenant of weight 1, apart from every named one (the empty name
/// too).
///
/// A tenant is known at the key by a 64-bit digest of its name (the first 8 bytes of its
/// SHA-256), the same in every process and on every machine, so a fleet sharing a key through
/// Redis shares one fair order; a name of any length costs the key 8 bytes. The weight goes
/// with each call: two calls of one tenant with different weights each take their own step.
///
/// ```
/// use tollgate::store::Share;
///
/// let share = Share::new("team-a", 2);
/// assert_eq!((share.tenant(), share.weight()), ("team-a", 2));
/// // A weight of 0 would never be served: it counts as 1.
/// assert_eq!(Share::new("team-b", 0).weight(), 1);
/// ```
///
/// One pointer wide, so that an operation carrying it stays small.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Share(std::sync::Arc<ShareData>);

#[derive(Debug, PartialEq, Eq, Hash)]
struct ShareData {
    tenant: Box<str>,
    weight: u32,
    id: u64,
}

impl Share {
    /// The share of `tenant`, of `weight` (at least 1; larger is a larger share).
    pub fn new(tenant: impl Into<Box<str>>, weight: u32) -> Share {
        let tenant = tenant.into();
        let id = tenant_id(&tenant);
        Share(std::sync::Arc::new(ShareData {
            tenant,
            weight: weight.max(1),
            id,
        }))
    }

    /// The tenant's name.
    pub fn tenant(&self) -> &str {
        &self.0.tenant
    }

    /// The tenant's weight (at least 1).
    pub fn weight(&self) -> u32 {
        self.0.weight
    }

    /// The tenant as the key knows it (never 0: that is the key's own calls, without a share).
    pub(crate) fn id(&self) -> u64 {
        self.0.id
    }
}

/// The tenant `name` as a key knows it: the first 8 bytes of its SHA-256, big-endian, never 0.
fn tenant_id(name: &str) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first).max(1)
}

/// One state transition of a key.
///
/// The one large operation, a sync, is boxed, so that an admission moves little (an `Op` is
/// 128 bytes, the size of a penalty with its refusal; a share is one pointer).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// A call arrives. It is [`Outcome::Admitted`] at once if every window can pay for it on
    /// top of every call already waiting; otherwise it is [`Outcome::Queued`] behind them,
    /// unless it would be due more than `max_wait` from now (then [`Outcome::NotYet`], and
    /// nothing changes). `max_wait` of zero never queues; `None` has no limit. With `fly`, an
    /// admitted call is remembered as in flight ([`Outcome::Flying`]) until [`Op::Settle`]
    /// says it is done: what a header sync ([`Op::Sync`]) needs.
    ///
    /// Tickets wait in *fair order*: each is tagged, as it is issued, with a virtual finish
    /// time, `max(V, G) + ⌈r / (1000·w)⌉`, where `V` is the tag of the ticket first in line
    /// (0 when nobody waits), `G` the tag of the tenant's last ticket while anyone waits, `r`
    /// the nanoseconds the key takes to refill the call's cost (its slowest window) and `w`
    /// the tenant's weight; it goes behind every ticket of a tag up to its own. One tenant's
    /// tags only grow, so with one tenant (or none: calls without a share are one tenant) the
    /// order is arrival order. A ticket placed ahead of others plans the line again: every
    /// ticket waiting loses its promise (see [`Op::Admit`]).
    Acquire {
        /// What the call pays.
        cost: Cost,
        /// The longest the call may wait for its turn.
        max_wait: Option<Duration>,
        /// Remember the call as in flight once admitted.
        fly: bool,
        /// Whose call it is, at a key tenants share (`None`: the key's own, weight 1).
        share: Option<Share>,
    },
    /// The holder of a ticket asks to pass: [`Outcome::Admitted`] (charged),
    /// [`Outcome::Behind`] while calls ahead of it have yet to pass, [`Outcome::NotYet`] when
    /// it is first in line but the windows (or a pause) hold it, or [`Outcome::Lost`] if the
    /// ticket lapsed.
    ///
    /// A ticket not to fly whose calls ahead are all promised is *promised* when issued: it is
    /// charged at its due time by the store itself (whatever operation runs first after
    /// it), and its holder, asking at or after that time, hears [`Outcome::Admitted`] without
    /// being charged again; asking before it, [`Outcome::NotYet`] until then. A pause, a
    /// lowered count, a sync, a charge or a refund between its issue and its due time breaks
    /// the promise of every ticket waiting, which then asks to pass as any other (after a
    /// refund, sooner than it was due).
    Admit {
        /// The ticket.
        ticket: Ticket,
        /// Remember the call as in flight once admitted (as for [`Op::Acquire`]).
        fly: bool,
    },
    /// Gives a ticket up: [`Outcome::Done`], and nothing was charged; or
    /// [`Outcome::Admitted`] if it was promised and already charged at its due time, and the
    /// caller gives back what it paid.
    Cancel {
        /// The ticket.
        ticket: Ticket,
    },
    /// Adds tokens to the windows of each currency: positive amounts are refunds (never above
    /// capacity), negative ones charges (which may leave a window in debt).
    Adjust {
        /// Added to every window of each currency.
        delta: PerCurrency<i64>,
    },
    /// A provider's 429: admits nothing for `pause` (a longer pause already in force wins),
    /// and lowers the windows of the `spent` currencies: with a `refusal`, the tightest window
    /// of each to where the provider's is (it holds what the refused call needed when the
    /// provider's own pause ends, less what went out after the call); without one, every
    /// window of them to empty. Never raises one. Answers [`Outcome::Emptied`].
    Penalize {
        /// How long nothing passes.
        pause: Duration,
        /// The currencies the 429 says are used up.
        spent: Currencies,
        /// The refused call, when the provider said when it would pass.
        refusal: Option<Refusal>,
    },
    /// A provider's `remaining` count: lowers every window of `currency` to at most
    /// `remaining`; never raises one. Answers [`Outcome::Lowered`].
    Lower {
        /// The currency the provider counted.
        currency: Currency,
        /// What the provider says is left.
        remaining: u64,
    },
    /// A header sync: brings the windows in line with a provider's counts read from the
    /// answer to a call in flight (see [`SyncArgs`]). Answers [`Outcome::Synced`].
    Sync(Box<SyncArgs>),
    /// Settles a call in flight with what it used, per currency (`None`: as charged). A shortfall is charged less what a sync that
    /// counted the call took off already. With `last`, the call is done. Answers
    /// [`Outcome::Settled`].
    Settle {
        /// The call's number ([`Outcome::Flying`]).
        flight: u64,
        /// What it was charged, in case the key no longer remembers it.
        charged: Cost,
        /// What it used.
        used: PerCurrency<Option<u64>>,
        /// Whether this is the call's last settlement.
        last: bool,
        /// How long after it went out the provider counted it (zero: not known), for a call
        /// that found a window full and whose refill the key credited alone until then (see
        /// [`SyncArgs::counted_after`]): taken off here unless a sync took it off already.
        counted_after: Duration,
    },
    /// What every window holds now: [`Outcome::Snapshot`].
    Snapshot,
    /// Checks that the store answers: [`Outcome::Done`].
    Ping,
}

/// What an [`Op`] came to.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// Every window paid: the call may go.
    Admitted,
    /// Every window paid, and the call is remembered as in flight with this number.
    Flying(u64),
    /// The call has its place: it is due after `due_in`, when it should [`Op::Admit`].
    Queued {
        /// Its place.
        ticket: Ticket,
        /// How long until it is due.
        due_in: Duration,
    },
    /// Nothing was charged; the call could pass after this long, if nothing else is charged
    /// meanwhile.
    NotYet(Duration),
    /// An [`Op::Admit`] came before calls ahead of the ticket passed (they were late, or are
    /// still on their way): nothing failed, and the ticket keeps its place. It could pass
    /// after this long if they passed now.
    Behind(Duration),
    /// The ticket lapsed (its holder did not ask for it in time) or was cancelled.
    Lost,
    /// Done.
    Done,
    /// What an [`Op::Lower`] found: how many whole tokens the window of the currency closest
    /// to `remaining` held above it (what was taken off), or, negative, below it (nothing was
    /// taken, and this much more was left than the provider said).
    Lowered(i64),
    /// What an [`Op::Penalize`] took off: per currency, the whole tokens the closest window
    /// held above where it was brought.
    Emptied(PerCurrency<u64>),
    /// What an [`Op::Sync`] found and did (boxed: the rare large answer would otherwise make
    /// every admission's answer as large).
    Synced(Box<Synced>),
    /// What an [`Op::Settle`] added to the windows, per currency (positive: a refund;
    /// negative: a charge).
    Settled(PerCurrency<i64>),
    /// What every window holds, in the order of [`Limits::windows`].
    Snapshot(Vec<Available>),
}

impl KeyState {
    /// Runs `op` on the key's state at `now`: the rule book's transition, as a store's answer.
    /// Tickets that lapse are kept `lease` past their due time; new ones are numbered by `id`.
    pub(crate) fn apply(
        &mut self,
        limits: &Limits,
        key: &str,
        now: Nanos,
        op: Op,
        lease: Duration,
        id: impl FnOnce() -> u64,
    ) -> Result<Outcome, Error> {
        self.charge_due(limits, now);
        match op {
            Op::Acquire {
                cost,
                max_wait,
                fly,
                share,
            } => self
                .acquire(limits, now, cost, max_wait, fly, share.as_ref(), lease, id)
                .map_err(|e| Error::from_bucket(key, cost, e)),
            Op::Admit { ticket, fly } => self
                .admit(
                    limits,
                    now,
                    ticket.id(),
                    ticket.due().map(Nanos),
                    fly,
                    lease,
                )
                .map_err(|e| Error::from_bucket(key, Default::default(), e)),
            Op::Cancel { ticket } => {
                Ok(self.cancel(now, ticket.id(), ticket.due().map(Nanos), lease))
            }
            Op::Adjust { delta } => Ok(self.adjust(limits, now, delta)),
            Op::Penalize {
                pause,
                spent,
                refusal,
            } => {
                let refusal = refusal.map(|r| Refusal {
                    hint: whole_ms(r.hint),
                    ..r
                });
                let until = now.plus(whole_ms(pause));
                Ok(self.penalize(limits, now, until, spent, refusal.as_ref()))
            }
            Op::Lower {
                currency,
                remaining,
            } => Ok(self.lower(limits, now, currency, remaining)),
            Op::Sync(mut args) => {
                args.counted_after = whole_ms_down(args.counted_after);
                let mut outcome = self.sync(limits, now, &args);
                if let (Some(used), Outcome::Synced(synced)) = (args.settle, &mut outcome)
                    && let Outcome::Settled(delta) = self.settle(
                        limits,
                        now,
                        args.flight,
                        args.charged,
                        used,
                        true,
                        args.counted_after,
                    )
                {
                    synced.settled = Some(delta);
                }
                Ok(outcome)
            }
            Op::Settle {
                flight,
                charged,
                used,
                last,
                counted_after,
            } => Ok(self.settle(
                limits,
                now,
                flight,
                charged,
                used,
                last,
                whole_ms_down(counted_after),
            )),
            Op::Snapshot => Ok(Outcome::Snapshot(self.snapshot(limits, now))),
            Op::Ping => Ok(Outcome::Done),
        }
    }
}

/// `d` in whole milliseconds, rounded up: the store's grain for a pause and a provider's hint
/// (Redis's script takes milliseconds), rounded to the cautious side: a longer pause, a window
/// lowered more.
fn whole_ms(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// `d` in whole milliseconds, rounded down: when a provider counted a call after it went out,
/// as the script reads it. Down, so that the refill taken back from a window that was full is
/// never more than the window had (it is at most a millisecond's refill short of it).
fn whole_ms_down(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
