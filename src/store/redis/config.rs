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
    pub(super) tls_ca_file: Option<std::path::PathBuf>,
}

impl Default for RedisConfig {
    fn default() -> RedisConfig {
        RedisConfig {
            prefix: "tollgate".to_owned(),
            timeout: Duration::from_secs(1),
            fail_open: false,
            lease: Duration::from_secs(1),
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

    /// The certificate authority for TLS, if one is given.
    pub fn tls_ca_file(&self) -> Option<&std::path::Path> {
        self.tls_ca_file.as_deref()
    }
}
