//! Encryption at rest (docs/behaviour.md §17) over real sockets, on every store kind:
//! what the store holds, replays, rotation, clear records from before, and a record that
//! does not decrypt. Several proxies with different keyrings share one store, as
//! replicas (or a restart with a new configuration) do.

use crate::support;

use std::sync::Arc;

use idemgate::config::Config;
use idemgate::idempotency::record::{KIND_SEALED, KIND_SEALED_ADDRESS_ONLY};
use idemgate::idempotency::{Completed, Kept, Record, Streamed};
use idemgate::store::{FileOptions, FileStore, MemoryStore, PostgresStore, RedisStore, Store};
use support::postgres::PgServer;
use support::redis::{RedisCluster, RedisServer};
use support::{Proxy, Upstream};

const K1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const K2: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
const MARKER: &str = "CARD-4242-MARKER-5f1e";
/// In the record written in clear, which the file store's journal keeps beside the
/// sealed ones.
const PLAIN: &str = "PLAIN-MARKER-77aa";

/// The configuration of one proxy: `store` (the lines under `store:`) and these keys.
fn config(up: &Upstream, store: &str, keys: &[(&str, &str)]) -> Config {
    let mut yaml = format!("upstream:\n  url: {}\nstore:\n{store}", up.url());
    if !keys.is_empty() {
        yaml.push_str("  encryption:\n    keys:\n");
        for (id, key) in keys {
            yaml.push_str(&format!("      - {{id: {id}, key: {key}}}\n"));
        }
    }
    Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid")
}

fn body(n: u32) -> String {
    let marker = if n == 1 { PLAIN } else { MARKER };
    format!("{{\"card\":\"{marker}\",\"n\":{n}}}")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Everything of encryption at rest that does not depend on the store kind.
/// `stored(id)` returns the bytes the store itself holds for a record id (`None` while
/// it holds nothing).
async fn sealed_at_rest<S, F>(store: Arc<S>, store_yaml: &str, stored: F)
where
    S: Store,
    F: AsyncFn(&str) -> Option<Vec<u8>>,
{
    let up = Upstream::start().await;
    let start = |keys: &[(&str, &str)]| {
        Proxy::with_store(config(&up, store_yaml, keys), Arc::clone(&store))
    };

    // Written in clear before encryption was turned on: the store shows the body, which
    // also shows that `stored` can see one.
    let plain = start(&[]).await;
    let first = plain.client().post("/charges", "clear-1", &body(1)).await;
    assert_eq!(first.status, 201);
    let clear_id = plain.record_id("/charges", "clear-1");
    let held = stored(&clear_id).await.expect("a clear record is stored");
    assert!(contains(&held, PLAIN), "a clear record shows its body");
    drop(plain);

    let sealing = start(&[("k1", K1)]).await;
    let client = sealing.client();
    let admin = sealing.admin().await;
    let first = client.post("/charges", "enc-1", &body(2)).await;
    assert_eq!(first.status, 201);
    assert!(first.text().contains(MARKER), "the client gets the body");
    let again = client.post("/charges", "enc-1", &body(2)).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["x-execution"], first.headers["x-execution"]);
    let id = sealing.record_id("/charges", "enc-1");
    let held = stored(&id).await.expect("the record is stored");
    assert!(!held.is_empty());
    assert!(!contains(&held, MARKER), "the body is in the stored bytes");
    let shown = admin.send("GET", &format!("/keys/{id}"), &[], "").await;
    assert_eq!(shown.status, 200, "{}", shown.text());
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).expect("json");
    assert_eq!(shown["encryption_key_id"], "k1", "{shown}");
    assert_eq!(shown["state"], "completed");
    assert_eq!(shown["replayable"], true);
    assert!(
        shown["status"].is_null() && shown["body_bytes"].is_null(),
        "{shown}"
    );
    assert!(shown["fingerprint"].as_str().is_some_and(|f| f.len() == 64));
    assert!(shown["completed_at"].is_string(), "times stay readable");
    // The clear record from before still replays, and says it is clear.
    let old = client.post("/charges", "clear-1", &body(1)).await;
    assert!(old.replayed() && old.text().contains(PLAIN));
    let shown = admin
        .send("GET", &format!("/keys/{clear_id}"), &[], "")
        .await;
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).expect("json");
    assert!(shown["encryption_key_id"].is_null(), "{shown}");
    assert_eq!(shown["status"], 201);
    drop(sealing);

    // Rotation: a new key first; the old one still opens what it sealed.
    let rotated = start(&[("k2", K2), ("k1", K1)]).await;
    let again = rotated.client().post("/charges", "enc-1", &body(2)).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    rotated.client().post("/charges", "enc-2", &body(3)).await;
    let id2 = rotated.record_id("/charges", "enc-2");
    let shown = rotated
        .admin()
        .await
        .send("GET", &format!("/keys/{id2}"), &[], "")
        .await;
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).expect("json");
    assert_eq!(shown["encryption_key_id"], "k2", "{shown}");
    drop(rotated);
    let executed = up.count();

    // k1 dropped: its record is never replayed nor executed again, until purged.
    let dropped = start(&[("k2", K2)]).await;
    let refused = dropped.client().post("/charges", "enc-1", &body(2)).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.problem(), "store-unavailable");
    assert!(!refused.text().contains(MARKER));
    assert_eq!(up.count(), executed, "not forwarded");
    let metrics = dropped.state.metrics.render();
    assert!(
        metrics.contains("idemgate_store_undecryptable_total 1"),
        "{metrics}"
    );
    let admin = dropped.admin().await;
    let shown = admin.send("GET", &format!("/keys/{id}"), &[], "").await;
    assert_eq!(shown.status, 200, "inspected without decrypting");
    let purged = admin.send("DELETE", &format!("/keys/{id}"), &[], "").await;
    assert_eq!(purged.status, 204, "{}", purged.text());
    let fresh = dropped.client().post("/charges", "enc-1", &body(2)).await;
    assert_eq!(fresh.status, 201);
    assert!(!fresh.replayed());
    assert_eq!(up.count(), executed + 1, "executes again once purged");
}

