//! A full Redis still replays (docs/behaviour.md §15). Under `maxmemory` with
//! `noeviction`, Redis refuses every write, the claim's included, even for a key that
//! already holds a record; reads are still answered. A completed key is replayed, never
//! executed again; a new key follows `on_unavailable`. Real redis-server processes,
//! filled until they refuse a write.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate::config::Config;
use idemgate::idempotency::{Completed, Fingerprint, OwnerToken, Record, ScopedKey, StoredBody};
use idemgate::metrics::Outcome;
use idemgate::store::{Claim, ClaimRequest, Fenced, Lease, RedisStore, Store};
use support::redis::RedisServer;
use support::{Proxy, Upstream};

fn store(url: &str) -> RedisStore {
    let yaml =
        format!("upstream:\n  url: http://127.0.0.1:1\nstore:\n  kind: redis\n  url: {url}\n");
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("config");
    RedisStore::new(&config.store).expect("store")
}

fn key(n: u8) -> ScopedKey {
    ScopedKey::from_bytes([n; 32])
}

fn req(n: u8) -> ClaimRequest {
    ClaimRequest {
        key: key(n),
        scope: None,
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        streamed: false,
    }
}

async fn acquire(s: &RedisStore, n: u8) -> Lease {
    match s.claim(req(n)).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing { record, .. } => panic!("expected to acquire, found {record:?}"),
    }
}

fn response() -> Completed {
    Completed::clear(
        Fingerprint::from_bytes([1; 32]),
        StatusCode::CREATED,
        Vec::new(),
        StoredBody::Stored(Bytes::from_static(b"{\"id\":1}")),
    )
}

/// What a claim finds in a full Redis: the completed record, the in-flight marker, and
/// for a key with nothing stored the refusal, with nothing written.
async fn a_full_redis_answers_claims_from_what_is_stored(server: &RedisServer, s: &RedisStore) {
    let done = acquire(s, 1).await;
    let landed = s
        .complete(&done, Arc::new(response()), Duration::from_secs(60))
        .await
        .expect("complete");
    assert_eq!(landed, Fenced::Done);
    let running = acquire(s, 2).await;

    let fillers = server.fill().await;
    assert!(fillers > 0, "the filler keys fitted before the refusal");

    match s.claim(req(1)).await.expect("a completed key is read") {
        Claim::Existing {
            record: Record::Completed(completed),
            ..
        } => assert_eq!(*completed, response()),
        other => panic!("expected the completed record, got {other:?}"),
    }
    match s.claim(req(2)).await.expect("an in-flight key is read") {
        Claim::Existing {
            record: Record::InFlight(marker),
            ..
        } => assert_eq!(marker.token, running.token),
        other => panic!("expected the in-flight marker, got {other:?}"),
    }
    let new = s.claim(req(3)).await;
    assert!(new.is_err(), "a new key cannot be claimed: {new:?}");
    assert_eq!(server.cli(&["EXISTS", &s.record_key(&key(3))]), "0");
}

/// Redis 7: the native `SET ... NX PX ... GET` is refused with OOM whatever the key holds.
#[tokio::test]
async fn a_full_redis_answers_native_claims_from_what_is_stored() {
    let server = RedisServer::start().await;
    let s = store(&server.url());
    a_full_redis_answers_claims_from_what_is_stored(&server, &s).await;
}

/// The claim script (a server that does not tell its version) is refused only when it
/// writes; the answers must be the same.
#[tokio::test]
async fn a_full_redis_answers_script_claims_from_what_is_stored() {
    let server = RedisServer::start().await;
    server.cli(&[
        "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info",
    ]);
    let s = store(&format!("redis://app:secret@127.0.0.1:{}/0", server.port));
    a_full_redis_answers_claims_from_what_is_stored(&server, &s).await;
}

fn redis_yaml(url: &str, on_unavailable: &str) -> String {
    format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {url}\n  timeout: 300ms\n  on_unavailable: {on_unavailable}\n"
    )
}

/// One key completed, then Redis fills up: its retry is replayed, under either setting.
async fn completed_then_full(on_unavailable: &str) -> (RedisServer, Upstream, Proxy<RedisStore>) {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::redis(&redis_yaml(&redis.url(), on_unavailable), &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "paid", r#"{"amount":7}"#).await;
    assert_eq!(first.status, 201);
    redis.fill().await;
    for _ in 0..2 {
        let retry = c.post("/charges", "paid", r#"{"amount":7}"#).await;
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert!(
            retry.replayed(),
            "the retry is a replay: {:?}",
            retry.headers
        );
        assert_eq!(retry.body, first.body);
    }
    let reused = c.post("/charges", "paid", r#"{"amount":8}"#).await;
    assert_eq!(reused.status, 422, "{}", reused.text());
    assert_eq!(reused.problem(), "key-reused");
    assert_eq!(up.count(), 1, "the completed key did not execute again");
    (redis, up, proxy)
}

#[tokio::test]
async fn under_pass_through_a_full_redis_replays_a_completed_key_and_forwards_a_new_one() {
    let (_redis, up, proxy) = completed_then_full("pass_through").await;
    let new = proxy.client().post("/charges", "new", "{}").await;
    assert_eq!(new.status, 201);
    assert!(!new.replayed());
    assert_eq!(up.count(), 2);
    assert_eq!(proxy.state.metrics.requests(Outcome::StoreBypassed), 1);
}

#[tokio::test]
async fn under_reject_a_full_redis_replays_a_completed_key_and_refuses_a_new_one() {
    let (_redis, up, proxy) = completed_then_full("reject").await;
    let new = proxy.client().post("/charges", "new", "{}").await;
    assert_eq!(new.status, 503, "{}", new.text());
    assert_eq!(new.problem(), "store-unavailable");
    assert_eq!(up.count(), 1);
}
