//! The Redis store: one key's windows shared by every process and machine (feature `redis`).
//!
//! Each key is a Redis hash and a sorted set under one Cluster hash tag (so a key's state lives
//! in one slot), checked and changed by one Lua script in one round trip: all windows or none,
//! exactly as [`MemoryStore`](crate::MemoryStore) does. Time is the server's `TIME`, one clock
//! for every worker, so clients whose clocks differ can't gain or lose allowance. The limits
//! are stored with the state, so a process that uses the key with other limits gets
//! [`Error::ConflictingLimits`] instead of corrupting the windows. A key expires as soon as its
//! windows would be full again and no ticket can still be claimed, so idle keys leave nothing
//! behind.
//!
//! # Arrival order across processes
//!
//! The script keeps each key's queue of tickets: a call that can't pass at once gets the
//! instant it is due, computed as if every call ahead of it (from any process) paid on time,
//! and sleeps until then; at that instant it asks once and, if the calls ahead did pay on time,
//! passes. A newcomer passes at once only when the key can pay for it on top of everyone
//! waiting, so no call delays one that reached the server before it. A ticket whose holder
//! stops asking (its process died) lapses [`RedisConfig::lease`] after it was due (1 s by
//! default), and stops holding anyone up.
//!
//! # Precision
//!
//! Lua numbers are doubles, exact for integers below 2^53. The script counts time in
//! milliseconds (the server's `TIME`, truncated) and each window in units of `1/S` token, where
//! `S = P / gcd(N, P)` for a rate of `N` per `P` milliseconds; the refill is then `N / gcd(N, P)`
//! units a millisecond, and every decision is exact integer arithmetic as long as
//! `burst × S < 2^46 ≈ 7·10^13` (which leaves room for a debt of 64 bursts). Round rates reduce
//! far below that: `100000/m` has S = 3, `2000000/d` has S = 216, `5/s burst 10` has S = 200.
//! Even with no common factor at all, any rate with a period up to a day and a burst up to
//! 800,000, or a period up to a minute and a burst up to 10^9, is exact. Limits outside the
//! range are refused when the limiter is built ([`Error::UnsupportedLimits`]), naming the
//! window, rather than decided approximately. The script checks every argument again, so no
//! client can make it compute outside that range or loop on a value.
//!
//! # Redis Cluster
//!
//! [`RedisStore::connect_cluster`] (or a `redis+cluster://host:port,host:port` address to
//! [`RedisStore::connect`]) reaches a cluster through any of its nodes. A key's hash and queue
//! share one hash tag, so each key lives in one slot, on one master, and different keys
//! spread over the masters. When a master fails, calls on its keys fail closed
//! ([`Error::Unavailable`], within the timeout) until a replica is promoted, then go on.
//!
//! A failover can go back in time. Replication is asynchronous: a promoted replica holds a
//! key's state as of the last write it received, so charges made on the old master and not
//! yet replicated are forgotten, and that many calls may pass again: at most what the key
//! admitted during the replica's lag (one burst plus the lag's refill). Tickets issued in that
//! lag are forgotten too; their holders hear that they lost their place and queue again.
//! Redis's `min-replicas-to-write` and `min-replicas-max-lag` narrow the window.
//!
//! # Redis Sentinel
//!
//! A `redis+sentinel://[user:password@]host:port[,host:port...]/<master>[/<db>]` address to
//! [`RedisStore::connect`] asks the sentinels at those addresses which server is the master
//! they watch under that name (the credentials and database are the master's; the sentinels
//! are asked without credentials). When the connection to it fails, or it answers that it is
//! a replica now, the next call asks the sentinels again, so the store follows a failover:
//! calls fail closed ([`Error::Unavailable`]) while no master answers, and go on on the
//! promoted replica, about as soon as the sentinels agree on it (their
//! `down-after-milliseconds` plus an election). A failover through Sentinel can go back in time
//! exactly as one in a cluster can (above). TLS to the sentinels is not supported yet.
//!
//! # Failure
//!
//! Every call is bounded by the configured timeout: when Redis is down or stopped, the answer
//! is [`Error::Unavailable`] with the cause, never a silent hang and never a silent admission,
//! and every call waiting on the key learns it at its own turn, or, if that is later, within
//! one and a half [liveness](RedisConfig::with_liveness) periods and a timeout (a limiter
//! whose waiters are quiet that long asks the server; 5 s by default). The connection is
//! re-established in the background, and the script is reloaded after a `SCRIPT FLUSH` or a
//! restart without the caller seeing it. With [`RedisConfig::fail_open`], an admission that
//! finds Redis unreachable or timed out is granted with a warning instead; a reply that says no
//! (conflicting limits, a refused argument, a script error) is still an error.

