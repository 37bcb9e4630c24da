//! Replays over real sockets on the memory store (docs/behaviour.md §3–§4): the same
//! response to every retry, scoped by credentials, refused for another request, and what
//! is not kept.

use crate::support;

use idemgate::metrics::Outcome;
use support::{BASIC, Proxy, Upstream};

#[tokio::test]
async fn retry_replays_the_byte_identical_response_and_the_upstream_runs_once() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "key-1", r#"{"amount":100}"#).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(
        first.headers["set-cookie"], "session=1",
        "a first response keeps Set-Cookie"
    );
    for _ in 0..3 {
        let again = c.post("/charges", "key-1", r#"{"amount":100}"#).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body);
        assert!(again.replayed());
        assert_eq!(again.headers["content-type"], "application/json");
        assert_eq!(again.headers["x-execution"], "1");
        assert!(
            again.headers.get("set-cookie").is_none(),
            "replays drop Set-Cookie"
        );
        assert!(again.headers.contains_key("date"), "Date is regenerated");
        assert_eq!(
            again.headers["content-length"],
            first.body.len().to_string()
        );
    }
    assert_eq!(up.count(), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::Forwarded), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::Replayed), 3);
}

#[tokio::test]
async fn same_key_with_another_body_is_422_and_the_record_is_unchanged() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "k", r#"{"amount":1}"#).await;
    let other = c.post("/charges", "k", r#"{"amount":2}"#).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.problem(), "key-reused");
    let other_path = c.post("/refunds", "k", r#"{"amount":1}"#).await;
    assert_eq!(other_path.problem(), "key-reused");
    let again = c.post("/charges", "k", r#"{"amount":1}"#).await;
    assert_eq!(again.body, first.body);
    assert!(again.replayed());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn another_authorization_executes_separately_and_never_sees_the_other_response() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let alice = |auth: &'static str| {
        let c = c.clone();
        async move {
            c.send(
                "POST",
                "/charges",
                &[("idempotency-key", "shared"), ("authorization", auth)],
                "{}",
            )
            .await
        }
    };
    let a = alice("Bearer alice").await;
    let b = alice("Bearer bob").await;
    assert_eq!(a.status, 201);
    assert_eq!(b.status, 201);
    assert!(!b.replayed());
    assert_eq!(a.json()["authorization"], "Bearer alice");
    assert_eq!(b.json()["authorization"], "Bearer bob");
    assert_eq!(up.count(), 2);
    let b2 = alice("Bearer bob").await;
    assert_eq!(b2.body, b.body);
    let a2 = alice("Bearer alice").await;
    assert_eq!(a2.body, a.body);
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn quoted_and_bare_keys_name_the_same_record() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "7c9e-abc", "{}").await;
    let quoted = c.post("/charges", "\"7c9e-abc\"", "{}").await;
    assert!(quoted.replayed());
    assert_eq!(quoted.body, first.body);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn release_statuses_free_the_key_and_other_statuses_are_recorded() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    for _ in 0..2 {
        let r = c.post("/status/503", "busy", "{}").await;
        assert_eq!(r.status, 503);
        assert!(!r.replayed());
    }
    assert_eq!(up.count(), 2, "503 released the claim: the retry executed");
    let first = c.post("/status/500", "boom", "{}").await;
    let again = c.post("/status/500", "boom", "{}").await;
    assert_eq!(again.status, 500);
    assert!(again.replayed(), "a 500 may follow a side effect: recorded");
    assert_eq!(again.body, first.body);
    assert_eq!(up.count(), 3);
}

/// Not executed, not recorded (docs/behaviour.md §25): an upstream that refused the
/// caller (`401`, `403`) released the key under the default `release_statuses`, so a
/// flood of made-up credentials stores nothing and a retry reaches the upstream again.
#[tokio::test]
async fn an_upstream_that_refuses_the_caller_is_not_recorded_by_default() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    for (n, status) in [401u16, 403].into_iter().enumerate() {
        let path = format!("/status/{status}");
        for attempt in 1..=2 {
            let r = c
                .send(
                    "POST",
                    &path,
                    &[
                        ("authorization", "Bearer made-up"),
                        ("idempotency-key", "refused"),
                        ("content-type", "application/json"),
                    ],
                    "{}",
                )
                .await;
            assert_eq!(r.status, status, "{}", r.text());
            assert!(!r.replayed(), "{status} attempt {attempt} was replayed");
        }
        assert_eq!(up.count(), 2 * (n + 1), "{status}: the retry executed");
    }
    assert!(proxy.state.store.is_empty(), "nothing was recorded");
}

