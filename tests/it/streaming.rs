//! The rules of streamed bodies (docs/behaviour.md §19) at small sizes, with a proxy in
//! this process: what a retry is compared on while the first request is in flight and
//! once it completed, the limits, and what does not stream. `uploads.rs` has the real
//! sizes.

use idemgate::config::Config;

use crate::support::bin::{TempConfig, idemgate, run};
use crate::support::uploads::{Generated, UploadServer, answered_half_way, small, upload};
use crate::support::{Proxy, Upstream};

/// Bodies over 1 KiB stream, up to 8 KiB: every body below fits the sockets' buffers, so
/// an answer sent before a body was read is never lost to a reset.
const YAML: &str = "upstream:\n  url: {upstream}\nidempotency:\n  max_request_body: 1KiB\n  \
                    stream_request_body: true\n  max_streamed_body: 8KiB\n";

#[tokio::test]
async fn in_flight_only_the_upfront_fingerprint_counts_and_completed_the_body_does() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(YAML, &up).await;
    let body = Generated::new(4096);
    let addr = proxy.addr;
    let first = tokio::spawn(async move { upload(addr, "/gate/docs", "k", body).await });
    up.wait_for(1).await;
    let other_body = upload(addr, "/gate/docs", "k", body.last_byte_changed()).await;
    assert_eq!(other_body.status, 409, "{}", other_body.text());
    assert!(other_body.text().contains("in-flight"));
    let other_length = upload(addr, "/gate/docs", "k", Generated::new(4000)).await;
    assert_eq!(other_length.status, 422, "{}", other_length.text());
    let chunked = upload(addr, "/gate/docs", "k", body.chunked()).await;
    assert_eq!(chunked.status, 422, "a chunked body declares no length");
    let buffered = small(addr, "/gate/docs", "k").await;
    assert_eq!(buffered.status, 422, "{}", buffered.text());

    up.open_gate();
    let first = first.await.expect("first upload");
    assert_eq!(first.status, 201, "{}", first.text());
    let replay = upload(addr, "/gate/docs", "k", body).await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    let changed = upload(addr, "/gate/docs", "k", body.last_byte_changed()).await;
    assert_eq!(changed.status, 422, "{}", changed.text());
    assert_eq!(small(addr, "/gate/docs", "k").await.status, 422);
    assert_eq!(up.count(), 1);
    assert_eq!(up.seen()[0].body.len(), 4096, "forwarded whole");
    proxy.stop().await;
}

/// `on_concurrent: wait` holds a streamed retry, its body unread, until the first
/// request completes; then it reads its body, compares it, and replays.
#[tokio::test]
async fn a_waiting_streamed_retry_replays_once_the_first_completes() {
    let up = Upstream::start().await;
    let yaml = format!("{YAML}  on_concurrent: wait\n  wait_timeout: 30s\n");
    let proxy = Proxy::start(&yaml, &up).await;
    let body = Generated::new(6000).chunked();
    let addr = proxy.addr;
    let first = tokio::spawn(async move { upload(addr, "/gate/docs", "w", body).await });
    up.wait_for(1).await;
    let waiter = tokio::spawn(async move { upload(addr, "/gate/docs", "w", body).await });
    up.open_gate();
    let first = first.await.expect("first");
    let waiter = waiter.await.expect("waiter");
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(waiter.status, 201, "{}", waiter.text());
    assert!(waiter.replayed());
    assert_eq!(waiter.body, first.body);
    assert_eq!(up.count(), 1);
    proxy.stop().await;
}

/// Over `max_streamed_body`: a declared length is refused before anything is claimed or
/// forwarded; a chunked body is cut off on the way, its key released.
#[tokio::test]
async fn max_streamed_body_refuses_declared_lengths_and_cuts_chunked_bodies() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(YAML, &up).await;
    let too_large = upload(proxy.addr, "/docs", "big", Generated::new(9000)).await;
    assert_eq!(too_large.status, 413, "{}", too_large.text());
    let cut = upload(proxy.addr, "/docs", "big", Generated::new(9000).chunked()).await;
    assert_eq!(cut.status, 413, "{}", cut.text());
    assert_eq!(up.count(), 0, "no complete request reached the upstream");
    // Nothing recorded, the key free: the next request with it executes.
    let next = upload(proxy.addr, "/docs", "big", Generated::new(4000).chunked()).await;
    assert_eq!(next.status, 201, "{}", next.text());
    assert!(!next.replayed());
    assert_eq!(up.count(), 1);
    proxy.stop().await;
}

