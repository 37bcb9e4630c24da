//! Bounded resources (docs/behaviour.md §15): silent connections are closed on both
//! listeners, and bodies held in memory stay within `max_buffered_bytes`.

use crate::support;

use std::time::{Duration, Instant};

use support::{Proxy, Upstream, raw_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Waits for the server to close `stream` (EOF or reset), failing after 10 s.
async fn closed_by_server(mut stream: TcpStream) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the connection was never closed");
    started.elapsed()
}

#[tokio::test]
async fn silent_and_half_started_connections_are_closed_on_both_listeners() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nlisten_header_timeout: 300ms\n",
        &up,
    )
    .await;
    let admin = proxy.admin().await;

    // Nothing at all: the protocol is never known.
    let silent = TcpStream::connect(proxy.addr).await.expect("connect");
    // Half an HTTP/2 preface.
    let mut half_h2 = TcpStream::connect(proxy.addr).await.expect("connect");
    half_h2
        .write_all(b"PRI * HTTP/2.0\r\n")
        .await
        .expect("write");
    // A complete HTTP/2 preface and settings, and never a request.
    let mut idle_h2 = TcpStream::connect(proxy.addr).await.expect("connect");
    idle_h2
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .expect("write");
    // Half an HTTP/1 head.
    let mut half_h1 = TcpStream::connect(proxy.addr).await.expect("connect");
    half_h1
        .write_all(b"POST /charges HTTP/1.1\r\nhost: a")
        .await
        .expect("write");
    // The admin listener, silent.
    let admin_silent = TcpStream::connect(admin.addr()).await.expect("connect");
    let mut admin_half = TcpStream::connect(admin.addr()).await.expect("connect");
    admin_half.write_all(b"GET /metr").await.expect("write");

    for (what, stream) in [
        ("silent", silent),
        ("half an h2 preface", half_h2),
        ("h2 without a request", idle_h2),
        ("half an h1 head", half_h1),
        ("admin, silent", admin_silent),
        ("admin, half a head", admin_half),
    ] {
        let took = closed_by_server(stream).await;
        assert!(
            took < Duration::from_secs(5),
            "{what}: closed after {took:?}"
        );
    }

    // A client that does send its request is served as usual.
    let ok = proxy.client().post("/charges", "k", "{}").await;
    assert_eq!(ok.status, 201);
}

/// A guarded POST whose body stops one byte short of its length.
async fn stalled_post(proxy: &Proxy, key: &str, length: usize) -> TcpStream {
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    let head = format!(
        "POST /charges HTTP/1.1\r\nhost: t\r\nidempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    stream
        .write_all(&vec![b' '; length - 1])
        .await
        .expect("body");
    stream
}

#[tokio::test]
async fn stalled_bodies_are_bounded_and_the_next_one_is_told_to_come_back() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nmax_buffered_bytes: 1MiB\nidempotency:\n  max_request_body: 1MiB\n",
        &up,
    )
    .await;
    let length = 600 * 1024;
    let mut first = stalled_post(&proxy, "first", length).await;
    // The first body holds 600 KiB of the 1 MiB: another 600 KiB cannot be held.
    let body = " ".repeat(length);
    let request = format!(
        "POST /charges HTTP/1.1\r\nhost: t\r\nidempotency-key: second\r\ncontent-type: application/json\r\ncontent-length: {length}\r\nconnection: close\r\n\r\n{body}"
    );
    let refused = raw_request(proxy.addr, request.as_bytes()).await;
    assert!(
        refused.starts_with("HTTP/1.1 503"),
        "{}",
        &refused[..refused.len().min(300)]
    );
    assert!(refused.contains("overloaded"), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    assert_eq!(
        proxy
            .state
            .metrics
            .requests(idemgate::metrics::Outcome::Overloaded),
        1
    );
    assert!(
        proxy.state.store.is_empty(),
        "nothing was claimed for the refused request"
    );

    // The first body completes and is forwarded; its share is given back.
    first.write_all(b" ").await.expect("last byte");
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), first.read(&mut chunk))
            .await
            .expect("the first request is answered")
            .expect("read");
        assert!(n > 0, "closed without an answer");
        answer.extend_from_slice(&chunk[..n]);
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 201"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    drop(first);
    let again = raw_request(proxy.addr, request.as_bytes()).await;
    assert!(
        again.starts_with("HTTP/1.1 201"),
        "{}",
        &again[..again.len().min(300)]
    );
    assert_eq!(up.count(), 2);
}

/// Sends one keep-alive GET on a new connection and reads its answer head.
async fn served_connection(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("answered")
            .expect("read");
        assert!(n > 0, "closed without an answer");
        head.extend_from_slice(&chunk[..n]);
    }
    stream
}

#[tokio::test]
async fn past_max_connections_a_new_connection_waits_until_one_closes() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}\nmax_connections: 2\n", &up).await;
    let first = served_connection(proxy.addr).await;
    let _second = served_connection(proxy.addr).await;
    // The third connection is accepted by the kernel's backlog, not by the proxy.
    let mut third = tokio::spawn(served_connection(proxy.addr));
    let early = tokio::time::timeout(Duration::from_millis(500), &mut third).await;
    assert!(
        early.is_err(),
        "a third connection was served while two were open"
    );
    drop(first);
    tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a connection closed")
        .expect("task");
    assert_eq!(up.count(), 3);
}
