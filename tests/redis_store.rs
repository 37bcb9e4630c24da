//! Redis-store specifics the store contract cannot show, on real redis-server processes:
//! waiters that come and go on one channel, and which claim the server's version picks.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate::config::Config;
use idemgate::idempotency::{Completed, Fingerprint, OwnerToken, ScopedKey, StoredBody};
use idemgate::store::{Claim, ClaimRequest, Fenced, Lease, RedisStore, Store, Watch};
use support::monitor::Monitor;
use support::redis::RedisServer;

/// Long enough that a waiter woken only by the lease's end is a failure.
const LEASE: Duration = Duration::from_secs(30);
/// How long a woken waiter may take: the publish is one round trip away.
const WAKE: Duration = Duration::from_secs(2);

fn store(url: &str) -> RedisStore {
    let yaml =
        format!("upstream:\n  url: http://127.0.0.1:1\nstore:\n  kind: redis\n  url: {url}\n");
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("config");
    RedisStore::new(&config.store).expect("store")
}

fn key(round: u32) -> ScopedKey {
    let mut bytes = [7u8; 32];
    bytes[..4].copy_from_slice(&round.to_be_bytes());
    ScopedKey::from_bytes(bytes)
}

fn req(key: ScopedKey) -> ClaimRequest {
    ClaimRequest {
        key,
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease: LEASE,
        ttl: Duration::from_secs(60),
    }
}

async fn acquire(s: &RedisStore, key: ScopedKey) -> Lease {
    match s.claim(req(key)).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing { record, .. } => panic!("expected to acquire, found {record:?}"),
    }
}

fn response() -> Arc<Completed> {
    Arc::new(Completed {
        fingerprint: Fingerprint::from_bytes([1; 32]),
        status: StatusCode::CREATED,
        headers: Vec::new(),
        body: StoredBody::Stored(Bytes::from_static(b"{}")),
    })
}

/// The last waiter on a key gives up just as the next one arrives (a retry right after
/// a timeout): the one leaving must not unsubscribe the one arriving. Its unsubscribe
/// used to be sent after the new subscribe, and the new waiter slept out the lease.
async fn a_waiter_arriving_as_the_last_one_leaves_is_woken(flavor: &str) {
    let server = RedisServer::start().await;
    let waiters = store(&server.url());
    let owner = store(&server.url());
    let mut monitor = Monitor::start(server.port).await;
    let rounds = 100;
    for round in 0..rounds {
        let key = key(round);
        let lease = acquire(&owner, key).await;
        let leaving = waiters.watch(key).await.expect("watch");
        drop(leaving);
        let arriving = waiters.watch(key).await.expect("watch");
        let done = owner
            .complete(&lease, response(), Duration::from_secs(60))
            .await
            .expect("complete");
        assert_eq!(done, Fenced::Done);
        assert!(
            tokio::time::timeout(WAKE, arriving.changed()).await.is_ok(),
            "{flavor} round {round}: the completion did not wake the new waiter"
        );
    }
    // Once its waiters are gone, each channel is left.
    let mut subscribed: HashSet<String> = (0..rounds)
        .map(|round| format!("{}:changed", waiters.record_key(&key(round))))
        .collect();
    while !subscribed.is_empty() {
        let command = monitor.next_command().await;
        if command[0] == "UNSUBSCRIBE" {
            for channel in &command[1..] {
                subscribed.remove(channel);
            }
        }
    }
}

#[tokio::test]
async fn a_waiter_arriving_as_the_last_one_leaves_is_woken_on_one_thread() {
    a_waiter_arriving_as_the_last_one_leaves_is_woken("one thread").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_arriving_as_the_last_one_leaves_is_woken_on_two_threads() {
    a_waiter_arriving_as_the_last_one_leaves_is_woken("two threads").await;
}
