//! The body the client reads: one the proxy wrote, or the upstream's, handed on as it comes.
//! A metered one goes through the library's [`MeteredBody`] body (usage read on the way, the call
//! settled at its end, generated text counted when no usage comes), and every one is cut when
//! its client stops reading it. The answer's head goes on without the headers that belong to
//! one connection (a rule the request's head, going upstream, keeps too).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use metrics::Counter;
use tokio::time::Instant;
use tollgate::http::MeteredBody;

use crate::upstream::{BoxError, Gapped, UpstreamBody};

/// A response body: one the proxy wrote, or the upstream's, metered or not.
pub struct Relay {
    inner: Inner,
    /// What the body keeps alive until the client is done with it (the connection's count of
    /// requests in flight).
    held: Option<Box<dyn Send + Sync>>,
    /// Takes the organisation's secrets out of what the client reads.
    scrub: Option<Scrubber>,
    /// Records the owner of the objects the answer creates, before the client reads their ids.
    catch: Option<Catch>,
}

/// What a [`Relay`] needs to record the owner of the ids an answer carries.
struct Catch {
    catcher: crate::owners::IdCatcher,
    owners: Arc<crate::owners::Owners>,
    tenant: String,
    /// The recording under way (Sync for bodies that must be), and the frame it holds back.
    recording: std::sync::Mutex<Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>>,
    held: Option<Frame<Bytes>>,
}

enum Inner {
    Full(Option<Bytes>),
    Plain(Watched<Gapped<UpstreamBody>>),
    Metered {
        body: Watched<Draining>,
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
            scrub: None,
            catch: None,
        }
    }

    /// The upstream's body, handed on unmetered; cut when the client stops reading it for
    /// `unread` (see [`Watched`]).
    pub(crate) fn plain(
        body: UpstreamBody,
        gap: Duration,
        stalled: Counter,
        unread: Unread,
    ) -> Relay {
        Relay {
            inner: Inner::Plain(Watched::new(Gapped::new(body, gap, stalled), unread)),
            held: None,
            scrub: None,
            catch: None,
        }
    }

    /// The upstream's body, metered; read to its end by the proxy when the client leaves it
    /// early if `drain` (see [`Draining`]).
    pub(crate) fn metered(
        body: Box<MeteredBody<Gapped<UpstreamBody>>>,
        stream: bool,
        left: Counter,
        unread: Unread,
        drain: bool,
    ) -> Relay {
        Relay {
            inner: Inner::Metered {
                body: Watched::new(
                    Draining {
                        body: Some(body),
                        drain,
                    },
                    unread,
                ),
                stream,
                left,
                ended: false,
            },
            held: None,
            scrub: None,
            catch: None,
        }
    }

    /// Keeps `held` alive for as long as the client reads the body.
    pub(crate) fn holding(mut self, held: Box<dyn Send + Sync>) -> Relay {
        self.held = Some(held);
        self
    }

    /// Masks every occurrence of `secrets` in the body the client reads (see [`Scrubber`]).
    pub(crate) fn scrubbing(mut self, secrets: &Arc<Secrets>) -> Relay {
        if !secrets.is_empty() {
            self.scrub = Some(Scrubber::new(Arc::clone(secrets)));
        }
        self
    }

    /// Records `tenant` as the owner of the objects whose ids this answer carries (read from
    /// its start), each before the frame that shows it goes to the client.
    pub(crate) fn catching(
        mut self,
        owners: Arc<crate::owners::Owners>,
        tenant: String,
        any_id: bool,
    ) -> Relay {
        self.catch = Some(Catch {
            catcher: if any_id {
                crate::owners::IdCatcher::any_own()
            } else {
                crate::owners::IdCatcher::default()
            },
            owners,
            tenant,
            recording: std::sync::Mutex::new(None),
            held: None,
        });
        self
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.inner {
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
}

impl Body for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(catch) = this.catch.as_mut() else {
            return this.poll_scrubbed(cx);
        };
        let recording = catch
            .recording
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(future) = recording.as_mut() {
            match future.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    *recording = None;
                    if let Some(frame) = catch.held.take() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        let polled = this.poll_scrubbed(cx);
        let (Some(catch), Poll::Ready(Some(Ok(frame)))) = (this.catch.as_mut(), &polled) else {
            return polled;
        };
        let Some(data) = frame.data_ref() else {
            return polled;
        };
        let ids = catch.catcher.feed(data);
        if ids.is_empty() {
            return polled;
        }
        let (owners, tenant) = (Arc::clone(&catch.owners), catch.tenant.clone());
        let mut future: Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            Box::pin(async move {
                for id in ids {
                    owners.record(&id, &tenant).await;
                }
            });
        let Poll::Ready(Some(Ok(frame))) = polled else {
            return polled;
        };
        match future.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Ok(frame))),
            Poll::Pending => {
                catch.held = Some(frame);
                *catch
                    .recording
                    .get_mut()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(future);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.catch.as_ref().is_some_and(|c| c.held.is_some()) {
            return false;
        }
        self.scrubbed_end()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner_size_hint()
    }
}

