//! The admin key API (docs/behaviour.md §13) over real sockets, on every store kind: what
//! `GET /keys/{id}` reports, what `DELETE /keys/{id}` removes and refuses, the fencing of
//! a forcibly purged request, and who may ask.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idemgate::config::Config;
use idemgate::metrics::Outcome;
use idemgate::store::{RedisStore, Store};
use support::bin::{Running, TempConfig, free_port};
use support::postgres::PgServer;
use support::redis::{RedisCluster, RedisServer};
use support::{Proxy, Resp, TestClient, Upstream};

fn time(value: &serde_json::Value) -> SystemTime {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("a time, got {value}"));
    humantime::parse_rfc3339(text).unwrap_or_else(|err| panic!("{text}: {err}"))
}

fn assert_problem(resp: &Resp, status: u16, slug: &str) {
    assert_eq!(resp.status, status, "{}", resp.text());
    assert_eq!(
        resp.headers["content-type"],
        "application/problem+json",
        "{}",
        resp.text()
    );
    assert_eq!(resp.problem(), slug, "{}", resp.text());
}

/// Everything of the key API that does not depend on the store kind, run on each
/// (docs/behaviour.md §13).
async fn inspect_purge_and_fence<S: Store>(proxy: Proxy<S>, up: &Upstream) {
    let client = proxy.client();
    let admin = proxy.admin().await;

    // A completed record: reported without its body, headers or key.
    let first = client
        .post("/charges", "order-7731", "{\"amount\":100}")
        .await;
    assert_eq!(first.status, 201);
    let id = proxy.record_id("/charges", "order-7731");
    assert!(id.starts_with("idemgate:") && id.len() == "idemgate:".len() + 64);
    let seen = admin.send("GET", &format!("/keys/{id}"), &[], "").await;
    assert_eq!(seen.status, 200, "{}", seen.text());
    assert_eq!(seen.headers["content-type"], "application/json");
    let text = seen.text();
    for secret in ["order-7731", "amount", "session=", "execution"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    let json = seen.json();
    let fields: Vec<&str> = json
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = [
        "id",
        "state",
        "status",
        "replayable",
        "body_bytes",
        "fingerprint",
        "fingerprint_rules",
        "created_at",
        "completed_at",
        "expires_at",
        "lease_expires_at",
        "encryption_key_id",
    ];
    expected.sort_unstable();
    let mut fields = fields;
    fields.sort_unstable();
    assert_eq!(fields, expected);
    assert_eq!(json["id"], id);
    assert_eq!(json["state"], "completed");
    assert_eq!(json["status"], 201);
    assert_eq!(
        json["fingerprint_rules"],
        serde_json::json!({"body": "raw", "query": true, "headers": ["content-type"], "ignore": []})
    );
    assert_eq!(json["replayable"], true);
    assert_eq!(json["body_bytes"], first.body.len());
    assert!(json["encryption_key_id"].is_null(), "kept in clear");
    let fingerprint = json["fingerprint"].as_str().expect("a string");
    assert!(fingerprint.len() == 64 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(json["lease_expires_at"].is_null());
    let (created, completed, expires) = (
        time(&json["created_at"]),
        time(&json["completed_at"]),
        time(&json["expires_at"]),
    );
    let now = SystemTime::now();
    assert!(created <= completed && completed <= now, "{json}");
    assert!(now.duration_since(created).expect("past") < Duration::from_secs(60));
    // The default ttl is 24 h, counted from completion.
    let ttl = expires.duration_since(completed).expect("after completion");
    assert!(ttl > Duration::from_secs(23 * 3600) && ttl <= Duration::from_secs(24 * 3600 + 1));

    // The 64 hex alone name it too.
    let bare = admin
        .send(
            "GET",
            &format!("/keys/{}", &id["idemgate:".len()..]),
            &[],
            "",
        )
        .await;
    assert_eq!(bare.json(), json);
    let absent = format!("/keys/idemgate:{}", "0".repeat(64));
    assert_problem(
        &admin.send("GET", &absent, &[], "").await,
        404,
        "key-not-found",
    );
    assert_problem(
        &admin.send("DELETE", &absent, &[], "").await,
        404,
        "key-not-found",
    );
    assert_problem(
        &admin.send("GET", "/keys/not-an-id", &[], "").await,
        404,
        "key-not-found",
    );
    assert_eq!(
        admin
            .send("PUT", &format!("/keys/{id}"), &[], "")
            .await
            .status,
        405
    );

    // A purge of a completed key: the next retry executes again.
    assert_eq!(
        client
            .post("/charges", "order-7731", "{\"amount\":100}")
            .await
            .status,
        201
    );
    assert_eq!(up.count(), 1, "replayed before the purge");
    let purged = admin.send("DELETE", &format!("/keys/{id}"), &[], "").await;
    assert_eq!(purged.status, 204, "{}", purged.text());
    assert!(purged.body.is_empty());
    assert_eq!(proxy.state.metrics.purges(), 1);
    assert_problem(
        &admin.send("GET", &format!("/keys/{id}"), &[], "").await,
        404,
        "key-not-found",
    );
    assert_problem(
        &admin.send("DELETE", &format!("/keys/{id}"), &[], "").await,
        404,
        "key-not-found",
    );
    let again = client
        .post("/charges", "order-7731", "{\"amount\":100}")
        .await;
    assert_eq!(again.status, 201);
    assert_eq!(up.count(), 2, "executed again after the purge");

    // A live marker: reported in flight, never purged without force.
    let held = client.spawn_post("/gate/charges", "order-7732", "{}");
    up.wait_for(3).await;
    let id = proxy.record_id("/gate/charges", "order-7732");
    let seen = admin.send("GET", &format!("/keys/{id}"), &[], "").await;
    assert_eq!(seen.status, 200, "{}", seen.text());
    let json = seen.json();
    assert_eq!(json["state"], "in_flight");
    assert!(
        json["status"].is_null() && json["body_bytes"].is_null() && json["completed_at"].is_null()
    );
    assert_eq!(json["replayable"], false);
    let lease_ends = time(&json["lease_expires_at"]);
    assert!(lease_ends > SystemTime::now(), "{json}");
    assert!(time(&json["created_at"]) <= SystemTime::now());
    assert!(time(&json["expires_at"]) >= lease_ends);
    let refused = admin.send("DELETE", &format!("/keys/{id}"), &[], "").await;
    assert_problem(&refused, 409, "in-flight");
    assert_problem(
        &admin
            .send("DELETE", &format!("/keys/{id}?force=false"), &[], "")
            .await,
        409,
        "in-flight",
    );
    assert_eq!(
        admin
            .send("GET", &format!("/keys/{id}"), &[], "")
            .await
            .json()["state"],
        "in_flight",
        "an unforced purge never removes a live marker"
    );
    assert_eq!(proxy.state.metrics.purges(), 1);

    // Forced: the retry executes, and the first request's late record is fenced off.
    let forced = admin
        .send("DELETE", &format!("/keys/{id}?force=true"), &[], "")
        .await;
    assert_eq!(forced.status, 204, "{}", forced.text());
    assert_eq!(proxy.state.metrics.purges(), 2);
    let retry = client.spawn_post("/gate/charges", "order-7732", "{}");
    up.wait_for(4).await;
    up.open_gate();
    let (first, second) = (held.await.expect("first"), retry.await.expect("retry"));
    assert_eq!((first.status.as_u16(), second.status.as_u16()), (201, 201));
    let lost = proxy
        .state
        .metrics
        .wait_until(|m| m.requests(Outcome::LeaseLost) == 1);
    tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("the fenced request is counted lease_lost");
    let replay = client.post("/gate/charges", "order-7732", "{}").await;
    assert!(replay.replayed());
    assert_eq!(
        replay.headers["x-execution"], second.headers["x-execution"],
        "the record is the newer claim's, not the fenced one's"
    );
    assert_eq!(up.count(), 4);
}

#[tokio::test]
async fn on_the_memory_store() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}\n", &up).await;
    inspect_purge_and_fence(proxy, &up).await;
}

