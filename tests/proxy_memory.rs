//! The proxy over real sockets, on the memory store: one test per behaviour of SPEC §2–§4.

mod support;

use std::time::Duration;

use idemgate::metrics::Outcome;
use support::{BASIC, Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn retry_replays_the_byte_identical_response_and_the_upstream_runs_once() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "key-1", r#"{"amount":100}"#).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(
        first.headers["set-cookie"], "session=1",
        "a first response keeps Set-Cookie"
    );
    for _ in 0..3 {
        let again = c.post("/charges", "key-1", r#"{"amount":100}"#).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body);
        assert!(again.replayed());
        assert_eq!(again.headers["content-type"], "application/json");
        assert_eq!(again.headers["x-execution"], "1");
        assert!(
            again.headers.get("set-cookie").is_none(),
            "replays drop Set-Cookie"
        );
        assert!(again.headers.contains_key("date"), "Date is regenerated");
        assert_eq!(
            again.headers["content-length"],
            first.body.len().to_string()
        );
    }
    assert_eq!(up.count(), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::Forwarded), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::Replayed), 3);
}

#[tokio::test]
async fn fifty_concurrent_duplicates_execute_once_and_the_rest_get_409() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let c = proxy.client();
        tasks.push(tokio::spawn(async move {
            c.post("/gate/charges", "dup", "{}").await
        }));
    }
    // Everyone but the owner is refused while the owner's request is held upstream.
    proxy
        .state
        .metrics
        .wait_until(|m| m.requests(Outcome::InFlight) == 49)
        .await;
    up.open_gate();
    let mut created = 0;
    for t in tasks {
        let r = t.await.expect("join");
        match r.status.as_u16() {
            201 => created += 1,
            409 => {
                assert_eq!(r.problem(), "in-flight");
                assert!(r.headers.contains_key("retry-after"));
            }
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(up.count(), 1);
    let replay = proxy.client().post("/gate/charges", "dup", "{}").await;
    assert!(replay.replayed());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn same_key_with_another_body_is_422_and_the_record_is_unchanged() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "k", r#"{"amount":1}"#).await;
    let other = c.post("/charges", "k", r#"{"amount":2}"#).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.problem(), "key-reused");
    let other_path = c.post("/refunds", "k", r#"{"amount":1}"#).await;
    assert_eq!(other_path.problem(), "key-reused");
    let again = c.post("/charges", "k", r#"{"amount":1}"#).await;
    assert_eq!(again.body, first.body);
    assert!(again.replayed());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn another_authorization_executes_separately_and_never_sees_the_other_response() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let alice = |auth: &'static str| {
        let c = c.clone();
        async move {
            c.send(
                "POST",
                "/charges",
                &[("idempotency-key", "shared"), ("authorization", auth)],
                "{}",
            )
            .await
        }
    };
    let a = alice("Bearer alice").await;
    let b = alice("Bearer bob").await;
    assert_eq!(a.status, 201);
    assert_eq!(b.status, 201);
    assert!(!b.replayed());
    assert_eq!(a.json()["authorization"], "Bearer alice");
    assert_eq!(b.json()["authorization"], "Bearer bob");
    assert_eq!(up.count(), 2);
    let b2 = alice("Bearer bob").await;
    assert_eq!(b2.body, b.body);
    let a2 = alice("Bearer alice").await;
    assert_eq!(a2.body, a.body);
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn get_and_keyless_post_pass_through_every_time() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    for _ in 0..2 {
        assert_eq!(
            c.send("GET", "/charges", &[("idempotency-key", "g")], "")
                .await
                .status,
            201
        );
        assert_eq!(c.send("POST", "/charges", &[], "{}").await.status, 201);
    }
    assert_eq!(up.count(), 4);
    assert_eq!(proxy.state.metrics.requests(Outcome::Passthrough), 4);
    assert!(
        proxy.state.store.is_empty(),
        "pass-through never touches the store"
    );
}

#[tokio::test]
async fn invalid_keys_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let long = "a".repeat(256);
    let bad: [&[(&str, &str)]; 6] = [
        &[("idempotency-key", "")],
        &[("idempotency-key", long.as_str())],
        &[("idempotency-key", "a b")],
        &[("idempotency-key", "a,b")],
        &[("idempotency-key", "one"), ("idempotency-key", "two")],
        &[("idempotency-key", "\"unterminated")],
    ];
    for headers in bad {
        let r = c.send("POST", "/charges", headers, "{}").await;
        assert_eq!(r.status, 400, "{headers:?}");
        assert_eq!(r.problem(), "invalid-key");
    }
    // Non-ASCII bytes need a raw request: the test client refuses to send them.
    let raw = raw_exchange(proxy.addr, b"POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: caf\xc3\xa9\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert!(raw.contains("invalid-key"), "{raw}");
    assert_eq!(up.count(), 0);
    assert!(proxy.state.store.is_empty());
}

#[tokio::test]
async fn quoted_and_bare_keys_name_the_same_record() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "7c9e-abc", "{}").await;
    let quoted = c.post("/charges", "\"7c9e-abc\"", "{}").await;
    assert!(quoted.replayed());
    assert_eq!(quoted.body, first.body);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn oversized_bodies_are_413_and_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nidempotency:\n  max_request_body: 16\n",
        &up,
    )
    .await;
    let c = proxy.client();
    let r = c.post("/charges", "big", &"x".repeat(17)).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.problem(), "body-too-large");
    // Chunked, no Content-Length: refused once more than the limit arrived.
    let raw = raw_exchange(
        proxy.addr,
        b"POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: chunky\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\na\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    // At the limit is fine, and a keyless body is streamed without a limit.
    assert_eq!(
        c.post("/charges", "fits", &"x".repeat(16)).await.status,
        201
    );
    assert_eq!(
        c.send("POST", "/charges", &[], &"x".repeat(1000))
            .await
            .status,
        201
    );
    assert_eq!(up.count(), 2);
    // The refused key was never claimed: it can be used now.
    assert_eq!(c.post("/charges", "big", "{}").await.status, 201);
}

