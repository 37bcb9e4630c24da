//! The seams an attacker's probe found with real upstreams, each closed: an h2c tunnel
//! past the guard, paths that a decoding server routes elsewhere, `Host` spellings,
//! idle HTTP/2 sessions that hold their place, and a body budget taken from what a
//! client announced instead of what it sent.
//!
//! The upstream is [`RealServer`]: a raw-socket HTTP/1.1 server that decodes `%2F`,
//! `%5C` and `\` and drops `;parameters` before routing (as Jetty, Flask and Tomcat do),
//! and answers `Upgrade: h2c` with `101` as Jetty does.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::servers::{RealServer, Upgrades, route_of};
use support::{Proxy, Upstream, raw_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `/charges` guarded with a required key; `/webhooks` not guarded at all.
const GUARDED: &str = "upstream:\n  url: {upstream}\nroutes:\n  - path: /webhooks\n    enabled: false\n  - path: /charges\n    required: true\n";

async fn proxy_for(server: &RealServer, extra: &str) -> Proxy {
    let yaml = format!("{extra}{GUARDED}").replace("{upstream}", &server.url());
    let config = idemgate::config::Config::from_yaml_str(&yaml, &|_| None).expect("config");
    Proxy::with_config(config).await
}

fn post(path: &str, extra: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: api.test\r\ncontent-type: application/json\r\ncontent-length: 2\r\n{extra}\r\n{{}}"
    )
}

/// The status codes of every answer in `raw`, in order.
fn statuses(raw: &str) -> Vec<u16> {
    raw.match_indices("HTTP/1.")
        .filter_map(|(at, _)| raw[at + 9..].get(..3)?.parse().ok())
        .collect()
}

const H2C_GET: &str = "GET /webhooks HTTP/1.1\r\nhost: api.test\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";

#[test]
fn the_test_server_routes_as_real_servers_do() {
    assert_eq!(route_of("/charges%2F1"), "/charges/1");
    assert_eq!(route_of("/webhooks/..%2Fcharges"), "/charges");
    assert_eq!(route_of("/webhooks/..;/charges"), "/charges");
    assert_eq!(route_of("/webhooks/..%5Ccharges"), "/charges");
    assert_eq!(route_of("/charges?x=1"), "/charges");
}

/// The probe's attack on one connection: an unguarded `GET` asking for h2c, then two
/// keyless `POST /charges` on a `required: true` route; every answer it got.
async fn h2c_attack(proxy: &Proxy) -> String {
    let attack = format!(
        "{H2C_GET}{}{}",
        post("/charges", ""),
        post("/charges", "connection: close\r\n")
    );
    raw_request(proxy.addr, attack.as_bytes()).await
}

#[tokio::test]
async fn an_h2c_upgrade_is_never_forwarded_and_later_requests_stay_guarded() {
    let server = RealServer::start(Upgrades::Honour).await;
    let proxy = proxy_for(&server, "").await;
    let answers = h2c_attack(&proxy).await;
    assert_eq!(statuses(&answers), [201, 400, 400], "{answers}");
    assert_eq!(answers.matches("missing-key").count(), 2, "{answers}");
    assert_eq!(
        server.switched(),
        0,
        "no 101: the upgrade was not asked for"
    );
    let executed = server.executed();
    assert_eq!(executed.len(), 1, "{executed:?}");
    assert_eq!(executed[0].route, "/webhooks");
    for (name, _) in &executed[0].headers {
        assert!(
            name != "upgrade" && name != "http2-settings",
            "{name} reached the upstream: {executed:?}"
        );
    }
    assert!(server.tunnelled().is_empty());
}

#[tokio::test]
async fn a_101_to_a_request_that_asked_for_no_upgrade_is_502_and_nothing_is_joined() {
    let server = RealServer::start(Upgrades::SwitchAlways).await;
    let proxy = proxy_for(&server, "").await;
    let answers = h2c_attack(&proxy).await;
    assert_eq!(statuses(&answers), [502, 400, 400], "{answers}");
    assert!(answers.contains("upstream-unreachable"), "{answers}");
    assert_eq!(server.switched(), 1);
    assert_eq!(server.routes(), ["/webhooks"], "the POSTs never ran");
    assert!(
        server.tunnelled().is_empty(),
        "nothing reached the switched connection: {:?}",
        String::from_utf8_lossy(&server.tunnelled())
    );
}

