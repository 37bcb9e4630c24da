//! Where the key comes from (docs/behaviour.md §9), over real sockets: header, query and
//! JSON body sources in order, the fingerprint as a last resort, the source in the record
//! address, and keyless requests forwarded byte for byte.

use crate::support;

use http::StatusCode;
use idemgate::metrics::Outcome;
use support::redis::RedisServer;
use support::{Proxy, Resp, TestClient, Upstream};

const JSON: (&str, &str) = ("content-type", "application/json");
/// A client's credential: without one, a fingerprint key is not used.
const ME: (&str, &str) = ("authorization", "Bearer me");

/// Every kind of source, in the order of the example (docs/behaviour.md §9).
const ALL_SOURCES: &str = "upstream:\n  url: {upstream}\nidempotency:\n  key_from:\n\
    \x20   - header: Idempotency-Key\n    - header: X-Request-Id\n    - query: request_id\n\
    \x20   - json: /payment/reference\n";

async fn post(c: &TestClient, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    c.send("POST", path, headers, body).await
}

#[tokio::test]
async fn a_header_source_other_than_idempotency_key_guards_and_replays() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(ALL_SOURCES, &up).await;
    let c = proxy.client();
    let headers = [("x-request-id", "req-1"), JSON];
    let first = post(&c, "/orders", &headers, "{}").await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let retry = post(&c, "/orders", &headers, "{}").await;
    assert!(retry.replayed(), "{}", retry.text());
    assert_eq!(retry.body, first.body);
    assert_eq!(up.count(), 1);
    // Unchanged on the way: no Idempotency-Key is added because of the source.
    let seen = &up.seen()[0];
    assert_eq!(seen.headers["x-request-id"], "req-1");
    assert!(seen.headers.get("idempotency-key").is_none());
    // The sf-string form applies to header sources.
    let quoted = post(&c, "/orders", &[("x-request-id", "\"req-1\""), JSON], "{}").await;
    assert!(quoted.replayed());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn the_first_present_source_wins_and_the_source_is_part_of_the_address() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(ALL_SOURCES, &up).await;
    let c = proxy.client();
    let body = r#"{"payment":{"reference":"same"}}"#;
    // The same string from four sources: four keys, four executions, not a replay and
    // not a 422 (the fingerprints agree: same method, path and body).
    let by_key = post(
        &c,
        "/p?request_id=same",
        &[("idempotency-key", "same"), JSON],
        body,
    )
    .await;
    let by_id = post(
        &c,
        "/p?request_id=same",
        &[("x-request-id", "same"), JSON],
        body,
    )
    .await;
    let by_query = post(&c, "/p?request_id=same", &[JSON], body).await;
    let by_json = post(&c, "/p", &[JSON], body).await;
    for answer in [&by_key, &by_id, &by_query, &by_json] {
        assert_eq!(answer.status, 201, "{}", answer.text());
        assert!(!answer.replayed());
    }
    assert_eq!(up.count(), 4);
    // Each replays under its own source: with both headers, the first listed decides.
    let both = [("x-request-id", "other"), ("idempotency-key", "same"), JSON];
    let retry = post(&c, "/p?request_id=same", &both, body).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, by_key.body);
    let retry = post(
        &c,
        "/p?request_id=same",
        &[("x-request-id", "same"), JSON],
        body,
    )
    .await;
    assert_eq!(retry.body, by_id.body);
    let retry = post(&c, "/p", &[JSON], body).await;
    assert_eq!(retry.body, by_json.body);
    assert_eq!(up.count(), 4);
}

#[tokio::test]
async fn query_values_are_percent_decoded_and_bad_ones_refused() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  key_from: [{query: request_id}]\n  \
                fingerprint_query: false\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let first = post(&c, "/charges?request_id=a%2Db&x=1", &[JSON], "{}").await;
    assert_eq!(first.status, 201);
    let retry = post(&c, "/charges?x=2&request_id=a-b", &[JSON], "{}").await;
    assert!(retry.replayed(), "the decoded value is the key");
    assert_eq!(up.count(), 1);
    // The upstream got the query the first client sent.
    assert_eq!(up.seen()[0].path_and_query, "/charges?request_id=a%2Db&x=1");
    for bad in [
        "request_id=a&request_id=a",
        "request_id=",
        "request_id",
        "request_id=a+b",
        "request_id=a%2Cb",
        "request_id=caf%C3%A9",
    ] {
        let answer = post(&c, &format!("/charges?{bad}"), &[JSON], "{}").await;
        assert_eq!(answer.status, 400, "{bad}");
        assert_eq!(answer.problem(), "invalid-key", "{bad}");
    }
    assert_eq!(up.count(), 1, "a bad key never reaches the upstream");
}

