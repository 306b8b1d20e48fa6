//! The duration grammar of timeouts: `"30s"`, `"500ms"`, `"2m"`, `"1h"`, or `"none"`.
//!
//! Shared, as source, with the `#[tollgate::limit]` macro, which checks timeouts when the code
//! compiles.

use std::time::Duration;

/// Parses a timeout: `Ok(None)` for `"none"` (no deadline), the duration otherwise, or a
/// message naming the input and what was expected.
pub fn parse_timeout(text: &str) -> Result<Option<Duration>, String> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let bad = || {
        format!(
            "timeout `{text}`: expected a duration like \"30s\", \"500ms\", \"2m\" or \"1h\", or \"none\" to wait as long as it takes"
        )
    };
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(bad)?;
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.trim() {
        "ms" => 1_000_000,
        "s" | "sec" | "secs" => 1_000_000_000,
        "m" | "min" | "mins" => 60_000_000_000,
        "h" | "hr" | "hrs" => 3_600_000_000_000,
        _ => return Err(bad()),
    };
    number
        .checked_mul(scale)
        .map(|nanos| Some(Duration::from_nanos(nanos)))
        .ok_or_else(bad)
}