impl Relay {
    fn poll_scrubbed(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self;
        if this.scrub.is_none() {
            return this.poll_inner(cx);
        }
        loop {
            if let Some(scrub) = this.scrub.as_mut()
                && let Some(trailers) = scrub.trailers.take()
            {
                return Poll::Ready(Some(Ok(trailers)));
            }
            let polled = this.poll_inner(cx);
            let Some(scrub) = this.scrub.as_mut() else {
                return polled;
            };
            match polled {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = scrub.feed(&data);
                        // Held back whole (the start of a secret, perhaps): read on.
                        if out.is_empty() && !data.is_empty() {
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    // Trailers (which HTTP/2 always delivers, and HTTP/1.1 to a client that
                    // asks) are masked too, after what the body held back.
                    Err(mut frame) => {
                        if let Some(trailers) = frame.trailers_mut() {
                            mask_headers(&scrub.secrets, trailers);
                        }
                        let rest = scrub.flush();
                        if rest.is_empty() {
                            return Poll::Ready(Some(Ok(frame)));
                        }
                        scrub.trailers = Some(frame);
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                },
                Poll::Ready(None) => {
                    let rest = scrub.flush();
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                other => return other,
            }
        }
    }

    fn scrubbed_end(&self) -> bool {
        if self
            .scrub
            .as_ref()
            .is_some_and(|s| !s.pending.is_empty() || s.trailers.is_some())
        {
            return false;
        }
        match &self.inner {
            Inner::Full(bytes) => bytes.is_none(),
            Inner::Plain(body) => body.is_end_stream(),
            Inner::Metered { body, .. } => body.is_end_stream(),
        }
    }

    fn inner_size_hint(&self) -> SizeHint {
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

impl Watched<Draining> {
    /// The metered body's call is not settled yet.
    fn settling(&self) -> bool {
        self.watch
            .body
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .and_then(|draining| draining.body.as_ref())
            .is_some_and(|body| body.is_settling())
    }
}

/// The most a body left by its client is read on by the proxy.
const DRAIN_MOST: Duration = Duration::from_secs(600);

/// A metered body that, when its client leaves it before its end (hangs up, or stops reading),
/// is read on to its end by the proxy, within [`DRAIN_MOST`] and the upstream's chunk timeout,
/// so that its call settles with the usage its provider reports rather than its reservation.
/// Calls with inputs the proxy can't see drain: their bill is what teaches the ceiling such
/// calls are reserved at, and a tenant that left each such stream early had kept every one at
/// its visible estimate (the provider bills the whole input of a call cut short). The output
/// read on is within what the call reserved.
pub(crate) struct Draining {
    body: Option<Box<MeteredBody<Gapped<UpstreamBody>>>>,
    drain: bool,
}

impl Body for Draining {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut().body.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        let Some(mut body) = self.body.take() else {
            return;
        };
        if !self.drain || !body.is_settling() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            use http_body_util::BodyExt as _;
            let read_on = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(DRAIN_MOST, read_on).await;
        });
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

/// The organisation's secrets (the upstreams' real keys, the header tenants' shared secret),
/// as they may appear in what an upstream sends back.
pub(crate) type Secrets = Vec<Vec<u8>>;

/// Masks the organisation's secrets in a body as it passes, whatever its frames: each
/// occurrence is overwritten with `[redacted]` and stars to its length (so a `content-length`
/// stays true), and the end of a frame that could begin one is held back until the next frame
/// says (at most a secret's length, and only while it could be one).
pub(crate) struct Scrubber {
    secrets: Arc<Secrets>,
    pending: Vec<u8>,
    /// Trailers that came while data was held back: handed on after it.
    trailers: Option<Frame<Bytes>>,
}

impl Scrubber {
    pub(crate) fn new(secrets: Arc<Secrets>) -> Scrubber {
        Scrubber {
            secrets,
            pending: Vec::new(),
            trailers: None,
        }
    }

    /// Takes `data`: what can be handed on now, masked.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Bytes {
        self.pending.extend_from_slice(data);
        mask(&self.secrets, &mut self.pending);
        // Hold back the longest end that begins a secret.
        let hold = self
            .secrets
            .iter()
            .map(|secret| {
                (1..secret.len().min(self.pending.len() + 1))
                    .rev()
                    .find(|n| self.pending.ends_with(&secret[..*n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let out = self.pending.len() - hold;
        let rest = self.pending.split_off(out);
        Bytes::from(std::mem::replace(&mut self.pending, rest))
    }

    /// What is held back, at the end.
    pub(crate) fn flush(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.pending))
    }
}

/// Overwrites every occurrence of each secret in `bytes`.
pub(crate) fn mask(secrets: &Secrets, bytes: &mut [u8]) -> bool {
    let mut found = false;
    for secret in secrets {
        if secret.is_empty() || secret.len() > bytes.len() {
            continue;
        }
        let mut i = 0;
        while i + secret.len() <= bytes.len() {
            if bytes[i..i + secret.len()] == secret[..] {
                let shown = b"[redacted]";
                for (j, b) in bytes[i..i + secret.len()].iter_mut().enumerate() {
                    *b = shown.get(j).copied().unwrap_or(b'*');
                }
                found = true;
                i += secret.len();
            } else {
                i += 1;
            }
        }
    }
    found
}

/// Masks the secrets in every header value.
pub(crate) fn mask_headers(secrets: &Secrets, headers: &mut http::HeaderMap) {
    if secrets.is_empty() {
        return;
    }
    for value in headers.values_mut() {
        let mut bytes = value.as_bytes().to_vec();
        if mask(secrets, &mut bytes)
            && let Ok(masked) = http::HeaderValue::from_bytes(&bytes)
        {
            *value = masked;
        }
    }
}

/// The upstream's answer as the client gets it: its head without the headers that belong to
/// the proxy's connection with the upstream, and `body`.
pub(crate) fn relayed(head: http::response::Parts, body: Relay) -> http::Response<Relay> {
    let mut response = http::Response::new(body);
    *response.status_mut() = head.status;
    let mut headers = head.headers;
    strip_hop_by_hop(&mut headers);
    *response.headers_mut() = headers;
    response
}

/// The headers that belong to one connection, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the headers that belong to one connection, and those its `connection` header
/// names: neither a request nor an answer carries them on to the next hop.
pub(crate) fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    let named: Vec<http::HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| http::HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_masked_whatever_frames_it_comes_in() {
        let secrets = Arc::new(vec![b"sk-secret-123".to_vec()]);
        let text = b"data: {\"echo\":\"Bearer sk-secret-123\"}\n\nsk-secret-12";
        for cut in 1..text.len() {
            let mut scrubber = Scrubber::new(Arc::clone(&secrets));
            let mut out = Vec::new();
            for piece in text.chunks(cut) {
                out.extend_from_slice(&scrubber.feed(piece));
            }
            out.extend_from_slice(&scrubber.flush());
            assert_eq!(out.len(), text.len());
            let out = String::from_utf8(out).unwrap();
            assert!(!out.contains("sk-secret-123"), "{cut}: {out}");
            assert!(out.contains("Bearer [redacted]***"), "{cut}: {out}");
            // A partial secret at the end is not the secret: handed on as it came.
            assert!(out.ends_with("sk-secret-12"), "{cut}: {out}");
        }
    }
}
