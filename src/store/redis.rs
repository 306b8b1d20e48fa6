//! The Redis store: one key's buckets shared by every process and machine (feature `redis`).
//!
//! Each key is one Redis hash, `{prefix:key}` (the braces are a Cluster hash tag, so a key's
//! state lives in one slot), checked and charged by one Lua script in one round trip: all
//! buckets or none, exactly as [`MemoryStore`](crate::MemoryStore) does. Time is the server's
//! `TIME`, one clock for every worker, so clients whose clocks differ can't gain or lose
//! allowance. The limits are stored with the state, so a process that uses the key with other
//! limits gets [`Error::ConflictingLimits`] instead of corrupting the buckets. A key expires as
//! soon as its buckets would be full again, so idle keys leave nothing behind.
//!
//! # Precision
//!
//! Lua numbers are doubles, exact for integers below 2^53. The script counts time in
//! milliseconds (the server's `TIME`, truncated) and each bucket in units of `1/S` token, where
//! `S = P / gcd(N, P)` for a rate of `N` per `P` milliseconds; the refill is then `N / gcd(N, P)`
//! units a millisecond, and every decision is exact integer arithmetic as long as
//! `burst × S < 2^53 / 128 ≈ 7·10^13` (the factor leaves room for a debt of 64 bursts). Round
//! rates reduce far below that: `100000/m` has S = 3, `2000000/d` has S = 216, `5/s burst 10`
//! has S = 200. Even with no common factor at all, any rate with a period up to a day and a
//! burst up to 800,000, or a period up to a minute and a burst up to 10^9, is exact. Limits
//! outside the range are refused when first used, naming the window, rather than decided
//! approximately.
//!
//! Within the range the script makes the same decisions as the in-memory store at the same
//! (whole-millisecond) instants, which the tests check on random traces; its hints are rounded
//! up to the millisecond.
//!
//! # Failure
//!
//! Every call is bounded by the configured timeout: when Redis is down or slow, the answer is
//! [`Error::Store`] with the cause, never a silent hang and never a silent admission. The
//! connection is re-established in the background, and the script is reloaded after a
//! `SCRIPT FLUSH` or a restart without the caller seeing it. With
//! [`RedisConfig::fail_open`], a failed call admits with a warning instead.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

use crate::bucket::{Available, Buckets, Cost, Decision, Tokens};
use crate::error::Error;
use crate::rate::{Currency, Limits, Rate};
use crate::store::Store;

const LUA: &str = include_str!("redis.lua");
/// Scaled capacities stay below 2^53 / 128, so that a debt of 64 bursts and any refill stay
/// exact in the script's doubles.
const MAX_EXACT: u128 = (1 << 53) / 128;

/// How a [`RedisStore`] connects and fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// Prepended to every key, inside the hash tag: `{prefix:key}`. Default `tollgate`.
    pub prefix: String,
    /// The longest any one store call may take, connection included. Default 1 s.
    pub timeout: Duration,
    /// Admit (with a warning) instead of failing when Redis can't be reached. Default false.
    pub fail_open: bool,
    /// For `rediss://` URLs: a PEM file of the certificate authority to trust instead of the
    /// system's roots (a private CA, a self-signed server). Needs the `redis-tls` feature.
    pub tls_ca_file: Option<std::path::PathBuf>,
}

impl Default for RedisConfig {
    fn default() -> RedisConfig {
        RedisConfig {
            prefix: "tollgate".to_owned(),
            timeout: Duration::from_secs(1),
            fail_open: false,
            tls_ca_file: None,
        }
    }
}

/// Buckets in Redis (or Valkey), shared by every process that uses the same server and prefix.
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
    connection: ConnectionManager,
    script: Script,
    config: RedisConfig,
    /// The URL with any password replaced, for messages.
    shown_url: String,
    /// The password, to scrub from any message that might echo it.
    secret: Option<String>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.shown_url)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// `redis://user:secret@host` → `redis://user:***@host`; the password, if any.
