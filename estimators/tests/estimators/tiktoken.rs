//! The OpenAI estimators: names, model mapping, and counts equal to tiktoken-rs's.

use tollgate_estimators::{Estimator, EstimatorError, Tiktoken, estimator, estimator_strict};

const ENCODINGS: [&str; 6] = [
    "o200k_base",
    "o200k_harmony",
    "cl100k_base",
    "p50k_base",
    "p50k_edit",
    "r50k_base",
];

/// Texts where a counter may go wrong: the tricky ones, the sample texts, pieces of the fixture
/// tokenizer files, random characters, and the edges of the counter's own paths (a piece that
/// is a token, one merged on the stack, one too long for it; whitespace runs ending the text).
fn texts_to_compare() -> Vec<String> {
    let mut texts = crate::common::tricky_texts();
    texts.extend(crate::common::edge_texts());
    texts.extend(crate::common::fixture_texts(300));
    texts.extend(crate::common::random_texts(26, 3_000));
    for n in [1, 2, 3, 126, 127, 128, 129, 300, 1_000] {
        texts.push("a".repeat(n));
        texts.push(format!("x {}y", "é".repeat(n)));
        texts.push(format!("{}\n", "\u{1f980}".repeat(n)));
        texts.push(" ".repeat(n));
        texts.push(format!("a{}", " \n".repeat(n)));
        texts.push("9".repeat(n));
        texts.push(format!("'{}", "-".repeat(n)));
    }
    for tail in [
        "\n",
        "\n  ",
        "  \n",
        " \t",
        "\r\n \r\n ",
        "\u{a0}",
        " \u{3000}",
    ] {
        texts.push(format!("end{tail}"));
        texts.push(format!("{tail}start"));
    }
    texts
}

#[test]
fn counts_equal_tiktoken_rs_on_every_encoding() {
    let texts = texts_to_compare();
    for encoding in ENCODINGS {
        let tiktoken = Tiktoken::for_encoding(encoding).unwrap();
        for text in &texts {
            assert_eq!(
                tiktoken.count(text),
                tiktoken.count_with_tiktoken_rs(text),
                "{encoding} on {} ({} bytes)",
                text.escape_debug().take(300).collect::<String>(),
                text.len()
            );
        }
    }
}

#[test]
fn known_counts() {
    let openai = estimator("openai").unwrap();
    assert_eq!(openai.count("Hello, world!"), 4);
    assert_eq!(openai.count(""), 0);
    // Special-token text counts as ordinary text, never an error or a panic.
    assert_eq!(openai.count("<|endoftext|>"), 7);
    assert_eq!(openai.count(&crate::common::sample("english.txt")), 570);
}

#[test]
fn names_pick_encodings() {
    let cases = [
        ("openai", "o200k_base"),
        ("tiktoken", "o200k_base"),
        ("openai:gpt-4o", "o200k_base"),
        ("openai:gpt-4", "cl100k_base"),
        ("openai:gpt-3.5-turbo", "cl100k_base"),
        ("tiktoken:cl100k_base", "cl100k_base"),
        ("tiktoken:p50k_base", "p50k_base"),
        ("tiktoken:r50k_base", "r50k_base"),
    ];
    for (name, encoding) in cases {
        let est = estimator(name).unwrap();
        assert_eq!(est.name(), name);
        let reference = Tiktoken::for_encoding(encoding).unwrap();
        let text = crate::common::sample("english.txt");
        assert_eq!(
            est.count(&text),
            reference.count_with_tiktoken_rs(&text),
            "{name}"
        );
    }
    // Different encodings really differ, so the mapping above is checked.
    let text = crate::common::sample("code_rs.txt");
    assert_ne!(
        estimator("openai:gpt-4").unwrap().count(&text),
        estimator("openai").unwrap().count(&text)
    );
}

#[test]
fn unknown_names_are_errors_naming_them() {
    let err = estimator("openai:not-a-model").unwrap_err();
    assert!(
        matches!(err, EstimatorError::UnknownModel { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "estimator `openai:not-a-model`: tiktoken-rs knows no encoding for model `not-a-model`; name the encoding instead, like tiktoken:o200k_base"
    );
    let err = estimator_strict("tiktoken:o300k").unwrap_err();
    assert!(
        err.to_string().contains("unknown encoding `o300k`"),
        "{err}"
    );
    let err = estimator("bard").unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown estimator `bard`; expected openai, openai:<model>, tiktoken:<encoding>, voyageai, hf:<path to tokenizer.json> or words"
    );
}

#[test]
fn estimators_are_shared_not_reloaded() {
    let first = estimator("openai:gpt-4o").unwrap();
    let second = estimator("openai:gpt-4o").unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &second));
}

/// Large texts, whole: the sample texts over and over (about 1 MB), random characters run
/// together, and long pieces around the counter's path from its stack merge to bpe-openai's
/// encoder (tiktoken's own merge changes at 100 bytes).
#[test]
fn counts_equal_tiktoken_rs_on_large_texts() {
    let samples: String = ["english.txt", "code_rs.txt", "chinese.txt", "japanese.txt"]
        .map(crate::common::sample)
        .concat();
    let mut large = vec![
        samples.repeat((1 << 20) / samples.len() + 1),
        crate::common::random_texts(7, 600).concat(),
        crate::common::edge_texts().concat(),
        "ab".repeat(50_000),
        "1234567890".repeat(10_000),
        "é".repeat(20_000),
    ];
    // Words of 90 to 140 letters (and of each letter's case), one after another.
    let word = |n: usize| -> String { "thequickbrownfox".chars().cycle().take(n).collect() };
    large.push((90..140).map(word).collect::<Vec<_>>().join(" "));
    large.push(
        (90..140)
            .map(|n| word(n).to_uppercase())
            .collect::<Vec<_>>()
            .join(" "),
    );
    large.push(
        (90..140)
            .map(|n| format!("{}é", word(n)))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    for encoding in ["o200k_base", "o200k_harmony", "cl100k_base"] {
        let tiktoken = Tiktoken::for_encoding(encoding).unwrap();
        for text in &large {
            assert_eq!(
                tiktoken.count(text),
                tiktoken.count_with_tiktoken_rs(text),
                "{encoding} on {} bytes from {}",
                text.len(),
                text.escape_debug().take(100).collect::<String>(),
            );
        }
    }
}

/// Many more random texts than the suite compares, for a release run:
/// `cargo test --release -p tollgate-estimators --test estimators -- --ignored many_random`
/// (`TOLLGATE_RANDOM_TEXTS` of them on each encoding, 100,000 unless set).
#[test]
#[ignore = "long: run in release"]
fn counts_equal_tiktoken_rs_on_many_random_texts() {
    let total: usize = std::env::var("TOLLGATE_RANDOM_TEXTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let encodings = ["o200k_base", "o200k_harmony", "cl100k_base"]
        .map(|encoding| Tiktoken::for_encoding(encoding).unwrap());
    for batch in 0..total.div_ceil(1_000) {
        for text in crate::common::random_texts(1_000 + batch as u64, 1_000) {
            for tiktoken in &encodings {
                assert_eq!(
                    tiktoken.count(&text),
                    tiktoken.count_with_tiktoken_rs(&text),
                    "{} on {} ({} bytes, batch {batch})",
                    tiktoken.name(),
                    text.escape_debug().take(300).collect::<String>(),
                    text.len()
                );
            }
        }
    }
}
