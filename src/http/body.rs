//! A response body that reads its usage as it passes and settles the call at its end.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::gate::Call;
use super::usage::UsageScanner;

type Settling = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A response body on its way to the caller: every piece of data is read for usage as it
/// passes (a JSON body or a server-sent stream), and when the body ends (or a stream sends its
/// last event) the call is settled before that is handed on, so that once the caller has read
/// the body its key's windows already hold the real usage. A body dropped after its usage
/// came settles in a task of its own; one dropped before keeps the estimate.
pub struct Metered<B> {
    inner: Pin<Box<B>>,
    scanner: Option<UsageScanner>,
    call: Option<Call>,
    held: Option<Frame<Bytes>>,
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
            return match future.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    *settling = None;
                    Poll::Ready(this.held.take().map(Ok))
                }
                Poll::Pending => Poll::Pending,
            };
        }
        let (frame, ended) = match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let frame = frame.map_data(Into::into);
                let mut last = false;
                if let (Some(scanner), Some(data)) = (this.scanner.as_mut(), frame.data_ref()) {
                    scanner.feed(data);
                    last = scanner.is_done();
                }
                if !last {
                    return Poll::Ready(Some(Ok(frame)));
                }
                (Some(frame), false)
            }
            Poll::Ready(None) => (None, true),
            Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
            Poll::Pending => return Poll::Pending,
        };
        // The body ended, or the stream sent its last event: settle before handing it on.
        let (Some(call), Some(scanner)) = (this.call.take(), this.scanner.take()) else {
            return Poll::Ready(if ended { None } else { frame.map(Ok) });
        };
        let reported = scanner.finish();
        let mut future: Settling = Box::pin(async move {
            if let Err(err) = call.finish(reported).await {
                tracing::warn!(%err, "could not settle a call with its usage");
            }
        });
        match future.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(frame.map(Ok)),
            Poll::Pending => {
                this.held = frame;
                *settling = Some(future);
                Poll::Pending
            }
        }
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

impl<B> Drop for Metered<B> {
    fn drop(&mut self) {
        // Dropped after its usage came (a client that stops reading at the last event it
        // needs): settle in a task of its own. Without usage, the estimate stands.
        let (Some(call), Some(scanner)) = (self.call.take(), self.scanner.take()) else {
            return;
        };
        let reported = scanner.reported();
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

/// Reads a short body whole (a 429's error), keeping at most 1 MiB of it.
pub(crate) async fn read_short<B>(body: B) -> Result<Bytes, B::Error>
where
    B: Body,
    B::Data: Into<Bytes>,
{
    let mut body = Box::pin(body);
    let mut kept = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Ok(data) = frame?.into_data() {
            let data: Bytes = data.into();
            let room = (1usize << 20).saturating_sub(kept.len());
            kept.extend_from_slice(&data[..data.len().min(room)]);
        }
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
