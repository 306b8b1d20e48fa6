//! The other side of a proxy, playing unfair: an upstream that answers by a script of raw
//! bytes and pauses (or not at all), and a client that writes raw bytes at its own pace.
//! Written so that the next finding is a few lines.
//!
//! ```ignore
//! // An upstream that sends a head and then nothing: a proxy must cut it.
//! let upstream = HostileUpstream::start(|_, _| vec![
//!     Step::Write(head(200, &[("content-type", "text/event-stream")])),
//!     Step::Hold,
//! ]).await;
//! // A client that sends a request's head and one byte of body every 5 s.
//! let answer = Hostile::new(proxy.addr).trickle(b"POST /v1/chat/completions ...", b"{...}", 5s).await;
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One thing a hostile upstream does.
#[derive(Debug, Clone)]
pub enum Step {
    /// Writes these bytes.
    Write(Vec<u8>),
    /// Waits this long.
    Sleep(Duration),
    /// Keeps the connection open and says nothing more, for ever.
    Hold,
    /// Closes the connection (also what happens after the last step).
    Close,
}

/// A request as the hostile upstream read it.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// The request line and headers, as text.
    pub head: String,
    /// The path and query.
    pub path: String,
    /// The body, read by `content-length` or chunked encoding.
    pub body: Vec<u8>,
}

impl Received {
    /// A header's value (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The body as JSON (`Null` if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

type Script = dyn Fn(usize, &Received) -> Vec<Step> + Send + Sync;

/// An upstream that answers each request (numbered from 0) by a script of raw steps, one
/// request a connection, and remembers what it read.
pub struct HostileUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Every request read, in order.
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Answers whose writing failed: the other side hung up before the script's end.
    pub broken: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HostileUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HostileUpstream {
    /// Starts it on a free loopback port.
    pub async fn start(
        script: impl Fn(usize, &Received) -> Vec<Step> + Send + Sync + 'static,
    ) -> HostileUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("an address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let broken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let script: Arc<Script> = Arc::new(script);
        let task = {
            let received = Arc::clone(&received);
            let broken = Arc::clone(&broken);
            tokio::spawn(async move {
                loop {
                    let Ok((mut stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (received, script) = (Arc::clone(&received), Arc::clone(&script));
                    let broken = Arc::clone(&broken);
                    tokio::spawn(async move {
                        let Ok(request) = read_request(&mut stream).await else {
                            return;
                        };
                        let n = {
                            let mut all = received.lock().expect("not poisoned");
                            all.push(request.clone());
                            all.len() - 1
                        };
                        for step in script(n, &request) {
                            match step {
                                Step::Write(bytes) => {
                                    if stream.write_all(&bytes).await.is_err() {
                                        broken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                        return;
                                    }
                                    let _ = stream.flush().await;
                                }
                                Step::Sleep(wait) => tokio::time::sleep(wait).await,
                                Step::Hold => {
                                    // Read (and drop) whatever comes, until the other side
                                    // closes: a connection held open, saying nothing.
                                    let mut sink = [0u8; 4096];
                                    while let Ok(n) = stream.read(&mut sink).await {
                                        if n == 0 {
                                            break;
                                        }
                                    }
                                    return;
                                }
                                Step::Close => break,
                            }
                        }
                        let _ = stream.shutdown().await;
                    });
                }
            })
        };
        HostileUpstream {
            addr,
            received,
            broken,
            task,
        }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests it read.
    pub fn count(&self) -> usize {
        self.received.lock().expect("not poisoned").len()
    }

    /// The `n`th request it read.
    pub fn request(&self, n: usize) -> Received {
        self.received.lock().expect("not poisoned")[n].clone()
    }
}

/// A response's head: status line and headers, with `connection: close`.
pub fn head(status: u16, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} X\r\nconnection: close\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// A whole JSON response.
pub fn json(status: u16, headers: &[(&str, &str)], body: &serde_json::Value) -> Vec<u8> {
    let body = body.to_string();
    let length = body.len().to_string();
    let mut all: Vec<(&str, &str)> = vec![
        ("content-type", "application/json"),
        ("content-length", &length),
    ];
    all.extend_from_slice(headers);
    let mut out = head(status, &all);
    out.extend_from_slice(body.as_bytes());
    out
}

/// The head of a server-sent event stream (no length: the body ends when the connection
/// closes).
pub fn stream_head(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut all: Vec<(&str, &str)> = vec![("content-type", "text/event-stream")];
    all.extend_from_slice(headers);
    head(200, &all)
}

/// One server-sent event carrying `data` as JSON.
pub fn event(data: &serde_json::Value) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

/// Reads one request: head, then body by `content-length` or chunked encoding.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Received> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
    let mut request = Received {
        head,
        path,
        body: Vec::new(),
    };
    let mut rest = buffer[head_end..].to_vec();
    let chunked = request
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    if chunked {
        loop {
            let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                rest.extend_from_slice(&chunk[..n]);
                continue;
            };
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..line_end]).trim(), 16)
                .unwrap_or(0);
            while rest.len() < line_end + 2 + size + 2 {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(request);
                }
                rest.extend_from_slice(&chunk[..n]);
            }
            request
                .body
                .extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    } else {
        let length: usize = request
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while rest.len() < length {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&chunk[..n]);
        }
        rest.truncate(length);
        request.body = rest;
    }
    Ok(request)
}

