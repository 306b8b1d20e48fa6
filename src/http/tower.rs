//! A `tower::Layer` that puts a [`Gate`] in front of any `Service<http::Request<B>>`, such as
//! hyper's clients (feature `tower`).

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;

use super::attempt::{Attempts, Next};
use super::body::MeteredBody;
use super::gate::Gate;

/// An error of any kind, boxed: tollgate's own, [`PermanentRefusal`](super::PermanentRefusal), or the inner service's.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body whose bytes can be read before it is sent (to estimate it) and that can be
/// sent again (to retry a 429).
pub trait RequestBytes: Clone {
    /// The body's bytes, if it has them at hand (a streaming body does not: it is sent with
    /// the cost of an empty body).
    fn request_bytes(&self) -> Option<Cow<'_, [u8]>>;

    /// A body of this type holding `bytes`, for a body the gate rewrote (decoded from its
    /// `content-encoding`, or asking a stream for its usage); `None` when the type can't
    /// hold them, and the caller's body is sent as it is.
    fn with_bytes(&self, bytes: Bytes) -> Option<Self> {
        let _ = bytes;
        None
    }
}

impl RequestBytes for Bytes {
    fn request_bytes(&self) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Borrowed(self))
    }

    fn with_bytes(&self, bytes: Bytes) -> Option<Self> {
        Some(bytes)
    }
}

impl RequestBytes for String {
    fn request_bytes(&self) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Borrowed(self.as_bytes()))
    }

    fn with_bytes(&self, bytes: Bytes) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

impl RequestBytes for Vec<u8> {
    fn request_bytes(&self) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Borrowed(self))
    }

    fn with_bytes(&self, bytes: Bytes) -> Option<Self> {
        Some(bytes.to_vec())
    }
}

impl<D: bytes::Buf + Clone + From<Bytes>> RequestBytes for http_body_util::Full<D> {
    fn with_bytes(&self, bytes: Bytes) -> Option<Self> {
        Some(http_body_util::Full::new(D::from(bytes)))
    }

    fn request_bytes(&self) -> Option<Cow<'_, [u8]>> {
        // Full keeps its data private; its frame is read from a clone.
        let mut clone = self.clone();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        match Pin::new(&mut clone).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => frame
                .into_data()
                .ok()
                .map(|mut data| Cow::Owned(data.copy_to_bytes(data.remaining()).to_vec())),
            _ => Some(Cow::Borrowed(&[])),
        }
    }
}

/// The layer: wraps a service in a [`GateService`].
///
/// ```
/// use tollgate::Limits;
/// use tollgate::http::{Gate, Profile};
/// use tollgate::http::tower::GateLayer;
///
/// # fn main() -> Result<(), tollgate::Error> {
/// let gate = Gate::builder(Profile::openai())
///     .limits(Limits::parse("500/m", "30000/m")?)
///     .build()?;
/// let layer = GateLayer::new(gate);
/// // tower::ServiceBuilder::new().layer(layer).service(hyper_client)
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct GateLayer {
    gate: Gate,
}

impl GateLayer {
    /// A layer that sends every request through `gate`.
    pub fn new(gate: Gate) -> GateLayer {
        GateLayer { gate }
    }
}

impl<S> tower_layer::Layer<S> for GateLayer {
    type Service = GateService<S>;

    fn layer(&self, inner: S) -> GateService<S> {
        GateService {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// A service whose every request pays its toll first, is retried after a transient 429 (up
/// to the gate's [`retries`](Gate::retries)), fails at once with [`PermanentRefusal`](super::PermanentRefusal) on a
/// permanent one, and whose response body settles the call when it ends. It serves
/// `http::Request<B>` and, with the `async-openai` feature, async-openai's requests.
#[derive(Debug, Clone)]
pub struct GateService<S> {
    inner: S,
    gate: Gate,
}

impl<S: Clone> GateService<S> {
    /// The service that was made ready, and the gate, for one call; a clone of the service
    /// takes its place.
    pub(crate) fn take(&mut self) -> (S, Gate) {
        let clone = self.inner.clone();
        (std::mem::replace(&mut self.inner, clone), self.gate.clone())
    }
}

impl<S> GateService<S> {
    #[cfg_attr(not(feature = "async-openai"), allow(dead_code))]
    pub(crate) fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }
}

impl<S, B, RB> tower_service::Service<Request<B>> for GateService<S>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: RequestBytes + Send + Sync + 'static,
    RB: Body + Unpin + Send + 'static,
    RB::Data: Into<Bytes>,
    RB::Error: Into<BoxError>,
{
    type Response = Response<MeteredBody<EitherBody<RB>>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was made ready is the one that sends; a clone takes its place.
        let (mut inner, gate) = self.take();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body
                .request_bytes()
                .map(Cow::into_owned)
                .unwrap_or_default();
            // Every attempt shares the deadline of the first admission.
            let mut attempts = Attempts::new(&gate, &parts, &bytes)?;
            loop {
                let mut call = attempts.admit().await?;
                if attempts.retried() > 0 {
                    std::future::poll_fn(|cx| inner.poll_ready(cx))
                        .await
                        .map_err(Into::into)?;
                }
                let mut head = parts.clone();
                let sent = match call.body().and_then(|new| body.with_bytes(new.clone())) {
                    Some(rewritten) => {
                        call.rewrite_headers(&mut head.headers);
                        rewritten
                    }
                    None => body.clone(),
                };
                call.sending();
                let response = inner
                    .call(Request::from_parts(head, sent))
                    .await
                    .map_err(Into::into)?;
                let (head, response_body) = response.into_parts();
                let next = attempts
                    .answered(
                        call,
                        head.status,
                        &head.headers,
                        EitherBody::Inner(response_body),
                    )
                    .await?;
                match next {
                    Next::Deliver(body) => return Ok(Response::from_parts(head, *body)),
                    Next::Retry(delay) => tokio::time::sleep(delay).await,
                    Next::HandOn {
                        past_deadline: Some(err),
                        ..
                    } => return Err(err.into()),
                    Next::HandOn { body, .. } => {
                        let body = MeteredBody::plain(EitherBody::Read(Some(body)));
                        return Ok(Response::from_parts(head, body));
                    }
                    Next::Refused { refusal, .. } => return Err(refusal.into()),
                }
            }
        })
    }
}

/// The inner service's body, or one already read (a 429's).
#[derive(Debug)]
pub enum EitherBody<B> {
    /// As the service answered it.
    Inner(B),
    /// Read whole.
    Read(Option<Bytes>),
}

impl<B> Body for EitherBody<B>
where
    B: Body + Unpin,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            EitherBody::Inner(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map(|f| f.map_data(Into::into)).map_err(Into::into))),
            EitherBody::Read(data) => {
                Poll::Ready(data.take().map(|d| Ok(http_body::Frame::data(d))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            EitherBody::Inner(body) => body.is_end_stream(),
            EitherBody::Read(data) => data.is_none(),
        }
    }
}