fn redact(url: &str) -> (String, Option<String>) {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return (url.to_owned(), None);
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_owned(), None);
    };
    let userinfo = &rest[..at];
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, password),
        None => ("", userinfo),
    };
    if password.is_empty() {
        return (url.to_owned(), None);
    }
    let shown = format!("{}{user}:***{}", &url[..scheme_end], &rest[at..]);
    (shown, Some(password.to_owned()))
}

/// One bucket's parameters as the script takes them.
#[derive(Debug)]
struct Scaled {
    currency: Currency,
    rate: Rate,
    scale: u64,
    refill: u64,
    capacity: u64,
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn scale(currency: Currency, rate: &Rate) -> Result<Scaled, Error> {
    // Periods are whole milliseconds.
    let period_ms = u128::from(rate.period_nanos() / 1_000_000);
    let amount = u128::from(rate.amount());
    let g = gcd(amount, period_ms);
    let scale = period_ms / g;
    let refill = amount / g;
    let capacity = u128::from(rate.burst()) * scale;
    if capacity >= MAX_EXACT || refill >= MAX_EXACT {
        return Err(Error::Store {
            message: format!(
                "the {currency} window `{rate}` is outside the range the Redis script decides exactly (burst × period in ms / gcd(amount, period) must stay below 7·10^13); use a shorter period or a smaller burst"
            ),
            source: None,
        });
    }
    Ok(Scaled {
        currency,
        rate: *rate,
        scale: scale as u64,
        refill: refill as u64,
        capacity: capacity as u64,
    })
}

fn scaled(limits: &Limits) -> Result<Vec<Scaled>, Error> {
    [Currency::Requests, Currency::Tokens]
        .into_iter()
        .flat_map(|currency| {
            limits
                .of(currency)
                .as_slice()
                .iter()
                .map(move |rate| scale(currency, rate))
        })
        .collect()
}

/// What the script answered.
enum Reply {
    Ok { now_ms: u64 },
    Wait { millis: u64, now_ms: u64 },
    Conflict { stored: String },
    Levels { levels: Vec<i64> },
}

fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    }
}

fn as_text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

fn parse_reply(value: Value) -> Option<Reply> {
    let Value::Array(items) = value else {
        return None;
    };
    let tag = as_text(items.first()?)?;
    let int = |i: usize| items.get(i).and_then(as_int);
    let uint = |i: usize| int(i).and_then(|n| u64::try_from(n).ok());
    Some(match tag.as_str() {
        "ok" => Reply::Ok { now_ms: uint(1)? },
        "wait" => Reply::Wait {
            millis: uint(1)?,
            now_ms: uint(2)?,
        },
        "conflict" => Reply::Conflict {
            stored: as_text(items.get(1)?)?,
        },
        "levels" => Reply::Levels {
            levels: items[2..].iter().map(as_int).collect::<Option<_>>()?,
        },
        _ => return None,
    })
}

impl RedisStore {
    /// Connects with the default [`RedisConfig`], checking that the server answers.
    ///
    /// `url` is `redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS (with the
    /// `redis-tls` feature; see [`RedisConfig::tls_ca_file`] for a private CA). The password
    /// never appears in an error or a log.
    pub async fn connect(url: &str) -> Result<RedisStore, Error> {
        RedisStore::connect_with(url, RedisConfig::default()).await
    }

    /// Connects with `config`, checking that the server answers within its timeout.
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<RedisStore, Error> {
        let store = RedisStore::lazy(url, config)?;
        store.ping().await?;
        Ok(store)
    }

