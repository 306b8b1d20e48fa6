//! `Retry-After` as providers send it, and as a hostile one might: every HTTP date form, past
//! and absurd dates, huge numbers, impossible days and trailing text. Nothing panics, nothing
//! overflows, and an absurd pause is clamped to the documented maximum, never dropped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use tollgate::{MAX_RETRY_AFTER, parse_retry_after};

/// 07:27:50 GMT on 21 Oct 2015.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_445_412_470)
}

#[test]
fn a_date_far_in_the_future_is_clamped_not_a_panic() {
    for value in [
        "Wed, 21 Oct 300000000000 07:28:00 GMT",
        "Wed, 21 Oct 99999999999999999999999999999 07:28:00 GMT",
        "Wed, 21 Oct 9999 07:28:00 GMT",
        "Wed Oct 21 07:28:00 300000000000",
    ] {
        assert_eq!(
            parse_retry_after(value, now()),
            Some(MAX_RETRY_AFTER),
            "{value}"
        );
    }
}

#[test]
fn seconds_beyond_any_integer_are_the_maximum_not_dropped() {
    assert_eq!(
        parse_retry_after("18446744073709551616", now()),
        Some(MAX_RETRY_AFTER)
    );
    assert_eq!(
        parse_retry_after(&"9".repeat(400), now()),
        Some(MAX_RETRY_AFTER)
    );
    assert_eq!(parse_retry_after("86401.5", now()), Some(MAX_RETRY_AFTER));
    assert_eq!(
        parse_retry_after("86399.5", now()),
        Some(Duration::from_millis(86_399_500))
    );
    // A fraction finer than a nanosecond rounds up: never shorter than asked.
    assert_eq!(
        parse_retry_after("0.0000000001", now()),
        Some(Duration::from_nanos(1))
    );
    assert_eq!(
        parse_retry_after("007", now()),
        Some(Duration::from_secs(7))
    );
}

#[test]
fn all_three_http_date_forms_are_read() {
    let ten = Some(Duration::from_secs(10));
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now()),
        ten
    );
    assert_eq!(
        parse_retry_after("Wednesday, 21-Oct-15 07:28:00 GMT", now()),
        ten
    );
    assert_eq!(parse_retry_after("Wed Oct 21 07:28:00 2015", now()), ten);
    let later = UNIX_EPOCH + Duration::from_secs(784_111_777 - 60);
    assert_eq!(
        parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", later),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        parse_retry_after("Sun Nov  6 08:49:37 1994", later),
        Some(Duration::from_secs(60))
    );
}

#[test]
fn any_past_date_is_no_pause() {
    for value in [
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "Wed, 31 Dec 1969 23:59:59 GMT",
        "Sat, 01 Jan 0001 00:00:00 GMT",
        "Sun Nov  6 08:49:37 1000",
    ] {
        assert_eq!(
            parse_retry_after(value, now()),
            Some(Duration::ZERO),
            "{value}"
        );
    }
    // A clock before 1970 still measures forward correctly.
    let before_epoch = UNIX_EPOCH - Duration::from_secs(10);
    assert_eq!(
        parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", before_epoch),
        Some(Duration::from_secs(10))
    );
}

#[test]
fn impossible_dates_and_trailing_text_are_refused() {
    for value in [
        "Sat, 31 Feb 2015 07:28:00 GMT",
        "Sun, 29 Feb 2015 07:28:00 GMT",
        "Wed, 31 Apr 2015 07:28:00 GMT",
        "Wed, 00 Oct 2015 07:28:00 GMT",
        "Wed, 21 Oct 2015 24:00:00 GMT",
        "Wed, 21 Oct 2015 07:60:00 GMT",
        "Wed, 21 Oct 2015 07:28:00 GMT extra",
        "Wed, 21 Oct 2015 07:28:00",
        "Wed, 21 Oct 15 07:28:00 GMT",
        "Wednesday, 21-Oct-2015 07:28:00 GMT",
        "Wed Oct 21 07:28:00 2015 GMT",
        "Funday, 21 Oct 2015 07:28:00 GMT",
        "30 seconds",
        "-5",
        "1e3",
        "1.2.3",
        ".",
        "",
        "   ",
    ] {
        assert_eq!(parse_retry_after(value, now()), None, "{value:?}");
    }
    // 29 Feb in a leap year is a real day.
    assert!(parse_retry_after("Sat, 29 Feb 2020 00:00:00 GMT", now()).is_some());
}

fn date_like() -> impl Strategy<Value = String> {
    let day = prop_oneof![(0u32..40).prop_map(|d| format!("{d:02}")), "[0-9 ]{1,3}"];
    let month = prop::sample::select(vec!["Jan", "Feb", "Apr", "Oct", "Dec", "Foo", "oct"]);
    let year = prop_oneof![
        (0u64..10_000).prop_map(|y| format!("{y:04}")),
        any::<u64>().prop_map(|y| y.to_string()),
        "[0-9]{1,40}",
    ];
    let time = prop_oneof![
        (0u32..30, 0u32..70, 0u32..70).prop_map(|(h, m, s)| format!("{h:02}:{m:02}:{s:02}")),
        "[0-9:]{0,10}",
    ];
    let weekday = prop::sample::select(vec!["Wed", "Sunday", "Fri", "Xyz"]);
    (weekday, day, month, year, time, 0u8..4).prop_map(|(w, d, m, y, t, form)| match form {
        0 => format!("{w}, {d} {m} {y} {t} GMT"),
        1 => format!("{w}, {d}-{m}-{y} {t} GMT"),
        2 => format!("{w} {m} {d} {t} {y}"),
        _ => format!("{y}.{d}"),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn any_text_is_a_bounded_pause_or_none(text in ".{0,48}", secs in any::<i64>()) {
        let now = if secs >= 0 {
            UNIX_EPOCH + Duration::from_secs(secs as u64 / 4)
        } else {
            UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs() / 4)
        };
        if let Some(pause) = parse_retry_after(&text, now) {
            prop_assert!(pause <= MAX_RETRY_AFTER);
        }
    }

    #[test]
    fn date_shaped_text_is_a_bounded_pause_or_none(text in date_like(), secs in any::<u32>()) {
        let now = UNIX_EPOCH + Duration::from_secs(u64::from(secs));
        if let Some(pause) = parse_retry_after(&text, now) {
            prop_assert!(pause <= MAX_RETRY_AFTER);
        }
    }
}
