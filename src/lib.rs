//! Keep calls to LLM APIs inside their rate limits.
//!
//! Providers limit requests per period and text tokens per period at once (some also output
//! tokens apart). tollgate makes every call pay its toll before it goes out: one request, and
//! the tokens its arguments will cost, counted with the provider's own tokenizer. Each key has
//! a request window and a token window (or several of each, like `60/m; 1000/d`); a call
//! proceeds only when every window can pay, all or nothing, and otherwise waits its turn, never
//! past its deadline. Calls that share a key share the windows: across the tasks of a process
//! through the in-memory store, across processes and machines through Redis.
//!
//! The front door is an attribute on async functions, [`limit`]:
//!
//! ```
//! #[derive(Debug)]
//! enum ApiError { Limited(tollgate::Error) }
//! impl From<tollgate::Error> for ApiError {
//!     fn from(e: tollgate::Error) -> Self { ApiError::Limited(e) }
//! }
//!
//! #[tollgate::limit(key = "openai", requests = "500/m", tokens = "200000/m", estimator = "words")]
//! async fn summarise(text: &str) -> Result<String, ApiError> {
//!     // ... call the API: the call has already paid 1 request and the tokens of `text` ...
//!     Ok(text.chars().take(10).collect())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ApiError> {
//! summarise("a long document").await?;
//! # Ok(())
//! # }
//! ```
//!
//! Underneath, the same with a [`Limiter`] of the process-wide [`Registry`]:
//!
//! ```
//! use tollgate::{Cost, Limits, Registry};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! let limits = Limits::parse("500/m", "200000/m")?;
//! // Every task that asks the registry for "openai" shares these windows.
//! let limiter = Registry::global().limiter("openai", &limits)?;
//! let permit = limiter.acquire(Cost::call(1_500)).await?;
//! println!("admitted after {:?}", permit.waited());
//! // After the call, the real usage corrects the estimate.
//! permit.settle(1_480).await?;
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
//! `h`/`hr`/`hour`, `d`/`day` (and `ms`); timeouts (`"30s"`, `"1d"`) use the same table. See
//! [`Rate`] and [`Limits`].
//!
//! # The promises
//!
//! - **All windows, or none**: a call that one window can pay and another can't consumes
//!   nothing.
//! - **Exact**: the arithmetic is in integers scaled by the period in nanoseconds, so decisions
//!   are those of exact rational arithmetic; a refusal keeps its partial credit and a long
//!   silence refills to capacity, never beyond.
//! - **The window bound**: in any interval of length `dt`, the admitted cost of a window is at
//!   most `B + r·dt`, under any number of tasks and processes.
//! - **Errors are for errors**: a cost above capacity is [`Error::CostExceedsCapacity`] at
//!   once; an insufficient balance is an answer ([`Attempt::NotYet`]), and waiting fails only
//!   when the deadline passes ([`Error::Timeout`]) or the store fails.
//! - **Arrival order**: calls on a key are admitted in the order they reached the store.
//! - **Cancel-safe**: a dropped wait holds nothing and consumed nothing.
//!
//! # How waiting works
//!
//! - **The queue.** A call the key can't pay for at once takes a *ticket* from the store: its
//!   place behind every call that arrived before it, and the instant it is *due*, when the key
//!   can pay for it after everyone ahead of it has paid. Tickets hold no tokens; only an
//!   admission charges the windows, so the window bound is the bucket's own. A newcomer passes
//!   at once only if the key can pay for it on top of every waiting ticket: no later call
//!   delays an earlier one, and a large call is never starved by a stream of small ones.
//! - **The sleep.** A waiter sleeps until it is due, then asks once. If the calls ahead paid on
//!   time it passes. If one of them is still waiting (it woke a little late), the store says
//!   so ([`store::Outcome::Behind`]): nothing failed, and the waiter waits for that call to
//!   pass, which nudges it at once when both are in this process (a line due within one timer
//!   tick passes within that tick), or sleeps the store's hint when the call ahead is another
//!   process's. If it is first in line and still can't pass, the store answers with the exact
//!   time until it could (the *hint*): the first such retry sleeps exactly that, ending with a
//!   few milliseconds of yielding rather than a timer tick late (a small burst can't absorb
//!   the lateness); every later one sleeps the hint plus a jitter whose ceiling starts at 5 ms
//!   and doubles each time, up to 1 s ([`Backoff`]). Sleeps to a due time carry no jitter:
//!   every waiter has its own due time, so there is no herd to spread, and jitter there would
//!   only cost throughput on a small burst.
//! - **The deadline.** When the turn would come after the call's deadline, the answer is
//!   [`Error::Timeout`] at once, with the time it would have needed; no call returns later than
//!   its deadline, store calls included. [`WaitPolicy`] sets the deadline (60 s) and how many
//!   calls may wait on a key (10,000).
//! - **Across processes.** On Redis the queue lives in the server, so arrival order, due times
//!   and the bound hold across every process that shares the key, on the server's clock. A
//!   dropped wait gives its ticket back (a call cut while its question is on the wire gives back
//!   what the answer took); a ticket whose process died lapses one lease (1 s) after it was due.
//!   When the server dies or stops, every waiter on the key learns it within one and a half
//!   liveness periods (5 s each by default, `RedisConfig::with_liveness`) and a store timeout,
//!   or at its own turn if that comes first. Not shared across processes: the jitter of a waiter, and
//!   in-process pauses of a [`MemoryStore`].
//! - **Time in tests.** Waits sleep on tokio's timer. A [`MemoryStore`] reads the CPU's
//!   counter, except one whose first call runs on a runtime whose clock is paused
//!   (`#[tokio::test(start_paused = true)]`, or `tokio::time::pause()` before the first call):
//!   it follows tokio's clock, so the test drives its windows too. A store first used before
//!   the clock is paused follows it if made with [`MemoryStore::on_tokio_clock`];
//!   [`ManualClock`] moves only when told to.
//!
//! # Layers
//!
//! The bucket arithmetic is pure and exact; a [`Store`] keeps the windows of every key
//! ([`MemoryStore`] in process, `store::redis::RedisStore` across processes) and applies one
//! [`store::Op`] at a time to a key; a [`Limiter`] is one key on a store with a
//! [`WaitPolicy`]; the [`Registry`] maps keys to limiters for the whole process.
//!
//! # Glossary
//!
//! - **Key**: what a set of windows belongs to (`"openai:gpt-4o"`, a tenant, a budget); calls
//!   that share a key share its windows.
//! - **Currency**: what a window counts: requests, tokens, output tokens, or spend
//!   (micro-dollars, for budgets like `"$50/d"`). A [`Cost`] has an amount in each.
//! - **Window**: one rate of one currency, `N/P burst B`: it holds at most `B` and refills `N`
//!   every `P`. A key has any number per currency; a call must fit every one.
//! - **Burst**: a window's capacity, the most one call can cost in it.
//! - **Level**: what a window holds now (negative: in debt, after a settlement charged more
//!   than it held).
//! - **Toll**: what a call pays before it goes out: its [`Cost`], in every currency at once.
//! - **Permit**: the proof a call paid, which settles it later ([`Permit`]).
//! - **Ticket**: a waiting call's place in its key's queue, with when it is due; it holds no
//!   tokens until it passes.
//! - **Queue** (the *line* of waiters in this process is the same queue, as one process sees
//!   it): the tickets of a key, in arrival order.
//! - **Hint**: the exact time until a refused call could pass.
//! - **Pause**: a time a provider's 429 asked for, during which nothing on the key passes.
//! - **Settle**: correct a call's charge to what it really used: a refund for an overestimate,
//!   a charge (the *shortfall*) for an underestimate.
//! - **Calls in flight**: the calls that went out through the HTTP gate and have not settled;
//!   a key remembers what each was charged and what its windows held when it went out.
//! - **Sync**: bring a key's windows in line with a provider's `remaining` count, read from the
//!   answer to one call in flight.
//! - **Spending elsewhere**: what others spend from the same provider quota, seen only in its
//!   counts; the gate models its rate and charges it between syncs.
//! - **Correction** (the *cover* in the code): what a sync or a 429 took off a key's windows to
//!   reach the provider's count; a call that count already held settles its shortfall against
//!   it instead of paying twice.
//! - **Budget**: windows of the spend currency, kept in micro-dollars.
//!
//! # Features
//!
//! With `default-features = false` the core builds with tokio, serde, rand and tracing only,
//! and estimates with `words`.
//!
#![doc = document_features::document_features!()]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod bucket;
mod clock;
mod config;
mod cost;
mod counting;
mod error;
pub mod headers;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod limiter;
mod macro_support;
mod rate;
mod rate_limited;
mod registry;
pub mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use backoff::Backoff;
pub use bucket::{Amount, Available, Snapshot};
pub use clock::ManualClock;
pub use config::{Config, KeyConfig, install_config};
pub use cost::{Cost, Dollars, Margin, Usage};
pub use error::{Cause, Error};
#[doc(no_inline)]
pub use headers::{MAX_RETRY_AFTER, parse_retry_after};
pub use limiter::{Attempt, Limiter, LimiterBuilder, Permit, Settled, WaitPolicy};
pub use rate::{
    Currencies, Currency, Limits, MICROS_PER_DOLLAR, Money, PerCurrency, Rate, RateError,
    RateErrorKind, Rates,
};
pub use rate_limited::RateLimited;
pub use registry::{Registry, install_store};
pub use store::{MemoryStore, Store};
/// The estimators crate: token counts from a call's arguments.
pub use tollgate_estimators as estimators;
pub use tollgate_estimators::{Estimate, Estimator};
#[doc = include_str!("limit.md")]
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
