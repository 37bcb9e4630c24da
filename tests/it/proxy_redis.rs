//! The proxy on the Redis store, over real sockets and real redis-server processes
//! (docs/behaviour.md §5): replicas sharing one Redis or a cluster, the hot-path command
//! budget, script reloads, and Redis outages.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate::metrics::{Metrics, Outcome};
use idemgate::store::RedisStore;
use support::monitor::Monitor;
use support::redis::{RedisCluster, RedisServer, Server};
use support::{Proxy, Resp, Upstream};

fn redis_yaml(url: &str, extra: &str) -> String {
    format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {url}\n  timeout: 300ms\n{extra}"
    )
}

type RedisProxy = Proxy<RedisStore>;

/// Waits until the two replicas together counted `n` of `outcome`.
async fn wait_for_sum(a: &Metrics, b: &Metrics, outcome: Outcome, n: u64) {
    let sum = |_: &Metrics| a.requests(outcome) + b.requests(outcome) >= n;
    tokio::select! {
        () = a.wait_until(sum) => {},
        () = b.wait_until(sum) => {},
    }
}

/// 50 identical requests split over two replicas: exactly one reaches the upstream.
async fn duplicates_across_replicas(
    a: &RedisProxy,
    b: &RedisProxy,
    up: &Upstream,
    key: &str,
) -> Resp {
    let path = "/gate/charges";
    let mut tasks = Vec::new();
    for i in 0..50 {
        let c = if i % 2 == 0 { a.client() } else { b.client() };
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            c.post(path, &key, r#"{"amount":7}"#).await
        }));
    }
    wait_for_sum(&a.state.metrics, &b.state.metrics, Outcome::InFlight, 49).await;
    up.open_gate();
    let mut winner = None;
    for t in tasks {
        let r = t.await.expect("join");
        match r.status.as_u16() {
            201 => assert!(winner.replace(r).is_none(), "two executions"),
            409 => assert_eq!(r.problem(), "in-flight"),
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    let winner = winner.expect("one execution");
    for proxy in [a, b] {
        let replay = proxy.client().post(path, key, r#"{"amount":7}"#).await;
        assert!(replay.replayed());
        assert_eq!(replay.body, winner.body);
    }
    winner
}

#[tokio::test]
async fn two_replicas_on_one_redis_execute_once() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let yaml = redis_yaml(&redis.url(), "");
    let a = Proxy::redis(&yaml, &up).await;
    let b = Proxy::redis(&yaml, &up).await;
    duplicates_across_replicas(&a, &b, &up, "replicas").await;
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn two_replicas_on_a_three_master_cluster_execute_once_per_key() {
    let cluster = RedisCluster::start().await;
    let up = Upstream::start().await;
    let urls = cluster.seed_urls();
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  cluster: true\n  urls: [{}]\n  timeout: 2s\n",
        urls.join(", ")
    );
    let a = Proxy::redis(&yaml, &up).await;
    let b = Proxy::redis(&yaml, &up).await;
    duplicates_across_replicas(&a, &b, &up, "cluster-0").await;
    // More keys, so that records land on every master.
    for i in 0..12 {
        let key = format!("cluster-key-{i}");
        let first = a.client().post("/charges", &key, "{}").await;
        assert_eq!(first.status, 201);
        let again = b.client().post("/charges", &key, "{}").await;
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
    }
    assert_eq!(up.count(), 13);
    let mut masters_with_records = 0;
    for node in &cluster.nodes {
        let keys: u64 = node.cli(&["DBSIZE"]).parse().expect("dbsize");
        masters_with_records += u64::from(keys > 0);
    }
    assert_eq!(
        masters_with_records, 3,
        "records are spread over the cluster"
    );
}

#[tokio::test]
async fn a_replay_costs_one_round_trip_and_a_first_execution_two() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::redis(&redis_yaml(&redis.url(), ""), &up).await;
    let c = proxy.client();
    // Warm up: connection set-up and script loading are not per-request costs.
    c.post("/charges", "warm-up", "{}").await;
    c.post("/charges", "warm-up", "{}").await;
    let mut monitor = Monitor::start(redis.port).await;
    let _ = monitor.sent().await;

    let first = c.post("/charges", "budget", "{}").await;
    assert_eq!(first.status, 201);
    // The claim's GETRANGE, which proves its SET wrote, is pipelined behind it.
    assert_eq!(
        monitor.sent().await,
        [&["SET", "GETRANGE"], redis.completion_commands()].concat(),
        "claim, then complete"
    );

    let replay = c.post("/charges", "budget", "{}").await;
    assert!(replay.replayed());
    assert_eq!(
        monitor.sent().await,
        ["SET", "GETRANGE"],
        "the claim attempt returns the record"
    );

    // A slow upstream adds one renewal per lease/3, and nothing else.
    let slow = Proxy::redis(
        &redis_yaml(&redis.url(), "idempotency:\n  lease: 300ms\n"),
        &up,
    )
    .await;
    let held = slow.client().spawn_post("/gate/slow", "renewed", "{}");
    up.wait_for(3).await;
    // Time passing is the behaviour here: the lease must be renewed to survive it.
    tokio::time::sleep(Duration::from_millis(250)).await;
    up.open_gate();
    assert_eq!(held.await.expect("join").status, 201);
    let sent = monitor.sent().await;
    let count = |cmd: &str, of: &[&str]| of.iter().filter(|c| **c == cmd).count();
    let completion = redis.completion_commands();
    let renewals = count(
        "EVALSHA",
        &sent.iter().map(String::as_str).collect::<Vec<_>>(),
    ) - count("EVALSHA", completion);
    assert_eq!(
        sent.iter().filter(|c| *c == "SET").count(),
        1 + count("SET", completion),
        "{sent:?}"
    );
    assert!(
        (1..=3).contains(&renewals),
        "one renewal per 100 ms over ~250 ms: {sent:?}"
    );
}

