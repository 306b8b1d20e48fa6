//! Token-count estimators: the number of tokens a provider will bill for a call's arguments.
//!
//! This crate knows nothing of buckets; tollgate asks it for the token cost of a call.
//!
//! | name | vocabulary | cargo feature |
//! |---|---|---|
//! | `openai`, `tiktoken` | `o200k_base` (today's OpenAI models) | `tiktoken` (default) |
//! | `openai:<model>` | the model's encoding, as tiktoken-rs maps it (`openai:gpt-4` → `cl100k_base`) | `tiktoken` |
//! | `tiktoken:<encoding>` | `o200k_base`, `cl100k_base`, `p50k_base`, `p50k_edit`, `r50k_base`, `o200k_harmony` | `tiktoken` |
//! | `voyageai`, `voyage` | Voyage AI's voyage-3, offline | `voyage` (default) |
//! | `hf:<path to tokenizer.json>` | any Hugging Face tokenizer | `huggingface` |
//! | `words` | none: a rule on characters (see [`Words`]) | always |
//!
//! ```
//! use tollgate_estimators::{estimate, estimator};
//!
//! let openai = estimator("openai")?;
//! assert_eq!(openai.count("Hello, world!"), 4);
//! let body = serde_json::json!({
//!     "model": "gpt-4o",
//!     "messages": [{"role": "user", "content": "Hello, world!"}],
//! });
//! // 3 per message + "user" (1) + the content (4) + 3 for the reply's priming.
//! assert_eq!(estimate(&*openai, &body)?.input_tokens, 11);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Loading and falling back
//!
//! Each vocabulary is loaded once per process and shared: [`estimator`] returns the same
//! `Arc` for the same name every time, and a Hugging Face file is read once per path. When a
//! vocabulary can't be loaded (a missing or corrupt `tokenizer.json`), [`estimator`] falls back
//! along Hugging Face → tiktoken → words, with one `tracing` warning the first time;
//! [`estimator_strict`] returns the error instead. An unknown name is an error either way.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use tollgate_grammar::{EstimatorName, EstimatorNameError};

mod cache;
pub mod extract;
#[cfg(feature = "huggingface")]
mod huggingface;
#[cfg(feature = "tiktoken")]
mod tiktoken;
#[cfg(feature = "voyage")]
mod voyage;
mod words;

pub use cache::{CACHE_ABOVE, Cached, LONG_FROM};
pub use extract::{
    Billing, Estimate, ExtractError, ImageRule, ImageSize, ToolOverheads, estimate, estimate_with,
    tally, tally_with, text_len,
};
#[cfg(feature = "huggingface")]
#[cfg_attr(docsrs, doc(cfg(feature = "huggingface")))]
pub use huggingface::HuggingFace;
#[cfg(feature = "tiktoken")]
#[cfg_attr(docsrs, doc(cfg(feature = "tiktoken")))]
pub use tiktoken::Tiktoken;
#[cfg(feature = "voyage")]
#[cfg_attr(docsrs, doc(cfg(feature = "voyage")))]
pub use voyage::Voyage;
pub use words::Words;

/// Turns text into the number of tokens a provider would bill for it.
///
/// Implementations count *ordinary* text: a string that looks like a special token
/// (`<|endoftext|>`) is counted as the text it is, never an error or a panic.
pub trait Estimator: Send + Sync + fmt::Debug {
    /// The name this estimator is looked up by (`openai`, `hf:/path/tokenizer.json`, `words`).
    fn name(&self) -> &str;

    /// The number of tokens of `text`.
    fn count(&self, text: &str) -> usize;

    /// The fixed costs OpenAI adds to tool definitions for this vocabulary, when they are known
    /// (the `o200k_base` and `cl100k_base` encodings). Without them, a tool definition is
    /// counted as its JSON text, which errs high.
    fn tool_overheads(&self) -> Option<ToolOverheads> {
        None
    }

    /// How the provider of this vocabulary bills images: OpenAI's tiles unless the model is
    /// known to use patches.
    fn image_rule(&self) -> ImageRule {
        ImageRule::Tiles
    }

    /// True when the count errs high by design (no vocabulary: [`Words`]): a limiter adds no
    /// margin for a provider's count straying from it, as it does for a vocabulary's exact one.
    fn errs_high(&self) -> bool {
        false
    }
}

macro_rules! forward {
    ($($ty:ty),*) => {
        $(impl<E: Estimator + ?Sized> Estimator for $ty {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn count(&self, text: &str) -> usize {
                (**self).count(text)
            }
            fn tool_overheads(&self) -> Option<ToolOverheads> {
                (**self).tool_overheads()
            }
            fn image_rule(&self) -> ImageRule {
                (**self).image_rule()
            }
            fn errs_high(&self) -> bool {
                (**self).errs_high()
            }
        })*
    };
}

