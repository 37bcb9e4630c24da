//! `Retry-After` on `409 in-flight` is the time left on the holder's lease, rounded up to
//! whole seconds (docs/behaviour.md §18), on every store, over real sockets and a
//! real slow upstream. The exact rounding, on tokio's paused clock, is in `handler.rs`
//! and in `idempotency/decide.rs`.
//!
//! With `lease: 5s` the holder renews every third of it, so its lease always has more
//! than 3.3 s left: a duplicate is told 5, or 4 on a machine that stalled for a second
//! between a renewal and the duplicate's claim. The constant it replaced was 1.

use crate::support;

use std::sync::Arc;

use idemgate::config::Config;
use idemgate::store::{RedisStore, Store};
use support::redis::{RedisCluster, RedisServer};
use support::{Proxy, Upstream};

const POLICY: &str = "idempotency:\n  lease: 5s\n";

/// The `Retry-After` a duplicate gets while the first request with its key is held
/// upstream: refused at once (`reject`), and after `wait_timeout` (`wait`, on the
/// `/gate/wait` route).
async fn while_held<S: Store>(proxy: Proxy<S>, up: &Upstream) -> [u64; 2] {
    let c = proxy.client();
    let holders = [
        c.spawn_post("/gate/charges", "held", "{}"),
        c.spawn_post("/gate/wait", "held-too", "{}"),
    ];
    up.wait_for(2).await;
    let mut seen = [0; 2];
    for (at, (path, key)) in [("/gate/charges", "held"), ("/gate/wait", "held-too")]
        .into_iter()
        .enumerate()
    {
        let r = c.post(path, key, "{}").await;
        assert_eq!(r.status, 409, "{path}: {}", r.text());
        assert_eq!(r.problem(), "in-flight");
        seen[at] = r.headers["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("whole seconds");
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

fn assert_lease_left(seen: [u64; 2]) {
    for after in seen {
        assert!(
            (4..=5).contains(&after),
            "Retry-After {after}, not the 5 s lease left: {seen:?}"
        );
    }
}

#[tokio::test]
async fn on_the_memory_store() {
    let up = Upstream::start().await;
    let proxy =
        Proxy::with_config(Config::from_yaml_str(&yaml(&up, ""), &|_| None).expect("config")).await;
    assert_lease_left(while_held(proxy, &up).await);
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
    assert_lease_left(while_held(Proxy::file(config).await, &up).await);
}

#[tokio::test]
async fn on_redis() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let store = format!("store:\n  kind: redis\n  url: {}\n", redis.url());
    let config = Config::from_yaml_str(&yaml(&up, &store), &|_| None).expect("config");
    let store = Arc::new(RedisStore::new(&config.store).expect("redis store"));
    assert_lease_left(while_held(Proxy::with_store(config, store).await, &up).await);
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
    assert_lease_left(while_held(Proxy::with_store(config, store).await, &up).await);
}
