//! The listener: accepts connections (HTTP/1.1 and HTTP/2), bounds what each may hold, hands
//! each request to the pipeline (`pipeline.rs`), and on shutdown stops accepting and lets the
//! calls in flight finish, up to a deadline.
//!
//! Every connection is watched: one with no request in flight that sends nothing for
//! `idle_timeout` is closed (a new one that never speaks, a kept-alive one between requests, an
//! HTTP/2 one with no streams). Past `max_connections`, the connection idle the longest is
//! closed to make room; when none is idle, the new one is answered 503 and closed. The
//! listener never stops accepting.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::pipeline::handle;
use crate::state::{Current, Shared};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every call in flight finished.
    Clean,
    /// The deadline passed with calls still in flight; they were cut.
    Cut,
}

/// One connection's state, shared by its watchdog, its reads and its requests.
pub(crate) struct Connection {
    /// Milliseconds since the listener started, at the last byte read or response finished.
    last: AtomicU64,
    /// Requests whose response is not finished.
    in_flight: AtomicUsize,
    /// Told to close (to make room for another).
    close: Notify,
    /// Milliseconds since the listener started when a write first could not proceed, since the
    /// last one that did (`u64::MAX`: writes proceed).
    blocked: AtomicU64,
    epoch: Instant,
}

impl Connection {
    fn new(epoch: Instant) -> Connection {
        let connection = Connection {
            last: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            close: Notify::new(),
            blocked: AtomicU64::new(u64::MAX),
            epoch,
        };
        connection.touch();
        connection
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last.store(self.now_ms(), Ordering::Relaxed);
    }

    fn idle_for(&self) -> Option<u64> {
        (self.in_flight.load(Ordering::Acquire) == 0).then(|| {
            self.now_ms()
                .saturating_sub(self.last.load(Ordering::Relaxed))
        })
    }

    /// A request started: the connection is busy until the guard (kept by its response's
    /// body) is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        InFlight(Arc::clone(self))
    }
}

/// A request in flight on a connection.
pub(crate) struct InFlight(Arc<Connection>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The live connections, for making room.
#[derive(Default)]
struct Connections {
    live: Mutex<HashMap<u64, Arc<Connection>>>,
    next: AtomicU64,
}

impl Connections {
    /// Room for one more: the connection idle the longest is told to close when there are
    /// `most` already; false when none is idle.
    fn make_room(&self, most: usize) -> Option<bool> {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.len() < most {
            return None;
        }
        let idlest = live
            .iter()
            .filter_map(|(id, c)| c.idle_for().map(|idle| (idle, *id)))
            .max_by_key(|(idle, _)| *idle)
            .map(|(_, id)| id);
        // Out of the count at once: the next connection makes room elsewhere.
        match idlest.and_then(|id| live.remove(&id)) {
            Some(connection) => {
                connection.close.notify_one();
                Some(true)
            }
            None => Some(false),
        }
    }
}

/// A connection's reads stamp its activity.
struct Watched {
    stream: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.connection.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(&polled);
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Watched {
    /// A write that can't proceed starts the clock of a client that doesn't read; one that
    /// does stops it.
    fn wrote(&self, polled: &Poll<std::io::Result<usize>>) {
        let connection = &self.connection;
        match polled {
            Poll::Pending => {
                let now = connection.now_ms();
                let _ = connection.blocked.compare_exchange(
                    u64::MAX,
                    now,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            Poll::Ready(_) => connection.blocked.store(u64::MAX, Ordering::Release),
        }
    }
}

/// Waits until the connection's writes have been stuck for `timeout` (a client that stopped
/// reading).
async fn stuck(connection: &Connection, timeout: std::time::Duration) {
    let limit = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let period = (timeout / 4).max(std::time::Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        let since = connection.blocked.load(Ordering::Acquire);
        if since != u64::MAX && connection.now_ms().saturating_sub(since) >= limit {
            return;
        }
    }
}

/// Waits until the connection has been idle for `idle` (nothing in flight, nothing read).
async fn idle(connection: &Connection, idle: std::time::Duration) {
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX).max(1);
    loop {
        let last = connection.last.load(Ordering::Relaxed);
        let due = last.saturating_add(idle_ms);
        let now = connection.now_ms();
        if now < due {
            tokio::time::sleep(std::time::Duration::from_millis(due - now)).await;
            continue;
        }
        match connection.idle_for() {
            Some(quiet) if quiet >= idle_ms => return,
            // Busy: look again a period from now (its last activity moves when it ends).
            _ => tokio::time::sleep(idle).await,
        }
    }
}

/// The most connections the process's descriptors allow: its soft limit, raised to the hard
/// one, less room for upstream connections and the rest (each client connection may need one
/// upstream connection too).
pub(crate) fn descriptor_room() -> Option<usize> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return None;
            }
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max,
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit = raised;
                }
            }
        }
        let descriptors = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
        Some(descriptors.saturating_sub(64) / 2)
    }
    #[cfg(not(unix))]
    None
}