#[tokio::test]
async fn a_guarded_request_answered_101_is_outcome_unknown_and_its_retry_too() {
    let server = RealServer::start(Upgrades::SwitchAlways).await;
    let proxy = proxy_for(&server, "").await;
    for _ in 0..2 {
        let answer = raw_request(
            proxy.addr,
            post("/charges", "idempotency-key: k1\r\nconnection: close\r\n").as_bytes(),
        )
        .await;
        assert_eq!(statuses(&answer), [502], "{answer}");
        assert!(answer.contains("outcome-unknown"), "{answer}");
    }
    assert_eq!(server.routes(), ["/charges"], "executed once, never joined");
    assert!(server.tunnelled().is_empty());
}

/// Reads an answer head from `stream` (up to the blank line).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte)).await;
        match read.expect("an answer in time") {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

const WS_GET: &str = "GET /ws HTTP/1.1\r\nhost: api.test\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

#[tokio::test]
async fn a_websocket_upgrade_still_joins_and_a_101_to_another_protocol_does_not() {
    let server = RealServer::start(Upgrades::Honour).await;
    let proxy = proxy_for(&server, "").await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    stream.write_all(WS_GET.as_bytes()).await.expect("write");
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    stream.write_all(b"frames").await.expect("write");
    server.wait(|s| s.tunnelled() == b"frames").await;

    let other = RealServer::start(Upgrades::SwitchToOther).await;
    let proxy = proxy_for(&other, "").await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    stream.write_all(WS_GET.as_bytes()).await.expect("write");
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    stream.write_all(b"frames").await.expect("write");
    assert_eq!(other.switched(), 1);
    assert!(other.tunnelled().is_empty(), "not joined");
}

#[tokio::test]
async fn h2c_listed_in_upgrades_is_still_never_forwarded() {
    let server = RealServer::start(Upgrades::Honour).await;
    let proxy = proxy_for(&server, "upgrades: [websocket, h2c]\n").await;
    let answers = h2c_attack(&proxy).await;
    assert_eq!(statuses(&answers), [201, 400, 400], "{answers}");
    assert_eq!(server.switched(), 0);
    assert_eq!(server.routes(), ["/webhooks"]);
}

#[tokio::test]
async fn an_upgrade_to_an_unlisted_protocol_is_forwarded_as_a_plain_request() {
    let server = RealServer::start(Upgrades::Honour).await;
    let proxy = proxy_for(&server, "upgrades: []\n").await;
    let answer = raw_request(
        proxy.addr,
        WS_GET
            .replace("\r\n\r\n", "\r\nconnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert_eq!(statuses(&answer), [201], "{answer}");
    assert_eq!(server.switched(), 0);
    let executed = server.executed();
    assert!(
        !executed[0].headers.iter().any(|(n, _)| n == "upgrade"),
        "{executed:?}"
    );
}

#[tokio::test]
async fn escaped_slashes_dot_parameters_and_nul_never_reach_a_decoding_server() {
    let server = RealServer::start(Upgrades::Honour).await;
    let proxy = proxy_for(&server, "").await;
    for path in [
        "/charges%2F1",
        "/charges%2f1",
        "/webhooks/..%2Fcharges",
        "/webhooks/..%5Ccharges",
        "/webhooks/..%5ccharges",
        "/webhooks/..;/charges",
        "/webhooks/.;x/charges",
        "/webhooks/%2e%2e;/charges",
        "/charges%00",
        "/webhooks%00/../charges",
    ] {
        let answer = raw_request(proxy.addr, post(path, "connection: close\r\n").as_bytes()).await;
        assert_eq!(statuses(&answer), [400], "{path}: {answer}");
        assert!(answer.contains("invalid-path"), "{path}: {answer}");
    }
    // A raw backslash: refused by idemgate, or by hyper's parser before it.
    let answer = raw_request(
        proxy.addr,
        post("/webhooks/..\\charges", "connection: close\r\n").as_bytes(),
    )
    .await;
    assert_eq!(statuses(&answer), [400], "{answer}");
    assert!(
        server.executed().is_empty(),
        "nothing ran: {:?}",
        server.routes()
    );
}

#[tokio::test]
async fn decoded_escaped_slashes_are_guarded_as_the_path_the_server_routes() {
    let server = RealServer::start(Upgrades::Honour).await;
    let proxy = proxy_for(&server, "escaped_slashes: decode\n").await;
    let keyless = raw_request(
        proxy.addr,
        post("/webhooks/..%2Fcharges", "connection: close\r\n").as_bytes(),
    )
    .await;
    assert_eq!(statuses(&keyless), [400], "{keyless}");
    assert!(keyless.contains("missing-key"), "{keyless}");
    for path in [
        "/webhooks/..%2Fcharges",
        "/charges",
        "/webhooks\\..%5Ccharges",
    ] {
        let answer = raw_request(
            proxy.addr,
            post(path, "idempotency-key: k1\r\nconnection: close\r\n").as_bytes(),
        )
        .await;
        assert_eq!(statuses(&answer), [201], "{path}: {answer}");
    }
    let executed = server.executed();
    assert_eq!(
        executed.len(),
        1,
        "one execution, two replays: {executed:?}"
    );
    assert_eq!(
        executed[0].target, "/charges",
        "the upstream got the decoded path"
    );
}

#[tokio::test]
async fn a_host_must_name_one_authority() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(GUARDED, &up).await;
    for (what, request) in [
        (
            "no host",
            "GET /webhooks HTTP/1.1\r\nconnection: close\r\n\r\n",
        ),
        (
            "empty host",
            "GET /webhooks HTTP/1.1\r\nhost: \r\nconnection: close\r\n\r\n",
        ),
        (
            "a list",
            "GET /webhooks HTTP/1.1\r\nhost: a.test, b.test\r\nconnection: close\r\n\r\n",
        ),
        (
            "another authority",
            "GET http://b.test/webhooks HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n",
        ),
    ] {
        let answer = raw_request(proxy.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [400], "{what}: {answer}");
        assert!(answer.contains("bad-request"), "{what}: {answer}");
    }
    assert_eq!(up.count(), 0);
    for (what, request) in [
        ("HTTP/1.0 without a host", "GET /webhooks HTTP/1.0\r\n\r\n"),
        (
            "the default port",
            "GET http://a.test:80/webhooks HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n",
        ),
        (
            "the default port in the host",
            "GET http://a.test/webhooks HTTP/1.1\r\nhost: A.test:80\r\nconnection: close\r\n\r\n",
        ),
    ] {
        let answer = raw_request(proxy.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [201], "{what}: {answer}");
    }
}

/// An HTTP/2 connection (prior knowledge) to `addr`; the returned task ends when the
/// server closes the connection.
async fn h2_connection(
    addr: std::net::SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, task)
}

#[tokio::test]
async fn idle_connections_are_closed_and_give_their_place_back() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        &format!("listen_idle_timeout: 1s\nmax_connections: 2\n{GUARDED}"),
        &up,
    )
    .await;
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (mut send, task) = h2_connection(proxy.addr).await;
        let request = http::Request::get(format!("http://{}/webhooks", proxy.addr))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = send.send_request(request).await.expect("answered");
        assert_eq!(response.status(), 201);
        let _ = response.into_body().collect().await;
        sessions.push((send, task));
    }
    // Both sessions stay open on the client's side; the proxy sends GOAWAY and closes.
    for (_send, task) in sessions {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("an idle HTTP/2 session is closed by the proxy")
            .expect("connection task");
    }
    let (mut send, _task) = h2_connection(proxy.addr).await;
    let request = http::Request::get(format!("http://{}/webhooks", proxy.addr))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = tokio::time::timeout(Duration::from_secs(5), send.send_request(request))
        .await
        .expect("a third connection is served")
        .expect("answered");
    assert_eq!(response.status(), 201);

    // HTTP/1 keep-alive connections too.
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    stream
        .write_all(b"GET /webhooks HTTP/1.1\r\nhost: api.test\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an idle HTTP/1.1 connection is closed by the proxy")
        .expect("read");
    assert_eq!(statuses(&String::from_utf8_lossy(&answer)), [201]);
}

