//! One tenant cannot evict another, on the embedded stores: `store.max_entries_per_scope`
//! (docs/behaviour.md §17) makes a client flooding fresh keys evict its own oldest
//! records, never another client's, and the file store keeps each record's scope across
//! a restart; without a quota, a full store evicts fairly between scopes (§25): a client
//! minting new scopes evicts its own records before those of a scope that was there
//! first.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate::config::Config;
use idemgate::idempotency::{
    Completed, Fingerprint, OwnerToken, Record, ScopeId, ScopedKey, StoredBody,
};
use idemgate::store::{Claim, ClaimRequest, Fenced, FileOptions, FileStore, MemoryStore, Store};
use support::{Proxy, Resp, TestClient, Upstream};

const QUOTA: usize = 3;

fn config(up: &Upstream, store: &str) -> Config {
    let yaml = format!(
        "upstream:\n  url: {}\nstore:\n{store}  max_entries: 1000\n  max_entries_per_scope: {QUOTA}\n",
        up.url()
    );
    Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid")
}

async fn post_as(client: &TestClient, who: &str, key: &str) -> Resp {
    let auth = format!("Bearer token-of-{who}");
    client
        .send(
            "POST",
            "/charges",
            &[
                ("authorization", auth.as_str()),
                ("idempotency-key", key),
                ("content-type", "application/json"),
            ],
            "{}",
        )
        .await
}

fn quota_evictions<S: Store>(proxy: &Proxy<S>) -> u64 {
    let text = proxy.state.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix("idemgate_store_evictions_total{reason=\"scope_quota\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the counter is exported:\n{text}"))
}

/// `flooder` writes `n` fresh keys after `tenant` wrote two; returns the executions.
async fn flood<S: Store>(proxy: &Proxy<S>, flooder: &str, from: usize, n: usize) {
    let client = proxy.client();
    for i in from..from + n {
        let first = post_as(&client, flooder, &format!("{flooder}-{i}")).await;
        assert_eq!(first.status, 201, "{}", first.text());
    }
}

/// The tenant's records replay; of the flooder's, only its newest `QUOTA` do.
async fn check<S: Store>(proxy: &Proxy<S>, up: &Upstream, flooder: &str, last: usize) {
    let client = proxy.client();
    let executed = up.count();
    for key in ["tenant-1", "tenant-2"] {
        let again = post_as(&client, "tenant", key).await;
        assert!(
            again.replayed(),
            "{key} was evicted by another scope's flood"
        );
    }
    for i in last + 1 - QUOTA..=last {
        let again = post_as(&client, flooder, &format!("{flooder}-{i}")).await;
        assert!(
            again.replayed(),
            "{flooder}-{i} is among its scope's newest"
        );
    }
    assert_eq!(up.count(), executed, "nothing executed again");
    let oldest = post_as(&client, flooder, &format!("{flooder}-{}", last - QUOTA)).await;
    assert_eq!(oldest.status, 201);
    assert!(
        !oldest.replayed(),
        "the flooder's own older record was evicted"
    );
}

#[tokio::test]
async fn a_flood_from_one_scope_evicts_only_its_own_records_on_the_memory_store() {
    let up = Upstream::start().await;
    let config = config(&up, "  kind: memory\n");
    let store = MemoryStore::new(1000).with_scope_quota(config.store.max_entries_per_scope);
    let proxy = Proxy::with_store(config, Arc::new(store)).await;
    let client = proxy.client();
    for key in ["tenant-1", "tenant-2"] {
        assert_eq!(post_as(&client, "tenant", key).await.status, 201);
    }
    flood(&proxy, "flooder", 0, 20).await;
    assert_eq!(quota_evictions(&proxy), 20 - QUOTA as u64);
    assert_eq!(
        proxy.state.store.evictions(),
        0,
        "the store itself is not full"
    );
    check(&proxy, &up, "flooder", 19).await;
}

