//! `replay_authorization` (docs/behaviour.md §24) and the Basic principal it allows
//! (§25), with real parts: one backend on a socket that executes `POST /charges` and
//! answers `/auth/check` by the `Authorization` it gets, behind idemgate on the memory
//! store (and once on Redis). A replay is preceded by one check; its `2xx` replays,
//! its `401`/`403` go to the client, anything else is `503 authorization-unavailable`;
//! the record never changes, and a first execution or a `409 in-flight` is never checked.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use idemgate::config::Config;
use idemgate::metrics::{Authorized, Outcome};
use idemgate::store::{RedisStore, Store};
use support::redis::RedisServer;
use support::{Proxy, Resp, TestClient};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

/// A check's request, as the backend got it.
#[derive(Debug, Clone)]
struct Check {
    method: Method,
    path_and_query: String,
    headers: HeaderMap,
    body: Bytes,
}

struct Shared {
    checks: Mutex<Vec<Check>>,
    executions: AtomicUsize,
    connections: AtomicUsize,
    /// Held `POST /charges/gate` requests wait for a permit.
    gate: Semaphore,
    /// Requests that reached the gate, and a wake-up for each.
    held: AtomicUsize,
    arrived: Notify,
}

/// The backend: `POST /charges...` executes (`201`, `{"n": N}`), held under
/// `/charges/gate` until [`Backend::open_gate`]; `/auth/check...` answers by the
/// `Authorization` it gets (see [`verdict`]).
struct Backend {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Backend {
    async fn start() -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            checks: Mutex::default(),
            executions: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            gate: Semaphore::new(0),
            held: AtomicUsize::new(0),
            arrived: Notify::new(),
        });
        let task = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    shared.connections.fetch_add(1, Ordering::SeqCst);
                    let shared = Arc::clone(&shared);
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let shared = Arc::clone(&shared);
                            async move { Ok::<_, hyper::Error>(answer(&shared, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }
        });
        Backend { addr, shared, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn checks(&self) -> Vec<Check> {
        self.shared.checks.lock().expect("lock").clone()
    }

    fn executions(&self) -> usize {
        self.shared.executions.load(Ordering::SeqCst)
    }

    fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Resolves once a request is held at the gate.
    async fn held(&self) {
        loop {
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.held.load(Ordering::SeqCst) > 0 {
                return;
            }
            notified.await;
        }
    }

    fn open_gate(&self) {
        self.shared.gate.add_permits(1000);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What `/auth/check` answers to each credential.
fn verdict(authorization: Option<&HeaderValue>) -> Response<Full<Bytes>> {
    let credential = authorization.and_then(|v| v.to_str().ok()).unwrap_or("");
    let user = credential.strip_prefix("Bearer ").unwrap_or(credential);
    let (status, body): (u16, Bytes) = match user {
        "good" | "Basic YWxpY2U6cmlnaHQ=" => (204, Bytes::new()),
        "revoked" | "Basic YWxpY2U6d3Jvbmc=" => (401, Bytes::from_static(b"token revoked")),
        "forbidden" => (403, Bytes::from_static(b"not yours")),
        "big" => (401, Bytes::from(vec![b'x'; 100 * 1024])),
        "broken" => (500, Bytes::from_static(b"oops")),
        "moved" => (302, Bytes::new()),
        _ => (401, Bytes::from_static(b"who are you")),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = StatusCode::from_u16(status).expect("status");
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("text/plain"));
    headers.insert(
        "www-authenticate",
        HeaderValue::from_static("Bearer error=\"invalid_token\""),
    );
    headers.insert("x-authorizer-secret", HeaderValue::from_static("internal"));
    headers.insert("set-cookie", HeaderValue::from_static("auth=1"));
    response
}

async fn answer(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    if path.starts_with("/auth/check") {
        shared.checks.lock().expect("lock").push(Check {
            method: parts.method.clone(),
            path_and_query: parts
                .uri
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .to_owned(),
            headers: parts.headers.clone(),
            body,
        });
        if parts
            .headers
            .get("authorization")
            .is_some_and(|v| v == "Bearer slow")
        {
            std::future::pending::<()>().await;
        }
        return verdict(parts.headers.get("authorization"));
    }
    if path.starts_with("/charges/gate") {
        shared.held.fetch_add(1, Ordering::SeqCst);
        shared.arrived.notify_waiters();
        if let Ok(permit) = shared.gate.acquire().await {
            permit.forget();
        }
    }
    let n = shared.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let mut response = Response::new(Full::new(Bytes::from(format!("{{\"n\": {n}}}"))));
    *response.status_mut() = StatusCode::CREATED;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    response
}

/// `/charges` guarded, scoped by `x-tenant` (so that one key's retries may carry other
/// credentials), with `replay_authorization: {check}` unless `check` is empty.
fn config(backend: &Backend, check: &str, store: &str) -> Config {
    let check = if check.is_empty() {
        String::new()
    } else {
        format!("    replay_authorization: {{{check}}}\n")
    };
    let yaml = format!(
        "workers: 1\nupstream:\n  url: {}\nstore:\n{store}routes:\n  - path: /charges\n    \
         methods: [POST]\n    scope_headers: [x-tenant]\n    on_concurrent: wait\n    \
         wait_timeout: 5s\n{check}",
        backend.url()
    );
    Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid")
}

const MEMORY: &str = "  kind: memory\n";
const ON_PATH: &str = "path: /auth/check";

async fn charge(c: &TestClient, path: &str, key: &str, credential: &str) -> Resp {
    c.send(
        "POST",
        path,
        &[
            ("idempotency-key", key),
            ("authorization", credential),
            ("x-tenant", "acme"),
            ("content-type", "application/json"),
        ],
        r#"{"amount": 1}"#,
    )
    .await
}

fn authorizations<S: Store>(proxy: &Proxy<S>, result: Authorized) -> u64 {
    proxy.state.metrics.replay_authorizations(result)
}

/// The story of one key under the check, on any store: executed unchecked, replayed to a
/// good credential, refused to a revoked or forbidden one with the authorizer's answer,
/// and replayed again afterwards.
async fn a_replay_is_checked_and_a_refusal_passed_on<S: Store>(
    proxy: &Proxy<S>,
    backend: &Backend,
) {
    let c = proxy.client();
    let first = charge(&c, "/charges", "k1", "Bearer good").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(
        backend.checks().is_empty(),
        "a first execution is not checked"
    );
    let replay = charge(&c, "/charges", "k1", "Bearer good").await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(backend.checks().len(), 1);
    for (credential, status, body) in [
        ("Bearer revoked", 401, "token revoked"),
        ("Bearer forbidden", 403, "not yours"),
    ] {
        let denied = charge(&c, "/charges", "k1", credential).await;
        assert_eq!(denied.status, status, "{}", denied.text());
        assert_eq!(denied.text(), body);
        assert!(!denied.replayed());
        assert_eq!(denied.headers["content-type"], "text/plain");
        assert_eq!(
            denied.headers["www-authenticate"],
            "Bearer error=\"invalid_token\""
        );
        assert!(
            !denied.headers.contains_key("x-authorizer-secret")
                && !denied.headers.contains_key("set-cookie"),
            "nothing else of the authorizer's answer: {:?}",
            denied.headers
        );
    }
    // The record is unchanged: a credential that passes replays it.
    let again = charge(&c, "/charges", "k1", "Bearer good").await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(backend.executions(), 1, "executed once");
    assert_eq!(backend.checks().len(), 4);
    assert_eq!(authorizations(proxy, Authorized::Allowed), 2);
    assert_eq!(authorizations(proxy, Authorized::Denied), 2);
    assert_eq!(authorizations(proxy, Authorized::Error), 0);
    assert_eq!(proxy.state.metrics.requests(Outcome::ReplayDenied), 2);
    assert_eq!(proxy.state.metrics.requests(Outcome::Replayed), 2);
}

#[tokio::test]
async fn replays_are_checked_on_the_same_upstream_and_refusals_passed_on() {
    let backend = Backend::start().await;
    let proxy = Proxy::with_config(config(&backend, ON_PATH, MEMORY)).await;
    a_replay_is_checked_and_a_refusal_passed_on(&proxy, &backend).await;
    let text = proxy.state.metrics.render();
    for line in [
        "idemgate_replay_authorizations_total{result=\"allowed\"} 2",
        "idemgate_replay_authorizations_total{result=\"denied\"} 2",
        "idemgate_replay_authorizations_total{result=\"error\"} 0",
    ] {
        assert!(text.contains(line), "no {line} in:\n{text}");
    }
    proxy.stop().await;
}

#[tokio::test]
async fn replays_are_checked_on_redis_too() {
    let redis = RedisServer::start().await;
    let backend = Backend::start().await;
    let store = format!("  kind: redis\n  url: {}\n", redis.url());
    let config = config(&backend, ON_PATH, &store);
    let store = Arc::new(RedisStore::new(&config.store).expect("redis store"));
    let proxy = Proxy::with_store(config, store).await;
    a_replay_is_checked_and_a_refusal_passed_on(&proxy, &backend).await;
    proxy.stop().await;
}

/// Without `replay_authorization`, nothing is asked: a revoked credential replays.
#[tokio::test]
async fn without_the_key_nothing_is_checked() {
    let backend = Backend::start().await;
    let proxy = Proxy::with_config(config(&backend, "", MEMORY)).await;
    let c = proxy.client();
    charge(&c, "/charges", "k", "Bearer good").await;
    let replay = charge(&c, "/charges", "k", "Bearer revoked").await;
    assert!(replay.replayed());
    assert!(backend.checks().is_empty());
    proxy.stop().await;
}

/// The check carries the listed headers of the retry (the default: `authorization` and
/// the scope headers), the record id, the original method and URI, and no body, never
/// the idempotency key, even when it is listed.
#[tokio::test]
async fn the_check_carries_the_retrys_headers_and_names_the_record() {
    let backend = Backend::start().await;
    for (check, copied) in [
        (ON_PATH.to_owned(), vec!["authorization", "x-tenant"]),
        (
            format!(
                "{ON_PATH}?v=1, method: head, headers: [authorization, idempotency-key, x-extra]"
            ),
            vec!["authorization", "x-extra"],
        ),
    ] {
        let config = config(&backend, &check, MEMORY);
        let proxy = Proxy::with_config(config).await;
        let c = proxy.client();
        let key = format!("k-{}", copied.len());
        let headers = [
            ("idempotency-key", key.as_str()),
            ("authorization", "Bearer good"),
            ("x-tenant", "acme"),
            ("x-extra", "e"),
            ("cookie", "s=1"),
            ("content-type", "application/json"),
        ];
        for _ in 0..2 {
            // Normalised to /charges/a for the guard and the upstream.
            let r = c.send("POST", "/charges/%61?b=c", &headers, "{}").await;
            assert_eq!(r.status, 201, "{}", r.text());
        }
        let checks = backend.checks();
        let seen = checks.last().expect("one check").clone();
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(name, HeaderValue::from_str(value).expect("value"));
        }
        let id = idemgate::proxy::record_id(
            &proxy.state.config,
            &Method::POST,
            "/charges/a",
            &map,
            &key,
        )
        .expect("a guarded path");
        assert_eq!(seen.headers["x-idempotency-record"], id.as_str());
        assert_eq!(seen.headers["x-original-method"], "POST");
        assert_eq!(
            seen.headers["x-original-uri"], "/charges/%61?b=c",
            "as received"
        );
        for name in copied {
            assert_eq!(seen.headers[name], map[name], "{name}");
        }
        assert!(
            !seen.headers.contains_key("idempotency-key"),
            "{:?}",
            seen.headers
        );
        assert!(!seen.headers.contains_key("cookie"));
        assert!(!seen.headers.contains_key("content-type"));
        assert!(seen.body.is_empty());
        proxy.stop().await;
    }
    let checks = backend.checks();
    assert_eq!(checks.len(), 2);
    assert_eq!(
        (checks[0].method.clone(), checks[0].path_and_query.as_str()),
        (Method::GET, "/auth/check")
    );
    assert_eq!(
        (checks[1].method.clone(), checks[1].path_and_query.as_str()),
        (Method::HEAD, "/auth/check?v=1")
    );
}

/// A check that cannot decide (another status, no answer in time, no connection) is
/// `503 authorization-unavailable` with `Retry-After: 1`, and the record is unchanged.
#[tokio::test]
async fn a_check_that_cannot_decide_is_503_and_changes_nothing() {
    let backend = Backend::start().await;
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr")
    };
    for (check, credential) in [
        (format!("{ON_PATH}, timeout: 300ms"), "Bearer broken"),
        (format!("{ON_PATH}, timeout: 300ms"), "Bearer moved"),
        (format!("{ON_PATH}, timeout: 300ms"), "Bearer slow"),
        (format!("url: 'http://{closed}/auth/check'"), "Bearer good"),
    ] {
        let proxy = Proxy::with_config(config(&backend, &check, MEMORY)).await;
        let c = proxy.client();
        assert_eq!(charge(&c, "/charges", "k", "Bearer good").await.status, 201);
        let r = charge(&c, "/charges", "k", credential).await;
        assert_eq!(r.status, 503, "{check} {credential}: {}", r.text());
        assert_eq!(r.problem(), "authorization-unavailable");
        assert_eq!(r.headers["retry-after"], "1");
        assert_eq!(authorizations(&proxy, Authorized::Error), 1);
        assert_eq!(
            proxy
                .state
                .metrics
                .requests(Outcome::AuthorizationUnavailable),
            1
        );
        proxy.stop().await;
    }
    assert_eq!(backend.executions(), 4, "one first execution per proxy");
}

