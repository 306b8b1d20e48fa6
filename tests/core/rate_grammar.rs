//! The rate grammar: what parses, what it means, what it prints, and what each refusal says.

use std::time::Duration;

use tollgate::{Limits, Rate, RateErrorKind, Rates};

fn rate(text: &str) -> Rate {
    text.parse()
        .unwrap_or_else(|e| panic!("`{text}` should parse: {e}"))
}

fn parts(text: &str) -> (u64, Duration, u64) {
    let r = rate(text);
    (r.amount(), r.period(), r.burst())
}

const SEC: Duration = Duration::from_secs(1);
const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

#[test]
fn the_documented_forms_parse_to_their_meaning() {
    assert_eq!(parts("50/s"), (50, SEC, 50));
    assert_eq!(parts("100000/m"), (100_000, MIN, 100_000));
    assert_eq!(parts("1000/h"), (1000, HOUR, 1000));
    assert_eq!(parts("20000/d"), (20_000, DAY, 20_000));
    assert_eq!(parts("10/5m"), (10, 5 * MIN, 10));
    assert_eq!(parts("100 per minute"), (100, MIN, 100));
    assert_eq!(parts("5/s burst 10"), (5, SEC, 10));
    assert_eq!(parts("250/100ms"), (250, Duration::from_millis(100), 250));
}

#[test]
fn units_are_case_insensitive_singular_or_plural() {
    for (unit, period) in [
        ("s", SEC),
        ("sec", SEC),
        ("second", SEC),
        ("Seconds", SEC),
        ("SECS", SEC),
        ("m", MIN),
        ("min", MIN),
        ("Minute", MIN),
        ("minutes", MIN),
        ("h", HOUR),
        ("hr", HOUR),
        ("HOUR", HOUR),
        ("hours", HOUR),
        ("d", DAY),
        ("day", DAY),
        ("Days", DAY),
    ] {
        assert_eq!(parts(&format!("7/{unit}")), (7, period, 7), "unit {unit}");
        assert_eq!(
            parts(&format!("7 per {unit}")),
            (7, period, 7),
            "unit {unit}"
        );
    }
}

#[test]
fn whitespace_around_parts_is_fine() {
    assert_eq!(parts("  100 / m  "), (100, MIN, 100));
    assert_eq!(parts("10 / 5 min"), (10, 5 * MIN, 10));
    assert_eq!(parts(" 5/s   BURST   10 "), (5, SEC, 10));
    assert_eq!(parts("100 per 5 minutes"), (100, 5 * MIN, 100));
    assert_eq!(parts("100_000/m"), (100_000, MIN, 100_000));
}

#[test]
fn display_is_canonical_and_parses_back() {
    for (input, canonical) in [
        ("50/s", "50/s"),
        ("100000 per minute", "100000/m"),
        ("10/300s", "10/5m"),
        ("10/60m", "10/h"),
        ("3/24h", "3/d"),
        ("5/s burst 10", "5/s burst 10"),
        ("5/s burst 5", "5/s"),
        ("250/100ms", "250/100ms"),
        ("1/1000ms", "1/s"),
        ("9/90s", "9/90s"),
    ] {
        let parsed = rate(input);
        assert_eq!(parsed.to_string(), canonical, "display of `{input}`");
        assert_eq!(rate(canonical), parsed, "`{canonical}` parses back");
    }
}

