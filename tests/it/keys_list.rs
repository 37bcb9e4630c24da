//! `GET /keys?state=...&limit=...&cursor=...` (docs/behaviour.md §24) over real sockets,
//! on every store kind, a Redis Cluster's masters included: after an incident, every
//! record in a state is listed exactly once, page after page; and `idemgate keys list`
//! follows the pages to the last.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use idemgate::config::Config;
use idemgate::store::{RedisStore, Store};
use support::bin::{Finished, admin_cli};
use support::postgres::PgServer;
use support::redis::ha::{MASTER_NAME, Sentinels};
use support::redis::{RedisCluster, RedisServer};
use support::{Proxy, TestClient, Upstream};

/// Every id listed for `state`, page by page with `limit`, and each page's size checked.
async fn listed(admin: &TestClient, state: &str, limit: usize) -> Vec<(String, serde_json::Value)> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let mut path = format!("/keys?state={state}&limit={limit}");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let page = admin.send("GET", &path, &[], "").await;
        assert_eq!(page.status, 200, "{path}: {}", page.text());
        let page = page.json();
        let items = page["items"].as_array().expect("items").clone();
        assert!(items.len() <= limit, "{path}: {} items", items.len());
        for item in items {
            let id = item["id"].as_str().expect("an id").to_owned();
            all.push((id, item));
        }
        match page.get("next_cursor") {
            Some(next) => cursor = Some(next.as_str().expect("a string").to_owned()),
            None => return all,
        }
    }
    panic!("{state}: the listing never ended");
}

/// Everything of listing that does not depend on the store kind.
async fn find_the_keys<S: Store>(proxy: Proxy<S>, up: &Upstream) {
    let client = proxy.client();
    let admin = proxy.admin().await;
    let mut completed = BTreeSet::new();
    for i in 0..5 {
        let key = format!("done-{i}");
        assert_eq!(client.post("/charges", &key, "{}").await.status, 201);
        completed.insert(proxy.record_id("/charges", &key));
    }
    let mut unknown = BTreeSet::new();
    for i in 0..3 {
        let key = format!("unknown-{i}");
        let answer = client.post("/reset", &key, "{}").await;
        assert_eq!(answer.problem(), "outcome-unknown");
        unknown.insert(proxy.record_id("/reset", &key));
    }
    let mut in_flight = BTreeSet::new();
    let mut held = Vec::new();
    for i in 0..2 {
        let key = format!("held-{i}");
        held.push(client.spawn_post("/gate/charges", &key, "{}"));
        in_flight.insert(proxy.record_id("/gate/charges", &key));
    }
    // The held requests' markers are written before they reach the upstream.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while listed(&admin, "in_flight", 100).await.len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no markers");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    for (state, shown, want) in [
        ("completed", "completed", &completed),
        ("outcome_unknown", "completed", &unknown),
        ("in_flight", "in_flight", &in_flight),
    ] {
        for limit in [1, 2, 3, 100, 1000] {
            let got = listed(&admin, state, limit).await;
            let ids: Vec<&String> = got.iter().map(|(id, _)| id).collect();
            let once: BTreeSet<String> = ids.iter().map(|id| (*id).clone()).collect();
            assert_eq!(
                once.len(),
                ids.len(),
                "{state} by {limit}: listed twice: {ids:?}"
            );
            assert_eq!(&once, want, "{state} by {limit}");
            for (id, item) in &got {
                assert_eq!(item["state"], shown, "{id}");
                assert!(item["expires_at"].is_string(), "{item}");
                // The same inspection as GET /keys/{id}.
                let one = admin.send("GET", &format!("/keys/{id}"), &[], "").await;
                assert_eq!(&one.json(), item, "{id}");
            }
        }
    }
    let first = listed(&admin, "outcome_unknown", 100).await;
    assert!(first.iter().all(|(_, item)| item["status"] == 502));

    for bad in [
        "/keys",
        "/keys?state=done",
        "/keys?state=completed&limit=0",
        "/keys?state=completed&limit=1001",
        "/keys?state=completed&limit=many",
        "/keys?state=completed&cursor=not-a-cursor",
        "/keys?state=completed&state=in_flight",
        "/keys?state=completed&limt=5",
    ] {
        let refused = admin.send("GET", bad, &[], "").await;
        assert_eq!(
            (refused.status.as_u16(), refused.problem()),
            (400, "invalid-listing".to_owned()),
            "{bad}"
        );
    }
    let post = admin.send("POST", "/keys?state=completed", &[], "").await;
    assert_eq!(post.status, 405);

    up.open_gate();
    for answer in held {
        assert_eq!(answer.await.expect("held request").status, 201);
    }
    let after = listed(&admin, "completed", 2).await;
    assert_eq!(after.len(), 7, "the held ones completed");
    assert!(listed(&admin, "in_flight", 2).await.is_empty());
}