/// A streamed request's retry, whose body decides after it is read
/// (docs/behaviour.md §19), is checked before its replay too.
#[tokio::test]
async fn a_streamed_retry_is_checked_before_its_replay() {
    let backend = Backend::start().await;
    let yaml = format!(
        "workers: 1\nupstream:\n  url: {}\nroutes:\n  - path: /charges\n    methods: [POST]\n    \
         scope_headers: [x-tenant]\n    max_request_body: 1KiB\n    stream_request_body: true\n    \
         replay_authorization: {{{ON_PATH}}}\n",
        backend.url()
    );
    let proxy = Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("valid")).await;
    let c = proxy.client();
    let body = "x".repeat(8 * 1024);
    let send = |credential: &'static str| {
        let (c, body) = (c.clone(), body.clone());
        async move {
            c.send(
                "POST",
                "/charges",
                &[
                    ("idempotency-key", "streamed"),
                    ("authorization", credential),
                    ("x-tenant", "acme"),
                ],
                &body,
            )
            .await
        }
    };
    assert_eq!(send("Bearer good").await.status, 201);
    assert!(backend.checks().is_empty());
    let denied = send("Bearer revoked").await;
    assert_eq!(denied.status, 401, "{}", denied.text());
    assert!(send("Bearer good").await.replayed());
    assert_eq!(backend.checks().len(), 2);
    assert_eq!(backend.executions(), 1);
    proxy.stop().await;
}