#[tokio::test]
async fn a_client_that_disconnects_leaves_a_record_that_a_retry_replays() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let mut socket = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    let body = r#"{"amount":5}"#;
    let head = format!(
        "POST /gate/charges HTTP/1.1\r\nhost: x\r\nidempotency-key: gone\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.expect("write");
    up.wait_for(1).await;
    drop(socket);
    up.open_gate();
    proxy
        .state
        .metrics
        .wait_until(|m| m.requests(Outcome::Forwarded) == 1)
        .await;
    let retry = proxy.client().post("/gate/charges", "gone", body).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.json()["execution"], 1);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn routes_require_keys_and_override_methods() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nroutes:\n  - path: /charges\n    methods: [POST]\n    required: true\n  - path: /webhooks\n    enabled: false\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let missing = c.send("POST", "/charges/42", &[], "{}").await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.problem(), "missing-key");
    assert_eq!(
        c.send("POST", "/chargesX", &[], "{}").await.status,
        201,
        "segment-wise match only"
    );
    // PUT is not guarded on /charges: the same key passes through twice.
    assert_eq!(
        c.send("PUT", "/charges/1", &[("idempotency-key", "p")], "{}")
            .await
            .status,
        201
    );
    assert_eq!(
        c.send("PUT", "/charges/1", &[("idempotency-key", "p")], "{}")
            .await
            .status,
        201
    );
    // A disabled route passes keyed requests through.
    assert_eq!(c.post("/webhooks/x", "w", "{}").await.status, 201);
    assert!(!c.post("/webhooks/x", "w", "{}").await.replayed());
    assert_eq!(up.count(), 5);
}

#[tokio::test]
async fn release_statuses_free_the_key_and_other_statuses_are_recorded() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    for _ in 0..2 {
        let r = c.post("/status/503", "busy", "{}").await;
        assert_eq!(r.status, 503);
        assert!(!r.replayed());
    }
    assert_eq!(up.count(), 2, "503 released the claim: the retry executed");
    let first = c.post("/status/500", "boom", "{}").await;
    let again = c.post("/status/500", "boom", "{}").await;
    assert_eq!(again.status, 500);
    assert!(again.replayed(), "a 500 may follow a side effect: recorded");
    assert_eq!(again.body, first.body);
    assert_eq!(up.count(), 3);
}