#[tokio::test]
async fn records_are_one_key_of_prefix_and_64_hex_with_the_configured_ttl() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let yaml = redis_yaml(
        &redis.url(),
        "  key_prefix: \"shop:\"\nidempotency:\n  ttl: 1h\n",
    );
    let proxy = Proxy::redis(&yaml, &up).await;
    proxy.client().post("/charges", "k", "{}").await;
    let keys = redis.cli(&["KEYS", "*"]);
    let key = keys.trim();
    assert_eq!(key.len(), "shop:".len() + 64, "{keys}");
    assert!(
        key.starts_with("shop:") && key[5..].chars().all(|c| c.is_ascii_hexdigit()),
        "{key}"
    );
    assert!(!keys.contains(' '), "exactly one key: {keys}");
    let ttl: u64 = redis.cli(&["PTTL", key]).parse().expect("pttl");
    assert!((3_590_000..=3_600_000).contains(&ttl), "ttl {ttl}");
}

#[tokio::test]
async fn script_flush_between_requests_is_invisible_to_clients() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::redis(&redis_yaml(&redis.url(), ""), &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "flush", "{}").await;
    redis.cli(&["SCRIPT", "FLUSH"]);
    let replay = c.post("/charges", "flush", "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    redis.cli(&["SCRIPT", "FLUSH"]);
    let other = c.post("/charges", "flush-2", "{}").await;
    assert_eq!(other.status, 201);
    redis.cli(&["SCRIPT", "FLUSH"]);
    assert!(c.post("/charges", "flush-2", "{}").await.replayed());
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn redis_down_is_503_with_retry_after_and_recovers_without_a_restart() {
    let mut redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::redis(&redis_yaml(&redis.url(), ""), &up).await;
    let c = proxy.client();
    assert_eq!(c.post("/charges", "before", "{}").await.status, 201);
    redis.kill();
    for key in ["down-1", "before"] {
        let r = c.post("/charges", key, "{}").await;
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.problem(), "store-unavailable");
        assert!(r.headers.contains_key("retry-after"));
    }
    assert_eq!(
        up.count(),
        1,
        "the upstream is not called while the store is down"
    );
    redis.restart().await;
    // The first request after the restart may meet the dead connection; clients retry.
    let mut recovered = None;
    for _ in 0..5 {
        let r = c.post("/charges", "after", "{}").await;
        if r.status == 201 {
            recovered = Some(r);
            break;
        }
        assert_eq!(r.status, 503);
    }
    assert!(
        recovered.is_some(),
        "idemgate did not recover after Redis came back"
    );
    assert!(c.post("/charges", "after", "{}").await.replayed());
}