/// A `fingerprint` key source's replays are checked like any other.
#[tokio::test]
async fn a_fingerprint_keyed_replay_is_checked() {
    let backend = Backend::start().await;
    let yaml = format!(
        "workers: 1\nupstream:\n  url: {}\nroutes:\n  - path: /charges\n    methods: [POST]\n    \
         key_from: [{{fingerprint: 10m}}]\n    scope_headers: [x-tenant]\n    \
         replay_authorization: {{{ON_PATH}}}\n",
        backend.url()
    );
    let proxy = Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("valid")).await;
    let c = proxy.client();
    let send = |credential: &'static str| {
        let c = c.clone();
        async move {
            c.send(
                "POST",
                "/charges",
                &[("authorization", credential), ("x-tenant", "acme")],
                "{}",
            )
            .await
        }
    };
    assert_eq!(send("Bearer good").await.status, 201);
    assert_eq!(send("Bearer forbidden").await.status, 403);
    assert!(send("Bearer good").await.replayed());
    assert_eq!(backend.checks().len(), 2);
    assert_eq!(backend.executions(), 1);
    proxy.stop().await;
}

/// `replay_authorization` follows a reload like any policy key (docs/behaviour.md §14).
#[tokio::test]
async fn the_check_follows_a_reload() {
    let backend = Backend::start().await;
    let proxy = Proxy::with_config(config(&backend, "", MEMORY)).await;
    let c = proxy.client();
    charge(&c, "/charges", "k", "Bearer good").await;
    assert!(
        charge(&c, "/charges", "k", "Bearer revoked")
            .await
            .replayed()
    );
    proxy.state.apply(config(&backend, ON_PATH, MEMORY));
    assert_eq!(
        charge(&c, "/charges", "k", "Bearer revoked").await.status,
        401
    );
    proxy.state.apply(config(&backend, "", MEMORY));
    assert!(
        charge(&c, "/charges", "k", "Bearer revoked")
            .await
            .replayed()
    );
    assert_eq!(backend.checks().len(), 1);
    proxy.stop().await;
}

