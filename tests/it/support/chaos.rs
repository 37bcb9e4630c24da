//! Pieces for chaos tests: deterministic randomness, an upstream that is slow at random
//! and sometimes drops the connection after doing the work, and a list of replicas that
//! a test can swap a restarted replica into while clients pick from it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// xorshift64: reproducible draws without another crate.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// One stream of draws per `(seed, stream)`; different streams do not overlap early.
    pub fn new(seed: u64, stream: u64) -> Self {
        // Any non-zero state works.
        Self((seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A draw in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One request that reached the upstream, which means it did the work.
#[derive(Debug, Clone)]
pub struct Execution {
    /// The `Authorization` header, i.e. the client's scope.
    pub scope: String,
    pub key: String,
    /// When the request reached the upstream.
    pub at: Instant,
}

#[derive(Debug)]
struct Shared {
    log: Mutex<Vec<Execution>>,
    rng: Mutex<XorShift>,
    max_delay_ms: u64,
    drop_percent: u64,
    drops: AtomicUsize,
}

/// Returned from the service to make hyper drop the connection without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped by the chaos upstream after executing")
    }
}

impl std::error::Error for Dropped {}

/// An upstream on 127.0.0.1:0 that logs every execution as (scope, key), then waits
/// `0..=max_delay` and, `drop_percent` of the time, drops the connection instead of
/// answering; otherwise it answers 201 with `{"authorization","key","execution"}`, where
/// `execution` is the 1-based position in [`ChaosUpstream::log`].
#[derive(Debug)]
pub struct ChaosUpstream {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl ChaosUpstream {
    pub async fn start(rng: XorShift, max_delay: Duration, drop_percent: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            log: Mutex::default(),
            rng: Mutex::new(rng),
            max_delay_ms: u64::try_from(max_delay.as_millis()).expect("a short delay"),
            drop_percent,
            drops: AtomicUsize::new(0),
        });
        let accept_shared = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            // Owned by this task, so aborting it closes every connection too.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = Arc::clone(&accept_shared);
                connections.spawn(async move {
                    let svc = service_fn(move |req| execute(Arc::clone(&shared), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Self { addr, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every execution so far, in order.
    pub fn log(&self) -> Vec<Execution> {
        self.shared.log.lock().expect("lock").clone()
    }

    /// How many executions ended in a dropped connection.
    pub fn drops(&self) -> usize {
        self.shared.drops.load(Ordering::Relaxed)
    }
}

impl Drop for ChaosUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn execute(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let (parts, body) = req.into_parts();
    body.collect().await.map_err(|_| Dropped)?;
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    let (scope, key) = (header("authorization"), header("idempotency-key"));
    let execution = {
        let mut log = shared.log.lock().expect("lock");
        log.push(Execution {
            scope: scope.clone(),
            key: key.clone(),
            at: Instant::now(),
        });
        log.len()
    };
    let (delay, drop) = {
        let mut rng = shared.rng.lock().expect("lock");
        let delay = rng.below(shared.max_delay_ms + 1);
        (delay, rng.below(100) < shared.drop_percent)
    };
    // The injected slowness is the behaviour: time passing is the point.
    tokio::time::sleep(Duration::from_millis(delay)).await;
    if drop {
        shared.drops.fetch_add(1, Ordering::Relaxed);
        return Err(Dropped);
    }
    let json = serde_json::json!({
        "authorization": scope,
        "key": key,
        "execution": execution,
    });
    Ok(Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json.to_string())))
        .expect("response"))
}

/// Named replica addresses that clients pick from; a test swaps a restarted replica in
/// under a new name while the clients keep picking.
#[derive(Debug)]
pub struct Replicas(RwLock<Vec<(&'static str, SocketAddr)>>);

impl Replicas {
    pub fn new(live: Vec<(&'static str, SocketAddr)>) -> Self {
        assert!(!live.is_empty(), "at least one replica");
        Self(RwLock::new(live))
    }

    /// How many replicas clients pick from.
    pub fn count(&self) -> usize {
        self.0.read().expect("lock").len()
    }

    /// The `i`-th replica, wrapping around: `i, i + 1, ...` alternates between them.
    pub fn pick(&self, i: usize) -> (&'static str, SocketAddr) {
        let live = self.0.read().expect("lock");
        live[i % live.len()]
    }

    /// Puts `new` in the place of the replica named `old`.
    pub fn replace(&self, old: &str, new: (&'static str, SocketAddr)) {
        let mut live = self.0.write().expect("lock");
        let slot = live.iter_mut().find(|(name, _)| *name == old);
        *slot.unwrap_or_else(|| panic!("no replica named {old}")) = new;
    }
}
