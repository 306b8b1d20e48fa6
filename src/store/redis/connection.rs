//! One server, a master watched by Sentinel, or a whole Redis Cluster, behind one connection
//! type.
//!
//! A single server is reached through redis-rs's `ConnectionManager` (one multiplexed
//! connection, re-established in the background). A master watched by Sentinel is asked of
//! the sentinels, and asked again whenever the connection to the one they named fails or
//! answers that it is a replica now, so the store follows a failover (the manager would
//! reconnect to the address it first resolved). A cluster is reached through redis-rs's
//! cluster client, which learns the slot map from any node given, sends each script call to
//! the master of its key's slot (a key's hash and queue share one hash tag, so one slot), and
//! follows `MOVED` and failovers by refreshing the map. The cluster client's connections are
//! tasks of the runtime that made them; when one of its calls finds them gone (that runtime
//! shut down, or the client gave up on every node), the next call makes a new cluster
//! connection on the runtime it runs on, so a cluster store outlives the runtime that
//! connected it as a single-server store does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};

#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Sentinel(Arc<SentinelLink>),
    Cluster(Arc<ClusterLink>),
}

/// The connection in use, numbered so that a failure seen on an older one doesn't throw away
/// its successor.
struct Current<C> {
    current: Mutex<Option<(u64, C)>>,
    made: AtomicU64,
}

impl<C: Clone> Current<C> {
    fn new() -> Self {
        Current {
            current: Mutex::new(None),
            made: AtomicU64::new(0),
        }
    }

    fn get(&self) -> Option<(u64, C)> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, connection: C) -> (u64, C) {
        let number = self.made.fetch_add(1, Ordering::Relaxed);
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((number, connection.clone()));
        (number, connection)
    }

    /// Forgets connection `number`, if it is still the one in use.
    fn forget(&self, number: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|(n, _)| *n == number) {
            *current = None;
        }
    }
}

/// Whether a cluster connection refused `error`'s command before sending it, its tasks gone
/// (what redis-rs's cluster connection answers when its runtime has shut down). A command that
/// may have reached a server is never sent again: the script is not idempotent.
fn never_sent(error: &RedisError) -> bool {
    error.is_connection_dropped() && error.to_string().contains("Unable to send command")
}

/// A Redis Cluster's client, and its connection while that connection's tasks run.
pub(super) struct ClusterLink {
    client: ClusterClient,
    current: Current<ClusterConnection>,
    /// One caller connects at a time; the others then take what it made.
    connecting: tokio::sync::Mutex<()>,
    timeout: Duration,
}

impl ClusterLink {
    /// A link whose first connection, `connection`, was made by `client`.
    pub(super) fn new(
        client: ClusterClient,
        connection: ClusterConnection,
        timeout: Duration,
    ) -> Self {
        let current = Current::new();
        current.set(connection);
        ClusterLink {
            client,
            current,
            connecting: tokio::sync::Mutex::new(()),
            timeout,
        }
    }

    async fn connection(&self) -> RedisResult<(u64, ClusterConnection)> {
        if let Some(found) = self.current.get() {
            return Ok(found);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(found) = self.current.get() {
            return Ok(found);
        }
        let connection = tokio::time::timeout(self.timeout, self.client.get_async_connection())
            .await
            .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
        Ok(self.current.set(connection))
    }

    /// After `error` on connection `number`: a connection whose tasks are gone answers every
    /// call with a broken pipe; the next call makes a new one.
    fn failed(&self, number: u64, error: &RedisError) {
        if error.is_connection_dropped() {
            self.current.forget(number);
        }
    }

    /// Whether the command that failed with `error` on connection `number` never left (its
    /// tasks were gone): then the connection is forgotten, and a new one sends it, once.
    fn never_left(&self, number: u64, error: &RedisError) -> bool {
        let never = never_sent(error);
        if never {
            self.current.forget(number);
        }
        never
    }
}

/// The master a set of sentinels names, and the connection to it while it answers.
pub(super) struct SentinelLink {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the master last named.
    current: Current<MultiplexedConnection>,
    config: AsyncConnectionConfig,
    db: i64,
}

impl SentinelLink {
    pub(super) fn new(sentinel: SentinelClient, config: AsyncConnectionConfig, db: i64) -> Self {
        SentinelLink {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Current::new(),
            config,
            db,
        }
    }

    /// The connection to the master, asking the sentinels which one that is when there is
    /// none. One caller asks at a time; the others then take what it found.
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(found) = self.current.get() {
            return Ok(found);
        }
        let mut sentinel = self.sentinel.lock().await;
        if let Some(found) = self.current.get() {
            return Ok(found);
        }
        let client = sentinel.async_get_client().await?;
        let connection = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok(self.current.set(connection))
    }

    /// After `error` on connection `number`: a master that can't be reached, or that says it
    /// is a replica now, is asked of the sentinels again at the next call.
    fn failed(&self, number: u64, error: &RedisError) {
        let lost = error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || matches!(
                error.kind(),
                ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
            );
        if lost {
            self.current.forget(number);
        }
    }

    /// A command through a sentinel's master is never sent twice.
    fn never_left(&self, _number: u64, _error: &RedisError) -> bool {
        false
    }
}