/// A refusal's body is passed on up to 64 KiB, no more.
#[tokio::test]
async fn a_refusal_body_is_capped_at_64_kib() {
    let backend = Backend::start().await;
    let proxy = Proxy::with_config(config(&backend, ON_PATH, MEMORY)).await;
    let c = proxy.client();
    charge(&c, "/charges", "k", "Bearer good").await;
    let r = charge(&c, "/charges", "k", "Bearer big").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body.len(), 64 * 1024);
    proxy.stop().await;
}

/// `url:` sends the check to another server, through a pool: many replays, one
/// connection.
#[tokio::test]
async fn a_url_check_is_pooled() {
    let backend = Backend::start().await;
    let authorizer = Backend::start().await;
    let check = format!("url: '{}/auth/check?from=url'", authorizer.url());
    let proxy = Proxy::with_config(config(&backend, &check, MEMORY)).await;
    let c = proxy.client();
    charge(&c, "/charges", "k", "Bearer good").await;
    for _ in 0..20 {
        assert!(charge(&c, "/charges", "k", "Bearer good").await.replayed());
    }
    assert!(backend.checks().is_empty());
    let checks = authorizer.checks();
    assert_eq!(checks.len(), 20);
    assert_eq!(checks[0].path_and_query, "/auth/check?from=url");
    assert_eq!(
        checks[0].headers["host"],
        authorizer.addr.to_string().as_str()
    );
    assert_eq!(
        authorizer.connections(),
        1,
        "the replays share one connection"
    );
    let denied = charge(&c, "/charges", "k", "Bearer revoked").await;
    assert_eq!(denied.status, 401);
    proxy.stop().await;
}

