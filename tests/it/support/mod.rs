//! Real sockets for the tests: a counting upstream, the proxy, and a small client, all on
//! 127.0.0.1:0. Everything started here is stopped when its handle is dropped.

#![allow(dead_code, unreachable_pub)]

pub mod bin;
pub mod chaos;
pub mod commands;
pub mod docker;
pub mod fake_redis;
pub mod fault;
pub mod flask;
pub mod jetty;
pub mod jwt;
pub mod kube;
pub mod legacy_cors;
pub mod monitor;
pub mod otlp;
pub mod pki;
pub mod postgres;
pub mod real_process;
pub mod redis;
pub mod servers;
pub mod stall;
pub mod uploads;
pub mod upstream;

/// The toy backend of the demo, as the compose and demo tests run it.
#[path = "../../../examples/toy_backend.rs"]
pub mod toy_backend;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idemgate::config::Config;
use idemgate::idempotency::{Fingerprint, IdempotencyKey, OwnerToken, ScopedKey};
use idemgate::metrics::Metrics;
use idemgate::proxy::{AppState, Shutdown, serve};
use idemgate::store::{
    ClaimRequest, FileOptions, FileStore, MemoryStore, PostgresStore, RedisStore, Store,
};
use std::time::Duration;

/// Serves `listener` on a task of its own, HTTP/1.1 or HTTP/2 as each client speaks, every
/// request answered by `answer` with `shared`: the test servers' accept loop, once. The
/// task is the caller's to abort.
pub fn serve_each<S, F, Fut, B, E>(
    listener: TcpListener,
    shared: Arc<S>,
    answer: F,
) -> JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<hyper::body::Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<http::Response<B>, E>> + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| answer(Arc::clone(&shared), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use upstream::Upstream;

/// A configuration with `upstream` in front and the `store:` section's lines `store`.
pub fn store_config(upstream: &Upstream, store: &str) -> Config {
    let yaml = format!("upstream:\n  url: {}\nstore:\n{store}", upstream.url());
    Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid")
}

/// A proxy served in this process on a free port.
pub struct Proxy<S: Store = MemoryStore> {
    pub addr: SocketAddr,
    pub state: Arc<AppState<S>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Shutdown>>,
}

impl Proxy<MemoryStore> {
    /// Starts a proxy from YAML; `{upstream}` in it is replaced by the upstream's URL.
    pub async fn start(yaml: &str, upstream: &Upstream) -> Proxy {
        let yaml = yaml.replace("{upstream}", &upstream.url());
        let config = Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid");
        Self::with_config(config).await
    }

    pub async fn with_config(config: Config) -> Proxy {
        let store = MemoryStore::new(config.store.max_entries)
            .with_scope_quota(config.store.max_entries_per_scope);
        Proxy::with_store(config, Arc::new(store)).await
    }
}

impl Proxy<RedisStore> {
    /// A proxy on the Redis store that the config names.
    pub async fn redis(yaml: &str, upstream: &Upstream) -> Self {
        let yaml = yaml.replace("{upstream}", &upstream.url());
        let config = Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid");
        let store = Arc::new(RedisStore::new(&config.store).expect("redis store"));
        Proxy::with_store(config, store).await
    }
}

impl Proxy<PostgresStore> {
    /// A proxy on the PostgreSQL store that the config names, its table checked or made
    /// as at start-up (docs/behaviour.md §22).
    pub async fn postgres(yaml: &str, upstream: &Upstream) -> Self {
        let yaml = yaml.replace("{upstream}", &upstream.url());
        let config = Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid");
        let store = Arc::new(PostgresStore::new(&config.store).expect("postgres store"));
        store.start().await.expect("the table is idemgate's");
        Proxy::with_store(config, store).await
    }
}

impl Proxy<FileStore> {
    /// A proxy on the file store that `config` names (`store.kind: file`).
    pub async fn file(config: Config) -> Self {
        let store = FileStore::open(&FileOptions::from_config(&config.store)).expect("file store");
        Proxy::with_store(config, Arc::new(store)).await
    }
}

impl<S: Store> Proxy<S> {
    /// A proxy on `store`, which the test may share to look into it.
    pub async fn with_store(config: Config, store: Arc<S>) -> Proxy<S> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let config = Arc::new(config);
        // Observable: tests wait on counts with `metrics.wait_until`.
        let state = Arc::new(AppState::with_metrics(config, store, Metrics::observable()));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, Arc::clone(&state), async move {
            let _ = stopped.await;
        }));
        Proxy {
            addr,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Shuts down gracefully and reports how.
    pub async fn stop(mut self) -> Shutdown {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task
            .take()
            .expect("running")
            .await
            .expect("serve task")
    }

    /// The record id (`key_prefix` + 64 hex) of a POST to `path` with `key` and no other
    /// header, as `idemgate key` prints it.
    pub fn record_id(&self, path: &str, key: &str) -> String {
        idemgate::proxy::record_id(
            &self.state.config,
            &Method::POST,
            path,
            &HeaderMap::new(),
            key,
        )
        .expect("a guarded path")
    }

    /// `idemgate_buffered_bytes`, as `/metrics` exports it.
    pub fn buffered_bytes(&self) -> u64 {
        self.state
            .metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("idemgate_buffered_bytes "))
            .and_then(|v| v.trim().parse().ok())
            .expect("the gauge is exported")
    }

    pub fn client(&self) -> TestClient {
        TestClient::new(self.addr)
    }

    /// Starts the admin listener for this proxy on a free port; stops with the test.
    pub async fn admin(&self) -> TestClient {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::clone(&self.state);
        tokio::spawn(async move {
            idemgate::admin::serve_admin(listener, state, std::future::pending()).await;
        });
        TestClient::new(addr)
    }
}