#[tokio::test]
async fn a_paused_redis_answers_within_the_store_timeout() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::redis(&redis_yaml(&redis.url(), ""), &up).await;
    let c = proxy.client();
    c.post("/charges", "warm", "{}").await;
    redis.pause();
    let started = Instant::now();
    let r = c.post("/charges", "paused", "{}").await;
    let took = started.elapsed();
    redis.resume();
    assert_eq!(r.status, 503);
    assert_eq!(r.problem(), "store-unavailable");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1000),
        "took {took:?}"
    );
    assert_eq!(up.count(), 1);
    // The claim of the timed-out call was applied once Redis resumed; it is released as
    // an orphan, so the key executes instead of turning into outcome-unknown.
    proxy
        .state
        .metrics
        .wait_until(|m| m.orphans_released() == 1)
        .await;
    let r = c.post("/charges", "paused", "{}").await;
    assert_eq!(r.status, 201);
    assert!(!r.replayed());
}

#[tokio::test]
async fn pass_through_on_unavailable_forwards_unguarded_and_counts_it() {
    let mut redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::redis(
        &redis_yaml(&redis.url(), "  on_unavailable: pass_through\n"),
        &up,
    )
    .await;
    let c = proxy.client();
    redis.kill();
    assert_eq!(c.post("/charges", "open", "{}").await.status, 201);
    assert_eq!(c.post("/charges", "open", "{}").await.status, 201);
    assert_eq!(up.count(), 2);
    assert_eq!(proxy.state.metrics.requests(Outcome::StoreBypassed), 2);
}

