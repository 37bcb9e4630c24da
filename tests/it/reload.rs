//! Reloading the configuration (docs/behaviour.md §14, first bullet), over real sockets:
//! what applies to new requests, what is refused and leaves the running configuration in
//! force, requests in flight finishing under the policy they started with, and a new
//! upstream URL draining the old pool. The SIGHUP path of the binary is in
//! tests/it/cli.rs.

use crate::support;

use std::time::Duration;

use idemgate::config::Config;
use idemgate::proxy::reload::{ReloadError, reload};
use support::bin::TempConfig;
use support::fault::Relay;
use support::{Proxy, Upstream};

const JSON: (&str, &str) = ("content-type", "application/json");

fn no_level(_: &str) -> Result<(), String> {
    Ok(())
}

/// A proxy started from `file`, as the binary starts from its `--config`.
async fn proxy_from(file: &TempConfig) -> Proxy {
    Proxy::with_config(Config::from_file(file.path()).expect("valid config")).await
}

fn write(file: &TempConfig, yaml: &str) {
    std::fs::write(file.path(), yaml).expect("rewrite the config");
}

#[tokio::test]
async fn routes_and_policies_apply_to_new_requests() {
    let up = Upstream::start().await;
    let strict = format!(
        "upstream:\n  url: {}\nroutes:\n  - path: /charges\n    required: true\n",
        up.url()
    );
    let file = TempConfig::new(&strict);
    let proxy = proxy_from(&file).await;
    let c = proxy.client();
    let answer = c.send("POST", "/charges", &[JSON], "{}").await;
    assert_eq!(answer.problem(), "missing-key");

    write(
        &file,
        &format!(
            "upstream:\n  url: {}\nroutes:\n  - path: /charges\n    key_from: [{{header: X-Request-Id}}]\n",
            up.url()
        ),
    );
    reload(&proxy.state, file.path(), None, &no_level).expect("reloads");
    assert_eq!(proxy.state.metrics.reloads(), (1, 0));
    let keyless = c.send("POST", "/charges", &[JSON], "{}").await;
    assert_eq!(keyless.status, 201, "required is gone: {}", keyless.text());
    let first = c
        .send("POST", "/charges", &[("x-request-id", "r1"), JSON], "{}")
        .await;
    let retry = c
        .send("POST", "/charges", &[("x-request-id", "r1"), JSON], "{}")
        .await;
    assert!(
        !first.replayed() && retry.replayed(),
        "the new key source guards"
    );
    assert_eq!(up.count(), 2);
    proxy.stop().await;
}

#[tokio::test]
async fn a_refused_or_invalid_file_leaves_the_running_configuration_in_force() {
    let up = Upstream::start().await;
    let good = format!(
        "upstream:\n  url: {}\nroutes:\n  - path: /charges\n    required: true\n",
        up.url()
    );
    let file = TempConfig::new(&good);
    let proxy = proxy_from(&file).await;
    let c = proxy.client();
    let refused = [
        (format!("{good}store:\n  key_prefix: 'other:'\n"), "store"),
        (format!("{good}listen: 127.0.0.1:1\n"), "listen"),
        (format!("{good}admin:\n  listen: null\n"), "admin.listen"),
        (format!("{good}log:\n  format: json\n"), "log.format"),
    ];
    for (i, (yaml, field)) in refused.iter().enumerate() {
        write(&file, &format!("{yaml}idempotency:\n  required: true\n"));
        let err = reload(&proxy.state, file.path(), None, &no_level).expect_err(field);
        assert!(
            matches!(err, ReloadError::NeedsRestart(f) if f == *field),
            "{err}"
        );
        assert_eq!(proxy.state.metrics.reloads(), (0, i as u64 + 1));
    }
    write(&file, "upstream:\n  url: [not, a, url]\n");
    let err = reload(&proxy.state, file.path(), None, &no_level).expect_err("invalid");
    assert!(
        err.to_string().starts_with("upstream.url: "),
        "names the field: {err}"
    );
    std::fs::remove_file(file.path()).expect("remove");
    reload(&proxy.state, file.path(), None, &no_level).expect_err("missing file");
    assert_eq!(proxy.state.metrics.reloads(), (0, 6));
    // Still the first configuration: the route still requires a key.
    let answer = c.send("POST", "/charges", &[JSON], "{}").await;
    assert_eq!(answer.problem(), "missing-key");
    let answer = c.send("POST", "/other", &[JSON], "{}").await;
    assert_eq!(answer.status, 201, "idempotency.required was never applied");
    proxy.stop().await;
}