#[tokio::test]
async fn a_bad_present_source_is_invalid_and_later_sources_are_not_tried() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(ALL_SOURCES, &up).await;
    let c = proxy.client();
    let body = r#"{"payment":{"reference":"fine"}}"#;
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 4] = [
        (
            "/p?request_id=fine",
            vec![("x-request-id", "a"), ("x-request-id", "b"), JSON],
            body,
        ),
        (
            "/p?request_id=fine",
            vec![("x-request-id", "a b"), JSON],
            body,
        ),
        ("/p?request_id=x&request_id=y", vec![JSON], body),
        ("/p", vec![JSON], r#"{"payment":{"reference":1.5}}"#),
    ];
    for (path, headers, body) in &cases {
        let answer = post(&c, path, headers, body).await;
        assert_eq!(answer.status, 400, "{path} {headers:?} {body}");
        assert_eq!(answer.problem(), "invalid-key");
    }
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn json_sources_read_strings_and_integers_of_json_bodies() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  key_from: [{json: /order/id}]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let vnd = ("content-type", "application/vnd.api+json; charset=utf-8");
    for (body, ct) in [
        (r#"{"order":{"id":"o-1"},"n":1}"#, JSON),
        (r#"{"order":{"id":42}}"#, vnd),
    ] {
        let first = post(&c, "/orders", &[ct], body).await;
        assert_eq!(first.status, 201);
        let retry = post(&c, "/orders", &[ct], body).await;
        assert!(retry.replayed(), "{body}");
    }
    assert_eq!(up.count(), 2);
    // A JSON value that is not a string or an integer, or breaks the key syntax.
    for bad in [
        r#"{"order":{"id":1.0}}"#,
        r#"{"order":{"id":true}}"#,
        r#"{"order":{"id":null}}"#,
        r#"{"order":{"id":{"x":1}}}"#,
        r#"{"order":{"id":""}}"#,
        r#"{"order":{"id":"a,b"}}"#,
    ] {
        let answer = post(&c, "/orders", &[JSON], bad).await;
        assert_eq!(answer.status, 400, "{bad}");
        assert_eq!(answer.problem(), "invalid-key", "{bad}");
    }
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn a_request_without_a_key_is_forwarded_with_the_very_same_bytes() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  key_from: [{json: /id}]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    // Absent: not JSON by its Content-Type, not parsing, or the pointer finds nothing.
    let cases = [
        ("text/plain", r#"{"id":"k1"}"#),
        ("application/json", r#"{"id":"k1""#),
        ("application/json", "  {\"other\": \"k1\"}\n"),
    ];
    for (ct, body) in cases {
        for _ in 0..2 {
            let answer = post(&c, "/orders", &[("content-type", ct)], body).await;
            assert_eq!(answer.status, 201, "{ct} {body}");
            assert!(!answer.replayed(), "unguarded: {ct} {body}");
        }
    }
    assert_eq!(up.count(), 6, "each keyless request executes");
    for (i, seen) in up.seen().iter().enumerate() {
        assert_eq!(
            seen.body,
            cases[i / 2].1.as_bytes(),
            "body {i} forwarded as sent"
        );
    }
}

#[tokio::test]
async fn json_sources_buffer_under_max_request_body_and_required_refuses_keyless() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  max_request_body: 64\n  \
                key_from: [{header: Idempotency-Key}, {json: /id}]\n\
                routes:\n  - path: /strict\n    required: true\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let big = format!(r#"{{"id":"k","pad":"{}"}}"#, "x".repeat(100));
    let answer = post(&c, "/orders", &[JSON], &big).await;
    assert_eq!(answer.status, 413, "buffered before the key is known");
    assert_eq!(answer.problem(), "body-too-large");
    // Without a key in it too: the body had to be read to find out.
    let keyless = format!(r#"{{"pad":"{}"}}"#, "x".repeat(100));
    let answer = post(&c, "/orders", &[JSON], &keyless).await;
    assert_eq!(answer.status, 413, "buffered to look for the key");
    assert_eq!(answer.problem(), "body-too-large");
    assert_eq!(up.count(), 0);
    let answer = post(&c, "/strict", &[JSON], r#"{"no":"id"}"#).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.problem(), "missing-key");
    let detail = answer.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        detail.contains("Idempotency-Key header or /id in the JSON body"),
        "{detail}"
    );
    let answer = post(&c, "/strict", &[JSON], r#"{"id":"k"}"#).await;
    assert_eq!(answer.status, 201);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_route_that_sets_its_sources_replaces_the_inherited_ones() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nroutes:\n  - path: /orders\n    key_from: [{json: /id}]\n\
                \x20 - path: /refunds\n    header: X-Refund-Key\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    // Idempotency-Key is no source on these routes: keyless, so each one executes.
    for path in ["/orders", "/refunds"] {
        for _ in 0..2 {
            let answer = post(&c, path, &[("idempotency-key", "k"), JSON], "{}").await;
            assert!(!answer.replayed(), "{path}");
        }
    }
    assert_eq!(up.count(), 4);
    let first = post(&c, "/refunds", &[("x-refund-key", "r"), JSON], "{}").await;
    let retry = post(&c, "/refunds", &[("x-refund-key", "r"), JSON], "{}").await;
    assert!(!first.replayed() && retry.replayed());
    let retry = post(&c, "/orders", &[JSON], r#"{"id":"o"}"#).await;
    assert!(!retry.replayed());
    let retry = post(&c, "/orders", &[JSON], r#"{"id":"o"}"#).await;
    assert!(retry.replayed());
    assert_eq!(up.count(), 6);
}

/// Identical requests in one scope within the window are one execution; any other
/// request, or another scope, is another.
#[tokio::test]
async fn the_fingerprint_is_the_key_of_last_resort() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  required: true\n  \
                fingerprint_body: json\n  fingerprint_ignore: [/sent_at]\n  \
                key_from: [{header: Idempotency-Key}, {fingerprint: 2m}]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let first = post(&c, "/pay", &[JSON, ME], r#"{"amount":5,"sent_at":1}"#).await;
    assert_eq!(
        first.status,
        201,
        "required never applies: {}",
        first.text()
    );
    let retry = post(&c, "/pay", &[JSON, ME], r#"{ "sent_at": 2, "amount": 5 }"#).await;
    assert!(
        retry.replayed(),
        "the same request under the fingerprint rules"
    );
    assert_eq!(retry.body, first.body);
    assert_eq!(up.count(), 1);
    for (path, headers, body) in [
        ("/pay", vec![JSON, ME], r#"{"amount":6}"#),
        ("/pay?x=1", vec![JSON, ME], r#"{"amount":5}"#),
        (
            "/pay",
            vec![JSON, ("authorization", "Bearer other")],
            r#"{"amount":5}"#,
        ),
    ] {
        let answer = post(&c, path, &headers, body).await;
        assert!(!answer.replayed(), "{path} {headers:?} {body}");
    }
    assert_eq!(up.count(), 4);
    // A key from an earlier source is used when present, under its own address.
    let keyed = post(
        &c,
        "/pay",
        &[("idempotency-key", "k"), JSON, ME],
        r#"{"amount":5}"#,
    )
    .await;
    assert!(!keyed.replayed());
    assert_eq!(up.count(), 5);
}

/// Tenants who authenticate with `X-Api-Key`, a header the scope does not list, all
/// look anonymous to the guard: keyed by the fingerprint alone, tenant B's identical
/// request would be answered with tenant A's stored response. Without a scope value
/// the request is forwarded as a keyless one (even under `required: true`, which never
/// applies to a fingerprint source) and counted `unscoped`.
#[tokio::test]
async fn a_fingerprint_key_needs_a_scope_value_to_tell_clients_apart() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  required: true\n  \
                key_from: [{fingerprint: 2m}]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let order = r#"{"amount":100,"to":"acct-1"}"#;
    let a = post(&c, "/transfers", &[JSON, ("x-api-key", "tenant-a")], order).await;
    let b = post(&c, "/transfers", &[JSON, ("x-api-key", "tenant-b")], order).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!b.replayed(), "tenant B never gets tenant A's answer");
    assert_ne!(a.body, b.body);
    assert_eq!(up.count(), 2, "both reached the upstream");
    let metrics = &proxy.state.metrics;
    assert_eq!(metrics.requests(Outcome::Unscoped), 2);
    assert_eq!(metrics.requests(Outcome::Replayed), 0);
    assert!(
        proxy
            .state
            .metrics
            .render()
            .contains("idemgate_requests_total{outcome=\"unscoped\"} 2"),
    );
    // Forwarded as it came, body included.
    assert_eq!(up.seen()[1].body, order);
    assert_eq!(up.seen()[1].headers["x-api-key"], "tenant-b");
}

/// Listing the header (or cookie) that identifies a client gives each client a scope of
/// its own; a malformed cookie pair next to it changes nothing, and a request with
/// none of them is still not deduplicated.
#[tokio::test]
async fn a_listed_identity_deduplicates_within_each_client() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  \
                scope_headers: [x-api-key]\n  scope_cookies: [session]\n  \
                key_from: [{fingerprint: 2m}]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let order = r#"{"amount":100}"#;
    let as_a = [JSON, ("x-api-key", "tenant-a"), ("cookie", "junk")];
    let a = post(&c, "/transfers", &as_a, order).await;
    let a_again = post(&c, "/transfers", &[JSON, ("x-api-key", "tenant-a")], order).await;
    assert!(a_again.replayed(), "{}", a_again.text());
    assert_eq!(a_again.body, a.body);
    let b = post(&c, "/transfers", &[JSON, ("x-api-key", "tenant-b")], order).await;
    assert!(!b.replayed());
    // A tenant known by its session cookie, however it spaces the pair.
    let s = post(&c, "/transfers", &[JSON, ("cookie", "session=s1")], order).await;
    let s_again = post(
        &c,
        "/transfers",
        &[JSON, ("cookie", "x=1; session = s1")],
        order,
    )
    .await;
    assert!(!s.replayed() && s_again.replayed());
    assert_eq!(up.count(), 3);
    // Nothing that tells the client apart: forwarded each time.
    for _ in 0..2 {
        let anonymous = post(&c, "/transfers", &[JSON, ("cookie", "session")], order).await;
        assert!(!anonymous.replayed());
    }
    assert_eq!(up.count(), 5);
    assert_eq!(proxy.state.metrics.requests(Outcome::Unscoped), 2);
}

/// The record of a fingerprint key is kept for the window, not `ttl`: read off the
/// key's TTL in a real Redis.
#[tokio::test]
async fn a_fingerprint_record_lives_for_its_window() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {}\n  key_prefix: 'ks:'\n\
         idempotency:\n  ttl: 24h\n  key_from: [{{header: Idempotency-Key}}, {{fingerprint: 2m}}]\n",
        redis.url()
    );
    let proxy = Proxy::redis(&yaml, &up).await;
    let c = proxy.client();
    assert_eq!(post(&c, "/pay", &[JSON, ME], "{}").await.status, 201);
    assert_eq!(
        post(&c, "/pay", &[("idempotency-key", "k"), JSON, ME], "{}")
            .await
            .status,
        201
    );
    let keys = redis.cli(&["--scan", "--pattern", "ks:*"]);
    let mut ttls: Vec<u64> = keys
        .split_whitespace()
        .map(|key| redis.cli(&["PTTL", key]).trim().parse().expect("PTTL"))
        .collect();
    ttls.sort_unstable();
    assert_eq!(ttls.len(), 2, "{keys}");
    assert!(
        ttls[0] <= 120_000 && ttls[0] > 60_000,
        "fingerprint window: {ttls:?}"
    );
    assert!(ttls[1] > 23 * 3_600_000, "ttl for a header key: {ttls:?}");
    proxy.stop().await;
}

/// Hostile bodies get a clear answer, never a panic or a stack overflow, and nothing is
/// stored for them.
#[tokio::test]
async fn hostile_json_bodies_get_clear_answers() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  required: true\n  \
                max_request_body: 2MiB\n  fingerprint_body: json\n  key_from: [{json: /id}]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    // Nested 10,000 deep: not JSON to the parser (it stops at 128 levels), so no key.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let answer = post(&c, "/o", &[JSON], &deep).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.problem(), "missing-key");
    let deep_object = format!(
        r#"{{"id":"k","x":{}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert_eq!(
        post(&c, "/o", &[JSON], &deep_object).await.problem(),
        "missing-key"
    );
    // A 1 MiB string at the pointer breaks the key syntax (255 at most).
    let long = format!(r#"{{"id":"{}"}}"#, "k".repeat(1 << 20));
    let answer = post(&c, "/o", &[JSON], &long).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.problem(), "invalid-key");
    // Not UTF-8: not JSON.
    let answer = c
        .send_bytes("POST", "/o", &[JSON], b"{\"id\":\"k\xff\"}".to_vec())
        .await;
    assert_eq!(answer.problem(), "missing-key");
    assert_eq!(up.count(), 0);
    // Duplicate member names: the last one gives the key, as in most JSON parsers, but
    // such a body is not I-JSON, so its fingerprint is its bytes: only a byte-identical
    // retry is the same request.
    let twice = r#"{"id":"a","id":"b","n":1}"#;
    let first = post(&c, "/o", &[JSON], twice).await;
    assert_eq!(first.status, 201);
    let canonical = post(&c, "/o", &[JSON], r#"{"n":1,"id":"b"}"#).await;
    assert_eq!(canonical.problem(), "key-reused", "{}", canonical.text());
    let same = post(&c, "/o", &[JSON], twice).await;
    assert!(same.replayed(), "{}", same.text());
    assert_eq!(up.count(), 1);
}

/// A body read for a `json` source that held no key stays counted in
/// `max_buffered_bytes` until it has been forwarded.
#[tokio::test]
async fn a_keyless_body_read_for_a_json_source_counts_until_forwarded() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  key_from: [{json: /id}]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(1000));
    let held = tokio::spawn({
        let c = c.clone();
        async move { c.send("POST", "/gate/orders", &[JSON], &body).await }
    });
    up.wait_for(1).await;
    let buffered = proxy.buffered_bytes();
    assert!(buffered >= 1000, "held while forwarding: {buffered}");
    up.open_gate();
    assert_eq!(held.await.expect("task").status, 201);
    proxy.stop().await;
}
