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

/// `count` texts of random characters, the same for the same `seed`: ASCII of every class
/// (letters of both cases, digits, punctuation, the six ASCII spaces, control characters,
/// apostrophes before the letters of contractions), and beyond it the characters where
/// pre-tokenization rules differ (letters of each case class, marks, digits and numbers of
/// other scripts, Unicode spaces, `ſ` and the Kelvin sign, which `(?i:'s)` and `(?i:k)` fold,
/// symbols, emoji, CJK), in runs that make words, numbers and whitespace runs of every length.
pub fn random_texts(seed: u64, count: usize) -> Vec<String> {
    const ASCII_CLASSES: [&str; 8] = [
        "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~",
        " \t\n\r\u{0b}\u{0c}",
        "\u{00}\u{01}\u{08}\u{0e}\u{1b}\u{1c}\u{1f}\u{7f}",
        "'sStTmMdDlLvVrReE",
        "  \n",
    ];
    const BEYOND: [&str; 10] = [
        "éüñçøåßàç",
        "ÉÜÑÇØÅÀǅǈ",
        "ʰʲˆ中文字한국ก",
        "\u{0301}\u{0308}\u{0903}\u{20dd}",
        "٣٤۵²³½Ⅻⅻ①",
        "\u{a0}\u{85}\u{1680}\u{2003}\u{2009}\u{2028}\u{2029}\u{202f}\u{3000}",
        "ſ\u{212a}İıΣσς",
        "—–€£©®™°•…«»„“”‘’",
        "🦀🚀👩\u{200d}👩\u{200d}👧\u{fe0f}\u{feff}\u{200b}",
        "。、「」！？ａｂＡＢ１２",
    ];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move |below: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % below as u64) as usize
    };
    let pick = |chars: &str, at: usize| chars.chars().nth(at % chars.chars().count()).unwrap();
    (0..count)
        .map(|_| {
            let mut text = String::new();
            let length = match next(10) {
                0 => next(4),
                1..=7 => next(80),
                8 => next(400),
                _ => next(3_000),
            };
            while text.chars().count() < length {
                // A run of one class: a word, a number, a whitespace run, a symbol cluster.
                let run = 1 + match next(6) {
                    0 => next(150),
                    _ => next(8),
                };
                let class = if next(5) == 0 {
                    BEYOND[next(BEYOND.len())]
                } else {
                    ASCII_CLASSES[next(ASCII_CLASSES.len())]
                };
                for _ in 0..run {
                    text.push(pick(class, next(64)));
                }
            }
            text
        })
        .collect()
}