forward!(Arc<E>, &E);

/// Why an estimator could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EstimatorError {
    /// The name is none of those in the table in the crate docs.
    #[error("{}", EstimatorNameError::Unknown(.0.clone()))]
    UnknownName(String),
    /// `openai:<model>` with a model tiktoken-rs does not know.
    #[error(
        "estimator `{name}`: tiktoken-rs knows no encoding for model `{model}`; name the encoding instead, like tiktoken:o200k_base"
    )]
    UnknownModel {
        /// The estimator name.
        name: String,
        /// The model.
        model: String,
    },
    /// `tiktoken:<encoding>` with an encoding that does not exist.
    #[error(
        "estimator `{name}`: unknown encoding `{encoding}`; expected o200k_base, cl100k_base, p50k_base, p50k_edit, r50k_base or o200k_harmony"
    )]
    UnknownEncoding {
        /// The estimator name.
        name: String,
        /// The encoding.
        encoding: String,
    },
    /// The estimator needs a cargo feature this build lacks.
    #[error(
        "estimator `{name}` needs the cargo feature `{feature}` of tollgate-estimators (or tollgate)"
    )]
    FeatureDisabled {
        /// The estimator name.
        name: String,
        /// The feature to turn on.
        feature: &'static str,
    },
    /// A vocabulary file could not be read or parsed.
    #[error("estimator `{name}`: could not load `{path}`: {reason}")]
    Load {
        /// The estimator name.
        name: String,
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

/// An estimator's name, and whether it may fall back.
type LoadKey = (String, bool);

/// Name → estimator, once per process.
static LOADED: LazyLock<Mutex<HashMap<LoadKey, Arc<dyn Estimator>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The estimator called `name`, loaded once per process and shared; falls back along Hugging
/// Face → tiktoken → words when a vocabulary can't be loaded, with one warning.
///
/// Fails for an unknown name, and for a name whose cargo feature is off.
pub fn estimator(name: &str) -> Result<Arc<dyn Estimator>, EstimatorError> {
    cached(name, true)
}

/// Like [`estimator`], but a vocabulary that can't be loaded is an error, not a fallback.
pub fn estimator_strict(name: &str) -> Result<Arc<dyn Estimator>, EstimatorError> {
    cached(name, false)
}

fn cached(name: &str, fallback: bool) -> Result<Arc<dyn Estimator>, EstimatorError> {
    let key = (name.to_owned(), fallback);
    if let Some(found) = LOADED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Ok(Arc::clone(found));
    }
    // Load outside the lock: a tokenizer file can take a while, and other names shouldn't wait.
    let made = build(name, fallback)?;
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(Arc::clone(loaded.entry(key).or_insert(made)))
}

fn build(name: &str, fallback: bool) -> Result<Arc<dyn Estimator>, EstimatorError> {
    match EstimatorName::parse(name)? {
        EstimatorName::Words => Ok(Arc::new(Cached::new(Words))),
        EstimatorName::OpenAi => tiktoken_named(name, "o200k_base", false),
        EstimatorName::OpenAiModel(model) => tiktoken_named(name, model, true),
        EstimatorName::Tiktoken(encoding) => tiktoken_named(name, encoding.name(), false),
        EstimatorName::Voyage => voyage_named(name),
        EstimatorName::HuggingFace(path) => hf_named(name, path, fallback),
    }
}

/// Checks `name` without loading any vocabulary: that it is an estimator's name, that this
/// build has its cargo feature, and for `openai:<model>` that the model has a known encoding.
/// What it can't check without reading a file (a Hugging Face path) is left to [`estimator`].
///
/// ```
/// use tollgate_estimators::check_name;
///
/// assert!(check_name("openai:gpt-4o").is_ok());
/// assert!(check_name("hf:/any/path/tokenizer.json").is_ok() || cfg!(not(feature = "huggingface")));
/// assert_eq!(
///     check_name("nonsense").unwrap_err().to_string(),
///     "unknown estimator `nonsense`; expected openai, openai:<model>, tiktoken:<encoding>, voyageai, hf:<path to tokenizer.json> or words"
/// );
/// ```
pub fn check_name(name: &str) -> Result<(), EstimatorError> {
    let feature = |feature: &'static str, on: bool| {
        if on {
            Ok(())
        } else {
            Err(EstimatorError::FeatureDisabled {
                name: name.to_owned(),
                feature,
            })
        }
    };
    match EstimatorName::parse(name)? {
        EstimatorName::Words => Ok(()),
        EstimatorName::OpenAi | EstimatorName::Tiktoken(_) => {
            feature("tiktoken", cfg!(feature = "tiktoken"))
        }
        EstimatorName::OpenAiModel(model) => {
            feature("tiktoken", cfg!(feature = "tiktoken"))?;
            check_model(name, model)
        }
        EstimatorName::Voyage => feature("voyage", cfg!(feature = "voyage")),
        EstimatorName::HuggingFace(_) => feature("huggingface", cfg!(feature = "huggingface")),
    }
}

