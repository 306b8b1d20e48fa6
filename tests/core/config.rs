//! The configuration file: every mistake is reported at load, once, in the words that fit it;
//! timeouts take the units rates take; and no text makes the loader panic.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Config, Error};

fn problems(text: &str) -> Vec<String> {
    match Config::from_toml(text) {
        Err(Error::Config { problems }) => problems,
        Err(other) => panic!("expected Error::Config, got {other:?}"),
        Ok(_) => panic!("expected the file to be refused:\n{text}"),
    }
}

#[test]
#[cfg(feature = "tiktoken")]
fn an_unknown_estimator_is_refused_at_load() {
    assert_eq!(
        problems("[keys.a]\ntokens = \"100/m\"\nestimator = \"nonsense\""),
        [
            "keys.a.estimator: unknown estimator `nonsense`; expected openai, openai:<model>, tiktoken:<encoding>, voyageai, hf:<path to tokenizer.json> or words"
        ]
    );
    assert_eq!(
        problems("[default]\ntokens = \"100/m\"\nestimator = \"tiktoken:o300k\""),
        [
            "default.estimator: estimator `tiktoken:o300k`: unknown encoding `o300k`; expected o200k_base, cl100k_base, p50k_base, p50k_edit, r50k_base or o200k_harmony"
        ]
    );
    assert_eq!(
        problems("[keys.a]\ntokens = \"100/m\"\nestimator = \"openai:no-such-model\""),
        [
            "keys.a.estimator: estimator `openai:no-such-model`: tiktoken-rs knows no encoding for model `no-such-model`; name the encoding instead, like tiktoken:o200k_base"
        ]
    );
    // A known name loads as before.
    let config =
        Config::from_toml("[keys.a]\ntokens = \"100/m\"\nestimator = \"openai:gpt-4\"").unwrap();
    assert_eq!(
        config.key("a").unwrap().estimator.as_deref(),
        Some("openai:gpt-4")
    );
}

#[test]
fn a_bad_rate_is_reported_once_without_a_second_misleading_line() {
    assert_eq!(
        problems("[keys.a]\nrequests = \"5/q\""),
        [
            "keys.a.requests: rate `5/q`: unknown unit `q`; expected s, m, h or d (or ms), optionally with a count like `5m`"
        ]
    );
    // A bad rate in [default] does not make every key say it has no rates either.
    assert_eq!(
        problems("[default]\ntokens = \"0/s\"\n[keys.a]\ntimeout = \"5s\""),
        ["default.tokens: rate `0/s`: the count is 0; a rate must admit at least 1 per period"]
    );
    // A section that really has no rate still says so.
    assert_eq!(
        problems("[keys.a]\ntimeout = \"5s\""),
        ["keys.a: no requests or tokens here or in [default]; give at least one rate"]
    );
}

#[test]
fn sections_that_are_not_tables_say_what_was_expected() {
    assert_eq!(
        problems("keys = 5"),
        ["keys: expected tables of settings, one per key, written [keys.<name>]"]
    );
    assert_eq!(
        problems("default = \"500/m\""),
        ["default: expected a table of settings, written [default]"]
    );
    assert_eq!(
        problems("[limits]\nrequests = \"5/s\""),
        ["limits: unknown section; expected [default] or [keys.<name>]"]
    );
}

#[test]
fn timeouts_take_the_units_rates_take() {
    let config = Config::from_toml(
        r#"
        [keys.upper]
        requests = "5/S"
        timeout = "30S"
        [keys.day]
        requests = "5/d"
        timeout = "1d"
        [keys.spelt]
        requests = "5 per minute"
        timeout = "2 minutes"
        "#,
    )
    .unwrap();
    let timeout = |key: &str| config.key(key).unwrap().timeout;
    assert_eq!(timeout("upper"), Some(Some(Duration::from_secs(30))));
    assert_eq!(timeout("day"), Some(Some(Duration::from_secs(86_400))));
    assert_eq!(timeout("spelt"), Some(Some(Duration::from_secs(120))));
}

/// Text shaped like a configuration, with good and bad values in every place.
fn config_like() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("\"500/m\"".to_owned()),
        Just("\"5/q\"".to_owned()),
        Just("\"\"".to_owned()),
        Just("5".to_owned()),
        Just("-1".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("\"30s\"".to_owned()),
        Just("\"none\"".to_owned()),
        Just("\"openai\"".to_owned()),
        Just("\"hf:\"".to_owned()),
        Just("[1, 2]".to_owned()),
        Just("{ a = 1 }".to_owned()),
        "\"[^\"\\\\]{0,12}\"",
    ];
    let field = prop::sample::select(vec![
        "requests",
        "tokens",
        "requests_burst",
        "tokens_burst",
        "estimator",
        "timeout",
        "colour",
    ]);
    let header = prop::sample::select(vec![
        "[default]",
        "[keys.a]",
        "[keys.\"b c\"]",
        "[keys]",
        "[other]",
        "",
        "keys = 5",
    ]);
    prop::collection::vec((header, prop::collection::vec((field, value), 0..4)), 0..4).prop_map(
        |sections| {
            let mut text = String::new();
            for (header, fields) in sections {
                text.push_str(header);
                text.push('\n');
                for (field, value) in fields {
                    text.push_str(&format!("{field} = {value}\n"));
                }
            }
            text
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn the_loader_answers_any_text_without_panicking(text in config_like()) {
        match Config::from_toml(&text) {
            Ok(_) => {}
            Err(Error::Config { problems }) => prop_assert!(!problems.is_empty()),
            Err(other) => prop_assert!(false, "not a configuration error: {other:?}"),
        }
    }

    #[test]
    fn arbitrary_text_is_a_configuration_or_a_refusal(text in ".{0,64}") {
        let _ = Config::from_toml(&text);
    }
}

#[test]
fn output_tokens_and_their_burst_are_read_like_the_other_currencies() {
    let config = Config::from_toml(
        r#"
        [default]
        requests = "50/m"
        [keys.anthropic]
        tokens = "40000/m"
        output_tokens = "8000/m"
        output_tokens_burst = 2000
        "#,
    )
    .unwrap();
    assert_eq!(
        config.key("anthropic").unwrap().limits.to_string(),
        "requests 50/m, tokens 40000/m, output tokens 8000/m burst 2000"
    );
    assert_eq!(
        problems("[keys.a]\noutput_tokens = \"5/q\""),
        [
            "keys.a.output_tokens: rate `5/q`: unknown unit `q`; expected s, m, h or d (or ms), optionally with a count like `5m`"
        ]
    );
}

/// Without the `tiktoken` feature, a name that needs it is refused when the file is read, and
/// says which feature to turn on.
#[test]
#[cfg(not(feature = "tiktoken"))]
fn an_estimator_whose_feature_is_off_is_refused_at_load() {
    let found = problems("[keys.a]\ntokens = \"100/m\"\nestimator = \"openai\"");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("`tiktoken`"), "{found:?}");
    // `words` needs nothing.
    assert!(Config::from_toml("[keys.a]\ntokens = \"100/m\"\nestimator = \"words\"").is_ok());
}
