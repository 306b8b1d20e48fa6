//! Reading what a provider's headers say: each currency's limit, what remains, when it is full
//! again, and how long a 429 asks to wait.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::profile::{Profile, ResetForm};
use crate::headers::{MAX_RETRY_AFTER, parse_retry_after, until_rfc3339};
use crate::rate::Currency;

/// What the headers of one response said about one currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct RateHeader {
    /// The currency.
    pub currency: Currency,
    /// The provider's limit for it.
    pub limit: Option<u64>,
    /// What is left of it.
    pub remaining: Option<u64>,
    /// How long until it is full again.
    pub reset: Option<Duration>,
}

/// Every currency the profile names that the headers speak of, in the profile's order.
/// Unreadable values are left out (`None`), never guessed.
pub(crate) fn rate_headers(
    profile: &Profile,
    headers: &HeaderMap,
    now: SystemTime,
) -> Vec<RateHeader> {
    profile
        .headers
        .iter()
        .filter_map(|names| {
            let text = |name: &str| headers.get(name).and_then(header_text);
            let read = RateHeader {
                currency: names.currency,
                limit: text(&names.limit).and_then(count),
                remaining: text(&names.remaining).and_then(count),
                reset: text(&names.reset).and_then(|t| reset(profile.reset, t, now)),
            };
            (read.limit.is_some() || read.remaining.is_some() || read.reset.is_some())
                .then_some(read)
        })
        .collect()
}

/// A header's value as text: visible ASCII as `http` reads it, or any UTF-8 (a reset written
/// `500µs` has a micro sign in it).
fn header_text(value: &http::HeaderValue) -> Option<&str> {
    value
        .to_str()
        .ok()
        .or_else(|| std::str::from_utf8(value.as_bytes()).ok())
}

/// A count: digits, or a number with a fraction (rounded down: what remains is never read as
/// more than was said), huge values saturating. Negative or other text is unreadable.
fn count(text: &str) -> Option<u64> {
    let text = text.trim();
    let whole = match text.split_once('.') {
        Some((whole, fraction)) if fraction.bytes().all(|b| b.is_ascii_digit()) => whole,
        Some(_) => return None,
        None => text,
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(whole.parse::<u64>().unwrap_or(u64::MAX))
}

fn reset(form: ResetForm, text: &str, now: SystemTime) -> Option<Duration> {
    match form {
        ResetForm::Duration => go_duration(text),
        ResetForm::Rfc3339 => until_rfc3339(text, now),
        ResetForm::Seconds => parse_retry_after(text, now),
    }
}

/// A Go-style duration as OpenAI writes its resets: `6m0s`, `1s`, `20ms`, `1h2m3.5s`, `250us`;
/// clamped to [`MAX_RETRY_AFTER`], rounded up to the nanosecond.
pub(crate) fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let scale: u128 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" | "μs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return None;
        }
        // Long digit strings saturate: the result is clamped anyway.
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().unwrap_or(u128::from(u64::MAX))
        };
        if !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Eighteen digits are read; any non-zero digit beyond them still counts (rounded up).
        let digits = &fraction[..fraction.len().min(18)];
        let beyond = fraction[digits.len()..].bytes().any(|b| b != b'0');
        let part = if digits.is_empty() {
            0
        } else {
            let value: u128 = digits.parse().ok()?;
            (value * scale).div_ceil(10u128.pow(digits.len() as u32))
        };
        let part = if beyond && part == 0 { 1 } else { part };
        nanos = nanos
            .saturating_add(whole.saturating_mul(scale))
            .saturating_add(part);
        rest = after;
    }
    let max = MAX_RETRY_AFTER.as_nanos();
    Some(Duration::from_nanos(nanos.min(max) as u64))
}

/// The pause a response asks for: `retry-after-ms` (milliseconds, as OpenAI and Azure send
/// it), else `retry-after` (seconds or an HTTP date); clamped to [`MAX_RETRY_AFTER`].
pub(crate) fn retry_pause(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = text("retry-after-ms").and_then(milliseconds) {
        return Some(ms);
    }
    text("retry-after").and_then(|t| parse_retry_after(t, now))
}

