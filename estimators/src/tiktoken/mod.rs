//! OpenAI's vocabularies through tiktoken-rs.

mod pieces;
mod vocabulary;

use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};
use tollgate_grammar::Encoding;

use self::vocabulary::{CL100K_BASE, O200K_BASE, Vocabulary};
use crate::{Estimator, EstimatorError, ImageRule, ToolOverheads};

/// An OpenAI encoding (`o200k_base` by default).
///
/// The vocabularies and the model → encoding map are tiktoken-rs's. For `o200k_base`,
/// `o200k_harmony` (the same ordinary tokens) and `cl100k_base`, the count is made without
/// encoding: the text is cut where tiktoken's expression cuts it (by hand on ASCII), a piece
/// that is a token counts one, a short one is merged by tiktoken's rule in an array on the
/// stack, and a long one goes to bpe-openai's linear-time encoder over the same vocabulary
/// (tiktoken's merge is quadratic in the length of one piece, and a 10 MB string without
/// spaces is one piece). Counting allocates nothing (but the expression's cache, once per
/// thread, for text beyond ASCII) and takes no lock: about 2 µs for 1 KB of English, some 7
/// times faster than bpe-openai's count (`BENCHMARKS.md`). The counts equal tiktoken-rs's
/// `encode_ordinary(text).len()` (tested on every encoding). The other encodings, older and
/// rarely asked for, are counted by tiktoken-rs itself.
///
/// Making one loads its vocabulary (once per process: about 0.1 s for `o200k_base`), so
/// the first count is as fast as the next.
///
/// ```
/// use tollgate_estimators::{Estimator, Tiktoken};
///
/// let gpt4 = Tiktoken::for_model("gpt-4")?;
/// assert_eq!(gpt4.encoding(), "cl100k_base");
/// // Special-token text is ordinary text here.
/// assert_eq!(Tiktoken::default().count("<|endoftext|>"), 7);
/// # Ok::<(), tollgate_estimators::EstimatorError>(())
/// ```
#[derive(Clone)]
pub struct Tiktoken {
    name: String,
    tokenizer: Tokenizer,
    counter: Counter,
    /// The model, when made for one: it decides how images are billed.
    model: Option<String>,
}

#[derive(Clone, Copy)]
enum Counter {
    Fast(&'static Vocabulary),
    Tiktoken(&'static CoreBPE),
}

impl std::fmt::Debug for Tiktoken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiktoken")
            .field("name", &self.name)
            .field("encoding", &self.encoding())
            .finish()
    }
}

impl Default for Tiktoken {
    fn default() -> Tiktoken {
        Tiktoken::from_tokenizer(Tokenizer::O200kBase).named("openai")
    }
}

fn encoding_name(tokenizer: Tokenizer) -> &'static str {
    match tokenizer {
        Tokenizer::O200kHarmony => "o200k_harmony",
        Tokenizer::O200kBase => "o200k_base",
        Tokenizer::Cl100kBase => "cl100k_base",
        Tokenizer::P50kBase => "p50k_base",
        Tokenizer::R50kBase | Tokenizer::Gpt2 => "r50k_base",
        Tokenizer::P50kEdit => "p50k_edit",
    }
}

impl Tiktoken {
    fn from_tokenizer(tokenizer: Tokenizer) -> Tiktoken {
        let counter = match tokenizer {
            Tokenizer::O200kBase | Tokenizer::O200kHarmony => Counter::Fast(&O200K_BASE),
            Tokenizer::Cl100kBase => Counter::Fast(&CL100K_BASE),
            other => Counter::Tiktoken(
                tiktoken_rs::bpe_for_tokenizer(other).expect("tiktoken-rs embeds every encoding"),
            ),
        };
        Tiktoken {
            name: format!("tiktoken:{}", encoding_name(tokenizer)),
            tokenizer,
            counter,
            model: None,
        }
    }

    pub(crate) fn named(mut self, name: &str) -> Tiktoken {
        name.clone_into(&mut self.name);
        self
    }