#[tokio::test]
async fn a_response_too_large_to_keep_is_delivered_once_and_never_executed_again() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nidempotency:\n  max_response_body: 1KiB\n",
        &up,
    )
    .await;
    let c = proxy.client();
    let first = c.post("/big/5000", "large", "{}").await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.body.len(),
        5000,
        "the first client gets the whole body"
    );
    let retry = c.post("/big/5000", "large", "{}").await;
    assert_eq!(retry.status, 409);
    assert_eq!(retry.problem(), "not-replayable");
    assert_eq!(up.count(), 1);
    let small = c.post("/big/1024", "small", "{}").await;
    assert_eq!(c.post("/big/1024", "small", "{}").await.body, small.body);
}

#[tokio::test]
async fn forwarding_drops_hop_by_hop_headers_and_adds_forwarded_ones() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let r = c
        .send(
            "POST",
            "/charges?x=1&y=%20",
            &[
                ("idempotency-key", "\"hdr\""),
                ("connection", "x-drop-me"),
                ("x-drop-me", "1"),
                ("te", "trailers"),
                ("x-forwarded-for", "203.0.113.7"),
                ("x-custom", "kept"),
            ],
            "{}",
        )
        .await;
    assert_eq!(r.status, 201);
    let seen = &up.seen()[0];
    assert_eq!(seen.path_and_query, "/charges?x=1&y=%20");
    assert_eq!(
        seen.headers["idempotency-key"], "\"hdr\"",
        "forwarded unchanged"
    );
    assert_eq!(seen.headers["x-custom"], "kept");
    assert!(!seen.headers.contains_key("x-drop-me"));
    assert!(!seen.headers.contains_key("te"));
    assert_eq!(seen.headers["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    // Pass-through requests are rewritten the same way.
    c.send(
        "GET",
        "/plain",
        &[("x-drop-me", "1"), ("connection", "x-drop-me")],
        "",
    )
    .await;
    let seen = &up.seen()[1];
    assert!(!seen.headers.contains_key("x-drop-me"));
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_releases_the_claim() {
    // A port that was free a moment ago: nothing listens there.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let config = idemgate::config::Config::from_yaml_str(
        &format!("upstream:\n  url: http://{addr}\n"),
        &|_| None,
    )
    .expect("config");
    let proxy = Proxy::with_config(config).await;
    let c = proxy.client();
    let r = c.post("/charges", "down", "{}").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.problem(), "upstream-unreachable");
    assert!(
        proxy.state.store.is_empty(),
        "the claim was released before answering"
    );
    assert!(!c.post("/charges", "down", "{}").await.replayed());
}

#[tokio::test]
async fn a_reset_after_sending_records_outcome_unknown_and_retries_replay_it() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/reset", "r", "{}").await;
    assert_eq!(first.status, 502);
    assert_eq!(first.problem(), "outcome-unknown");
    assert!(!first.replayed());
    let retry = c.post("/reset", "r", "{}").await;
    assert_eq!(retry.status, 502);
    assert_eq!(retry.problem(), "outcome-unknown");
    assert!(retry.replayed());
    assert_eq!(up.count(), 1, "never executed twice");
}

#[tokio::test]
async fn an_upstream_timeout_is_504_outcome_unknown_or_released_by_choice() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}\n  timeout: 200ms\n", &up).await;
    let c = proxy.client();
    let first = c.post("/hang", "t", "{}").await;
    assert_eq!(first.status, 504);
    assert_eq!(first.problem(), "outcome-unknown");
    let retry = c.post("/hang", "t", "{}").await;
    assert_eq!(retry.status, 504);
    assert!(retry.replayed());
    assert_eq!(up.count(), 1);

    let release = Proxy::start(
        "upstream:\n  url: {upstream}\n  timeout: 200ms\nidempotency:\n  on_unknown_outcome: release\n",
        &up,
    )
    .await;
    let c = release.client();
    assert_eq!(c.post("/hang", "t2", "{}").await.status, 504);
    let again = c.post("/hang", "t2", "{}").await;
    assert!(!again.replayed(), "released: the retry executed");
    assert_eq!(up.count(), 3);
}