#[tokio::test]
async fn a_response_too_large_to_keep_is_delivered_once_and_never_executed_again() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nidempotency:\n  max_response_body: 1KiB\n",
        &up,
    )
    .await;
    let c = proxy.client();
    let first = c.post("/big/5000", "large", "{}").await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.body.len(),
        5000,
        "the first client gets the whole body"
    );
    let retry = c.post("/big/5000", "large", "{}").await;
    assert_eq!(retry.status, 409);
    assert_eq!(retry.problem(), "not-replayable");
    assert_eq!(up.count(), 1);
    let small = c.post("/big/1024", "small", "{}").await;
    assert_eq!(c.post("/big/1024", "small", "{}").await.body, small.body);
}

#[tokio::test]
async fn the_upstreams_own_replay_marker_never_reaches_a_first_response() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let c = proxy.client();
    let first = c.post("/marked", "mk", "{}").await;
    assert_eq!(first.status, 201);
    assert!(
        first.headers.get("idempotent-replayed").is_none(),
        "{:?}",
        first.headers
    );
    let again = c.post("/marked", "mk", "{}").await;
    assert_eq!(
        again.headers.get_all("idempotent-replayed").iter().count(),
        1
    );
    assert!(again.replayed());
}

#[tokio::test]
async fn clients_may_speak_h2c() {
    use http_body_util::{BodyExt, Full};
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let req = http::Request::post(format!("http://{}/charges", proxy.addr))
            .header("idempotency-key", "h2")
            .body(Full::new(bytes::Bytes::from_static(b"{}")))
            .expect("request");
        let resp = client.request(req).await.expect("h2c response");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.status(), 201);
        let replayed = resp.headers().contains_key("idempotent-replayed")
            && resp.headers()["idempotent-replayed"] == "true";
        bodies.push((
            replayed,
            resp.into_body().collect().await.expect("body").to_bytes(),
        ));
    }
    assert!(!bodies[0].0 && bodies[1].0);
    assert_eq!(bodies[0].1, bodies[1].1);
    assert_eq!(up.count(), 1);
}

/// `record_exclude_headers` keeps a header out of the store on top of
/// `replay_drop_headers`, even one that a replaced `replay_drop_headers` list no longer
/// names (docs/behaviour.md §17): the first client gets it, the store never does.
#[tokio::test]
async fn excluded_response_headers_reach_the_first_client_and_are_never_stored() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  replay_drop_headers: [date]\n  record_exclude_headers: [set-cookie]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let first = c.post("/charges", "k-cookie", "{}").await;
    assert_eq!(first.headers["set-cookie"], "session=1");
    let again = c.post("/charges", "k-cookie", "{}").await;
    assert!(again.replayed());
    assert!(again.headers.get("set-cookie").is_none(), "not replayed");
    assert_eq!(again.headers["x-execution"], "1", "other headers are");
    let id = idemgate::proxy::record_id(
        &proxy.state.config,
        &http::Method::POST,
        "/charges",
        &http::HeaderMap::new(),
        "k-cookie",
    )
    .expect("guarded");
    let key = idemgate::idempotency::ScopedKey::from_hex(&id["idemgate:".len()..]).expect("id");
    let found = idemgate::store::Store::inspect(&proxy.state.store, key)
        .await
        .expect("inspect")
        .expect("stored");
    let stored = found.record.encode();
    assert!(
        !stored
            .windows(10)
            .any(|w| w.eq_ignore_ascii_case(b"set-cookie")),
        "the store holds no Set-Cookie"
    );
    assert!(stored.windows(11).any(|w| w == b"x-execution"));
}
