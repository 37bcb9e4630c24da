//! The admin listener over real sockets: health, readiness against a real store, and
//! the Prometheus exposition.

use crate::support;

use support::redis::RedisServer;
use support::{BASIC, Proxy, Upstream};

#[tokio::test]
async fn healthz_and_readyz_on_the_memory_store() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let admin = proxy.admin().await;
    assert_eq!(admin.send("GET", "/healthz", &[], "").await.status, 200);
    assert_eq!(admin.send("GET", "/readyz", &[], "").await.status, 200);
    assert_eq!(admin.send("GET", "/nope", &[], "").await.status, 404);
    // The proxy port does not serve them: it forwards everything.
    proxy.client().send("GET", "/healthz", &[], "").await;
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn readyz_follows_redis() {
    let mut redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {}\n  timeout: 300ms\n",
        redis.url()
    );
    let proxy = Proxy::redis(&yaml, &up).await;
    let admin = proxy.admin().await;
    assert_eq!(admin.send("GET", "/readyz", &[], "").await.status, 200);
    redis.kill();
    // Answers are cached for a second: a probe after the cache expired sees the outage.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let down = admin.send("GET", "/readyz", &[], "").await;
    assert_eq!(down.status, 503);
    assert_eq!(
        admin.send("GET", "/healthz", &[], "").await.status,
        200,
        "alive while not ready"
    );
    redis.restart().await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let mut ready = false;
    for _ in 0..5 {
        if admin.send("GET", "/readyz", &[], "").await.status == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    assert!(ready, "ready again after Redis came back");
}

#[tokio::test]
async fn metrics_count_outcomes_and_time_the_store_and_upstream() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    c.post("/charges", "m1", "{}").await;
    c.post("/charges", "m1", "{}").await;
    c.post("/charges", "m1", "{\"other\":1}").await;
    c.send("POST", "/charges", &[("idempotency-key", "")], "")
        .await;
    c.send("GET", "/charges", &[], "").await;
    let admin = proxy.admin().await;
    // Prometheus asks for OpenMetrics (its Accept header names it) and gets it.
    let accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3";
    let m = admin
        .send("GET", "/metrics", &[("accept", accept)], "")
        .await;
    assert_eq!(m.status, 200);
    assert!(
        m.headers["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("application/openmetrics-text")
    );
    assert!(m.text().ends_with("# EOF\n"), "{}", m.text());
    let text = m.text();
    for line in [
        "idemgate_requests_total{outcome=\"forwarded\"} 1",
        "idemgate_requests_total{outcome=\"replayed\"} 1",
        "idemgate_requests_total{outcome=\"key_reused\"} 1",
        "idemgate_requests_total{outcome=\"invalid_key\"} 1",
        "idemgate_requests_total{outcome=\"passthrough\"} 1",
        "idemgate_requests_total{outcome=\"lease_lost\"} 0",
        "idemgate_store_duration_seconds_count{op=\"claim\"} 3",
        "idemgate_store_duration_seconds_count{op=\"complete\"} 1",
        "idemgate_upstream_duration_seconds_count 2",
        "idemgate_in_flight 0",
        "idemgate_store_entries 1",
        "idemgate_store_evictions_total{reason=\"full\"} 0",
        "idemgate_store_evictions_total{reason=\"scope_quota\"} 0",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    let bytes = text
        .lines()
        .find_map(|l| l.strip_prefix("idemgate_store_bytes "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no idemgate_store_bytes in:\n{text}"));
    assert!(bytes > 100, "one record with its body and headers: {bytes}");

    // Anyone else (curl, promtool) gets the Prometheus text format 0.0.4: the same
    // samples, counter families named with `_total`.
    let plain = admin.send("GET", "/metrics", &[], "").await;
    assert_eq!(
        plain.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let plain = plain.text();
    assert!(
        plain.contains("# TYPE idemgate_requests_total counter\n"),
        "{plain}"
    );
    assert!(
        plain.contains("idemgate_requests_total{outcome=\"forwarded\"} 1\n"),
        "{plain}"
    );
    assert!(!plain.contains("# EOF"), "{plain}");
}
