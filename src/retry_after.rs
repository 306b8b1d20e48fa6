//! Reading a provider's `Retry-After` header.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The pause a `Retry-After` value asks for: delay-seconds (`"30"`, also `"1.5"` as some LLM
/// providers send) or an HTTP date (`"Wed, 21 Oct 2015 07:28:00 GMT"`), measured from `now`.
///
/// A date in the past is a zero pause; anything else unreadable is `None`.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tollgate::parse_retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 07:27:50 GMT that day
/// assert_eq!(parse_retry_after("30", now), Some(Duration::from_secs(30)));
/// assert_eq!(parse_retry_after("0.25", now), Some(Duration::from_millis(250)));
/// assert_eq!(
///     parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Some(Duration::from_secs(10))
/// );
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.bytes().all(|b| b.is_ascii_digit() || b == b'.') && !value.is_empty() {
        let seconds: f64 = value.parse().ok()?;
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// IMF-fixdate, the form HTTP requires senders to use: `Sun, 06 Nov 1994 08:49:37 GMT`.
fn parse_http_date(value: &str) -> Option<SystemTime> {
    let rest = value.split_once(", ")?.1;
    let mut parts = rest.split(' ');
    let day: u32 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    let mut clock = parts.next()?.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, s) = (clock.next()??, clock.next()??, clock.next()??);
    if parts.next()? != "GMT" || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = u64::try_from(days).ok()? * 86_400 + h * 3_600 + m * 60 + s;
    Some(UNIX_EPOCH + Duration::from_secs(seconds))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_match_known_unix_times() {
        let at = |s| {
            parse_http_date(s)
                .unwrap()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs()
        };
        assert_eq!(at("Thu, 01 Jan 1970 00:00:00 GMT"), 0);
        assert_eq!(at("Sun, 06 Nov 1994 08:49:37 GMT"), 784_111_777);
        assert_eq!(at("Tue, 29 Feb 2028 12:00:00 GMT"), 1_835_438_400);
        assert!(parse_http_date("Sun, 06 Nov 1994 08:49:37 PST").is_none());
        assert!(parse_http_date("Sun, 32 Nov 1994 08:49:37 GMT").is_none());
    }

    #[test]
    fn past_dates_are_no_pause_and_garbage_is_none() {
        let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("1e9999", now), None);
    }
}
