//! Pre-tokenization: cutting a text into the pieces that are byte-pair encoded one by one,
//! exactly where tiktoken's regular expression cuts it.
//!
//! Most prompts are mostly ASCII, and on ASCII the classes the expressions use (`\p{L}`,
//! `\p{Lu}`, `\p{N}`, `\s`) are a table of 128 entries. So each piece is first cut by hand,
//! reading bytes; only when the cut depends on a character beyond ASCII (a letter, a digit or
//! a space of another script, a mark, a case-insensitive `'ſ`) is that one piece found by the
//! regular expression, run anchored at the same place with a cache of this thread's. The hand
//! cut and the expression are tested against tiktoken-rs on the same texts.

use std::cell::RefCell;

use regex_automata::meta::{Cache, Regex};
use regex_automata::{Anchored, Input};

/// tiktoken's `o200k_base` expression (also `o200k_harmony`'s). A `(?!\S)` look-ahead can't
/// be written in `regex-automata`, so `\s+(?!\S)` is `\s+$` (in the first pattern) or `\s+\s`
/// less its last character (the second pattern, marked as a look-ahead), the rewrite
/// bpe-openai uses.
const O200K: [(&str, bool); 3] = [
    (
        concat!(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"|\p{N}{1,3}",
            r"| ?[^\s\p{L}\p{N}]+[\r\n/]*",
            r"|\s*[\r\n]+",
            r"|\s+$",
        ),
        false,
    ),
    (r"\s+\s", true),
    (r"\s+", false),
];

/// tiktoken's `cl100k_base` expression, its alternatives in tiktoken's order (`\s++$` before
/// `\s*[\r\n]`: a run of spaces and newlines that ends the text is one piece), possessive
/// quantifiers written greedy (no alternative here can match after giving a character back).
const CL100K: [(&str, bool); 3] = [
    (
        concat!(
            r"'(?i:[sdmt]|ll|ve|re)",
            r"|[^\r\n\p{L}\p{N}]?\p{L}+",
            r"|\p{N}{1,3}",
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
            r"|\s+$",
            r"|\s*[\r\n]",
        ),
        false,
    ),
    (r"\s+\s", true),
    (r"\s", false),
];

/// Which expression cuts the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rules {
    O200k,
    Cl100k,
}

impl Rules {
    fn patterns(self) -> &'static [(&'static str, bool); 3] {
        match self {
            Rules::O200k => &O200K,
            Rules::Cl100k => &CL100K,
        }
    }

    /// Where this thread keeps the expression's cache.
    fn slot(self) -> usize {
        match self {
            Rules::O200k => 0,
            Rules::Cl100k => 1,
        }
    }
}

// The classes of an ASCII byte, as the expressions define them on ASCII.
const UPPER: u8 = 1;
const LOWER: u8 = 2;
const DIGIT: u8 = 4;
/// `\s`: `\t`, `\n`, vertical tab, form feed, `\r` and the space (Unicode's White_Space).
const SPACE: u8 = 8;
const NEWLINE: u8 = 16;
/// Past the text's end.
const END: u8 = 32;
/// A byte of a character beyond ASCII: the hand cut stops and asks the expression.
const BEYOND: u8 = 64;
const LETTER: u8 = UPPER | LOWER;

const fn class_of(byte: u8) -> u8 {
    match byte {
        b'A'..=b'Z' => UPPER,
        b'a'..=b'z' => LOWER,
        b'0'..=b'9' => DIGIT,
        b'\r' | b'\n' => SPACE | NEWLINE,
        b'\t' | 0x0b | 0x0c | b' ' => SPACE,
        0x80..=0xff => BEYOND,
        _ => 0,
    }
}

static CLASSES: [u8; 256] = {
    let mut table = [0; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = class_of(byte as u8);
        byte += 1;
    }
    table
};

/// The class of the byte at `at`, [`END`] past the text.
#[inline(always)]
fn class(text: &[u8], at: usize) -> u8 {
    match text.get(at) {
        Some(&byte) => CLASSES[byte as usize],
        None => END,
    }
}

/// `[^\r\n\p{L}\p{N}]`: what may stand before a word.
#[inline(always)]
fn before_word(class: u8) -> bool {
    class & (NEWLINE | LETTER | DIGIT | END | BEYOND) == 0
}

/// `[^\s\p{L}\p{N}]`: punctuation, symbols, control characters.
#[inline(always)]
fn symbol(class: u8) -> bool {
    class & (SPACE | LETTER | DIGIT | END | BEYOND) == 0
}

