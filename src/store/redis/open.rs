//! Making a [`RedisStore`]: one server, a cluster, or the master a set of sentinels watches.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::connection::{self, ClusterLink, Connection};
use super::url::{self, Shown};
use super::{Inner, RedisConfig, RedisStore, fail, script};
use crate::error::Error;

impl RedisStore {
    /// Connects with the default [`RedisConfig`], checking that the server answers.
    ///
    /// `url` is `redis://[user:password@]host[:port][/db]`, `rediss://` for TLS (with the
    /// `redis-tls` feature; see [`RedisConfig::with_tls_ca_file`] for a private CA),
    /// `redis+unix:///path?db=N&pass=...`, or the `valkey` forms of these. The password never
    /// appears in an error or a log.
    pub async fn connect(url: &str) -> Result<RedisStore, Error> {
        RedisStore::connect_with(url, RedisConfig::default()).await
    }

    /// Connects with `config`, checking that the server answers within its timeout.
    ///
    /// A `redis+cluster://` (or `rediss+cluster://`) address names a Redis Cluster by some of
    /// its nodes: `redis+cluster://[user:password@]host:port,host:port[/?query]`, the same as
    /// [`connect_cluster_with`](RedisStore::connect_cluster_with) with `redis://` URLs. A
    /// `redis+sentinel://host:port[,host:port...]/<master>` address names the master a set of
    /// sentinels watches, and follows it through failovers (see the
    /// [module docs](super#redis-sentinel)).
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<RedisStore, Error> {
        if let Some(nodes) = connection::cluster_nodes(url) {
            return RedisStore::connect_cluster_with(&nodes, config).await;
        }
        let store = RedisStore::lazy(url, config)?;
        store.load_script().await?;
        Ok(store)
    }

    /// Connects to a Redis Cluster through any of `nodes` (URLs of some of its nodes, like
    /// `redis://10.0.0.1:7000`), with the default [`RedisConfig`].
    ///
    /// Each key's state lives in one slot (its hash and queue share a hash tag), and different
    /// keys spread over the slots. See the [module docs](super#redis-cluster) for what a
    /// failover means for the limits.
    pub async fn connect_cluster<U: AsRef<str>>(nodes: &[U]) -> Result<RedisStore, Error> {
        RedisStore::connect_cluster_with(nodes, RedisConfig::default()).await
    }

    /// Connects to a Redis Cluster through any of `nodes`, with `config`, checking that the
    /// cluster answers within its timeout.
    pub async fn connect_cluster_with<U: AsRef<str>>(
        nodes: &[U],
        config: RedisConfig,
    ) -> Result<RedisStore, Error> {
        let nodes: Vec<String> = nodes.iter().map(|n| n.as_ref().to_owned()).collect();
        let shown = Shown::all(&nodes);
        if nodes.is_empty() {
            return Err(Error::store(
                "a Redis Cluster needs at least one node's URL",
                None,
            ));
        }
        let client = cluster_client(&nodes, &config).map_err(|reason| {
            Error::store(
                format!("Redis Cluster at `{}`: {}", shown.url, shown.scrub(&reason)),
                None,
            )
        })?;
        let connection =
            match tokio::time::timeout(config.timeout, client.get_async_connection()).await {
                Ok(Ok(connection)) => connection,
                Ok(Err(e)) => return Err(fail(&shown, "could not connect", e)),
                Err(_) => {
                    return Err(Error::unavailable(
                        format!(
                            "Redis Cluster at `{}`: connecting timed out: no answer within {:?}",
                            shown.url, config.timeout
                        ),
                        None,
                    ));
                }
            };
        let store = RedisStore {
            inner: Arc::new(Inner {
                connection: Connection::Cluster(Arc::new(ClusterLink::new(
                    client,
                    connection,
                    config.timeout,
                ))),
                script: Script::new(&script::LUA),
                config,
                shown,
            }),
        };
        store.load_script().await?;
        Ok(store)
    }

    /// Loads the script, which also shows that the server answers. Without it the first calls
    /// all find the script missing at once, and each loads it (after a restart or a
    /// `SCRIPT FLUSH` that still happens, once per call in flight).
    async fn load_script(&self) -> Result<(), Error> {
        let mut connection = self.inner.connection.clone();
        self.bounded(
            "loading the script",
            self.inner.script.load_async(&mut connection),
        )
        .await
        .map(|_| ())
    }