#[cfg(feature = "tiktoken")]
fn check_model(name: &str, model: &str) -> Result<(), EstimatorError> {
    match tiktoken_rs::tokenizer::get_tokenizer(model) {
        Some(_) => Ok(()),
        None => Err(EstimatorError::UnknownModel {
            name: name.to_owned(),
            model: model.to_owned(),
        }),
    }
}

#[cfg(not(feature = "tiktoken"))]
fn check_model(_: &str, _: &str) -> Result<(), EstimatorError> {
    Ok(())
}

impl From<EstimatorNameError> for EstimatorError {
    fn from(err: EstimatorNameError) -> EstimatorError {
        match err {
            EstimatorNameError::UnknownEncoding { name, encoding } => {
                EstimatorError::UnknownEncoding { name, encoding }
            }
            EstimatorNameError::Unknown(name) => EstimatorError::UnknownName(name),
            other => EstimatorError::UnknownName(other.to_string()),
        }
    }
}

#[cfg(feature = "tiktoken")]
fn tiktoken_named(
    name: &str,
    what: &str,
    model: bool,
) -> Result<Arc<dyn Estimator>, EstimatorError> {
    let made = if model {
        Tiktoken::for_model(what)
    } else {
        Tiktoken::for_encoding(what)
    };
    made.map(|t| Arc::new(Cached::new(t.named(name))) as Arc<dyn Estimator>)
        .map_err(|e| e.renamed(name))
}

#[cfg(not(feature = "tiktoken"))]
fn tiktoken_named(name: &str, _: &str, _: bool) -> Result<Arc<dyn Estimator>, EstimatorError> {
    Err(EstimatorError::FeatureDisabled {
        name: name.to_owned(),
        feature: "tiktoken",
    })
}

#[cfg(feature = "voyage")]
fn voyage_named(_: &str) -> Result<Arc<dyn Estimator>, EstimatorError> {
    Ok(Arc::new(Cached::new(Voyage::new())))
}

#[cfg(not(feature = "voyage"))]
fn voyage_named(name: &str) -> Result<Arc<dyn Estimator>, EstimatorError> {
    Err(EstimatorError::FeatureDisabled {
        name: name.to_owned(),
        feature: "voyage",
    })
}

#[cfg(feature = "huggingface")]
fn hf_named(name: &str, path: &str, fallback: bool) -> Result<Arc<dyn Estimator>, EstimatorError> {
    match HuggingFace::from_file(path) {
        Ok(hf) => Ok(Arc::new(Cached::new(hf))),
        Err(err) if fallback => Ok(fall_back(name, err)),
        Err(err) => Err(err),
    }
}

#[cfg(not(feature = "huggingface"))]
fn hf_named(name: &str, _: &str, _: bool) -> Result<Arc<dyn Estimator>, EstimatorError> {
    Err(EstimatorError::FeatureDisabled {
        name: name.to_owned(),
        feature: "huggingface",
    })
}

/// The next estimator down the chain (tiktoken's o200k_base, else words), with one warning per
/// failing name.
#[cfg_attr(not(feature = "huggingface"), allow(dead_code))]
fn fall_back(name: &str, err: EstimatorError) -> Arc<dyn Estimator> {
    let next: Arc<dyn Estimator> = match tiktoken_named("openai", "o200k_base", false) {
        Ok(tiktoken) => tiktoken,
        Err(_) => Arc::new(Cached::new(Words)),
    };
    // `cached` makes this run once per name, so this is the one warning.
    tracing::warn!(
        estimator = name,
        fallback = next.name(),
        error = %err,
        "could not load the estimator's vocabulary; counting with {} instead",
        next.name()
    );
    Arc::new(Fallback {
        name: name.to_owned(),
        inner: next,
    })
}

/// An estimator standing in for one that could not be loaded.
#[derive(Debug)]
struct Fallback {
    name: String,
    inner: Arc<dyn Estimator>,
}

impl Estimator for Fallback {
    fn name(&self) -> &str {
        &self.name
    }
    fn count(&self, text: &str) -> usize {
        self.inner.count(text)
    }
    fn tool_overheads(&self) -> Option<ToolOverheads> {
        self.inner.tool_overheads()
    }
    fn image_rule(&self) -> ImageRule {
        self.inner.image_rule()
    }
    fn errs_high(&self) -> bool {
        self.inner.errs_high()
    }
}
