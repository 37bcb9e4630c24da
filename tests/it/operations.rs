//! The binary as an operator meets it: the Redis start-up check, TLS to Redis, and the
//! access log.

use crate::support;

use std::time::Duration;

use support::bin::{Running, TempConfig};
use support::redis::RedisServer;
use support::{TestClient, Upstream};

fn redis_config(up: &Upstream, url: &str, extra: &str) -> TempConfig {
    TempConfig::new(&format!(
        "upstream:\n  url: {}\nstore:\n  kind: redis\n  url: {url}\nadmin:\n  listen: null\nlog:\n  format: json\n{extra}",
        up.url()
    ))
}

/// Waits until the child's log holds `needle` (the log is the event), at most 10 s.
async fn log_contains(running: &Running, needle: &str) -> bool {
    for _ in 0..1000 {
        if running.stderr().contains(needle) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn start_up_warns_loudly_when_redis_may_evict_records() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]).await;
    let up = Upstream::start().await;
    let file = redis_config(&up, &redis.url(), "");
    let path = file.path().to_string_lossy().into_owned();
    let running = Running::start(&["--config", &path]).await;
    assert!(
        log_contains(&running, "maxmemory-policy").await,
        "{}",
        running.stderr()
    );
    let line = running
        .stderr()
        .lines()
        .find(|l| l.contains("maxmemory-policy"))
        .map(str::to_owned);
    let line = line.expect("warning line");
    assert!(
        line.contains("WARN") && line.contains("allkeys-lru") && line.contains("noeviction"),
        "{line}"
    );
}

#[tokio::test]
async fn a_safe_policy_gives_no_warning_and_redis_down_at_start_is_not_fatal() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let file = redis_config(&up, &redis.url(), "");
    let path = file.path().to_string_lossy().into_owned();
    let running = Running::start(&["--config", &path]).await;
    assert!(
        log_contains(&running, "noeviction").await,
        "{}",
        running.stderr()
    );
    assert!(
        !running.stderr().contains("\"level\":\"WARN\""),
        "{}",
        running.stderr()
    );

    // Nothing listens here: idemgate still starts and answers 503 instead of crash-looping.
    let gone = RedisServer::start().await;
    let url = gone.url();
    drop(gone);
    let file = redis_config(&up, &url, "");
    let path = file.path().to_string_lossy().into_owned();
    let mut running = Running::start(&["--config", &path]).await;
    let r = TestClient::new(running.addr)
        .post("/charges", "k", "{}")
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.problem(), "store-unavailable");
    assert!(!running.has_exited());
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn rediss_urls_speak_tls_to_redis() {
    // A test CA and a server certificate it signs, as a private PKI would have.
    let pki = support::pki::Pki::new("rediss");
    let ca_s = pki.path("ca.pem");
    let tls_port = support::bin::free_port();
    let (cert_s, key_s) = (pki.path("server.pem"), pki.path("server.key"));
    let port_s = tls_port.to_string();
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &port_s,
        "--tls-cert-file",
        &cert_s,
        "--tls-key-file",
        &key_s,
        "--tls-ca-cert-file",
        &ca_s,
        "--tls-auth-clients",
        "no",
    ])
    .await;
    let up = Upstream::start().await;
    let file = redis_config(&up, &format!("rediss://127.0.0.1:{tls_port}/0"), "");
    let path = file.path().to_string_lossy().into_owned();
    // The system trust store is used; SSL_CERT_FILE points it at the test CA.
    let running = Running::start_with_env(&["--config", &path], &[("SSL_CERT_FILE", &ca_s)]).await;
    let c = TestClient::new(running.addr);
    let first = c.post("/charges", "tls", "{}").await;
    assert_eq!(first.status, 201, "{}\n{}", first.text(), running.stderr());
    assert!(c.post("/charges", "tls", "{}").await.replayed());
    assert_eq!(up.count(), 1);
    let keys = redis.cli(&["DBSIZE"]);
    assert_eq!(keys, "1", "the record went to this Redis, over TLS");
}

#[tokio::test]
async fn the_access_log_has_one_json_line_per_request_without_secrets() {
    let up = Upstream::start().await;
    let file = TempConfig::new(&format!(
        "upstream:\n  url: {}\nadmin:\n  listen: null\nlog:\n  format: json\n",
        up.url()
    ));
    let path = file.path().to_string_lossy().into_owned();
    let running = Running::start(&["--config", &path]).await;
    let c = TestClient::new(running.addr);
    let secret_key = "key-7c9e-super-secret";
    for _ in 0..2 {
        c.send(
            "POST",
            "/charges?x=1",
            &[
                ("idempotency-key", secret_key),
                ("authorization", "Bearer tok-secret"),
            ],
            "{}",
        )
        .await;
    }
    assert!(
        log_contains(&running, "\"outcome\":\"replayed\"").await,
        "{}",
        running.stderr()
    );
    let log = running.stderr();
    let access: Vec<serde_json::Value> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
        })
        .filter(|v| v["target"] == "idemgate::access")
        .collect();
    assert_eq!(access.len(), 2, "{log}");
    for (line, outcome) in access.iter().zip(["forwarded", "replayed"]) {
        assert_eq!(line["method"], "POST");
        assert_eq!(line["path"], "/charges");
        assert_eq!(line["status"], 201);
        assert_eq!(line["outcome"], outcome);
        assert!(line["latency_ms"].is_number());
        assert_eq!(line["key"].as_str().map(str::len), Some(12), "{line}");
    }
    assert_eq!(access[0]["key"], access[1]["key"], "retries correlate");
    assert!(
        !log.contains(secret_key) && !log.contains("tok-secret"),
        "{log}"
    );
}

/// The `request failed` lines of a JSON log, by the error they name.
fn failures(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "request failed")
        .map(|v| v["error"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn an_upstream_failure_is_logged_once_whether_guarded_or_not() {
    // Nothing listens on this port: a connect failure, keyed and keyless.
    let closed = support::bin::free_port();
    let file = TempConfig::new(&format!(
        "upstream:\n  url: http://127.0.0.1:{closed}\nadmin:\n  listen: null\nlog:\n  format: json\n"
    ));
    let path = file.path().to_string_lossy().into_owned();
    let running = Running::start(&["--config", &path]).await;
    let c = TestClient::new(running.addr);
    assert_eq!(c.post("/charges", "k1", "{}").await.status, 502);
    assert_eq!(c.send("POST", "/charges", &[], "{}").await.status, 502);
    assert!(
        log_contains(&running, "\"outcome\":\"upstream_unreachable\"").await,
        "{}",
        running.stderr()
    );
    let failed = failures(&running.stderr());
    assert_eq!(
        failed,
        ["could not connect to the upstream"; 2],
        "{}",
        running.stderr()
    );

    // An upstream timeout on the guarded path, which was never logged.
    let up = Upstream::start().await;
    let file = TempConfig::new(&format!(
        "upstream:\n  url: {}\n  timeout: 200ms\nadmin:\n  listen: null\nlog:\n  format: json\n",
        up.url()
    ));
    let path = file.path().to_string_lossy().into_owned();
    let running = Running::start(&["--config", &path]).await;
    let c = TestClient::new(running.addr);
    assert_eq!(c.post("/hang", "k2", "{}").await.status, 504);
    assert!(
        log_contains(&running, "\"outcome\":\"outcome_unknown\"").await,
        "{}",
        running.stderr()
    );
    let failed = failures(&running.stderr());
    assert_eq!(failed.len(), 1, "{}", running.stderr());
    assert!(failed[0].contains("outcome is unknown"), "{failed:?}");
}