impl<S: Store> Drop for Proxy<S> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What a proxy that died after forwarding leaves: a marker for the POST that
/// `TestClient::post(path, key, "{}")` sends, its lease already over.
pub async fn crashed_owner<S: Store>(proxy: &Proxy<S>, path: &str, key: &str) {
    let key: IdempotencyKey = idemgate::idempotency::key::parse_value(key.as_bytes()).expect("key");
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let policy = &proxy.state.config.idempotency;
    let claim = ClaimRequest {
        key: ScopedKey::new(&headers, &policy.scope_headers, &key),
        scope: None,
        fingerprint: Fingerprint::new(
            &http::Method::POST,
            path,
            &headers,
            &policy.fingerprint_rules(),
            b"{}",
        ),
        token: OwnerToken::random(),
        lease: Duration::ZERO,
        ttl: policy.ttl,
        streamed: false,
    };
    let _ = proxy.state.store.claim(claim).await.expect("claim");
}

/// A minimal YAML config in front of `{upstream}`.
pub const BASIC: &str = "upstream:\n  url: {upstream}\n";

/// An answer as the client saw it.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The problem slug of an RFC 9457 answer, checked for shape on the way.
    pub fn problem(&self) -> String {
        assert_eq!(
            self.headers["content-type"],
            "application/problem+json",
            "{}",
            self.text()
        );
        let json = self.json();
        assert_eq!(json["status"], self.status.as_u16(), "{json}");
        assert!(
            json["title"].is_string() && json["detail"].is_string(),
            "{json}"
        );
        let ty = json["type"].as_str().expect("type");
        ty.rsplit('/').next().expect("slug").to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

/// An HTTP/1.1 client to one address.
#[derive(Clone)]
pub struct TestClient {
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl TestClient {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Resp {
        self.send_bytes(method, path, headers, body.as_bytes().to_vec())
            .await
    }

    /// [`TestClient::send`] with a body that need not be UTF-8.
    pub async fn send_bytes(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Resp {
        self.try_send_bytes(method, path, headers, body)
            .await
            .expect("response")
    }

    /// [`TestClient::send_bytes`] that returns a failed connection instead of panicking,
    /// for clients that retry through an outage.
    pub async fn try_send_bytes(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<Resp, Box<dyn std::error::Error + Send + Sync>> {
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).expect("method"))
            .uri(format!("http://{}{}", self.addr, path));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Full::new(Bytes::from(body))).expect("request");
        let resp = self.client.request(req).await?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Resp {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// The same POST on a task of its own, for requests held at the upstream's gate.
    pub fn spawn_post(&self, path: &str, key: &str, body: &str) -> tokio::task::JoinHandle<Resp> {
        let (c, path, key, body) = (
            self.clone(),
            path.to_owned(),
            key.to_owned(),
            body.to_owned(),
        );
        tokio::spawn(async move { c.post(&path, &key, &body).await })
    }

    /// POST with an idempotency key.
    pub async fn post(&self, path: &str, key: &str, body: &str) -> Resp {
        self.send(
            "POST",
            path,
            &[
                ("idempotency-key", key),
                ("content-type", "application/json"),
            ],
            body,
        )
        .await
    }
}

/// Writes `request` as raw bytes (what an HTTP client would normalise), half-closes,
/// and returns everything the proxy answered before it closed.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    raw(addr, request, true).await
}

/// Writes `request` (which should say `connection: close`) as raw bytes and returns
/// everything the proxy answered before it closed; the write side stays open, so a
/// request that is forwarded is not taken for an abandoned one.
pub async fn raw_request(addr: SocketAddr, request: &[u8]) -> String {
    raw(addr, request, false).await
}

async fn raw(addr: SocketAddr, request: &[u8], half_close: bool) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    // The proxy may answer and close before it has read everything: that is fine.
    let _ = stream.write_all(request).await;
    if half_close {
        let _ = stream.shutdown().await;
    }
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read_all)
        .await
        .expect("the proxy neither answered nor closed the connection");
    String::from_utf8_lossy(&out).into_owned()
}
