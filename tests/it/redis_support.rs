//! The real-redis test helpers do what the other suites rely on: crash, restart on the same
//! port, stall, authenticate, count commands, form a cluster, and clean up after themselves.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::redis::{RedisCluster, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Reads `n` simple reply lines from a raw connection, or `None` if they do not arrive in
/// time.
async fn read_lines(stream: &mut TcpStream, n: usize, wait: Duration) -> Option<Vec<String>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 256];
    timeout(wait, async {
        while buf.windows(2).filter(|w| w == b"\r\n").count() < n {
            let read = stream.read(&mut chunk).await.expect("read");
            assert!(read > 0, "connection closed");
            buf.extend_from_slice(&chunk[..read]);
        }
    })
    .await
    .ok()?;
    let text = String::from_utf8_lossy(&buf);
    Some(text.split_terminator("\r\n").map(str::to_owned).collect())
}

async fn connect(server: &RedisServer) -> TcpStream {
    TcpStream::connect(("127.0.0.1", server.port))
        .await
        .expect("connect")
}

fn pid_alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run kill -0")
        .success()
}

#[tokio::test]
async fn starts_answers_and_has_a_url() {
    let server = RedisServer::start().await;
    assert_ne!(server.port, 0);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}/0", server.port));
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(server.cli(&["SET", "k", "v"]), "OK");
    assert_eq!(server.cli(&["GET", "k"]), "v");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "save"]),
        "save",
        "no snapshots"
    );
}

#[tokio::test]
async fn kill_refuses_connections_and_restart_comes_back_empty_on_the_same_port() {
    let mut server = RedisServer::start().await;
    let port = server.port;
    server.cli(&["SET", "k", "v"]);
    let old_pid = server.pid().expect("running");

    server.kill();
    assert!(server.pid().is_none());
    assert!(!pid_alive(old_pid), "killed process is reaped");
    let refused = TcpStream::connect(("127.0.0.1", port)).await;
    assert!(refused.is_err(), "port still accepts after kill");

    server.restart().await;
    assert_eq!(server.port, port);
    assert_ne!(server.pid(), Some(old_pid));
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(server.cli(&["EXISTS", "k"]), "0", "a crash loses the data");
}

#[tokio::test]
async fn pause_stalls_replies_until_resume() {
    let server = RedisServer::start().await;
    let mut stream = connect(&server).await;
    stream.write_all(b"PING\r\n").await.expect("write");
    assert_eq!(
        read_lines(&mut stream, 1, Duration::from_secs(2)).await,
        Some(vec!["+PONG".to_owned()])
    );

    server.pause();
    stream.write_all(b"PING\r\n").await.expect("write");
    assert_eq!(
        read_lines(&mut stream, 1, Duration::from_millis(300)).await,
        None,
        "a paused server must not answer"
    );

    server.resume();
    assert_eq!(
        read_lines(&mut stream, 1, Duration::from_secs(2)).await,
        Some(vec!["+PONG".to_owned()]),
        "the queued PING is answered after resume"
    );
}

#[tokio::test]
async fn requirepass_server_needs_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]).await;
    assert_eq!(server.password(), Some("s3cret"));

    let mut stream = connect(&server).await;
    stream.write_all(b"PING\r\n").await.expect("write");
    let reply = read_lines(&mut stream, 1, Duration::from_secs(2))
        .await
        .expect("reply");
    assert!(reply[0].starts_with("-NOAUTH"), "{reply:?}");

    stream
        .write_all(b"AUTH s3cret\r\nPING\r\n")
        .await
        .expect("write");
    let replies = read_lines(&mut stream, 2, Duration::from_secs(2))
        .await
        .expect("replies");
    assert_eq!(replies, ["+OK", "+PONG"]);

    // The helper's cli authenticates by itself.
    assert_eq!(server.cli(&["PING"]), "PONG");
}

