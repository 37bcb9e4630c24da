//! Large uploads without large memory (docs/behaviour.md §19): a body generated as it is
//! sent, an upstream that checks what arrives byte for byte as it goes by, and the peak
//! memory of a process read from `/proc`.
//!
//! The body is one 256 KiB pattern block repeated (each frame a reference to it, so a
//! 200 MiB body costs the test nothing), shifted by a seed so that two bodies of the same
//! size differ; `last` replaces its final byte.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

pub const MIB: u64 = 1 << 20;
const BLOCK: usize = 256 * 1024;

/// The byte at `i` (below [`BLOCK`]) of the pattern.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8 ^ (i / 251) as u8
}

/// The pattern every generated body repeats, twice over, so that any run of up to
/// [`BLOCK`] bytes of it is one slice.
fn block() -> Bytes {
    (0..2 * BLOCK)
        .map(|i| pattern(i % BLOCK))
        .collect::<Vec<u8>>()
        .into()
}

/// A generated body, as the client sends it.
#[derive(Debug, Clone, Copy)]
pub struct Generated {
    pub len: u64,
    /// Shifts the pattern: two seeds are two bodies.
    pub seed: u8,
    /// Sent without a `Content-Length`, in chunks.
    pub chunked: bool,
    /// Replaces the final byte with this one.
    pub last: Option<u8>,
}

impl Generated {
    pub fn new(len: u64) -> Self {
        Self {
            len,
            seed: 0,
            chunked: false,
            last: None,
        }
    }

    pub fn chunked(self) -> Self {
        Self {
            chunked: true,
            ..self
        }
    }

    /// The same body with its final byte changed.
    pub fn last_byte_changed(self) -> Self {
        Self {
            last: Some(!self.byte_at(self.len - 1)),
            ..self
        }
    }

    fn byte_at(&self, at: u64) -> u8 {
        pattern(((at + u64::from(self.seed)) % BLOCK as u64) as usize)
    }

    /// The body as a stream of frames, `limit` bytes of it (the whole when `None`).
    pub fn body(&self, limit: Option<u64>) -> GeneratedBody {
        GeneratedBody {
            shape: *self,
            block: block(),
            sent: 0,
            stop: limit.unwrap_or(self.len).min(self.len),
        }
    }
}

/// A [`Generated`] body's frames.
pub struct GeneratedBody {
    shape: Generated,
    block: Bytes,
    sent: u64,
    stop: u64,
}

impl Body for GeneratedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.sent >= this.stop {
            return Poll::Ready(None);
        }
        let start = ((this.sent + u64::from(this.shape.seed)) % BLOCK as u64) as usize;
        let n = (BLOCK as u64).min(this.stop - this.sent) as usize;
        let mut frame = this.block.slice(start..start + n);
        let end = this.sent + n as u64;
        if end == this.shape.len
            && let Some(last) = this.shape.last
        {
            let mut owned = frame.to_vec();
            *owned.last_mut().expect("a frame is never empty") = last;
            frame = owned.into();
        }
        this.sent = end;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= self.stop
    }

    fn size_hint(&self) -> SizeHint {
        if self.shape.chunked {
            SizeHint::default()
        } else {
            SizeHint::with_exact(self.shape.len)
        }
    }
}

/// An answer, as the client read it.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// POSTs `body` to `addr` + `path` with `key`, on a connection of its own.
pub async fn upload(addr: SocketAddr, path: &str, key: &str, body: Generated) -> Answer {
    let mut req = Request::post(format!("http://{addr}{path}"))
        .header("host", addr.to_string())
        .header("idempotency-key", key)
        .header("content-type", "application/pdf");
    if !body.chunked {
        req = req.header("content-length", body.len);
    }
    send(addr, req.body(body.body(None)).expect("request")).await
}

/// POSTs a small body with `key`: a request idemgate buffers.
pub async fn small(addr: SocketAddr, path: &str, key: &str) -> Answer {
    let req = Request::post(format!("http://{addr}{path}"))
        .header("host", addr.to_string())
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    send(addr, req).await
}

/// Sends `req` to `addr` on a connection of its own and reads the whole answer.
async fn send<B>(addr: SocketAddr, req: Request<B>) -> Answer
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.expect("connect to idemgate");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let conn = tokio::spawn(conn);
    let response = sender.send_request(req).await.expect("an answer");
    let (parts, incoming) = response.into_parts();
    let bytes = incoming
        .collect()
        .await
        .expect("the answer's body")
        .to_bytes();
    conn.abort();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: bytes,
    }
}