#[tokio::test]
async fn on_the_memory_store() {
    let store = Arc::new(MemoryStore::new(1000));
    let probe = Arc::clone(&store);
    sealed_at_rest(store, "  kind: memory\n", async move |id: &str| {
        let hex = id.strip_prefix("idemgate:").expect("prefix");
        let key = idemgate::idempotency::ScopedKey::from_hex(hex).expect("an id");
        let found = probe.inspect(key).await.expect("inspect")?;
        Some(found.record.encode().to_vec())
    })
    .await;
}

#[tokio::test]
async fn on_the_file_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store");
    let yaml = format!("  kind: file\n  path: {}\n", path.display());
    let config = Config::from_yaml_str(
        &format!("upstream:\n  url: http://127.0.0.1:9\nstore:\n{yaml}"),
        &|_| None,
    )
    .expect("config");
    let store = Arc::new(FileStore::open(&FileOptions::from_config(&config.store)).expect("open"));
    // The store's files, whole: the journal holds every record written.
    sealed_at_rest(store, &yaml, async move |_: &str| {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(&path).expect("store dir") {
            let entry = entry.expect("entry");
            if entry.file_type().expect("type").is_file() {
                all.extend(std::fs::read(entry.path()).expect("read"));
            }
        }
        Some(all)
    })
    .await;
}

/// `GET id` as Redis answers it, raw.
async fn redis_get(conn: &mut impl redis::aio::ConnectionLike, id: &str) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(id)
        .query_async::<Option<Vec<u8>>>(conn)
        .await
        .expect("GET")
}

#[tokio::test]
async fn on_redis() {
    let server = RedisServer::start().await;
    let yaml = format!("  kind: redis\n  url: {}\n", server.url());
    let config = Config::from_yaml_str(
        &format!("upstream:\n  url: http://127.0.0.1:9\nstore:\n{yaml}"),
        &|_| None,
    )
    .expect("config");
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    let client = redis::Client::open(server.url()).expect("client");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    sealed_at_rest(store, &yaml, async move |id: &str| {
        redis_get(&mut conn.clone(), id).await
    })
    .await;
}

/// The row's `value` as the database holds it; `id` is the record id the proxy prints,
/// whose last 64 characters are the row's id.
#[tokio::test]
async fn on_postgres() {
    let server = PgServer::start().await;
    let yaml = format!("  kind: postgres\n  url: {}\n", server.url());
    let config = Config::from_yaml_str(
        &format!("upstream:\n  url: http://127.0.0.1:9\nstore:\n{yaml}"),
        &|_| None,
    )
    .expect("config");
    let store = Arc::new(PostgresStore::new(&config.store).expect("store"));
    store.start().await.expect("table");
    let server = &server;
    sealed_at_rest(store, &yaml, async move |id: &str| {
        let row = &id[id.len() - 64..];
        let hex = server.psql(&format!(
            "SELECT encode(value, 'hex') FROM idemgate_records WHERE id = '{row}'"
        ));
        (!hex.is_empty()).then(|| {
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect()
        })
    })
    .await;
}