#[tokio::test]
async fn extra_args_reach_the_server() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]).await;
    assert_eq!(
        server.cli(&["CONFIG", "GET", "maxmemory-policy"]),
        "maxmemory-policy\nallkeys-lru"
    );
}

#[tokio::test]
#[should_panic(expected = "redis-cli")]
async fn cli_panics_on_an_error_reply() {
    let server = RedisServer::start().await;
    server.cli(&["NO-SUCH-COMMAND"]);
}

#[tokio::test]
async fn one_set_is_counted_once() {
    let server = RedisServer::start().await;
    assert_eq!(server.command_calls("set"), 0);
    let total = server.total_calls();

    server.cli(&["SET", "k", "v"]);

    assert_eq!(server.command_calls("set"), 1);
    assert_eq!(server.command_calls("SET"), 1, "case-insensitive");
    assert_eq!(server.command_calls("evalsha"), 0);
    assert_eq!(
        server.total_calls(),
        total + 1,
        "INFO and PING are not counted"
    );
}

#[tokio::test]
async fn the_helpers_own_auth_is_not_counted() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]).await;
    let total = server.total_calls();
    server.cli(&["SET", "k", "v"]);
    server.cli(&["GET", "k"]);
    assert_eq!(server.total_calls(), total + 2);
    assert_eq!(server.command_calls("auth"), 0);
}

#[tokio::test]
async fn three_masters_form_a_working_cluster() {
    let cluster = RedisCluster::start().await;
    assert_eq!(cluster.nodes.len(), 3);
    for node in &cluster.nodes {
        let info = node.cli(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
    assert_eq!(
        cluster.seed_urls(),
        cluster
            .nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
    );

    let before = cluster.total_calls();
    // Keys that hash to different slots, written and read through every node with -c.
    for (i, node) in cluster.nodes.iter().enumerate() {
        let key = format!("key-{i}");
        assert_eq!(node.cli(&["-c", "SET", &key, "v"]), "OK");
        for reader in &cluster.nodes {
            assert_eq!(reader.cli(&["-c", "GET", &key]), "v");
        }
    }
    let after = cluster.total_calls();
    assert!(
        after >= before + 3 + 9,
        "sets and gets are counted: {before} -> {after}"
    );
}

#[tokio::test]
async fn drop_kills_the_process_and_removes_its_dir() {
    let server = RedisServer::start().await;
    let pid = server.pid().expect("running");
    let dir = server.dir().to_owned();
    assert!(pid_alive(pid) && dir.exists());
    drop(server);
    assert!(!pid_alive(pid), "redis-server {pid} survived drop");
    assert!(!dir.exists(), "{} survived drop", dir.display());

    // Also while stopped with SIGSTOP.
    let paused = RedisServer::start().await;
    let pid = paused.pid().expect("running");
    paused.pause();
    drop(paused);
    assert!(!pid_alive(pid), "paused redis-server {pid} survived drop");
}

#[tokio::test]
async fn drop_cleans_up_after_a_panicking_test() {
    let pid = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = std::sync::Arc::clone(&pid);
    let result = tokio::spawn(async move {
        let server = RedisServer::start().await;
        *seen.lock().expect("lock") = server.pid();
        panic!("test failure while the server runs");
    })
    .await;
    assert!(result.expect_err("task panicked").is_panic());
    let pid = pid.lock().expect("lock").expect("server started");
    assert!(!pid_alive(pid), "redis-server {pid} survived a panic");
}

#[tokio::test]
async fn concurrent_starts_get_distinct_ports() {
    let handles: Vec<_> = (0..4).map(|_| tokio::spawn(RedisServer::start())).collect();
    let mut servers = Vec::new();
    for handle in handles {
        servers.push(handle.await.expect("start"));
    }
    let mut ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        assert_eq!(server.cli(&["PING"]), "PONG");
    }
}

#[tokio::test]
#[should_panic(expected = "Bad directive or wrong number of arguments")]
async fn a_server_that_cannot_start_fails_with_its_log() {
    RedisServer::start_with(&["--no-such-directive", "x"]).await;
}