/// On the same upstream, the check shares the upstream's pool: the first execution's
/// connection serves every check after it.
#[tokio::test]
async fn a_path_check_shares_the_upstreams_pool() {
    let backend = Backend::start().await;
    let proxy = Proxy::with_config(config(&backend, ON_PATH, MEMORY)).await;
    let c = proxy.client();
    charge(&c, "/charges", "k", "Bearer good").await;
    for _ in 0..20 {
        assert!(charge(&c, "/charges", "k", "Bearer good").await.replayed());
    }
    assert_eq!(backend.checks().len(), 20);
    assert_eq!(backend.connections(), 1);
    proxy.stop().await;
}

/// A duplicate of a request in flight is not checked (`409` or `wait` reveal nothing);
/// the waiter, once handed the replay, is.
#[tokio::test]
async fn in_flight_is_not_checked_and_a_waiter_handed_a_replay_is() {
    let backend = Backend::start().await;
    let config = config(&backend, ON_PATH, MEMORY);
    let proxy = Proxy::with_config(config).await;
    let c = proxy.client();
    let first = tokio::spawn({
        let c = c.clone();
        async move { charge(&c, "/charges/gate", "held", "Bearer good").await }
    });
    backend.held().await;
    let waiter = tokio::spawn({
        let c = c.clone();
        async move { charge(&c, "/charges/gate", "held", "Bearer revoked").await }
    });
    proxy.state.metrics.wait_until(|m| m.waiting() == 1).await;
    assert!(backend.checks().is_empty(), "waiting is not checked");
    backend.open_gate();
    assert_eq!(first.await.expect("first").status, 201);
    let waited = waiter.await.expect("waiter");
    assert_eq!(
        waited.status,
        401,
        "the waiter's replay is checked: {}",
        waited.text()
    );
    assert_eq!(backend.checks().len(), 1);
    assert_eq!(backend.executions(), 1);
    proxy.stop().await;
}

