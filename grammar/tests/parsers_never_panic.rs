//! Every parser of the grammar on arbitrary and near-valid input: an answer, never a panic;
//! what parses prints back to itself; extreme numbers are refused or stay in bounds.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_grammar::{
    EstimatorName, MAX_CAPACITY_UNITS, Rate, RateErrorKind, Rates, parse_timeout,
};

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
                prop_assert!(rate.time_to_fill() >= Duration::ZERO);
            }
            Err(err) => {
                prop_assert_eq!(err.input(), text.as_str());
                prop_assert!(!err.to_string().is_empty());
            }
        }
    }

    #[test]
    fn programmatic_rates_refuse_what_would_overflow(
        amount in any::<u64>(),
        period_ms in any::<u64>(),
        burst in any::<u64>(),
    ) {
        if let Ok(rate) = Rate::new(amount, Duration::from_millis(period_ms)) {
            match rate.with_burst(burst) {
                Ok(r) => prop_assert!(
                    u128::from(r.burst()) * u128::from(r.period_nanos()) < MAX_CAPACITY_UNITS
                ),
                Err(e) => prop_assert!(matches!(
                    e.kind(),
                    RateErrorKind::ZeroBurst | RateErrorKind::CapacityTooLarge
                )),
            }
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