/// A reload that changes how record addresses are computed is applied, and counted once
/// per such reload; a reload that changes nothing of addresses counts nothing. Retries of
/// requests completed before it execute again, which is why it is counted.
#[tokio::test]
async fn a_reload_that_moves_addresses_is_applied_and_counted() {
    let up = Upstream::start().await;
    let yaml = |scope: &str, ttl: &str| {
        format!(
            "upstream:\n  url: {}\nroutes:\n  - path: /charges\n    scope_headers: [{scope}]\n    ttl: {ttl}\n",
            up.url()
        )
    };
    let file = TempConfig::new(&yaml("authorization", "24h"));
    let proxy = proxy_from(&file).await;
    let c = proxy.client();
    // A client that authenticates: its scope is its token while authorization scopes.
    let post = || {
        c.send(
            "POST",
            "/charges",
            &[
                ("idempotency-key", "k1"),
                ("authorization", "Bearer t1"),
                JSON,
            ],
            "{}",
        )
    };
    assert!(!post().await.replayed());
    assert!(post().await.replayed());

    // Neither another ttl nor the same file again moves an address.
    for ttl in ["1h", "1h"] {
        write(&file, &yaml("authorization", ttl));
        reload(&proxy.state, file.path(), None, &no_level).expect("reloads");
    }
    assert_eq!(proxy.state.metrics.address_changes(), 0);
    assert!(post().await.replayed());

    write(&file, &yaml("x-api-key", "1h"));
    reload(&proxy.state, file.path(), None, &no_level).expect("applied");
    assert_eq!(proxy.state.metrics.address_changes(), 1);
    let retry = post().await;
    assert!(!retry.replayed(), "the record is at the old address");
    assert_eq!(up.count(), 2);
    // Reloading the moved file again moves nothing more.
    reload(&proxy.state, file.path(), None, &no_level).expect("reloads");
    assert_eq!(proxy.state.metrics.address_changes(), 1);
    assert_eq!(proxy.state.metrics.reloads(), (4, 0));
    proxy.stop().await;
}

/// A request in flight during a reload is released or recorded as its own policy says:
/// here the old policy releases a 201 and the new one records it. `store` is the YAML
/// of the store section, the same in both files (a change to it would be refused); the
/// proxy is made from the first file by `start`.
async fn in_flight_finishes_under_its_policy<S: idemgate::store::Store>(
    store: &str,
    start: impl AsyncFnOnce(Config) -> Proxy<S>,
) {
    let up = Upstream::start().await;
    let releasing = format!(
        "upstream:\n  url: {}\n{store}idempotency:\n  release_statuses: [201]\n",
        up.url()
    );
    let file = TempConfig::new(&releasing);
    let proxy = start(Config::from_file(file.path()).expect("valid config")).await;
    let c = proxy.client();
    let held = c.spawn_post("/gate/charges", "k1", "{}");
    up.wait_for(1).await;
    write(&file, &format!("upstream:\n  url: {}\n{store}", up.url()));
    reload(&proxy.state, file.path(), None, &no_level).expect("reloads");
    // A store change is refused, whatever the kind.
    write(
        &file,
        &format!(
            "upstream:\n  url: {}\n{store}idempotency:\n  required: true\n",
            up.url()
        )
        .replace("store:\n", "store:\n  key_prefix: 'other:'\n"),
    );
    let err = reload(&proxy.state, file.path(), None, &no_level).expect_err("store");
    assert!(matches!(err, ReloadError::NeedsRestart("store")), "{err}");
    up.open_gate();
    let first = held.await.expect("task");
    assert_eq!(first.status, 201);
    // Released under the old policy, so the retry executes; under the new one, the
    // retry's own answer is recorded and replayed.
    let retry = c.post("/gate/charges", "k1", "{}").await;
    assert!(!retry.replayed(), "the first was released, not recorded");
    assert_eq!(up.count(), 2);
    let again = c.post("/gate/charges", "k1", "{}").await;
    assert!(again.replayed());
    assert_eq!(up.count(), 2);
    assert_eq!(proxy.state.metrics.reloads(), (1, 1));
    proxy.stop().await;
}

