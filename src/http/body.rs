//! A response body that reads its usage as it passes and settles the call at its end.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::call::Call;
use super::usage::{Reported, UsageScanner};

/// A settlement under way: a partial one gives the call back, the last one does not.
type Settling = Pin<Box<dyn Future<Output = Option<Call>> + Send>>;

/// A response body on its way to the caller: every piece of data is read for usage as it
/// passes (a JSON body or a server-sent stream), and when the body ends (or a stream sends its
/// last event) the call is settled before that is handed on, so that once the caller has read
/// the body its key's windows already hold the real usage. A stream that reports its input at
/// its start (Anthropic's `message_start`) has its input settled then.
///
/// A response that reports no output count is settled with the output counted from the text
/// it generated: content, tool-call arguments, reasoning, refusals, transcripts. A stream whose
/// usage the gate asked for ([`Call::usage_added`]) has that extra chunk taken out before the
/// caller sees it.
///
/// A body dropped after its usage came (a JSON body read whole, a stream past its last usage
/// event) settles with it, in a task of its own. One dropped before (the caller went away, or
/// the upstream broke off) keeps what the call was charged, unless more was generated than
/// its reservation held, which is then charged: never less than was generated.
pub struct MeteredBody<B> {
    inner: Pin<Box<B>>,
    scanner: Option<UsageScanner>,
    call: Option<Call>,
    /// What to hand on once the settlement under way is done: a frame, or the end.
    held: Option<Option<Frame<Bytes>>>,
    // Sync for clients (reqwest) that need Sync bodies; only ever locked by the poller.
    settling: Mutex<Option<Settling>>,
    /// Takes out the usage chunk the gate asked for.
    filter: Option<UsageFilter>,
    /// The inner body has ended.
    ended: bool,
}

impl<B> fmt::Debug for MeteredBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeteredBody")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

impl<B> MeteredBody<B> {
    /// KeyMetrics `inner` for `call`; `stream` says it is a server-sent event stream.
    pub fn new(inner: B, call: Call, stream: bool) -> MeteredBody<B> {
        let estimator = call.gate_estimator();
        let filter = (stream && call.usage_added()).then(UsageFilter::default);
        MeteredBody {
            inner: Box::pin(inner),
            scanner: Some(UsageScanner::counting(stream, estimator)),
            call: Some(call),
            held: None,
            settling: Mutex::new(None),
            filter,
            ended: false,
        }
    }

    /// A body with nothing to settle.
    pub fn plain(inner: B) -> MeteredBody<B> {
        MeteredBody {
            inner: Box::pin(inner),
            scanner: None,
            call: None,
            held: None,
            settling: Mutex::new(None),
            filter: None,
            ended: false,
        }
    }

