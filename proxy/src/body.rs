//! A request's body, read within its bounds: at most `max_body_bytes`, counted against the
//! memory for bodies as it arrives, by its deadline and at the minimum rate. A body that can't
//! be read is a [`Reject`] of the kind its client is told.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::answer::{ErrorKind, Reject};
use crate::state::{BUFFER_UNIT, ReadyUpstream, Shared};

/// Refuses a body whose declared length is larger than the proxy takes, before a byte of it
/// is read and before anything is charged.
pub(crate) fn declared(
    shared: &Shared,
    upstream: &ReadyUpstream,
    headers: &HeaderMap,
) -> Result<(), Reject> {
    if content_length(headers).is_some_and(|n| n > shared.max_body as u64) {
        return Err(too_large(shared, upstream));
    }
    Ok(())
}

/// Reads the body (see [`read_body`]); the permit holds its bytes in the memory for bodies
/// until it is dropped.
pub(crate) async fn read(
    shared: &Shared,
    upstream: &ReadyUpstream,
    headers: &HeaderMap,
    incoming: Incoming,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Reject> {
    read_body(shared, headers, incoming)
        .await
        .map_err(|fail| match fail {
            BodyFail::TooLarge => too_large(shared, upstream),
            BodyFail::Slow => Reject::new(
                ErrorKind::SlowBody,
                format!(
                    "tollgate-proxy: the request body came too slowly (it must come within {:?}, at least {} bytes a second after 5 s)",
                    shared.bounds.body_timeout, shared.bounds.body_min_rate
                ),
            )
            .counted(&shared.proxy_metrics.slow_bodies),
            BodyFail::Busy => Reject::new(
                ErrorKind::Unavailable,
                "tollgate-proxy: too many request bodies are held at once; retry shortly",
            )
            .counted(&shared.proxy_metrics.busy),
            BodyFail::Draining => Reject::new(
                ErrorKind::Unavailable,
                "tollgate-proxy: the proxy is shutting down; nothing was sent",
            ),
            BodyFail::Broken => Reject::new(
                ErrorKind::Invalid,
                "tollgate-proxy: the request body could not be read",
            ),
        })
}

fn too_large(shared: &Shared, upstream: &ReadyUpstream) -> Reject {
    Reject::new(
        ErrorKind::TooLarge,
        format!(
            "tollgate-proxy: the request body is larger than {} bytes, the most this proxy takes",
            shared.max_body
        ),
    )
    .counted(&upstream.metrics.too_large)
}

/// How long a body may come at any rate before the minimum rate applies.
const BODY_GRACE: Duration = Duration::from_secs(5);

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFail {
    /// Larger than the proxy takes (413).
    TooLarge,
    /// Slower than the minimum rate, or past the body's deadline (408).
    Slow,
    /// The memory for bodies is full (503).
    Busy,
    /// The proxy started draining while it came (503).
    Draining,
    /// The client broke the body off (400).
    Broken,
}

/// The `content-length` a request declares.
pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn units(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(BUFFER_UNIT)).unwrap_or(u32::MAX)
}

/// Reads a request's body: at most `max_body` bytes, counted against the memory for bodies as
/// they arrive (the permit comes back when the request is done), by its deadline and at the
/// minimum rate, and given up when the proxy starts draining.
async fn read_body(
    shared: &Shared,
    headers: &HeaderMap,
    mut body: Incoming,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), BodyFail> {
    let started = Instant::now();
    let bounds = &shared.bounds;
    let declared = content_length(headers).and_then(|n| usize::try_from(n).ok());
    let mut held: Option<OwnedSemaphorePermit> = None;
    let hold = |bytes: usize, held: &mut Option<OwnedSemaphorePermit>| {
        let want = units(bytes);
        let have = held.as_ref().map_or(0, |p| p.num_permits() as u32);
        if want <= have {
            return Ok(());
        }
        let more = Arc::clone(&shared.buffered)
            .try_acquire_many_owned(want - have)
            .map_err(|_| BodyFail::Busy)?;
        match held {
            Some(permit) => permit.merge(more),
            None => *held = Some(more),
        }
        Ok(())
    };
    // Counted as the bytes arrive, not as declared: a client that declares 32 MiB and trickles
    // holds only what it sent (and the minimum rate keeps that small).
    let mut data = BytesMut::with_capacity(declared.unwrap_or(0).min(64 << 10));
    let deadline = started + bounds.body_timeout;
    let drain = shared.drain_started.notified();
    let mut drain = std::pin::pin!(drain);
    drain.as_mut().enable();
    loop {
        if shared.draining.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BodyFail::Draining);
        }
        // By `t` after the start, the body must have sent `rate × (t − grace)` bytes.
        let behind = match bounds.body_min_rate {
            0 => deadline,
            rate => {
                let allowed = Duration::from_secs_f64(data.len() as f64 / rate as f64);
                started + BODY_GRACE + allowed
            }
        };
        let until = deadline.min(behind);
        let frame = tokio::select! {
            frame = tokio::time::timeout_at(until, body.frame()) => frame,
            () = &mut drain => return Err(BodyFail::Draining),
        };
        match frame {
            Err(_) => return Err(BodyFail::Slow),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(BodyFail::Broken),
            Ok(Some(Ok(frame))) => {
                let Ok(bytes) = frame.into_data() else {
                    continue;
                };
                if data.len() + bytes.len() > shared.max_body {
                    return Err(BodyFail::TooLarge);
                }
                hold(data.len() + bytes.len(), &mut held)?;
                data.extend_from_slice(&bytes);
            }
        }
    }
    Ok((data.freeze(), held))
}