#[tokio::test]
async fn the_body_budget_counts_bytes_held_and_a_stalled_body_gives_them_back() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        &format!(
            "max_buffered_bytes: 64KiB\nlisten_body_timeout: 1s\n{}",
            GUARDED.replace(
                "required: true\n",
                "required: true\n    max_request_body: 1MiB\n"
            )
        ),
        &up,
    )
    .await;
    // Two bodies that announce 60 KB each (120 KB, past the 64 KiB budget) and send
    // 15 KB in total before they stall.
    let mut stalled = Vec::new();
    for key in ["s1", "s2"] {
        let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
        let head = format!(
            "POST /charges HTTP/1.1\r\nhost: api.test\r\nidempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: 60000\r\nconnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.expect("head");
        stream.write_all(&[b' '; 7500]).await.expect("part");
        stalled.push(stream);
    }
    let answer = raw_request(
        proxy.addr,
        post("/charges", "idempotency-key: ok\r\nconnection: close\r\n").as_bytes(),
    )
    .await;
    assert_eq!(
        statuses(&answer),
        [201],
        "announced bytes take nothing: {answer}"
    );
    for mut stream in stalled {
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .expect("a stalled body is answered")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert_eq!(statuses(&answer), [408], "{answer}");
        assert!(answer.contains("body-timeout"), "{answer}");
    }
    assert_eq!(proxy.buffered_bytes(), 0, "every share was given back");
    assert_eq!(up.count(), 1, "nothing was forwarded for them");
    for key in ["s1", "s2"] {
        let retry = raw_request(
            proxy.addr,
            post(
                "/charges",
                &format!("idempotency-key: {key}\r\nconnection: close\r\n"),
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(statuses(&retry), [201], "nothing was claimed: {retry}");
        assert!(
            !retry
                .to_ascii_lowercase()
                .contains("idempotent-replayed: true")
        );
    }
}

/// An upstream on a socket of its own that answers one request with a chunked body of
/// `chunks` one-byte chunks, one every `every`: a download that outlasts an idle period.
async fn slow_stream(chunks: usize, every: Duration) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            socket.read_exact(&mut byte).await.expect("request head");
            head.push(byte[0]);
        }
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .expect("response head");
        for _ in 0..chunks {
            // The pace of the download is what is under test, not a wait for an event.
            tokio::time::sleep(every).await;
            socket.write_all(b"1\r\nx\r\n").await.expect("chunk");
        }
        socket.write_all(b"0\r\n\r\n").await.expect("last chunk");
    });
    (url, task)
}

