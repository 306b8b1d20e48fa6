//! Keep calls to LLM APIs inside their rate limits.
//!
//! Providers limit requests per period and text tokens per period at once. tollgate makes every
//! call pay its toll before it goes out: one request, and the tokens its arguments will cost.
//! Each key has a request bucket and a token bucket (or several windows of each, like
//! `60/m; 1000/d`); a call proceeds only when every bucket can pay, all or nothing, and
//! otherwise waits with jittered exponential backoff, never past its deadline.
//!
//! ```
//! use tollgate::{Cost, Limits, Registry};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! let limits = Limits::parse("500/m", "200000/m")?;
//! // Every task that asks the process-wide registry for "openai" shares these buckets.
//! let limiter = Registry::global().limiter("openai", &limits)?;
//! let permit = limiter.acquire(Cost::call(1_500)).await?;
//! println!("admitted after {:?}", permit.waited());
//! # Ok(())
//! # }
//! ```
//!
//! # Rates
//!
//! | written | capacity (burst) | refill |
//! |---|---|---|
//! | `50/s` | 50 | 50 per second |
//! | `100000/m`, `100000 per minute` | 100,000 | 100,000 per minute |
//! | `10/5m` | 10 | 10 per 5 minutes |
//! | `5/s burst 10` | 10 | 5 per second |
//! | `60/m; 1000/d` | two windows | a call must fit both |
//!
//! Units are case-insensitive, singular or plural: `s`/`sec`/`second`, `m`/`min`/`minute`,
//! `h`/`hr`/`hour`, `d`/`day` (and `ms`). See [`Rate`].
//!
//! # The promises
//!
//! - **Both buckets, or none**: a call that one window can pay and another can't consumes
//!   nothing.
//! - **Exact**: the arithmetic is in integers scaled by the period in nanoseconds, so decisions
//!   are those of exact rational arithmetic; a refusal keeps its partial credit and a long
//!   silence refills to capacity, never beyond.
//! - **The window bound**: in any interval of length `dt`, the admitted cost of a window is at
//!   most `B + r·dt`.
//! - **Errors are for errors**: a cost above capacity is [`Error::CostExceedsCapacity`] at
//!   once; an insufficient balance is an answer ([`Attempt::NotYet`]), and waiting fails only
//!   when the deadline passes ([`Error::Timeout`]).
//! - **Cancel-safe**: a dropped wait holds nothing and consumed nothing.
//!
//! # Layers
//!
//! The bucket arithmetic is pure and exact; a [`Store`] keeps the windows of every key
//! ([`MemoryStore`] in process, `store::redis::RedisStore` across processes); a [`Limiter`] is
//! one key on a store with a [`WaitPolicy`]; the [`Registry`] maps keys to limiters for the
//! whole process.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod bucket;
mod clock;
mod config;
mod cost;
mod error;
mod limiter;
mod macro_support;
mod rate;
mod registry;
mod retry_after;
pub mod store;
pub mod testing;

pub use backoff::Backoff;
pub use bucket::{Available, Tokens};
pub use clock::ManualClock;
pub use config::{Config, KeyConfig, install_config};
pub use cost::{Cost, Usage};
pub use error::{Cause, Error};
pub use limiter::{Attempt, Limiter, LimiterBuilder, Permit, Settled, WaitPolicy};
pub use macro_support::RateLimited;
pub use rate::{Currency, Limits, Rate, RateError, RateErrorKind, Rates};
pub use registry::{Registry, install_store};
pub use retry_after::{MAX_RETRY_AFTER, parse_retry_after};
pub use store::{MemoryStore, Store};
/// The estimators crate: token counts from a call's arguments.
pub use tollgate_estimators as estimators;
pub use tollgate_estimators::{Estimate, Estimator};
pub use tollgate_macros::limit;

/// What `#[tollgate::limit]` expands to; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::macro_support::*;
}

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
