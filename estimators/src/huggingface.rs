//! Any Hugging Face `tokenizer.json`, through the `tokenizers` crate.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use tokenizers::Tokenizer;

use crate::{Estimator, EstimatorError};

/// Texts up to this are encoded whole: exact.
const CHUNK_ABOVE: usize = 1 << 20;
/// Longer texts are counted in pieces of [`PIECE`] to `2 × PIECE` bytes, so that the encoder's
/// buffers stay a small multiple of a piece rather than of the whole text, and identical pieces
/// (a long run of one character) are counted once.
const PIECE: usize = 64 << 10;
/// A piece is cut before a single space between two non-space characters, where byte-level and
/// whitespace pre-tokenizers split anyway, so the cut changes nothing. Where no such space
/// comes within `2 × PIECE` bytes (text with no spaces), the cut falls inside a word, which can
/// lower the count by a token or two (a merge the cut prevents); each such cut adds this
/// many, so that the estimate errs high, never low.
const FORCED_CUT_MARGIN: usize = 4;

/// Tokenizers by canonical path, loaded once per process.
static FILES: LazyLock<Mutex<HashMap<PathBuf, Arc<Tokenizer>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static FILES_READ: AtomicUsize = AtomicUsize::new(0);

/// A Hugging Face tokenizer file, with its truncation and padding switched off (a file that
/// truncates or pads to 128 would otherwise count every text as 128 tokens).
///
/// Counts the text's own tokens, without the special tokens a model adds around an input
/// (`[CLS]`, `[SEP]`, `<bos>`), and counts text that looks like a special token as ordinary
/// text.
#[derive(Debug, Clone)]
pub struct HuggingFace {
    name: String,
    tokenizer: Arc<Tokenizer>,
}

impl HuggingFace {
    /// Loads `path` (once per process: later calls for the same file share the first load).
    pub fn from_file(path: impl AsRef<Path>) -> Result<HuggingFace, EstimatorError> {
        let path = path.as_ref();
        let name = format!("hf:{}", path.display());
        let load_error = |reason: String| EstimatorError::Load {
            name: name.clone(),
            path: path.display().to_string(),
            reason,
        };
        let canonical = path.canonicalize().map_err(|e| load_error(e.to_string()))?;
        if let Some(found) = FILES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&canonical)
        {
            return Ok(HuggingFace {
                name,
                tokenizer: Arc::clone(found),
            });
        }
        let mut tokenizer =
            Tokenizer::from_file(&canonical).map_err(|e| load_error(e.to_string()))?;
        tokenizer
            .with_truncation(None)
            .map_err(|e| load_error(e.to_string()))?;
        tokenizer.with_padding(None);
        // Text that looks like a special token (`<|endoftext|>`) is counted as the text it is,
        // as every other estimator here counts it.
        tokenizer.set_encode_special_tokens(true);
        FILES_READ.fetch_add(1, Ordering::Relaxed);
        let tokenizer = Arc::clone(
            FILES
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(canonical)
                .or_insert_with(|| Arc::new(tokenizer)),
        );
        Ok(HuggingFace { name, tokenizer })
    }

    /// How many tokenizer files this process has read and parsed: a second load of the same
    /// path doesn't add to it.
    pub fn files_read() -> usize {
        FILES_READ.load(Ordering::Relaxed)
    }

    /// The tokens of `text`, as the tokenizer splits them (for checking one vocabulary against
    /// another).
    pub fn tokens(&self, text: &str) -> Vec<String> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_tokens().to_vec())
            .unwrap_or_default()
    }

    fn count_piece(&self, text: &str) -> usize {
        match self.tokenizer.encode(text, false) {
            Ok(encoding) => encoding.len(),
            // The tokenizer refused the text (it never does for valid UTF-8 with these
            // settings); count it with the no-vocabulary rule rather than as free.
            Err(_) => crate::Words.count(text),
        }
    }
}

/// What a character is, for finding a cut between two kinds (where pre-tokenizers split).
fn kind(c: char) -> u8 {
    if c.is_alphabetic() {
        0
    } else if c.is_numeric() {
        1
    } else if c.is_whitespace() {
        2
    } else {
        3
    }
}

/// The largest char boundary at or below `at`.
fn boundary_below(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Cuts `text` into pieces of `PIECE` to `2 × PIECE` bytes, each answered with whether its
/// cut was forced inside a word.
fn pieces(text: &str) -> impl Iterator<Item = (&str, bool)> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= 2 * PIECE {
            return Some((std::mem::take(&mut rest), false));
        }
        let bytes = rest.as_bytes();
        let lone_space = (PIECE..2 * PIECE).find(|&i| {
            bytes[i] == b' '
                && !bytes[i - 1].is_ascii_whitespace()
                && !bytes[i + 1].is_ascii_whitespace()
        });
        let (cut, forced) = match lone_space {
            Some(cut) => (cut, false),
            None => {
                // Prefer a change of kind (letter to digit, word to punctuation) in the last
                // few kilobytes, where a pre-tokenizer would cut too; else any character.
                let end = boundary_below(rest, 2 * PIECE);
                let window = boundary_below(rest, end - 4096);
                let change = rest[window..end]
                    .char_indices()
                    .zip(rest[window..end].chars().skip(1))
                    .filter(|((_, a), b)| kind(*a) != kind(*b))
                    .map(|((i, a), _)| window + i + a.len_utf8())
                    .last();
                (change.unwrap_or(end), true)
            }
        };
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some((piece, forced))
    })
}

impl Estimator for HuggingFace {
    fn name(&self) -> &str {
        &self.name
    }

    fn count(&self, text: &str) -> usize {
        if text.len() <= CHUNK_ABOVE {
            return self.count_piece(text);
        }
        // A piece seen before in this text is not counted again: a run of one character cut
        // into equal pieces costs one encoding and a hash per piece.
        let mut seen: HashMap<&str, usize> = HashMap::new();
        pieces(text)
            .map(|(piece, forced)| {
                let count = match seen.get(piece) {
                    Some(count) => *count,
                    None => *seen.entry(piece).or_insert_with(|| self.count_piece(piece)),
                };
                count + if forced { FORCED_CUT_MARGIN } else { 0 }
            })
            .sum()
    }
}