#[tokio::test]
async fn on_the_file_store() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = format!(
        "upstream:\n  url: {}\nstore:\n  kind: file\n  path: {}\n",
        up.url(),
        dir.path().join("store").display()
    );
    let proxy = Proxy::file(Config::from_yaml_str(&yaml, &|_| None).expect("config")).await;
    inspect_purge_and_fence(proxy, &up).await;
}

/// A redis-server of its own and a proxy on it, in front of `up`.
async fn on_its_own_redis(up: &Upstream) -> (RedisServer, Proxy<RedisStore>) {
    let redis = RedisServer::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {}\n",
        redis.url()
    );
    let proxy = Proxy::redis(&yaml, up).await;
    (redis, proxy)
}

#[tokio::test]
async fn on_redis() {
    let up = Upstream::start().await;
    let (_redis, proxy) = on_its_own_redis(&up).await;
    inspect_purge_and_fence(proxy, &up).await;
}

#[tokio::test]
async fn on_postgres() {
    let up = Upstream::start().await;
    let server = PgServer::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: postgres\n  url: {}\n",
        server.url()
    );
    let proxy = Proxy::postgres(&yaml, &up).await;
    inspect_purge_and_fence(proxy, &up).await;
}

#[tokio::test]
async fn on_a_redis_cluster() {
    let cluster = RedisCluster::start().await;
    let up = Upstream::start().await;
    let urls = cluster.seed_urls();
    let yaml = format!(
        "upstream:\n  url: {}\nstore:\n  kind: redis\n  cluster: true\n  urls: [{}]\n",
        up.url(),
        urls.join(", ")
    );
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("config");
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    let proxy = Proxy::with_store(config, store).await;
    inspect_purge_and_fence(proxy, &up).await;
}

