//! What a 429 means, in one place: whether it is worth retrying ([`Verdict`]), which
//! currencies it says are spent (from the rate-limit headers, else the providers' own words),
//! the code and message of its body, and the error an adapter answers for one no retry can
//! fix ([`PermanentRefusal`]).

use std::fmt;
use std::time::Duration;

use serde_json::Value;

use super::headers::RateHeader;
use crate::cost::Cost;
use crate::rate::{Currencies, Currency};

/// What a response meant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Not a 429: the call went through (whatever its status).
    Passed,
    /// A rate limit: worth retrying after the pause (the key is paused for it already).
    Transient {
        /// How long the key is paused: the provider's own pause for the first 429 in a row,
        /// longer (with jitter) for each further one (`None`: the key's limits are not known
        /// yet, and the provider gave no pause).
        pause: Option<Duration>,
    },
    /// A 429 no retry can fix: a spent quota or a spend limit.
    Permanent {
        /// The error code the body gave, if any.
        code: Option<String>,
        /// The provider's own words (`error.message`), if the body had them.
        message: Option<String>,
    },
}

/// The error an adapter answers for a permanent 429: retrying it only burns time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermanentRefusal {
    /// The provider profile's name.
    pub profile: String,
    /// The error code the body gave, if any.
    pub code: Option<String>,
    /// The provider's own message, if the body had one.
    pub message: Option<String>,
}

impl fmt::Display for PermanentRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} refused the call for good (429", self.profile)?;
        if let Some(code) = &self.code {
            write!(f, " {code}")?;
        }
        write!(
            f,
            "): the quota or spend limit is used up; retrying will not help"
        )?;
        if let Some(message) = &self.message {
            write!(f, ". The provider said: {message}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PermanentRefusal {}

/// The currencies a provider counts (and a 429 may say are spent).
const PROVIDER_COUNTS: [Currency; 3] =
    [Currency::Requests, Currency::Tokens, Currency::OutputTokens];

/// The spending a 429 says is used up: the currencies whose `remaining` can't pay what the
/// call needed in them; when the headers say nothing of it, the currencies the error's body
/// names; when nothing says, every currency a provider counts (never a spend budget: money is
/// counted here alone).
pub(super) fn spent(
    read: &[RateHeader],
    cost: Cost,
    configured: &crate::rate::Limits,
    body: Option<&[u8]>,
) -> Currencies {
    let counted: Vec<&RateHeader> = read
        .iter()
        .filter(|r| r.remaining.is_some() && !configured.of(r.currency).is_empty())
        .collect();
    let short: Currencies = counted
        .iter()
        .filter(|r| {
            r.remaining
                .is_some_and(|left| left < cost.of(r.currency).max(1))
        })
        .map(|r| r.currency)
        .collect();
    if !short.is_empty() {
        return short;
    }
    let every = PROVIDER_COUNTS
        .into_iter()
        .filter(|c| !configured.of(*c).is_empty())
        .all(|c| counted.iter().any(|r| r.currency == c));
    if every {
        // Every window's count says it can pay: the refusal is about something else (a
        // concurrency limit, a count taken a moment earlier). Pause, but empty nothing.
        return Currencies::NONE;
    }
    let (_, message, kind) = body.map(error_detail).unwrap_or_default();
    let message = message.unwrap_or_default().to_ascii_lowercase();
    let kind = kind.unwrap_or_default().to_ascii_lowercase();
    // OpenAI: `"type": "tokens"` and "... on tokens per min (TPM) ..."; Anthropic: "... your
    // rate limit of 50,000 input tokens per minute" (or output tokens, or requests).
    let output = message.contains("output tokens per");
    let tokens = message.contains("input tokens per")
        || ((kind == "tokens" || message.contains("tokens per min") || message.contains("(tpm)"))
            && !output);
    let requests =
        kind == "requests" || message.contains("requests per min") || message.contains("(rpm)");
    let named: Currencies = [
        (requests, Currency::Requests),
        (tokens, Currency::Tokens),
        (output, Currency::OutputTokens),
    ]
    .into_iter()
    .filter_map(|(said, currency)| said.then_some(currency))
    .collect();
    if named.is_empty() {
        PROVIDER_COUNTS.into_iter().collect()
    } else {
        named
    }
}

/// The `error.code` (else `error.type`), the `error.message`, and the `error.type` of an error
/// body.
pub(crate) fn error_detail(body: &[u8]) -> (Option<String>, Option<String>, Option<String>) {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return (None, None, None);
    };
    let Some(error) = value.get("error") else {
        return (None, None, None);
    };
    let text = |name: &str| error.get(name).and_then(Value::as_str).map(str::to_owned);
    let kind = text("type");
    let code = text("code").or_else(|| kind.clone());
    // A provider's message is shown to people: bounded, one line.
    let message = text("message").map(|m| {
        let line: String = m.chars().filter(|c| !c.is_control()).take(500).collect();
        line
    });
    (code, message, kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_come_from_code_or_type() {
        let code = |body: &[u8]| error_detail(body).0;
        assert_eq!(
            code(br#"{"error":{"code":"insufficient_quota","type":"insufficient_quota"}}"#)
                .as_deref(),
            Some("insufficient_quota")
        );
        assert_eq!(
            code(br#"{"type":"error","error":{"type":"rate_limit_error"}}"#).as_deref(),
            Some("rate_limit_error")
        );
        assert_eq!(code(b"<html>"), None);
        let (_, message, _) = error_detail(
            br#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota."}}"#,
        );
        assert_eq!(message.as_deref(), Some("You exceeded your current quota."));
    }
}
