//! `POST /keys/{id}/resolve` (docs/behaviour.md §18) over real sockets, on every store
//! kind: an operator settles an `outcome-unknown` record, either way, exactly once.

use crate::support;

use std::sync::Arc;

use idemgate::config::Config;
use idemgate::store::{PostgresStore, RedisStore, Store};
use support::postgres::PgServer;
use support::redis::{RedisCluster, RedisServer};
use support::{Proxy, Resp, TestClient, Upstream};

async fn resolve(admin: &TestClient, id: &str, body: &str) -> Resp {
    admin
        .send(
            "POST",
            &format!("/keys/{id}/resolve"),
            &[("content-type", "application/json")],
            body,
        )
        .await
}

fn json(resp: &Resp) -> serde_json::Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|_| panic!("json: {}", resp.text()))
}

fn resolutions<S: Store>(proxy: &Proxy<S>, executed: &str) -> String {
    let text = proxy.state.metrics.render();
    let line = format!("idemgate_admin_resolutions_total{{executed=\"{executed}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .unwrap_or_else(|| panic!("no {line} in:\n{text}"))
        .trim()
        .to_owned()
}

/// Everything of resolving that does not depend on the store kind.
async fn settle_unknown_outcomes<S: Store>(proxy: Proxy<S>, up: &Upstream) {
    let client = proxy.client();
    let admin = proxy.admin().await;

    // Executed after all: the operator gives the answer, and every retry replays it.
    let first = client.post("/reset", "charge-1", "{}").await;
    assert_eq!(first.problem(), "outcome-unknown");
    let id = proxy.record_id("/reset", "charge-1");
    let before = json(&admin.send("GET", &format!("/keys/{id}"), &[], "").await);
    assert_eq!(before["status"], 502);
    let done = resolve(
        &admin,
        &id,
        r#"{"executed": true, "status": 201, "headers": {"content-type": "application/json", "x-charge": "ch_1"}, "body": "{\"charge\":\"ch_1\"}"}"#,
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.text());
    let shown = json(&done);
    assert_eq!(shown["state"], "completed");
    assert_eq!(shown["status"], 201);
    assert_eq!(shown["replayable"], true);
    assert_eq!(shown["expires_at"], before["expires_at"], "the same expiry");
    assert_eq!(shown["created_at"], before["created_at"]);
    assert_eq!(shown["fingerprint"], before["fingerprint"]);
    for _ in 0..2 {
        let again = client.post("/reset", "charge-1", "{}").await;
        assert_eq!(again.status, 201, "{}", again.text());
        assert!(again.replayed());
        assert_eq!(again.text(), "{\"charge\":\"ch_1\"}");
        assert_eq!(again.headers["x-charge"], "ch_1");
        assert_eq!(again.headers["content-type"], "application/json");
    }
    assert_eq!(up.count(), 1, "never executed again");
    // Known now: a second resolution is refused.
    let twice = resolve(&admin, &id, r#"{"executed": false}"#).await;
    assert_eq!(twice.status, 409, "{}", twice.text());
    assert_eq!(twice.problem(), "not-unknown");

    // Not executed: the record goes, and the next retry executes.
    client.post("/reset", "charge-2", "{}").await;
    let id2 = proxy.record_id("/reset", "charge-2");
    let removed = resolve(&admin, &id2, r#"{"executed": false}"#).await;
    assert_eq!(removed.status, 204, "{}", removed.text());
    let shown = admin.send("GET", &format!("/keys/{id2}"), &[], "").await;
    assert_eq!(shown.status, 404);
    let retry = client.post("/reset", "charge-2", "{}").await;
    assert!(!retry.replayed(), "executed again");
    assert_eq!(up.count(), 3);
    assert_eq!(resolutions(&proxy, "true"), "1");
    assert_eq!(resolutions(&proxy, "false"), "1");

    // What cannot be resolved.
    let known = client.post("/charges", "paid", "{}").await;
    assert_eq!(known.status, 201);
    let known_id = proxy.record_id("/charges", "paid");
    let refused = resolve(&admin, &known_id, r#"{"executed": false}"#).await;
    assert_eq!(
        (refused.status.as_u16(), refused.problem()),
        (409, "not-unknown".to_owned())
    );
    let bad = resolve(&admin, &id2, r#"{"executed": true, "status": 700}"#).await;
    assert_eq!(
        (bad.status.as_u16(), bad.problem()),
        (400, "invalid-resolution".to_owned())
    );
    let absent = resolve(
        &admin,
        &proxy.record_id("/reset", "never"),
        r#"{"executed": false}"#,
    )
    .await;
    assert_eq!(
        (absent.status.as_u16(), absent.problem()),
        (404, "key-not-found".to_owned())
    );
    let get = admin
        .send("GET", &format!("/keys/{id}/resolve"), &[], "")
        .await;
    assert_eq!(get.status, 405);

    // Two operators at once: exactly one resolution lands.
    client.post("/reset", "charge-3", "{}").await;
    let id3 = proxy.record_id("/reset", "charge-3");
    let (a, b) = tokio::join!(
        resolve(
            &admin,
            &id3,
            r#"{"executed": true, "status": 200, "body": "a"}"#
        ),
        resolve(
            &admin,
            &id3,
            r#"{"executed": true, "status": 200, "body": "b"}"#
        ),
    );
    let won: Vec<&Resp> = [&a, &b].into_iter().filter(|r| r.status == 200).collect();
    assert_eq!(won.len(), 1, "{} / {}", a.text(), b.text());
    let lost = if a.status == 200 { &b } else { &a };
    assert_eq!(
        (lost.status.as_u16(), lost.problem()),
        (409, "not-unknown".to_owned())
    );
    let replay = client.post("/reset", "charge-3", "{}").await;
    let winner = if a.status == 200 { "a" } else { "b" };
    assert_eq!(replay.text(), winner, "the winner's answer is the one kept");
}

fn config(up: &Upstream, store: &str) -> Config {
    support::store_config(up, store)
}

#[tokio::test]
async fn on_the_memory_store() {
    let up = Upstream::start().await;
    let proxy = Proxy::with_config(config(&up, "  kind: memory\n")).await;
    settle_unknown_outcomes(proxy, &up).await;
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
    settle_unknown_outcomes(proxy, &up).await;
}

#[tokio::test]
async fn on_redis() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let config = config(&up, &format!("  kind: redis\n  url: {}\n", redis.url()));
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    settle_unknown_outcomes(Proxy::with_store(config, store).await, &up).await;
}

#[tokio::test]
async fn on_postgres() {
    let server = PgServer::start().await;
    let up = Upstream::start().await;
    let config = config(&up, &format!("  kind: postgres\n  url: {}\n", server.url()));
    let store = Arc::new(PostgresStore::new(&config.store).expect("store"));
    store.start().await.expect("table");
    settle_unknown_outcomes(Proxy::with_store(config, store).await, &up).await;
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
    settle_unknown_outcomes(Proxy::with_store(config, store).await, &up).await;
}

/// With encryption at rest, the resolved answer is sealed like any record
/// (docs/behaviour.md §17).
#[tokio::test]
async fn a_resolved_answer_is_encrypted_when_records_are() {
    let up = Upstream::start().await;
    let key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    let store = format!("  encryption:\n    keys:\n      - {{id: k1, key: {key}}}\n");
    let proxy = Proxy::with_config(config(&up, &store)).await;
    let admin = proxy.admin().await;
    proxy.client().post("/reset", "sealed", "{}").await;
    let id = proxy.record_id("/reset", "sealed");
    let done = resolve(
        &admin,
        &id,
        r#"{"executed": true, "status": 201, "body": "ok"}"#,
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(json(&done)["encryption_key_id"], "k1");
    let again = proxy.client().post("/reset", "sealed", "{}").await;
    assert!(again.replayed());
    assert_eq!(again.text(), "ok");
}

/// A resolution is a response idemgate could have recorded (docs/behaviour.md §25): a
/// status outside 200–599 is refused, and the headers a recorded response never keeps
/// (hop-by-hop ones and those `Connection` names, trace context, the policy's
/// `record_exclude_headers`) are dropped from the given ones, so no replay carries them.
#[tokio::test]
async fn a_resolution_is_a_response_idemgate_could_have_recorded() {
    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {}\nidempotency:\n  record_exclude_headers: [x-session-token]\n",
        up.url()
    );
    let proxy = Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("config")).await;
    let (client, admin) = (proxy.client(), proxy.admin().await);
    assert_eq!(
        client.post("/reset", "settled", "{}").await.problem(),
        "outcome-unknown"
    );
    let id = proxy.record_id("/reset", "settled");

    for status in [100, 101, 103, 199, 600, 999] {
        let refused = resolve(
            &admin,
            &id,
            &format!(r#"{{"executed": true, "status": {status}, "body": "x"}}"#),
        )
        .await;
        assert_eq!(refused.status, 400, "{status}: {}", refused.text());
        assert_eq!(refused.problem(), "invalid-resolution", "{status}");
    }
    let shown = json(&admin.send("GET", &format!("/keys/{id}"), &[], "").await);
    assert_eq!(shown["status"], 502, "still unknown: {shown}");

    let dropped = [
        "connection",
        "x-named-by-connection",
        "keep-alive",
        "upgrade",
        "transfer-encoding",
        "proxy-connection",
        "te",
        "trailer",
        "traceparent",
        "tracestate",
        "x-session-token",
    ];
    let done = resolve(
        &admin,
        &id,
        r#"{"executed": true, "status": 200, "headers": {
            "content-type": "text/plain",
            "x-charge": "ch_9",
            "connection": "keep-alive, x-named-by-connection",
            "x-named-by-connection": "hop",
            "keep-alive": "timeout=5",
            "upgrade": "websocket",
            "transfer-encoding": "chunked",
            "proxy-connection": "keep-alive",
            "te": "trailers",
            "trailer": "x-checksum",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "vendor=opaque",
            "x-session-token": "s3cr3t"
        }, "body": "paid"}"#,
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.text());
    for _ in 0..2 {
        let replay = client.post("/reset", "settled", "{}").await;
        assert!(replay.replayed(), "{}", replay.text());
        assert_eq!(
            (replay.status.as_u16(), replay.text()),
            (200, "paid".into())
        );
        assert_eq!(replay.headers["x-charge"], "ch_9");
        assert_eq!(replay.headers["content-type"], "text/plain");
        for name in dropped {
            assert!(
                replay.headers.get(name).is_none(),
                "{name} replayed: {:?}",
                replay.headers
            );
        }
    }
    assert_eq!(up.count(), 1, "never executed again");
}