const TOKEN: &str = "adm-5f3e0c2b9a";

#[tokio::test]
async fn a_token_guards_keys_and_nothing_else() {
    let up = Upstream::start().await;
    let yaml = format!("upstream:\n  url: {{upstream}}\nadmin:\n  token: {TOKEN}\n");
    let proxy = Proxy::start(&yaml, &up).await;
    let admin = proxy.admin().await;
    proxy.client().post("/charges", "k-1", "{}").await;
    let path = format!("/keys/{}", proxy.record_id("/charges", "k-1"));
    for auth in [
        None,
        Some("Bearer wrong".to_owned()),
        Some(format!("Basic {TOKEN}")),
        Some(format!("Bearer {TOKEN}x")),
    ] {
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        for method in ["GET", "DELETE"] {
            let refused = admin.send(method, &path, &headers, "").await;
            assert_problem(&refused, 401, "unauthorized");
            assert!(refused.headers.contains_key("www-authenticate"));
            let text = refused.text();
            assert!(!text.contains(TOKEN), "{text}");
        }
    }
    // Refused before anything else: an unknown id is 401 too, not 404.
    assert_problem(
        &admin
            .send(
                "GET",
                &format!("/keys/idemgate:{}", "1".repeat(64)),
                &[],
                "",
            )
            .await,
        401,
        "unauthorized",
    );
    let bearer = format!("Bearer {TOKEN}");
    let ok = admin
        .send("GET", &path, &[("authorization", &bearer)], "")
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(admin.send("GET", open, &[], "").await.status, 200, "{open}");
    }
    assert_eq!(
        proxy.state.metrics.purges(),
        0,
        "nothing was purged by a refused call"
    );
    let deleted = admin
        .send("DELETE", &path, &[("authorization", &bearer)], "")
        .await;
    assert_eq!(deleted.status, 204);

    // A reload that changes the token applies to the next call.
    let yaml = format!(
        "upstream:\n  url: {}\nadmin:\n  token: rotated-token\n",
        up.url()
    );
    proxy
        .state
        .apply(Config::from_yaml_str(&yaml, &|_| None).expect("config"));
    assert_problem(
        &admin
            .send("GET", &path, &[("authorization", &bearer)], "")
            .await,
        401,
        "unauthorized",
    );
    let rotated = admin
        .send(
            "GET",
            &path,
            &[("authorization", "Bearer rotated-token")],
            "",
        )
        .await;
    assert_problem(&rotated, 404, "key-not-found");
}