#[tokio::test]
async fn on_a_redis_cluster() {
    let cluster = RedisCluster::start().await;
    let urls = cluster.seed_urls();
    let yaml = format!(
        "  kind: redis\n  cluster: true\n  urls: [{}]\n",
        urls.join(", ")
    );
    let config = Config::from_yaml_str(
        &format!("upstream:\n  url: http://127.0.0.1:9\nstore:\n{yaml}"),
        &|_| None,
    )
    .expect("config");
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    let client = redis::cluster::ClusterClient::new(urls).expect("cluster client");
    let conn = client.get_async_connection().await.expect("connection");
    sealed_at_rest(store, &yaml, async move |id: &str| {
        redis_get(&mut conn.clone(), id).await
    })
    .await;
}

/// A proxy sealing with key `k1` in front of `up`, on a real `server`.
async fn sealed_on_redis(server: &RedisServer, up: &Upstream) -> Proxy<RedisStore> {
    let yaml = format!("  kind: redis\n  url: {}\n", server.url());
    let config = config(up, &yaml, &[("k1", K1)]);
    let store = Arc::new(RedisStore::new(&config.store).expect("store"));
    Proxy::with_store(config, store).await
}

/// The record's address is the associated data: a sealed value copied under another
/// key (by someone with write access to Redis) does not decrypt there, and is refused.
#[tokio::test]
async fn a_sealed_value_copied_under_another_key_is_refused() {
    let server = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = sealed_on_redis(&server, &up).await;
    let client = proxy.client();
    assert_eq!(
        client.post("/charges", "victim", &body(1)).await.status,
        201
    );
    assert_eq!(client.post("/charges", "other", &body(1)).await.status, 201);
    let redis = redis::Client::open(server.url()).expect("client");
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let value = redis_get(&mut conn, &proxy.record_id("/charges", "victim"))
        .await
        .expect("stored");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(proxy.record_id("/charges", "other"))
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    let _: () = redis::cmd("SET")
        .arg(proxy.record_id("/charges", "other"))
        .arg(value)
        .arg("PX")
        .arg(ttl)
        .query_async(&mut conn)
        .await
        .expect("SET");
    let moved = client.post("/charges", "other", &body(1)).await;
    assert_eq!(moved.status, 503, "{}", moved.text());
    assert_eq!(up.count(), 2);
    let victim = client.post("/charges", "victim", &body(1)).await;
    assert!(
        victim.replayed(),
        "the original still opens where it belongs"
    );
}

/// The binary, as an operator runs it: keys from environment variables, logs at
/// `trace`. Neither a key nor the body ever reaches a log line; after a restart without
/// the sealing key, the record is refused with an `error` line naming the record and
/// the key id, and is never executed again.
#[tokio::test]
async fn the_binary_never_logs_keys_and_names_a_record_that_does_not_decrypt() {
    use support::bin::{Running, TempConfig};
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = |keys: &str| {
        format!(
            "upstream:\n  url: {}\nadmin:\n  listen: null\nlog:\n  level: trace\nstore:\n  kind: file\n  path: {}\n  encryption:\n    keys:\n{keys}",
            up.url(),
            dir.path().join("store").display()
        )
    };
    let env = [("ENC_K1", K1), ("ENC_K2", K2)];
    let first = TempConfig::new(&yaml("      - {id: k1, key: \"${ENC_K1}\"}\n"));
    let path = first.path().to_string_lossy().into_owned();
    let mut running = Running::start_with_env(&["--config", &path], &env).await;
    let client = support::TestClient::new(running.addr);
    let created = client.post("/charges", "bin-1", &body(2)).await;
    assert_eq!(created.status, 201, "{}", created.text());
    assert!(client.post("/charges", "bin-1", &body(2)).await.replayed());
    running.terminate().await;
    assert!(running.wait_exit().await.success());
    let log = running.stderr();
    for secret in [K1, MARKER] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }

    let second = TempConfig::new(&yaml("      - {id: k2, key: \"${ENC_K2}\"}\n"));
    let path = second.path().to_string_lossy().into_owned();
    let mut running = Running::start_with_env(&["--config", &path], &env).await;
    let client = support::TestClient::new(running.addr);
    let refused = client.post("/charges", "bin-1", &body(2)).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.problem(), "store-unavailable");
    assert_eq!(up.count(), 1, "never executed again");
    running.terminate().await;
    running.wait_exit().await;
    let log = running.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("does not decrypt") && l.contains("ERROR"))
        .unwrap_or_else(|| panic!("no error line for the record:\n{log}"));
    assert!(line.contains("k1"), "names the key id: {line}");
    assert!(line.contains("idemgate:"), "names the record id: {line}");
    for secret in [K1, K2, MARKER] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