/// The edges of pre-tokenization, each in several settings (alone, after a word, before one):
/// contractions of every case after words, spaces and punctuation; digit runs of 1 to 7 in
/// and around words; whitespace runs of each kind and length ending the text or before a
/// non-space; `\r\n` mixes; punctuation followed by newlines and slashes; and beyond ASCII:
/// CJK, Cyrillic, Greek, combining marks, emoji with joiners and selectors, `'ſ` and the
/// Kelvin sign (which `(?i:'s)` and `(?i:k)` fold), NBSP and the other Unicode spaces, title
/// case (Lt) and modifier (Lm) letters, other scripts' digits and numbers.
pub fn edge_texts() -> Vec<String> {
    let mut cores: Vec<String> = Vec::new();
    for contraction in ["s", "t", "re", "ve", "m", "ll", "d"] {
        for form in [
            contraction.to_owned(),
            contraction.to_uppercase(),
            // Mixed case: 'Re, 'rE, 'Ll, 'lL, 'Ve, 'vE.
            contraction[..1].to_uppercase() + &contraction[1..],
            contraction[..1].to_owned() + &contraction[1..].to_uppercase(),
        ] {
            for before in ["", "it", "IT", "It", " ", "x ", "!", "3", "\n", "é", "中"] {
                for after in ["", " ", "x", "X", "'", "'s", "\n", "é", "1"] {
                    cores.push(format!("{before}'{form}{after}"));
                }
            }
        }
    }
    cores.extend(
        [
            "'",
            "''",
            "'''s",
            "'ſ",
            "'ſt",
            "x'ſ",
            "X'ſ",
            "'\u{212a}",
            "'lſ",
            "'rſ",
            "'l",
            "'r",
            "'v",
            "'x",
            "'é",
            "ſ's",
            "don't",
            "DON'T",
            "I'M",
            "we'LL",
            "you'Re",
            "they'VE",
            "it's'",
            "rock'n'roll",
            "'tis",
            "o'clock",
            "l'été",
            "L'ÉTÉ",
            "Ǆ'S",
            "ǅ's",
        ]
        .map(str::to_owned),
    );
    for n in 1..=7 {
        let digits: String = "1234567".chars().take(n).collect();
        for (before, after) in [
            ("", ""),
            ("x", ""),
            ("", "x"),
            (" ", " "),
            ("$", "%"),
            ("v", ".0"),
            ("٣", ""),
            ("", "²"),
            ("-", "\n"),
        ] {
            cores.push(format!("{before}{digits}{after}"));
        }
    }
    let spaces = [
        " ", "\t", "\n", "\r", "\r\n", "\n\r", "\u{b}", "\u{c}", "\u{a0}", "\u{85}", "\u{1680}",
        "\u{2000}", "\u{2003}", "\u{2009}", "\u{200a}", "\u{2028}", "\u{2029}", "\u{202f}",
        "\u{205f}", "\u{3000}", "\u{feff}", "\u{200b}",
    ];
    for space in spaces {
        for n in [1, 2, 3, 5] {
            let run = space.repeat(n);
            for (before, after) in [
                ("", ""),
                ("a", ""),
                ("", "a"),
                ("a", "a"),
                ("a", "!"),
                ("a", "1"),
                ("a", "é"),
                ("a", "中"),
                ("a ", "\n"),
                ("a\n", " "),
                ("a", " a"),
            ] {
                cores.push(format!("{before}{run}{after}"));
            }
        }
    }
    cores.extend(
        [
            "a\r\n\r\nb",
            "a \r\n b",
            "a\r \n\tb",
            "\r\r\n\n",
            " \n \n ",
            "\n\n\n",
            "a  \r\n",
            "a\t\r\n  ",
            "x\n\r\n\r y",
            "\r\n",
            "\r",
            "a\rb",
            "a \rb",
            "\u{a0}\n",
            "\n\u{a0}",
            " \u{3000}\nx",
            "\u{2028}\r\n",
        ]
        .map(str::to_owned),
    );
    let punctuation = [
        "!", ".", "...", ",", "?!", "//", "/", "-", "--", ")", "\"", "$", "—", "…", "。",
    ];
    for mark in punctuation {
        for after in [
            "", "\n", "\r\n", "\n\n", "/", "//", "/\n", "\n/", " ", "a", "1", "\r",
        ] {
            for before in ["", "a", " ", "\n"] {
                cores.push(format!("{before}{mark}{after}"));
            }
        }
    }
    cores.extend(
        [
            "中文字符测试，中文。",
            "日本語のテキスト",
            "한국어 텍스트",
            "Привет, мир! ПРИВЕТ Мир",
            "Ελληνικά ΕΛΛΗΝΙΚΑ σς",
            "e\u{301}te\u{301} E\u{301}TE\u{301}",
            "\u{301}\u{301}a",
            " \u{301}",
            "a\u{20dd}",
            "क्षत्रिय",
            "ไทย",
            "🦀",
            "🦀🦀🦀",
            " 🦀",
            "👩\u{200d}👩\u{200d}👧",
            "❤\u{fe0f}",
            "🇫🇷🇩🇪",
            "ſ ſs ſ's",
            "\u{212a}elvin",
            "ǅungla ǈ ǋ ᾈ",
            "ʰʲ ˆx xʰ",
            "ǅ's",
            "Ⅻ ⅻ ① ½",
            "ａｂｃ ＡＢＣ １２３",
            "İstanbul ıi",
            "ß ẞ",
            "ﬁ ﬂ",
            "\u{0}\u{1}\u{7f}\u{80}\u{9f}",
            "\u{e000}\u{f8ff}",
            "\u{10ffff}",
        ]
        .map(str::to_owned),
    );
    let mut texts = Vec::new();
    for core in cores {
        texts.push(format!("{core} and more"));
        texts.push(format!("Then {core}"));
        texts.push(core);
    }
    texts
}

/// Pieces of every fixture tokenizer file that is there (their JSON holds the vocabularies'
/// own tokens, in many scripts, with escapes and byte-level symbols), `count` from each, of up
/// to 2,000 bytes, cut at character boundaries.
pub fn fixture_texts(count: usize) -> Vec<String> {
    let mut texts = Vec::new();
    for model in ["gpt-4o", "qwen3", "all-MiniLM-L6-v2"] {
        let Some(path) = fixture(model) else {
            continue;
        };
        let file = std::fs::read_to_string(&path).unwrap();
        let mut at = 7usize;
        for i in 0..count {
            // Spread over the file, the same pieces every run.
            at = (at * 31 + 1_000_003 * i) % file.len();
            let mut start = at;
            while !file.is_char_boundary(start) {
                start -= 1;
            }
            let mut end = (start + 1 + (i * 7919) % 2_000).min(file.len());
            while !file.is_char_boundary(end) {
                end += 1;
            }
            texts.push(file[start..end].to_owned());
        }
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
