//! Reading usage from a response: a JSON body, or the events of a server-sent stream, fed in
//! pieces as they pass.

use std::sync::Arc;

use serde_json::Value;
use tollgate_estimators::Estimator;

use super::profile::{OutputTo, Profile};
use crate::cost::Usage;
use crate::rate::Limits;

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
    /// `prompt_tokens_details.cached_tokens` or `input_tokens_details.cached_tokens`: the part
    /// of `input` read from OpenAI's prompt cache (billed at the cached price).
    pub cached: Option<u64>,
    /// `total_tokens`.
    pub total: Option<u64>,
    /// The output tokens counted from the text the response generated (its content, tool-call
    /// arguments, reasoning, refusals, transcripts), when a scanner was given an estimator:
    /// what settles a response that reported no output count.
    pub generated: Option<u64>,
    /// The calls of server-side tools the answer reports: Anthropic's
    /// `usage.server_tool_use.web_search_requests`, the responses API's `web_search_call`,
    /// `file_search_call` and `code_interpreter_call` output items. What their fees settle at.
    pub tool_calls: Option<u64>,
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

    /// Takes the fields of a `usage` object. A field reported twice keeps the larger count
    /// (Anthropic's `message_delta` carries the final, cumulative `output_tokens`; an answer
    /// that reports a count and then a smaller one is read at the larger). `with_output`:
    /// false for Anthropic's `message_start`, whose `output_tokens` is a placeholder.
    fn merge(&mut self, usage: &Value, with_output: bool) {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        let cached = ["prompt_tokens_details", "input_tokens_details"]
            .iter()
            .find_map(|details| usage.get(*details)?.get("cached_tokens")?.as_u64());
        let pairs = [
            (
                &mut self.input,
                field("prompt_tokens").or(field("input_tokens")),
            ),
            (
                &mut self.output,
                if with_output {
                    field("completion_tokens").or(field("output_tokens"))
                } else {
                    None
                },
            ),
            (&mut self.cache_write, field("cache_creation_input_tokens")),
            (&mut self.cache_read, field("cache_read_input_tokens")),
            (&mut self.cached, cached),
            (&mut self.total, field("total_tokens")),
            (
                &mut self.tool_calls,
                usage
                    .get("server_tool_use")
                    .and_then(|s| s.get("web_search_requests"))
                    .and_then(Value::as_u64),
            ),
        ];
        for (slot, value) in pairs {
            if let Some(value) = value {
                *slot = Some(slot.map_or(value, |kept| kept.max(value)));
            }
        }
    }

    /// The usage objects of one JSON value: at its top, or in `message` (Anthropic's
    /// `message_start`) or `response` (the responses API's `response.completed`).
    fn take(&mut self, value: &Value) {
        // The responses API lists each server-side tool call among its output items.
        let output = value
            .get("output")
            .or_else(|| value.get("response").and_then(|r| r.get("output")))
            .and_then(Value::as_array);
        if let Some(items) = output {
            let calls = items
                .iter()
                .filter(|item| {
                    matches!(
                        item.get("type").and_then(Value::as_str),
                        Some("web_search_call" | "file_search_call" | "code_interpreter_call")
                    )
                })
                .count() as u64;
            self.tool_calls = Some(self.tool_calls.map_or(calls, |kept| kept.max(calls)));
        }
        for usage in [
            value.get("usage"),
            value.get("message").and_then(|m| m.get("usage")),
            value.get("response").and_then(|r| r.get("usage")),
        ]
        .into_iter()
        .flatten()
        {
            if usage.is_object() {
                let placeholder =
                    value.get("type").and_then(Value::as_str) == Some("message_start");
                self.merge(usage, !placeholder);
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
        let output_metered_apart = profile.output == OutputTo::OutputTokens;
        let output_apart = output_metered_apart && !limits.output_tokens().is_empty();
        let tokens = if output_metered_apart {
            // The provider meters output apart: the token windows hold input alone, whether
            // or not this key limits output (without output windows, no window was charged
            // for it up front, and none is settled with it).
            input
        } else {
            match (input, self.output) {
                (Some(input), output) => Some(input.saturating_add(output.unwrap_or(0))),
                (None, _) => self.total,
            }
        };
        let usage = Usage::tokens_only(tokens);
        if output_apart {
            match self.output {
                Some(output) => usage.with_output_tokens(output),
                None => usage,
            }
        } else {
            usage
        }
    }
}

/// The most of a plain body kept whole for reading its usage; past it, only the last
/// [`TAIL`] bytes are kept (usage comes last in every provider's answer).
const WHOLE: usize = 8 << 20;
const TAIL: usize = 64 << 10;
/// A stream's event line (or event) longer than this is skipped rather than held.
const LONGEST_LINE: usize = 4 << 20;

/// Reads usage from a response body as it passes, without holding a stream.
///
/// A stream is read as server-sent events are defined: lines end with CR LF, LF or a lone CR,
/// a byte-order mark before the first line is dropped, an event's `data:` lines are joined
/// with line feeds and read when a blank line ends the event.
#[derive(Debug)]
pub(crate) struct UsageScanner {
    stream: bool,
    done: bool,
    kept: Vec<u8>,
    overflowed: bool,
    reported: Reported,
    /// Stream state: the data of the event being read, whether the last byte fed was a CR,
    /// whether the first bytes (and a byte-order mark among them) have been seen.
    data: Vec<u8>,
    data_overflowed: bool,
    after_cr: bool,
    started: bool,
    /// The stream reported its input before its output (Anthropic's `message_start`).
    input_early: bool,
    /// Counts the text the response generates, when given.
    estimator: Option<Arc<dyn Estimator>>,
    /// Generated text not counted yet, what was counted, and whether any was seen.
    generated_text: String,
    generated_tokens: u64,
    generated_seen: bool,
    /// Bytes of lines or events too long to read, and bytes fed in all.
    skipped: u64,
    fed: u64,
}

/// Generated text is counted in pieces of about this many bytes (a piece boundary can split a
/// token in two, and so errs high by at most one token a piece).
const COUNT_EVERY: usize = 64 << 10;

/// Fields of a response that are not text the model generated: tags, ids, reasons, indexes,
/// a reasoning block's signature, audio's base64 data.
const NOT_GENERATED: [&str; 22] = [
    "role",
    "type",
    "id",
    "index",
    "finish_reason",
    "stop_reason",
    "stop_sequence",
    "signature",
    "call_id",
    "status",
    "encrypted_content",
    "logprobs",
    "model",
    "object",
    "item_id",
    "annotations",
    "system_fingerprint",
    "usage",
    "obfuscation",
    "data",
    "expires_at",
    "service_tier",
];

/// Every string of `value` that the model wrote, into `out`.
fn generated_strings(value: &Value, out: &mut dyn FnMut(&str)) {
    match value {
        Value::String(text) => out(text),
        Value::Array(items) => items.iter().for_each(|v| generated_strings(v, out)),
        Value::Object(map) => {
            for (key, value) in map {
                if !NOT_GENERATED.contains(&key.as_str()) {
                    generated_strings(value, out);
                }
            }
        }
        _ => {}
    }
}

/// The generated text of one event of a stream, or of a whole JSON answer: OpenAI's choices
/// (`delta` or `message`: content, tool calls and their arguments, reasoning, refusals, audio
/// transcripts; `text` of completions), Anthropic's content blocks and their deltas (text,
/// tool input as JSON, thinking), the responses API's `*.delta` events and its `output`.
fn generated_of(value: &Value, out: &mut dyn FnMut(&str)) -> bool {
    if let Some(choices) = value.get("choices").and_then(Value::as_array) {
        for choice in choices {
            for field in ["delta", "message"] {
                if let Some(part) = choice.get(field) {
                    generated_strings(part, out);
                }
            }
            if let Some(text) = choice.get("text").and_then(Value::as_str) {
                out(text);
            }
        }
        return true;
    }
    let kind = value.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "content_block_delta" | "content_block_start" => {
            for field in ["delta", "content_block"] {
                if let Some(part) = value.get(field) {
                    generated_strings(part, out);
                }
            }
            true
        }
        // An Anthropic answer, whole.
        "message" => {
            if let Some(content) = value.get("content") {
                generated_strings(content, out);
            }
            true
        }
        kind if kind.ends_with(".delta") => {
            if let Some(text) = value.get("delta").and_then(Value::as_str) {
                out(text);
            }
            true
        }
        _ => {
            // The responses API's answer, whole (not its events, whose `response` repeats
            // what the deltas said).
            if value.get("object").and_then(Value::as_str) == Some("response")
                && let Some(output) = value.get("output")
            {
                generated_strings(output, out);
                return true;
            }
            false
        }
    }
}

