//! Redis-store specifics the store contract cannot show, on real redis-server processes:
//! waiters that come and go on one channel, and which claim the server's version picks.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate::config::Config;
use idemgate::idempotency::{Completed, Fingerprint, OwnerToken, ScopedKey, StoredBody};
use idemgate::store::{Claim, ClaimRequest, Fenced, Lease, RedisStore, Store, Watch};
use support::monitor::Monitor;
use support::redis::{RedisCluster, RedisServer};

/// Long enough that a waiter woken only by the lease's end is a failure.
const LEASE: Duration = Duration::from_secs(30);
/// How long a woken waiter may take: the publish is one round trip away.
const WAKE: Duration = Duration::from_secs(2);

fn store(url: &str) -> RedisStore {
    store_from(&format!("  url: {url}\n"))
}

/// A store from the lines of the `store:` section after `kind: redis`.
fn store_from(section: &str) -> RedisStore {
    let yaml = format!("upstream:\n  url: http://127.0.0.1:1\nstore:\n  kind: redis\n{section}");
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
        scope: None,
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease: LEASE,
        ttl: Duration::from_secs(60),
        streamed: false,
    }
}

async fn acquire(s: &RedisStore, key: ScopedKey) -> Lease {
    match s.claim(req(key)).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing { record, .. } => panic!("expected to acquire, found {record:?}"),
    }
}

fn response() -> Arc<Completed> {
    Arc::new(Completed::clear(
        Fingerprint::from_bytes([1; 32]),
        StatusCode::CREATED,
        Vec::new(),
        StoredBody::Stored(Bytes::from_static(b"{}")),
    ))
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

/// The commands that say how a claim was made: the version lookup and either claim.
fn claim_commands(sent: Vec<String>) -> Vec<String> {
    sent.into_iter()
        .filter(|c| ["INFO", "SET", "EVAL", "EVALSHA"].contains(&c.as_str()))
        .collect()
}

/// The premise of the native-claim tests: the installed redis-server is 7.0 or later.
fn assert_redis_7(server: &RedisServer) {
    let info = server.cli(&["INFO", "server"]);
    let major: u32 = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next())
        .and_then(|major| major.parse().ok())
        .unwrap_or_else(|| panic!("no redis_version in {info}"));
    assert!(
        major >= 7,
        "these tests need redis-server 7.0 or later:\n{info}"
    );
}

/// The version decides the claim before the first one is made (not a refused command):
/// asked once, then every claim is one native SET.
#[tokio::test]
async fn a_redis_7_server_is_asked_its_version_once_then_claimed_natively() {
    let server = RedisServer::start().await;
    assert_redis_7(&server);
    let s = store(&server.url());
    // Connected first, so that only the claims' own commands are seen.
    s.ping().await.expect("ping");
    let mut monitor = Monitor::start(server.port).await;
    let _ = monitor.sent().await;

    let _ = acquire(&s, key(1)).await;
    // Each claim is the native SET with its check pipelined behind it.
    assert_eq!(monitor.sent().await, ["INFO", "SET", "GETRANGE"]);
    assert!(matches!(
        s.claim(req(key(1))).await.expect("claim"),
        Claim::Existing { .. }
    ));
    let _ = acquire(&s, key(2)).await;
    assert_eq!(
        monitor.sent().await,
        ["SET", "GETRANGE", "SET", "GETRANGE"],
        "the version is known"
    );
}

/// After a disconnection the server may be another one: it is asked again.
#[tokio::test]
async fn the_version_is_asked_again_after_a_reconnect() {
    let mut server = RedisServer::start().await;
    let s = store(&server.url());
    let _ = acquire(&s, key(1)).await;
    // A waiter is woken by the disconnection, after the choice was forgotten.
    let waiter = s.watch(key(1)).await.expect("watch");
    server.restart().await;
    assert!(
        tokio::time::timeout(WAKE, waiter.changed()).await.is_ok(),
        "the disconnection wakes waiters"
    );
    let mut monitor = Monitor::start(server.port).await;
    let _ = acquire(&s, key(2)).await;
    let _ = acquire(&s, key(3)).await;
    assert_eq!(claim_commands(monitor.sent().await), ["INFO", "SET", "SET"]);
}

/// A server that will not say its version (INFO denied by an ACL) gets the script, which
/// works on every version.
#[tokio::test]
async fn a_server_that_will_not_tell_its_version_is_claimed_with_the_script() {
    let server = RedisServer::start().await;
    server.cli(&[
        "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info",
    ]);
    let s = store(&format!("redis://app:secret@127.0.0.1:{}/0", server.port));
    s.ping().await.expect("ping");
    let mut monitor = Monitor::start(server.port).await;
    let _ = monitor.sent().await;

    let _ = acquire(&s, key(1)).await;
    let sent = monitor.sent().await;
    assert!(
        sent.iter().any(|c| c == "EVALSHA") && !sent.iter().any(|c| c == "SET"),
        "claimed with the script: {sent:?}"
    );
    assert!(matches!(
        s.claim(req(key(1))).await.expect("claim"),
        Claim::Existing { .. }
    ));
}

/// On a cluster every master is asked, once, and then claims are native SETs.
#[tokio::test]
async fn every_cluster_master_is_asked_its_version_then_claimed_natively() {
    let cluster = RedisCluster::start().await;
    assert_redis_7(&cluster.nodes[0]);
    let s = store_from(&format!(
        "  cluster: true\n  urls: [{}]\n  timeout: 2s\n",
        cluster.seed_urls().join(", ")
    ));
    // PING reaches every master: all connections are made before the monitors start.
    s.ping().await.expect("ping");
    let mut monitors = Vec::new();
    for node in &cluster.nodes {
        let mut monitor = Monitor::start(node.port).await;
        let _ = monitor.sent().await;
        monitors.push(monitor);
    }
    let claims = 12;
    for round in 0..claims {
        let _ = acquire(&s, key(round)).await;
    }
    let mut sets = 0;
    for (node, monitor) in cluster.nodes.iter().zip(&mut monitors) {
        let sent = claim_commands(monitor.sent().await);
        assert_eq!(
            sent.first().map(String::as_str),
            Some("INFO"),
            "node {}: {sent:?}",
            node.port
        );
        assert!(
            sent[1..].iter().all(|c| c == "SET"),
            "node {}: {sent:?}",
            node.port
        );
        sets += sent.len() - 1;
    }
    assert_eq!(sets, claims as usize);
}
