//! The proxy as a program or a test runs it: bound to its addresses and connected to its store
//! ([`Proxy::bind`]), serving until told to stop and then draining ([`Proxy::serve`], or in a
//! task of its own, [`Running`]), its configuration reloaded while it serves ([`Reloader`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tollgate::MemoryStore;
use tollgate::store::AnyStore;

use crate::accept::{Bound, Drained};
use crate::config::Config;
use crate::state::{Current, Lasting, ReloadError, Shared, StartError};

/// A proxy bound to its address, not yet serving.
pub struct Proxy {
    /// The clients' listener.
    bound: Bound,
    /// The operators' live view (`admin_listen`), when configured.
    admin: Option<TcpListener>,
    drain: std::time::Duration,
}

impl Proxy {
    /// Binds `config.listen` and connects to the store (Redis, when `config.redis` is set).
    pub async fn bind(config: Config) -> Result<Proxy, StartError> {
        let (store, records): (AnyStore, _) = match &config.redis {
            Some(url) => {
                let store = tollgate::store::redis::RedisStore::connect(url)
                    .await
                    .map_err(|e| StartError(crate::config::masked(&format!("redis: {e}"))))?;
                (store.clone().into(), Some(store))
            }
            None => (MemoryStore::new().into(), None),
        };
        let mut config = config;
        if let Some(room) = crate::accept::descriptor_room()
            && room < config.bounds.max_connections
        {
            tracing::warn!(
                configured = config.bounds.max_connections,
                room,
                "max_connections is more than the process's descriptors allow; lowered (raise `ulimit -n`)"
            );
            config.bounds.max_connections = room.max(1);
        }
        let lasting = Arc::new(Lasting::new(&config, store, records));
        let current = Arc::new(Current::new(Shared::new(&config, &lasting, 0)?));
        let shared = current.get();
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| StartError(format!("listen on {}: {e}", config.listen)))?;
        let admin = match config.admin_listen {
            Some(addr) => Some({
                if !addr.ip().is_loopback() {
                    tracing::warn!(
                        %addr,
                        "the live view (admin_listen) has no authentication and listens beyond this host: keep it behind a firewall"
                    );
                }
                TcpListener::bind(addr)
                    .await
                    .map_err(|e| StartError(format!("admin_listen on {addr}: {e}")))?
            }),
            None => None,
        };
        Ok(Proxy {
            bound: Bound {
                listener,
                shared,
                current,
            },
            admin,
            drain: config.drain,
        })
    }

    /// The address it listens on (the port the system chose, for `:0`).
    pub fn local_addr(&self) -> SocketAddr {
        self.bound
            .listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The address of the operators' live view, when `admin_listen` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then drains: no new connection is accepted,
    /// `/healthz` and `/readyz` answer 503, a request still sending its body is answered 503,
    /// idle connections are closed, and calls in flight (streams included) run on until they
    /// end or the drain deadline passes.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Drained {
        // The live view serves until the drain ends (an operator watches the drain on it).
        let _admin = self.admin.map(|listener| {
            AbortOnDrop(tokio::spawn(crate::admin::serve(
                listener,
                Arc::clone(&self.bound.current),
            )))
        });
        self.bound.serve(shutdown, self.drain).await
    }

    /// What reloads the configuration while the proxy serves.
    pub fn reloader(&self) -> Reloader {
        Reloader(Arc::clone(&self.bound.current))
    }

    /// Serves in a task of its own: for tests and embedding.
    pub fn spawn(self) -> Running {
        let addr = self.local_addr();
        let admin = self.admin_addr();
        let reloader = self.reloader();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(self.serve(async move {
            let _ = stopped.await;
        }));
        Running {
            addr,
            admin,
            reloader,
            stop: Some(stop),
            task,
        }
    }
}

/// Reloads a serving proxy's configuration (what SIGHUP does to the binary).
///
/// ```no_run
/// # async fn f(running: tollgate_proxy::Running) -> Result<(), Box<dyn std::error::Error>> {
/// let config = tollgate_proxy::Config::from_file("proxy.toml".as_ref())?;
/// running.reloader.reload(config).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Reloader(Arc<Current>);

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reloader")
    }
}

impl Reloader {
    /// Puts `config` in force: calls in flight finish on the old one; keys whose limits did
    /// not change keep their levels; keys whose limits changed start from the new limits,
    /// never above what they held; virtual keys added work at once and revoked ones are
    /// refused. A configuration that can't be used is refused (its errors returned and
    /// logged) and the one in force stays. The listeners, the store, the connection bounds
    /// and the drain take a restart (kept, with a warning). Answers how many keys' levels were
    /// carried over.
    pub async fn reload(&self, config: Config) -> Result<usize, ReloadError> {
        let reloaded = self.0.reload(config).await;
        if let Err(err) = &reloaded {
            tracing::error!(error = %err, "reload refused");
        }
        reloaded
    }
}

/// A task ended when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A proxy serving in a task.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where the operators' live view listens (`admin_listen`), if anywhere.
    pub admin: Option<SocketAddr>,
    /// Reloads its configuration.
    pub reloader: Reloader,
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
