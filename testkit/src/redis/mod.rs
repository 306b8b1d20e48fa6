//! Real Redis servers on free loopback ports: one server ([`RedisServer`]), a cluster of 3
//! masters and 3 replicas ([`RedisCluster`]), or a master and replica watched by a sentinel
//! ([`Watched`]). Each is stopped when dropped.
//!
//! When `redis-server` is not installed, a starter says so and answers `None` (the test is
//! skipped), unless `TOLLGATE_REQUIRE_REDIS` is set (as `.ci/run` sets it): then it panics.
//! With `TOLLGATE_REDIS_CLUSTER` set, [`RedisServer::start`] starts a whole cluster instead,
//! so that the same tests run against a cluster.

mod cluster;
mod sentinel;
mod server;

pub use cluster::{Node, RedisCluster, cli, cli_batch};
pub use sentinel::{MASTER, Watched, wait_for};
pub use server::{RedisServer, cluster_mode, free_port, resp, single_server_only};

/// For examples: the URL to use, `given`, or that of a server of the example's own started
/// now (and answering), kept alive by the returned guard.
pub fn given_or_own(given: Option<String>) -> Result<(String, Option<RedisServer>), String> {
    if let Some(url) = given {
        return Ok((url, None));
    }
    match RedisServer::start() {
        Some(server) => Ok((server.url(), Some(server))),
        None => Err("redis-server is not installed: install it, or pass --redis URL".to_owned()),
    }
}
