//! The seams of round four where the upstream takes part (docs/behaviour.md §25), against
//! real upstreams of another make than idemgate's own hyper: a Flask app that checks the
//! credentials itself (`support/flask.rs`) and an embedded Jetty that logs every request
//! line reaching it (`support/jetty.rs`). Each test starts its own server on a free port
//! and stops it. Only the upstreams are real here; the proxy is idemgate's, in process.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use idemgate::config::Config;
use support::flask::{Flask, basic};
use support::jetty::Jetty;
use support::otlp::Receiver;
use support::{Proxy, Resp, TestClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const JSON: (&str, &str) = ("content-type", "application/json");

/// A proxy in front of `url`, with `rest` (top-level YAML keys) after its `upstream`.
async fn proxy_to(url: &str, rest: &str) -> Proxy {
    let yaml = format!("upstream:\n  url: {url}\n{rest}");
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid");
    Proxy::with_config(config).await
}

/// `POST /charges` with idempotency key `key`, `authorization` and `extra` headers.
async fn charge(
    client: &TestClient,
    key: &str,
    authorization: &str,
    extra: &[(&str, &str)],
) -> Resp {
    let mut headers = vec![
        ("idempotency-key", key),
        JSON,
        ("authorization", authorization),
    ];
    headers.extend_from_slice(extra);
    client.send("POST", "/charges", &headers, "{}").await
}

#[tokio::test]
async fn flask_a_guarded_post_executes_once_and_its_retry_is_replayed() {
    let flask = Flask::start().await;
    let proxy = proxy_to(&flask.url(), "").await;
    let client = proxy.client();
    let alice = basic("alice", "secret");

    let first = charge(&client, "sanity", &alice, &[]).await;
    assert_eq!(first.status, 200, "{}\n{}", first.text(), flask.output());
    assert!(!first.replayed());
    assert_eq!(first.json()["user"], "alice");
    assert_eq!(first.json()["execution"], 1);
    let retry = charge(&client, "sanity", &alice, &[]).await;
    assert_eq!(retry.status, 200);
    assert!(retry.replayed(), "{:?}", retry.headers);
    assert_eq!(retry.body, first.body);

    let seen = flask.seen().await;
    assert_eq!(seen.executions("sanity", "alice"), 1);
    let reached = seen.with_key("sanity");
    assert_eq!(reached.len(), 1, "the retry never reached Flask: {seen:?}");
    assert_eq!(reached[0].header("authorization"), [alice.as_str()]);
    proxy.stop().await;
}

/// §25, "A Basic user name alone is not a credential": idemgate cannot check the
/// password and a replay never reaches Flask, which can; so `alice:wrong` is a scope of
/// its own, reaches Flask and is refused there.
#[tokio::test]
async fn flask_a_wrong_basic_password_never_reads_the_users_recorded_answer() {
    let flask = Flask::start().await;
    let yaml = "routes:\n  - path: /charges\n    scope_principal: {basic: true}\n";
    let proxy = proxy_to(&flask.url(), yaml).await;
    let client = proxy.client();

    let right = charge(&client, "k", &basic("alice", "secret"), &[]).await;
    assert_eq!(right.status, 200, "{}\n{}", right.text(), flask.output());
    assert_eq!(right.json()["user"], "alice");

    let wrong = charge(&client, "k", &basic("alice", "wrong"), &[]).await;
    assert!(
        !wrong.replayed(),
        "alice:wrong was replayed alice's recorded answer ({} {})",
        wrong.status,
        wrong.text()
    );
    assert_eq!(wrong.status, 401, "Flask refuses it: {}", wrong.text());
    assert!(
        wrong.headers.contains_key("www-authenticate"),
        "{:?}",
        wrong.headers
    );
    let seen = flask.seen().await;
    assert_eq!(seen.with_key("k").len(), 2, "both reached Flask: {seen:?}");
    assert_eq!(seen.executions("k", "alice"), 1);

    // alice's own retry, with her password, is still a replay.
    let again = charge(&client, "k", &basic("alice", "secret"), &[]).await;
    assert!(again.replayed(), "{} {}", again.status, again.text());
    assert_eq!(again.body, right.body);
    assert_eq!(flask.seen().await.with_key("k").len(), 2);
    proxy.stop().await;
}

/// §25, "Not executed, not recorded": 401 is in the default `release_statuses`, so a
/// request with made-up credentials is not recorded, and its retry asks Flask again.
#[tokio::test]
async fn flask_a_401_to_made_up_credentials_is_not_recorded_by_default() {
    let flask = Flask::start().await;
    let proxy = proxy_to(&flask.url(), "").await;
    let client = proxy.client();
    let made_up = format!("Bearer {}", uuid::Uuid::new_v4());

    let first = charge(&client, "k", &made_up, &[]).await;
    assert_eq!(first.status, 401, "{}\n{}", first.text(), flask.output());
    assert!(
        first.headers.contains_key("www-authenticate"),
        "{:?}",
        first.headers
    );
    let retry = charge(&client, "k", &made_up, &[]).await;
    assert!(
        !retry.replayed(),
        "the 401 was recorded and replayed ({} {})",
        retry.status,
        retry.text()
    );
    assert_eq!(retry.status, 401);
    let seen = flask.seen().await;
    assert_eq!(
        seen.with_key("k").len(),
        2,
        "the retry reached Flask: {seen:?}"
    );
    assert_eq!(seen.executions("k", "alice"), 0);
    proxy.stop().await;
}

/// The `tracestate` headers Flask got with key `key`, after checking that exactly one
/// such request reached it.
async fn tracestates(flask: &Flask, key: &str) -> Vec<String> {
    let seen = flask.seen().await;
    let reached = seen.with_key(key);
    assert_eq!(reached.len(), 1, "{seen:?}");
    reached[0]
        .header("tracestate")
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// §25, "Small ones": an empty `tracestate` is not forwarded (no exporter: the trace
/// headers otherwise pass through unchanged, §20).
#[tokio::test]
async fn flask_never_receives_an_empty_tracestate() {
    let flask = Flask::start().await;
    // What the check below looks for is visible: sent straight to Flask, an empty
    // tracestate is reported as one.
    let direct = TestClient::new(flask.addr());
    let alice = basic("alice", "secret");
    let straight = charge(&direct, "direct", &alice, &[("tracestate", "")]).await;
    assert_eq!(straight.status, 200, "{}", straight.text());
    assert_eq!(tracestates(&flask, "direct").await, [""]);

    let proxy = proxy_to(&flask.url(), "").await;
    let client = proxy.client();
    let answer = charge(&client, "k", &alice, &[("tracestate", "")]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        tracestates(&flask, "k").await,
        Vec::<String>::new(),
        "an empty tracestate reached Flask"
    );
    // A tracestate with members still passes through.
    let kept = charge(&client, "k2", &alice, &[("tracestate", "vendor=opaque")]).await;
    assert_eq!(kept.status, 200, "{}", kept.text());
    assert_eq!(tracestates(&flask, "k2").await, ["vendor=opaque"]);
    proxy.stop().await;
}

/// The same with an exporter: the upstream call carries the trace's `tracestate`, which
/// is empty here (the client's was), so it carries none, and a `traceparent` of its own.
#[tokio::test]
async fn flask_never_receives_an_empty_tracestate_from_a_traced_call() {
    let flask = Flask::start().await;
    let collector = Receiver::start().await;
    let yaml = format!(
        "telemetry:\n  otlp:\n    endpoint: {}\n    protocol: http/protobuf\n",
        collector.url()
    );
    let proxy = proxy_to(&flask.url(), &yaml).await;
    let client = proxy.client();
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = charge(
        &client,
        "k",
        &basic("alice", "secret"),
        &[("traceparent", parent), ("tracestate", "")],
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = flask.seen().await;
    let reached = seen.with_key("k");
    assert_eq!(reached.len(), 1, "{seen:?}");
    let traceparent = reached[0].header("traceparent");
    assert!(
        traceparent.len() == 1 && traceparent[0].contains("4bf92f3577b34da6a3ce929d0e0e4736"),
        "the call is traced in the client's trace: {traceparent:?}"
    );
    assert_eq!(
        reached[0].header("tracestate"),
        Vec::<&str>::new(),
        "an empty tracestate reached Flask"
    );
    proxy.stop().await;
}

/// Writes `request` and returns the answer's head (status line and headers), without
/// waiting for a body or for the connection to close: a forwarded CONNECT may leave it
/// open as a tunnel.
async fn head(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write the request");
    let mut out = Vec::new();
    let mut chunk = [0u8; 1024];
    let read = async {
        while !out.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .unwrap_or_else(|_| panic!("no answer to {request:?} within 5 s"));
    let text = String::from_utf8_lossy(&out).into_owned();
    text.split("\r\n\r\n").next().unwrap_or_default().to_owned()
}

const CONNECT: &str = "CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n";
const POST_ASTERISK: &str = "POST * HTTP/1.1\r\nhost: example.com\r\nidempotency-key: star\r\n\
     content-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
const OPTIONS_ASTERISK: &str =
    "OPTIONS * HTTP/1.1\r\nhost: example.com\r\nconnection: close\r\n\r\n";

/// §25, "Small ones": a `CONNECT` is answered 405 and a `*` target 400, and neither
/// reaches the upstream.
#[tokio::test]
async fn jetty_never_receives_a_connect_or_an_asterisk_target() {
    let jetty = Jetty::start().await;
    // Jetty's log sees them when they reach it: sent straight to it, each is logged.
    for (request, line) in [
        (CONNECT, "CONNECT example.com:443"),
        (POST_ASTERISK, "POST *"),
        (OPTIONS_ASTERISK, "OPTIONS *"),
    ] {
        let answer = head(jetty.addr(), request).await;
        assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
        jetty.wait_for(line).await;
    }
    let before = jetty.requests().len();

    let proxy = proxy_to(&jetty.url(), "").await;
    let connect = head(proxy.addr, CONNECT).await;
    let post = head(proxy.addr, POST_ASTERISK).await;
    let options = head(proxy.addr, OPTIONS_ASTERISK).await;
    // A request that does go through: once Jetty has logged it, it has logged anything
    // forwarded before it.
    let marker = proxy.client().send("GET", "/marker", &[], "").await;
    assert_eq!(marker.status, 200, "{}\n{}", marker.text(), jetty.output());
    jetty.wait_for("GET /marker").await;
    let reached = jetty.requests()[before..].to_vec();

    // The status code, or the whole head when it is not an answer (an empty one: closed).
    let status = |head: &str| match head.split(' ').collect::<Vec<_>>()[..] {
        ["HTTP/1.1", code, ..] => code.to_owned(),
        _ => format!("{head:?}"),
    };
    assert_eq!(
        (
            status(&connect),
            status(&post),
            status(&options),
            &reached[..]
        ),
        (
            "405".into(),
            "400".into(),
            "400".into(),
            &["GET /marker".to_owned()][..]
        ),
        "(CONNECT, POST *, OPTIONS *, what reached Jetty)\n{connect}\n{post}\n{options}"
    );
    proxy.stop().await;
}
