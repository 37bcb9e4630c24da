//! `Retry-After` on `409 in-flight` is the smaller of the time left on the holder's lease
//! and the time the holder has already run, rounded up to whole seconds, at least 1
//! (docs/behaviour.md §25), on every store, over real sockets and a real slow upstream.
//! The exact values, on tokio's paused clock, are in `handler.rs` and in
//! `idempotency/decide.rs`.
//!
//! The lease is 10 s, and renewed every third of it: told the lease left, a duplicate
//! would wait 7 to 10 s. The holder has run no longer than the test has since it sent
//! it, well under a second on any machine not stalled for one: a duplicate is told 1.

use crate::support;

use std::sync::Arc;
use std::time::Instant;

use idemgate::config::Config;
use idemgate::store::{RedisStore, Store};
use support::redis::{RedisCluster, RedisServer};
use support::{Proxy, Upstream};

const POLICY: &str = "idempotency:\n  lease: 10s\n";

/// The `Retry-After` a duplicate gets while the first request with its key is held
/// upstream: refused at once (`reject`), and after `wait_timeout` (`wait`, on the
/// `/gate/wait` route); each with the whole seconds the test had run by then, rounded
/// up: the most its holder can have run.
async fn while_held<S: Store>(proxy: Proxy<S>, up: &Upstream) -> [(u64, u64); 2] {
    let c = proxy.client();
    let sent = Instant::now();
    let holders = [
        c.spawn_post("/gate/charges", "held", "{}"),
        c.spawn_post("/gate/wait", "held-too", "{}"),
    ];
    up.wait_for(2).await;
    let mut seen = [(0, 0); 2];
    for (at, (path, key)) in [("/gate/charges", "held"), ("/gate/wait", "held-too")]
        .into_iter()
        .enumerate()
    {
        let r = c.post(path, key, "{}").await;
        let ran = sent.elapsed();
        assert_eq!(r.status, 409, "{path}: {}", r.text());
        assert_eq!(r.problem(), "in-flight");
        let after = r.headers["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("whole seconds");
        seen[at] = (after, ran.as_secs() + u64::from(ran.subsec_nanos() > 0));
    }
    up.open_gate();
    for holder in holders {
        assert_eq!(holder.await.expect("join").status, 201);
    }
    assert_eq!(up.count(), 2, "no duplicate reached the upstream");
    seen
}

/// `{store}` is the store section; the `/gate/wait` route waits 200 ms for its holder.
fn yaml(up: &Upstream, store: &str) -> String {
    format!(
        "upstream:\n  url: {}\n{store}{POLICY}routes:\n  - path: /gate/wait\n    \
         on_concurrent: wait\n    wait_timeout: 200ms\n",
        up.url()
    )
}

/// Each duplicate was told at least 1 and no more than its holder can have run: 1
/// unless the machine stalled, never the 7 to 10 s of lease left.
fn assert_holders_run(seen: [(u64, u64); 2]) {
    for (after, most) in seen {
        assert!(
            (1..=most.max(1)).contains(&after),
            "Retry-After {after}, more than the {most} s its holder can have run: {seen:?}"
        );
    }
}

#[tokio::test]
async fn on_the_memory_store() {
    let up = Upstream::start().await;
    let proxy =
        Proxy::with_config(Config::from_yaml_str(&yaml(&up, ""), &|_| None).expect("config")).await;
    assert_holders_run(while_held(proxy, &up).await);
}

#[tokio::test]
async fn on_the_file_store() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!(
        "store:\n  kind: file\n  path: {}\n",
        dir.path().join("store").display()
    );
    let config = Config::from_yaml_str(&yaml(&up, &store), &|_| None).expect("config");
    assert_holders_run(while_held(Proxy::file(config).await, &up).await);
}

#[tokio::test]
async fn on_redis() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let store = format!("store:\n  kind: redis\n  url: {}\n", redis.url());
    let config = Config::from_yaml_str(&yaml(&up, &store), &|_| None).expect("config");
    let store = Arc::new(RedisStore::new(&config.store).expect("redis store"));
    assert_holders_run(while_held(Proxy::with_store(config, store).await, &up).await);
}

#[tokio::test]
async fn on_a_redis_cluster() {
    let cluster = RedisCluster::start().await;
    let up = Upstream::start().await;
    let store = format!(
        "store:\n  kind: redis\n  cluster: true\n  urls: [{}]\n",
        cluster.seed_urls().join(", ")
    );
    let config = Config::from_yaml_str(&yaml(&up, &store), &|_| None).expect("config");
    let store = Arc::new(RedisStore::new(&config.store).expect("redis store"));
    assert_holders_run(while_held(Proxy::with_store(config, store).await, &up).await);
}