/// Without a token, `/keys` is served only on a loopback admin listener. The listener
/// here is bound to every interface, and reached over loopback.
#[tokio::test]
async fn without_a_token_only_a_loopback_listener_serves_keys() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}\n", &up).await;
    let loopback = proxy.admin().await;
    let path = format!("/keys/idemgate:{}", "2".repeat(64));
    assert_problem(
        &loopback.send("GET", &path, &[], "").await,
        404,
        "key-not-found",
    );

    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let state = Arc::clone(&proxy.state);
    tokio::spawn(async move {
        idemgate::admin::serve_admin(listener, state, std::future::pending()).await;
    });
    let everywhere = TestClient::new(([127, 0, 0, 1], port).into());
    for method in ["GET", "DELETE"] {
        let refused = everywhere.send(method, &path, &[], "").await;
        assert_problem(&refused, 403, "forbidden");
    }
    let bearer = [("authorization", "Bearer anything")];
    assert_problem(
        &everywhere.send("GET", &path, &bearer, "").await,
        403,
        "forbidden",
    );
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            everywhere.send("GET", open, &[], "").await.status,
            200,
            "{open}"
        );
    }
}

/// The binary end to end: the token from `${VAR}`, the purge logged at warn with the id,
/// the state and the caller, and counted; no raw key, body or token in any line.
#[tokio::test]
async fn a_purge_is_logged_and_counted_without_secrets() {
    let up = Upstream::start().await;
    // The admin port is picked free and may be taken before idemgate binds it (another
    // test's server): then idemgate logs so and keeps serving, and this tries another.
    let mut attempts = 0;
    let (config, admin_port, mut running) = loop {
        attempts += 1;
        let admin_port = free_port();
        let config = TempConfig::new(&format!(
            "upstream:\n  url: {}\nadmin:\n  listen: 127.0.0.1:{admin_port}\n  token: ${{ADMIN_TOKEN}}\nlog:\n  format: json\n  level: info\n",
            up.url()
        ));
        let path = config.path().display().to_string();
        let mut running =
            Running::start_with_env(&["--config", &path], &[("ADMIN_TOKEN", TOKEN)]).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let bound = loop {
            let log = running.stderr();
            if log.contains("admin listening") {
                break true;
            }
            if log.contains("admin listener not started") {
                break false;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no admin listener:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        if bound {
            break (config, admin_port, running);
        }
        running.kill().await;
        assert!(attempts < 5, "no free admin port in 5 attempts");
    };
    let path = config.path().display().to_string();
    let client = TestClient::new(running.addr);
    let secret_key = "customer-4242-payment-77";
    assert_eq!(
        client
            .post("/charges", secret_key, "{\"card\":\"4111\"}")
            .await
            .status,
        201
    );
    let id = support::bin::run(
        support::bin::idemgate()
            .env("ADMIN_TOKEN", TOKEN)
            .args(["key", "--config", &path, "--path", "/charges", secret_key]),
    )
    .await;
    assert_eq!(id.code(), Some(0), "{}", id.stderr);
    let id = id.stdout.trim().to_owned();
    let admin = TestClient::new(([127, 0, 0, 1], admin_port).into());
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let seen = admin.send("GET", &format!("/keys/{id}"), &auth, "").await;
    assert_eq!(seen.status, 200, "{}", seen.text());
    let deleted = admin
        .send("DELETE", &format!("/keys/{id}"), &auth, "")
        .await;
    assert_eq!(deleted.status, 204);
    let metrics = admin.send("GET", "/metrics", &[], "").await.text();
    assert!(
        metrics.contains("idemgate_admin_purges_total 1"),
        "{metrics}"
    );
    running.terminate().await;
    let log = running.stderr();
    let purge = log
        .lines()
        .find(|line| line.contains("admin purge"))
        .unwrap_or_else(|| panic!("no purge line in:\n{log}"));
    let line: serde_json::Value = serde_json::from_str(purge).expect("a JSON line");
    assert_eq!(line["level"], "WARN", "{purge}");
    let fields = if line["fields"].is_object() {
        &line["fields"]
    } else {
        &line
    };
    assert_eq!(fields["id"], id.as_str(), "{purge}");
    assert_eq!(fields["state"], "completed", "{purge}");
    assert!(
        fields["caller"]
            .as_str()
            .is_some_and(|c| c.starts_with("127.0.0.1:")),
        "{purge}"
    );
    for secret in [secret_key, TOKEN, "4111"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

/// A record written before records kept their times (format 1) still loads: reported
/// with `created_at` and `completed_at` null, and purged like any other.
#[tokio::test]
async fn a_record_from_before_times_were_kept_is_reported_and_purged() {
    let up = Upstream::start().await;
    let (redis, proxy) = on_its_own_redis(&up).await;
    let id = proxy.record_id("/charges", "old-key");
    // A completed 201 with no headers and the body `ok`, in format 1, under a
    // fingerprint nobody's request has: enough to be reported, not replayed.
    let mut v1 = vec![1u8, 2];
    v1.extend([7; 32]);
    v1.extend(201u16.to_be_bytes());
    v1.push(0);
    v1.extend(0u16.to_be_bytes());
    v1.extend(2u32.to_be_bytes());
    v1.extend(b"ok");
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    redis::cmd("SET")
        .arg(&id)
        .arg(v1)
        .arg("PX")
        .arg(60_000)
        .query_async::<()>(&mut conn)
        .await
        .expect("set");
    let admin = proxy.admin().await;
    let seen = admin.send("GET", &format!("/keys/{id}"), &[], "").await;
    assert_eq!(seen.status, 200, "{}", seen.text());
    let json = seen.json();
    assert_eq!(json["state"], "completed");
    assert_eq!(json["status"], 201);
    assert_eq!(json["body_bytes"], 2);
    assert_eq!(json["fingerprint"], "07".repeat(32));
    assert!(
        json["created_at"].is_null() && json["completed_at"].is_null(),
        "{json}"
    );
    assert!(time(&json["expires_at"]) > SystemTime::now());
    assert_eq!(
        admin
            .send("DELETE", &format!("/keys/{id}"), &[], "")
            .await
            .status,
        204
    );
    assert_eq!(
        proxy
            .client()
            .post("/charges", "old-key", "{}")
            .await
            .status,
        201
    );
    assert_eq!(up.count(), 1, "the purged key executed");
}

/// With `errors.format: template`, the key API's problems take the template's shape too,
/// statuses and headers unchanged (docs/behaviour.md §16).
#[tokio::test]
async fn admin_problems_follow_the_error_template() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nerrors:\n  format: template\n  \
                template: '{\"error\":{\"code\":\"{slug}\",\"status\":{status}}}'\n  \
                content_type: application/vnd.legacy+json\n";
    let proxy = Proxy::start(yaml, &up).await;
    let admin = proxy.admin().await;
    let absent = admin
        .send(
            "GET",
            &format!("/keys/idemgate:{}", "3".repeat(64)),
            &[],
            "",
        )
        .await;
    assert_eq!(absent.status, 404);
    assert_eq!(
        absent.headers["content-type"],
        "application/vnd.legacy+json"
    );
    assert_eq!(
        absent.json(),
        serde_json::json!({"error": {"code": "key-not-found", "status": 404}})
    );
}