#[tokio::test]
async fn the_file_store_keeps_each_records_scope_across_a_restart() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store_yaml = format!(
        "  kind: file\n  path: {}\n",
        dir.path().join("store").display()
    );
    let open = |config: &Config| {
        Arc::new(FileStore::open(&FileOptions::from_config(&config.store)).expect("open"))
    };
    {
        let config = config(&up, &store_yaml);
        let store = open(&config);
        let proxy = Proxy::with_store(config, Arc::clone(&store)).await;
        let client = proxy.client();
        for key in ["tenant-1", "tenant-2"] {
            assert_eq!(post_as(&client, "tenant", key).await.status, 201);
        }
        flood(&proxy, "flooder", 0, 10).await;
        assert_eq!(quota_evictions(&proxy), 10 - QUOTA as u64);
        proxy.stop().await;
        drop(store);
    }
    // Reopened from its journal: the scopes are known again, and a flood goes on
    // evicting the flooder's records only.
    let config = config(&up, &store_yaml);
    let store = open(&config);
    let proxy = Proxy::with_store(config, store).await;
    flood(&proxy, "flooder", 10, 5).await;
    assert_eq!(quota_evictions(&proxy), 5);
    check(&proxy, &up, "flooder", 14).await;
}

/// `max_entries` of the fair-eviction tests, and the made-up scopes flooding it.
const FULL_AT: usize = 1000;
const MADE_UP: u32 = 10_000;
const TTL: Duration = Duration::from_secs(3600);

/// The established scope, and a key of `scope` numbered `n`.
const ESTABLISHED: u32 = u32::MAX;

fn scope(n: u32) -> ScopeId {
    let mut bytes = [0xa5; 16];
    bytes[..4].copy_from_slice(&n.to_be_bytes());
    ScopeId::from_bytes(bytes)
}

fn scoped_key(scope: u32, n: u32) -> ScopedKey {
    let mut bytes = [0x5a; 32];
    bytes[..4].copy_from_slice(&scope.to_be_bytes());
    bytes[4..8].copy_from_slice(&n.to_be_bytes());
    ScopedKey::from_bytes(bytes)
}

fn claim_in(scope_n: u32, n: u32) -> ClaimRequest {
    ClaimRequest {
        key: scoped_key(scope_n, n),
        scope: Some(scope(scope_n)),
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease: Duration::from_secs(10),
        ttl: TTL,
        streamed: false,
    }
}

/// Claims and completes key `n` of scope `scope_n`.
async fn record<S: Store>(store: &S, scope_n: u32, n: u32) {
    let lease = match store.claim(claim_in(scope_n, n)).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing { record, .. } => panic!("{scope_n}/{n} is held already: {record:?}"),
    };
    let response = Arc::new(Completed::clear(
        Fingerprint::from_bytes([1; 32]),
        StatusCode::CREATED,
        Vec::new(),
        StoredBody::Stored(Bytes::from(format!("{scope_n}/{n}"))),
    ));
    let done = store
        .complete(&lease, response, TTL)
        .await
        .expect("complete");
    assert_eq!(done, Fenced::Done);
}

/// Whether key `n` of the established scope still holds its completed record.
async fn kept<S: Store>(store: &S, n: u32) -> bool {
    match store.claim(claim_in(ESTABLISHED, n)).await.expect("claim") {
        Claim::Existing {
            record: Record::Completed(c),
            ..
        } => {
            let body = c.clear_response().map(|r| &r.body);
            let expected = Bytes::from(format!("{ESTABLISHED}/{n}"));
            assert_eq!(
                body,
                Some(&StoredBody::Stored(expected)),
                "{n}'s own record"
            );
            true
        }
        Claim::Existing { record, .. } => panic!("a marker under {n}: {record:?}"),
        Claim::Acquired(_) => false,
    }
}

/// An established scope writes `held` records, then `made_up` scopes one record each:
/// the store is full long before the end, and every eviction is of a made-up scope.
async fn flood_of_made_up_scopes<S: Store>(store: &S, held: u32, from: u32, made_up: u32) {
    for n in 0..held {
        record(store, ESTABLISHED, n).await;
    }
    for n in from..from + made_up {
        record(store, n, 0).await;
    }
}

