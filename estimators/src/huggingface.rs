//! Any Hugging Face `tokenizer.json`, through the `tokenizers` crate.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use tokenizers::Tokenizer;

use crate::{Estimator, EstimatorError};

/// Texts longer than this are counted in pieces of about [`PIECE`] bytes, cut before a single
/// space between two non-space characters, so that the encoder's buffers stay a small multiple
/// of a piece rather than of the whole text.
const CHUNK_ABOVE: usize = 1 << 20;
const PIECE: usize = 256 << 10;

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

/// Cuts `text` into pieces of about `PIECE` bytes, each cut before a lone space between two
/// non-space characters, where byte-level and whitespace pre-tokenizers split anyway.
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= PIECE {
            return Some(std::mem::take(&mut rest));
        }
        let bytes = rest.as_bytes();
        let cut = (PIECE..bytes.len().saturating_sub(1))
            .find(|&i| {
                bytes[i] == b' '
                    && !bytes[i - 1].is_ascii_whitespace()
                    && !bytes[i + 1].is_ascii_whitespace()
            })
            .unwrap_or(rest.len());
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
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
        pieces(text).map(|piece| self.count_piece(piece)).sum()
    }
}