#[tokio::test]
async fn shutdown_closes_the_listener_and_finishes_in_flight_requests() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let addr = proxy.addr;
    let state = std::sync::Arc::clone(&proxy.state);
    let c = proxy.client();
    let pending = tokio::spawn(async move { c.post("/gate/charges", "sd", "{}").await });
    up.wait_for(1).await;
    let stopping = tokio::spawn(proxy.stop());
    // The listener closes at once: new connections are refused.
    let mut refused = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(refused, "listener still accepting after shutdown began");
    up.open_gate();
    let r = pending.await.expect("join");
    assert_eq!(r.status, 201);
    assert_eq!(
        stopping.await.expect("join"),
        idemgate::proxy::Shutdown::Drained
    );
    assert_eq!(state.metrics.requests(Outcome::Forwarded), 1);
}

#[tokio::test]
async fn an_expired_marker_becomes_a_recorded_outcome_unknown() {
    use idemgate::idempotency::{Fingerprint, IdempotencyKey, OwnerToken, ScopedKey};
    use idemgate::store::{ClaimRequest, Store};
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    // A proxy that died after forwarding left this marker, its lease already over.
    let key: IdempotencyKey = idemgate::idempotency::key::parse_value(b"crashed").expect("key");
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let policy = &proxy.state.config.idempotency;
    let scoped = ScopedKey::new(&headers, &policy.scope_headers, &key);
    let fp = Fingerprint::new(
        &http::Method::POST,
        "/charges",
        &headers,
        &policy.fingerprint_headers,
        b"{}",
    );
    let claim = ClaimRequest {
        key: scoped,
        fingerprint: fp,
        token: OwnerToken::random(),
        lease: Duration::ZERO,
        ttl: policy.ttl,
    };
    let _ = proxy.state.store.claim(claim).await.expect("claim");
    let c = proxy.client();
    let r = c.post("/charges", "crashed", "{}").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.problem(), "outcome-unknown");
    assert!(r.replayed(), "it answers from the (now recorded) outcome");
    let again = c.post("/charges", "crashed", "{}").await;
    assert_eq!(again.body, r.body);
    assert_eq!(up.count(), 0, "never a silent second execution");
}

/// Sends raw bytes and reads until the server closes.
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = socket.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

const WAIT: &str =
    "upstream:\n  url: {upstream}\nidempotency:\n  on_concurrent: wait\n  wait_timeout: 10s\n";

#[tokio::test]
async fn on_concurrent_wait_blocks_duplicates_until_the_first_completes_then_replays() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(WAIT, &up).await;
    let c = proxy.client();
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.post("/gate/charges", "w", "{}").await }
    });
    up.wait_for(1).await;
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.post("/gate/charges", "w", "{}").await })
        })
        .collect();
    proxy.state.metrics.wait_until(|m| m.waiting() == 5).await;
    up.open_gate();
    let first = first.await.expect("join");
    assert_eq!(first.status, 201);
    for w in waiters {
        let r = w.await.expect("join");
        assert_eq!(r.status, 201, "{}", r.text());
        assert!(r.replayed());
        assert_eq!(r.body, first.body);
    }
    assert_eq!(up.count(), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::InFlight), 0);
}

