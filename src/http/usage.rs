//! Reading usage from a response: a JSON body, or the events of a server-sent stream, fed in
//! pieces as they pass.

use serde_json::Value;

use super::profile::{OutputTo, Profile};
use crate::{Limits, Usage};

/// Token counts a response reported; a field the response did not carry is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Reported {
    /// `prompt_tokens` or `input_tokens`.
    pub input: Option<u64>,
    /// `completion_tokens` or `output_tokens`.
    pub output: Option<u64>,
    /// `cache_creation_input_tokens`.
    pub cache_write: Option<u64>,
    /// `cache_read_input_tokens`.
    pub cache_read: Option<u64>,
    /// `total_tokens`.
    pub total: Option<u64>,
}

impl Reported {
    /// What a whole JSON body (or a whole server-sent stream, when `stream`) reported.
    ///
    /// ```
    /// use tollgate::http::Reported;
    ///
    /// let reported = Reported::read(br#"{"usage":{"prompt_tokens":12,"completion_tokens":3}}"#, false);
    /// assert_eq!((reported.input, reported.output), (Some(12), Some(3)));
    /// ```
    pub fn read(body: &[u8], stream: bool) -> Reported {
        let mut scanner = UsageScanner::new(stream);
        scanner.feed(body);
        scanner.finish()
    }

    /// True when the response reported nothing.
    pub fn is_empty(&self) -> bool {
        *self == Reported::default()
    }

    /// Takes the fields of a `usage` object; a later report of a field replaces an earlier one
    /// (Anthropic's `message_delta` carries the final `output_tokens`).
    fn merge(&mut self, usage: &Value) {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        let pairs = [
            (
                &mut self.input,
                field("prompt_tokens").or(field("input_tokens")),
            ),
            (
                &mut self.output,
                field("completion_tokens").or(field("output_tokens")),
            ),
            (&mut self.cache_write, field("cache_creation_input_tokens")),
            (&mut self.cache_read, field("cache_read_input_tokens")),
            (&mut self.total, field("total_tokens")),
        ];
        for (slot, value) in pairs {
            if value.is_some() {
                *slot = value;
            }
        }
    }

    /// The usage objects of one JSON value: at its top, or in `message` (Anthropic's
    /// `message_start`) or `response` (the responses API's `response.completed`).
    fn take(&mut self, value: &Value) {
        for usage in [
            value.get("usage"),
            value.get("message").and_then(|m| m.get("usage")),
            value.get("response").and_then(|r| r.get("usage")),
        ]
        .into_iter()
        .flatten()
        {
            if usage.is_object() {
                self.merge(usage);
            }
        }
    }

    /// What the key's windows should have been charged, per currency, under `profile`: `None`
    /// where the response said nothing of it.
    pub fn usage(&self, profile: &Profile, limits: &Limits) -> Usage {
        let input = self.input.map(|input| {
            input
                .saturating_add(self.cache_write.unwrap_or(0))
                .saturating_add(if profile.cache_reads_count {
                    self.cache_read.unwrap_or(0)
                } else {
                    0
                })
        });
        let output_apart =
            profile.output == OutputTo::OutputTokens && !limits.output_tokens().is_empty();
        let tokens = if output_apart {
            input
        } else {
            match (input, self.output) {
                (Some(input), output) => Some(input.saturating_add(output.unwrap_or(0))),
                (None, _) => self.total,
            }
        };
        Usage {
            tokens,
            output_tokens: if output_apart { self.output } else { None },
        }
    }
}

/// The most of a plain body kept whole for reading its usage; past it, only the last
/// [`TAIL`] bytes are kept (usage comes last in every provider's answer).
const WHOLE: usize = 8 << 20;
const TAIL: usize = 64 << 10;
/// A stream's event line longer than this is skipped rather than held.
const LONGEST_LINE: usize = 4 << 20;

/// Reads usage from a response body as it passes, without holding a stream.
#[derive(Debug)]
pub struct UsageScanner {
    stream: bool,
    done: bool,
    kept: Vec<u8>,
    overflowed: bool,
    reported: Reported,
}

impl UsageScanner {
    /// A scanner for a server-sent event stream (`stream`) or a JSON body.
    pub fn new(stream: bool) -> UsageScanner {
        UsageScanner {
            stream,
            done: false,
            kept: Vec::new(),
            overflowed: false,
            reported: Reported::default(),
        }
    }

    /// Reads the next piece of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.stream {
            self.feed_events(bytes);
        } else {
            self.kept.extend_from_slice(bytes);
            if self.kept.len() > WHOLE {
                self.overflowed = true;
                let cut = self.kept.len() - TAIL;
                self.kept.drain(..cut);
            }
        }
    }

    fn feed_events(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            if self.overflowed {
                self.overflowed = false;
            } else {
                self.kept.extend_from_slice(&bytes[..end]);
                let line = std::mem::take(&mut self.kept);
                self.event_line(&line);
            }
            bytes = &bytes[end + 1..];
        }
        if self.overflowed {
            return;
        }
        self.kept.extend_from_slice(bytes);
        if self.kept.len() > LONGEST_LINE {
            self.kept = Vec::new();
            self.overflowed = true;
        }
    }

    fn event_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        if let Ok(value) = serde_json::from_slice::<Value>(data) {
            self.reported.take(&value);
            if matches!(
                value.get("type").and_then(Value::as_str),
                Some("message_stop" | "response.completed")
            ) {
                self.done = true;
            }
        }
    }

    /// True once a stream has sent its last event (`data: [DONE]`, Anthropic's
    /// `message_stop`, the responses API's `response.completed`): its usage is all in.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What the body reported so far.
    pub fn reported(&self) -> Reported {
        self.reported
    }

    /// What the whole body reported.
    pub fn finish(mut self) -> Reported {
        if self.stream {
            let line = std::mem::take(&mut self.kept);
            if !self.overflowed {
                self.event_line(&line);
            }
        } else if !self.overflowed {
            if let Ok(value) = serde_json::from_slice::<Value>(&self.kept) {
                self.reported.take(&value);
            }
        } else {
            // Only the tail is kept: read the last `"usage":` object in it.
            let needle = b"\"usage\"";
            if let Some(at) = self.kept.windows(needle.len()).rposition(|w| w == needle) {
                let after = &self.kept[at + needle.len()..];
                if let Some(open) = after.iter().position(|&b| b == b'{') {
                    let mut values =
                        serde_json::Deserializer::from_slice(&after[open..]).into_iter::<Value>();
                    if let Some(Ok(usage)) = values.next() {
                        self.reported.merge(&usage);
                    }
                }
            }
        }
        self.reported
    }
}

