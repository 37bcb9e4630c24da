//! `reconcile` (docs/behaviour.md §18) with real parts: the toy backend on a socket, whose
//! `GET /charges/by-key/{key}` says whether a charge exists, behind idemgate on the
//! memory store and on Redis. A timeout or a reset is settled by that lookup: found, the
//! charge is the answer; not found, the key is released; no lookup answer, the outcome
//! stays unknown. Never a second execution.

use crate::support;

use std::sync::Arc;

use idemgate::config::Config;
use idemgate::metrics::Reconciled;
use idemgate::store::{RedisStore, Store};
use support::redis::RedisServer;
use support::{Proxy, TestClient, toy_backend};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The toy backend on a free port, stopped by [`Backend::stop`].
struct Backend {
    client: TestClient,
    url: String,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    async fn start() -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(toy_backend::serve(listener, async move {
            let _ = stopped.await;
        }));
        Backend {
            client: TestClient::new(addr),
            url: format!("http://{addr}"),
            stop,
            task,
        }
    }

    /// Charges the backend created, as `GET /stats` says.
    async fn charges(&self) -> u64 {
        let stats = self.client.send("GET", "/stats", &[], "").await;
        stats.json()["charges_created"]
            .as_u64()
            .expect("charges_created")
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        // A delayed answer still sleeping is cut short: the grace is not waited out.
        self.task.abort();
        let _ = self.task.await;
    }
}

/// `/charges` guarded with `reconcile` (`lookup` written into its mapping), an upstream
/// timeout of 300ms, and `fingerprint_query: false` so that a retry without the toy's
/// failure knobs is the same request.
fn config(backend: &Backend, lookup: &str, store: &str) -> Config {
    let yaml = format!(
        "upstream:\n  url: {}\n  timeout: 300ms\nstore:\n{store}routes:\n  - path: /charges\n    \
         methods: [POST]\n    fingerprint_query: false\n    reconcile: {{{lookup}}}\n",
        backend.url
    );
    Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid")
}

const MEMORY: &str = "  kind: memory\n";
const FOUND: &str = "path: '/charges/by-key/{key}', timeout: 1s, attempts: 2";

fn reconciliations<S: Store>(proxy: &Proxy<S>, result: Reconciled) -> u64 {
    proxy.state.metrics.reconciliations(result)
}

/// The story of a timeout that the lookup settles, on any store.
async fn a_timeout_is_settled_by_the_lookup<S: Store>(proxy: &Proxy<S>, backend: &Backend) {
    let c = proxy.client();
    let body = r#"{"amount": 1200}"#;
    // Created at once, answered after 2s: past idemgate's 300ms.
    let first = c.post("/charges?delay_ms=2000", "order#1/a", body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.headers["idempotency-reconciled"], "true");
    assert!(
        !first.replayed(),
        "the waiting client's answer is no replay"
    );
    assert_eq!(first.json()["amount"], 1200, "{}", first.text());
    for _ in 0..2 {
        let retry = c.post("/charges", "order#1/a", body).await;
        assert_eq!(retry.status, 200);
        assert!(retry.replayed());
        assert_eq!(retry.headers["idempotency-reconciled"], "true");
        assert_eq!(retry.body, first.body);
    }
    assert_eq!(backend.charges().await, 1, "executed once");
    assert_eq!(reconciliations(proxy, Reconciled::Executed), 1);
    assert_eq!(reconciliations(proxy, Reconciled::Unknown), 0);
}

