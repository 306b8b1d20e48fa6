//! Reading what a provider's response headers say.
//!
//! - [`parse_retry_after`]: the pause a `Retry-After` value asks for, as delay-seconds or an
//!   HTTP date in any of its three forms, clamped to [`MAX_RETRY_AFTER`].
//! - The readers that need a provider's profile (each currency's limit, what remains, when it
//!   is full again; a 429's pause; Gemini's pause in a 429's body) are the `http` feature's
//!   own: the [`Gate`](crate::http::Gate) reads every answer with them, and its
//!   [`Verdict`](crate::http::Verdict) says what they found.
//!
//! Nothing a provider sends makes any of them panic: a value that can't be read is `None` (or
//! left out), never a guess.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//!
//! let now = SystemTime::now();
//! assert_eq!(tollgate::headers::parse_retry_after("30", now), Some(Duration::from_secs(30)));
//! assert_eq!(tollgate::headers::parse_retry_after("soon", now), None);
//! ```

mod retry_after;

#[cfg(feature = "http")]
pub(crate) use retry_after::until_rfc3339;
pub use retry_after::{MAX_RETRY_AFTER, parse_retry_after};
