//! Reading a provider's `Retry-After` header.
//!
//! The value is delay-seconds or an HTTP date in any of the three forms HTTP requires a
//! recipient to accept (RFC 9110 §5.6.7): IMF-fixdate, the obsolete RFC 850 form, and C's
//! asctime form. Nothing a provider sends can make it panic or overflow: a date in the past is
//! no pause, and a pause longer than [`MAX_RETRY_AFTER`] (seconds beyond any integer type, a
//! date centuries away) is clamped to it rather than dropped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest pause a `Retry-After` can ask for: one day. A longer value is read as this, so
/// that a garbled or hostile header can't stop a key for years, while a real "come back
/// tomorrow" still pauses it.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// The pause a `Retry-After` value asks for, measured from `now`: delay-seconds (`"30"`, also
/// `"1.5"` as some LLM providers send) or an HTTP date.
///
/// A date in the past (before 1970 too) is a zero pause; a pause beyond [`MAX_RETRY_AFTER`] is
/// that maximum; anything unreadable (a negative number, an impossible date such as 31 Feb,
/// trailing text) is `None`.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tollgate::{parse_retry_after, MAX_RETRY_AFTER};
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 07:27:50 GMT that day
/// assert_eq!(parse_retry_after("30", now), Some(Duration::from_secs(30)));
/// assert_eq!(parse_retry_after("0.25", now), Some(Duration::from_millis(250)));
/// assert_eq!(
///     parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Some(Duration::from_secs(10))
/// );
/// // The two older forms of the same instant.
/// assert_eq!(
///     parse_retry_after("Wednesday, 21-Oct-15 07:28:00 GMT", now),
///     Some(Duration::from_secs(10))
/// );
/// assert_eq!(
///     parse_retry_after("Wed Oct 21 07:28:00 2015", now),
///     Some(Duration::from_secs(10))
/// );
/// assert_eq!(parse_retry_after("18446744073709551616", now), Some(MAX_RETRY_AFTER));
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return parse_seconds(value);
    }
    let at = parse_http_date(value)?;
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::from(after.as_secs()),
        Err(before) => -i128::from(before.duration().as_secs()),
    };
    let ahead = at.saturating_sub(now);
    Some(match u64::try_from(ahead) {
        Ok(secs) => Duration::from_secs(secs).min(MAX_RETRY_AFTER),
        Err(_) if ahead < 0 => Duration::ZERO,
        Err(_) => MAX_RETRY_AFTER,
    })
}

/// How long from `now` until an RFC 3339 time (`2026-12-01T22:05:00Z`,
/// `2026-12-01T23:05:00.25+01:00`), as Anthropic writes its resets: zero for a time in the
/// past, at most [`MAX_RETRY_AFTER`], `None` for anything else.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) fn until_rfc3339(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let (date, time) = value.split_once(['T', 't', ' '])?;
    let mut parts = date.splitn(3, '-');
    let year = year(parts.next()?)?;
    let month = two_digits(parts.next()?).filter(|m| (1..=12).contains(m))?;
    let day = two_digits(parts.next()?)?;
    // The offset: Z, or +hh:mm / -hh:mm.
    let (clock_text, offset) = if let Some(clock_text) = time.strip_suffix(['Z', 'z']) {
        (clock_text, 0i128)
    } else {
        let at = time.rfind(['+', '-'])?;
        let (clock_text, offset) = time.split_at(at);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let (h, m) = offset[1..].split_once(':')?;
        let (h, m) = (two_digits(h)?, two_digits(m)?);
        if h > 23 || m > 59 {
            return None;
        }
        (clock_text, sign * i128::from(h * 3_600 + m * 60))
    };
    let (whole, fraction) = clock_text.split_once('.').unwrap_or((clock_text, ""));
    if !fraction.bytes().all(|b| b.is_ascii_digit())
        || (clock_text.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let at = instant(year, month, day, clock(whole)?)? - offset;
    // Nanoseconds of the fraction, rounded up (a reset is never read as earlier than it is).
    let digits = &fraction[..fraction.len().min(9)];
    let mut nanos: u32 = if digits.is_empty() {
        0
    } else {
        digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32)
    };
    if fraction.len() > 9 && fraction[9..].bytes().any(|b| b != b'0') {
        nanos += 1;
    }
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_nanos()).ok()?,
        Err(before) => -i128::try_from(before.duration().as_nanos()).ok()?,
    };
    let ahead = at
        .saturating_mul(1_000_000_000)
        .saturating_add(i128::from(nanos))
        .saturating_sub(now);
    Some(match u64::try_from(ahead) {
        Ok(nanos) => Duration::from_nanos(nanos).min(MAX_RETRY_AFTER),
        Err(_) if ahead < 0 => Duration::ZERO,
        Err(_) => MAX_RETRY_AFTER,
    })
}