fn config(up: &Upstream, store: &str) -> Config {
    support::store_config(up, store)
}

#[tokio::test]
async fn on_the_memory_store() {
    let up = Upstream::start().await;
    let proxy = Proxy::with_config(config(&up, "  kind: memory\n")).await;
    find_the_keys(proxy, &up).await;
}

#[tokio::test]
async fn on_the_file_store() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!(
        "  kind: file\n  path: {}\n",
        dir.path().join("store").display()
    );
    let proxy = Proxy::file(config(&up, &store)).await;
    find_the_keys(proxy, &up).await;
}

#[tokio::test]
async fn on_redis() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let config = config(&up, &format!("  kind: redis\n  url: {}\n", redis.url()));
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    find_the_keys(Proxy::with_store(config, store).await, &up).await;
    assert!(redis.command_calls("scan") > 0);
    assert_eq!(redis.command_calls("keys"), 0, "SCAN, never KEYS");
}

#[tokio::test]
async fn on_redis_behind_sentinels() {
    let master = RedisServer::start().await;
    let sentinels = Sentinels::start(&master, 0).await;
    let up = Upstream::start().await;
    let store = format!(
        "  kind: redis\n  sentinel:\n    master_name: {MASTER_NAME}\n    urls: [{}]\n",
        sentinels.urls("").join(", ")
    );
    let config = config(&up, &store);
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    // The sentinels may not name the master at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.ping().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no master found");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    find_the_keys(Proxy::with_store(config, store).await, &up).await;
    assert_eq!(master.command_calls("keys"), 0, "SCAN, never KEYS");
}

#[tokio::test]
async fn on_a_redis_cluster() {
    let cluster = RedisCluster::start().await;
    let up = Upstream::start().await;
    let store = format!(
        "  kind: redis\n  cluster: true\n  urls: [{}]\n",
        cluster.seed_urls().join(", ")
    );
    let config = config(&up, &store);
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    find_the_keys(Proxy::with_store(config, store).await, &up).await;
}

#[tokio::test]
async fn on_postgres() {
    let server = PgServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::postgres(
        &format!(
            "upstream:\n  url: {{upstream}}\nstore:\n  kind: postgres\n  url: {}\n",
            server.url()
        ),
        &up,
    )
    .await;
    find_the_keys(proxy, &up).await;
}

const TOKEN: &str = "s3cret-admin";

async fn keys_list(admin: &TestClient, token: Option<&str>, args: &[&str]) -> Finished {
    admin_cli(&["keys", "list"], admin.addr(), token, args).await
}

#[tokio::test]
async fn keys_list_prints_every_unknown_outcome_across_pages() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        &format!("upstream:\n  url: {{upstream}}\nadmin:\n  token: {TOKEN}\n"),
        &up,
    )
    .await;
    let admin = proxy.admin().await;
    let client = proxy.client();
    let mut unknown = BTreeSet::new();
    for i in 0..3 {
        let key = format!("unknown-{i}");
        client.post("/reset", &key, "{}").await;
        unknown.insert(proxy.record_id("/reset", &key));
    }
    assert_eq!(client.post("/charges", "paid", "{}").await.status, 201);

    let done = keys_list(
        &admin,
        Some(TOKEN),
        &["--state", "outcome_unknown", "--limit", "1"],
    )
    .await;
    assert!(done.status.success(), "{}", done.stderr);
    let lines: Vec<&str> = done.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", done.stdout);
    let mut printed = BTreeSet::new();
    for line in lines {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 5, "{line}");
        assert_eq!(&fields[1..3], &["outcome_unknown", "502"], "{line}");
        printed.insert(fields[0].to_owned());
    }
    assert_eq!(printed, unknown);

    let denied = keys_list(&admin, None, &["--state", "outcome_unknown"]).await;
    assert!(!denied.status.success());
    assert!(denied.stderr.contains("token"), "{}", denied.stderr);
    let bad = keys_list(&admin, Some(TOKEN), &["--state", "lost"]).await;
    assert!(!bad.status.success());
    assert!(bad.stderr.contains("state must be"), "{}", bad.stderr);
}
