//! `store.min_replicas` (docs/behaviour.md §14) on real redis-server processes: a master,
//! and a replica when the test wants one acknowledging.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use idemgate::store::RedisStore;
use support::fault::{Fault, Relay};
use support::monitor::Monitor;
use support::redis::RedisServer;
use support::{Proxy, Upstream};

type RedisProxy = Proxy<RedisStore>;

fn yaml(url: &str, extra: &str) -> String {
    format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {url}\n  timeout: 300ms\n  min_replicas: 1\n{extra}"
    )
}

/// No replica acknowledges the claim: 503, never forwarded, even under `pass_through`
/// (the store answered: it is not down), and the marker is released, so the same key
/// executes once a replica is there.
#[tokio::test]
async fn a_claim_no_replica_acknowledged_is_refused_released_and_never_forwarded() {
    let master = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy: RedisProxy = Proxy::redis(
        &yaml(&master.url(), "  on_unavailable: pass_through\n"),
        &up,
    )
    .await;
    let c = proxy.client();
    let refused = c.post("/charges", "lonely", "{}").await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.problem(), "store-unavailable");
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(up.count(), 0, "an unreplicated claim was forwarded");
    let metrics = &proxy.state.metrics;
    metrics.wait_until(|m| m.orphans_released() >= 1).await;
    assert_eq!(master.cli(&["DBSIZE"]), "0", "the claim was not released");

    let _replica = RedisServer::start_replica_of(&master, master.port).await;
    let done = c.post("/charges", "lonely", "{}").await;
    assert_eq!(done.status, 201, "{}", done.text());
    assert_eq!(up.count(), 1);
    assert_eq!(metrics.replication_shortfall().get(), 0);
}

/// The replica stops acknowledging between the claim and the record: the upstream has
/// executed, so the client gets its answer; the shortfall is counted.
#[tokio::test]
async fn a_record_the_replica_did_not_acknowledge_is_answered_and_counted() {
    let master = RedisServer::start().await;
    let replica = RedisServer::start_replica_of(&master, master.port).await;
    let up = Upstream::start().await;
    let proxy: RedisProxy = Proxy::redis(&yaml(&master.url(), ""), &up).await;
    let held = proxy.client().spawn_post("/gate/charges", "late", "{}");
    // At the upstream: the claim was acknowledged.
    tokio::time::timeout(Duration::from_secs(10), up.wait_for(1))
        .await
        .expect("the claim was forwarded");
    replica.pause();
    up.open_gate();
    let answered = held.await.expect("join");
    replica.resume();
    assert_eq!(answered.status, 201, "{}", answered.text());
    assert_eq!(proxy.state.metrics.replication_shortfall().get(), 1);
    assert!(
        proxy
            .state
            .metrics
            .render()
            .contains("idemgate_replication_shortfall_total 1")
    );
    let replay = proxy.client().post("/gate/charges", "late", "{}").await;
    assert!(replay.replayed());
    assert_eq!(up.count(), 1);
}

/// With a replica acknowledging, a first execution adds a WAIT after the claim and
/// one after the record; a replay adds nothing.
#[tokio::test]
async fn wait_follows_a_claim_and_a_record_but_not_a_replay() {
    let master = RedisServer::start().await;
    let _replica = RedisServer::start_replica_of(&master, master.port).await;
    let up = Upstream::start().await;
    let proxy: RedisProxy = Proxy::redis(&yaml(&master.url(), ""), &up).await;
    let c = proxy.client();
    c.post("/charges", "warm-up", "{}").await;
    let mut monitor = Monitor::start(master.port).await;
    let _ = monitor.sent().await;

    let first = c.post("/charges", "budget", "{}").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(
        monitor.sent().await,
        [
            &["SET", "GETRANGE", "WAIT"],
            master.completion_commands(),
            &["WAIT"]
        ]
        .concat()
    );
    let replay = c.post("/charges", "budget", "{}").await;
    assert!(replay.replayed());
    assert_eq!(monitor.sent().await, ["SET", "GETRANGE"]);
    assert_eq!(proxy.state.metrics.replication_shortfall().get(), 0);
}

/// Redis answers nothing else on a connection while a WAIT blocks it: concurrent first
/// executions share their WAITs instead of queueing two each behind one another.
#[tokio::test]
async fn concurrent_first_executions_share_their_waits() {
    let master = RedisServer::start().await;
    let link = Relay::start(SocketAddr::from(([127, 0, 0, 1], master.port))).await;
    let _replica = RedisServer::start_replica_of(&master, link.addr.port()).await;
    link.set(Fault::Delay(Duration::from_millis(50)));
    let up = Upstream::start().await;
    let yaml = yaml(&master.url(), "").replace("timeout: 300ms", "timeout: 5s");
    let proxy: RedisProxy = Proxy::redis(&yaml, &up).await;
    let before = master.command_calls("wait");
    let requests: Vec<_> = (0..16)
        .map(|i| {
            proxy
                .client()
                .spawn_post("/charges", &format!("shared-{i}"), "{}")
        })
        .collect();
    for request in requests {
        let resp = request.await.expect("join");
        assert_eq!(resp.status, 201, "{}", resp.text());
    }
    let waits = master.command_calls("wait") - before;
    assert!(
        waits < 32,
        "{waits} WAITs for 16 first executions: none shared"
    );
}
