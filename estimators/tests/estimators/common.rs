//! Shared by the estimator tests: the sample texts and the tokenizer fixtures.

use std::path::PathBuf;

/// The sample texts, by file name.
pub fn sample(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fixture tokenizer file from `$TOLLGATE_TOKENIZERS/<model>/tokenizer.json`.
///
/// When the variable or the file is missing the test says so and is skipped, unless
/// `TOLLGATE_REQUIRE_FIXTURES` is set (as `.ci/run` sets it), where it fails instead.
pub fn fixture(model: &str) -> Option<PathBuf> {
    let required = std::env::var_os("TOLLGATE_REQUIRE_FIXTURES").is_some();
    let found = std::env::var_os("TOLLGATE_TOKENIZERS")
        .map(|dir| PathBuf::from(dir).join(model).join("tokenizer.json"))
        .filter(|path| path.is_file());
    match found {
        Some(path) => Some(path),
        None if required => panic!(
            "fixture {model}/tokenizer.json not found: set TOLLGATE_TOKENIZERS to shared/fixtures/tokenizers (TOLLGATE_REQUIRE_FIXTURES is set, so this fails instead of skipping)"
        ),
        None => {
            eprintln!(
                "SKIPPED: fixture {model}/tokenizer.json not found; set TOLLGATE_TOKENIZERS to shared/fixtures/tokenizers to run this test"
            );
            None
        }
    }
}

/// Texts that exercise pre-tokenization: whitespace runs, digits, contractions, special-token
/// look-alikes, emoji, several scripts, code.
pub fn tricky_texts() -> Vec<String> {
    let mut texts: Vec<String> = [
        "",
        " ",
        "Hello, world!",
        "  leading and trailing spaces   ",
        "tabs\tand\nnewlines\r\n\r\nand   runs    of     spaces\n\n\n",
        "I'm sure they'll say it's 12345678901234567890, isn't it?",
        "<|endoftext|> and <|fim_prefix|> are just text here",
        "emoji 🦀🚀👩‍👩‍👧 and accents: naïve café résumé Ångström",
        "Русский текст, ελληνικά, العربية, עברית, हिन्दी",
        "fn main() { let x: Vec<u8> = (0..10).map(|i| i * 2).collect(); }",
        "URL: https://example.com/path?query=1&b=2#frag",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "CamelCaseIdentifiersAndSNAKE_CASE_CONSTANTS and mixedUPPERlower",
        "\u{00a0}non-breaking\u{2003}em-space\u{3000}ideographic space",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for name in ["english.txt", "code_rs.txt", "chinese.txt", "japanese.txt"] {
        texts.push(sample(name));
    }
    texts
}

/// A real PNG signature and IHDR chunk for an image of `w` × `h`.
pub fn png(w: u32, h: u32) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    bytes.extend_from_slice(&w.to_be_bytes());
    bytes.extend_from_slice(&h.to_be_bytes());
    bytes.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
    bytes
}

/// Standard base64 with padding, for image data in request bodies.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