/// A client that writes raw bytes at its own pace, and watches when the server hangs up.
#[derive(Debug, Clone, Copy)]
pub struct Hostile {
    addr: SocketAddr,
}

impl Hostile {
    /// A hostile client of the server at `addr`.
    pub fn new(addr: SocketAddr) -> Hostile {
        Hostile { addr }
    }

    /// Opens a connection that sends nothing.
    pub async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr)
            .await
            .expect("the server accepts")
    }

    /// Writes `bytes` on a new connection and reads what comes back until the server closes
    /// it or `within` passes.
    pub async fn send(&self, bytes: &[u8], within: Duration) -> String {
        let mut stream = self.connect().await;
        let _ = stream.write_all(bytes).await;
        read_for(&mut stream, within).await
    }

    /// Writes `head`, then `body` one byte every `every`, then reads the answer (until the
    /// server closes, or `within` after the last byte). Stops writing when the server closes
    /// or answers.
    pub async fn trickle(
        &self,
        head: &[u8],
        body: &[u8],
        every: Duration,
        within: Duration,
    ) -> String {
        let mut stream = self.connect().await;
        if stream.write_all(head).await.is_err() {
            return String::new();
        }
        let mut out = Vec::new();
        for byte in body {
            let mut one = [0u8; 4096];
            // A pause, unless the server speaks (or hangs up) first.
            match tokio::time::timeout(every, stream.read(&mut one)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return String::from_utf8_lossy(&out).into_owned(),
                Ok(Ok(n)) => {
                    out.extend_from_slice(&one[..n]);
                    let rest = read_for(&mut stream, within).await;
                    return String::from_utf8_lossy(&out).into_owned() + &rest;
                }
                Err(_) => {}
            }
            if stream.write_all(&[*byte]).await.is_err() {
                break;
            }
        }
        String::from_utf8_lossy(&out).into_owned() + &read_for(&mut stream, within).await
    }

    /// How long until the server closes `stream` (reading and dropping what it sends), or
    /// `None` when it is still open after `within`.
    pub async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
        let started = tokio::time::Instant::now();
        let mut sink = [0u8; 4096];
        let read = async {
            loop {
                match stream.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(within, read)
            .await
            .ok()
            .map(|()| started.elapsed())
    }
}

/// Reads until the other side closes or `within` passes.
async fn read_for(stream: &mut TcpStream, within: Duration) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(within, stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}