impl UsageScanner {
    /// A scanner for a server-sent event stream (`stream`) or a JSON body.
    pub(crate) fn new(stream: bool) -> UsageScanner {
        UsageScanner {
            stream,
            done: false,
            kept: Vec::new(),
            overflowed: false,
            reported: Reported::default(),
            data: Vec::new(),
            data_overflowed: false,
            after_cr: false,
            started: false,
            input_early: false,
            estimator: None,
            generated_text: String::new(),
            generated_tokens: 0,
            generated_seen: false,
            skipped: 0,
            fed: 0,
        }
    }

    /// A scanner that also counts, with `estimator`, the text the response generates, for a
    /// response that reports no output count ([`Reported::generated`]).
    pub(crate) fn counting(stream: bool, estimator: Arc<dyn Estimator>) -> UsageScanner {
        UsageScanner {
            estimator: Some(estimator),
            ..UsageScanner::new(stream)
        }
    }

    /// Takes the generated text of `value` (an event, or a whole answer).
    fn take_generated(&mut self, value: &Value) {
        let Some(estimator) = self.estimator.clone() else {
            return;
        };
        let mut text = std::mem::take(&mut self.generated_text);
        let seen = generated_of(value, &mut |piece| text.push_str(piece));
        self.generated_seen |= seen;
        if text.len() >= COUNT_EVERY {
            self.generated_tokens = self
                .generated_tokens
                .saturating_add(estimator.count(&text) as u64);
            text.clear();
        }
        self.generated_text = text;
    }

