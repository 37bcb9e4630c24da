//! A record keeps the fingerprint rules it was made under, and a retry is compared under
//! them (docs/behaviour.md §24): across a reload, a restart, and replicas that run
//! different configurations, for a marker in flight, a completed record and a streamed
//! one; `GET /keys/{id}` shows them.

use crate::support;

use idemgate::config::Config;
use idemgate::proxy::reload::reload;
use support::bin::TempConfig;
use support::redis::RedisServer;
use support::uploads::{Generated, upload};
use support::{Proxy, Resp, TestClient, Upstream};

const JSON: (&str, &str) = ("content-type", "application/json");

fn no_level(_: &str) -> Result<(), String> {
    Ok(())
}

async fn post(c: &TestClient, key: &str, body: &str, extra: &[(&str, &str)]) -> Resp {
    let mut headers = vec![("idempotency-key", key), JSON];
    headers.extend_from_slice(extra);
    c.send("POST", "/charges", &headers, body).await
}

fn assert_reused(resp: &Resp) {
    assert_eq!(resp.status, 422, "{}", resp.text());
    assert_eq!(resp.problem(), "key-reused");
}

/// `fingerprint_body: json` with `/nonce` left out, after records made under `raw`: an
/// honest retry of an old key replays (under `json` its fingerprint differs), a changed
/// body is still refused (under `json` it would replay), and new keys follow `json`.
#[tokio::test]
async fn a_reload_leaves_old_keys_under_the_rules_they_were_made_under() {
    let up = Upstream::start().await;
    let raw = format!("upstream:\n  url: {}\n", up.url());
    let file = TempConfig::new(&raw);
    let proxy = Proxy::with_config(Config::from_file(file.path()).expect("config")).await;
    let admin = proxy.admin().await;
    let c = proxy.client();
    let first = post(&c, "old", r#"{"amount":1,"nonce":"a"}"#, &[]).await;
    assert_eq!(first.status, 201, "{}", first.text());

    let json =
        format!("{raw}idempotency:\n  fingerprint_body: json\n  fingerprint_ignore: [/nonce]\n");
    std::fs::write(file.path(), json).expect("rewrite");
    reload(&proxy.state, file.path(), None, &no_level).expect("reloads");

    let retry = post(&c, "old", r#"{"amount":1,"nonce":"a"}"#, &[]).await;
    assert!(retry.replayed(), "{} {}", retry.status, retry.text());
    assert_eq!(retry.body, first.body);
    assert_reused(&post(&c, "old", r#"{"amount":1,"nonce":"b"}"#, &[]).await);
    assert_reused(&post(&c, "old", r#"{ "nonce": "a", "amount": 1 }"#, &[]).await);

    let new = post(&c, "new", r#"{"amount":1,"nonce":"a"}"#, &[]).await;
    assert_eq!(new.status, 201);
    let same = post(&c, "new", r#"{ "nonce": "z", "amount": 1.0 }"#, &[]).await;
    assert!(same.replayed(), "{} {}", same.status, same.text());
    assert_eq!(up.count(), 2);

    let shown = |key: &str| {
        let id = proxy.record_id("/charges", key);
        let admin = &admin;
        async move {
            let seen = admin.send("GET", &format!("/keys/{id}"), &[], "").await;
            assert_eq!(seen.status, 200, "{}", seen.text());
            seen.json()["fingerprint_rules"].clone()
        }
    };
    assert_eq!(
        shown("old").await,
        serde_json::json!({"body": "raw", "query": true, "headers": ["content-type"], "ignore": []})
    );
    assert_eq!(
        shown("new").await,
        serde_json::json!({"body": "json", "query": true, "headers": ["content-type"], "ignore": ["/nonce"]})
    );
    proxy.stop().await;
}

/// A marker claimed before a reload that adds a fingerprint header: its retry is told
/// `409 in-flight`, not `422`, and replays once the first request completes.
#[tokio::test]
async fn a_marker_in_flight_is_compared_under_its_own_rules() {
    let up = Upstream::start().await;
    let before = format!("upstream:\n  url: {}\n", up.url());
    let file = TempConfig::new(&before);
    let proxy = Proxy::with_config(Config::from_file(file.path()).expect("config")).await;
    let c = proxy.client();
    let held = {
        let c = c.clone();
        tokio::spawn(async move {
            c.send(
                "POST",
                "/gate/charges",
                &[("idempotency-key", "k"), JSON, ("x-tenant", "t1")],
                "{}",
            )
            .await
        })
    };
    up.wait_for(1).await;
    let after = format!(
        "{before}idempotency:\n  fingerprint_headers: [content-type, x-tenant]\n  \
         fingerprint_query: false\n"
    );
    std::fs::write(file.path(), after).expect("rewrite");
    reload(&proxy.state, file.path(), None, &no_level).expect("reloads");

    let retry = |tenant: &'static str| {
        let c = c.clone();
        async move {
            c.send(
                "POST",
                "/gate/charges",
                &[("idempotency-key", "k"), JSON, ("x-tenant", tenant)],
                "{}",
            )
            .await
        }
    };
    let busy = retry("t2").await;
    assert_eq!(busy.status, 409, "{}", busy.text());
    assert_eq!(busy.problem(), "in-flight");
    up.open_gate();
    let first = held.await.expect("first");
    assert_eq!(first.status, 201, "{}", first.text());
    let replay = retry("t3").await;
    assert!(replay.replayed(), "{} {}", replay.status, replay.text());
    assert_eq!(up.count(), 1);
    proxy.stop().await;
}

/// Two replicas on one Redis, one fingerprinting `X-Tenant` and one not: a key made on
/// either is compared under its maker's rules on both.
#[tokio::test]
async fn replicas_with_different_rules_agree_on_every_key() {
    let up = Upstream::start().await;
    let redis = RedisServer::start().await;
    let store = format!("store:\n  kind: redis\n  url: {}\n", redis.url());
    let tenant = format!(
        "upstream:\n  url: {{upstream}}\n{store}idempotency:\n  \
         fingerprint_headers: [content-type, x-tenant]\n"
    );
    let plain = format!("upstream:\n  url: {{upstream}}\n{store}");
    let a = Proxy::redis(&tenant, &up).await;
    let b = Proxy::redis(&plain, &up).await;
    let (ca, cb) = (a.client(), b.client());

    let made_on_a = post(&ca, "a", "{}", &[("x-tenant", "t1")]).await;
    assert_eq!(made_on_a.status, 201);
    let replay = post(&cb, "a", "{}", &[("x-tenant", "t1")]).await;
    assert!(replay.replayed(), "{} {}", replay.status, replay.text());
    assert_reused(&post(&cb, "a", "{}", &[("x-tenant", "t2")]).await);

    let made_on_b = post(&cb, "b", "{}", &[("x-tenant", "t1")]).await;
    assert_eq!(made_on_b.status, 201);
    let replay = post(&ca, "b", "{}", &[("x-tenant", "t2")]).await;
    assert!(replay.replayed(), "{} {}", replay.status, replay.text());
    assert_reused(&post(&ca, "b", r#"{"x":1}"#, &[("x-tenant", "t1")]).await);
    assert_eq!(up.count(), 2);
    a.stop().await;
    b.stop().await;
}

/// The file store read back by a process started with other rules.
#[tokio::test]
async fn a_restart_with_other_rules_keeps_the_records_rules() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "upstream:\n  url: {}\nstore:\n  kind: file\n  path: {}\n",
        up.url(),
        dir.path().join("store").display()
    );
    let config = |extra: &str| Config::from_yaml_str(&format!("{store}{extra}"), &|_| None);
    let proxy = Proxy::file(config("").expect("config")).await;
    let first = post(&proxy.client(), "k", r#"{"b":2,"a":1}"#, &[]).await;
    assert_eq!(first.status, 201);
    proxy.stop().await;

    let json = "idempotency:\n  fingerprint_body: json\n";
    let proxy = Proxy::file(config(json).expect("config")).await;
    let c = proxy.client();
    let retry = post(&c, "k", r#"{"b":2,"a":1}"#, &[]).await;
    assert!(retry.replayed(), "{} {}", retry.status, retry.text());
    assert_reused(&post(&c, "k", r#"{"a":1,"b":2}"#, &[]).await);
    assert_eq!(up.count(), 1);
    proxy.stop().await;
}

/// A streamed upload made with its query in the fingerprint, retried after a reload
/// that leaves the query out: its body is hashed under the record's up-front
/// fingerprint, and it replays.
#[tokio::test]
async fn a_streamed_record_is_compared_under_its_own_rules() {
    let up = Upstream::start().await;
    let base = format!(
        "upstream:\n  url: {}\nidempotency:\n  max_request_body: 1KiB\n  \
         stream_request_body: true\n  max_streamed_body: 8KiB\n",
        up.url()
    );
    let file = TempConfig::new(&base);
    let proxy = Proxy::with_config(Config::from_file(file.path()).expect("config")).await;
    let body = Generated::new(4096);
    let first = upload(proxy.addr, "/docs?v=1", "s", body).await;
    assert_eq!(first.status, 201, "{}", first.text());
    std::fs::write(file.path(), format!("{base}  fingerprint_query: false\n")).expect("write");
    reload(&proxy.state, file.path(), None, &no_level).expect("reloads");
    let retry = upload(proxy.addr, "/docs?v=1", "s", body).await;
    assert!(retry.replayed(), "{} {}", retry.status, retry.text());
    let other = upload(proxy.addr, "/docs?v=2", "s", body).await;
    assert_eq!(other.status, 422, "{}", other.text());
    assert_eq!(up.count(), 1);
    proxy.stop().await;
}