/// The end of `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` from `at`: `at` itself when none follows;
/// `None` when a character beyond ASCII decides (`'ſ` is `'s` case-insensitively).
#[inline]
fn contraction(text: &[u8], at: usize) -> Option<usize> {
    if text.get(at) != Some(&b'\'') {
        return Some(at);
    }
    let lower = |i: usize| text.get(i).map(u8::to_ascii_lowercase);
    let first = match lower(at + 1) {
        None => return Some(at),
        Some(byte) if byte >= 0x80 => return None,
        Some(byte) => byte,
    };
    let second = match first {
        b's' | b't' | b'm' | b'd' => return Some(at + 2),
        b'r' | b'v' => b'e',
        b'l' => b'l',
        _ => return Some(at),
    };
    match lower(at + 2) {
        Some(byte) if byte >= 0x80 => None,
        Some(byte) if byte == second => Some(at + 3),
        _ => Some(at),
    }
}

/// Scans the run of `\s` from `at`: its end, and the position of its last `\r` or `\n`.
/// `None` when the run ends at a character beyond ASCII (it may be a space too).
#[inline]
fn spaces(text: &[u8], at: usize) -> Option<(usize, Option<usize>)> {
    let mut end = at;
    let mut newline = None;
    loop {
        let class = class(text, end);
        if class & BEYOND != 0 {
            return None;
        }
        if class & SPACE == 0 {
            return Some((end, newline));
        }
        if class & NEWLINE != 0 {
            newline = Some(end);
        }
        end += 1;
    }
}

/// The end of the run of bytes of class `want` from `at`; `None` when it ends at a character
/// beyond ASCII.
#[inline(always)]
fn run(text: &[u8], mut at: usize, want: u8) -> Option<usize> {
    loop {
        let class = class(text, at);
        if class & BEYOND != 0 {
            return None;
        }
        if class & want == 0 {
            return Some(at);
        }
        at += 1;
    }
}

/// Up to three digits from `at` (at least one is there).
#[inline]
fn digits(text: &[u8], at: usize) -> Option<usize> {
    let mut end = at + 1;
    while end < at + 3 {
        let class = class(text, end);
        if class & BEYOND != 0 {
            return None;
        }
        if class & DIGIT == 0 {
            break;
        }
        end += 1;
    }
    Some(end)
}

/// ` ?[^\s\p{L}\p{N}]+` then `[\r\n]*` (and `/` too when `slash`): its end, `Some(at)` when it
/// doesn't match.
#[inline]
fn symbols(text: &[u8], at: usize, slash: bool) -> Option<usize> {
    let mut start = at;
    if text[at] == b' ' {
        let next = class(text, at + 1);
        if next & BEYOND != 0 {
            return None;
        }
        if symbol(next) {
            start = at + 1;
        }
    }
    if !symbol(class(text, start)) {
        return Some(at);
    }
    let mut end = run_symbols(text, start + 1)?;
    while let Some(&byte) = text.get(end) {
        if byte == b'\r' || byte == b'\n' || (slash && byte == b'/') {
            end += 1;
        } else {
            break;
        }
    }
    Some(end)
}

#[inline(always)]
fn run_symbols(text: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let class = class(text, at);
        if class & BEYOND != 0 {
            return None;
        }
        if !symbol(class) {
            return Some(at);
        }
        at += 1;
    }
}

/// The end of the `o200k_base` piece that starts at `at`, cut by hand; `None` when a character
/// beyond ASCII decides it.
fn o200k_piece(text: &[u8], at: usize) -> Option<usize> {
    let first = class(text, at);
    if first & BEYOND != 0 {
        return None;
    }
    // [^\r\n\p{L}\p{N}]? then upper case, then lower case: a word, with a contraction.
    if first & LETTER != 0 || before_word(first) {
        let word = if first & LETTER != 0 { at } else { at + 1 };
        let uppers = run(text, word, UPPER)?;
        let lowers = run(text, uppers, LOWER)?;
        if lowers > word {
            return contraction(text, lowers);
        }
    }
    if first & DIGIT != 0 {
        return digits(text, at);
    }
    let end = symbols(text, at, true)?;
    if end > at {
        return Some(end);
    }
    // The first byte is a space: `\s*[\r\n]+`, else `\s+(?!\S)`, else `\s+`.
    let (end, newline) = spaces(text, at)?;
    Some(match newline {
        Some(newline) => newline + 1,
        None if end == text.len() || end - at == 1 => end,
        None => end - 1,
    })
}