    /// The generated text counted so far, the rest counted now.
    fn generated_total(&mut self) -> Option<u64> {
        if !self.generated_seen {
            return None;
        }
        if let Some(estimator) = &self.estimator
            && !self.generated_text.is_empty()
        {
            self.generated_tokens = self
                .generated_tokens
                .saturating_add(estimator.count(&self.generated_text) as u64);
            self.generated_text.clear();
        }
        Some(self.generated_tokens)
    }

    /// Reads the next piece of the body.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        self.fed = self.fed.saturating_add(bytes.len() as u64);
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
        if !self.started && !bytes.is_empty() {
            // A byte-order mark may open the stream, and may come in pieces.
            let bom = b"\xEF\xBB\xBF";
            let have = self.kept.len() + bytes.len();
            if have < bom.len() && bom.starts_with(&[self.kept.as_slice(), bytes].concat()) {
                self.kept.extend_from_slice(bytes);
                return;
            }
            self.started = true;
            let mut joined = std::mem::take(&mut self.kept);
            joined.extend_from_slice(bytes);
            let rest = joined.strip_prefix(bom).unwrap_or(&joined).to_vec();
            return self.feed_events(&rest);
        }
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') else {
                break;
            };
            self.after_cr = bytes[end] == b'\r';
            if self.overflowed {
                self.overflowed = false;
                self.skipped = self.skipped.saturating_add(end as u64);
            } else {
                self.kept.extend_from_slice(&bytes[..end]);
                let line = std::mem::take(&mut self.kept);
                self.event_line(&line);
            }
            bytes = &bytes[end + 1..];
        }
        if self.overflowed {
            self.skipped = self.skipped.saturating_add(bytes.len() as u64);
            return;
        }
        self.kept.extend_from_slice(bytes);
        if self.kept.len() > LONGEST_LINE {
            self.skipped = self.skipped.saturating_add(self.kept.len() as u64);
            self.kept = Vec::new();
            self.overflowed = true;
        }
    }

    /// Lines or events too long to hold were skipped: what they carried is counted at the most
    /// it could be, a token a byte.
    fn count_skipped(&mut self) {
        if self.estimator.is_some() {
            self.generated_seen = true;
            self.generated_tokens = self.generated_tokens.saturating_add(self.skipped);
        }
        self.skipped = 0;
    }

    fn event_line(&mut self, line: &[u8]) {
        if line.is_empty() {
            self.dispatch();
            return;
        }
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if self.data_overflowed {
            self.skipped = self.skipped.saturating_add(data.len() as u64);
            return;
        }
        if !self.data.is_empty() {
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(data);
        if self.data.len() > LONGEST_LINE {
            self.skipped = self.skipped.saturating_add(self.data.len() as u64);
            self.data = Vec::new();
            self.data_overflowed = true;
        }
    }

    /// The event just ended: read its data.
    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.data_overflowed = false;
        let data = data.trim_ascii();
        if data.is_empty() {
            return;
        }
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        if self.skipped > 0 {
            self.count_skipped();
        }
        // An event a Python client reads (NaN, a lone surrogate) is read too.
        let value = serde_json::from_slice::<Value>(data).ok().or_else(|| {
            std::str::from_utf8(data)
                .ok()
                .and_then(|text| super::json::parse(text).ok())
                .map(|parsed| parsed.value)
        });
        if let Some(value) = value {
            self.reported.take(&value);
            self.take_generated(&value);
            match value.get("type").and_then(Value::as_str) {
                Some("message_stop" | "response.completed") => self.done = true,
                Some("message_start") if self.reported.input.is_some() => {
                    self.input_early = true;
                }
                _ => {}
            }
        }
    }

    /// True once a stream has sent its last event (`data: [DONE]`, Anthropic's
    /// `message_stop`, the responses API's `response.completed`): its usage is all in.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Once, when a stream has reported its input before its output (Anthropic's
    /// `message_start`): what it reported then, for the input to be settled while the output
    /// is still being written.
    pub(crate) fn take_input(&mut self) -> Option<Reported> {
        std::mem::take(&mut self.input_early).then_some(self.reported)
    }

    /// What the whole body reported (for a plain body, what the bytes read so far report, if
    /// they are the whole JSON document).
    pub(crate) fn finish(mut self) -> Reported {
        if self.stream {
            let line = std::mem::take(&mut self.kept);
            if !self.overflowed && !line.is_empty() {
                self.event_line(&line);
            }
            self.dispatch();
        } else if !self.overflowed {
            if let Ok(value) = serde_json::from_slice::<Value>(&self.kept) {
                self.reported.take(&value);
                self.take_generated(&value);
            }
        } else {
            // Only the tail is kept: the last `"usage": {...}` member in it. Without one, what
            // the body generated is counted at the most it could be, a token a byte.
            match last_usage_object(&self.kept) {
                Some(usage) => self.reported.merge(&usage, true),
                None => self.skipped = self.skipped.saturating_add(self.fed),
            }
        }
        if self.skipped > 0 {
            self.count_skipped();
        }
        self.reported.generated = self.generated_total();
        self.reported
    }
}