    /// A store that connects on first use (and reconnects by itself after failures): for
    /// programs that start before their Redis does.
    pub fn lazy(url: &str, config: RedisConfig) -> Result<RedisStore, Error> {
        let (shown_url, secret) = redact(url);
        let client = open_client(url, &config).map_err(|reason| Error::Store {
            message: format!(
                "Redis at `{shown_url}`: {}",
                scrub(&reason, secret.as_deref())
            ),
            source: None,
        })?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let connection =
            ConnectionManager::new_lazy_with_config(client, manager_config).map_err(|e| {
                Error::Store {
                    message: format!(
                        "Redis at `{shown_url}`: {}",
                        scrub(&e.to_string(), secret.as_deref())
                    ),
                    source: None,
                }
            })?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                connection,
                script: Script::new(LUA),
                config,
                shown_url,
                secret,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The Redis key holding `key`'s buckets: `{prefix:key}`.
    pub fn redis_key(&self, key: &str) -> String {
        format!("{{{}:{key}}}", self.inner.config.prefix)
    }

    fn failure(&self, what: &str, cause: impl std::fmt::Display) -> Error {
        Error::Store {
            message: format!(
                "Redis at `{}`: {what}: {}",
                self.inner.shown_url,
                scrub(&cause.to_string(), self.inner.secret.as_deref())
            ),
            source: None,
        }
    }

    /// Awaits `call` within the configured timeout, turning a driver error or the timeout
    /// into [`Error::Store`] saying `what` failed.
    async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.inner.config.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.failure(&format!("{what} failed"), e)),
            Err(_) => Err(self.failure(
                &format!("{what} timed out"),
                format!("no answer within {:?}", self.inner.config.timeout),
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

    async fn run(
        &self,
        op: &str,
        key: &str,
        limits: &Limits,
        amounts: impl Fn(&Scaled) -> i128,
        now_ms: Option<u64>,
    ) -> Result<Reply, Error> {
        self.run_with_pause(op, key, limits, amounts, now_ms, 0)
            .await
    }

    async fn run_with_pause(
        &self,
        op: &str,
        key: &str,
        limits: &Limits,
        amounts: impl Fn(&Scaled) -> i128,
        now_ms: Option<u64>,
        pause_ms: u64,
    ) -> Result<Reply, Error> {
        let buckets = scaled(limits)?;
        let mut invocation = self.inner.script.prepare_invoke();
        invocation
            .key(self.redis_key(key))
            .arg(op)
            .arg(limits.to_string())
            .arg(now_ms.map(|t| t.to_string()).unwrap_or_default())
            .arg(buckets.len())
            .arg(pause_ms);
        for bucket in &buckets {
            let amount = amounts(bucket);
            if amount.unsigned_abs() >= MAX_EXACT {
                return Err(self.failure(
                    "amount out of range",
                    format!(
                        "{amount} units for the {} window `{}`",
                        bucket.currency, bucket.rate
                    ),
                ));
            }
            invocation
                .arg(bucket.scale)
                .arg(bucket.refill)
                .arg(bucket.capacity)
                .arg(amount as i64);
        }
        let mut connection = self.inner.connection.clone();
        // A connection that broke since the last call (a restarted server) fails once, and the
        // manager reconnects; one more try, inside the same timeout, hides that from callers.
        let call = async {
            match invocation.invoke_async::<Value>(&mut connection).await {
                Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                    invocation.invoke_async::<Value>(&mut connection).await
                }
                other => other,
            }
        };
        let value = self.bounded("the script", call).await?;
        match parse_reply(value) {
            Some(Reply::Conflict { stored }) => Err(Error::ConflictingLimits {
                key: key.to_owned(),
                existing: parse_stored_limits(&stored).unwrap_or_else(|| limits.clone()),
                requested: limits.clone(),
            }),
            Some(reply) => Ok(reply),
            None => Err(self.failure("unexpected reply", "the script answered something else")),
        }
    }

    /// [`Store::try_acquire`] at an explicit time in milliseconds (`None`: the server's
    /// `TIME`), answering the time the script used too. Explicit times are for tests that
    /// compare the script's arithmetic with the in-memory store's; real callers pass `None`.
    pub async fn try_acquire_at(
        &self,
        key: &str,
        limits: &Limits,
        cost: Cost,
        now_ms: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        Buckets::validate(limits, cost).map_err(|e| Error::from_bucket(key, cost, e))?;
        let reply = self
            .run(
                "acquire",
                key,
                limits,
                |b| i128::from(cost.of(b.currency)) * i128::from(b.scale),
                now_ms,
            )
            .await;
        match reply {
            Ok(Reply::Ok { now_ms }) => Ok((Decision::Admitted, now_ms)),
            Ok(Reply::Wait { millis, now_ms }) => {
                Ok((Decision::NotYet(Duration::from_millis(millis)), now_ms))
            }
            Ok(_) => Err(self.failure("unexpected reply", "not an acquire answer")),
            Err(err @ (Error::ConflictingLimits { .. } | Error::CostExceedsCapacity { .. })) => {
                Err(err)
            }
            Err(err) if self.inner.config.fail_open => {
                tracing::warn!(key, error = %err, "Redis unavailable; admitting because fail_open is set");
                Ok((Decision::Admitted, 0))
            }
            Err(err) => Err(err),
        }
    }

    /// [`Store::snapshot`] at an explicit time (see [`try_acquire_at`](Self::try_acquire_at)).
    pub async fn snapshot_at(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: Option<u64>,
    ) -> Result<Vec<Available>, Error> {
        let buckets = scaled(limits)?;
        match self.run("snapshot", key, limits, |_| 0, now_ms).await? {
            Reply::Levels { levels, .. } if levels.len() == buckets.len() => Ok(buckets
                .iter()
                .zip(levels)
                .map(|(b, level)| Available {
                    currency: b.currency,
                    rate: b.rate,
                    tokens: Tokens::from_units(i128::from(level), b.scale),
                })
                .collect()),
            _ => Err(self.failure("unexpected reply", "not a snapshot")),
        }
    }

    /// [`Store::adjust`] at an explicit time (see [`try_acquire_at`](Self::try_acquire_at)).
    pub async fn adjust_at(
        &self,
        key: &str,
        limits: &Limits,
        delta: i64,
        now_ms: Option<u64>,
    ) -> Result<(), Error> {
        let amount = |b: &Scaled| match b.currency {
            Currency::Tokens => i128::from(delta) * i128::from(b.scale),
            Currency::Requests => 0,
        };
        self.run("adjust", key, limits, amount, now_ms)
            .await
            .map(|_| ())
    }
}

impl RedisStore {
    /// [`Store::penalize`] at an explicit time (see [`try_acquire_at`](Self::try_acquire_at)):
    /// every process sharing the key honours the pause, since it lives in Redis.
    pub async fn penalize_at(
        &self,
        key: &str,
        limits: &Limits,
        pause: Duration,
        now_ms: Option<u64>,
    ) -> Result<(), Error> {
        // Whole milliseconds, rounded up: never shorter than the provider asked.
        let pause_ms = u64::try_from(pause.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let pause_ms = pause_ms.min(MAX_EXACT as u64);
        self.run_with_pause("penalize", key, limits, |_| 0, now_ms, pause_ms)
            .await
            .map(|_| ())
    }
}

/// A client for `url`, trusting `config.tls_ca_file` when one is given.
fn open_client(url: &str, config: &RedisConfig) -> Result<redis::Client, String> {
    #[cfg(feature = "redis-tls")]
    {
        // rustls needs a process-wide crypto provider; ring is the one this crate brings. An
        // application that installed its own keeps it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if let Some(path) = &config.tls_ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("could not read the CA file `{}`: {e}", path.display()))?;
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            return redis::Client::build_with_tls(url, certificates)
                .map_err(|e| format!("invalid Redis URL or CA: {e}"));
        }
    }
    #[cfg(not(feature = "redis-tls"))]
    if config.tls_ca_file.is_some() || url.starts_with("rediss://") {
        return Err("TLS (rediss:// or a CA file) needs tollgate's `redis-tls` feature".to_owned());
    }
    redis::Client::open(url).map_err(|e| format!("invalid Redis URL: {e}"))
}

/// Reads back the canonical text `Limits` displays as, for a conflict message.
fn parse_stored_limits(text: &str) -> Option<Limits> {
    let (mut requests, mut tokens) = ("", "");
    for part in text.split(", ") {
        if let Some(rest) = part.strip_prefix("requests ") {
            requests = rest;
        } else if let Some(rest) = part.strip_prefix("tokens ") {
            tokens = rest;
        }
    }
    Limits::parse(requests, tokens).ok()
}

/// Removes `secret` from `text`, in case a driver message echoes the URL.
fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(secret) if !secret.is_empty() => text.replace(secret, "***"),
        _ => text.to_owned(),
    }
}

