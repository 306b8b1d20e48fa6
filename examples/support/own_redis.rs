//! A redis-server of the example's own on a free loopback port, for when no `--redis URL` is
//! given; it is killed when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tollgate::store::redis::RedisStore;

pub struct OwnRedis(Child);

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The URL to use: `given`, or that of a server started now (and answering) for this run.
pub async fn given_or_own(given: Option<String>) -> Result<(String, Option<OwnRedis>), String> {
    if let Some(url) = given {
        return Ok((url, None));
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("could not start redis-server ({e}); install it or pass --redis URL")
        })?;
    let own = OwnRedis(child);
    let url = format!("redis://127.0.0.1:{port}");
    // Wait until it answers (a process starting, not a measurement).
    for _ in 0..200 {
        if RedisStore::connect(&url).await.is_ok() {
            return Ok((url, Some(own)));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!(
        "the redis-server started on port {port} did not answer"
    ))
}
