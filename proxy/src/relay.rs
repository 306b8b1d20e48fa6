//! The body the client reads: the upstream's bytes handed on as they come, read for usage on
//! the way, and the call settled when the usage has passed, when the body ends, or from what
//! was seen when the client goes away.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use serde_json::Value;
use tollgate::http::{Call, Reported, UsageScanner};
use tollgate::{Estimator, Permit};

use crate::proxy::Upstreamed;

/// The most of a stream's text kept to count what the client saw, if it goes away early.
const SEEN_MOST: usize = 1 << 20;

/// A response body: one the proxy wrote, or the upstream's, metered or not.
pub struct Relay {
    inner: Inner,
    meter: Option<Box<Meter>>,
}

enum Inner {
    Full(Option<Bytes>),
    Upstream(Incoming),
}

/// What settles a metered call.
pub(crate) struct Meter {
    pub(crate) call: Call,
    pub(crate) tenant: Option<Permit>,
    pub(crate) scanner: UsageScanner,
    pub(crate) upstream: Arc<Upstreamed>,
    /// A stream's request body, to estimate its input if the client leaves before the usage.
    pub(crate) request: Option<Bytes>,
    /// The text of a stream's events so far, and the unfinished line.
    pub(crate) seen: Option<Seen>,
}

impl Relay {
    /// A body the proxy wrote.
    pub fn full(bytes: Bytes) -> Relay {
        Relay {
            inner: Inner::Full(Some(bytes)),
            meter: None,
        }
    }

    /// The upstream's body, handed on unmetered.
    pub fn plain(body: Incoming) -> Relay {
        Relay {
            inner: Inner::Upstream(body),
            meter: None,
        }
    }

    /// The upstream's body, read for usage as it passes.
    pub(crate) fn metered(body: Incoming, meter: Meter) -> Relay {
        Relay {
            inner: Inner::Upstream(body),
            meter: Some(Box::new(meter)),
        }
    }

    /// Settles now with what the body reported (in a task of its own: the bytes don't wait).
    fn settle(&mut self) {
        if let Some(meter) = self.meter.take() {
            conclude(*meter);
        }
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = match &mut this.inner {
            Inner::Full(bytes) => return Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Upstream(body) => Pin::new(body).poll_frame(cx),
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(meter), Some(data)) = (this.meter.as_mut(), frame.data_ref()) {
                    meter.scanner.feed(data);
                    if let Some(seen) = meter.seen.as_mut() {
                        seen.feed(data);
                    }
                    if meter.scanner.is_done() {
                        this.settle();
                    }
                }
            }
            Poll::Ready(None) => this.settle(),
            // The upstream failed mid-body: what was seen is what settles.
            Poll::Ready(Some(Err(_))) => {
                if let Some(meter) = this.meter.take() {
                    cut_short(*meter);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(bytes) => bytes.is_none(),
            Inner::Upstream(body) => self.meter.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Inner::Full(None) => SizeHint::with_exact(0),
            Inner::Upstream(body) => body.size_hint(),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The client went away (or hyper stopped reading) before the usage passed: dropping
        // the upstream's body closes its connection, which cancels the call there.
        if let Some(meter) = self.meter.take() {
            cut_short(*meter);
        }
    }
}

/// Settles a call whose body ended: with the usage it reported, if it did; for a stream
/// that reported none (an OpenAI stream without `include_usage`, or one cut short), with its
/// input (reported, or estimated) and the output the client saw; for a plain body without
/// usage, the estimate stands.
fn conclude(meter: Meter) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut reported = meter.scanner.finish();
    let complete = reported.output.is_some() || reported.total.is_some();
    let Some(seen) = meter.seen.filter(|_| !complete) else {
        if !reported.is_empty() {
            runtime.spawn(settle(meter.call, meter.tenant, reported, meter.upstream));
        }
        // Without usage the estimate stands: dropping the call and the permit keeps it.
        return;
    };
    let upstream = meter.upstream;
    let request = meter.request;
    let (call, tenant) = (meter.call, meter.tenant);
    runtime.spawn(async move {
        let estimator: &dyn Estimator = &*upstream.estimator;
        let seen_output = estimator.count(&seen.text) as u64;
        if reported.input.is_none() {
            let body: Value = request
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            reported.input = tollgate::estimators::estimate(estimator, &body)
                .ok()
                .map(|e| e.input_tokens);
        }
        reported.output = Some(reported.output.unwrap_or(0).max(seen_output));
        settle(call, tenant, reported, upstream).await;
    });
}