/// The last `"usage": { ... }` member in `tail`: the key, a colon and an object right after it
/// (not just any object that follows the word somewhere).
fn last_usage_object(tail: &[u8]) -> Option<Value> {
    let needle = b"\"usage\"";
    let mut end = tail.len();
    while let Some(at) = tail[..end].windows(needle.len()).rposition(|w| w == needle) {
        end = at;
        let after = tail[at + needle.len()..].trim_ascii_start();
        let Some(after) = after.strip_prefix(b":") else {
            continue;
        };
        let after = after.trim_ascii_start();
        if after.first() != Some(&b'{') {
            continue;
        }
        let mut values = serde_json::Deserializer::from_slice(after).into_iter::<Value>();
        if let Some(Ok(usage)) = values.next()
            && usage.is_object()
        {
            return Some(usage);
        }
    }
    None
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
            .with_output_tokens("4000/m".parse::<crate::rate::Rates>().unwrap());
        let usage = reported.usage(&Profile::anthropic(), &limits);
        assert_eq!((usage.tokens, usage.output_tokens), (Some(30), Some(15)));
        let counted = reported.usage(&Profile::anthropic().cache_reads_count(true), &limits);
        assert_eq!(counted.tokens, Some(130));
        // Without output windows, Anthropic's output is settled nowhere: its input-token
        // windows hold input alone, as they were charged up front.
        let no_output = Limits::parse("", "10000/m").unwrap();
        let usage = reported.usage(&Profile::anthropic(), &no_output);
        assert_eq!((usage.tokens, usage.output_tokens), (Some(30), None));
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

    fn counting(stream: bool, pieces: &[&[u8]]) -> Reported {
        let estimator = tollgate_estimators::estimator("words").unwrap();
        let mut scanner = UsageScanner::counting(stream, estimator);
        for piece in pieces {
            scanner.feed(piece);
        }
        scanner.finish()
    }

    #[test]
    fn what_a_python_client_reads_is_read_and_what_cant_be_read_counts_a_token_a_byte() {
        // An event with NaN: Python's SDK reads it, and so is its text counted.
        let nan = counting(
            true,
            &[b"data: {\"choices\":[{\"delta\":{\"content\":\"one two three\"}}],\"x\":NaN}\n\n"],
        );
        assert_eq!(nan.generated, Some(3));
        // An event too long to hold: its bytes, at a token a byte.
        let huge = vec![b'x'; LONGEST_LINE + 10];
        let skipped = counting(true, &[b"data: ", &huge, b"\n\n"]);
        assert!(
            skipped.generated.unwrap() >= LONGEST_LINE as u64,
            "{skipped:?}"
        );
        // A plain body past what is held, without usage: a token a byte.
        let chunk = vec![b'w'; 1 << 20];
        let mut pieces: Vec<&[u8]> = vec![b"{\"choices\":[{\"message\":{\"content\":\""];
        for _ in 0..9 {
            pieces.push(&chunk);
        }
        pieces.push(b"\"}}]}");
        let long = counting(false, &pieces);
        assert!(long.generated.unwrap() >= 9 << 20, "{long:?}");
    }

    #[test]
    fn a_count_reported_twice_keeps_the_larger_and_anthropics_placeholder_is_not_final() {
        let twice = scan(
            true,
            &[b"data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1000}}\n\ndata: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n"],
        );
        assert_eq!(twice.output, Some(1000));
        let start_only = scan(
            true,
            &[b"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n"],
        );
        assert_eq!((start_only.input, start_only.output), (Some(9), None));
    }
}