#[tokio::test]
async fn a_request_in_flight_finishes_under_the_policy_it_started_with() {
    in_flight_finishes_under_its_policy("store:\n  kind: memory\n", async |config| {
        Proxy::with_config(config).await
    })
    .await;
}

#[tokio::test]
async fn the_same_on_the_file_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!(
        "store:\n  kind: file\n  path: {}\n",
        dir.path().join("store").display()
    );
    in_flight_finishes_under_its_policy(&store, Proxy::file).await;
}

#[tokio::test]
async fn the_same_on_redis() {
    let redis = support::redis::RedisServer::start().await;
    let store = format!("store:\n  kind: redis\n  url: {}\n", redis.url());
    in_flight_finishes_under_its_policy(&store, async |config| {
        let store = std::sync::Arc::new(
            idemgate::store::RedisStore::new(&config.store).expect("redis store"),
        );
        Proxy::with_store(config, store).await
    })
    .await;
}

#[tokio::test]
async fn a_new_upstream_url_takes_new_requests_and_drains_the_old_pool() {
    let old = Upstream::start().await;
    let relay = Relay::start(old.addr).await;
    let new = Upstream::start().await;
    let file = TempConfig::new(&format!("upstream:\n  url: {}\n", relay.url()));
    let proxy = proxy_from(&file).await;
    let c = proxy.client();
    assert_eq!(c.post("/charges", "a", "{}").await.status, 201);
    relay.wait_open(1).await;
    write(&file, &format!("upstream:\n  url: {}\n", new.url()));
    reload(&proxy.state, file.path(), None, &no_level).expect("reloads");
    assert_eq!(c.post("/charges", "b", "{}").await.status, 201);
    assert_eq!((old.count(), new.count()), (1, 1));
    // The old client went with the last request that held it, its idle connection too.
    tokio::time::timeout(Duration::from_secs(5), relay.wait_open(0))
        .await
        .expect("the old pool's connection is closed");
    // Keys recorded before the reload still replay: the store did not change.
    assert!(c.post("/charges", "a", "{}").await.replayed());
    proxy.stop().await;
}

/// `shutdown_timeout` applies from a reload: a shutdown after one waits for the new
/// limit, not the one the proxy started with.
#[tokio::test]
async fn a_reloaded_shutdown_timeout_bounds_the_next_shutdown() {
    let up = Upstream::start().await;
    let file = TempConfig::new(&format!(
        "upstream:\n  url: {}\nshutdown_timeout: 60s\n",
        up.url()
    ));
    let proxy = proxy_from(&file).await;
    let _held = proxy.client().spawn_post("/gate/charges", "k1", "{}");
    up.wait_for(1).await;
    write(
        &file,
        &format!("upstream:\n  url: {}\nshutdown_timeout: 100ms\n", up.url()),
    );
    reload(&proxy.state, file.path(), None, &no_level).expect("reloads");
    let how = tokio::time::timeout(Duration::from_secs(10), proxy.stop())
        .await
        .expect("the reloaded 100ms, not the 60s the proxy started with");
    assert_eq!(how, idemgate::proxy::Shutdown::TimedOut);
}
