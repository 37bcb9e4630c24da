//! A proxy killed at an exact moment (docs/behaviour.md §4 "Lease", issue: SIGKILL after
//! forwarding): on the Redis store, a retry through another or a restarted replica gets
//! 409 until the lease ends, then the `on_unknown_outcome` result, and never a silent
//! second execution under `record`. Needs the `failpoints` feature (scripts/test.sh sets
//! it).

use crate::support;

use std::time::Duration;

use support::bin::{Running, TempConfig};
use support::redis::RedisServer;
use support::{Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEASE: Duration = Duration::from_millis(800);

fn yaml(redis: &RedisServer, up: &Upstream, on_unknown: &str) -> String {
    format!(
        "upstream:\n  url: {}\nstore:\n  kind: redis\n  url: {}\nidempotency:\n  lease: {}ms\n  on_unknown_outcome: {on_unknown}\nadmin:\n  listen: null\n",
        up.url(),
        redis.url(),
        LEASE.as_millis()
    )
}

/// Sends one guarded POST to a replica that is about to crash; returns what came back
/// before the connection died (nothing, for a crash before the answer).
async fn post_raw(addr: std::net::SocketAddr, key: &str) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    socket.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Replica A crashes at `point` while handling key `k`; returns the survivors.
async fn crash(point: &str, on_unknown: &str) -> (RedisServer, Upstream, TempConfig) {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let file = TempConfig::new(&yaml(&redis, &up, on_unknown));
    let path = file.path().to_string_lossy().into_owned();
    let mut a =
        Running::start_with_env(&["--config", &path], &[("IDEMGATE_CRASH_AT", point)]).await;
    let answer = post_raw(a.addr, "k").await;
    let status = a.wait_exit().await;
    assert!(
        !status.success(),
        "the replica crashed ({status}); it answered: {answer:?}"
    );
    assert!(
        answer.is_empty(),
        "a crash before the answer sends nothing: {answer:?}"
    );
    (redis, up, file)
}

/// The crashed replica started again on the same file; the client to retry through it.
async fn restart(file: &TempConfig) -> (Running, support::TestClient) {
    let path = file.path().to_string_lossy().into_owned();
    let running = Running::start(&["--config", &path]).await;
    let client = support::TestClient::new(running.addr);
    (running, client)
}

async fn retry_on(proxy: &support::TestClient) -> support::Resp {
    proxy.post("/charges", "k", "{}").await
}

#[tokio::test]
async fn killed_after_forwarding_blocks_retries_for_the_lease_then_records_outcome_unknown() {
    let (redis, up, _file) = crash("after-forward", "record").await;
    assert_eq!(up.count(), 1, "the crashed replica had forwarded");
    let other = Proxy::redis(
        &yaml(&redis, &up, "record").replace(&up.url(), "{upstream}"),
        &up,
    )
    .await;
    let c = other.client();
    let early = retry_on(&c).await;
    assert_eq!(early.status, 409, "{}", early.text());
    assert_eq!(early.problem(), "in-flight");
    // The lease is the behaviour under test: let it run out.
    tokio::time::sleep(LEASE).await;
    let late = retry_on(&c).await;
    assert_eq!(late.status, 502, "{}", late.text());
    assert_eq!(late.problem(), "outcome-unknown");
    assert!(late.replayed());
    let again = retry_on(&c).await;
    assert_eq!(again.body, late.body, "the outcome is recorded");
    assert_eq!(up.count(), 1, "never a silent second execution");
}

#[tokio::test]
async fn killed_after_forwarding_with_release_lets_a_retry_execute_after_the_lease() {
    let (redis, up, file) = crash("after-forward", "release").await;
    // This time the retry goes through the same replica, restarted.
    let (_restarted, c) = restart(&file).await;
    assert_eq!(retry_on(&c).await.status, 409);
    tokio::time::sleep(LEASE).await;
    let late = retry_on(&c).await;
    assert_eq!(late.status, 201, "{}", late.text());
    assert!(!late.replayed());
    assert_eq!(
        up.count(),
        2,
        "release chose a second execution, as configured"
    );
    drop(redis);
}

#[tokio::test]
async fn killed_after_claiming_never_forwarded_yet_the_key_turns_outcome_unknown() {
    let (redis, up, file) = crash("after-claim", "record").await;
    assert_eq!(up.count(), 0);
    let (_restarted, c) = restart(&file).await;
    assert_eq!(retry_on(&c).await.status, 409);
    tokio::time::sleep(LEASE).await;
    // A marker cannot tell "about to forward" from "forwarded": it is treated as unknown.
    let late = retry_on(&c).await;
    assert_eq!(late.problem(), "outcome-unknown");
    assert_eq!(up.count(), 0);
    drop(redis);
}

#[tokio::test]
async fn killed_after_recording_the_retry_replays_at_once() {
    let (redis, up, _file) = crash("after-record", "record").await;
    let other = Proxy::redis(
        &yaml(&redis, &up, "record").replace(&up.url(), "{upstream}"),
        &up,
    )
    .await;
    let r = retry_on(&other.client()).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(r.replayed());
    assert_eq!(r.json()["execution"], 1);
    assert_eq!(up.count(), 1);
}