/// The end of the `cl100k_base` piece that starts at `at`, cut by hand; `None` when a
/// character beyond ASCII decides it.
fn cl100k_piece(text: &[u8], at: usize) -> Option<usize> {
    let first = class(text, at);
    if first & BEYOND != 0 {
        return None;
    }
    // '(?i:[sdmt]|ll|ve|re)
    let end = contraction(text, at)?;
    if end > at {
        return Some(end);
    }
    // [^\r\n\p{L}\p{N}]?+\p{L}++
    if first & LETTER != 0 || before_word(first) {
        let word = if first & LETTER != 0 { at } else { at + 1 };
        let letters = run(text, word, LETTER)?;
        if letters > word {
            return Some(letters);
        }
    }
    if first & DIGIT != 0 {
        return digits(text, at);
    }
    let end = symbols(text, at, false)?;
    if end > at {
        return Some(end);
    }
    // `\s++$`, else `\s*[\r\n]`, else `\s+(?!\S)`, else `\s`.
    let (end, newline) = spaces(text, at)?;
    Some(if end == text.len() {
        end
    } else if let Some(newline) = newline {
        newline + 1
    } else if end - at == 1 {
        end
    } else {
        end - 1
    })
}

/// The pre-tokenizer of one encoding.
pub(super) struct Pieces {
    rules: Rules,
    regex: Regex,
    lookahead: [bool; 3],
}

thread_local! {
    /// This thread's cache for each encoding's expression: no lock, no pool to wait on.
    static CACHES: RefCell<[Option<Cache>; 2]> = const { RefCell::new([None, None]) };
}

impl Pieces {
    pub(super) fn new(rules: Rules) -> Pieces {
        let patterns = rules.patterns();
        let regex = Regex::new_many(&patterns.map(|(pattern, _)| pattern))
            .expect("tiktoken's expressions compile");
        Pieces {
            rules,
            regex,
            lookahead: patterns.map(|(_, lookahead)| lookahead),
        }
    }

    /// Calls `piece` with each piece of `text`, in order.
    pub(super) fn each(&self, text: &str, mut piece: impl FnMut(&[u8])) {
        let bytes = text.as_bytes();
        let mut at = 0;
        while at < bytes.len() {
            let cut = match self.rules {
                Rules::O200k => o200k_piece(bytes, at),
                Rules::Cl100k => cl100k_piece(bytes, at),
            };
            let end = match cut {
                Some(end) => end,
                None => self.by_regex(text, at),
            };
            piece(&bytes[at..end]);
            at = end;
        }
    }

    /// The end of the piece at `at`, found by the expression.
    #[cold]
    fn by_regex(&self, text: &str, at: usize) -> usize {
        let slot = self.rules.slot();
        let found = CACHES
            .try_with(|caches| {
                let mut caches = caches.try_borrow_mut().ok()?;
                let cache = caches[slot].get_or_insert_with(|| self.regex.create_cache());
                Some(self.find(cache, text, at))
            })
            .ok()
            .flatten();
        // A thread being torn down has no locals left: a cache of its own for this piece.
        found.unwrap_or_else(|| self.find(&mut self.regex.create_cache(), text, at))
    }

    fn find(&self, cache: &mut Cache, text: &str, at: usize) -> usize {
        let input = Input::new(text).range(at..).anchored(Anchored::Yes);
        let found = self
            .regex
            .search_with(cache, &input)
            .expect("every character starts a piece");
        let mut end = found.end();
        if self.lookahead[found.pattern().as_usize()] {
            let last = text[at..end]
                .chars()
                .next_back()
                .expect("a look-ahead match has a last character");
            end -= last.len_utf8();
        }
        debug_assert!(end > at);
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand cut's classes are the expressions' own on every ASCII byte.
    #[test]
    fn ascii_classes_are_the_expressions_classes() {
        let classes = [
            (UPPER, r"\p{Lu}"),
            (LOWER, r"\p{Ll}"),
            (DIGIT, r"\p{N}"),
            (SPACE, r"\s"),
            (NEWLINE, r"[\r\n]"),
        ];
        for (class, pattern) in classes {
            let regex = Regex::new(&format!("^{pattern}$")).unwrap();
            for byte in 0u8..0x80 {
                let text = (byte as char).to_string();
                assert_eq!(
                    CLASSES[byte as usize] & class != 0,
                    regex.is_match(&text),
                    "{pattern} on {byte:#04x}"
                );
            }
        }
        // Letters are exactly the upper and lower case ones in ASCII (no Lt, Lm, Lo or M).
        let letter = Regex::new(r"^[\p{L}\p{M}]$").unwrap();
        for byte in 0u8..0x80 {
            let text = (byte as char).to_string();
            assert_eq!(CLASSES[byte as usize] & LETTER != 0, letter.is_match(&text));
        }
    }

    fn cut(rules: Rules, text: &str) -> Vec<String> {
        let pieces = Pieces::new(rules);
        let mut out = Vec::new();
        pieces.each(text, |piece| {
            out.push(String::from_utf8(piece.to_vec()).unwrap());
        });
        out
    }

    fn by_regex_alone(rules: Rules, text: &str) -> Vec<String> {
        let pieces = Pieces::new(rules);
        let mut out = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let end = pieces.by_regex(text, at);
            out.push(text[at..end].to_owned());
            at = end;
        }
        out
    }