/// A body that ended before its end: counted, then settled as far as it was seen.
fn cut_short(meter: Meter) {
    meter.upstream.metrics.cut_short.increment(1);
    conclude(meter);
}

/// Settles the call at the upstream's key and the tenant's windows with `reported`.
async fn settle(call: Call, tenant: Option<Permit>, reported: Reported, upstream: Arc<Upstreamed>) {
    match call.finish(reported).await {
        Ok(usage) => {
            let tokens = usage.tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0);
            upstream.metrics.settled_tokens.increment(tokens);
        }
        Err(err) => tracing::warn!(upstream = %upstream.name, %err, "could not settle a call"),
    }
    if let Some(permit) = tenant {
        let usage = reported.usage(upstream.gate.profile(), permit.limiter().limits());
        if let Err(err) = permit.settle_usage(usage).await {
            tracing::warn!(upstream = %upstream.name, %err, "could not settle a tenant's call");
        }
    }
}

/// The text a stream's events carried: what the client saw of the output.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    text: String,
    line: Vec<u8>,
}

impl Seen {
    /// Reads the `data:` lines of server-sent events for the text they carry.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            if self.line.len() + piece.len() <= SEEN_MOST {
                self.line.extend_from_slice(piece);
            }
            if piece.ends_with(b"\n") {
                let line = std::mem::take(&mut self.line);
                self.line_done(&line);
            }
        }
    }

    fn line_done(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let Ok(event) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
            return;
        };
        let mut add = |text: Option<&str>| {
            if let Some(text) = text
                && self.text.len() + text.len() <= SEEN_MOST
            {
                self.text.push_str(text);
            }
        };
        // OpenAI chat chunks and completions.
        if let Some(choices) = event.get("choices").and_then(Value::as_array) {
            for choice in choices {
                add(choice
                    .get("delta")
                    .and_then(|d| d.get("content"))
                    .and_then(Value::as_str));
                add(choice.get("text").and_then(Value::as_str));
            }
        }
        match event.get("delta") {
            // Anthropic's content_block_delta.
            Some(Value::Object(delta)) => add(delta.get("text").and_then(Value::as_str)),
            // The responses API's output_text.delta.
            Some(Value::String(text)) => add(Some(text)),
            _ => {}
        }
    }

    /// The text seen so far.
    #[cfg(test)]
    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_of_every_kind_of_stream_is_seen_across_pieces() {
        let mut seen = Seen::default();
        let events = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"lo, \"}}\n\n",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":\"wor\"}\n\n",
            "data: {\"choices\":[{\"text\":\"ld\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        // Cut anywhere, the same text comes out.
        for cut in [1, 7, 33, 100] {
            let mut seen_cut = Seen::default();
            for piece in events.as_bytes().chunks(cut) {
                seen_cut.feed(piece);
            }
            assert_eq!(seen_cut.text(), "Hello, world", "cut every {cut}");
        }
        seen.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"unfinished");
        assert_eq!(seen.text(), "");
    }

    #[test]
    fn an_endless_line_is_not_kept() {
        let mut seen = Seen::default();
        let huge = vec![b'x'; SEEN_MOST + 10];
        seen.feed(b"data: ");
        seen.feed(&huge);
        assert!(seen.line.len() <= SEEN_MOST);
        seen.feed(b"\ndata: {\"delta\":\"ok\"}\n");
        assert_eq!(seen.text(), "ok");
    }
}
