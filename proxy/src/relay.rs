//! The body the client reads: one the proxy wrote, or the upstream's, handed on as it comes.
//! A metered one goes through the library's [`MeteredBody`] body (usage read on the way, the call
//! settled at its end, generated text counted when no usage comes); every upstream body is cut
//! when it goes silent longer than its upstream's `chunk_timeout`.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use metrics::Counter;
use tokio::time::{Instant, Sleep};
use tollgate::http::MeteredBody;

/// An error of the body the client reads.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: one the proxy wrote, or the upstream's, metered or not.
pub struct Relay {
    inner: Inner,
    /// What the body keeps alive until the client is done with it (the connection's count of
    /// requests in flight).
    held: Option<Box<dyn Send + Sync>>,
}

enum Inner {
    Full(Option<Bytes>),
    Plain(Watched<Gapped<Incoming>>),
    Metered {
        body: Watched<Box<MeteredBody<Gapped<Incoming>>>>,
        /// A server-sent stream (for counting streams a client left).
        stream: bool,
        /// Streams the client left before their end.
        left: Counter,
        ended: bool,
    },
}

impl Relay {
    /// A body the proxy wrote.
    pub fn full(bytes: Bytes) -> Relay {
        Relay {
            inner: Inner::Full(Some(bytes)),
            held: None,
        }
    }

    /// The upstream's body, handed on unmetered; cut when the client stops reading it for
    /// `unread` (see [`Watched`]).
    pub(crate) fn plain(body: Incoming, gap: Duration, stalled: Counter, unread: Unread) -> Relay {
        Relay {
            inner: Inner::Plain(Watched::new(Gapped::new(body, gap, stalled), unread)),
            held: None,
        }
    }

    /// The upstream's body, metered.
    pub(crate) fn metered(
        body: Box<MeteredBody<Gapped<Incoming>>>,
        stream: bool,
        left: Counter,
        unread: Unread,
    ) -> Relay {
        Relay {
            inner: Inner::Metered {
                body: Watched::new(body, unread),
                stream,
                left,
                ended: false,
            },
            held: None,
        }
    }

    /// Keeps `held` alive for as long as the client reads the body.
    pub(crate) fn holding(mut self, held: Box<dyn Send + Sync>) -> Relay {
        self.held = Some(held);
        self
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match &mut this.inner {
            Inner::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Plain(body) => Pin::new(body).poll_frame(cx),
            Inner::Metered { body, ended, .. } => {
                let polled = Pin::new(body).poll_frame(cx);
                if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
                    *ended = true;
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(bytes) => bytes.is_none(),
            Inner::Plain(body) => body.is_end_stream(),
            Inner::Metered { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Inner::Full(None) => SizeHint::with_exact(0),
            Inner::Plain(body) => body.size_hint(),
            Inner::Metered { body, .. } => body.size_hint(),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // A stream the client left before its end (or before its call settled): counted.
        // The metered body keeps the call's reservation (or charges what was generated, if
        // more) in its own drop.
        if let Inner::Metered {
            body,
            stream: true,
            left,
            ended: false,
        } = &self.inner
            && body.settling()
        {
            left.increment(1);
        }
    }
}

/// A body that fails when it goes `gap` without a frame: an upstream that stalls can't hold
/// the client (or the proxy) for ever.
pub(crate) struct Gapped<B> {
    inner: B,
    gap: Duration,
    timer: Pin<Box<Sleep>>,
    stalled: Counter,
}

impl<B> Gapped<B> {
    pub(crate) fn new(inner: B, gap: Duration, stalled: Counter) -> Gapped<B> {
        Gapped {
            inner,
            gap,
            timer: Box::pin(tokio::time::sleep(gap)),
            stalled,
        }
    }
}

/// An upstream body that went silent too long.
#[derive(Debug)]
pub(crate) struct Stalled(Duration);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the upstream sent nothing for {:?}; its answer was cut",
            self.0
        )
    }
}

impl std::error::Error for Stalled {}

impl<B> Body for Gapped<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.timer.as_mut().reset(Instant::now() + this.gap);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.stalled.increment(1);
                    Poll::Ready(Some(Err(Box::new(Stalled(this.gap)))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How long a client may leave an answer unread, and what counts it.
#[derive(Clone)]
pub(crate) struct Unread {
    pub(crate) timeout: Duration,
    pub(crate) counter: Counter,
}

/// The shared state of a [`Watched`] body: the body (taken when the client stalls), and when
/// the client last took a frame while none was waiting on the upstream.
struct Watch<B> {
    body: std::sync::Mutex<Option<B>>,
    /// Milliseconds from `epoch` when a frame was handed out; `u64::MAX` while the body waits
    /// on the upstream (a quiet upstream is the chunk timeout's business).
    handed: std::sync::atomic::AtomicU64,
    epoch: Instant,
}

/// A body the client must keep reading: if a frame handed out is not followed by another poll
/// within `timeout` (a client that stopped reading, an HTTP/2 stream whose window stays shut),
/// the upstream's body is dropped (which cancels the call there and frees its connection) and
/// the client's body ends with an error. The call keeps its charge (a body cut short).
pub(crate) struct Watched<B> {
    watch: std::sync::Arc<Watch<B>>,
}

/// The client stopped reading.
#[derive(Debug)]
pub(crate) struct Unreadable(Duration);

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the client read nothing for {:?}; the answer was cut",
            self.0
        )
    }
}

impl std::error::Error for Unreadable {}

impl<B: Send + 'static> Watched<B> {
    fn new(body: B, unread: Unread) -> Watched<B> {
        let watch = std::sync::Arc::new(Watch {
            body: std::sync::Mutex::new(Some(body)),
            handed: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
        });
        let weak = std::sync::Arc::downgrade(&watch);
        let Unread { timeout, counter } = unread;
        tokio::spawn(async move {
            let period = (timeout / 4).max(Duration::from_millis(10));
            loop {
                tokio::time::sleep(period).await;
                let Some(watch) = weak.upgrade() else {
                    return;
                };
                let handed = watch.handed.load(std::sync::atomic::Ordering::Acquire);
                let now = u64::try_from(watch.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
                let limit = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                if handed != u64::MAX && now.saturating_sub(handed) >= limit {
                    let body = watch
                        .body
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take();
                    if body.is_some() {
                        counter.increment(1);
                        tracing::warn!(
                            ?timeout,
                            "a client stopped reading an answer; the upstream call is cut"
                        );
                    }
                    drop(body);
                    return;
                }
            }
        });
        Watched { watch }
    }
}

impl<B> Watched<Box<MeteredBody<B>>> {
    /// The metered body's call is not settled yet.
    fn settling(&self) -> bool {
        self.watch
            .body
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(|body| body.is_settling())
    }
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let watch = &self.watch;
        let mut body = watch
            .body
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(inner) = body.as_mut() else {
            return Poll::Ready(Some(Err(Box::new(Unreadable(Duration::ZERO)))));
        };
        let polled = Pin::new(inner).poll_frame(cx);
        let stamp = match &polled {
            Poll::Pending => u64::MAX,
            Poll::Ready(_) => {
                u64::try_from(watch.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
            }
        };
        watch
            .handed
            .store(stamp, std::sync::atomic::Ordering::Release);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.watch
            .body
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.watch
            .body
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }
}