/// `30`, `1.5`, `.5`: whole seconds and a fraction, rounded up to the nanosecond (never shorter
/// than asked), clamped to the maximum.
fn parse_seconds(value: &str) -> Option<Duration> {
    let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let max = MAX_RETRY_AFTER.as_secs();
    // Leading zeros say nothing; past the digits of the maximum, the value is above it.
    let significant = whole.trim_start_matches('0');
    let secs = if significant.len() > 20 {
        u64::MAX
    } else {
        significant
            .parse::<u64>()
            .unwrap_or(if significant.is_empty() { 0 } else { u64::MAX })
    };
    if secs >= max {
        return Some(MAX_RETRY_AFTER);
    }
    let mut nanos = 0u32;
    for (i, digit) in fraction.bytes().take(9).enumerate() {
        nanos += u32::from(digit - b'0') * 10u32.pow(8 - i as u32);
    }
    let rest_nonzero = fraction.bytes().skip(9).any(|d| d != b'0');
    let pause = Duration::new(secs, nanos) + Duration::from_nanos(u64::from(rest_nonzero));
    Some(pause.min(MAX_RETRY_AFTER))
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const LONG_DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// The seconds since 1970 (negative before) of an HTTP date in any of its three forms.
fn parse_http_date(value: &str) -> Option<i128> {
    if let Some((day, rest)) = value.split_once(", ") {
        if DAYS.contains(&day) {
            return imf_fixdate(rest);
        }
        if LONG_DAYS.contains(&day) {
            return rfc850(rest);
        }
        return None;
    }
    asctime(value)
}

/// `06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(rest: &str) -> Option<i128> {
    let mut parts = rest.split(' ');
    let day = two_digits(parts.next()?)?;
    let month = month(parts.next()?)?;
    let year = year(parts.next()?)?;
    let time = clock(parts.next()?)?;
    (parts.next()? == "GMT" && parts.next().is_none()).then_some(())?;
    instant(year, month, day, time)
}

/// `06-Nov-94 08:49:37 GMT`: a two-digit year more than 50 years ahead of today's is read as
/// the most recent past year with those digits (RFC 9110); today's year is taken as at least
/// 1970, so the answer does not depend on the clock beyond that.
fn rfc850(rest: &str) -> Option<i128> {
    let mut parts = rest.split(' ');
    let mut date = parts.next()?.split('-');
    let day = two_digits(date.next()?)?;
    let month = month(date.next()?)?;
    let yy = two_digits(date.next()?)?;
    date.next().is_none().then_some(())?;
    let time = clock(parts.next()?)?;
    (parts.next()? == "GMT" && parts.next().is_none()).then_some(())?;
    let this_year = current_year();
    let century = this_year - this_year.rem_euclid(100);
    let mut year = century + i128::from(yy);
    if year > this_year + 50 {
        year -= 100;
    }
    instant(year, month, day, time)
}

/// `Sun Nov  6 08:49:37 1994`: the day is padded with a space, not a zero.
fn asctime(value: &str) -> Option<i128> {
    let (weekday, rest) = value.split_once(' ')?;
    DAYS.contains(&weekday).then_some(())?;
    let (month_name, rest) = rest.split_once(' ')?;
    let month = month(month_name)?;
    let (day, rest) = match rest.strip_prefix(' ') {
        Some(padded) => padded.split_once(' ')?,
        None => rest.split_once(' ')?,
    };
    let day = match day.len() {
        1 | 2 if day.bytes().all(|b| b.is_ascii_digit()) => day.parse().ok()?,
        _ => return None,
    };
    let (time, year) = rest.split_once(' ')?;
    instant(self::year(year)?, month, day, clock(time)?)
}

