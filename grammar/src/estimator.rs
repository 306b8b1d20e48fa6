//! Estimator names: `openai`, `openai:<model>`, `tiktoken:<encoding>`, `voyageai`,
//! `hf:<path to tokenizer.json>` and `words`.

use std::fmt;

/// An estimator's name, parsed: which family, and its argument.
///
/// ```
/// use tollgate_grammar::{Encoding, EstimatorName};
///
/// assert_eq!(EstimatorName::parse("openai")?, EstimatorName::OpenAi);
/// assert_eq!(EstimatorName::parse("openai:gpt-4")?, EstimatorName::OpenAiModel("gpt-4"));
/// assert_eq!(
///     EstimatorName::parse("tiktoken:cl100k_base")?,
///     EstimatorName::Tiktoken(Encoding::Cl100kBase)
/// );
/// assert_eq!(EstimatorName::parse("HF: tok.json")?, EstimatorName::HuggingFace("tok.json"));
/// assert!(EstimatorName::parse("gemini").is_err());
/// # Ok::<(), tollgate_grammar::EstimatorNameError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EstimatorName<'a> {
    /// `words`: the no-vocabulary rule.
    Words,
    /// `openai` or `tiktoken`: `o200k_base`.
    OpenAi,
    /// `openai:<model>`: the model's encoding.
    OpenAiModel(&'a str),
    /// `tiktoken:<encoding>`.
    Tiktoken(Encoding),
    /// `voyageai` or `voyage`.
    Voyage,
    /// `hf:<path>` or `huggingface:<path>`.
    HuggingFace(&'a str),
}

/// OpenAI's encodings, by their tiktoken names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Encoding {
    /// `o200k_base`: GPT-4o, GPT-4.1, o-series.
    O200kBase,
    /// `o200k_harmony`: gpt-oss.
    O200kHarmony,
    /// `cl100k_base`: GPT-4, GPT-3.5, text-embedding-3.
    Cl100kBase,
    /// `p50k_base`.
    P50kBase,
    /// `p50k_edit`.
    P50kEdit,
    /// `r50k_base` (also `gpt2`).
    R50kBase,
}

impl Encoding {
    const ALL: [(&'static str, Encoding); 7] = [
        ("o200k_base", Encoding::O200kBase),
        ("o200k_harmony", Encoding::O200kHarmony),
        ("cl100k_base", Encoding::Cl100kBase),
        ("p50k_base", Encoding::P50kBase),
        ("p50k_edit", Encoding::P50kEdit),
        ("r50k_base", Encoding::R50kBase),
        ("gpt2", Encoding::R50kBase),
    ];

    /// The encoding called `name` (any case).
    pub fn parse(name: &str) -> Option<Encoding> {
        Encoding::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
            .map(|(_, e)| *e)
    }

    /// The tiktoken name.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::O200kHarmony => "o200k_harmony",
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::P50kBase => "p50k_base",
            Encoding::P50kEdit => "p50k_edit",
            Encoding::R50kBase => "r50k_base",
        }
    }
}

impl<'a> EstimatorName<'a> {
    /// Parses a name. The family is case-insensitive; the argument (a model, an encoding, a
    /// path) is trimmed.
    pub fn parse(name: &'a str) -> Result<EstimatorName<'a>, EstimatorNameError> {
        let trimmed = name.trim();
        let (family, arg) = match trimmed.split_once(':') {
            Some((family, arg)) => (family.trim(), Some(arg.trim())),
            None => (trimmed, None),
        };
        let is = |f: &str| family.eq_ignore_ascii_case(f);
        let unknown = || EstimatorNameError::Unknown(name.to_owned());
        match arg {
            None if is("words") => Ok(EstimatorName::Words),
            None if is("openai") || is("tiktoken") => Ok(EstimatorName::OpenAi),
            None if is("voyageai") || is("voyage") => Ok(EstimatorName::Voyage),
            Some("") => Err(unknown()),
            Some(model) if is("openai") => Ok(EstimatorName::OpenAiModel(model)),
            Some(encoding) if is("tiktoken") => Encoding::parse(encoding)
                .map(EstimatorName::Tiktoken)
                .ok_or_else(|| EstimatorNameError::UnknownEncoding {
                    name: name.to_owned(),
                    encoding: encoding.to_owned(),
                }),
            Some(path) if is("hf") || is("huggingface") => Ok(EstimatorName::HuggingFace(path)),
            _ => Err(unknown()),
        }
    }
}

/// A name that is none of the estimators.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EstimatorNameError {
    /// The name is none of the families.
    Unknown(String),
    /// `tiktoken:<encoding>` with an encoding that does not exist.
    UnknownEncoding {
        /// The whole name.
        name: String,
        /// The encoding.
        encoding: String,
    },
}

impl fmt::Display for EstimatorNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EstimatorNameError::Unknown(name) => write!(
                f,
                "unknown estimator `{name}`; expected openai, openai:<model>, tiktoken:<encoding>, voyageai, hf:<path to tokenizer.json> or words"
            ),
            EstimatorNameError::UnknownEncoding { name, encoding } => write!(
                f,
                "estimator `{name}`: unknown encoding `{encoding}`; expected o200k_base, cl100k_base, p50k_base, p50k_edit, r50k_base or o200k_harmony"
            ),
        }
    }
}

impl std::error::Error for EstimatorNameError {}
