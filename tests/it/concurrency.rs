//! Concurrent duplicates, disconnecting clients and shutdown on the memory store
//! (docs/behaviour.md §4, §8): one execution, `on_concurrent` reject and wait, graceful
//! drain.

use crate::support;

use std::time::Duration;

use idemgate::metrics::Outcome;
use support::{BASIC, Proxy, Upstream};
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn fifty_concurrent_duplicates_execute_once_and_the_rest_get_409() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let c = proxy.client();
        tasks.push(tokio::spawn(async move {
            c.post("/gate/charges", "dup", "{}").await
        }));
    }
    // Everyone but the owner is refused while the owner's request is held upstream.
    proxy
        .state
        .metrics
        .wait_until(|m| m.requests(Outcome::InFlight) == 49)
        .await;
    up.open_gate();
    let mut created = 0;
    for t in tasks {
        let r = t.await.expect("join");
        match r.status.as_u16() {
            201 => created += 1,
            409 => {
                assert_eq!(r.problem(), "in-flight");
                assert!(r.headers.contains_key("retry-after"));
            }
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(up.count(), 1);
    let replay = proxy.client().post("/gate/charges", "dup", "{}").await;
    assert!(replay.replayed());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_client_that_disconnects_leaves_a_record_that_a_retry_replays() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let mut socket = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    let body = r#"{"amount":5}"#;
    let head = format!(
        "POST /gate/charges HTTP/1.1\r\nhost: x\r\nidempotency-key: gone\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.expect("write");
    up.wait_for(1).await;
    drop(socket);
    up.open_gate();
    proxy
        .state
        .metrics
        .wait_until(|m| m.requests(Outcome::Forwarded) == 1)
        .await;
    let retry = proxy.client().post("/gate/charges", "gone", body).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.json()["execution"], 1);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn shutdown_closes_the_listener_and_finishes_in_flight_requests() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let addr = proxy.addr;
    let state = std::sync::Arc::clone(&proxy.state);
    let c = proxy.client();
    let pending = tokio::spawn(async move { c.post("/gate/charges", "sd", "{}").await });
    up.wait_for(1).await;
    let stopping = tokio::spawn(proxy.stop());
    // The listener closes at once: new connections are refused.
    let mut refused = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(refused, "listener still accepting after shutdown began");
    up.open_gate();
    let r = pending.await.expect("join");
    assert_eq!(r.status, 201);
    assert_eq!(
        stopping.await.expect("join"),
        idemgate::proxy::Shutdown::Drained
    );
    assert_eq!(state.metrics.requests(Outcome::Forwarded), 1);
}

const WAIT: &str =
    "upstream:\n  url: {upstream}\nidempotency:\n  on_concurrent: wait\n  wait_timeout: 10s\n";

#[tokio::test]
async fn on_concurrent_wait_blocks_duplicates_until_the_first_completes_then_replays() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(WAIT, &up).await;
    let c = proxy.client();
    let first = c.spawn_post("/gate/charges", "w", "{}");
    up.wait_for(1).await;
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.post("/gate/charges", "w", "{}").await })
        })
        .collect();
    proxy.state.metrics.wait_until(|m| m.waiting() == 5).await;
    up.open_gate();
    let first = first.await.expect("join");
    assert_eq!(first.status, 201);
    for w in waiters {
        let r = w.await.expect("join");
        assert_eq!(r.status, 201, "{}", r.text());
        assert!(r.replayed());
        assert_eq!(r.body, first.body);
    }
    assert_eq!(up.count(), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::InFlight), 0);
}

#[tokio::test]
async fn on_concurrent_wait_hands_a_released_claim_to_one_waiter() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(WAIT, &up).await;
    let c = proxy.client();
    let first = c.spawn_post("/gate/status/503", "rel", "{}");
    up.wait_for(1).await;
    let waiter = c.spawn_post("/gate/status/503", "rel", "{}");
    // The waiter is parked on the key before the owner finishes.
    proxy.state.metrics.wait_until(|m| m.waiting() == 1).await;
    up.open_gate();
    assert_eq!(first.await.expect("join").status, 503);
    let second = waiter.await.expect("join");
    assert_eq!(second.status, 503);
    assert!(!second.replayed(), "the waiter executed after the release");
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn on_concurrent_wait_gives_up_after_wait_timeout() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  on_concurrent: wait\n  wait_timeout: 150ms\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let first = c.spawn_post("/gate/charges", "slow", "{}");
    up.wait_for(1).await;
    let started = std::time::Instant::now();
    let r = c.post("/gate/charges", "slow", "{}").await;
    assert_eq!(r.status, 409);
    assert_eq!(r.problem(), "in-flight");
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "answered before wait_timeout"
    );
    up.open_gate();
    assert_eq!(first.await.expect("join").status, 201);
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_memory_store_full_of_markers_answers_503_even_under_pass_through() {
    let up = Upstream::start().await;
    let yaml =
        "upstream:\n  url: {upstream}\nstore:\n  max_entries: 1\n  on_unavailable: pass_through\n";
    let proxy = Proxy::start(yaml, &up).await;
    let c = proxy.client();
    let held = c.spawn_post("/gate/charges", "holder", "{}");
    up.wait_for(1).await;
    let r = c.post("/charges", "another", "{}").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.problem(), "store-unavailable");
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(up.count(), 1, "not forwarded unguarded");
    up.open_gate();
    assert_eq!(held.await.expect("join").status, 201);
    // Once the marker is a completed record it can be evicted for the next key.
    assert_eq!(c.post("/charges", "another", "{}").await.status, 201);
}
