//! One error enum; every variant says what to do about it.

use std::time::Duration;

use crate::bucket::{BucketError, Cost};
use crate::rate::{Currency, Limits, Rate, RateError};

/// Everything that can go wrong in tollgate.
///
/// An insufficient balance is *not* an error: [`Limiter::try_acquire`](crate::Limiter::try_acquire)
/// answers it with the time until the call could pass, and waiting only fails with
/// [`Error::Timeout`] when the deadline passes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A rate string that does not parse.
    #[error(transparent)]
    Rate(#[from] RateError),

    /// A cost that no window can take: zero in a limited currency.
    #[error("key `{key}`: cost {cost} is invalid: {reason}")]
    InvalidCost {
        /// The key.
        key: String,
        /// The cost that was asked for.
        cost: Cost,
        /// Why it is invalid.
        reason: String,
    },

    /// A cost above a window's burst. Waiting cannot make it admissible, so it is answered at
    /// once: raise the burst, or split the call.
    #[error(
        "key `{key}`: a cost of {cost} {currency} exceeds the capacity {capacity} of the {currency} window `{rate}`; waiting cannot help: raise the burst or split the call"
    )]
    CostExceedsCapacity {
        /// The key.
        key: String,
        /// The currency of the window.
        currency: Currency,
        /// The window that is too small.
        rate: Rate,
        /// The cost that was asked for.
        cost: u64,
        /// The window's burst.
        capacity: u64,
    },

    /// The deadline passed, or would pass before the tokens could exist. Nothing was charged:
    /// retry later, lengthen the timeout, or raise the limits.
    #[error("key `{key}`: timed out after {waited:?}{}", needed.map(|n| format!("; the call needed {n:?} more to be admitted")).unwrap_or_default())]
    Timeout {
        /// The key.
        key: String,
        /// How long the call waited before giving up.
        waited: Duration,
        /// How much longer it would have needed, when that is known.
        needed: Option<Duration>,
    },

    /// Too many calls are already waiting on this key: shed load or raise the queue limit.
    #[error(
        "key `{key}`: {limit} calls are already waiting; the queue is full (raise `max_waiters` or shed load)"
    )]
    QueueFull {
        /// The key.
        key: String,
        /// The queue limit.
        limit: usize,
    },

    /// The same key was asked for with different limits. Use one set of limits per key, or
    /// give the other use its own key.
    #[error(
        "key `{key}` is already limited by {existing}, and was now asked for with {requested}; use one set of limits per key, or another key"
    )]
    ConflictingLimits {
        /// The key.
        key: String,
        /// The limits in force.
        existing: Limits,
        /// The limits asked for.
        requested: Limits,
    },

    /// A limiter with no windows at all.
    #[error("key `{key}`: no limits given; give at least one request or token rate")]
    NoLimits {
        /// The key.
        key: String,
    },

    /// `#[tollgate::limit]` without rates, for a key the configuration doesn't cover.
    #[error(
        "key `{key}` (in {function}): #[tollgate::limit] gives no rates, and the configuration has no [keys.{key}] or [default] section; install one with tollgate::install_config or TOLLGATE_CONFIG, or give requests/tokens in the attribute"
    )]
    NotConfigured {
        /// The key.
        key: String,
        /// The function.
        function: String,
    },

    /// A manual clock was moved backwards, or a bucket was given a time before its last update.
    #[error("time went backwards from {from:?} to {to:?}; a clock may only move forward")]
    ClockWentBackwards {
        /// The time before.
        from: Duration,
        /// The earlier time that was asked for.
        to: Duration,
    },

    /// The store failed (Redis down, timed out, answered garbage). Nothing was admitted.
    #[error("store: {message}")]
    Store {
        /// What failed, without secrets.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// A configuration file with bad entries: every one is listed, with its key.
    #[error("configuration: {}", problems.join("\n"))]
    Config {
        /// One line per bad entry, `keys.<key>.<field>: what is wrong`.
        problems: Vec<String>,
    },

    /// The token estimate could not be made.
    #[error("estimator: {message}")]
    Estimator {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl From<tollgate_estimators::EstimatorError> for Error {
    fn from(err: tollgate_estimators::EstimatorError) -> Error {
        // The message already says all the cause says; a source would print it twice.
        Error::Estimator {
            message: err.to_string(),
            source: None,
        }
    }
}

impl From<tollgate_estimators::ExtractError> for Error {
    fn from(err: tollgate_estimators::ExtractError) -> Error {
        // The message already says all the cause says; a source would print it twice.
        Error::Estimator {
            message: err.to_string(),
            source: None,
        }
    }
}

impl Error {
    /// The error for bucket-level refusal `err` on `key`, with `cost` for context.
    pub(crate) fn from_bucket(key: &str, cost: Cost, err: BucketError) -> Error {
        match err {
            BucketError::ZeroCost { currency } => Error::InvalidCost {
                key: key.to_owned(),
                cost,
                reason: format!(
                    "a call pays at least 1 of every limited currency, and {currency} is limited"
                ),
            },
            BucketError::CostExceedsCapacity {
                currency,
                rate,
                cost,
            } => Error::CostExceedsCapacity {
                key: key.to_owned(),
                currency,
                rate,
                cost,
                capacity: rate.burst(),
            },
            BucketError::TimeWentBackwards { last, now } => Error::ClockWentBackwards {
                from: last.as_duration(),
                to: now.as_duration(),
            },
        }
    }

    /// A store error with a message and a cause.
    pub fn store(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error::Store {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// True for errors that a later retry may not see (timeouts, a full queue, a store that
    /// failed); false for errors in the input, which will fail again.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::QueueFull { .. } | Error::Store { .. }
        )
    }
}
