//! A reply the Redis client cannot read is a store error, never "nothing there": the
//! claim must not be taken as acquired, or every retry would execute. A fake Redis
//! answers the handshake as Redis does, then malformed RESP to the claim.

use crate::support;

use std::time::Duration;

use idemgate::config::Config;
use idemgate::idempotency::{Fingerprint, OwnerToken, ScopedKey};
use idemgate::store::{ClaimRequest, RedisStore, Store};
use support::fake_redis::{FakeRedis, Info};
use support::{Proxy, Upstream};

/// Negative lengths other than -1, a null with content, an integer that is not one.
const MALFORMED: [&[u8]; 4] = [b"$-5\r\n", b"*-3\r\n", b":abc\r\n", b"_x\r\n"];

/// Each way of claiming: the native SET (Redis 7), the script (Redis 6), and the script
/// again when `INFO` is malformed too, as from a server that answers `$-5` to everything.
const SERVERS: [Info; 3] = [
    Info::Version("7.0.0"),
    Info::Version("6.2.0"),
    Info::Garbage,
];

/// A claim that neither fails nor succeeds within this is a hang, not an answer.
const ANSWER: Duration = Duration::from_secs(5);

fn yaml(url: &str) -> String {
    format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {url}\n  timeout: 300ms\n  on_unavailable: reject\n"
    )
}

fn store(url: &str) -> RedisStore {
    let yaml = yaml(url).replace("{upstream}", "http://127.0.0.1:1");
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("config");
    RedisStore::new(&config.store).expect("store")
}

fn req() -> ClaimRequest {
    ClaimRequest {
        key: ScopedKey::from_bytes([3; 32]),
        scope: None,
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        streamed: false,
    }
}

#[tokio::test]
async fn a_claim_answered_with_malformed_resp_is_a_store_error() {
    for info in SERVERS {
        for reply in MALFORMED {
            let shown = format!(
                "{info:?}, claim answered {:?}",
                String::from_utf8_lossy(reply)
            );
            let fake = FakeRedis::start(info, reply).await;
            let s = store(&fake.url());
            let claim = tokio::time::timeout(ANSWER, s.claim(req()))
                .await
                .unwrap_or_else(|_| panic!("{shown}: no answer within {ANSWER:?}"));
            assert!(claim.is_err(), "{shown}: {claim:?}");
            if let Info::Version(_) = info {
                let received = fake.received();
                assert!(
                    received.iter().any(|c| c == "SET" || c == "EVALSHA"),
                    "{shown}: the claim reached the server: {received:?}"
                );
            }
        }
    }
}

/// The incident: three POSTs with one key, each claim answered `$-5`. None may reach the
/// upstream; each is told the store is unavailable.
#[tokio::test]
async fn retries_answered_with_malformed_resp_never_reach_the_upstream() {
    for info in [Info::Garbage, Info::Version("7.0.0")] {
        let fake = FakeRedis::start(info, b"$-5\r\n").await;
        let up = Upstream::start().await;
        let proxy = Proxy::redis(&yaml(&fake.url()), &up).await;
        let c = proxy.client();
        for attempt in 0..3 {
            let r = c.post("/charges", "charge-1", r#"{"amount":7}"#).await;
            assert_eq!(r.status, 503, "{info:?}, attempt {attempt}: {}", r.text());
            assert_eq!(r.problem(), "store-unavailable");
        }
        assert_eq!(up.count(), 0, "{info:?}: the upstream was called");
    }
}

/// A record this version cannot read (a later format, a damaged value) under the key is
/// still a record: the key is taken. Forwarding the request unguarded, as `pass_through`
/// does when the store is down, could execute it twice, so it is refused instead.
#[tokio::test]
async fn a_record_that_cannot_be_read_is_never_forwarded_even_under_pass_through() {
    let redis = support::redis::RedisServer::start().await;
    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {}\n  on_unavailable: pass_through\n",
        redis.url()
    );
    let proxy = Proxy::redis(&yaml, &up).await;
    let id = idemgate::proxy::record_id(
        &proxy.state.config,
        &http::Method::POST,
        "/charges",
        &http::HeaderMap::new(),
        "k-from-the-future",
    )
    .expect("guarded");
    let admin = proxy.admin().await;
    for (i, value) in ["\u{3}\u{2}a record of format 3", "\u{2}"]
        .iter()
        .enumerate()
    {
        redis.cli(&["SET", &id, value, "PX", "60000"]);
        let answer = proxy
            .client()
            .post("/charges", "k-from-the-future", "{}")
            .await;
        assert_eq!(answer.status, 503, "{}", answer.text());
        assert_eq!(answer.problem(), "store-unavailable");
        assert_eq!(up.count(), i, "never forwarded");
        // The operator's way out (docs/behaviour.md §13): the purge removes it, is
        // counted, and the next request executes.
        let purged = admin.send("DELETE", &format!("/keys/{id}"), &[], "").await;
        assert_eq!(purged.status, 204, "{}", purged.text());
        assert_eq!(proxy.state.metrics.purges(), i as u64 + 1);
        let answer = proxy
            .client()
            .post("/charges", "k-from-the-future", "{}")
            .await;
        assert_eq!(answer.status, 201, "{}", answer.text());
        assert_eq!(up.count(), i + 1);
        redis.cli(&["DEL", &id]);
    }
    // A key with nothing under it still follows on_unavailable when Redis is down: that
    // is what pass_through is for.
    let other = proxy.client().post("/charges", "k-fresh", "{}").await;
    assert_eq!(other.status, 201);
    assert_eq!(up.count(), 3);
}
