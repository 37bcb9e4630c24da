//! An upstream that does CORS as a legacy app does (docs/behaviour.md §24): it answers
//! every request with `Access-Control-Allow-Origin` echoing the `Origin`, and knows
//! nothing of `Idempotency-Key`.
//!
//! Preflights (`OPTIONS`), by path: under `/no-options` `404`, under `/405` `405`,
//! under `/501` `501`; anything else `200` allowing `POST` and `Content-Type` only.
//! Other methods: under `/slow`, held until [`LegacyCors::open_gate`]; then `201` with
//! a JSON body naming the execution number, `Vary: Accept-Encoding`, and the `Origin`
//! it got echoed in `Access-Control-Allow-Origin`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

struct Shared {
    executions: AtomicUsize,
    preflights: AtomicUsize,
    arrived: Notify,
    gate: Semaphore,
}

pub struct LegacyCors {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl LegacyCors {
    pub async fn start() -> LegacyCors {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            executions: AtomicUsize::new(0),
            preflights: AtomicUsize::new(0),
            arrived: Notify::new(),
            gate: Semaphore::new(0),
        });
        let task = super::serve_each(listener, Arc::clone(&shared), |shared, req| async move {
            answer(&shared, req).await
        });
        LegacyCors { addr, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests other than preflights that reached it.
    pub fn executions(&self) -> usize {
        self.shared.executions.load(Ordering::SeqCst)
    }

    pub fn preflights(&self) -> usize {
        self.shared.preflights.load(Ordering::SeqCst)
    }

    /// Resolves once at least `n` executions have arrived (held ones included).
    pub async fn wait_for(&self, n: usize) {
        loop {
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.executions() >= n {
                return;
            }
            notified.await;
        }
    }

    /// Lets one held `/slow` request answer, now or when it comes.
    pub fn let_one_through(&self) {
        self.shared.gate.add_permits(1);
    }

    /// Lets every held `/slow` request answer, now and later.
    pub fn open_gate(&self) {
        self.shared.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

impl Drop for LegacyCors {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = req.into_parts();
    let _ = body.collect().await?;
    let path = parts.uri.path().to_owned();
    let origin = parts.headers.get("origin").cloned();
    if parts.method == Method::OPTIONS {
        shared.preflights.fetch_add(1, Ordering::SeqCst);
        let status = if path.starts_with("/no-options") {
            StatusCode::NOT_FOUND
        } else if path.starts_with("/405") {
            StatusCode::METHOD_NOT_ALLOWED
        } else if path.starts_with("/501") {
            StatusCode::NOT_IMPLEMENTED
        } else {
            let mut ok = Response::builder()
                .status(StatusCode::OK)
                .header("access-control-allow-methods", "POST")
                .header("access-control-allow-headers", "Content-Type")
                .header("vary", "Origin");
            if let Some(origin) = origin {
                ok = ok.header("access-control-allow-origin", origin);
            }
            return Ok(ok.body(Full::default()).expect("response"));
        };
        return Ok(Response::builder()
            .status(status)
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from_static(b"no such route")))
            .expect("response"));
    }
    let n = shared.executions.fetch_add(1, Ordering::SeqCst) + 1;
    shared.arrived.notify_waiters();
    if path.starts_with("/slow")
        && let Ok(permit) = shared.gate.acquire().await
    {
        permit.forget();
    }
    let mut response = Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("vary", "Accept-Encoding")
        .header("access-control-expose-headers", "X-Execution")
        .header("x-execution", n.to_string());
    if let Some(origin) = origin {
        response = response.header("access-control-allow-origin", origin);
    }
    Ok(response
        .body(Full::new(Bytes::from(
            serde_json::json!({"execution": n}).to_string(),
        )))
        .expect("response"))
}