impl Store for RedisStore {
    async fn try_acquire(&self, key: &str, limits: &Limits, cost: Cost) -> Result<Decision, Error> {
        self.try_acquire_at(key, limits, cost, None)
            .await
            .map(|(decision, _)| decision)
    }

    async fn adjust(&self, key: &str, limits: &Limits, delta: i64) -> Result<(), Error> {
        self.adjust_at(key, limits, delta, None).await
    }

    async fn drain(&self, key: &str, limits: &Limits) -> Result<(), Error> {
        self.run("drain", key, limits, |_| 0, None)
            .await
            .map(|_| ())
    }

    async fn penalize(&self, key: &str, limits: &Limits, pause: Duration) -> Result<(), Error> {
        self.penalize_at(key, limits, pause, None).await
    }

    async fn snapshot(&self, key: &str, limits: &Limits) -> Result<Vec<Available>, Error> {
        self.snapshot_at(key, limits, None).await
    }
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
    fn passwords_are_redacted() {
        assert_eq!(
            redact("redis://:hunter2@localhost:6379/0"),
            (
                "redis://:***@localhost:6379/0".to_owned(),
                Some("hunter2".to_owned())
            )
        );
        assert_eq!(
            redact("rediss://alice:s3cr%40t@host"),
            (
                "rediss://alice:***@host".to_owned(),
                Some("s3cr%40t".to_owned())
            )
        );
        assert_eq!(
            redact("redis://localhost:6379"),
            ("redis://localhost:6379".to_owned(), None)
        );
        assert_eq!(
            scrub("auth hunter2 failed", Some("hunter2")),
            "auth *** failed"
        );
    }

    #[test]
    fn scales_are_reduced_and_bounded() {
        let s = scale(Currency::Tokens, &"2000000/d".parse().unwrap()).unwrap();
        assert_eq!((s.scale, s.refill, s.capacity), (216, 5, 432_000_000));
        let s = scale(Currency::Tokens, &"5/s burst 10".parse().unwrap()).unwrap();
        assert_eq!((s.scale, s.refill, s.capacity), (200, 1, 2_000));
        let s = scale(Currency::Tokens, &"100000/m".parse().unwrap()).unwrap();
        assert_eq!((s.scale, s.refill, s.capacity), (3, 5, 300_000));
        // No common factor: a day and a burst of 800,000 is still exact.
        assert!(scale(Currency::Tokens, &"1001/d burst 800000".parse().unwrap()).is_ok());
        let err = scale(Currency::Tokens, &"7/d burst 1000000000".parse().unwrap()).unwrap_err();
        assert!(err.to_string().contains("outside the range"), "{err}");
    }

    #[test]
    fn stored_limits_read_back() {
        let limits = Limits::parse("60/m; 1000/d", "5/s burst 10").unwrap();
        assert_eq!(parse_stored_limits(&limits.to_string()), Some(limits));
    }
}
