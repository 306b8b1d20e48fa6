//! The word-count fallback never undercounts o200k on prose, code or CJK text.

use tollgate_estimators::{Estimator, Tiktoken, Words};

#[test]
fn words_never_undercounts() {
    let o200k = Tiktoken::default();
    // The table in the docs of `Words`: (file, o200k tokens, words tokens).
    let table = [
        ("english.txt", 570, 714),
        ("code_rs.txt", 4086, 5727),
        ("chinese.txt", 440, 579),
        ("japanese.txt", 540, 695),
    ];
    for (file, o200k_tokens, words_tokens) in table {
        let text = crate::common::sample(file);
        assert_eq!(o200k.count(&text), o200k_tokens, "{file}");
        assert_eq!(Words.count(&text), words_tokens, "{file}");
        let ratio = words_tokens as f64 / o200k_tokens as f64;
        assert!((1.0..=1.6).contains(&ratio), "{file}: ratio {ratio:.2}");
    }
}

#[test]
fn a_three_quarter_token_per_word_rule_would_undercount() {
    // Why the rule looks at characters: whitespace words undercount every sample.
    let o200k = Tiktoken::default();
    for file in ["english.txt", "code_rs.txt", "chinese.txt", "japanese.txt"] {
        let text = crate::common::sample(file);
        let naive = (text.split_whitespace().count() as f64 * 0.75) as usize;
        assert!(naive < o200k.count(&text), "{file}");
    }
}