#[tokio::test]
async fn on_concurrent_wait_hands_a_released_claim_to_one_waiter() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(WAIT, &up).await;
    let c = proxy.client();
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.post("/gate/status/503", "rel", "{}").await }
    });
    up.wait_for(1).await;
    let waiter = tokio::spawn({
        let c = c.clone();
        async move { c.post("/gate/status/503", "rel", "{}").await }
    });
    // The waiter is parked on the key before the owner finishes.
    proxy.state.metrics.wait_until(|m| m.waiting() == 1).await;
    up.open_gate();
    assert_eq!(first.await.expect("join").status, 503);
    let second = waiter.await.expect("join");
    assert_eq!(second.status, 503);
    assert!(!second.replayed(), "the waiter executed after the release");
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn on_concurrent_wait_gives_up_after_wait_timeout() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  on_concurrent: wait\n  wait_timeout: 150ms\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.post("/gate/charges", "slow", "{}").await }
    });
    up.wait_for(1).await;
    let started = std::time::Instant::now();
    let r = c.post("/gate/charges", "slow", "{}").await;
    assert_eq!(r.status, 409);
    assert_eq!(r.problem(), "in-flight");
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "answered before wait_timeout"
    );
    up.open_gate();
    assert_eq!(first.await.expect("join").status, 201);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_trickling_guarded_body_times_out_holding_no_claim() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}\n  timeout: 300ms\n", &up).await;
    let mut socket = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    socket
        .write_all(b"POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: slow-body\r\ncontent-length: 100\r\n\r\n{")
        .await
        .expect("write");
    let mut out = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut out))
        .await
        .expect("answered within the bound")
        .expect("read");
    let head = String::from_utf8_lossy(&out[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(head.contains("request-timeout"), "{head}");
    assert_eq!(up.count(), 0);
    assert!(proxy.state.store.is_empty(), "no claim was made");
    assert_eq!(
        proxy
            .client()
            .post("/charges", "slow-body", "{}")
            .await
            .status,
        201
    );
}

#[tokio::test]
async fn malformed_requests_and_header_floods_get_a_4xx_and_reach_nothing() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let garbage = raw_exchange(proxy.addr, b"\x16\x03\x01 this is not http\r\n\r\n").await;
    assert!(
        garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
        "{garbage}"
    );
    let mut flood = b"POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: flood\r\n".to_vec();
    for i in 0..200 {
        flood.extend_from_slice(format!("x-flood-{i}: {}\r\n", "v".repeat(1024)).as_bytes());
    }
    flood.extend_from_slice(b"content-length: 0\r\n\r\n");
    let answer = raw_exchange(proxy.addr, &flood).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "{answer}"
    );
    assert_eq!(up.count(), 0);
    assert!(proxy.state.store.is_empty());
}

#[tokio::test]
async fn a_memory_store_full_of_markers_answers_503_even_under_pass_through() {
    let up = Upstream::start().await;
    let yaml =
        "upstream:\n  url: {upstream}\nstore:\n  max_entries: 1\n  on_unavailable: pass_through\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let held = tokio::spawn({
        let c = c.clone();
        async move { c.post("/gate/charges", "holder", "{}").await }
    });
    up.wait_for(1).await;
    let r = c.post("/charges", "another", "{}").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.problem(), "store-unavailable");
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(up.count(), 1, "not forwarded unguarded");
    up.open_gate();
    assert_eq!(held.await.expect("join").status, 201);
    // Once the marker is a completed record it can be evicted for the next key.
    assert_eq!(c.post("/charges", "another", "{}").await.status, 201);
}

#[tokio::test]
async fn the_upstreams_own_replay_marker_never_reaches_a_first_response() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/marked", "mk", "{}").await;
    assert_eq!(first.status, 201);
    assert!(
        first.headers.get("idempotent-replayed").is_none(),
        "{:?}",
        first.headers
    );
    let again = c.post("/marked", "mk", "{}").await;
    assert_eq!(
        again.headers.get_all("idempotent-replayed").iter().count(),
        1
    );
    assert!(again.replayed());
}

#[tokio::test]
async fn clients_may_speak_h2c() {
    use http_body_util::{BodyExt, Full};
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let req = http::Request::post(format!("http://{}/charges", proxy.addr))
            .header("idempotency-key", "h2")
            .body(Full::new(bytes::Bytes::from_static(b"{}")))
            .expect("request");
        let resp = client.request(req).await.expect("h2c response");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.status(), 201);
        let replayed = resp.headers().contains_key("idempotent-replayed")
            && resp.headers()["idempotent-replayed"] == "true";
        bodies.push((
            replayed,
            resp.into_body().collect().await.expect("body").to_bytes(),
        ));
    }
    assert!(!bodies[0].0 && bodies[1].0);
    assert_eq!(bodies[0].1, bodies[1].1);
    assert_eq!(up.count(), 1);
}