    /// True while the call is not settled: the body has not reached its end (or its last
    /// usage event).
    pub fn is_settling(&self) -> bool {
        self.call.is_some()
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body,
    B::Data: Into<Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let settling = this
            .settling
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(future) = settling {
            match future.as_mut().poll(cx) {
                Poll::Ready(call) => {
                    *settling = None;
                    if call.is_some() {
                        this.call = call;
                    }
                    if let Some(held) = this.held.take() {
                        return Poll::Ready(held.map(Ok));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        loop {
            if this.ended {
                return this.settle_last(None, cx);
            }
            let frame = match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame.map_data(Into::into),
                Poll::Ready(None) => {
                    this.ended = true;
                    // What the filter still holds goes out, then the end (after settling).
                    if let Some(rest) = this.filter.as_mut().map(UsageFilter::flush)
                        && !rest.is_empty()
                    {
                        return this.settle_last(Some(Frame::data(rest)), cx);
                    }
                    return this.settle_last(None, cx);
                }
                Poll::Ready(Some(Err(err))) => {
                    // The upstream broke off: settled as a body cut short, when dropped.
                    return Poll::Ready(Some(Err(err)));
                }
                Poll::Pending => return Poll::Pending,
            };
            let (early, last) = match (this.scanner.as_mut(), frame.data_ref()) {
                (Some(scanner), Some(data)) => {
                    scanner.feed(data);
                    (scanner.take_input(), scanner.is_done())
                }
                _ => (None, false),
            };
            let frame = match (this.filter.as_mut(), frame.into_data()) {
                (Some(filter), Ok(data)) => {
                    let kept = filter.feed(&data);
                    if kept.is_empty() && !last && early.is_none() {
                        // Nothing to hand on yet (an event in pieces, or the one taken out).
                        continue;
                    }
                    Frame::data(kept)
                }
                (_, Ok(data)) => Frame::data(data),
                (_, Err(frame)) => frame,
            };
            if last {
                // The stream sent its last event: settle before handing it on.
                return this.settle_last(Some(frame), cx);
            }
            if let Some(reported) = early
                && let Some(mut call) = this.call.take()
            {
                let future: Settling = Box::pin(async move {
                    if let Err(err) = call.settle_input(reported).await {
                        tracing::warn!(%err, "could not settle a stream's input");
                    }
                    Some(call)
                });
                return this.settle_then(future, Some(frame), cx);
            }
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        // The end is reported only once the call is settled.
        self.call.is_none()
            && self.settling.lock().map(|s| s.is_none()).unwrap_or(true)
            && self.filter.as_ref().is_none_or(UsageFilter::is_empty)
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.filter.is_some() {
            return SizeHint::default();
        }
        self.inner.size_hint()
    }
}

impl<B> MeteredBody<B> {
    /// Settles the call for the last time (if it has one), then hands on `then` (a frame, or
    /// the end).
    fn settle_last<E>(
        &mut self,
        then: Option<Frame<Bytes>>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        let (Some(call), Some(scanner)) = (self.call.take(), self.scanner.take()) else {
            return Poll::Ready(then.map(Ok));
        };
        let reported = scanner.finish();
        let future: Settling = Box::pin(async move {
            if let Err(err) = call.finish(reported).await {
                tracing::warn!(%err, "could not settle a call with its usage");
            }
            None
        });
        self.settle_then(future, then, cx)
    }

    /// Runs `future` (a settlement) before handing on `then`.
    fn settle_then<E>(
        &mut self,
        mut future: Settling,
        then: Option<Frame<Bytes>>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        match future.as_mut().poll(cx) {
            Poll::Ready(call) => {
                if call.is_some() {
                    self.call = call;
                }
                Poll::Ready(then.map(Ok))
            }
            Poll::Pending => {
                self.held = Some(then);
                *self
                    .settling
                    .get_mut()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(future);
                Poll::Pending
            }
        }
    }
}

impl<B> Drop for MeteredBody<B> {
    fn drop(&mut self) {
        let (Some(call), Some(scanner)) = (self.call.take(), self.scanner.take()) else {
            return;
        };
        let done = scanner.is_done();
        let reported: Reported = scanner.finish();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Dropped after its usage came (a client that stops reading at the last event it
        // needs, or once it has the whole JSON document): settled with it. Dropped before:
        // the reservation stands, or what was generated if more.
        let complete = done || (!call.is_stream() && reported.output.is_some());
        runtime.spawn(async move {
            let settled = if complete {
                call.finish(reported).await
            } else {
                call.finish_cut(reported).await
            };
            if let Err(err) = settled {
                tracing::warn!(%err, "could not settle a call with its usage");
            }
        });
    }
}

/// Takes the usage chunk out of an OpenAI stream whose usage the gate asked for: the event
/// whose `choices` is empty and whose `usage` is an object. Events pass whole, as soon as
/// their blank line comes; an event that grows past [`FILTER_MOST`] without ending stops the
/// filter (everything passes from then on).
#[derive(Debug, Default)]
struct UsageFilter {
    pending: Vec<u8>,
    /// How far `pending` has been read.
    searched: usize,
    /// Bytes in the line being read, not counting its end.
    line_len: usize,
    /// The last byte read was a CR that ended a line (an LF may follow as part of that end),
    /// and whether that line was blank.
    after_cr: bool,
    blank_before_cr: bool,
    off: bool,
}

/// The longest event the filter holds back.
const FILTER_MOST: usize = 1 << 20;

impl UsageFilter {
    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes `data`; answers the whole events to hand on. Lines end with CR LF, LF or a lone
    /// CR, and a blank line ends an event, as server-sent events are defined.
    fn feed(&mut self, data: &[u8]) -> Bytes {
        if self.off {
            return Bytes::copy_from_slice(data);
        }
        self.pending.extend_from_slice(data);
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = self.searched;
        while i < self.pending.len() {
            let b = self.pending[i];
            if self.after_cr {
                self.after_cr = false;
                let blank = std::mem::take(&mut self.blank_before_cr);
                if b == b'\n' {
                    i += 1;
                }
                if blank {
                    self.emit(start, i, &mut out);
                    start = i;
                }
                continue;
            }
            i += 1;
            match b {
                b'\n' => {
                    let blank = self.line_len == 0;
                    self.line_len = 0;
                    if blank {
                        self.emit(start, i, &mut out);
                        start = i;
                    }
                }
                b'\r' => {
                    self.blank_before_cr = self.line_len == 0;
                    self.line_len = 0;
                    self.after_cr = true;
                }
                _ => self.line_len += 1,
            }
        }
        self.pending.drain(..start);
        self.searched = i - start;
        if self.pending.len() > FILTER_MOST {
            self.off = true;
            out.append(&mut self.pending);
            self.searched = 0;
        }
        Bytes::from(out)
    }

    /// Hands on `pending[start..end]` (one whole event) unless it is the usage chunk.
    fn emit(&self, start: usize, end: usize, out: &mut Vec<u8>) {
        let event = &self.pending[start..end];
        if !is_usage_chunk(event) {
            out.extend_from_slice(event);
        }
    }

    /// What is held back, at the end of the stream (an event without its blank line, which
    /// is still read as an event, and so is still the usage chunk if it is one).
    fn flush(&mut self) -> Bytes {
        self.searched = 0;
        let rest = std::mem::take(&mut self.pending);
        if is_usage_chunk(&rest) {
            return Bytes::new();
        }
        Bytes::from(rest)
    }
}

/// Whether one event is OpenAI's usage chunk: `choices` empty, `usage` an object.
fn is_usage_chunk(event: &[u8]) -> bool {
    if !event.windows(7).any(|w| w == b"\"usage\"") {
        return false;
    }
    let mut data = Vec::new();
    for line in event.split(|b| *b == b'\n' || *b == b'\r') {
        if let Some(rest) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(rest.strip_prefix(b" ").unwrap_or(rest));
        }
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&data) else {
        return false;
    };
    value
        .get("choices")
        .and_then(serde_json::Value::as_array)
        .is_some_and(Vec::is_empty)
        && value.get("usage").is_some_and(serde_json::Value::is_object)
}

/// The longest a 429's body is read.
const SHORT_READ: std::time::Duration = std::time::Duration::from_secs(10);
/// The most of a 429's body that is kept (and read).
const SHORT_SIZE: usize = 1 << 20;

/// Reads a short body (a 429's error): at most 1 MiB of it, for at most 10 s or until
/// `deadline`, whichever is sooner. What came by then is what is kept: an endless body can't
/// hold the caller.
pub(crate) async fn read_short<B>(
    body: B,
    deadline: Option<tokio::time::Instant>,
) -> Result<Bytes, B::Error>
where
    B: Body,
    B::Data: Into<Bytes>,
{
    let mut body = Box::pin(body);
    let mut kept = Vec::new();
    let until = tokio::time::Instant::now() + SHORT_READ;
    let until = deadline.map_or(until, |d| d.min(until));
    let read = async {
        while kept.len() < SHORT_SIZE
            && let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await
        {
            if let Ok(data) = frame?.into_data() {
                let data: Bytes = data.into();
                let room = SHORT_SIZE.saturating_sub(kept.len());
                kept.extend_from_slice(&data[..data.len().min(room)]);
            }
        }
        Ok(())
    };
    // Past the time allowed, what came is what is kept.
    if let Ok(Err(err)) = tokio::time::timeout_at(until, read).await {
        return Err(err);
    }
    Ok(Bytes::from(kept))
}

/// Whether a response is a server-sent event stream, by its content type
/// (`text/event-stream`, with or without parameters): the answers whose usage comes in their
/// last events, and which a proxy must pass on as they come.
///
/// ```
/// let mut headers = http::HeaderMap::new();
/// headers.insert("content-type", "text/event-stream; charset=utf-8".parse().unwrap());
/// assert!(tollgate::http::is_event_stream(&headers));
/// headers.insert("content-type", "application/json".parse().unwrap());
/// assert!(!tollgate::http::is_event_stream(&headers));
/// ```
pub fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}
