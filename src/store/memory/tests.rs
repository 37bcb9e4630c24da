//! Memory-store internals the contract suite cannot see: the watchers map stays bounded,
//! expiry and eviction wake waiters, and a shard full of live markers refuses a claim
//! without scanning. All on tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use super::{MemoryStore, MemoryWatch, lock};
use crate::idempotency::{Completed, Fingerprint, OwnerToken, ScopeId, ScopedKey, StoredBody};
use crate::store::Clock;
use crate::store::{Claim, ClaimRequest, Fenced, Lease, Store, StoreError, Watch};

const LEASE: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(60);

fn key(n: u8) -> ScopedKey {
    ScopedKey::from_bytes([n; 32])
}

fn req(k: u8) -> ClaimRequest {
    ClaimRequest {
        key: key(k),
        scope: None,
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease: LEASE,
        ttl: TTL,
        streamed: false,
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

async fn acquire(s: &MemoryStore, k: u8) -> Lease {
    match s.claim(req(k)).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing { record, .. } => panic!("expected to acquire {k}, found {record:?}"),
    }
}

async fn complete(s: &MemoryStore, lease: &Lease) {
    let done = s.complete(lease, response(), TTL).await.expect("complete");
    assert_eq!(done, Fenced::Done);
}

/// Whether the watch has already fired: polled once, no time passes.
async fn woken(w: MemoryWatch) -> bool {
    tokio::time::timeout(Duration::ZERO, w.changed())
        .await
        .is_ok()
}

fn watchers_len(s: &MemoryStore) -> usize {
    s.core
        .shards
        .iter()
        .map(|shard| lock(shard).watchers.len())
        .sum()
}

fn scans(s: &MemoryStore) -> usize {
    s.core
        .shards
        .iter()
        .map(|shard| lock(shard).index.scans)
        .sum()
}

#[tokio::test(start_paused = true)]
async fn dropped_watches_leave_no_watchers_behind() {
    let s = MemoryStore::new(1000);
    for k in 0..50 {
        let lease = acquire(&s, k).await;
        // A waiter that gives up before anything changes.
        drop(s.watch(key(k)).await.expect("watch"));
        // Two waiters on one key: one woken by the completion, one dropped unpolled.
        let woken_one = s.watch(key(k)).await.expect("watch");
        let dropped = s.watch(key(k)).await.expect("watch");
        complete(&s, &lease).await;
        assert!(woken(woken_one).await, "the completion wakes the waiter");
        drop(dropped);
        // A waiter whose watch comes after the completion it waited for.
        drop(s.watch(key(k)).await.expect("watch"));
    }
    assert_eq!(watchers_len(&s), 0, "every watch handle is gone");

    // A live handle keeps its entry, and only it.
    let held = s.watch(key(1)).await.expect("watch");
    let other = s.watch(key(1)).await.expect("watch");
    drop(other);
    assert_eq!(watchers_len(&s), 1);
    drop(held);
    assert_eq!(watchers_len(&s), 0);
}

#[tokio::test(start_paused = true)]
async fn reclaiming_an_expired_key_wakes_its_waiters() {
    let s = MemoryStore::new(1000);
    let _abandoned = acquire(&s, 1).await;
    let w = s.watch(key(1)).await.expect("watch");
    tokio::time::advance(TTL + LEASE).await;
    let _new = acquire(&s, 1).await;
    assert!(woken(w).await, "the expired marker was replaced");
}

#[tokio::test(start_paused = true)]
async fn making_room_wakes_the_waiters_of_expired_markers() {
    let s = MemoryStore::new(2);
    let _a = acquire(&s, 1).await;
    let _b = acquire(&s, 2).await;
    let w = s.watch(key(1)).await.expect("watch");
    tokio::time::advance(TTL + LEASE).await;
    // Full: the claim drops the expired markers to make room.
    let _c = acquire(&s, 3).await;
    assert!(woken(w).await, "the expired marker was dropped");
}

#[tokio::test(start_paused = true)]
async fn eviction_wakes_the_evicted_keys_waiters() {
    let s = MemoryStore::new(1);
    let lease = acquire(&s, 1).await;
    complete(&s, &lease).await;
    let w = s.watch(key(1)).await.expect("watch");
    let _b = acquire(&s, 2).await;
    assert_eq!(s.evictions(), 1);
    assert!(woken(w).await, "the completed record was evicted");
}

#[tokio::test(start_paused = true)]
async fn a_shard_full_of_live_markers_refuses_without_scanning() {
    let s = MemoryStore::new(4);
    let mut leases = Vec::new();
    for k in 1..=4 {
        leases.push(acquire(&s, k).await);
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    for k in 10..110 {
        assert!(matches!(s.claim(req(k)).await, Err(StoreError::Full)));
    }
    assert_eq!(scans(&s), 0, "no marker can have expired yet");

    // Renewals push expiries out and never make the shard scan early.
    for lease in &leases {
        assert_eq!(s.renew(lease, TTL * 2).await.expect("renew"), Fenced::Done);
    }
    // The earliest marker goes away; its slot is taken by a later one.
    assert_eq!(s.release(&leases[0]).await.expect("release"), Fenced::Done);
    let late = acquire(&s, 5).await;
    assert_eq!(s.renew(&late, TTL * 2).await.expect("renew"), Fenced::Done);
    // Past the released marker's expiry, one scan learns that nothing expired.
    tokio::time::advance(TTL + LEASE).await;
    for k in 10..110 {
        assert!(matches!(s.claim(req(k)).await, Err(StoreError::Full)));
    }
    assert_eq!(scans(&s), 1, "one scan, then the earliest expiry is known");

    // Once a marker's ttl has passed, the scan makes room.
    tokio::time::advance(TTL * 2).await;
    let _ = acquire(&s, 10).await;
    assert_eq!(scans(&s), 2);
}

/// A claim in `scope`, kept for `ttl`.
fn scoped_req(k: u8, scope: u8, ttl: Duration) -> ClaimRequest {
    ClaimRequest {
        scope: Some(ScopeId::from_bytes([scope; 16])),
        ttl,
        ..req(k)
    }
}

async fn record_in(s: &MemoryStore, k: u8, scope: u8, ttl: Duration) {
    let Claim::Acquired(lease) = s.claim(scoped_req(k, scope, ttl)).await.expect("claim") else {
        panic!("{k} is held already");
    };
    let done = s.complete(&lease, response(), ttl).await.expect("complete");
    assert_eq!(done, Fenced::Done);
}

fn holds(s: &MemoryStore, k: u8) -> bool {
    let now = s.core.clock.now_ms();
    s.core.shards.iter().any(|shard| {
        lock(shard)
            .index
            .live(now)
            .any(|(key, _)| *key == self::key(k))
    })
}

/// Full (docs/behaviour.md §25): a record whose ttl has passed goes first, whatever its
/// scope; then the scope that arrived last gives up its own, never an older scope's,
/// and never a marker.
#[tokio::test(start_paused = true)]
async fn a_full_store_drops_the_expired_then_evicts_from_the_scope_that_came_last() {
    let s = MemoryStore::new(3);
    record_in(&s, 1, 1, TTL).await;
    record_in(&s, 2, 2, Duration::from_secs(1)).await;
    record_in(&s, 3, 3, TTL).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    // Scope 2's record expired: it makes room, and nothing live is evicted.
    let _marker = acquire(&s, 4).await;
    assert_eq!(s.evictions(), 0);
    assert!(!holds(&s, 2) && holds(&s, 1) && holds(&s, 3));
    // Scope 3 came after scope 1: a new scope's record costs scope 3 its own.
    let _other = s.claim(scoped_req(5, 4, TTL)).await.expect("claim");
    assert_eq!(s.evictions(), 1);
    assert!(
        holds(&s, 1) && !holds(&s, 3) && holds(&s, 4),
        "the marker stays"
    );
    // Scope 1 alone holds a completed record: it gives it up before any marker goes.
    let _third = s.claim(scoped_req(6, 5, TTL)).await.expect("claim");
    assert_eq!(s.evictions(), 2);
    assert!(!holds(&s, 1) && holds(&s, 4) && holds(&s, 5));
    // Only markers are left, all live: full.
    assert!(matches!(s.claim(req(7)).await, Err(StoreError::Full)));
}
