//! One error enum; every variant says what to do about it.

use std::sync::Arc;
use std::time::Duration;

use crate::bucket::BucketError;
use crate::cost::Cost;
use crate::rate::{Currency, Limits, Rate, RateError};

/// The cause of a store's failure, shared so that every waiter it fails can carry it.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

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

    /// A cost that pays for nothing: zero in every currency.
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

    /// A call on a key with a spend budget, for a model with no known price: the budget can't
    /// be kept for it. Give the model its price (`Profile::models`, or the proxy's model
    /// table), or keep the budget on keys whose models are priced.
    #[error(
        "key `{key}`: the model `{model}` has no price, and the key keeps a spend budget; give the model its price (Profile::models, or the proxy's models table)"
    )]
    Unpriced {
        /// The key.
        key: String,
        /// The model the request named (empty: none).
        model: String,
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

    /// The store could not be reached, or did not answer in time (Redis down, stopped, or the
    /// network cut). Nothing was admitted. This is what `fail_open` turns into an admission;
    /// retrying later may succeed.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What failed, without secrets.
        message: String,
        /// The underlying error (passwords scrubbed).
        #[source]
        source: Option<Cause>,
    },

    /// The store answered, but with an error or with something this version can't read (a
    /// script error, a refused argument, a reply of the wrong shape). Nothing was admitted.
    #[error("store: {message}")]
    Store {
        /// What failed, without secrets.
        message: String,
        /// The underlying error (passwords scrubbed).
        #[source]
        source: Option<Cause>,
    },

    /// Limits this store can't keep exactly (the Redis script's integers have a narrower range
    /// than the in-memory arithmetic). Refused when the limiter is built, never approximated.
    #[error("key `{key}`: the limits {limits} can't be kept by this store: {reason}")]
    UnsupportedLimits {
        /// The key.
        key: String,
        /// The limits asked for.
        limits: Limits,
        /// Which window is out of range, and what would fit.
        reason: String,
    },

    /// [`install_store`](crate::install_store) was called when the process-wide store was
    /// already chosen. Call it once, at startup, before the first limited call.
    #[error(
        "the process-wide store is already chosen (install_store must be called once, before the first limited call)"
    )]
    StoreAlreadyInstalled,

    /// A configuration file with bad entries: every one is listed, with its key.
    #[error("configuration: {}", problems.join("\n"))]
    Config {
        /// One line per bad entry, `keys.<key>.<field>: what is wrong`.
        problems: Vec<String>,
    },

    /// A request body the HTTP gate can't read to meter it (a `content-encoding` it doesn't
    /// know, a body that decodes past its limit, or one that is not what its encoding says).
    /// Nothing was charged or sent: send the body plain, or smaller.
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    #[error(transparent)]
    Body(#[from] BodyError),

    /// The token estimate could not be made.
    #[error("estimator: {message}")]
    Estimator {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Cause>,
    },
}

impl From<tollgate_estimators::EstimatorError> for Error {
    fn from(err: tollgate_estimators::EstimatorError) -> Error {
        Error::Estimator {
            message: err.to_string(),
            source: Some(Arc::new(err)),
        }
    }
}

impl From<tollgate_estimators::ExtractError> for Error {
    fn from(err: tollgate_estimators::ExtractError) -> Error {
        Error::Estimator {
            message: err.to_string(),
            source: Some(Arc::new(err)),
        }
    }
}

impl Error {
    /// The error for bucket-level refusal `err` on `key`, with `cost` for context.
    pub(crate) fn from_bucket(key: &str, cost: Cost, err: BucketError) -> Error {
        match err {
            BucketError::ZeroCost => Error::InvalidCost {
                key: key.to_owned(),
                cost,
                reason:
                    "it is zero in every currency; a call pays at least one request or one token"
                        .to_owned(),
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
            BucketError::QueueFull => Error::QueueFull {
                key: key.to_owned(),
                limit: crate::bucket::MAX_QUEUE,
            },
        }
    }

    /// A store that answered with an error: `message` says what failed, `source` why.
    pub fn store(message: impl Into<String>, source: Option<Cause>) -> Error {
        Error::Store {
            message: message.into(),
            source,
        }
    }

    /// A store that could not be reached or did not answer in time.
    pub fn unavailable(message: impl Into<String>, source: Option<Cause>) -> Error {
        Error::Unavailable {
            message: message.into(),
            source,
        }
    }

    /// True for errors that a later retry may not see (timeouts, a full queue, a store that
    /// could not be reached); false for errors in the input or the setup, which will fail again.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::QueueFull { .. } | Error::Unavailable { .. }
        )
    }

    /// The same error, for another waiter: a store failure is shared by every call it fails.
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::Unavailable { message, source } => Error::Unavailable {
                message: message.clone(),
                source: source.clone(),
            },
            Error::Store { message, source } => Error::Store {
                message: message.clone(),
                source: source.clone(),
            },
            other => Error::Store {
                message: other.to_string(),
                source: None,
            },
        }
    }
}

#[cfg(feature = "http")]
/// Why a request body can't be sent through the HTTP gate (`tollgate::http::BodyError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// A `content-encoding` the gate can't undo (it undoes `gzip`, `x-gzip`, `deflate`, `br`,
    /// `zstd` and `identity`): it could not be metered. (A proxy answers 415.)
    #[error(
        "the request body's content-encoding `{0}` is not one the gate can read (gzip, deflate, br, zstd)"
    )]
    UnsupportedEncoding(String),
    /// Decoded, the body would be larger than the gate takes. (A proxy answers 413.)
    #[error("the request body decodes to more than {most} bytes")]
    TooLarge {
        /// The most the gate decodes.
        most: usize,
    },
    /// The body does not decode as its `content-encoding` says. (A proxy answers 400.)
    #[error("the request body is not valid {0}")]
    Corrupt(String),
}