/// `retry-after-ms`: digits, with an optional fraction (`1250`, `1250.5`), and nothing else.
fn milliseconds(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || text.ends_with('.') {
        return None;
    }
    go_duration(&format!("{text}ms"))
}

impl Profile {
    /// Writes one currency's rate-limit headers in the profile's names and form: `limit`,
    /// `remaining`, and the time until the window is full again (`reset`, from `now`). A
    /// proxy that holds a caller to windows of its own answers with them, so that the SDKs
    /// and gates downstream pace themselves against the numbers that hold them.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tollgate::Currency;
    /// use tollgate::http::Profile;
    ///
    /// let mut headers = http::HeaderMap::new();
    /// let now = UNIX_EPOCH + Duration::from_secs(1_764_806_400); // 2025-12-04T00:00:00Z
    /// Profile::openai().write_rate_headers(&mut headers, Currency::Requests, 5, 3, Duration::from_millis(4_500), now);
    /// assert_eq!(headers["x-ratelimit-limit-requests"], "5");
    /// assert_eq!(headers["x-ratelimit-remaining-requests"], "3");
    /// assert_eq!(headers["x-ratelimit-reset-requests"], "4.5s");
    /// Profile::anthropic().write_rate_headers(&mut headers, Currency::Requests, 5, 3, Duration::from_secs(90), now);
    /// assert_eq!(headers["anthropic-ratelimit-requests-reset"], "2025-12-04T00:01:30Z");
    /// ```
    pub fn write_rate_headers(
        &self,
        headers: &mut http::HeaderMap,
        currency: Currency,
        limit: u64,
        remaining: u64,
        reset: std::time::Duration,
        now: std::time::SystemTime,
    ) {
        let Some(names) = self.headers.iter().find(|n| n.currency == currency) else {
            return;
        };
        let reset = match self.reset {
            ResetForm::Duration => write_go_duration(reset),
            ResetForm::Rfc3339 => write_rfc3339(now + reset),
            ResetForm::Seconds => format!("{}", reset.as_secs_f64().ceil() as u64),
        };
        for (name, value) in [
            (&names.limit, limit.to_string()),
            (&names.remaining, remaining.to_string()),
            (&names.reset, reset),
        ] {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::try_from(name.as_ref()),
                http::HeaderValue::try_from(value),
            ) {
                headers.insert(name, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_in_every_unit_and_nothing_else() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration("1s"), Some(ms(1_000)));
        assert_eq!(go_duration("0s"), Some(Duration::ZERO));
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("2m59.56s"), Some(ms(179_560)));
        assert_eq!(go_duration(".5s"), Some(ms(500)));
        assert_eq!(go_duration("1.5ms"), Some(Duration::from_micros(1_500)));
        assert_eq!(go_duration("7us"), Some(Duration::from_micros(7)));
        assert_eq!(go_duration("0.0000000001s"), Some(Duration::from_nanos(1)));
        assert_eq!(
            go_duration("99999999999999999999999h"),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(go_duration("25h"), Some(MAX_RETRY_AFTER));
        for bad in ["", "s", "1", "1x", "1..5s", "-1s", "1 s", ".s", "1s2"] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_duration_too_small_for_a_nanosecond_is_a_nanosecond_not_zero() {
        assert_eq!(
            go_duration("0.0000000000000000001h"),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(go_duration("500µs"), Some(Duration::from_micros(500)));
    }

    #[test]
    fn a_reset_with_a_micro_sign_is_read() {
        let mut headers = HeaderMap::new();
        let value = http::HeaderValue::from_bytes("500µs".as_bytes()).unwrap();
        headers.insert("x-ratelimit-reset-tokens", value);
        headers.insert("x-ratelimit-remaining-tokens", "7".parse().unwrap());
        let read = rate_headers(&Profile::openai(), &headers, SystemTime::now());
        assert_eq!(read[0].reset, Some(Duration::from_micros(500)));
    }

    #[test]
    fn retry_after_ms_is_milliseconds_and_nothing_else() {
        let pause = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("retry-after-ms", value.parse().unwrap());
            retry_pause(&headers, SystemTime::now())
        };
        assert_eq!(pause("1250"), Some(Duration::from_millis(1_250)));
        assert_eq!(pause(" 20.5 "), Some(Duration::from_micros(20_500)));
        for bad in ["2h3", "1s", "1e3", "-5", ".5", "5.", "", "0x10"] {
            assert_eq!(pause(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn counts_never_read_more_than_was_said() {
        assert_eq!(count("29100"), Some(29_100));
        assert_eq!(count(" 7 "), Some(7));
        assert_eq!(count("12.9"), Some(12));
        assert_eq!(count("99999999999999999999999"), Some(u64::MAX));
        for bad in ["", "-1", "1e3", "x", "1.2.3", ".5"] {
            assert_eq!(count(bad), None, "{bad:?}");
        }
    }
}

/// Writes a duration as Go does (`6m0s`, `4.5s`, `20ms`, `1h2m3s`), as OpenAI's reset headers
/// are written: what [`go_duration`] reads back.
pub(crate) fn write_go_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis == 0 {
        return "0s".to_owned();
    }
    if millis < 1_000 {
        return format!("{millis}ms");
    }
    let hours = millis / 3_600_000;
    let minutes = (millis / 60_000) % 60;
    let seconds = (millis % 60_000) as f64 / 1_000.0;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&format!("{seconds}s"));
    out
}

/// Writes a time as RFC 3339 in UTC, to the second rounded up (`2026-12-01T22:05:00Z`), as
/// Anthropic's reset headers are written.
pub(crate) fn write_rfc3339(at: std::time::SystemTime) -> String {
    let since = at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let secs = since.as_secs() + u64::from(since.subsec_nanos() > 0);
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        (rest / 60) % 60,
        rest % 60
    )
}

#[cfg(test)]
mod writing {
    use super::*;

    #[test]
    fn written_durations_and_times_read_back() {
        for ms in [
            0u64, 1, 20, 999, 1_000, 4_500, 59_999, 60_000, 360_000, 3_723_500, 3_599_999,
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(go_duration(&write_go_duration(d)), Some(d), "{ms} ms");
        }
        assert_eq!(write_go_duration(Duration::from_secs(360)), "6m0s");
        let epoch = std::time::UNIX_EPOCH;
        assert_eq!(write_rfc3339(epoch), "1970-01-01T00:00:00Z");
        assert_eq!(
            write_rfc3339(epoch + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            write_rfc3339(epoch + Duration::from_millis(1_796_256_000_001)),
            "2026-12-03T00:00:01Z"
        );
    }
}

#[cfg(test)]
mod documented {
    #[test]
    fn rate_headers_reads_as_documented() {
        use crate::Currency;
        use crate::http::Profile;
        use crate::http::headers::rate_headers;
        use http::HeaderMap;
        use std::time::{Duration, SystemTime};

        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-limit-tokens", "30000".parse().unwrap());
        headers.insert("x-ratelimit-remaining-tokens", "29100".parse().unwrap());
        headers.insert("x-ratelimit-reset-tokens", "1.8s".parse().unwrap());
        let read = rate_headers(&Profile::openai(), &headers, SystemTime::now());
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].currency, Currency::Tokens);
        assert_eq!(read[0].remaining, Some(29_100));
        assert_eq!(read[0].reset, Some(Duration::from_millis(1_800)));
    }

    #[test]
    fn go_duration_reads_as_documented() {
        use crate::http::headers::go_duration;
        use std::time::Duration;

        assert_eq!(go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(
            go_duration("1h2m3.5s"),
            Some(Duration::from_millis(3_723_500))
        );
        assert_eq!(go_duration("soon"), None);
    }

    #[test]
    fn retry_pause_reads_as_documented() {
        use crate::http::headers::retry_pause;
        use http::HeaderMap;
        use std::time::{Duration, SystemTime};

        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "2".parse().unwrap());
        assert_eq!(
            retry_pause(&headers, SystemTime::now()),
            Some(Duration::from_secs(2))
        );
        headers.insert("retry-after-ms", "1250".parse().unwrap());
        assert_eq!(
            retry_pause(&headers, SystemTime::now()),
            Some(Duration::from_millis(1_250))
        );
    }
}
