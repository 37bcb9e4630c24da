//! A real upstream on 127.0.0.1:0 that counts and logs what reaches it.
//!
//! Behaviour by path: a `/gate` prefix holds the answer until the test opens the gate,
//! then the rest of the path decides;
//! `/status/NNN` answers NNN; `/big/N` answers N bytes; `/reset` reads the request and
//! drops the connection; `/hang` never answers; anything else answers 201 with a JSON
//! body naming the execution number (and the `traceparent` and `tracestate` it got, as
//! headers).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

struct Shared {
    seen: Mutex<Vec<Seen>>,
    arrived: Notify,
    gate: Semaphore,
}

pub struct Upstream {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

#[derive(Debug)]
struct Reset;

impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reset by test upstream")
    }
}

impl std::error::Error for Reset {}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            seen: Mutex::default(),
            arrived: Notify::new(),
            gate: Semaphore::new(0),
        });
        let task = super::serve_each(listener, Arc::clone(&shared), |shared, req| async move {
            answer(&shared, req).await
        });
        Upstream { addr, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests reached the upstream.
    pub fn count(&self) -> usize {
        self.shared.seen.lock().expect("lock").len()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("lock").clone()
    }

    /// Resolves once at least `n` requests have arrived.
    pub async fn wait_for(&self, n: usize) {
        loop {
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() >= n {
                return;
            }
            notified.await;
        }
    }

    /// Lets every held `/gate` request answer, now and later.
    pub fn open_gate(&self) {
        self.shared.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(shared: &Shared, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Reset> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Reset)?.to_bytes();
    let path = parts.uri.path().to_owned();
    let n = {
        let mut seen = shared.seen.lock().expect("lock");
        seen.push(Seen {
            method: parts.method.to_string(),
            path_and_query: parts
                .uri
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .to_owned(),
            headers: parts.headers.clone(),
            body: body.clone(),
        });
        seen.len()
    };
    shared.arrived.notify_waiters();
    let path = match path.strip_prefix("/gate") {
        Some(rest) => {
            let permit = shared.gate.acquire().await.map_err(|_| Reset)?;
            permit.forget();
            if rest.is_empty() {
                "/".to_owned()
            } else {
                rest.to_owned()
            }
        }
        None => path,
    };
    if path == "/reset" {
        return Err(Reset);
    }
    if path == "/hang" {
        std::future::pending::<()>().await;
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let status = code
            .parse()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::IM_A_TEAPOT);
        return Ok(Response::builder()
            .status(status)
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from(format!(
                "status {code} execution {n}"
            ))))
            .expect("response"));
    }
    if let Some(len) = path.strip_prefix("/big/") {
        let len: usize = len.parse().unwrap_or(0);
        return Ok(Response::builder()
            .status(200)
            .body(Full::new(Bytes::from(vec![b'x'; len])))
            .expect("response"));
    }
    let json = serde_json::json!({
        "execution": n,
        "method": parts.method.as_str(),
        "path": path,
        "authorization": parts.headers.get("authorization").and_then(|v| v.to_str().ok()),
        "body": String::from_utf8_lossy(&body),
    });
    let mut response = Response::builder();
    // As traced servers may: the trace context it was called under, sent back.
    for name in ["traceparent", "tracestate"] {
        if let Some(value) = parts.headers.get(name) {
            response = response.header(name, value);
        }
    }
    Ok(response
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("set-cookie", format!("session={n}"))
        .header("x-execution", n.to_string())
        // An upstream that deduplicates too may mark its own replays; idemgate must not
        // pass that off as its marker.
        .header(
            "idempotent-replayed",
            if path == "/marked" { "true" } else { "false" },
        )
        .header("connection", "keep-alive")
        .body(Full::new(Bytes::from(json.to_string())))
        .expect("response"))
}