    /// A store that connects on first use (and reconnects by itself after failures): for
    /// programs that start before their Redis does.
    ///
    /// Must be called inside a tokio runtime, where the connection's background task runs;
    /// outside one it is an error (not a panic).
    pub fn lazy(url: &str, config: RedisConfig) -> Result<RedisStore, Error> {
        if let Some(nodes) = connection::cluster_nodes(url) {
            return Err(Error::store(
                format!(
                    "Redis Cluster at `{}`: a cluster is reached with RedisStore::connect, which learns its slots",
                    Shown::all(&nodes).url
                ),
                None,
            ));
        }
        if url.starts_with("rediss+sentinel://") || url.starts_with("valkeys+sentinel://") {
            return Err(Error::store(
                "Redis Sentinel over TLS is not supported yet: use redis+sentinel://",
                None,
            ));
        }
        let sentinel = connection::sentinel_address(url);
        let shown = match &sentinel {
            Some(Ok(_)) if url::ambiguous(url) => Shown::unreadable(url),
            Some(Ok(address)) => Shown::sentinel(address),
            Some(Err(_)) => Shown::unreadable(url),
            None => Shown::new(url),
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::store(
                format!(
                    "Redis at `{}`: a RedisStore needs a tokio runtime; make it inside one",
                    shown.url
                ),
                None,
            ));
        }
        if let Some(address) = sentinel {
            let link = address
                .and_then(|address| sentinel_link(&address, &config))
                .map_err(|reason| {
                    Error::store(
                        format!(
                            "Redis Sentinel at `{}`: {}",
                            shown.url,
                            shown.scrub(&reason)
                        ),
                        None,
                    )
                })?;
            return Ok(RedisStore {
                inner: Arc::new(Inner {
                    connection: Connection::Sentinel(Arc::new(link)),
                    script: Script::new(&script::LUA),
                    config,
                    shown,
                }),
            });
        }
        let client = open_client(url, &config).map_err(|reason| {
            Error::store(
                format!("Redis at `{}`: {}", shown.url, shown.scrub(&reason)),
                None,
            )
        })?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let connection = ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| fail(&shown, "could not set up the connection", e))?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                connection: Connection::Single(connection),
                script: Script::new(&script::LUA),
                config,
                shown,
            }),
        })
    }
}

/// A client for `url`, trusting `config`'s CA file when one is given.
fn open_client(url: &str, config: &RedisConfig) -> Result<redis::Client, String> {
    #[cfg(feature = "redis-tls")]
    {
        // rustls needs a process-wide crypto provider; ring is the one this crate brings. An
        // application that installed its own keeps it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if let Some(path) = &config.tls_ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("could not read the CA file `{}`: {e}", path.display()))?;
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            return redis::Client::build_with_tls(url, certificates)
                .map_err(|e| format!("invalid Redis URL or CA: {e}"));
        }
    }
    #[cfg(not(feature = "redis-tls"))]
    if config.tls_ca_file.is_some() || url.starts_with("rediss://") || url.starts_with("valkeys://")
    {
        return Err("TLS (rediss:// or a CA file) needs tollgate's `redis-tls` feature".to_owned());
    }
    redis::Client::open(url).map_err(|e| format!("invalid Redis URL: {e}"))
}

/// What asks `address`'s sentinels for their master. Each connection to a master gets nine
/// tenths of the store's timeout to connect and to answer, so that a master that stopped
/// answering is given up (and the sentinels asked again) before the call's own timeout ends.
fn sentinel_link(
    address: &connection::SentinelAddress,
    config: &RedisConfig,
) -> Result<connection::SentinelLink, String> {
    use redis::IntoConnectionInfo;
    use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
    if config.tls_ca_file.is_some() {
        return Err("Redis Sentinel over TLS is not supported yet".to_owned());
    }
    let node = address
        .node
        .as_str()
        .into_connection_info()
        .map_err(|e| format!("invalid credentials or database for the master: {e}"))?;
    let db = node.redis_settings().db();
    let node = SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(node.redis_settings().clone());
    let client = SentinelClient::build(
        address.sentinels.clone(),
        address.master.clone(),
        Some(node),
        SentinelServerType::Master,
    )
    .map_err(|e| format!("invalid sentinel address: {e}"))?;
    let patience = config.timeout.mul_f64(0.9);
    let connection = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(patience))
        .set_response_timeout(Some(patience));
    Ok(connection::SentinelLink::new(client, connection, db))
}

/// A cluster client for `nodes`: each call bounded by the store's timeout, redirects and a
/// failover's refusals retried a few times within it.
fn cluster_client(
    nodes: &[String],
    config: &RedisConfig,
) -> Result<redis::cluster::ClusterClient, String> {
    #[cfg(not(feature = "redis-tls"))]
    if config.tls_ca_file.is_some() || nodes.iter().any(|n| n.starts_with("rediss://")) {
        return Err("TLS (rediss:// or a CA file) needs tollgate's `redis-tls` feature".to_owned());
    }
    #[allow(unused_mut)] // with TLS a CA may be added
    let mut builder = redis::cluster::ClusterClient::builder(nodes.to_vec())
        .connection_timeout(config.timeout)
        .response_timeout(config.timeout)
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(200);
    #[cfg(feature = "redis-tls")]
    {
        let _ = rustls::crypto::ring::default_provider().install_default();
        if let Some(path) = &config.tls_ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("could not read the CA file `{}`: {e}", path.display()))?;
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            });
        }
    }
    builder
        .build()
        .map_err(|e| format!("invalid Redis Cluster URLs: {e}"))
}