use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};

use crate::error::{Cause, Error};
use crate::rate::Limits;
use crate::store::{Op, Outcome, Store, Ticket};

mod config;
mod connection;
mod open;
mod script;
mod url;

pub use config::RedisConfig;

use connection::Connection;

use script::{Reply, Scaled};
use url::Shown;

/// Windows in Redis (or Valkey), shared by every process that uses the same server and prefix.
///
/// ```no_run
/// use tollgate::store::redis::RedisStore;
/// use tollgate::{Cost, Limiter, Limits};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let limiter = Limiter::new("openai", Limits::parse("500/m", "200000/m")?, store)?;
/// limiter.acquire(Cost::call(1_200)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Connection,
    script: Script,
    config: RedisConfig,
    /// The URL without secrets, and the secrets to scrub from anything that may echo it.
    shown: Shown,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.shown.url)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// A key bound to a [`RedisStore`]: its names in Redis and its windows in the script's terms.
#[derive(Debug, Clone)]
pub struct RedisKey {
    name: String,
    hash: String,
    queue: String,
    /// The tenants' last tags while calls wait (the fair order's memory).
    tenants: String,
    limits: Limits,
    signature: String,
    windows: Arc<[Scaled]>,
}

/// `text` with the characters that would end a Cluster hash tag, or be read as an escape,
/// escaped: `%` → `%25`, `{` → `%7B`, `}` → `%7D`.
fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['%', '{', '}']) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.replace('%', "%25")
            .replace('{', "%7B")
            .replace('}', "%7D"),
    )
}

/// The hash tag of `key` under `prefix`: `{<length of prefix>:<prefix>:<key>}`, both escaped.
/// The length makes the encoding unambiguous: `app` with `eu:openai` and `app:eu` with `openai`
/// can't meet.
pub(crate) fn tag(prefix: &str, key: &str) -> String {
    let prefix = escape(prefix);
    format!("{{{}:{prefix}:{}}}", prefix.len(), escape(key))
}

/// A driver error that says the server can't be reached or did not answer, rather than that
/// it answered no.
fn is_unavailable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::NoValidReplicasFoundBySentinel
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
        || e.code() == Some("BUSY")
}

/// A cause with every secret removed: the driver's own error when it holds none, else its
/// text, scrubbed.
#[derive(Debug)]
struct Scrubbed(String);

impl std::fmt::Display for Scrubbed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Scrubbed {}

