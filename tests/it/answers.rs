//! Answers that clients' retry logic understands (docs/behaviour.md §16): replay hints,
//! the error shape of a legacy API, and metrics that tell guarded from pass-through
//! failures.

use crate::support;

use idemgate::metrics::Outcome;
use support::{BASIC, Proxy, Upstream};

#[tokio::test]
async fn replays_of_a_recorded_server_error_say_not_to_retry_and_nothing_else_does() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/status/500", "e500", "{}").await;
    assert_eq!(first.status, 500);
    assert!(
        !first.headers.contains_key("x-should-retry"),
        "first responses never"
    );
    let replay = c.post("/status/500", "e500", "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.headers["x-should-retry"], "false");

    let conflict = c.post("/status/409", "e409", "{}").await;
    let replay = c.post("/status/409", "e409", "{}").await;
    assert_eq!(
        (conflict.status.as_u16(), replay.status.as_u16()),
        (409, 409)
    );
    assert!(replay.replayed());
    assert!(
        !replay.headers.contains_key("x-should-retry"),
        "below 500 never"
    );
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn a_recorded_outcome_unknown_replays_with_the_hint_and_an_empty_map_turns_it_off() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\n  timeout: 200ms\nroutes:\n  - path: /status/500\n    replay_error_headers: {}\n  - path: /status/502\n    replay_error_headers: {x-should-retry: \"false\", retry-after-ms: \"0\"}\n",
        &up,
    )
    .await;
    let c = proxy.client();
    let first = c.post("/hang", "h1", "{}").await;
    assert_eq!(first.status, 504);
    assert!(!first.headers.contains_key("x-should-retry"));
    let replay = c.post("/hang", "h1", "{}").await;
    assert_eq!(replay.status, 504);
    assert_eq!(replay.problem(), "outcome-unknown");
    assert_eq!(replay.headers["x-should-retry"], "false");

    let first = c.post("/status/500", "q", "{}").await;
    let quiet = c.post("/status/500", "q", "{}").await;
    assert_eq!((first.status.as_u16(), quiet.status.as_u16()), (500, 500));
    assert!(quiet.replayed() && !quiet.headers.contains_key("x-should-retry"));

    c.post("/status/502", "c", "{}").await;
    let custom = c.post("/status/502", "c", "{}").await;
    assert_eq!(custom.status, 502);
    assert_eq!(custom.headers["x-should-retry"], "false");
    assert_eq!(custom.headers["retry-after-ms"], "0");
}

const TEMPLATE: &str = r#"upstream:
  url: {upstream}
  timeout: 200ms
idempotency:
  required: true
errors:
  format: template
  template: '{"error":{"code":"{slug}","status":{status},"message":"{detail}"}}'
"#;

#[tokio::test]
async fn errors_take_the_shape_of_the_template_with_status_and_headers_unchanged() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(TEMPLATE, &up).await;
    let c = proxy.client();
    let missing = c.send("POST", "/charges", &[], "{}").await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.headers["content-type"], "application/json");
    let body = missing.json();
    assert_eq!(body["error"]["code"], "missing-key");
    assert_eq!(body["error"]["status"], 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Idempotency-Key") || m.contains("idempotency-key")),
        "{body}"
    );

    // A recorded outcome-unknown is stored in the same shape, and replayed so.
    let first = c.post("/hang", "t1", "{}").await;
    assert_eq!(first.status, 504);
    assert_eq!(first.json()["error"]["code"], "outcome-unknown");
    let replay = c.post("/hang", "t1", "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.headers["content-type"], "application/json");
}

#[tokio::test]
async fn a_failed_pass_through_is_counted_apart_from_guarded_unknown_outcomes() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let unguarded = c.send("POST", "/reset", &[], "{}").await;
    assert_eq!(unguarded.status, 502);
    let guarded = c.post("/reset", "r1", "{}").await;
    assert_eq!(guarded.status, 502);
    let m = &proxy.state.metrics;
    assert_eq!(m.requests(Outcome::PassthroughError), 1);
    assert_eq!(
        m.requests(Outcome::OutcomeUnknown),
        1,
        "the guarded one only"
    );
    assert_eq!(m.requests(Outcome::Passthrough), 0);
}
