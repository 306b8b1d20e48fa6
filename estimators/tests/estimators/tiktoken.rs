//! The OpenAI estimators: names, model mapping, and counts equal to tiktoken-rs's.

use tollgate_estimators::{Estimator, EstimatorError, Tiktoken, estimator, estimator_strict};

#[test]
fn linear_counter_equals_tiktoken_rs_on_o200k_and_cl100k() {
    for encoding in ["o200k_base", "cl100k_base"] {
        let tiktoken = Tiktoken::for_encoding(encoding).unwrap();
        for text in crate::common::tricky_texts() {
            assert_eq!(
                tiktoken.count(&text),
                tiktoken.count_with_tiktoken_rs(&text),
                "{encoding} on {:?}",
                &text[..text.len().min(60)]
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
