//! Real Redis servers on free loopback ports: one server ([`RedisServer`]), a cluster of 3
//! masters and 3 replicas ([`RedisCluster`]), or a master and replica watched by a sentinel
//! ([`Watched`]). Each is stopped when dropped.
//!
//! When `redis-server` is not installed, a starter says so and answers `None` (the test is
//! skipped), unless `TOLLGATE_REQUIRE_REDIS` is set (as `.ci/run` sets it): then it panics.
//! With `TOLLGATE_REDIS_CLUSTER` set, [`RedisServer::start`] starts a whole cluster instead,
//! so that the same tests run against a cluster.

mod cluster;
mod port;
mod sentinel;
mod server;

pub use cluster::{Node, RedisCluster, cli, cli_batch};
pub use port::free_port;
pub use sentinel::{MASTER, Watched, wait_for};
pub use server::{RedisServer, cluster_mode, resp, single_server_only};

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

/// What the script does inside Redis: `INFO commandstats` counts these too, but no client
/// sent them.
const SCRIPT_INSIDE: &[&str] = &[
    "hget",
    "hmget",
    "hset",
    "hdel",
    "hexists",
    "zadd",
    "zrem",
    "zrange",
    "zrangebyscore",
    "zrevrangebyscore",
    "zrevrange",
    "zcard",
    "zcount",
    "zrank",
    "del",
    "pexpire",
    "time",
];

/// How many commands clients have sent the server at `url` so far, from `INFO commandstats`
/// (the `INFO` asking excluded, and the commands a script runs inside the server too).
pub async fn client_commands(url: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let client = ::redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            if name == "info" || SCRIPT_INSIDE.contains(&name) {
                return None;
            }
            stats
                .split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}
