//! Tokens from arguments: a `serde::Serializer` walks any `Serialize` value and counts its text
//! as it goes, without building a JSON tree or copying a string, billing it the way providers
//! bill requests.
//!
//! # What counts
//!
//! - **Elsewhere** (plain strings, lists, user structs, maps): every string value, and every
//!   `char`. Map keys, struct field names, enum variant names, numbers and booleans are
//!   structure, not text.
//! - **A chat message** is a map or struct with a `role` field. It is counted the way OpenAI
//!   bills it: 3 tokens of framing, its `role`, its `content`, its `name` plus 1, and its tool
//!   calls (their names and arguments). A list that holds messages adds 3 tokens once for the
//!   priming of the reply. On messages of role, content and name this is exactly
//!   tiktoken-rs's `num_tokens_from_messages`.
//! - **Content** is a string, or a list of parts: their `text`, a tool call's `name` and
//!   `input` (Anthropic's `tool_use`, its input counted as its JSON text), a tool's result
//!   (Anthropic's `tool_result` `content`, the responses API's `output`), and images.
//! - **Images**: an OpenAI `image_url` part costs 85 tokens at `detail: low`; at `high` or
//!   `auto`, the image is fitted into 2048 × 2048 with its short side scaled down to 768, and
//!   costs 170 per 512-px tile plus 85 (the 32-px patch rule for gpt-4.1-mini, gpt-4.1-nano and
//!   o4-mini, see [`ImageRule`]). An Anthropic `image` block costs (width × height) / 750 after
//!   its long edge is scaled to 1568 px, at most 1,600. The size of a `data:` URL or base64
//!   image is read from its PNG, JPEG, GIF or WebP header; a remote URL can't be read, and
//!   costs the most an image can cost unless [`Billing`] says otherwise. (PDF documents are
//!   not counted.)
//! - **A request body** is a top-level map or struct with a `messages`, `system`, `prompt`,
//!   `input`, `instructions`, `suffix`, `prediction`, `query`, `documents` or `inputs` field
//!   (the shapes of OpenAI's chat, responses and completions APIs, Anthropic's messages and
//!   Voyage's embeddings and reranking). Every field of it counts except its parameters
//!   (`model`, `user`, `metadata`, `stop`, `temperature`, `reasoning`, `tool_choice` and the
//!   like): a field the rules don't know yet counts its strings, so that a request errs high,
//!   never low. The `tools`/`functions` definitions are counted by the OpenAI cookbook's rule
//!   where the estimator has an OpenAI encoding ([`ToolOverheads`]), else as their JSON text
//!   (which errs high). In `input`, integers count one token each (OpenAI accepts
//!   pre-tokenized input). The output the request reserves, `max_tokens` (or
//!   `max_completion_tokens`, `max_output_tokens`)
//!   times `n`, is reported apart in [`Estimate::reserved_output`].

use std::fmt;

use serde::Serialize;

use crate::Estimator;

mod catch;
mod image;
mod rules;
mod tools;
mod tree;
mod walk;

pub use image::{Billing, ImageRule, ImageSize, file_size};
pub use rules::{REPLY_PRIMING, TOKENS_PER_MESSAGE, TOKENS_PER_NAME};
pub use tools::ToolOverheads;

/// The tokens a call will cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    /// The text the request sends (from [`estimate`], at least 1).
    pub input_tokens: u64,
    /// The output the request reserves (`max_tokens` × `n`), 0 when it names none. Providers
    /// that count the reservation against the token limit charge it up front; a limit can
    /// choose to add it.
    pub reserved_output: u64,
}

impl Estimate {
    /// The sum of two estimates, field by field.
    pub fn plus(self, other: Estimate) -> Estimate {
        Estimate {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            reserved_output: self.reserved_output.saturating_add(other.reserved_output),
        }
    }

    /// Input plus reserved output.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.reserved_output)
    }
}

/// How deep arguments may nest (a list in a map in a list ...). Deeper values are refused with
/// an error rather than walked, so that no input can overflow the stack.
pub const MAX_DEPTH: usize = 128;

/// A `Serialize` implementation that failed while its text was being read, or a value nested
/// deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not read the text of the arguments: {0}")]
pub struct ExtractError(String);

impl ExtractError {
    pub(crate) fn new(message: impl Into<String>) -> ExtractError {
        ExtractError(message.into())
    }
}

impl serde::ser::Error for ExtractError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ExtractError(msg.to_string())
    }
}

/// Counts the tokens of `value` with `estimator`; see the [module docs](self) for what counts.
///
/// ```
/// use serde_json::json;
/// use tollgate_estimators::{Words, estimate};
///
/// let body = json!({
///     "model": "gpt-4o",
///     "max_tokens": 256,
///     "n": 2,
///     "messages": [{"role": "user", "content": "Hello there"}],
/// });
/// let estimate = estimate(&Words, &body)?;
/// assert_eq!(estimate.reserved_output, 512);
/// // 3 framing + "user" + "Hello there" + 3 priming; "gpt-4o" is not counted.
/// assert_eq!(estimate.input_tokens, 3 + 1 + 2 + 3);
/// # Ok::<(), tollgate_estimators::ExtractError>(())
/// ```
pub fn estimate<E, T>(estimator: &E, value: &T) -> Result<Estimate, ExtractError>
where
    E: Estimator + ?Sized,
    T: Serialize + ?Sized,
{
    estimate_with(estimator, value, &Billing::default())
}

/// Like [`estimate`], with the caller's choices of [`Billing`] (the size of remote images).
pub fn estimate_with<E, T>(
    estimator: &E,
    value: &T,
    billing: &Billing,
) -> Result<Estimate, ExtractError>
where
    E: Estimator + ?Sized,
    T: Serialize + ?Sized,
{
    let mut estimate = tally_with(estimator, value, billing)?;
    estimate.input_tokens = estimate.input_tokens.max(1);
    Ok(estimate)
}

/// Like [`estimate`], without the floor of 1 token: for adding up several values (the
/// arguments of one call), where the floor applies once to the sum.
///
/// ```
/// use tollgate_estimators::{Words, tally};
///
/// assert_eq!(tally(&Words, "")?.input_tokens, 0);
/// let sum = tally(&Words, "one")?.plus(tally(&Words, "two")?);
/// assert_eq!(sum.input_tokens, 2);
/// # Ok::<(), tollgate_estimators::ExtractError>(())
/// ```
pub fn tally<E, T>(estimator: &E, value: &T) -> Result<Estimate, ExtractError>
where
    E: Estimator + ?Sized,
    T: Serialize + ?Sized,
{
    tally_with(estimator, value, &Billing::default())
}

/// Like [`tally`], with the caller's choices of [`Billing`].
pub fn tally_with<E, T>(
    estimator: &E,
    value: &T,
    billing: &Billing,
) -> Result<Estimate, ExtractError>
where
    E: Estimator + ?Sized,
    T: Serialize + ?Sized,
{
    walk::tally(estimator, value, billing)
}

/// About how many bytes of text counting `value` would read (the bytes of the text it counts,
/// plus the few tokens of framing and the cost of images it adds), found without counting: for
/// deciding whether counting is long enough to move off an async worker.
///
/// ```
/// assert_eq!(tollgate_estimators::text_len(&["Hello", "world"]), 10);
/// ```
pub fn text_len<T: Serialize + ?Sized>(value: &T) -> usize {
    walk::text_len(value)
}
