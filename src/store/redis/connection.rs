//! One server or a whole Redis Cluster, behind one connection type.
//!
//! A single server is reached through redis-rs's `ConnectionManager` (one multiplexed
//! connection, re-established in the background). A cluster is reached through redis-rs's
//! cluster client, which learns the slot map from any node given, sends each script call to
//! the master of its key's slot (a key's hash and queue share one hash tag, so one slot), and
//! follows `MOVED` and failovers by refreshing the map.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
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
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
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

#[cfg(test)]
mod tests {
    use super::cluster_nodes;

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