#[test]
fn serde_goes_through_the_same_parser() {
    let parsed: Rate = serde_json::from_str("\"5/s burst 10\"").unwrap();
    assert_eq!(parsed, rate("5/s burst 10"));
    assert_eq!(serde_json::to_string(&parsed).unwrap(), "\"5/s burst 10\"");
    let err = serde_json::from_str::<Rate>("\"100/q\"").unwrap_err();
    assert!(err.to_string().contains("unknown unit `q`"), "{err}");

    let limits: Limits =
        serde_json::from_str(r#"{"requests": "500/m", "tokens": "200000/m; 2000000/d"}"#).unwrap();
    assert_eq!(
        limits,
        Limits::parse("500/m", "200000/m; 2000000/d").unwrap()
    );
    let back: Limits = serde_json::from_str(&serde_json::to_string(&limits).unwrap()).unwrap();
    assert_eq!(back, limits);
}

#[test]
fn several_windows_split_on_semicolons_or_commas() {
    let rates: Rates = "60/m; 1000/d".parse().unwrap();
    assert_eq!(rates.as_slice(), &[rate("60/m"), rate("1000/d")]);
    let rates: Rates = "60/m,1000/d , 5/s burst 9".parse().unwrap();
    assert_eq!(rates.len(), 3);
    assert_eq!(rates.to_string(), "60/m; 1000/d; 5/s burst 9");
    assert_eq!(rates.capacity(), Some(9));
    assert_eq!(rates.to_string().parse::<Rates>().unwrap(), rates);
}

fn refusal(text: &str) -> (RateErrorKind, String) {
    let err = text
        .parse::<Rate>()
        .expect_err(&format!("`{text}` should be refused"));
    assert_eq!(err.input(), text);
    (err.kind().clone(), err.to_string())
}

#[test]
fn zero_count_is_refused() {
    let (kind, message) = refusal("0/s");
    assert_eq!(kind, RateErrorKind::Zero);
    assert_eq!(
        message,
        "rate `0/s`: the count is 0; a rate must admit at least 1 per period"
    );
}

#[test]
fn negative_count_is_refused() {
    let (kind, message) = refusal("-5/m");
    assert_eq!(kind, RateErrorKind::Negative("-5".into()));
    assert_eq!(
        message,
        "rate `-5/m`: `-5` is negative; rates count whole calls or tokens, from 1 up"
    );
}

#[test]
fn fractional_count_is_refused() {
    let (kind, message) = refusal("1.5/s");
    assert_eq!(kind, RateErrorKind::NotAnInteger("1.5".into()));
    assert_eq!(message, "rate `1.5/s`: `1.5` is not a whole number");
}

#[test]
fn unknown_unit_is_refused() {
    let (kind, message) = refusal("100/q");
    assert_eq!(kind, RateErrorKind::UnknownUnit("q".into()));
    assert_eq!(
        message,
        "rate `100/q`: unknown unit `q`; expected s, m, h or d (or ms), optionally with a count like `5m`"
    );
}

#[test]
fn missing_count_is_refused() {
    let (kind, message) = refusal("/s");
    assert_eq!(kind, RateErrorKind::MissingCount);
    assert_eq!(
        message,
        "rate `/s`: missing the count before `/`; expected a rate like `100/m`"
    );
}

#[test]
fn count_without_unit_is_refused() {
    let (kind, message) = refusal("100");
    assert_eq!(kind, RateErrorKind::MissingUnit);
    assert_eq!(
        message,
        "rate `100`: missing the unit; expected `N/unit` such as `100/m`, with unit s, m, h or d"
    );
}

#[test]
fn slash_without_unit_is_refused() {
    let (kind, _) = refusal("100/");
    assert_eq!(kind, RateErrorKind::MissingUnit);
}

#[test]
fn overflow_past_u64_is_refused() {
    let (kind, message) = refusal("18446744073709551616/s");
    assert_eq!(kind, RateErrorKind::Overflow("18446744073709551616".into()));
    assert!(message.contains("too large"), "{message}");
    // u64::MAX itself is fine.
    assert_eq!(rate("18446744073709551615/s").amount(), u64::MAX);
}

#[test]
fn period_too_long_is_refused() {
    let (kind, _) = refusal("1/200000d");
    assert_eq!(kind, RateErrorKind::PeriodTooLong);
}

#[test]
fn empty_string_is_refused() {
    let (kind, message) = refusal("");
    assert_eq!(kind, RateErrorKind::Empty);
    assert_eq!(
        message,
        "rate ``: empty; expected a rate like `100/m` or `5/s burst 10`"
    );
    assert_eq!(refusal("   ").0, RateErrorKind::Empty);
}

#[test]
fn zero_burst_is_refused() {
    let (kind, message) = refusal("5/s burst 0");
    assert_eq!(kind, RateErrorKind::ZeroBurst);
    assert_eq!(
        message,
        "rate `5/s burst 0`: the burst is 0; the burst is the capacity and must be at least 1"
    );
}

#[test]
fn zero_period_and_stray_text_are_refused() {
    assert_eq!(refusal("5/0s").0, RateErrorKind::ZeroPeriod);
    assert_eq!(
        refusal("5/s burst").0,
        RateErrorKind::Trailing("burst".into())
    );
    assert_eq!(
        refusal("5/s burst ten").0,
        RateErrorKind::NotAnInteger("ten".into())
    );
}

#[test]
fn an_empty_window_in_a_list_is_refused() {
    let err = "60/m;;1000/d".parse::<Rates>().unwrap_err();
    assert_eq!(err.kind(), &RateErrorKind::EmptyWindow);
    let err = "60/m; 100/q".parse::<Rates>().unwrap_err();
    assert_eq!(err.input(), " 100/q");
}

#[test]
fn programmatic_rates_check_their_inputs() {
    assert!(Rate::new(0, SEC).is_err());
    assert!(Rate::new(1, Duration::ZERO).is_err());
    assert!(Rate::new(1, Duration::from_nanos(1500)).is_err());
    let r = Rate::new(5, SEC).unwrap().with_burst(10).unwrap();
    assert_eq!(r, rate("5/s burst 10"));
    assert!(Rate::new(5, SEC).unwrap().with_burst(0).is_err());
}

/// Limits with up to two windows in each currency, over the whole grammar's range.
fn limits_strategy() -> impl proptest::strategy::Strategy<Value = Limits> {
    use proptest::prelude::*;
    let rate = (
        1u64..=u64::MAX,
        1u64..=86_400_000,
        prop::option::of(1u64..=u64::MAX),
    )
        .prop_filter_map("fits the grammar's bound", |(amount, period_ms, burst)| {
            let rate = Rate::new(amount, Duration::from_millis(period_ms)).ok()?;
            match burst {
                Some(b) => rate.with_burst(b).ok(),
                None => Some(rate),
            }
        });
    let rates = prop::collection::vec(rate, 0..3).prop_map(Rates::from);
    (rates.clone(), rates).prop_map(|(r, t)| Limits::new(r, t))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

    #[test]
    fn limits_round_trip_through_json_and_toml(limits in limits_strategy()) {
        let json = serde_json::to_string(&limits).unwrap();
        proptest::prop_assert_eq!(&serde_json::from_str::<Limits>(&json).unwrap(), &limits);
        let text = toml::to_string(&limits).unwrap();
        proptest::prop_assert_eq!(&toml::from_str::<Limits>(&text).unwrap(), &limits);
        for rates in [limits.requests(), limits.tokens()] {
            let json = serde_json::to_string(rates).unwrap();
            proptest::prop_assert_eq!(&serde_json::from_str::<Rates>(&json).unwrap(), rates);
            for rate in rates.as_slice() {
                let json = serde_json::to_string(rate).unwrap();
                proptest::prop_assert_eq!(serde_json::from_str::<Rate>(&json).unwrap(), *rate);
            }
        }
    }
}

#[test]
fn limits_without_a_currency_survive_serde() {
    let requests_only = Limits::parse("5/s", "").unwrap();
    let json = serde_json::to_string(&requests_only).unwrap();
    assert_eq!(json, r#"{"requests":"5/s"}"#);
    assert_eq!(
        serde_json::from_str::<Limits>(&json).unwrap(),
        requests_only
    );
    let text = toml::to_string(&requests_only).unwrap();
    assert_eq!(toml::from_str::<Limits>(&text).unwrap(), requests_only);
    assert_eq!(
        serde_json::from_str::<Limits>("{}").unwrap(),
        Limits::default()
    );
    for currency in [tollgate::Currency::Requests, tollgate::Currency::Tokens] {
        let json = serde_json::to_string(&currency).unwrap();
        assert_eq!(
            serde_json::from_str::<tollgate::Currency>(&json).unwrap(),
            currency
        );
    }
}

#[test]
fn unknown_fields_in_limits_are_refused() {
    let err = serde_json::from_str::<Limits>(r#"{"request":"5/s","tokns":"100/m"}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `request`"), "{err}");
    let err = toml::from_str::<Limits>("tokens = \"100/m\"\noutput = \"5/s\"").unwrap_err();
    assert!(err.to_string().contains("unknown field `output`"), "{err}");
}
