//! What the fingerprint covers, over real sockets (docs/behaviour.md §10): canonical JSON
//! bodies with ignored members, and a fingerprint without the query string.

use crate::support;

use support::{Proxy, Upstream};

const JSON_IGNORING_TIMESTAMP: &str = "upstream:\n  url: {upstream}\n\
     idempotency:\n  fingerprint_body: json\n  fingerprint_ignore: [/timestamp]\n";

#[tokio::test]
async fn a_reordered_json_body_with_another_timestamp_is_the_same_request() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(JSON_IGNORING_TIMESTAMP, &up).await;
    let c = proxy.client();
    let first = c
        .post(
            "/charges",
            "k",
            r#"{"amount":100,"currency":"eur","timestamp":"2025-01-01T00:00:00Z"}"#,
        )
        .await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let retry = c
        .post(
            "/charges",
            "k",
            r#"{ "timestamp": "2025-01-01T00:00:05Z", "currency": "eur", "amount": 100.0 }"#,
        )
        .await;
    assert_eq!(retry.status, first.status);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(up.count(), 1);

    let changed = c
        .post(
            "/charges",
            "k",
            r#"{"amount":101,"currency":"eur","timestamp":"2025-01-01T00:00:00Z"}"#,
        )
        .await;
    assert_eq!(changed.status, 422);
    assert_eq!(changed.problem(), "key-reused");
    assert_eq!(up.count(), 1);
    // The upstream got the body the first client sent, untouched.
    assert_eq!(
        up.seen()[0].body,
        r#"{"amount":100,"currency":"eur","timestamp":"2025-01-01T00:00:00Z"}"#
    );
}

#[tokio::test]
async fn without_the_query_another_query_is_the_same_request() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nidempotency:\n  fingerprint_query: false\n",
        &up,
    )
    .await;
    let c = proxy.client();
    let first = c.post("/charges?x=1", "k", r#"{"amount":1}"#).await;
    assert_eq!(first.status, 201);
    let retry = c.post("/charges?x=2", "k", r#"{"amount":1}"#).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(up.count(), 1);
    assert_eq!(up.seen()[0].path_and_query, "/charges?x=1");
    // The path and body still count.
    let other_body = c.post("/charges?x=1", "k", r#"{"amount":2}"#).await;
    assert_eq!(other_body.problem(), "key-reused");
    let other_path = c.post("/refunds?x=1", "k", r#"{"amount":1}"#).await;
    assert_eq!(other_path.problem(), "key-reused");
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn by_default_the_query_and_the_body_bytes_count() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}\n", &up).await;
    let c = proxy.client();
    assert_eq!(c.post("/charges?x=1", "k", r#"{"a":1}"#).await.status, 201);
    let query = c.post("/charges?x=2", "k", r#"{"a":1}"#).await;
    assert_eq!(query.problem(), "key-reused");
    let spaced = c.post("/charges?x=1", "k", r#"{ "a": 1 }"#).await;
    assert_eq!(spaced.problem(), "key-reused");
    assert_eq!(up.count(), 1);
}

/// `fingerprint_ignore: [/items/0, /items/1]` leaves out the first two items as the
/// client sent them. Removed one after another, the third went instead, and a charge of
/// 999 was answered with the stored answer to a charge of 100.
#[tokio::test]
async fn ignored_elements_are_the_ones_the_client_sent_at_those_places() {
    let up = Upstream::start().await;
    for ignore in ["[/items/0, /items/1]", "[/items/1, /items/0]"] {
        let yaml = format!(
            "upstream:\n  url: {{upstream}}\nidempotency:\n  fingerprint_body: json\n  \
             fingerprint_ignore: {ignore}\n"
        );
        let proxy = Proxy::start(&yaml, &up).await;
        let c = proxy.client();
        let before = up.count();
        let first = c
            .post(
                "/charges",
                "k",
                r#"{"items":[{"sent_at":1},{"trace":"a"},{"amount":100}]}"#,
            )
            .await;
        assert_eq!(first.status, 201);
        let other = c
            .post(
                "/charges",
                "k",
                r#"{"items":[{"sent_at":1},{"trace":"a"},{"amount":999}]}"#,
            )
            .await;
        assert_eq!(other.problem(), "key-reused", "{ignore}: {}", other.text());
        let retry = c
            .post(
                "/charges",
                "k",
                r#"{"items":[{"sent_at":2},{"trace":"b"},{"amount":100}]}"#,
            )
            .await;
        assert!(retry.replayed(), "{ignore}");
        assert_eq!(retry.body, first.body);
        assert_eq!(up.count(), before + 1, "{ignore}");
    }
}

/// A body that names a member twice is not I-JSON: parsers disagree on which value
/// counts, so under `fingerprint_body: json` it is compared as bytes.
#[tokio::test]
async fn a_member_named_twice_is_not_the_canonical_body_it_might_mean() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nidempotency:\n  fingerprint_body: json\n",
        &up,
    )
    .await;
    let c = proxy.client();
    assert_eq!(c.post("/charges", "k", r#"{"amount":2}"#).await.status, 201);
    let twice = c.post("/charges", "k", r#"{"amount":1,"amount":2}"#).await;
    assert_eq!(twice.problem(), "key-reused");
    assert_eq!(
        c.post("/charges", "j", r#"{"a":1,"a":2}"#).await.status,
        201
    );
    let spaced = c.post("/charges", "j", r#"{ "a":1, "a":2 }"#).await;
    assert_eq!(spaced.problem(), "key-reused", "compared as bytes");
    assert!(c.post("/charges", "j", r#"{"a":1,"a":2}"#).await.replayed());
    assert_eq!(up.count(), 2);
}
