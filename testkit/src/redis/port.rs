//! Free loopback ports for the servers the tests start, and whether the server that answers on
//! one is the process the test started (another test may have taken the port).

use std::net::TcpListener;

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Whether an `INFO server` reply is from process `pid`.
pub(super) fn is_process(info: &str, pid: u32) -> bool {
    let line = format!("process_id:{pid}");
    info.lines().any(|l| l.trim() == line)
}
