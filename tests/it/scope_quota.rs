//! `store.max_entries_per_scope` (docs/behaviour.md §17) over real sockets, on the
//! embedded stores: one client flooding fresh keys evicts its own oldest records, never
//! another client's, and the file store keeps each record's scope across a restart.

use crate::support;

use std::sync::Arc;

use idemgate::config::Config;
use idemgate::store::{FileOptions, FileStore, MemoryStore, Store};
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
    let proxy = Proxy::with_store(config, store).await;
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