/// Declares `body`'s whole length and sends `sent` bytes of it.
async fn send_part(
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: Generated,
    sent: u64,
) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect to idemgate");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: {key}\r\n\
         content-type: application/pdf\r\ncontent-length: {}\r\n\r\n",
        body.len
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    let mut frames = body.body(Some(sent));
    while let Some(frame) = frames.frame().await {
        let Ok(data) = frame.expect("infallible").into_data() else {
            continue;
        };
        stream.write_all(&data).await.expect("write body");
    }
    stream.flush().await.expect("flush");
    stream
}

/// Declares `body`'s whole length, sends `sent` bytes of it, and closes the
/// connection: a client killed half-way.
pub async fn abandon(addr: SocketAddr, path: &str, key: &str, body: Generated, sent: u64) {
    drop(send_part(addr, path, key, body, sent).await);
}

/// Declares `body`'s whole length, sends `sent` bytes of it, then reads the answer
/// before sending any more: a client whose upload was answered while it was still
/// sending. Returns the answer's status line.
pub async fn answered_half_way(
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: Generated,
    sent: u64,
) -> String {
    use tokio::io::AsyncReadExt;
    let mut stream = send_part(addr, path, key, body, sent).await;
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf).await.expect("read the answer");
        assert!(n > 0, "closed before answering: {answer:?}");
        answer.extend_from_slice(&buf[..n]);
    }
    let line = answer
        .split(|&b| b == b'\r')
        .next()
        .expect("split yields at least one part");
    String::from_utf8_lossy(line).into_owned()
}

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    /// Body bytes that arrived.
    pub bytes: u64,
    /// Every byte that arrived was the generated body's (seed 0) at its offset.
    pub intact: bool,
    /// The body ended as its framing said (not cut short).
    pub complete: bool,
    pub content_length: Option<u64>,
}

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    changed: Notify,
}

/// A real upstream on 127.0.0.1:0 that reads bodies as they arrive, keeping none of
/// them. `/early...` answers `400` at once, without reading the body; anything else
/// reads the body to its end, then answers `201` with `{"n": <execution>, "bytes": N}`.
pub struct UploadServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl UploadServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared::default());
        let task = super::serve_each(listener, Arc::clone(&shared), |shared, req| async move {
            answer(&shared, req).await
        });
        Self { addr, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().expect("lock").clone()
    }

    /// Resolves once `n` requests have been received (to their end, or cut short).
    pub async fn wait_for(&self, n: usize) {
        loop {
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.received().len() >= n {
                return;
            }
            changed.await;
        }
    }
}

impl Drop for UploadServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let path = req.uri().path().to_owned();
    let content_length = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    if path.starts_with("/early") {
        shared.received.lock().expect("lock").push(Received {
            path,
            bytes: 0,
            intact: true,
            complete: false,
            content_length,
        });
        shared.changed.notify_waiters();
        return Ok(Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Full::new(Bytes::from_static(
                b"{\"error\":\"refused before reading\"}",
            )))
            .expect("response"));
    }
    let expected = Generated::new(u64::MAX);
    let pattern = block();
    let mut body = req.into_body();
    let (mut bytes, mut intact, mut complete) = (0u64, true, true);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            complete = false;
            break;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let start = ((bytes + u64::from(expected.seed)) % BLOCK as u64) as usize;
        // The pattern is two blocks long, so any frame up to a block compares at once.
        let mut at = 0;
        while at < data.len() {
            let from = (start + at) % BLOCK;
            let n = (data.len() - at).min(BLOCK);
            intact &= data[at..at + n] == pattern[from..from + n];
            at += n;
        }
        bytes += data.len() as u64;
    }
    let n = {
        let mut received = shared.received.lock().expect("lock");
        received.push(Received {
            path,
            bytes,
            intact,
            complete,
            content_length,
        });
        received.len()
    };
    shared.changed.notify_waiters();
    Ok(Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(
            "{{\"n\":{n},\"bytes\":{bytes}}}"
        ))))
        .expect("response"))
}

/// `VmRSS` and `VmHWM` (peak) of process `pid`, in bytes.
pub fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}