/// "Encryption at rest" of docs/stores.md, run as written: its `openssl` command makes the
/// keys, its YAML is the configuration, and its three rotation steps are followed with
/// the real binary on a file store.
#[tokio::test]
async fn the_readme_section_runs_as_written() {
    use support::bin::{Running, TempConfig};
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/stores.md"))
        .expect("docs/stores.md");
    let section = doc
        .split("\n## Encryption at rest\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/stores.md has the section");
    let block = |lang: &str| {
        section
            .split(&format!("```{lang}\n"))
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap_or_else(|| panic!("a {lang} block"))
            .to_owned()
    };
    let (sh, yaml) = (block("sh"), block("yaml"));
    let var = sh
        .trim()
        .strip_prefix("export ")
        .and_then(|rest| rest.split('=').next())
        .expect("export VAR=...")
        .to_owned();
    assert!(
        yaml.contains(&format!("${{{var}}}")),
        "the YAML reads {var}"
    );
    // Two keys made by the doc's command, as two rotations would.
    let key = || {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("{}\nprintf %s \"${var}\"", sh.trim()))
            .output()
            .expect("bash");
        assert!(out.status.success());
        String::from_utf8(out.stdout).expect("base64 text")
    };
    let (old_key, new_key) = (key(), key());
    assert_ne!(old_key, new_key);

    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let base = format!(
        "upstream:\n  url: {}\nadmin:\n  listen: null\n{}",
        up.url(),
        yaml.replace(
            "store:\n",
            &format!(
                "store:\n  kind: file\n  path: {}\n",
                dir.path().join("store").display()
            )
        )
    );
    let old_id = base
        .split("id: \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the key's id")
        .to_owned();
    let run = async |yaml: &str, env: &[(&str, &str)]| {
        let file = TempConfig::new(yaml);
        let path = file.path().to_string_lossy().into_owned();
        let running = Running::start_with_env(&["--config", &path], env).await;
        (file, running)
    };

    // Turned on.
    let (_file, mut running) = run(&base, &[(var.as_str(), old_key.as_str())]).await;
    let client = support::TestClient::new(running.addr);
    assert_eq!(client.post("/charges", "old", &body(2)).await.status, 201);
    running.terminate().await;
    running.wait_exit().await;

    // Step 1: the new key listed first, the old one after it.
    let new_var = format!("{var}_NEW");
    let both = base.replace(
        "    keys:\n",
        &format!("    keys:\n      - {{id: \"next\", key: \"${{{new_var}}}\"}}\n"),
    );
    let env = [
        (var.as_str(), old_key.as_str()),
        (new_var.as_str(), new_key.as_str()),
    ];
    let (_file, mut running) = run(&both, &env).await;
    let client = support::TestClient::new(running.addr);
    assert!(client.post("/charges", "old", &body(2)).await.replayed());
    assert_eq!(client.post("/charges", "new", &body(3)).await.status, 201);
    running.terminate().await;
    running.wait_exit().await;
    assert_eq!(up.count(), 2);

    // Step 3 (step 2 is waiting out the ttl): the old key removed. A record of the new
    // key replays; one of the old key, had it not expired, is refused, not executed.
    let only_new = both.replace(
        &format!("      - {{id: \"{old_id}\", key: \"${{{var}}}\"}}\n"),
        "",
    );
    assert!(!only_new.contains(&old_id), "{only_new}");
    let (_file, mut running) = run(&only_new, &env).await;
    let client = support::TestClient::new(running.addr);
    assert!(client.post("/charges", "new", &body(3)).await.replayed());
    assert_eq!(client.post("/charges", "old", &body(2)).await.status, 503);
    assert_eq!(up.count(), 2);
    running.terminate().await;
    running.wait_exit().await;
}

/// `idemgate_store_undecryptable_total`, as `/metrics` exports it.
fn undecryptable<S: Store>(proxy: &Proxy<S>) -> u64 {
    proxy
        .state
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("idemgate_store_undecryptable_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the counter is exported")
}

/// A change made at rest to one field a sealed record keeps in clear.
type Alteration = fn(&mut Completed, &Completed);

