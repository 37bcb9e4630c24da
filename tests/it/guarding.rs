//! Which requests are guarded and what reaches the upstream (docs/behaviour.md §2, §4,
//! §8): pass-through, bad keys and bodies, routes, header rewriting, hostile clients.

use crate::support;

use std::time::Duration;

use idemgate::metrics::Outcome;
use support::{BASIC, Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
    assert!(head.contains("body-timeout"), "{head}");
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

/// Sends raw bytes and reads until the server closes.
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = socket.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}
