//! Answers the proxy writes itself, in the shape the upstream's own clients read: OpenAI's
//! `{"error": {...}}` or Anthropic's `{"type": "error", "error": {...}}`, with `retry-after`
//! on a 429 so that the SDKs wait and retry as they would for the provider. Every phase of a
//! request that refuses it answers a [`Reject`]; [`Reject::answer`] is where one becomes a
//! response.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use metrics::Counter;
use serde_json::json;

use tollgate::Currency;

use crate::config::Family;
use crate::relay::Relay;

/// What went wrong, in the words each provider uses for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// The call's wait for its toll would pass its deadline (429, worth retrying later), for
    /// want of this currency (`None`: every window could pay; a pause or the line held it).
    /// The answer names it as the provider would, since clients (a tollgate gate among them)
    /// read it to tell which window is spent.
    RateLimited(Option<Currency>),
    /// The request body is larger than the proxy takes (413).
    TooLarge,
    /// The request can't be read or can never pass (400).
    Invalid,
    /// The credentials can't be used: no key, an unknown or malformed one, no tenant (401).
    Unauthorized,
    /// No route (404).
    NotFound,
    /// A stored object another tenant owns, or none does (404, as the provider answers an id
    /// it doesn't know).
    NoSuchObject,
    /// Listing the organisation's stored objects, which are every tenant's (403).
    Forbidden,
    /// The request's body came too slowly, or not at all (408).
    SlowBody,
    /// A `content-encoding` the proxy can't read (415).
    UnsupportedEncoding,
    /// The upstream could not be reached (502).
    Upstream,
    /// The store is down, the proxy is draining, or its memory for bodies is full (503).
    Unavailable,
    /// The upstream said nothing by the call's deadline (504).
    UpstreamTimeout,
    /// A budget the call spends from is spent: answered as the provider answers a spent quota
    /// (OpenAI: 429 `insufficient_quota`, which the SDKs don't retry; Anthropic: 400, as for a
    /// credit balance too low).
    BudgetSpent,
}

impl ErrorKind {
    /// The status it is answered with, for `family`.
    pub(crate) fn status_for(self, family: Family) -> StatusCode {
        match (self, family) {
            (ErrorKind::BudgetSpent, Family::Anthropic) => StatusCode::BAD_REQUEST,
            (kind, _) => kind.status(),
        }
    }

    /// The status it is answered with.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            ErrorKind::BudgetSpent => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Invalid => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound | ErrorKind::NoSuchObject => StatusCode::NOT_FOUND,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::SlowBody => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::UnsupportedEncoding => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn openai_type(self) -> (&'static str, &'static str) {
        match self {
            ErrorKind::RateLimited(Some(Currency::Requests)) => ("requests", "rate_limit_exceeded"),
            ErrorKind::RateLimited(Some(Currency::Tokens | Currency::OutputTokens)) => {
                ("tokens", "rate_limit_exceeded")
            }
            ErrorKind::RateLimited(None | Some(Currency::Spend)) => {
                ("rate_limit_exceeded", "rate_limit_exceeded")
            }
            ErrorKind::TooLarge => ("invalid_request_error", "request_too_large"),
            ErrorKind::Invalid => ("invalid_request_error", "invalid_request"),
            ErrorKind::Unauthorized => ("invalid_request_error", "invalid_api_key"),
            ErrorKind::NotFound => ("invalid_request_error", "unknown_url"),
            ErrorKind::NoSuchObject => ("invalid_request_error", "not_found"),
            ErrorKind::Forbidden => ("invalid_request_error", "permission_denied"),
            ErrorKind::SlowBody => ("invalid_request_error", "request_timeout"),
            ErrorKind::UnsupportedEncoding => ("invalid_request_error", "unsupported_encoding"),
            ErrorKind::Upstream => ("server_error", "upstream_unreachable"),
            ErrorKind::Unavailable => ("server_error", "service_unavailable"),
            ErrorKind::UpstreamTimeout => ("server_error", "upstream_timeout"),
            ErrorKind::BudgetSpent => ("insufficient_quota", "insufficient_quota"),
        }
    }

    fn anthropic_type(self) -> &'static str {
        match self {
            ErrorKind::RateLimited(_) => "rate_limit_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::Invalid
            | ErrorKind::SlowBody
            | ErrorKind::UnsupportedEncoding
            | ErrorKind::BudgetSpent => "invalid_request_error",
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::NotFound | ErrorKind::NoSuchObject => "not_found_error",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::Upstream | ErrorKind::UpstreamTimeout => "api_error",
            ErrorKind::Unavailable => "overloaded_error",
        }
    }
}

/// Why the proxy answers a request itself: what went wrong, what the client is told, when it
/// may try again, and the counter that counts such answers.
#[derive(Debug)]
pub(crate) struct Reject {
    pub(crate) kind: ErrorKind,
    pub(crate) message: String,
    pub(crate) retry_after: Option<Duration>,
    /// Counted once, when the rejection is answered.
    pub(crate) counter: Option<Counter>,
    /// The shape to answer in, where the phase that refused knew it before an upstream was
    /// chosen (a path with no route).
    pub(crate) shape: Option<Family>,
}

