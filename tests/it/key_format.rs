//! `key_format` (docs/behaviour.md §18), over real sockets: a key of another format, from
//! any source, is `400 invalid-key` naming the format, and never reaches the store or
//! the upstream; a `fingerprint` key, which is not the client's, is not checked.

use crate::support;

use idemgate::metrics::Outcome;
use support::{Proxy, Resp, TestClient, Upstream};

const JSON: (&str, &str) = ("content-type", "application/json");
const V4: &str = "6f1c2b9e-3d4a-4b8c-9f2e-1a2b3c4d5e6f";
const V7: &str = "01890a5d-ac96-774b-bcce-b302099a8057";

/// `uuidv4` for every source kind; `/orders` a regex of its own, inherited sources.
const YAML: &str = "upstream:\n  url: {upstream}\nidempotency:\n  key_format: uuidv4\n\
    \x20 key_from:\n    - header: Idempotency-Key\n    - query: request_id\n\
    \x20   - json: /reference\n\
    routes:\n  - path: /orders\n    key_format: {regex: 'ord-[0-9]{1,8}'}\n\
    \x20 - path: /pings\n    key_from: [{header: Idempotency-Key}, {fingerprint: 1m}]\n";

async fn post(c: &TestClient, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    c.send("POST", path, headers, body).await
}

fn refused(r: &Resp, names: &str) {
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.problem(), "invalid-key");
    let detail = r.json()["detail"].as_str().expect("detail").to_owned();
    assert!(detail.contains(names), "{detail}");
}

#[tokio::test]
async fn a_key_of_another_format_is_invalid_key_from_every_source() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(YAML, &up).await;
    let c = proxy.client();
    let uuidv4 = "version 4 UUID (key_format: uuidv4)";
    refused(
        &post(&c, "/charges", &[("idempotency-key", V7)], "{}").await,
        uuidv4,
    );
    refused(
        &post(&c, "/charges", &[("idempotency-key", "pay-1")], "{}").await,
        uuidv4,
    );
    refused(
        &post(&c, "/charges?request_id=pay-1", &[], "{}").await,
        uuidv4,
    );
    refused(
        &post(&c, "/charges", &[JSON], r#"{"reference":"pay-1"}"#).await,
        uuidv4,
    );
    refused(
        &post(&c, "/charges", &[JSON], r#"{"reference":42}"#).await,
        uuidv4,
    );
    // The first source present gives the key: a bad one is not skipped for a later one.
    let both = format!("/charges?request_id={V4}");
    refused(
        &post(&c, &both, &[("idempotency-key", "pay-1")], "{}").await,
        uuidv4,
    );
    let regex = "the regular expression 'ord-[0-9]{1,8}'";
    for key in ["ord-", "ord-123456789", "xord-1", "ord-1x"] {
        refused(
            &post(&c, "/orders", &[("idempotency-key", key)], "{}").await,
            regex,
        );
    }
    assert_eq!(up.count(), 0, "no bad key reached the upstream");
    assert_eq!(proxy.state.metrics.requests(Outcome::InvalidKey), 10);
    proxy.stop().await;
}

#[tokio::test]
async fn a_key_of_the_format_is_guarded_as_before() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(YAML, &up).await;
    let c = proxy.client();
    let upper = V4.to_ascii_uppercase();
    let quoted = format!("\"{V4}\"");
    for (path, headers, body) in [
        ("/charges", vec![("idempotency-key", V4)], "{}".to_owned()),
        (
            "/charges",
            vec![("idempotency-key", quoted.as_str())],
            "{}".to_owned(),
        ),
        (
            "/refunds",
            vec![("idempotency-key", upper.as_str())],
            "{}".to_owned(),
        ),
        (&*format!("/q?request_id={V4}"), vec![], "{}".to_owned()),
        ("/j", vec![JSON], format!(r#"{{"reference":"{V4}"}}"#)),
        (
            "/orders",
            vec![("idempotency-key", "ord-12345678")],
            "{}".to_owned(),
        ),
    ] {
        let first = post(&c, path, &headers, &body).await;
        assert_eq!(first.status, 201, "{path}: {}", first.text());
        let retry = post(&c, path, &headers, &body).await;
        assert!(retry.replayed(), "{path}: {}", retry.text());
    }
    // The bare and the quoted spelling name one key: one execution for the two.
    assert_eq!(up.count(), 5);
    // No key at all: passed through (`required: false`), as before.
    assert_eq!(post(&c, "/charges", &[], "{}").await.status, 201);
    assert_eq!(up.count(), 6);
    proxy.stop().await;
}

#[tokio::test]
async fn a_fingerprint_key_has_no_format_to_check() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(YAML, &up).await;
    let c = proxy.client();
    let me = [("authorization", "Bearer me"), JSON];
    let first = post(&c, "/pings", &me, r#"{"n":1}"#).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(post(&c, "/pings", &me, r#"{"n":1}"#).await.replayed());
    assert_eq!(up.count(), 1);
    // A client key on the same route is still checked.
    let bad = [("idempotency-key", "pay-1"), JSON];
    refused(&post(&c, "/pings", &bad, "{}").await, "uuidv4");
    proxy.stop().await;
}