/// Sends a command (or pipeline) through `link`'s connection to its server, as `send` says on
/// the connection `c`, and tells the link of a failure (which may make it connect anew at the
/// next call). A command that never left (the link's `never_left`) goes once more, on a new
/// connection. One way for the Sentinel's and the Cluster's links alike.
macro_rules! through {
    ($link:expr, |$c:ident| $send:expr) => {{
        let link = $link;
        let (number, mut $c) = link.connection().await?;
        let mut result = $send.await;
        if let Err(error) = &result {
            if link.never_left(number, error) {
                let (number, mut $c) = link.connection().await?;
                result = $send.await;
                if let Err(error) = &result {
                    link.failed(number, error);
                }
            } else {
                link.failed(number, error);
            }
        }
        result
    }};
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Sentinel(link) => {
                Box::pin(async move { through!(&**link, |c| c.req_packed_command(cmd)) })
            }
            Connection::Cluster(link) => {
                Box::pin(async move { through!(&**link, |c| c.req_packed_command(cmd)) })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(link) => Box::pin(async move {
                through!(&**link, |c| c.req_packed_commands(pipeline, offset, count))
            }),
            Connection::Cluster(link) => Box::pin(async move {
                through!(&**link, |c| c.req_packed_commands(pipeline, offset, count))
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Sentinel(link) => link.db,
            Connection::Cluster(_) => 0,
        }
    }
}

/// The seed nodes of a `redis+cluster://` (or `rediss+cluster://`) address: `[userinfo@]` then
/// comma-separated `host:port`s, then an optional `/db` or `?query` that applies to each.
/// `None` for any other scheme.
pub(super) fn cluster_nodes(address: &str) -> Option<Vec<String>> {
    let (scheme, rest) = if let Some(rest) = address.strip_prefix("redis+cluster://") {
        ("redis", rest)
    } else {
        ("rediss", address.strip_prefix("rediss+cluster://")?)
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    Some(
        hosts
            .split(',')
            .map(|host| format!("{scheme}://{userinfo}{}{tail}", host.trim()))
            .collect(),
    )
}

/// A `redis+sentinel://` address, read.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct SentinelAddress {
    /// A `redis://host:port` URL for each sentinel.
    pub(super) sentinels: Vec<String>,
    /// The name the sentinels watch the master under.
    pub(super) master: String,
    /// `redis://[userinfo@]<first sentinel>[/db][?query]`: the credentials, database and
    /// options for the master, in a URL that redis-rs (and the redactor) can read.
    pub(super) node: String,
}

/// Reads `redis+sentinel://[user:password@]host:port[,host:port...]/<master>[/<db>][?query]`
/// (or `valkey+sentinel://`): `None` for any other scheme, an error saying what is missing
/// for one of this scheme that can't be read. The credentials, database and query are the
/// master's; the sentinels are asked without credentials.
pub(super) fn sentinel_address(address: &str) -> Option<Result<SentinelAddress, String>> {
    let rest = address
        .strip_prefix("redis+sentinel://")
        .or_else(|| address.strip_prefix("valkey+sentinel://"))?;
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    // The master's name follows the last `@`-free `/` after the hosts; a password may hold
    // a `/`, so the hosts start after the last `@`.
    let (userinfo, hosts_and_path) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let Some((hosts, path)) = hosts_and_path.split_once('/') else {
        return Some(Err(
            "a Sentinel address names the master after the hosts: redis+sentinel://host:port/mymaster".to_owned(),
        ));
    };
    let (master, db) = path.split_once('/').unwrap_or((path, ""));
    if master.is_empty() {
        return Some(Err(
            "a Sentinel address names the master after the hosts: redis+sentinel://host:port/mymaster".to_owned(),
        ));
    }
    if !db.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Err(
            "the database after the master's name is a number".to_owned()
        ));
    }
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .map(|host| format!("redis://{host}"))
        .collect();
    if hosts.split(',').any(|h| h.trim().is_empty()) {
        return Some(Err(
            "a Sentinel address needs at least one host:port".to_owned()
        ));
    }
    let first = hosts.split(',').next().unwrap_or("").trim();
    let mut node = format!("redis://{userinfo}{first}");
    if !db.is_empty() {
        node.push('/');
        node.push_str(db);
    }
    if let Some(query) = query {
        node.push('?');
        node.push_str(query);
    }
    Some(Ok(SentinelAddress {
        sentinels,
        master: master.to_owned(),
        node,
    }))
}

#[cfg(test)]
mod tests {
    use super::{SentinelAddress, cluster_nodes, sentinel_address};

    #[test]
    fn a_sentinel_address_names_the_sentinels_the_master_and_its_credentials() {
        assert_eq!(
            sentinel_address("redis+sentinel://:pw@a:26379,b:26380/mymaster/2?protocol=resp3"),
            Some(Ok(SentinelAddress {
                sentinels: vec!["redis://a:26379".to_owned(), "redis://b:26380".to_owned()],
                master: "mymaster".to_owned(),
                node: "redis://:pw@a:26379/2?protocol=resp3".to_owned(),
            }))
        );
        assert_eq!(
            sentinel_address("valkey+sentinel://h:1/m"),
            Some(Ok(SentinelAddress {
                sentinels: vec!["redis://h:1".to_owned()],
                master: "m".to_owned(),
                node: "redis://h:1".to_owned(),
            }))
        );
        for missing in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel:///m",
            "redis+sentinel://h:1,/m",
            "redis+sentinel://h:1/m/x",
        ] {
            assert!(
                matches!(sentinel_address(missing), Some(Err(_))),
                "{missing}"
            );
        }
        assert_eq!(sentinel_address("redis://h:1/0"), None);
    }

    #[test]
    fn a_cluster_address_names_each_seed_node_with_the_same_credentials() {
        assert_eq!(
            cluster_nodes("redis+cluster://:pw@a:7000,b:7001/?protocol=resp3"),
            Some(vec![
                "redis://:pw@a:7000/?protocol=resp3".to_owned(),
                "redis://:pw@b:7001/?protocol=resp3".to_owned(),
            ])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://h:1"),
            Some(vec!["rediss://h:1".to_owned()])
        );
        assert_eq!(cluster_nodes("redis://h:1"), None);
    }
}
