//! Timeouts: `"30s"`, `"500ms"`, `"2 min"`, `"1d"`, or `"none"`, in the units rates use.

use std::fmt;
use std::time::Duration;

use crate::rate::{RateErrorKind, parse_count};
use crate::units::{split_count, unit_nanos};

/// Parses a timeout: `Ok(None)` for `"none"` (no deadline), the duration otherwise.
///
/// The units are the rate grammar's, in any spelling and case (`ms`, `s`, `sec`, `m`, `min`,
/// `h`, `d`, `days`, ...), after a whole number.
///
/// ```
/// use std::time::Duration;
/// use tollgate_grammar::parse_timeout;
///
/// assert_eq!(parse_timeout("30s")?, Some(Duration::from_secs(30)));
/// assert_eq!(parse_timeout("30S")?, Some(Duration::from_secs(30)));
/// assert_eq!(parse_timeout("1d")?, Some(Duration::from_secs(86_400)));
/// assert_eq!(parse_timeout("250 ms")?, Some(Duration::from_millis(250)));
/// assert_eq!(parse_timeout("none")?, None);
/// assert!(parse_timeout("30 parsecs").is_err());
/// # Ok::<(), tollgate_grammar::TimeoutError>(())
/// ```
pub fn parse_timeout(text: &str) -> Result<Option<Duration>, TimeoutError> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let bad = |kind| TimeoutError {
        input: text.to_owned(),
        kind,
    };
    let (count, unit) = split_count(trimmed);
    if count.is_empty() || unit.is_empty() {
        return Err(bad(TimeoutErrorKind::Malformed));
    }
    let size = unit_nanos(unit).ok_or_else(|| bad(TimeoutErrorKind::Malformed))?;
    let count = parse_count(count).map_err(|kind| match kind {
        RateErrorKind::Overflow(_) => bad(TimeoutErrorKind::TooLong),
        _ => bad(TimeoutErrorKind::Malformed),
    })?;
    count
        .checked_mul(size)
        .map(|nanos| Some(Duration::from_nanos(nanos)))
        .ok_or_else(|| bad(TimeoutErrorKind::TooLong))
}

/// A timeout that does not parse; the message names the input and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutError {
    input: String,
    kind: TimeoutErrorKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimeoutErrorKind {
    Malformed,
    TooLong,
}

impl TimeoutError {
    /// The text that was refused.
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for TimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            TimeoutErrorKind::Malformed => write!(
                f,
                "timeout `{}`: expected a duration like \"30s\", \"500ms\", \"2m\" or \"1h\", or \"none\" to wait as long as it takes",
                self.input
            ),
            TimeoutErrorKind::TooLong => write!(
                f,
                "timeout `{}`: too long; the longest is 2^64 - 1 nanoseconds (about 584 years), or \"none\" to wait as long as it takes",
                self.input
            ),
        }
    }
}

impl std::error::Error for TimeoutError {}
