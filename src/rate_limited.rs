//! What an error says about a provider's refusal, for the macro's `retries`.

use std::time::Duration;

/// What a function's error says about a provider's refusal, for `#[tollgate::limit(retries = N)]`.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(Debug)]
/// enum ApiError {
///     Status { code: u16, retry_after: Option<Duration> },
///     Limited(tollgate::Error),
/// }
///
/// impl tollgate::RateLimited for ApiError {
///     fn is_rate_limited(&self) -> bool {
///         matches!(self, ApiError::Status { code: 429, .. })
///     }
///     fn retry_after(&self) -> Option<Duration> {
///         match self {
///             ApiError::Status { retry_after, .. } => *retry_after,
///             _ => None,
///         }
///     }
/// }
/// ```
pub trait RateLimited {
    /// True when the provider refused the call for its rate limit (an HTTP 429).
    fn is_rate_limited(&self) -> bool;

    /// How long the provider asked to wait (its `Retry-After`), if it said.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}