fn two_digits(text: &str) -> Option<u32> {
    (text.len() == 2 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

fn month(text: &str) -> Option<u32> {
    MONTHS.iter().position(|m| *m == text).map(|i| i as u32 + 1)
}

/// Four or more digits; a year too large for any calendar is clamped far ahead (the pause is
/// clamped anyway).
fn year(text: &str) -> Option<i128> {
    if text.len() < 4 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(if text.len() > 12 {
        i128::from(u32::MAX)
    } else {
        text.parse().ok()?
    })
}

fn clock(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split(':');
    let mut next = || two_digits(parts.next()?);
    let (h, m, s) = (next()?, next()?, next()?);
    (parts.next().is_none() && h <= 23 && m <= 59 && s <= 60).then_some((h, m, s))
}

fn is_leap(year: i128) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i128, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn instant(year: i128, month: u32, day: u32, (h, m, s): (u32, u32, u32)) -> Option<i128> {
    if day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + i128::from(h * 3_600 + m * 60 + s))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm), in i128
/// so that no year can overflow it.
fn days_from_civil(year: i128, month: u32, day: u32) -> i128 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let month = i128::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i128::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// This year by the system clock, and never before 1970 (for RFC 850's two-digit years).
fn current_year() -> i128 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // 365.2425 days a year is exact enough to find the year of an instant within a day of it.
    1970 + i128::from(secs) * 10_000 / (86_400 * 3_652_425)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_are_read_with_offsets_and_fractions() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 2015-10-21T07:27:50Z
        let read = |text| until_rfc3339(text, now);
        assert_eq!(read("2015-10-21T07:28:00Z"), Some(Duration::from_secs(10)));
        assert_eq!(
            read("2015-10-21T08:28:00+01:00"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            read("2015-10-21T06:28:00.5-01:00"),
            Some(Duration::from_millis(10_500))
        );
        assert_eq!(
            read("2015-10-21T07:27:50.0000000001Z"),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(read("1969-01-01T00:00:00Z"), Some(Duration::ZERO));
        assert_eq!(read("9999999-01-01T00:00:00Z"), Some(MAX_RETRY_AFTER));
        for bad in [
            "2015-02-31T00:00:00Z",
            "2015-10-21T07:28:00",
            "2015-10-21",
            "2015-10-21T25:00:00Z",
            "2015-10-21T07:28:00.Z",
            "2015-10-21T07:28:00+1:00",
            "soon",
            "",
        ] {
            assert_eq!(read(bad), None, "{bad}");
        }
    }

    #[test]
    fn dates_match_known_unix_times() {
        let at = |s| parse_http_date(s).unwrap();
        assert_eq!(at("Thu, 01 Jan 1970 00:00:00 GMT"), 0);
        assert_eq!(at("Sun, 06 Nov 1994 08:49:37 GMT"), 784_111_777);
        assert_eq!(at("Sunday, 06-Nov-94 08:49:37 GMT"), 784_111_777);
        assert_eq!(at("Sun Nov  6 08:49:37 1994"), 784_111_777);
        assert_eq!(at("Tue, 29 Feb 2028 12:00:00 GMT"), 1_835_438_400);
        assert_eq!(at("Wed, 31 Dec 1969 23:59:59 GMT"), -1);
        assert!(parse_http_date("Sun, 06 Nov 1994 08:49:37 PST").is_none());
        assert!(parse_http_date("Sun, 32 Nov 1994 08:49:37 GMT").is_none());
    }

    #[test]
    fn two_digit_years_are_the_recent_past_or_the_near_future() {
        let this = current_year();
        let year_of = |yy: i128| {
            let secs = parse_http_date(&format!("Monday, 01-Jul-{yy:02} 00:00:00 GMT")).unwrap();
            1970 + secs * 10_000 / (86_400 * 3_652_425)
        };
        for yy in [0, 25, 49, 50, 51, 94, 99] {
            let year = year_of(yy);
            assert_eq!(year.rem_euclid(100), yy);
            assert!(year <= this + 50 && year > this - 50, "{yy} read as {year}");
        }
    }
}
