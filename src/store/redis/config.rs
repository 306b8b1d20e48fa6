//! How a [`RedisStore`](super::RedisStore) connects and fails.

use std::time::Duration;

/// How a [`RedisStore`](super::RedisStore) connects and fails.
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::redis::RedisConfig;
///
/// let config = RedisConfig::default()
///     .with_prefix("myapp")
///     .with_timeout(Duration::from_millis(250));
/// assert_eq!(config.prefix(), "myapp");
/// assert_eq!(config.lease(), Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    pub(super) fail_open: bool,
    pub(super) lease: Duration,
    pub(super) liveness: Duration,
    pub(super) tls_ca_file: Option<std::path::PathBuf>,
}

impl Default for RedisConfig {
    fn default() -> RedisConfig {
        RedisConfig {
            prefix: "tollgate".to_owned(),
            timeout: Duration::from_secs(1),
            fail_open: false,
            lease: Duration::from_secs(1),
            liveness: Duration::from_secs(5),
            tls_ca_file: None,
        }
    }
}

impl RedisConfig {
    /// Kept apart from other prefixes in every key's name. Default `tollgate`.
    pub fn with_prefix(self, prefix: impl Into<String>) -> RedisConfig {
        RedisConfig {
            prefix: prefix.into(),
            ..self
        }
    }

    /// The longest any one store call may take, connection included. Default 1 s.
    pub fn with_timeout(self, timeout: Duration) -> RedisConfig {
        RedisConfig { timeout, ..self }
    }

    /// Admit (with a warning) instead of failing when Redis can't be reached or does not answer
    /// in time. Nothing else is admitted: refused limits, conflicts and bad arguments are
    /// errors. Default false.
    pub fn with_fail_open(self, fail_open: bool) -> RedisConfig {
        RedisConfig { fail_open, ..self }
    }

    /// How long past its due time a waiting call's ticket is kept without its holder asking
    /// for it: what a call whose process died holds the key up for, at most. Default 1 s.
    pub fn with_lease(self, lease: Duration) -> RedisConfig {
        RedisConfig { lease, ..self }
    }

    /// How long a limiter whose calls wait stays quiet before it asks the server whether it
    /// still answers (a `ping` through the script), when no answer came and none of its waiters
    /// will ask within that time: every waiter then learns of a dead or stopped server within
    /// this plus half of it plus the timeout, instead of at its own turn. Every answer counts
    /// as a sign of life, so a busy limiter never asks. Default 5 s; a shorter time notices
    /// sooner and costs a command a quiet limiter per period (never below 20 ms).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::redis::RedisConfig;
    ///
    /// let config = RedisConfig::default().with_liveness(Duration::from_millis(500));
    /// assert_eq!(config.liveness(), Duration::from_millis(500));
    /// assert_eq!(RedisConfig::default().liveness(), Duration::from_secs(5));
    /// ```
    pub fn with_liveness(self, liveness: Duration) -> RedisConfig {
        RedisConfig { liveness, ..self }
    }

    /// For `rediss://` URLs: a PEM file of the certificate authority to trust instead of the
    /// system's roots (a private CA, a self-signed server). Needs the `redis-tls` feature.
    pub fn with_tls_ca_file(self, path: impl Into<std::path::PathBuf>) -> RedisConfig {
        RedisConfig {
            tls_ca_file: Some(path.into()),
            ..self
        }
    }

    /// The prefix of every key's name.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The longest any one store call may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether an unreachable Redis admits.
    pub fn fail_open(&self) -> bool {
        self.fail_open
    }

    /// How long an unclaimed ticket is kept past its due time.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How long a waiting limiter stays quiet before it asks whether the server answers.
    pub fn liveness(&self) -> Duration {
        self.liveness
    }

    /// The certificate authority for TLS, if one is given.
    pub fn tls_ca_file(&self) -> Option<&std::path::Path> {
        self.tls_ca_file.as_deref()
    }
}