    /// The encoding a model uses, as tiktoken-rs maps it: `gpt-4o` → `o200k_base`,
    /// `gpt-4` → `cl100k_base`.
    pub fn for_model(model: &str) -> Result<Tiktoken, EstimatorError> {
        let tokenizer = get_tokenizer(model).ok_or_else(|| EstimatorError::UnknownModel {
            name: format!("openai:{model}"),
            model: model.to_owned(),
        })?;
        let mut made = Tiktoken::from_tokenizer(tokenizer).named(&format!("openai:{model}"));
        made.model = Some(model.to_owned());
        Ok(made)
    }

    /// An encoding by name: `o200k_base`, `cl100k_base`, `p50k_base`, `p50k_edit`,
    /// `r50k_base` (also `gpt2`), `o200k_harmony`.
    pub fn for_encoding(encoding: &str) -> Result<Tiktoken, EstimatorError> {
        let tokenizer = match Encoding::parse(encoding) {
            Some(Encoding::O200kBase) => Tokenizer::O200kBase,
            Some(Encoding::O200kHarmony) => Tokenizer::O200kHarmony,
            Some(Encoding::Cl100kBase) => Tokenizer::Cl100kBase,
            Some(Encoding::P50kBase) => Tokenizer::P50kBase,
            Some(Encoding::P50kEdit) => Tokenizer::P50kEdit,
            Some(Encoding::R50kBase) => Tokenizer::R50kBase,
            // The grammar's list is the one list; an encoding it adds reads as unknown here
            // until this crate maps it.
            Some(_) | None => {
                return Err(EstimatorError::UnknownEncoding {
                    name: format!("tiktoken:{encoding}"),
                    encoding: encoding.to_owned(),
                });
            }
        };
        Ok(Tiktoken::from_tokenizer(tokenizer))
    }

    /// The encoding's name.
    pub fn encoding(&self) -> &'static str {
        encoding_name(self.tokenizer)
    }

    /// Counts with tiktoken-rs's own `encode_ordinary`, whatever the encoding: the reference
    /// the counter is tested and benchmarked against.
    pub fn count_with_tiktoken_rs(&self, text: &str) -> usize {
        match tiktoken_rs::bpe_for_tokenizer(self.tokenizer) {
            Ok(bpe) => bpe.encode_ordinary(text).len(),
            // tiktoken-rs embeds its vocabularies and never fails here; if it ever did, the
            // counter's answer is the same count.
            Err(_) => self.count(text),
        }
    }
}

impl EstimatorError {
    /// The same error under the name the user asked for.
    pub(crate) fn renamed(self, asked: &str) -> EstimatorError {
        match self {
            EstimatorError::UnknownModel { model, .. } => EstimatorError::UnknownModel {
                name: asked.to_owned(),
                model,
            },
            EstimatorError::UnknownEncoding { encoding, .. } => EstimatorError::UnknownEncoding {
                name: asked.to_owned(),
                encoding,
            },
            other => other,
        }
    }
}

impl Estimator for Tiktoken {
    fn name(&self) -> &str {
        &self.name
    }

    fn tool_overheads(&self) -> Option<ToolOverheads> {
        match self.tokenizer {
            Tokenizer::O200kBase | Tokenizer::O200kHarmony => Some(ToolOverheads::O200K),
            Tokenizer::Cl100kBase => Some(ToolOverheads::CL100K),
            _ => None,
        }
    }

    fn image_rule(&self) -> ImageRule {
        // The models OpenAI bills by 32-px patches, with their multipliers.
        let model = self.model.as_deref().unwrap_or("");
        let multiplier = if model.starts_with("gpt-4.1-mini") {
            Some(1.62)
        } else if model.starts_with("gpt-4.1-nano") {
            Some(2.46)
        } else if model.starts_with("o4-mini") {
            Some(1.72)
        } else {
            None
        };
        match multiplier {
            Some(multiplier) => ImageRule::Patches { multiplier },
            None => ImageRule::Tiles,
        }
    }

    fn count(&self, text: &str) -> usize {
        match self.counter {
            Counter::Fast(vocabulary) => vocabulary.count(text),
            Counter::Tiktoken(bpe) => bpe.encode_ordinary(text).len(),
        }
    }
}