/// The `error.code` (else `error.type`, else a top-level `type`) of an error body.
pub(crate) fn error_code(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    error
        .get("code")
        .and_then(Value::as_str)
        .or_else(|| error.get("type").and_then(Value::as_str))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(stream: bool, pieces: &[&[u8]]) -> Reported {
        let mut scanner = UsageScanner::new(stream);
        for piece in pieces {
            scanner.feed(piece);
        }
        scanner.finish()
    }

    #[test]
    fn a_chat_body_reports_prompt_and_completion() {
        let body = br#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;
        let reported = scan(false, &[&body[..10], &body[10..]]);
        assert_eq!(
            (reported.input, reported.output, reported.total),
            (Some(12), Some(30), Some(42))
        );
    }

    #[test]
    fn an_openai_stream_reports_in_its_last_chunk_whatever_the_cuts() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"total_tokens\":13}}\n\n\
                      data: [DONE]\n\n";
        for cut in 0..stream.len() {
            let (a, b) = stream.as_bytes().split_at(cut);
            let reported = scan(true, &[a, b]);
            assert_eq!(
                (reported.input, reported.output),
                (Some(9), Some(4)),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn an_anthropic_stream_takes_output_from_the_last_delta() {
        let stream = b"event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":100,\"cache_creation_input_tokens\":5,\"output_tokens\":1}}}\r\n\r\n\
event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\r\n\r\n";
        let reported = scan(true, &[stream]);
        assert_eq!(reported.input, Some(25));
        assert_eq!(reported.output, Some(15));
        assert_eq!(reported.cache_read, Some(100));
        let limits = Limits::parse("", "10000/m")
            .unwrap()
            .with_output_tokens("4000/m".parse::<crate::Rates>().unwrap());
        let usage = reported.usage(&Profile::anthropic(), &limits);
        assert_eq!((usage.tokens, usage.output_tokens), (Some(30), Some(15)));
        let counted = reported.usage(&Profile::anthropic().cache_reads_count(true), &limits);
        assert_eq!(counted.tokens, Some(130));
        // Without output windows, Anthropic's output is not charged to the token windows.
        let no_output = Limits::parse("", "10000/m").unwrap();
        let usage = reported.usage(&Profile::anthropic(), &no_output);
        assert_eq!((usage.tokens, usage.output_tokens), (Some(45), None));
    }

    #[test]
    fn openai_usage_charges_input_and_output_to_the_tokens() {
        let reported = scan(
            false,
            &[br#"{"usage":{"prompt_tokens":100,"completion_tokens":20}}"#],
        );
        let limits = Limits::parse("", "10000/m").unwrap();
        let usage = reported.usage(&Profile::openai(), &limits);
        assert_eq!((usage.tokens, usage.output_tokens), (Some(120), None));
        let embeddings = scan(false, &[br#"{"usage":{"total_tokens":77}}"#]);
        assert_eq!(
            embeddings.usage(&Profile::voyage(), &limits).tokens,
            Some(77)
        );
    }

    #[test]
    fn a_huge_body_keeps_its_tail_and_still_reports() {
        let mut scanner = UsageScanner::new(false);
        scanner.feed(b"{\"data\":[");
        let chunk = vec![b'1'; 1 << 20];
        for _ in 0..10 {
            scanner.feed(&chunk);
        }
        scanner.feed(br#"],"usage":{"prompt_tokens":5,"total_tokens":5}}"#);
        assert!(scanner.kept.len() <= WHOLE + (1 << 20));
        assert_eq!(scanner.finish().total, Some(5));
    }

    #[test]
    fn garbage_reports_nothing_and_an_endless_line_is_not_held() {
        assert!(scan(false, &[b"not json"]).is_empty());
        assert!(scan(true, &[b"data: {broken\n\n", b"data: [DONE]\n"]).is_empty());
        let mut scanner = UsageScanner::new(true);
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..8 {
            scanner.feed(&chunk);
        }
        assert!(scanner.kept.len() <= LONGEST_LINE);
        scanner.feed(b"\ndata: {\"usage\":{\"total_tokens\":3}}\n");
        assert_eq!(scanner.finish().total, Some(3));
    }

    #[test]
    fn error_codes_come_from_code_or_type() {
        assert_eq!(
            error_code(br#"{"error":{"code":"insufficient_quota","type":"insufficient_quota"}}"#)
                .as_deref(),
            Some("insufficient_quota")
        );
        assert_eq!(
            error_code(br#"{"type":"error","error":{"type":"rate_limit_error"}}"#).as_deref(),
            Some("rate_limit_error")
        );
        assert_eq!(error_code(b"<html>"), None);
    }
}
