//! The listener: accepts connections (HTTP/1.1 and HTTP/2), serves each request, and on
//! shutdown stops accepting and lets the calls in flight finish, up to a deadline.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tollgate::{MemoryStore, Registry};

use crate::config::Config;
use crate::proxy::{Shared, StartError, handle};

/// The longest a client may take to send a request's head (and, on a kept-alive connection,
/// the next one's) before its connection is closed.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A proxy bound to its address, not yet serving.
pub struct Proxy {
    listener: TcpListener,
    shared: Arc<Shared>,
    drain: std::time::Duration,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every call in flight finished.
    Clean,
    /// The deadline passed with calls still in flight; they were cut.
    Cut,
}

impl Proxy {
    /// Binds `config.listen` and connects to the store (Redis, when `config.redis` is set).
    pub async fn bind(config: Config) -> Result<Proxy, StartError> {
        let registry = match &config.redis {
            Some(url) => {
                let store = tollgate::store::redis::RedisStore::connect(url)
                    .await
                    .map_err(|e| StartError(format!("redis: {e}")))?;
                Registry::new(store)
            }
            None => Registry::new(MemoryStore::new()),
        };
        let shared = Arc::new(Shared::new(&config, Arc::new(registry))?);
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| StartError(format!("listen on {}: {e}", config.listen)))?;
        Ok(Proxy {
            listener,
            shared,
            drain: config.drain,
        })
    }

    /// The address it listens on (the port the system chose, for `:0`).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` completes, then drains: no new connection is accepted,
    /// `/healthz` answers 503, and calls in flight (streams included) run on until they end
    /// or the drain deadline passes.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Drained {
        let graceful = GracefulShutdown::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // Without a timer hyper enforces no header timeout: a client that sends half a head
        // and waits would hold its connection (and a descriptor) for ever.
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        builder.http2().timer(TokioTimer::new());
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
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let shared = Arc::clone(&self.shared);
            let service = service_fn(move |request| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(handle(shared, request).await) }
            });
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .into_owned();
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
        drop(self.listener);
        self.shared.draining.store(true, Ordering::Relaxed);
        tracing::info!(deadline = ?self.drain, "draining: no new connections");
        match tokio::time::timeout(self.drain, graceful.shutdown()).await {
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

    /// Serves in a task of its own: for tests and embedding.
    pub fn spawn(self) -> Running {
        let addr = self.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(self.serve(async move {
            let _ = stopped.await;
        }));
        Running {
            addr,
            stop: Some(stop),
            task,
        }
    }
}

/// A proxy serving in a task.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Drained>,
}

impl Running {
    /// Its base URL for OpenAI-style clients: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Starts the drain (as SIGTERM does) and waits for it to end.
    pub async fn shutdown(mut self) -> Drained {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.unwrap_or(Drained::Cut)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}