impl RedisStore {
    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// Awaits `call` within the configured timeout, turning a driver error or the timeout
    /// into [`Error::Unavailable`] or [`Error::Store`] saying `what` failed.
    async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.inner.config.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(fail(&self.inner.shown, &format!("{what} failed"), e)),
            Err(_) => Err(Error::unavailable(
                format!(
                    "Redis at `{}`: {what} timed out: no answer within {:?}",
                    self.inner.shown.url, self.inner.config.timeout
                ),
                None,
            )),
        }
    }

    /// Sends `PING` and waits for the answer, within the timeout.
    pub async fn ping(&self) -> Result<(), Error> {
        let mut connection = self.inner.connection.clone();
        let command = redis::cmd("PING");
        self.bounded("PING", command.query_async::<String>(&mut connection))
            .await
            .map(|_| ())
    }

    /// Keeps a small record beside the windows: `value` under `name` (in this store's
    /// prefix, so every process on the same server and prefix reads it) for `ttl`, replacing
    /// what was there. For what a fleet must agree on besides windows, such as which tenant
    /// owns a stored object (tollgate-proxy). One `SET`, within the timeout.
    pub async fn put_record(&self, name: &str, value: &str, ttl: Duration) -> Result<(), Error> {
        let mut connection = self.inner.connection.clone();
        let mut command = redis::cmd("SET");
        command
            .arg(format!("{}:record", tag(&self.inner.config.prefix, name)))
            .arg(value)
            .arg("PX")
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1));
        self.bounded("SET", command.query_async::<()>(&mut connection))
            .await
    }

    /// The record kept under `name` by [`put_record`](RedisStore::put_record), if any (and
    /// not expired). One `GET`, within the timeout.
    pub async fn get_record(&self, name: &str) -> Result<Option<String>, Error> {
        let mut connection = self.inner.connection.clone();
        let mut command = redis::cmd("GET");
        command.arg(format!("{}:record", tag(&self.inner.config.prefix, name)));
        self.bounded(
            "GET",
            command.query_async::<Option<String>>(&mut connection),
        )
        .await
    }

    /// Runs the script for `op` on `key`, at `now_ms` (tests) or the server's `TIME`.
    async fn run(&self, key: &RedisKey, op: &Op, now_ms: Option<u64>) -> Result<Reply, Error> {
        let (name, args) = script::op_args(op, &key.limits);
        let tenant = script::tenant_arg(op);
        // EVALSHA first; the same call with the script's text (EVAL, which also caches it on
        // that node) when the node does not know it: a restarted server, a `SCRIPT FLUSH`, or
        // a replica promoted by a failover (script caches are not replicated).
        let command = |head: &mut redis::Cmd| {
            head.arg(3)
                .arg(&key.hash)
                .arg(&key.queue)
                .arg(&key.tenants)
                .arg(name)
                .arg(&key.signature)
                .arg(now_ms.map(|t| t.to_string()).unwrap_or_default())
                .arg(key.windows.len())
                .arg(u64::try_from(self.inner.config.lease.as_millis()).unwrap_or(u64::MAX));
            script::window_args(head, &key.windows);
            for arg in &args {
                head.arg(*arg);
            }
            if let Some(tenant) = &tenant {
                head.arg(tenant.as_ref());
            }
        };
        let mut by_hash = redis::cmd("EVALSHA");
        by_hash.arg(self.inner.script.get_hash());
        command(&mut by_hash);
        let mut connection = self.inner.connection.clone();
        // A connection that broke since the last call (a restarted server) fails once, and the
        // manager reconnects; one more try, inside the same timeout, hides that from callers.
        let call = async {
            let mut tries = 0;
            loop {
                tries += 1;
                match by_hash.query_async::<Value>(&mut connection).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        let mut by_text = redis::cmd("EVAL");
                        by_text.arg(script::LUA.as_str());
                        command(&mut by_text);
                        break by_text.query_async::<Value>(&mut connection).await;
                    }
                    Err(e) if tries < 2 && (e.is_connection_dropped() || e.is_io_error()) => {}
                    other => break other,
                }
            }
        };
        let value = self.bounded("the script", call).await?;
        match script::parse_reply(value) {
            Some(Reply::Conflict { stored }) => Err(Error::ConflictingLimits {
                key: key.name.clone(),
                existing: script::parse_stored_limits(&stored)
                    .unwrap_or_else(|| key.limits.clone()),
                requested: key.limits.clone(),
            }),
            Some(reply) => Ok(reply),
            None => Err(Error::store(
                format!(
                    "Redis at `{}`: the script answered something this version does not send",
                    self.inner.shown.url
                ),
                None,
            )),
        }
    }

    /// The claim of ticket `ticket`, due at `due` ms, by its holder: the server's `TIME` (or
    /// `now_ms`, given) and the ticket's record, read in one pipeline on the key's node (in
    /// that order, so that the record is as of that time or later), without the script.
    /// `Some` where that settles it ([`bucket::queue::claim`]), with the time it used.
    pub(crate) async fn claim(
        &self,
        key: &RedisKey,
        ticket: Ticket,
        due: u64,
        now_ms: Option<u64>,
    ) -> Result<Option<(Outcome, u64, bool)>, Error> {
        let record = script::ticket_record(ticket.id());
        let mut pipe = redis::pipe();
        if now_ms.is_none() {
            pipe.cmd("TIME");
        }
        pipe.cmd("HMGET").arg(&key.hash).arg(&record).arg("pf");
        let mut connection = self.inner.connection.clone();
        let values: Vec<Value> = self
            .bounded("a ticket's claim", pipe.query_async(&mut connection))
            .await?;
        let odd = || self.odd_reply("a claim's answer");
        let (now_ms, fields) = match (now_ms, values.as_slice()) {
            (Some(now), [fields]) => (now, fields),
            (None, [time, fields]) => {
                let (secs, micros): (u64, u64) =
                    redis::from_redis_value_ref(time).map_err(|_| odd())?;
                (secs * 1000 + micros / 1000, fields)
            }
            _ => return Err(odd()),
        };
        let (record, floor): (Option<String>, Option<u64>) =
            redis::from_redis_value_ref(fields).map_err(|_| odd())?;
        let promised = record.map(|r| {
            // "due lease requests tokens output_tokens spend", and " 1" when issued promised.
            r.split(' ').nth(6) == Some("1") && ticket.id() > floor.unwrap_or(0)
        });
        let lease = u64::try_from(self.inner.config.lease.as_millis()).unwrap_or(u64::MAX);
        Ok(
            match crate::bucket::queue::claim(now_ms, due, lease, promised) {
                crate::bucket::queue::Claim::Passed => Some((Outcome::Admitted, now_ms, true)),
                crate::bucket::queue::Claim::NotYet(ms) => {
                    Some((Outcome::NotYet(Duration::from_millis(ms)), now_ms, true))
                }
                crate::bucket::queue::Claim::Ask => None,
            },
        )
    }

    /// [`Store::apply`] at an explicit time in milliseconds (`None`: the server's `TIME`),
    /// answering the time the script used too: see [`crate::testing`].
    pub(crate) async fn apply_at(
        &self,
        key: &RedisKey,
        op: Op,
        now_ms: Option<u64>,
    ) -> Result<(Outcome, u64), Error> {
        self.apply_traced(key, op, now_ms)
            .await
            .map(|(outcome, now_ms, _)| (outcome, now_ms))
    }

    /// [`apply_at`](RedisStore::apply_at), answering also whether one of the script's fast
    /// paths answered (an acquire that passed at once on a key where nobody waits, or the
    /// first in line asking).
    pub(crate) async fn apply_traced(
        &self,
        key: &RedisKey,
        op: Op,
        now_ms: Option<u64>,
    ) -> Result<(Outcome, u64, bool), Error> {
        if let Op::Acquire { cost, .. } = op {
            crate::bucket::validate(&key.limits, cost)
                .map_err(|e| Error::from_bucket(&key.name, cost, e))?;
        }
        // The holder of a ticket at its due time reads its record instead of running the
        // script: a promised ticket passes so (see `Op::Admit`).
        if let Op::Admit { ticket, fly: false } = op
            && let Some(due) = ticket.due()
            && let Ok(Some(claimed)) = self.claim(key, ticket, due, now_ms).await
        {
            return Ok(claimed);
        }
        let acquiring = matches!(op, Op::Acquire { .. } | Op::Admit { .. });
        let reply = match self.run(key, &op, now_ms).await {
            Err(err @ Error::Unavailable { .. }) if self.inner.config.fail_open && acquiring => {
                tracing::warn!(key = %key.name, error = %err, "Redis unavailable; admitting because fail_open is set");
                return Ok((Outcome::Admitted, 0, false));
            }
            other => other?,
        };
        let now_ms = reply.now_ms();
        let fast = matches!(
            reply,
            Reply::Ok { fast: true, .. } | Reply::Wait { fast: true, .. }
        );
        let ms = Duration::from_millis;
        let outcome = match (op, reply) {
            (Op::Snapshot, Reply::Levels { levels, .. }) => Outcome::Snapshot(
                script::available(&key.windows, &levels)
                    .ok_or_else(|| self.odd_reply("a snapshot of the wrong length"))?,
            ),
            (Op::Acquire { .. } | Op::Admit { .. }, Reply::Ok { .. }) => Outcome::Admitted,
            (
                Op::Acquire { fly: true, .. } | Op::Admit { fly: true, .. },
                Reply::Flying { id, .. },
            ) => Outcome::Flying(id),
            (Op::Acquire { cost, .. }, Reply::Full { .. }) => {
                return Err(Error::from_bucket(
                    &key.name,
                    cost,
                    crate::bucket::BucketError::QueueFull,
                ));
            }
            (Op::Penalize { .. }, Reply::Emptied { emptied, .. }) => Outcome::Emptied(emptied),
            (Op::Sync(_), Reply::Synced { synced, .. }) => Outcome::Synced(synced),
            (Op::Settle { .. }, Reply::Settled { delta, .. }) => Outcome::Settled(delta),
            (Op::Acquire { .. }, Reply::Queued { id, due_in_ms, .. }) => Outcome::Queued {
                ticket: Ticket::new(id).due_at(now_ms.saturating_add(due_in_ms)),
                due_in: ms(due_in_ms),
            },
            // Promised and charged at its due time already: the caller gives it back.
            (Op::Cancel { .. }, Reply::Ok { .. }) => Outcome::Admitted,
            (Op::Acquire { .. } | Op::Admit { .. }, Reply::Wait { millis, .. }) => {
                Outcome::NotYet(ms(millis))
            }
            (Op::Admit { .. }, Reply::Behind { millis, .. }) => Outcome::Behind(ms(millis)),
            (Op::Admit { .. }, Reply::Lost { .. }) => Outcome::Lost,
            (_, Reply::Done { .. }) => Outcome::Done,
            (Op::Lower { .. }, Reply::Lowered { above, .. }) => Outcome::Lowered(above),
            (op, reply) => {
                return Err(self.odd_reply(&format!("{reply:?} to {op:?}")));
            }
        };
        Ok((outcome, now_ms, fast))
    }

    fn odd_reply(&self, what: &str) -> Error {
        Error::store(
            format!(
                "Redis at `{}`: the script answered {what}",
                self.inner.shown.url
            ),
            None,
        )
    }

    /// The names of `key`'s hash and queue in Redis (for tests and operators).
    pub(crate) fn names(&self, key: &str) -> (String, String) {
        let tag = tag(&self.inner.config.prefix, key);
        (tag.clone(), format!("{tag}:q"))
    }
}