async fn the_established_scope_is_all_there<S: Store>(store: &S, held: u32) {
    let mut evicted = Vec::new();
    for n in 0..held {
        if !kept(store, n).await {
            evicted.push(n);
        }
    }
    assert!(
        evicted.is_empty(),
        "made-up scopes evicted the established scope's {evicted:?}"
    );
}

#[tokio::test]
async fn made_up_scopes_evict_their_own_records_on_the_memory_store() {
    let store = MemoryStore::new(FULL_AT);
    flood_of_made_up_scopes(&store, 50, 0, MADE_UP).await;
    assert_eq!(store.len(), FULL_AT);
    assert_eq!(store.evictions(), u64::from(50 + MADE_UP) - FULL_AT as u64);
    the_established_scope_is_all_there(&store, 50).await;
}

#[tokio::test]
async fn made_up_scopes_evict_their_own_records_on_the_file_store_across_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = FileOptions {
        path: dir.path().join("store"),
        fsync: false,
        max_entries: FULL_AT,
        max_entries_per_scope: None,
    };
    {
        let store = FileStore::open(&options).expect("open");
        flood_of_made_up_scopes(&store, 50, 0, MADE_UP).await;
        assert_eq!(store.evictions(), u64::from(50 + MADE_UP) - FULL_AT as u64);
        the_established_scope_is_all_there(&store, 50).await;
    }
    // Read back from the journal, the scopes' order is the one they were written in.
    let store = FileStore::open(&options).expect("reopen");
    flood_of_made_up_scopes(&store, 0, MADE_UP, 2 * FULL_AT as u32).await;
    the_established_scope_is_all_there(&store, 50).await;
}

fn full_evictions<S: Store>(proxy: &Proxy<S>) -> u64 {
    let text = proxy.state.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix("idemgate_store_evictions_total{reason=\"full\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the counter is exported:\n{text}"))
}

/// Through the proxy, with no quota: an established tenant's records, then requests
/// each with a new made-up `Authorization` (each its own scope) past `max_entries`.
async fn made_up_credentials_through_the_proxy<S: Store>(proxy: &Proxy<S>, up: &Upstream) {
    const ENTRIES: usize = 20;
    let client = proxy.client();
    for key in ["tenant-1", "tenant-2", "tenant-3"] {
        assert_eq!(post_as(&client, "tenant", key).await.status, 201);
    }
    for i in 0..100 {
        let first = post_as(&client, &format!("made-up-{i}"), "k").await;
        assert_eq!(first.status, 201, "{}", first.text());
    }
    assert_eq!(up.count(), 103);
    assert_eq!(full_evictions(proxy), 103 - ENTRIES as u64);
    for key in ["tenant-1", "tenant-2", "tenant-3"] {
        let again = post_as(&client, "tenant", key).await;
        assert!(again.replayed(), "{key} was evicted by made-up scopes");
    }
    assert_eq!(up.count(), 103, "the tenant's requests executed once each");
}

fn full_config(up: &Upstream, store: &str) -> Config {
    let yaml = format!(
        "upstream:\n  url: {}\nstore:\n{store}  max_entries: 20\n",
        up.url()
    );
    Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid")
}

#[tokio::test]
async fn made_up_credentials_do_not_evict_a_tenant_through_the_proxy_on_the_memory_store() {
    let up = Upstream::start().await;
    let proxy = Proxy::with_config(full_config(&up, "  kind: memory\n")).await;
    made_up_credentials_through_the_proxy(&proxy, &up).await;
    proxy.stop().await;
}

#[tokio::test]
async fn made_up_credentials_do_not_evict_a_tenant_through_the_proxy_on_the_file_store() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store_yaml = format!(
        "  kind: file\n  path: {}\n",
        dir.path().join("store").display()
    );
    let config = full_config(&up, &store_yaml);
    let store = FileStore::open(&FileOptions::from_config(&config.store)).expect("open");
    let proxy = Proxy::with_store(config, Arc::new(store)).await;
    made_up_credentials_through_the_proxy(&proxy, &up).await;
    proxy.stop().await;
}