impl Reject {
    /// A rejection with no retry-after and nothing counted.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Reject {
        Reject {
            kind,
            message: message.into(),
            retry_after: None,
            counter: None,
            shape: None,
        }
    }

    /// The same, answered in `family`'s shape whatever the upstream's.
    pub(crate) fn shaped(mut self, family: Family) -> Reject {
        self.shape = Some(family);
        self
    }

    /// The same, telling the client when it may try again.
    pub(crate) fn retry_after(mut self, wait: Duration) -> Reject {
        self.retry_after = Some(wait);
        self
    }

    /// The same, counted in `counter` when answered.
    pub(crate) fn counted(mut self, counter: &Counter) -> Reject {
        self.counter = Some(counter.clone());
        self
    }

    /// The answer in `family`'s shape (or its own): the one place a rejection becomes a
    /// response.
    pub(crate) fn answer(self, family: Family) -> Response<Relay> {
        if let Some(counter) = &self.counter {
            counter.increment(1);
        }
        let family = self.shape.unwrap_or(family);
        answer(family, self.kind, &self.message, self.retry_after)
    }
}

/// How `family`'s own 429s name the window of `currency` (OpenAI: "... on tokens per min
/// (TPM)"; Anthropic: "... of 50,000 input tokens per minute"), for the proxy's message.
pub(crate) fn window_words(family: Family, currency: Currency) -> &'static str {
    match (family, currency) {
        (Family::Anthropic, Currency::Requests) => "requests per minute",
        (Family::Anthropic, Currency::Tokens) => "input tokens per minute",
        (Family::Anthropic, Currency::OutputTokens) => "output tokens per minute",
        (_, Currency::Requests) => "requests per min (RPM)",
        (_, Currency::Tokens) => "tokens per min (TPM)",
        (_, Currency::OutputTokens) => "output tokens per min",
        (_, Currency::Spend) => "spend",
    }
}

/// The body of an error in `family`'s shape.
pub(crate) fn body(family: Family, kind: ErrorKind, message: &str) -> Bytes {
    let value = match family {
        Family::Anthropic => json!({
            "type": "error",
            "error": {"type": kind.anthropic_type(), "message": message},
        }),
        Family::OpenAi | Family::Azure | Family::Voyage => {
            let (kind, code) = kind.openai_type();
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
    };
    Bytes::from(value.to_string())
}

/// A whole error answer. A 429 carries `retry-after` (whole seconds, at least 1) and
/// `retry-after-ms`, and `x-should-retry: true`, which the OpenAI and Anthropic SDKs read;
/// `x-tollgate: local` says the proxy wrote it, not the provider.
fn answer(
    family: Family,
    kind: ErrorKind,
    message: &str,
    retry_after: Option<Duration>,
) -> Response<Relay> {
    let mut response = Response::new(Relay::full(body(family, kind, message)));
    *response.status_mut() = kind.status_for(family);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert("x-tollgate", HeaderValue::from_static("local"));
    if let ErrorKind::RateLimited(_) = kind {
        let wait = retry_after.unwrap_or(Duration::from_secs(1));
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        headers.insert(
            "retry-after-ms",
            HeaderValue::from(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1)),
        );
        headers.insert("x-should-retry", HeaderValue::from_static("true"));
    }
    if kind == ErrorKind::BudgetSpent {
        // No SDK retry can help before the budget refills; the message says when it does.
        headers.insert("x-should-retry", HeaderValue::from_static("false"));
        if let Some(wait) = retry_after {
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        }
    }
    response
}

/// Text a client chose, fit for a log line: at most 64 characters, control characters
/// escaped (a model name with a newline can't forge a line).
pub(crate) fn printable(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().take(64) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_429_tells_when_in_both_headers_rounded_up() {
        let response = answer(
            Family::OpenAi,
            ErrorKind::RateLimited(None),
            "wait",
            Some(Duration::from_millis(2_300)),
        );
        assert_eq!(response.status(), 429);
        let h = response.headers();
        assert_eq!(h["retry-after"], "3");
        assert_eq!(h["retry-after-ms"], "2300");
        assert_eq!(h["x-should-retry"], "true");
        assert_eq!(h["x-tollgate"], "local");
        let tiny = answer(
            Family::Anthropic,
            ErrorKind::RateLimited(None),
            "wait",
            Some(Duration::from_micros(10)),
        );
        assert_eq!(tiny.headers()["retry-after"], "1");
        assert_eq!(tiny.headers()["retry-after-ms"], "1");
    }

    #[test]
    fn each_provider_reads_its_own_shape() {
        let openai: serde_json::Value =
            serde_json::from_slice(&body(Family::OpenAi, ErrorKind::RateLimited(None), "wait"))
                .unwrap();
        assert_eq!(openai["error"]["code"], "rate_limit_exceeded");
        let anthropic: serde_json::Value = serde_json::from_slice(&body(
            Family::Anthropic,
            ErrorKind::RateLimited(None),
            "wait",
        ))
        .unwrap();
        assert_eq!(anthropic["error"]["type"], "rate_limit_error");
        assert_eq!(ErrorKind::SlowBody.status(), 408);
        assert_eq!(ErrorKind::UnsupportedEncoding.status(), 415);
        assert_eq!(ErrorKind::UpstreamTimeout.status(), 504);
    }

    #[test]
    fn errors_other_than_429_carry_no_retry_after() {
        let response = answer(Family::Anthropic, ErrorKind::TooLarge, "too big", None);
        assert_eq!(response.status(), 413);
        assert!(!response.headers().contains_key("retry-after"));
        let value: serde_json::Value =
            serde_json::from_slice(&body(Family::Anthropic, ErrorKind::TooLarge, "too big"))
                .unwrap();
        assert_eq!(
            value,
            json!({"type": "error", "error": {"type": "request_too_large", "message": "too big"}})
        );
    }
}