#[tokio::test]
async fn a_timeout_whose_charge_the_lookup_finds_is_answered_and_replayed_with_it() {
    let backend = Backend::start().await;
    let proxy = Proxy::with_config(config(&backend, FOUND, MEMORY)).await;
    a_timeout_is_settled_by_the_lookup(&proxy, &backend).await;
    let text = proxy.state.metrics.render();
    for line in [
        "idemgate_reconciliations_total{result=\"executed\"} 1",
        "idemgate_reconciliations_total{result=\"not_executed\"} 0",
        "idemgate_reconciliations_total{result=\"unknown\"} 0",
    ] {
        assert!(text.contains(line), "no {line} in:\n{text}");
    }
    proxy.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn a_lost_request_the_lookup_does_not_find_is_released_and_the_retry_executes_once() {
    let backend = Backend::start().await;
    let proxy = Proxy::with_config(config(&backend, FOUND, MEMORY)).await;
    let c = proxy.client();
    // The connection is closed before the charge is made: a reset, outcome unknown.
    let first = c.post("/charges?lose=1", "lost-1", "{}").await;
    assert_eq!(first.status, 502, "{}", first.text());
    assert_eq!(first.problem(), "upstream-unreachable");
    assert!(first.headers.get("idempotency-reconciled").is_none());
    assert!(proxy.state.store.is_empty(), "released before answering");
    assert_eq!(backend.charges().await, 0);
    let retry = c.post("/charges", "lost-1", "{}").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(!retry.replayed(), "the retry executed");
    let again = c.post("/charges", "lost-1", "{}").await;
    assert!(again.replayed());
    assert_eq!(backend.charges().await, 1, "executed once in all");
    assert_eq!(reconciliations(&proxy, Reconciled::NotExecuted), 1);
    proxy.stop().await;
    backend.stop().await;
}

/// A lookup that answers 500 on every attempt, or outlasts its timeout on every attempt,
/// settles nothing: `outcome-unknown` is recorded and replayed, as without `reconcile`.
#[tokio::test]
async fn a_lookup_that_fails_every_attempt_leaves_the_outcome_unknown() {
    let backend = Backend::start().await;
    let lookups = [
        ("path: '/charges/by-key/{key}?fail=1', attempts: 3", "fails"),
        (
            "path: '/charges/by-key/{key}?delay_ms=5000', timeout: 100ms, attempts: 2",
            "hangs",
        ),
    ];
    for (lookup, key) in lookups {
        let proxy = Proxy::with_config(config(&backend, lookup, MEMORY)).await;
        let c = proxy.client();
        let first = c.post("/charges?delay_ms=2000", key, "{}").await;
        assert_eq!(first.status, 504, "{lookup}: {}", first.text());
        assert_eq!(first.problem(), "outcome-unknown");
        let retry = c.post("/charges", key, "{}").await;
        assert_eq!(retry.status, 504);
        assert!(retry.replayed(), "{lookup}: recorded");
        assert!(retry.headers.get("idempotency-reconciled").is_none());
        assert_eq!(reconciliations(&proxy, Reconciled::Unknown), 1, "{lookup}");
        assert_eq!(reconciliations(&proxy, Reconciled::Executed), 0, "{lookup}");
        proxy.stop().await;
    }
    assert_eq!(backend.charges().await, 2, "one per key, never a second");
    backend.stop().await;
}

/// A `fingerprint:` key is the request's own, unknown to the upstream: never looked up.
#[tokio::test]
async fn a_fingerprint_key_is_never_reconciled() {
    let backend = Backend::start().await;
    let yaml = format!(
        "upstream:\n  url: {}\n  timeout: 300ms\nroutes:\n  - path: /charges\n    \
         key_from: [{{fingerprint: 1m}}]\n    scope_headers: [x-client]\n    \
         reconcile: {{{FOUND}}}\n",
        backend.url
    );
    let proxy = Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("config")).await;
    let r = proxy
        .client()
        .send("POST", "/charges?delay_ms=2000", &[("x-client", "a")], "{}")
        .await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.problem(), "outcome-unknown");
    for result in Reconciled::ALL {
        assert_eq!(reconciliations(&proxy, result), 0);
    }
    proxy.stop().await;
    backend.stop().await;
}

#[tokio::test]
async fn a_timeout_is_settled_by_the_lookup_on_redis() {
    let redis = RedisServer::start().await;
    let backend = Backend::start().await;
    let store = format!("  kind: redis\n  url: {}\n", redis.url());
    let config = config(&backend, FOUND, &store);
    let store = Arc::new(RedisStore::new(&config.store).expect("redis store"));
    let proxy = Proxy::with_store(config, store).await;
    a_timeout_is_settled_by_the_lookup(&proxy, &backend).await;
    proxy.stop().await;
    backend.stop().await;
}