/// `on_concurrent: reject`: a duplicate in flight gets `409` unchecked.
#[tokio::test]
async fn a_409_in_flight_is_not_checked() {
    let backend = Backend::start().await;
    let yaml = format!(
        "workers: 1\nupstream:\n  url: {}\nroutes:\n  - path: /charges\n    methods: [POST]\n    \
         replay_authorization: {{{ON_PATH}}}\n",
        backend.url()
    );
    let proxy = Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("valid")).await;
    let c = proxy.client();
    let first = tokio::spawn({
        let c = c.clone();
        async move { charge(&c, "/charges/gate", "held", "Bearer good").await }
    });
    // The first is held at the backend's gate, its claim made.
    backend.held().await;
    let r = charge(&c, "/charges/gate", "held", "Bearer good").await;
    assert_eq!(r.status, 409);
    assert_eq!(r.problem(), "in-flight");
    assert!(backend.checks().is_empty());
    backend.open_gate();
    assert_eq!(first.await.expect("first").status, 201);
    proxy.stop().await;
}

/// §25: under `basic: true`, the principal is the user name and a hash of the password,
/// or, with `replay_authorization`, the user name alone, the check verifying the password.
#[tokio::test]
async fn a_basic_principal_is_the_user_alone_only_where_the_password_is_checked() {
    let backend = Backend::start().await;
    // alice:right and alice:wrong.
    let (right, wrong) = ("Basic YWxpY2U6cmlnaHQ=", "Basic YWxpY2U6d3Jvbmc=");
    for checked in [false, true] {
        let check = if checked {
            format!("    replay_authorization: {{{ON_PATH}}}\n")
        } else {
            String::new()
        };
        let yaml = format!(
            "workers: 1\nupstream:\n  url: {}\nroutes:\n  - path: /charges\n    methods: [POST]\n    \
             scope_principal: {{basic: true}}\n{check}",
            backend.url()
        );
        let config = Config::from_yaml_str(&yaml, &|_| None).expect("valid");
        let said = config.to_yaml();
        let made_of = if checked {
            "the principal is the user name alone"
        } else {
            "the principal is the user name and a SHA-256 of the password"
        };
        assert!(said.contains(made_of), "{said}");
        let proxy = Proxy::with_config(config).await;
        let c = proxy.client();
        let key = format!("basic-{checked}");
        let send = |credential: &'static str| {
            let (c, key) = (c.clone(), key.clone());
            async move {
                c.send(
                    "POST",
                    "/charges",
                    &[("idempotency-key", &key), ("authorization", credential)],
                    "{}",
                )
                .await
            }
        };
        assert_eq!(send(right).await.status, 201);
        let other = send(wrong).await;
        if checked {
            // The same scope, and the check refuses the wrong password.
            assert_eq!(other.status, 401, "{}", other.text());
            assert!(send(right).await.replayed());
        } else {
            // Another scope: executed anew, alice's record unread.
            assert_eq!(other.status, 201);
            assert!(!other.replayed());
        }
        proxy.stop().await;
    }
    assert_eq!(backend.executions(), 3);
}

