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
/// its start (Anthropic's `message_start`) has its input settled then. A body dropped after its
/// usage came (a JSON body read whole, a stream past its last usage event) settles in a task of
/// its own; one dropped before keeps the estimate.
pub struct Metered<B> {
    inner: Pin<Box<B>>,
    scanner: Option<UsageScanner>,
    call: Option<Call>,
    /// What to hand on once the settlement under way is done: a frame, or the end.
    held: Option<Option<Frame<Bytes>>>,
    // Sync for clients (reqwest) that need Sync bodies; only ever locked by the poller.
    settling: Mutex<Option<Settling>>,
}

impl<B> fmt::Debug for Metered<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metered")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

impl<B> Metered<B> {
    /// Meters `inner` for `call`; `stream` says it is a server-sent event stream.
    pub fn new(inner: B, call: Call, stream: bool) -> Metered<B> {
        Metered {
            inner: Box::pin(inner),
            scanner: Some(UsageScanner::new(stream)),
            call: Some(call),
            held: None,
            settling: Mutex::new(None),
        }
    }

    /// A body with nothing to settle.
    pub fn plain(inner: B) -> Metered<B> {
        Metered {
            inner: Box::pin(inner),
            scanner: None,
            call: None,
            held: None,
            settling: Mutex::new(None),
        }
    }
}

impl<B> Body for Metered<B>
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
                    return Poll::Ready(this.held.take().flatten().map(Ok));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        let frame = match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame.map_data(Into::into),
            Poll::Ready(None) => {
                // The body ended: settle before handing the end on.
                return this.settle_last(None, cx);
            }
            Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
            Poll::Pending => return Poll::Pending,
        };
        let (early, last) = match (this.scanner.as_mut(), frame.data_ref()) {
            (Some(scanner), Some(data)) => {
                scanner.feed(data);
                (scanner.take_input(), scanner.is_done())
            }
            _ => (None, false),
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
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        // The end is reported only once the call is settled.
        self.call.is_none()
            && self.settling.lock().map(|s| s.is_none()).unwrap_or(true)
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Metered<B> {
    /// Settles the call for the last time (if it has one), then hands on `then` (a frame, or
    /// the end).
    fn settle_last<E>(
        &mut self,
        then: Option<Frame<Bytes>>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        if self.call.is_none() || self.scanner.is_none() {
            return Poll::Ready(then.map(Ok));
        }
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

impl<B> Drop for Metered<B> {
    fn drop(&mut self) {
        // Dropped after its usage came (a client that stops reading at the last event it
        // needs, or once it has the whole JSON document): settle in a task of its own.
        // Without usage, the estimate stands.
        let (Some(call), Some(scanner)) = (self.call.take(), self.scanner.take()) else {
            return;
        };
        let reported: Reported = scanner.finish();
        if reported.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = call.finish(reported).await {
                    tracing::warn!(%err, "could not settle a call with its usage");
                }
            });
        }
    }
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

/// Whether a response is a server-sent event stream, by its content type.
pub(crate) fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}
