//! Reading what a provider's response headers say.
//!
//! - [`parse_retry_after`]: the pause a `Retry-After` value asks for, as delay-seconds or an
//!   HTTP date in any of its three forms, clamped to [`MAX_RETRY_AFTER`].
//! - With the `http` feature, [`rate_headers`] reads each currency's limit, what remains and
//!   when it is full again, in a [`Profile`](crate::http::Profile)'s header names and reset
//!   forms; [`retry_pause`] reads a 429's pause from `retry-after-ms` or `retry-after`; and
//!   [`go_duration`] reads resets written like `6m0s`, `1.5s` or `2m59.56s`; and
//!   [`retry_info_delay`] reads the pause Google's APIs (Gemini) state only in a 429's body.
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

#[cfg(feature = "http")]
mod rates;
mod retry_after;
#[cfg(feature = "http")]
mod retry_info;

#[cfg(feature = "http")]
pub use rates::{RateHeader, go_duration, rate_headers, retry_pause};
#[cfg(feature = "http")]
pub(crate) use rates::{write_go_duration, write_rfc3339};
pub use retry_after::{MAX_RETRY_AFTER, parse_retry_after};
#[cfg(feature = "http")]
pub use retry_info::retry_info_delay;