#[tokio::test]
async fn a_failed_recording_still_answers_and_is_retried_until_it_lands() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::redis(&redis_yaml(&redis.url(), ""), &up).await;
    let c = proxy.client();
    let first = c.spawn_post("/gate/charges", "rec", "{}");
    up.wait_for(1).await;
    redis.pause();
    up.open_gate();
    let first = first.await.expect("join");
    assert_eq!(
        first.status, 201,
        "the client gets its response although recording failed"
    );
    redis.resume();
    // Until the background retry lands the record, a retry is 409, never re-executed.
    let during = c.post("/gate/charges", "rec", "{}").await;
    assert!(
        during.replayed() || during.status == 409,
        "{}",
        during.text()
    );
    proxy
        .state
        .metrics
        .wait_until(|m| m.late_records() == 1)
        .await;
    let replay = c.post("/gate/charges", "rec", "{}").await;
    assert!(replay.replayed(), "the record landed: {}", replay.text());
    assert_eq!(replay.body, first.body);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_slow_upstream_keeps_its_claim_past_the_lease() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let yaml = redis_yaml(&redis.url(), "idempotency:\n  lease: 300ms\n");
    let proxy = Proxy::redis(&yaml, &up).await;
    let c = proxy.client();
    let first = c.spawn_post("/gate/charges", "slow", "{}");
    up.wait_for(1).await;
    // Three leases long: only renewals keep the claim alive.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let dup = c.post("/gate/charges", "slow", "{}").await;
    assert_eq!(dup.status, 409, "{}", dup.text());
    assert_eq!(dup.problem(), "in-flight");
    up.open_gate();
    assert_eq!(first.await.expect("join").status, 201);
    assert!(c.post("/gate/charges", "slow", "{}").await.replayed());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn password_from_the_environment_authenticates() {
    let redis = RedisServer::start_with(&["--requirepass", "s3cret"]).await;
    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {}\nstore:\n  kind: redis\n  url: redis://:${{REDIS_PASSWORD}}@127.0.0.1:{}/0\n",
        up.url(),
        redis.port
    );
    let env = |name: &str| (name == "REDIS_PASSWORD").then(|| "s3cret".to_owned());
    let config = idemgate::config::Config::from_yaml_str(&yaml, &env).expect("config");
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    let proxy = Proxy::with_store(config, store).await;
    let c = proxy.client();
    assert_eq!(c.post("/charges", "auth", "{}").await.status, 201);
    assert!(c.post("/charges", "auth", "{}").await.replayed());

    let wrong = format!(
        "upstream:\n  url: {}\nstore:\n  kind: redis\n  url: redis://:nope@127.0.0.1:{}/0\n",
        up.url(),
        redis.port
    );
    let config = idemgate::config::Config::from_yaml_str(&wrong, &|_| None).expect("config");
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    let denied = Proxy::with_store(config, store).await;
    let r = denied.client().post("/charges", "auth-2", "{}").await;
    assert_eq!(r.status, 503);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn on_concurrent_wait_across_replicas_replays_to_the_waiter() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let yaml = redis_yaml(&redis.url(), "idempotency:\n  on_concurrent: wait\n");
    let a = Proxy::redis(&yaml, &up).await;
    let b = Proxy::redis(&yaml, &up).await;
    let first = a.client().spawn_post("/gate/charges", "w", "{}");
    up.wait_for(1).await;
    let waiter = b.client().spawn_post("/gate/charges", "w", "{}");
    b.state.metrics.wait_until(|m| m.waiting() == 1).await;
    up.open_gate();
    let first = first.await.expect("join");
    let waited = waiter.await.expect("join");
    assert_eq!(waited.status, 201);
    assert!(waited.replayed());
    assert_eq!(waited.body, first.body);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_release_that_failed_is_retried_so_the_key_does_not_turn_outcome_unknown() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = Proxy::redis(&redis_yaml(&redis.url(), ""), &up).await;
    let c = proxy.client();
    let first = c.spawn_post("/gate/status/503", "busy", "{}");
    up.wait_for(1).await;
    // The upstream refuses (503, a release status) while Redis cannot take the release.
    redis.pause();
    up.open_gate();
    assert_eq!(first.await.expect("join").status, 503);
    redis.resume();
    // The release that timed out is still in the paused server's queue. On Redis 7 it is
    // a script never loaded, which answers NOSCRIPT once resumed, and the background
    // retry releases the claim; on Valkey 9 it is a native DELIFEQ, which lands
    // (docs/behaviour.md §23). Either way the key is freed.
    if redis.server() == Server::Redis {
        proxy
            .state
            .metrics
            .wait_until(|m| m.orphans_released() == 1)
            .await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.cli(&["DBSIZE"]) != "0" {
        assert!(Instant::now() < deadline, "the claim was never released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let retry = c.post("/gate/status/503", "busy", "{}").await;
    assert_eq!(retry.status, 503);
    assert!(!retry.replayed());
    assert_eq!(up.count(), 2, "the retry executed: the claim was released");
}

#[tokio::test]
async fn completions_are_published_only_where_a_duplicate_may_wait() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    for (wait, publishes) in [(false, 0), (true, 1)] {
        let extra = if wait {
            "idempotency:\n  on_concurrent: wait\n"
        } else {
            ""
        };
        let yaml = redis_yaml(&redis.url(), extra).replace("{upstream}", &up.url());
        let config = idemgate::config::Config::from_yaml_str(&yaml, &|_| None).expect("config");
        assert_eq!(config.uses_wait(), wait);
        // As the binary builds it (src/cli.rs).
        let mut store = RedisStore::new(&config.store).expect("store");
        if !config.uses_wait() {
            store = store.without_notifications();
        }
        let proxy = Proxy::with_store(config, Arc::new(store)).await;
        let before = redis.command_calls("publish");
        let key = format!("pub-{wait}");
        assert_eq!(
            proxy.client().post("/charges", &key, "{}").await.status,
            201
        );
        assert_eq!(
            redis.command_calls("publish") - before,
            publishes,
            "wait: {wait}"
        );
    }
}
