//! Upgrades pass through (docs/behaviour.md §11): a WebSocket-style upgrade is forwarded
//! with its headers, and after `101` the two connections are joined byte for byte.

use crate::support;

use std::time::Duration;

use support::{Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that answers an upgrade request with `101` and then echoes every byte;
/// it reports the request head it received.
async fn echo_upstream() -> (String, tokio::sync::oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let head = read_head(&mut stream).await;
        let _ = head_tx.send(head);
        let _ = stream
            .write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
            .await;
        let (mut read, mut write) = stream.split();
        let _ = tokio::io::copy(&mut read, &mut write).await;
    });
    (url, head_rx)
}

async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[tokio::test]
async fn an_upgrade_is_joined_to_the_upstream_byte_for_byte() {
    let (url, head) = echo_upstream().await;
    // A short upstream.timeout and header timeout: neither may cut the joined connection.
    let config =
        format!("upstream:\n  url: {url}\n  timeout: 200ms\nlisten_header_timeout: 200ms\n");
    let config = idemgate::config::Config::from_yaml_str(&config, &|_| None).expect("config");
    let proxy = Proxy::with_config(config).await;
    let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
    client
        .write_all(b"GET /ws HTTP/1.1\r\nhost: t\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-key: abc\r\n\r\n")
        .await
        .expect("write");
    let answer = read_head(&mut client).await.to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 101"), "{answer}");
    assert!(answer.contains("upgrade: websocket"), "{answer}");
    assert!(answer.contains("connection: upgrade"), "{answer}");
    let seen = head
        .await
        .expect("the upstream saw the request")
        .to_ascii_lowercase();
    assert!(seen.contains("upgrade: websocket"), "{seen}");
    assert!(seen.contains("connection: upgrade"), "{seen}");
    assert!(seen.contains("sec-websocket-key: abc"), "{seen}");

    // Past both timeouts, the joined connection still carries bytes both ways.
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.write_all(b"ping \x00\xff").await.expect("write");
    let mut echoed = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut echoed))
        .await
        .expect("echoed in time")
        .expect("read");
    assert_eq!(&echoed, b"ping \x00\xff");
}

#[tokio::test]
async fn a_guarded_request_never_upgrades() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}\n", &up).await;
    let r = proxy
        .client()
        .send(
            "POST",
            "/charges",
            &[
                ("idempotency-key", "k"),
                ("connection", "upgrade"),
                ("upgrade", "websocket"),
            ],
            "{}",
        )
        .await;
    assert_eq!(r.status, 201);
    let seen = &up.seen()[0];
    assert!(
        !seen.headers.contains_key("upgrade"),
        "dropped as hop-by-hop"
    );
}

#[tokio::test]
async fn shutdown_closes_an_upgraded_connection_once_shutdown_timeout_passes() {
    let (url, _head) = echo_upstream().await;
    let config = format!("upstream:\n  url: {url}\nshutdown_timeout: 300ms\n");
    let config = idemgate::config::Config::from_yaml_str(&config, &|_| None).expect("config");
    let proxy = Proxy::with_config(config).await;
    let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
    client
        .write_all(
            b"GET /ws HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
        )
        .await
        .expect("write");
    assert!(read_head(&mut client).await.starts_with("HTTP/1.1 101"));
    let started = std::time::Instant::now();
    // No request is in flight: the tunnel does not make shutdown time out.
    assert_eq!(proxy.stop().await, idemgate::proxy::Shutdown::Drained);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "closed before shutdown_timeout: {took:?}"
    );
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the upgraded connection was closed");
}