/// What `--check` refuses, each naming its path.
#[test]
fn a_bad_replay_authorization_is_refused() {
    for (check, says) in [
        ("{method: GET}", "needs path"),
        ("{path: /a, url: 'http://h/a'}", "exactly one"),
        ("{path: a}", "must start with '/'"),
        ("{url: /a}", "not an absolute http or https URL"),
        ("{url: 'ftp://h/a'}", "not an absolute http or https URL"),
        ("{path: /a, timeout: 0s}", "greater than zero"),
        ("{path: /a, headers: ['bad header']}", "header"),
        ("{path: /a, copy_headers: [x]}", "unknown field"),
    ] {
        let yaml = format!(
            "upstream:\n  url: http://127.0.0.1:9\nroutes:\n  - path: /a\n    \
             replay_authorization: {check}\n"
        );
        let err = match Config::from_yaml_str(&yaml, &|_| None) {
            Ok(_) => panic!("accepted {check}"),
            Err(err) => err.to_string(),
        };
        assert!(
            err.starts_with("routes[0].replay_authorization") && err.contains(says),
            "{check}: {err}"
        );
    }
    // Inherited by routes, printed by --check, and loaded back the same.
    let yaml = "upstream:\n  url: http://127.0.0.1:9\nidempotency:\n  replay_authorization: \
                {url: 'https://auth.internal/check', headers: [authorization]}\n\
                routes:\n  - path: /a\n";
    let config = Config::from_yaml_str(yaml, &|_| None).expect("valid");
    let check = config.routes[0]
        .policy
        .replay_authorization
        .clone()
        .expect("inherited");
    assert_eq!(check.timeout, std::time::Duration::from_secs(1));
    let printed = config.to_yaml();
    assert!(
        printed.contains("url: https://auth.internal/check"),
        "{printed}"
    );
    assert_eq!(
        Config::from_yaml_str(&printed, &|_| None).expect("loads back"),
        config
    );
}

/// Under `cors`, the authorizer's `401` and idemgate's `503` are idemgate's answers to a
/// browser (docs/behaviour.md §24): they carry the CORS headers of the retry's origin,
/// and nothing the authorizer said about CORS.
#[tokio::test]
async fn a_refusal_and_an_undecided_check_carry_the_cors_headers() {
    let backend = Backend::start().await;
    let yaml = format!(
        "workers: 1\nupstream:\n  url: {}\nstore:\n{MEMORY}cors:\n  allow_origins: \
         [https://shop.example]\nroutes:\n  - path: /charges\n    methods: [POST]\n    \
         scope_headers: [x-tenant]\n    replay_authorization: {{{ON_PATH}}}\n",
        backend.url()
    );
    let proxy = Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("valid")).await;
    let c = proxy.client();
    let send = |credential: &'static str| {
        let c = c.clone();
        async move {
            c.send(
                "POST",
                "/charges",
                &[
                    ("idempotency-key", "k"),
                    ("authorization", credential),
                    ("x-tenant", "acme"),
                    ("origin", "https://shop.example"),
                    ("content-type", "application/json"),
                ],
                "{}",
            )
            .await
        }
    };
    assert_eq!(send("Bearer good").await.status, 201);
    for (credential, status) in [("Bearer revoked", 401), ("Bearer broken", 503)] {
        let answer = send(credential).await;
        assert_eq!(answer.status, status, "{}", answer.text());
        let header = |name: &str| answer.headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(
            header("access-control-allow-origin"),
            Some("https://shop.example")
        );
        assert!(
            header("access-control-expose-headers").is_some_and(|v| v.contains("Retry-After")),
            "{:?}",
            answer.headers
        );
        assert_eq!(header("vary"), Some("Origin"));
    }
    proxy.stop().await;
}
