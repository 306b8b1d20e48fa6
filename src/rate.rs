//! Rates and limits: the grammar of `"100000/m"`, `"5/s burst 10"` and `"60/m; 1000/d"`.
//!
//! A [`Rate`] is a capacity (the burst) refilled at `amount` per `period`. [`Rates`] are the
//! windows of one currency (a call must fit every one of them), and [`Limits`] pair the request
//! windows with the token windows of one key.
//!
//! Every way in goes through one parser, the `tollgate-grammar` crate's: [`str::parse`],
//! [`Rate::from_str`](std::str::FromStr::from_str), serde (a rate is serialized as its
//! canonical string) and the `#[tollgate::limit]` macro, which runs the same parser when the
//! code compiles.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use tollgate_grammar::{Rate, RateError, RateErrorKind, Rates};

use crate::error::Error;

/// The two currencies a call pays in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Currency {
    /// One per call.
    Requests,
    /// The estimated text tokens of the call.
    Tokens,
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Currency::Requests => "requests",
            Currency::Tokens => "tokens",
        })
    }
}

/// The limits of one key: request windows (each call costs 1) and token windows (each call
/// costs its estimate).
///
/// ```
/// use tollgate::Limits;
///
/// let limits = Limits::parse("500/m", "200000/m; 2000000/d")?;
/// assert_eq!(limits.tokens().len(), 2);
/// assert_eq!(limits.to_string(), "requests 500/m, tokens 200000/m; 2000000/d");
/// # Ok::<(), tollgate::Error>(())
/// ```
///
/// With serde, limits are a map of rate strings; a currency without windows is left out, and an
/// unknown field is an error rather than a limit silently dropped:
///
/// ```
/// use tollgate::Limits;
///
/// let limits: Limits = serde_json::from_str(r#"{"requests": "5/s"}"#)?;
/// assert_eq!(serde_json::to_string(&limits)?, r#"{"requests":"5/s"}"#);
/// let typo = serde_json::from_str::<Limits>(r#"{"request": "5/s", "tokns": "100/m"}"#);
/// assert!(typo.unwrap_err().to_string().contains("unknown field `request`"));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Rates::is_empty")]
    requests: Rates,
    #[serde(default, skip_serializing_if = "Rates::is_empty")]
    tokens: Rates,
}

impl Limits {
    /// Limits from request windows and token windows.
    pub fn new(requests: impl Into<Rates>, tokens: impl Into<Rates>) -> Limits {
        Limits {
            requests: requests.into(),
            tokens: tokens.into(),
        }
    }

    /// Limits from two rate strings; an empty string leaves that currency unlimited.
    ///
    /// A string that does not parse is [`Error::Rate`], naming the window that is wrong.
    pub fn parse(requests: &str, tokens: &str) -> Result<Limits, Error> {
        Ok(Limits::new(
            Rates::parse_or_none(requests)?,
            Rates::parse_or_none(tokens)?,
        ))
    }

    /// Only request windows.
    pub fn requests_only(requests: impl Into<Rates>) -> Limits {
        Limits::new(requests, Rates::none())
    }

    /// Only token windows.
    pub fn tokens_only(tokens: impl Into<Rates>) -> Limits {
        Limits::new(Rates::none(), tokens)
    }

    /// The request windows.
    pub fn requests(&self) -> &Rates {
        &self.requests
    }

    /// The token windows.
    pub fn tokens(&self) -> &Rates {
        &self.tokens
    }

    /// The windows of one currency.
    pub fn of(&self, currency: Currency) -> &Rates {
        match currency {
            Currency::Requests => &self.requests,
            Currency::Tokens => &self.tokens,
        }
    }

    /// True when neither currency has a window.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.tokens.is_empty()
    }

    /// How long the longest window takes to refill from empty: after this much silence every
    /// bucket of the key is full again.
    pub fn time_to_fill(&self) -> Duration {
        self.requests
            .as_slice()
            .iter()
            .chain(self.tokens.as_slice())
            .map(Rate::time_to_fill)
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.requests.is_empty(), self.tokens.is_empty()) {
            (true, true) => f.write_str("no limits"),
            (false, true) => write!(f, "requests {}", self.requests),
            (true, false) => write!(f, "tokens {}", self.tokens),
            (false, false) => write!(f, "requests {}, tokens {}", self.requests, self.tokens),
        }
    }
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Limits({self})")
    }
}