/// A connection whose response is still being sent is not idle: a pass-through
/// download that lasts 2.5 listen_idle_timeouts arrives whole.
#[tokio::test]
async fn a_response_still_streaming_keeps_its_connection_open() {
    let (url, upstream) = slow_stream(25, Duration::from_millis(100)).await;
    let yaml = format!("listen_idle_timeout: 1s\n{GUARDED}").replace("{upstream}", &url);
    let config = idemgate::config::Config::from_yaml_str(&yaml, &|_| None).expect("config");
    let proxy = Proxy::with_config(config).await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    stream
        .write_all(b"GET /downloads HTTP/1.1\r\nhost: api.test\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the download ends")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(
        answer.ends_with("1\r\nx\r\n0\r\n\r\n"),
        "cut short: {answer}"
    );
    assert_eq!(answer.matches("1\r\nx\r\n").count(), 25, "{answer}");
    upstream.await.expect("upstream");
}

/// `CONNECT` asks for a tunnel, which idemgate never opens, and a `*` target names the
/// server, not a resource (`OPTIONS *`): neither is forwarded (docs/behaviour.md §25).
/// `CONNECT` is `405` with `Allow`, a `*` target `400 bad-request`, whatever the route
/// or key.
#[tokio::test]
async fn connect_and_asterisk_targets_are_answered_and_never_forwarded() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(GUARDED, &up).await;
    let close = "connection: close\r\n";
    for (what, request, status, slug) in [
        (
            "CONNECT",
            format!("CONNECT api.test:443 HTTP/1.1\r\nhost: api.test:443\r\n{close}\r\n"),
            405,
            "method-not-allowed",
        ),
        (
            "CONNECT with a key",
            format!(
                "CONNECT api.test:80 HTTP/1.1\r\nhost: api.test:80\r\nidempotency-key: k\r\n{close}\r\n"
            ),
            405,
            "method-not-allowed",
        ),
        (
            "OPTIONS *",
            format!("OPTIONS * HTTP/1.1\r\nhost: api.test\r\n{close}\r\n"),
            400,
            "bad-request",
        ),
        (
            "OPTIONS * over HTTP/1.0",
            "OPTIONS * HTTP/1.0\r\n\r\n".to_owned(),
            400,
            "bad-request",
        ),
        (
            "POST * with a key",
            "POST * HTTP/1.1\r\nhost: api.test\r\ncontent-type: application/json\r\n\
             content-length: 2\r\nidempotency-key: k\r\nconnection: close\r\n\r\n{}"
                .to_owned(),
            400,
            "bad-request",
        ),
    ] {
        let answer = raw_request(proxy.addr, request.as_bytes()).await;
        assert_eq!(statuses(&answer), [status], "{what}: {answer}");
        assert!(answer.contains(slug), "{what}: {answer}");
        let allow = answer
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("allow").then(|| value.trim())
            })
            .map(str::to_owned);
        if status == 405 {
            let allow = allow.unwrap_or_else(|| panic!("{what}: no Allow in {answer}"));
            assert!(
                allow.contains("POST") && !allow.contains("CONNECT"),
                "{what}: {allow}"
            );
        }
    }
    assert_eq!(up.count(), 0, "nothing was forwarded: {:?}", up.seen());
    assert_eq!(
        proxy
            .state
            .metrics
            .requests(idemgate::metrics::Outcome::BadRequest),
        5
    );
}