/// An upstream that answers before reading the body: its answer is the key's record
/// (a `400`: a `401` or `403` would be released, docs/behaviour.md §25).
#[tokio::test]
async fn an_early_answer_is_recorded_and_replayed() {
    let up = UploadServer::start().await;
    let config =
        Config::from_yaml_str(&YAML.replace("{upstream}", &up.url()), &|_| None).expect("config");
    let proxy = Proxy::with_config(config).await;
    let body = Generated::new(6000);
    let early = upload(proxy.addr, "/early", "e", body).await;
    assert_eq!(early.status, 400, "{}", early.text());
    let replay = upload(proxy.addr, "/early", "e", body).await;
    assert_eq!(replay.status, 400);
    assert!(replay.replayed());
    assert_eq!(up.received().len(), 1, "executed once");
    proxy.stop().await;
}

/// An upstream that answers while the body is still arriving never saw it whole: the
/// record is kept under the up-front fingerprint (method, path, declared length, ...),
/// and a retry is compared on that alone.
#[tokio::test]
async fn an_answer_before_the_body_arrived_is_kept_under_the_upfront_fingerprint() {
    let up = UploadServer::start().await;
    let config =
        Config::from_yaml_str(&YAML.replace("{upstream}", &up.url()), &|_| None).expect("config");
    let proxy = Proxy::with_config(config).await;
    let body = Generated::new(6000);
    // 2000 bytes: past `max_request_body`, so streamed, and far from the end.
    let status = answered_half_way(proxy.addr, "/early", "h", body, 2000).await;
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    let other_body = upload(proxy.addr, "/early", "h", body.last_byte_changed()).await;
    assert_eq!(other_body.status, 400, "{}", other_body.text());
    assert!(
        other_body.replayed(),
        "only the up-front fingerprint is compared"
    );
    let other_length = upload(proxy.addr, "/early", "h", Generated::new(5000)).await;
    assert_eq!(other_length.status, 422, "{}", other_length.text());
    assert_eq!(up.received().len(), 1, "executed once");
    proxy.stop().await;
}

/// A key in the JSON body needs the body before the claim: such a body over
/// `max_request_body` is `413` as without streaming, and `--check` says why.
#[tokio::test]
async fn a_json_key_source_does_not_stream_and_check_says_so() {
    let up = Upstream::start().await;
    let yaml = format!(
        "{YAML}routes:\n  - path: /orders\n    key_from: [{{header: idempotency-key}}, \
         {{json: /id}}]\n    fingerprint_body: json\n"
    );
    let proxy = Proxy::start(&yaml, &up).await;
    let refused = upload(proxy.addr, "/orders", "j", Generated::new(4096)).await;
    assert_eq!(refused.status, 413, "{}", refused.text());
    assert_eq!(up.count(), 0);
    proxy.stop().await;

    let file = TempConfig::new(&yaml.replace("{upstream}", &up.url()));
    let checked = run(idemgate().arg("--config").arg(file.path()).arg("--check")).await;
    assert_eq!(checked.code(), Some(0), "{}", checked.stderr);
    assert!(
        checked.stdout.contains(
            "# routes[0]: stream_request_body does not combine with /id in the JSON body, \
             fingerprint_body: json"
        ),
        "{}",
        checked.stdout
    );
    assert!(
        !checked
            .stdout
            .contains("# idempotency: stream_request_body"),
        "the default policy streams every body"
    );
}

#[test]
fn max_streamed_body_below_max_request_body_is_an_error_naming_it() {
    let yaml = "idempotency:\n  max_request_body: 2MiB\n  stream_request_body: true\n  \
                max_streamed_body: 1MiB\n";
    let err = Config::from_yaml_str(yaml, &|_| None).expect_err("refused");
    assert!(
        err.to_string().contains("idempotency.max_streamed_body"),
        "{err}"
    );
}