/// The clients' listener, bound, with the state its requests are served with.
pub(crate) struct Bound {
    pub(crate) listener: TcpListener,
    /// The first configuration's (for what outlives reloads: bounds, metrics, the drain).
    pub(crate) shared: Arc<Shared>,
    pub(crate) current: Arc<Current>,
}

impl Bound {
    /// Accepts connections until `shutdown` completes, then drains them within `drain` (see
    /// [`Proxy::serve`](crate::Proxy::serve)).
    pub(crate) async fn serve(
        self,
        shutdown: impl Future<Output = ()>,
        drain: Duration,
    ) -> Drained {
        let graceful = GracefulShutdown::new();
        let builder = connection_builder(&self.shared.bounds);
        let connections = Arc::new(Connections::default());
        let epoch = Instant::now();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                () = &mut shutdown => break,
            };
            let (stream, _peer) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, or a connection reset before it was accepted:
                    // wait a moment rather than spin.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let Some(stream) = self.room_for(&connections, stream) else {
                continue;
            };
            let connection = Arc::new(Connection::new(epoch));
            self.serve_connection(stream, connection, &connections, &builder, &graceful);
        }
        drop(self.listener);
        self.shared.draining.store(true, Ordering::Relaxed);
        self.shared.drain_started.notify_waiters();
        tracing::info!(deadline = ?drain, "draining: no new connections");
        match tokio::time::timeout(drain, graceful.shutdown()).await {
            Ok(()) => {
                tracing::info!("drained: every call finished");
                Drained::Clean
            }
            Err(_) => {
                tracing::warn!("the drain deadline passed: the calls still in flight are cut");
                Drained::Cut
            }
        }
    }

    /// `stream`, once there is room for it: past `max_connections` the connection idle the
    /// longest is closed; when none is idle, `stream` is answered 503 and closed (`None`).
    fn room_for(&self, connections: &Connections, mut stream: TcpStream) -> Option<TcpStream> {
        match connections.make_room(self.shared.bounds.max_connections) {
            None => {}
            Some(true) => self.shared.proxy_metrics.crowded_closed.increment(1),
            Some(false) => {
                self.shared.proxy_metrics.crowded_refused.increment(1);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        stream.write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\nretry-after: 1\r\n\r\n",
                        ),
                    )
                    .await;
                });
                return None;
            }
        }
        Some(stream)
    }

    /// Serves `stream`'s requests in a task of its own, watched (idle, stuck) until it closes.
    fn serve_connection(
        &self,
        stream: TcpStream,
        connection: Arc<Connection>,
        connections: &Arc<Connections>,
        builder: &auto::Builder<TokioExecutor>,
        graceful: &GracefulShutdown,
    ) {
        let _ = stream.set_nodelay(true);
        let id = connections.next.fetch_add(1, Ordering::Relaxed);
        connections
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&connection));
        let current = Arc::clone(&self.current);
        let watched = Arc::clone(&connection);
        let service = service_fn(move |request| {
            // Each request keeps the configuration in force when it came to its end.
            let shared = current.get();
            let in_flight = watched.start();
            async move { Ok::<_, Infallible>(handle(shared, request, Box::new(in_flight)).await) }
        });
        let io = Watched {
            stream,
            connection: Arc::clone(&connection),
        };
        let served = builder
            .serve_connection(TokioIo::new(io), service)
            .into_owned();
        let served = graceful.watch(served);
        let (connections, shared) = (Arc::clone(connections), Arc::clone(&self.shared));
        let bounds = &self.shared.bounds;
        let (idle_timeout, write_timeout) = (bounds.idle_timeout, bounds.write_timeout);
        tokio::spawn(async move {
            tokio::select! {
                _ = served => {}
                () = idle(&connection, idle_timeout) => {
                    shared.proxy_metrics.idle_closed.increment(1);
                }
                () = stuck(&connection, write_timeout) => {
                    shared.proxy_metrics.unread_closed.increment(1);
                }
                () = connection.close.notified() => {}
            }
            connections
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        });
    }
}

/// The connections' HTTP/1.1 and HTTP/2 settings.
fn connection_builder(bounds: &crate::config::Bounds) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Without a timer hyper enforces no header timeout: a client that sends half a head and
    // waits would hold its connection (and a descriptor) for ever.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .max_header_list_size(256 << 10);
    builder
}
