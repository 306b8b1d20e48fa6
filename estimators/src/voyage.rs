//! Voyage AI's voyage-3 vocabulary, offline.

use crate::Estimator;

/// The voyage-3 vocabulary (bpe-openai's `voyage3_base`, embedded: no file, no network).
///
/// It is the same byte-level BPE as Qwen's tokenizer, with NFC normalization.
///
/// ```
/// use tollgate_estimators::{Estimator, Voyage};
///
/// assert!(Voyage::new().count("Embeddings are vectors.") > 0);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Voyage;

impl Voyage {
    /// The estimator (its vocabulary is loaded on first use, once per process).
    pub fn new() -> Voyage {
        Voyage
    }
}

impl Estimator for Voyage {
    fn name(&self) -> &str {
        "voyageai"
    }

    fn count(&self, text: &str) -> usize {
        bpe_openai::voyage3_base().count(text)
    }
}