    /// tiktoken-rs's own expressions, run by the engine it runs them with (fancy-regex,
    /// with its look-ahead and possessive quantifiers): the pieces tiktoken byte-pair encodes.
    struct Reference([fancy_regex::Regex; 2]);

    /// tiktoken-rs's `cl100k_base` expression, as its source writes it.
    const CL100K_TIKTOKEN: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";

    impl Reference {
        fn new() -> Reference {
            Reference([
                fancy_regex::Regex::new(tiktoken_rs::O200K_BASE_PAT_STR).unwrap(),
                fancy_regex::Regex::new(CL100K_TIKTOKEN).unwrap(),
            ])
        }

        fn pieces(&self, rules: Rules, text: &str) -> Vec<String> {
            self.0[rules.slot()]
                .find_iter(text)
                .map(|found| found.unwrap().as_str().to_owned())
                .collect()
        }
    }

    /// Every string of up to `length` characters from `alphabet`.
    fn every_string(alphabet: &[char], length: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..length {
            last = last
                .iter()
                .flat_map(|text| {
                    alphabet.iter().map(move |c| {
                        let mut text = text.clone();
                        text.push(*c);
                        text
                    })
                })
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    /// The pieces are tiktoken's own, on every short string of the characters where the
    /// expressions' branches part: each ASCII class, the letters of contractions in both cases, `\r` and
    /// `\n`, `/`, and beyond ASCII a lower and an upper case letter, a title case (Lt) and a
    /// modifier (Lm) letter, a combining mark, CJK, a digit and a number of another script, an
    /// NBSP, an ideographic space, `ſ` (which `(?i:'s)` takes) and the Kelvin sign.
    #[test]
    fn pieces_are_tiktokens_on_every_short_string() {
        let reference = Reference::new();
        let pieces = [Pieces::new(Rules::O200k), Pieces::new(Rules::Cl100k)];
        let wide: Vec<char> = "aZ's1 \n\r!/\té\u{a0}ſǅʰ\u{301}中²\u{3000}\u{212a}Ж٣"
            .chars()
            .collect();
        let ascii: Vec<char> = "a'sStTmMdDlLrRvVeE1 \n\r!/\t\u{b}".chars().collect();
        let mut texts = every_string(&wide, 3);
        texts.extend(every_string(&ascii, 4));
        for rules in [Rules::O200k, Rules::Cl100k] {
            let cutter = &pieces[rules.slot()];
            for text in &texts {
                let mut cut = Vec::new();
                cutter.each(text, |piece| {
                    cut.push(String::from_utf8(piece.to_vec()).unwrap())
                });
                assert_eq!(cut, reference.pieces(rules, text), "{rules:?} on {text:?}");
            }
        }
    }

    #[test]
    fn the_hand_cut_agrees_with_the_expression() {
        let texts = [
            "Hello, world! I'm here, they'll see: it's 12345 o'clock.",
            "HELLOworld HELLO's don'T  x\t\ty \n\n  z\r\n",
            "a\n  ",
            "trailing   ",
            "  leading",
            "path/to/file!\n/next ...'s --x",
            "\x00\x01\x7f\x1c x",
            "'s 'S 'll 'Ve 're 'x 'sup",
            "CamelCase snake_case SCREAMING_CASE x1y22z333w4444",
        ];
        let reference = Reference::new();
        for rules in [Rules::O200k, Rules::Cl100k] {
            for text in texts {
                let cut = cut(rules, text);
                assert_eq!(cut, by_regex_alone(rules, text), "{rules:?} on {text:?}");
                assert_eq!(cut, reference.pieces(rules, text), "{rules:?} on {text:?}");
            }
        }
    }
}