/// A crashed owner's marker, taken over by a retry: under `reconcile` the retry asks
/// the upstream before recording `outcome-unknown`, with its own key and headers, and
/// the charge the crashed owner made is the answer (docs/behaviour.md §18).
#[tokio::test]
async fn a_crashed_owners_key_is_settled_by_the_lookup_when_a_retry_takes_it_over() {
    use idemgate::idempotency::{Fingerprint, OwnerToken, ScopedKey};
    use idemgate::store::{Claim, ClaimRequest};
    use std::time::Duration;

    let backend = Backend::start().await;
    let proxy = Proxy::with_config(config(&backend, FOUND, MEMORY)).await;
    let (key, body) = ("crashed-1", "{}");
    // The crashed owner's request reached the backend, which charged it.
    let charged = backend
        .client
        .send(
            "POST",
            "/charges",
            &[
                ("idempotency-key", key),
                ("content-type", "application/json"),
            ],
            body,
        )
        .await;
    assert_eq!(charged.status, 201);
    // Its marker, as it left it: a lease that has ended.
    let headers = {
        let mut h = http::HeaderMap::new();
        h.insert("idempotency-key", key.parse().expect("value"));
        h.insert("content-type", "application/json".parse().expect("value"));
        h
    };
    let id = idemgate::proxy::record_id(
        &proxy.state.config,
        &http::Method::POST,
        "/charges",
        &headers,
        key,
    )
    .expect("guarded");
    let scoped = ScopedKey::from_hex(&id["idemgate:".len()..]).expect("id");
    let policy = &proxy.state.config.routes[0].policy;
    let fingerprint = Fingerprint::new(
        &http::Method::POST,
        "/charges",
        &headers,
        &policy.fingerprint_rules(),
        body.as_bytes(),
    );
    let claim = ClaimRequest {
        key: scoped,
        scope: None,
        fingerprint,
        token: OwnerToken::random(),
        lease: Duration::from_millis(1),
        ttl: Duration::from_secs(3600),
        streamed: false,
    };
    let Claim::Acquired(_) = proxy.state.store.claim(claim).await.expect("claim") else {
        panic!("the key was free")
    };
    // Taken only once the lease has ended: poll with a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let retry = loop {
        let retry = proxy.client().post("/charges", key, body).await;
        if retry.status != 409 || std::time::Instant::now() > deadline {
            break retry;
        }
    };
    // The lookup's own answer: `200` and the charge.
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(retry.headers["idempotency-reconciled"], "true");
    assert_eq!(retry.body, charged.body, "the crashed owner's charge");
    let again = proxy.client().post("/charges", key, body).await;
    assert!(again.replayed());
    assert_eq!(backend.charges().await, 1, "never executed again");
    assert_eq!(reconciliations(&proxy, Reconciled::Executed), 1);
    proxy.stop().await;
    backend.stop().await;
}

/// A key that is `.` or `..` would make the lookup's key segment a dot segment, which
/// the upstream resolves away (`/lookup/..` is `/`): such a segment is percent-encoded
/// (docs/behaviour.md §25), and a key that merely holds dots is sent as it is. A real
/// upstream records the request target it received, byte for byte.
#[tokio::test]
async fn a_lookup_percent_encodes_a_key_segment_that_is_a_dot_segment() {
    let up = support::Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {}\nroutes:\n  - path: /reset\n    reconcile: {{path: \
         '/lookup/{{key}}/status?of={{key}}', attempts: 1}}\n",
        up.url()
    );
    let proxy = Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("config")).await;
    let cases = [
        (".", "/lookup/%2E/status?of=."),
        ("..", "/lookup/%2E%2E/status?of=.."),
        ("...", "/lookup/.../status?of=..."),
        ("a..b", "/lookup/a..b/status?of=a..b"),
        (".well", "/lookup/.well/status?of=.well"),
    ];
    for (n, (key, target)) in cases.into_iter().enumerate() {
        // `/reset` drops the connection: the outcome is unknown, and the lookup asks.
        let answer = proxy.client().post("/reset", key, "{}").await;
        assert_eq!(answer.status, 201, "{key}: {}", answer.text());
        assert_eq!(answer.headers["idempotency-reconciled"], "true");
        let seen = up.seen();
        assert_eq!(seen.len(), 2 * (n + 1));
        assert_eq!(seen[2 * n + 1].method, "GET");
        assert_eq!(seen[2 * n + 1].path_and_query, target, "{key}");
    }
    proxy.stop().await;
}
