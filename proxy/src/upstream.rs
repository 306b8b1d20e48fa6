//! The upstream's body as the proxy reads it: its first frame, when a pool's attempt read it
//! ahead (a member that sends a head and then nothing has not answered), then the rest; and
//! decoded, when it came compressed although the proxy asked for none (the organisation's keys
//! can only be masked, and the usage read, in the bytes as written); and cut when it goes
//! silent longer than its upstream's `chunk_timeout` ([`Gapped`]).

use std::future::Future as _;
use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use metrics::Counter;
use tokio::time::{Instant, Sleep};

/// An error of an upstream's body, and of the body the client reads.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How much compressed input is decoded at a time, and how much decoded output one frame
/// carries at most: a small frame that decodes to a great deal (a compression bomb) is handed
/// on in pieces, never held whole.
const INPUT_STEP: usize = 256;
const OUTPUT_MOST: usize = 64 << 10;

/// A decoder of one content coding, writing into a buffer.
enum Decoder {
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Zlib(flate2::write::ZlibDecoder<Vec<u8>>),
    Brotli(Box<brotli_decompressor::DecompressorWriter<Vec<u8>>>),
}

impl Decoder {
    fn of(coding: &str) -> Option<Decoder> {
        match coding {
            "gzip" | "x-gzip" => Some(Decoder::Gzip(
                flate2::write::MultiGzDecoder::new(Vec::new()),
            )),
            "deflate" => Some(Decoder::Zlib(flate2::write::ZlibDecoder::new(Vec::new()))),
            "br" => Some(Decoder::Brotli(Box::new(
                brotli_decompressor::DecompressorWriter::new(Vec::new(), 4096),
            ))),
            _ => None,
        }
    }

    fn write(&mut self, input: &[u8]) -> std::io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.write_all(input),
            Decoder::Zlib(d) => d.write_all(input),
            Decoder::Brotli(d) => d.write_all(input),
        }
    }

    fn finish(&mut self) -> std::io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.try_finish(),
            Decoder::Zlib(d) => d.try_finish(),
            Decoder::Brotli(d) => d.close(),
        }
    }

    fn take(&mut self) -> Vec<u8> {
        std::mem::take(match self {
            Decoder::Gzip(d) => d.get_mut(),
            Decoder::Zlib(d) => d.get_mut(),
            Decoder::Brotli(d) => d.get_mut(),
        })
    }
}

/// The upstream's body: a frame read ahead, then the rest, decoded when it must be.
pub(crate) struct UpstreamBody {
    first: Option<Frame<Bytes>>,
    /// The read ahead found the end.
    ended: bool,
    incoming: Incoming,
    decoder: Option<Decoder>,
    /// Compressed input not decoded yet.
    input: Bytes,
    /// The decoder was told the input ended.
    finished: bool,
}

impl UpstreamBody {
    pub(crate) fn new(incoming: Incoming) -> UpstreamBody {
        UpstreamBody {
            first: None,
            ended: false,
            incoming,
            decoder: None,
            input: Bytes::new(),
            finished: false,
        }
    }

    /// The body, decoded from the coding `headers` name when `must_read` (the proxy masks the
    /// organisation's keys in it, or reads its usage), with that header and `content-length`
    /// taken off `headers`; as it came otherwise. `Err`: codings it must read and can't (several,
    /// or one it doesn't know), named.
    pub(crate) fn decoding(
        mut self,
        headers: &mut HeaderMap,
        must_read: bool,
    ) -> Result<UpstreamBody, String> {
        let codings: Vec<String> = headers
            .get_all(CONTENT_ENCODING)
            .iter()
            .flat_map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .split(',')
                    .map(|c| c.trim().to_ascii_lowercase())
                    .filter(|c| !c.is_empty() && c != "identity")
                    .collect::<Vec<_>>()
            })
            .collect();
        if codings.is_empty() || !must_read {
            return Ok(self);
        }
        match (&codings[..], Decoder::of(&codings[0])) {
            ([_], Some(decoder)) => {
                headers.remove(CONTENT_ENCODING);
                headers.remove(CONTENT_LENGTH);
                self.decoder = Some(decoder);
                Ok(self)
            }
            _ => Err(codings.join(", ")),
        }
    }

    /// Waits for the first frame (or the end), so that an attempt can give up on a member
    /// that sent a head and nothing more: `Err` when the body failed before it.
    pub(crate) async fn read_ahead(&mut self) -> Result<(), BoxError> {
        use http_body_util::BodyExt as _;
        if self.first.is_some() || self.ended {
            return Ok(());
        }
        match self.incoming.frame().await {
            Some(Ok(frame)) => {
                self.first = Some(frame);
                Ok(())
            }
            Some(Err(err)) => Err(Box::new(err)),
            None => {
                self.ended = true;
                Ok(())
            }
        }
    }

    /// The next raw frame: the one read ahead, then the incoming body's.
    fn poll_raw(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => {
                Poll::Ready(Some(frame.map_err(|e| Box::new(e) as BoxError)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.decoder.is_none() {
            return this.poll_raw(cx);
        }
        loop {
            let Some(decoder) = this.decoder.as_mut() else {
                return Poll::Ready(None);
            };
            // Decode what is held, a step at a time, until a frame's worth is out.
            while !this.input.is_empty() {
                let step = this.input.split_to(this.input.len().min(INPUT_STEP));
                if let Err(err) = decoder.write(&step) {
                    return Poll::Ready(Some(Err(Box::new(err))));
                }
                if decoder_len(decoder) >= OUTPUT_MOST {
                    break;
                }
            }
            let out = decoder.take();
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
            }
            if this.finished {
                this.decoder = None;
                return Poll::Ready(None);
            }
            match this.poll_raw(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.input = data,
                    // Trailers come after the decoded body.
                    Err(frame) => {
                        if let Some(decoder) = this.decoder.as_mut()
                            && let Err(err) = decoder.finish()
                        {
                            return Poll::Ready(Some(Err(Box::new(err))));
                        }
                        let out = this.decoder.as_mut().map(Decoder::take).unwrap_or_default();
                        this.finished = true;
                        if out.is_empty() {
                            this.decoder = None;
                            return Poll::Ready(Some(Ok(frame)));
                        }
                        this.first = Some(frame);
                        this.ended = false;
                        this.decoder = None;
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                },
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(None) => {
                    if let Err(err) = decoder_finish(this) {
                        return Poll::Ready(Some(Err(Box::new(err))));
                    }
                    this.finished = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.first.is_some() || !self.input.is_empty() || self.decoder.is_some() {
            return false;
        }
        self.ended || self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.decoder.is_some() {
            return SizeHint::default();
        }
        let hint = self.incoming.size_hint();
        let ahead = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        let mut out = SizeHint::new();
        if let Some(upper) = hint.upper() {
            out.set_upper(upper.saturating_add(ahead));
        }
        out.set_lower(hint.lower().saturating_add(ahead));
        out
    }
}

fn decoder_len(decoder: &mut Decoder) -> usize {
    match decoder {
        Decoder::Gzip(d) => d.get_mut().len(),
        Decoder::Zlib(d) => d.get_mut().len(),
        Decoder::Brotli(d) => d.get_mut().len(),
    }
}

fn decoder_finish(upstream: &mut UpstreamBody) -> std::io::Result<()> {
    match upstream.decoder.as_mut() {
        Some(decoder) => decoder.finish(),
        None => Ok(()),
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

    /// The body it bounds, unbounded again.
    pub(crate) fn into_inner(self) -> B {
        self.inner
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