/// The error for driver error `e` while doing `what`, with every secret scrubbed.
fn fail(shown: &Shown, what: &str, e: RedisError) -> Error {
    let text = e.to_string();
    let message = format!("Redis at `{}`: {what}: {}", shown.url, shown.scrub(&text));
    let source: Cause = if shown.is_clean(&text) && shown.is_clean(&format!("{e:?}")) {
        Arc::new(e.clone())
    } else {
        Arc::new(Scrubbed(shown.scrub(&text).into_owned()))
    };
    if is_unavailable(&e) {
        Error::unavailable(message, Some(source))
    } else {
        Error::store(message, Some(source))
    }
}

impl Store for RedisStore {
    type Key = RedisKey;

    fn bind(&self, key: &str, limits: &Limits) -> Result<RedisKey, Error> {
        let windows = script::prepare(limits).map_err(|reason| Error::UnsupportedLimits {
            key: key.to_owned(),
            limits: limits.clone(),
            reason,
        })?;
        let (hash, queue) = self.names(key);
        let tenants = format!("{hash}:g");
        Ok(RedisKey {
            name: key.to_owned(),
            hash,
            queue,
            tenants,
            limits: limits.clone(),
            signature: limits.to_string(),
            windows: windows.into(),
        })
    }

    async fn apply(&self, key: &RedisKey, op: Op) -> Result<Outcome, Error> {
        self.apply_at(key, op, None)
            .await
            .map(|(outcome, _)| outcome)
    }

    fn health_interval(&self) -> Option<Duration> {
        // With fail_open, an unreachable server is not a reason for a waiter to fail.
        // Quiet for the liveness period (two of these), the store is asked: a failure is
        // known within one and a half periods plus the timeout of that question.
        (!self.inner.config.fail_open)
            .then(|| (self.inner.config.liveness / 2).max(Duration::from_millis(10)))
    }
}

/// The script as the server runs it.
#[cfg(feature = "testing")]
pub(crate) fn script_text() -> &'static str {
    script::LUA.as_str()
}

impl From<RedisStore> for crate::store::AnyStore {
    fn from(store: RedisStore) -> crate::store::AnyStore {
        crate::store::AnyStore::custom(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_never_collide_across_prefixes() {
        assert_eq!(tag("app", "eu:openai"), "{3:app:eu:openai}");
        assert_eq!(tag("app:eu", "openai"), "{6:app:eu:openai}");
        assert_eq!(tag("p", "a}b{c%"), "{1:p:a%7Db%7Bc%25}");
        assert_eq!(tag("{x}", "k"), "{7:%7Bx%7D:k}");
        // A literal `%7D` in a key is not a `}`: the escape is escaped.
        assert_ne!(tag("p", "%7D"), tag("p", "}"));
    }
}
