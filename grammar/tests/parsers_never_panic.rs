//! Every parser of the grammar on arbitrary and near-valid input: an answer, never a panic;
//! what parses prints back to itself; extreme numbers are refused or stay in bounds.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_grammar::{
    EstimatorName, MAX_CAPACITY_UNITS, Rate, RateErrorKind, Rates, parse_timeout,
};

/// Numbers that reach the edges: small ones, powers of two and their neighbours (where
/// amount × period crosses 2^120 for some period), and any at all.
fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..=1_000,
        (0u32..64, -2i64..=2).prop_map(|(p, d)| (1u64 << p).saturating_add_signed(d)),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

/// Periods in milliseconds that reach the edges: short ones, up to a day, around 2^63 ns (the
/// longest period) and beyond it, and any at all.
fn period_ms() -> impl Strategy<Value = u64> {
    let longest_ms = (i64::MAX as u64) / 1_000_000;
    prop_oneof![
        0u64..=1_000,
        1u64..=86_400_000,
        (longest_ms - 3)..=(longest_ms + 3),
        (0u32..64).prop_map(|p| 1u64 << p),
        any::<u64>(),
    ]
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(10_000)
}

/// Strings shaped like rates, with extreme numbers, odd units and stray words mixed in.
fn rate_like() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..100).prop_map(|n| n.to_string()),
        Just("18446744073709551616".to_owned()),
        Just("-1".to_owned()),
        Just("1.5".to_owned()),
        Just("1_000".to_owned()),
        Just(String::new()),
    ];
    let unit = prop_oneof![
        Just("s"),
        Just("ms"),
        Just("m"),
        Just("h"),
        Just("d"),
        Just("Days"),
        Just("q"),
        Just(""),
        Just("é"),
    ];
    (
        number.clone(),
        prop::option::of(number.clone()),
        unit,
        prop::option::of(number),
        prop::sample::select(vec!["/", " per ", "//", "", " / "]),
    )
        .prop_map(|(count, periods, unit, burst, sep)| {
            let mut text = format!("{count}{sep}{}{unit}", periods.unwrap_or_default());
            if let Some(burst) = burst {
                text.push_str(" burst ");
                text.push_str(&burst);
            }
            text
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_is_a_rate_or_a_refusal(text in ".{0,40}") {
        let _ = text.parse::<Rate>();
        let _ = text.parse::<Rates>();
        let _ = Rates::parse_or_none(&text);
    }

    #[test]
    fn rate_shaped_text_parses_back_to_itself_or_is_refused(text in rate_like()) {
        match text.parse::<Rate>() {
            Ok(rate) => {
                let shown = rate.to_string();
                prop_assert_eq!(shown.parse::<Rate>().unwrap(), rate);
                prop_assert!(
                    u128::from(rate.burst()) * u128::from(rate.period_nanos()) < MAX_CAPACITY_UNITS
                );
                // An empty bucket fills in burst × period / amount, rounded up.
                let fill = (u128::from(rate.burst()) * u128::from(rate.period_nanos()))
                    .div_ceil(u128::from(rate.amount()));
                prop_assert_eq!(rate.time_to_fill().as_nanos(), fill.min(u128::from(u64::MAX)));
            }
            Err(err) => {
                prop_assert_eq!(err.input(), text.as_str());
                prop_assert!(!err.to_string().is_empty());
            }
        }
    }

    #[test]
    fn programmatic_rates_are_refused_exactly_when_they_would_overflow(
        amount in edge_u64(),
        period_ms in period_ms(),
        burst in edge_u64(),
    ) {
        // The bounds, computed here from the documented limits rather than by the code under
        // test: a period of 1 ms to 2^63 - 1 ns, and amount × period below 2^120.
        let period_ns = u128::from(period_ms) * 1_000_000;
        let period_ok = period_ms > 0 && period_ns <= u128::from(i64::MAX as u64);
        let fits = |n: u64| n > 0 && u128::from(n) * period_ns < MAX_CAPACITY_UNITS;
        match Rate::new(amount, Duration::from_millis(period_ms)) {
            Ok(rate) => {
                prop_assert!(period_ok && fits(amount));
                prop_assert_eq!(rate.amount(), amount);
                prop_assert_eq!(u128::from(rate.period_nanos()), period_ns);
                match rate.with_burst(burst) {
                    Ok(r) => {
                        prop_assert!(fits(burst));
                        prop_assert_eq!(r.burst(), burst);
                    }
                    Err(e) => {
                        prop_assert!(!fits(burst));
                        let expected = if burst == 0 {
                            RateErrorKind::ZeroBurst
                        } else {
                            RateErrorKind::CapacityTooLarge
                        };
                        prop_assert_eq!(e.kind(), &expected);
                    }
                }
            }
            Err(_) => prop_assert!(!(period_ok && fits(amount))),
        }
    }

    #[test]
    fn any_text_is_a_timeout_or_a_refusal(text in ".{0,24}") {
        let _ = parse_timeout(&text);
    }

    #[test]
    fn timeout_shaped_text_means_count_times_unit(
        count in any::<u64>(),
        unit in prop::sample::select(vec![
            ("ms", 1_000_000u128), ("S", 1_000_000_000), ("sec", 1_000_000_000),
            ("min", 60_000_000_000), ("H", 3_600_000_000_000), ("d", 86_400_000_000_000),
            ("parsecs", 0),
        ]),
        space in any::<bool>(),
    ) {
        let text = format!("{count}{}{}", if space { " " } else { "" }, unit.0);
        let parsed = parse_timeout(&text);
        let nanos = u128::from(count) * unit.1;
        if unit.1 == 0 {
            prop_assert!(parsed.is_err());
        } else if nanos <= u128::from(u64::MAX) {
            prop_assert_eq!(parsed.unwrap(), Some(Duration::from_nanos(nanos as u64)));
        } else {
            prop_assert!(parsed.unwrap_err().to_string().contains("too long"));
        }
    }

    #[test]
    fn any_text_is_an_estimator_name_or_a_refusal(text in ".{0,24}") {
        let _ = EstimatorName::parse(&text);
    }
}

#[test]
fn absurd_but_once_accepted_rates_are_refused_with_the_bound() {
    let err = "18446744073709551615/106751d".parse::<Rate>().unwrap_err();
    assert_eq!(err.kind(), &RateErrorKind::CapacityTooLarge);
    assert!(err.to_string().contains("2^120"), "{err}");
    // Any burst still fits a period of two years, and a burst of 10^18 fits forty years.
    assert!("18446744073709551615/730d".parse::<Rate>().is_ok());
    assert!("1/15000d burst 1000000000000000000".parse::<Rate>().is_ok());
    assert!(
        "1/16000d burst 1000000000000000000"
            .parse::<Rate>()
            .is_err()
    );
}
