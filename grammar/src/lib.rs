//! The small grammars that `tollgate` and its `#[tollgate::limit]` macro share, so that what
//! compiles is exactly what parses: rates (`"100000/m"`, `"5/s burst 10"`, `"60/m; 1000/d"`),
//! timeouts (`"30s"`, `"none"`) and estimator names (`"openai:gpt-4"`). Rates and timeouts use
//! one table of units.
//!
//! It depends on nothing (serde only with the `serde` feature), so that the proc-macro stays
//! light. Use it through `tollgate`, which re-exports what a program needs.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_grammar::{Rate, Rates, parse_timeout};
//!
//! let rate: Rate = "100000/m".parse()?;
//! assert_eq!(rate.period(), Duration::from_secs(60));
//! let windows: Rates = "60/m; 1000/d".parse()?;
//! assert_eq!(windows.len(), 2);
//! assert_eq!(parse_timeout("2 min")?, Some(Duration::from_secs(120)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod duration;
mod estimator;
mod rate;
mod units;

pub use duration::{TimeoutError, parse_timeout};
pub use estimator::{Encoding, EstimatorName, EstimatorNameError};
pub use rate::{
    MAX_CAPACITY_UNITS, MICROS_PER_DOLLAR, Money, Rate, RateError, RateErrorKind, Rates,
    parse_dollars,
};
