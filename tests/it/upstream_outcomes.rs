//! Upstream failures on the memory store (docs/behaviour.md §4): unreachable, reset,
//! timeout, and a marker whose owner died.

use crate::support;

use std::time::Duration;

use support::{BASIC, Proxy, Upstream};

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
        &policy.fingerprint_rules(),
        b"{}",
    );
    let claim = ClaimRequest {
        key: scoped,
        scope: None,
        fingerprint: fp,
        token: OwnerToken::random(),
        lease: Duration::ZERO,
        ttl: policy.ttl,
        streamed: false,
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