/// Every field a sealed record keeps in clear is bound to its seal
/// (docs/behaviour.md §25). Altered at rest in a real redis-server, one field at a time
/// (with the record's expiry kept), the record does not open: its retry is `503 store-unavailable`, counted
/// as undecryptable, never a replay (neither to the original body nor to the one the
/// altered fingerprint names), never an execution, and the operator cannot resolve it.
#[tokio::test]
async fn a_sealed_record_altered_at_rest_in_any_clear_field_does_not_open() {
    let server = RedisServer::start().await;
    let up = Upstream::start().await;
    let proxy = sealed_on_redis(&server, &up).await;
    let (client, admin) = (proxy.client(), proxy.admin().await);
    let redis = redis::Client::open(server.url()).expect("client");
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let record = async |conn: &mut redis::aio::MultiplexedConnection, id: &str| {
        let raw = redis_get(conn, id).await.expect("stored");
        match Record::decode(raw.into()).expect("a record") {
            Record::Completed(completed) => (*completed).clone(),
            Record::InFlight(marker) => panic!("{id} is in flight: {marker:?}"),
        }
    };

    // Another request, whose fingerprint one alteration gives to the victim's record.
    let other_body = body(3);
    assert_eq!(
        client.post("/charges", "other", &other_body).await.status,
        201
    );
    let other = record(&mut conn, &proxy.record_id("/charges", "other")).await;

    let alterations: [(&str, Alteration); 8] = [
        ("fingerprint", |rec, other| {
            rec.fingerprint = other.fingerprint;
        }),
        ("outcome unknown", |rec, _| rec.unknown = true),
        ("too large", |rec, _| match &mut rec.kept {
            Kept::Sealed(sealed) => sealed.too_large = true,
            Kept::Clear(_) => panic!("sealed"),
        }),
        ("claimed at", |rec, _| {
            if let Some(times) = &mut rec.times {
                times.claimed_ms -= 1000;
            }
        }),
        ("completed at", |rec, _| {
            if let Some(times) = &mut rec.times {
                times.completed_ms += 1000;
            }
        }),
        ("times removed", |rec, _| rec.times = None),
        ("streamed", |rec, _| {
            rec.streamed = Some(Streamed {
                upfront: rec.fingerprint,
                whole: true,
            });
        }),
        // Relabelled as sealed by the rule before §25, which bound the address alone.
        ("seal version", |_, _| {}),
    ];
    for (n, (field, alter)) in alterations.into_iter().enumerate() {
        let key = format!("victim-{n}");
        let first = client.post("/charges", &key, &body(2)).await;
        assert_eq!(first.status, 201, "{field}");
        assert!(first.text().contains(MARKER));
        let id = proxy.record_id("/charges", &key);
        let sealed = record(&mut conn, &id).await;
        let mut altered = sealed.clone();
        alter(&mut altered, &other);
        let mut bytes = altered.encode().to_vec();
        if field == "seal version" {
            assert_eq!(bytes[1], KIND_SEALED, "sealed under the rule of §25");
            bytes[1] = KIND_SEALED_ADDRESS_ONLY;
        }
        assert_ne!(bytes, sealed.encode().to_vec(), "{field}: altered");
        let _: () = redis::cmd("SET")
            .arg(&id)
            .arg(&bytes)
            .arg("KEEPTTL")
            .query_async(&mut conn)
            .await
            .expect("SET");

        let (executed, counted) = (up.count(), undecryptable(&proxy));
        let retry_body = if field == "fingerprint" {
            &other_body
        } else {
            &body(2)
        };
        let retry = client.post("/charges", &key, retry_body).await;
        assert_eq!(retry.status, 503, "{field}: {}", retry.text());
        assert_eq!(retry.problem(), "store-unavailable", "{field}");
        assert!(
            !retry.replayed() && !retry.text().contains(MARKER),
            "{field}"
        );
        assert_eq!(up.count(), executed, "{field}: not executed again");
        assert_eq!(undecryptable(&proxy), counted + 1, "{field}: counted");

        let resolved = admin
            .send(
                "POST",
                &format!("/keys/{id}/resolve"),
                &[("content-type", "application/json")],
                r#"{"executed": false}"#,
            )
            .await;
        assert_eq!(resolved.status, 503, "{field}: {}", resolved.text());
        assert_eq!(resolved.problem(), "store-unavailable", "{field}");
        assert_eq!(undecryptable(&proxy), counted + 2, "{field}: counted");
        assert_eq!(
            redis_get(&mut conn, &id).await,
            Some(bytes),
            "{field}: not resolved away"
        );
    }
    // The request whose fingerprint was lent still replays its own answer.
    let own = client.post("/charges", "other", &other_body).await;
    assert!(own.replayed(), "{}", own.text());
}