/// An intermediary that folds two `Cookie` lines into one joins them with `, `; read as
/// one cookie, `theme=dark, session=A` would hide `session` and put every such client
/// in the anonymous scope together. Parsed as if separated by `; `
/// (docs/behaviour.md §25), two sessions are two scopes, neither the anonymous one.
#[tokio::test]
async fn cookies_joined_by_a_comma_scope_by_their_own_values() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nidempotency:\n  scope_cookies: [session]\n",
        &up,
    )
    .await;
    let c = proxy.client();
    let with = |cookie: Option<&'static str>| {
        let c = c.clone();
        async move {
            let mut headers = vec![
                ("idempotency-key", "same"),
                ("content-type", "application/json"),
            ];
            headers.extend(cookie.map(|cookie| ("cookie", cookie)));
            c.send("POST", "/charges", &headers, "{}").await
        }
    };
    let anonymous = with(None).await;
    let a = with(Some("theme=dark, session=tenant-a")).await;
    let b = with(Some("theme=dark, session=tenant-b")).await;
    for (who, answer) in [("anonymous", &anonymous), ("a", &a), ("b", &b)] {
        assert_eq!(answer.status, 201, "{who}: {answer:?}");
        assert!(!answer.replayed(), "{who} got another scope's record");
    }
    assert_ne!(a.body, anonymous.body);
    assert_ne!(b.body, a.body);
    let a_again = with(Some("session=tenant-a")).await;
    assert!(a_again.replayed(), "{a_again:?}");
    assert_eq!(a_again.body, a.body);
    assert_eq!(up.count(), 3);
}
