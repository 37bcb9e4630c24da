//! Network faults on real sockets (docs/behaviour.md §4, §5, §8): a relay between
//! idemgate and its upstream or its Redis cuts, stalls, slows down and resets
//! connections; raw TCP upstreams pin what hyper's pooled client retries on its own; raw
//! bytes probe the proxy's HTTP parser. Each test fails if the at-most-once promise or an
//! answer of the status table (docs/behaviour.md §7) breaks.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate::config::Config;
use idemgate::metrics::Outcome;
use idemgate::store::RedisStore;
use support::fault::{Fault, Relay};
use support::redis::RedisServer;
use support::{BASIC, Proxy, Resp, Upstream, raw_exchange};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A memory-store proxy whose upstream is `url` (a relay or a raw upstream); `{upstream}`
/// in `yaml` is replaced by it.
async fn proxy_to(url: &str, yaml: &str) -> Proxy {
    let yaml = yaml.replace("{upstream}", url);
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid");
    Proxy::with_config(config).await
}

fn assert_problem(resp: &Resp, status: u16, slug: &str) {
    assert_eq!(resp.status, status, "{}", resp.text());
    assert_eq!(resp.problem(), slug);
}

// --- The upstream connection ---------------------------------------------------------

#[tokio::test]
async fn a_response_cut_mid_way_is_recorded_as_outcome_unknown_and_never_re_executed() {
    let up = Upstream::start().await;
    let relay = Relay::start(up.addr).await;
    relay.set(Fault::CutAfter(30));
    let proxy = proxy_to(&relay.url(), BASIC).await;
    let c = proxy.client();
    let first = c.post("/charges", "cut", "{}").await;
    assert_problem(&first, 502, "outcome-unknown");
    assert!(!first.replayed());
    assert_eq!(up.count(), 1, "the upstream executed it before the cut");
    // The way to the upstream is clear again: only the record can stop a second run.
    relay.set(Fault::Pass);
    for _ in 0..2 {
        let again = c.post("/charges", "cut", "{}").await;
        assert_problem(&again, 502, "outcome-unknown");
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
    }
    assert_eq!(up.count(), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::OutcomeUnknown), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::Replayed), 2);
}

#[tokio::test]
async fn a_cut_response_under_release_lets_the_retry_execute_again() {
    let up = Upstream::start().await;
    let relay = Relay::start(up.addr).await;
    relay.set(Fault::CutAfter(30));
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  on_unknown_outcome: release\n";
    let proxy = proxy_to(&relay.url(), yaml).await;
    let c = proxy.client();
    let first = c.post("/charges", "cut", "{}").await;
    assert_problem(&first, 502, "outcome-unknown");
    assert!(
        proxy.state.store.is_empty(),
        "released before the answer was sent"
    );
    relay.set(Fault::Pass);
    let second = c.post("/charges", "cut", "{}").await;
    assert_eq!(second.status, 201, "{}", second.text());
    assert!(!second.replayed());
    assert_eq!(up.count(), 2, "release trades at-most-once for a retry");
    assert!(c.post("/charges", "cut", "{}").await.replayed());
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn a_hung_upstream_is_504_outcome_unknown_and_replayed() {
    let up = Upstream::start().await;
    let relay = Relay::start(up.addr).await;
    relay.set(Fault::Hang);
    let yaml = "upstream:\n  url: {upstream}\n  timeout: 300ms\n";
    let proxy = proxy_to(&relay.url(), yaml).await;
    let c = proxy.client();
    let first = c.post("/charges", "hang", "{}").await;
    assert_problem(&first, 504, "outcome-unknown");
    assert!(!first.replayed());
    // The relay swallowed the request, so whether it ran is known only to the proxy: it
    // recorded the timeout as the outcome.
    assert!(!proxy.state.store.is_empty());
    let again = c.post("/charges", "hang", "{}").await;
    assert_problem(&again, 504, "outcome-unknown");
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(
        relay.connections(),
        1,
        "the replay did not go to the upstream"
    );
    assert_eq!(proxy.state.metrics.requests(Outcome::OutcomeUnknown), 1);
    assert_eq!(proxy.state.metrics.requests(Outcome::Replayed), 1);
}

#[tokio::test]
async fn a_connection_reset_on_accept_is_outcome_unknown_not_unreachable() {
    let up = Upstream::start().await;
    let relay = Relay::start(up.addr).await;
    relay.set(Fault::Reset);
    let proxy = proxy_to(&relay.url(), BASIC).await;
    let c = proxy.client();
    let first = c.post("/charges", "rst", "{}").await;
    // The TCP connect succeeded (the kernel completed the handshake before the relay's
    // accept), so hyper's error is not a connect error and exchange.rs takes the
    // `UnknownCause::Reset` branch: 502 outcome-unknown, recorded. That is the safe
    // answer: from the proxy's side the request may have been written before the RST,
    // so releasing the key (upstream-unreachable) could execute it twice.
    assert_problem(&first, 502, "outcome-unknown");
    assert_eq!(relay.connections(), 1);
    relay.set(Fault::Pass);
    let again = c.post("/charges", "rst", "{}").await;
    assert_problem(&again, 502, "outcome-unknown");
    assert!(again.replayed());
    assert_eq!(up.count(), 0, "the retry was answered from the record");
    // The path works now, so the replay above came from the record, not from a fault.
    let other = c.post("/charges", "rst-2", "{}").await;
    assert_eq!(other.status, 201, "{}", other.text());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn an_upstream_nobody_listens_on_is_502_unreachable_and_the_claim_is_released() {
    let up = Upstream::start().await;
    let relay = Relay::start(up.addr).await;
    let url = relay.url();
    // Closed, not just aborted: connecting to the relay's port is now refused.
    relay.stop().await;
    let proxy = proxy_to(&url, BASIC).await;
    let c = proxy.client();
    for _ in 0..2 {
        let r = c.post("/charges", "nobody", "{}").await;
        assert_problem(&r, 502, "upstream-unreachable");
        assert!(!r.replayed(), "never recorded");
        assert!(
            proxy.state.store.is_empty(),
            "released before the answer was sent"
        );
    }
    assert_eq!(
        proxy.state.metrics.requests(Outcome::UpstreamUnreachable),
        2
    );
    assert_eq!(proxy.state.metrics.requests(Outcome::OutcomeUnknown), 0);
    assert_eq!(up.count(), 0);
}

// --- What hyper's pooled client retries on its own -------------------------------------

/// What a raw upstream does with the n-th request it reads (counted over all connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Answer 201 and keep the connection open.
    Answer,
    /// Answer 201 (keep-alive, as far as the client can tell), then close at once.
    AnswerThenClose,
    /// Read it in full, then close without answering.
    Swallow,
}

/// One request as the raw upstream read it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Arrival {
    connection: usize,
    key: String,
}

/// A hand-written HTTP/1.1 upstream that follows a plan; after the plan it answers.
struct RawUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Arrival>>>,
    task: JoinHandle<()>,
}

impl RawUpstream {
    async fn start(plan: &[Act]) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind raw");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let plan: Arc<[Act]> = plan.into();
        let shared = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            for connection in 0.. {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                while conns.try_join_next().is_some() {}
                let (seen, plan) = (Arc::clone(&shared), Arc::clone(&plan));
                conns.spawn(raw_connection(stream, connection, seen, plan));
            }
        });
        RawUpstream { addr, seen, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Arrival> {
        self.seen.lock().expect("lock").clone()
    }

    fn keys(&self) -> Vec<String> {
        self.seen().into_iter().map(|a| a.key).collect()
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn raw_connection(
    mut stream: TcpStream,
    connection: usize,
    seen: Arc<Mutex<Vec<Arrival>>>,
    plan: Arc<[Act]>,
) {
    let mut buf = Vec::new();
    while let Some(key) = read_request(&mut stream, &mut buf).await {
        let n = {
            let mut seen = seen.lock().expect("lock");
            seen.push(Arrival { connection, key });
            seen.len() - 1
        };
        let act = plan.get(n).copied().unwrap_or(Act::Answer);
        if act == Act::Swallow {
            // Everything sent was read, so dropping the socket sends a FIN, not an RST.
            return;
        }
        let body = format!("{{\"request\":{n}}}");
        let head = format!(
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if stream
            .write_all(format!("{head}{body}").as_bytes())
            .await
            .is_err()
            || act == Act::AnswerThenClose
        {
            return;
        }
    }
}

/// Reads one request (head and `content-length` body) and returns its idempotency key;
/// `None` at EOF, on an error, or on a head over 64 KiB. Bytes past it stay in `buf`.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    const MAX_HEAD: usize = 64 * 1024;
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let len: usize = header("content-length").map_or(0, |v| v.parse().unwrap_or(0));
    while buf.len() < head_end + len {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    buf.drain(..head_end + len);
    Some(header("idempotency-key").unwrap_or_default())
}

#[tokio::test]
async fn hyper_never_resends_a_request_the_upstream_read_but_did_not_answer() {
    // `a` on a fresh connection is read and dropped; `b` opens a new connection and is
    // answered; `c` goes out on that pooled connection and is read and dropped. A re-send
    // of `a` or `c` would be the next request of the plan and be answered 201.
    let raw = RawUpstream::start(&[Act::Swallow, Act::Answer, Act::Swallow]).await;
    let proxy = proxy_to(&raw.url(), BASIC).await;
    let c = proxy.client();
    let a = c.post("/charges", "a", "{}").await;
    assert_problem(&a, 502, "outcome-unknown");
    let b = c.post("/charges", "b", "{}").await;
    assert_eq!(b.status, 201, "{}", b.text());
    let cc = c.post("/charges", "c", "{}").await;
    assert_problem(&cc, 502, "outcome-unknown");
    assert_eq!(raw.keys(), ["a", "b", "c"], "each request was sent once");
    let seen = raw.seen();
    assert_eq!(
        seen[2].connection, seen[1].connection,
        "`c` went out on the pooled connection: the case `retry_canceled_requests` covers"
    );
    // And the records hold: retries replay, the upstream sees nothing more.
    for key in ["a", "c"] {
        let again = c.post("/charges", key, "{}").await;
        assert_problem(&again, 502, "outcome-unknown");
        assert!(again.replayed());
    }
    assert_eq!(raw.seen().len(), 3);
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_replaced_and_the_request_sent_once() {
    let raw = RawUpstream::start(&[Act::AnswerThenClose]).await;
    let proxy = proxy_to(&raw.url(), BASIC).await;
    let c = proxy.client();
    let a = c.post("/charges", "a", "{}").await;
    assert_eq!(a.status, 201, "{}", a.text());
    let b = c.post("/charges", "b", "{}").await;
    assert_eq!(b.status, 201, "{}", b.text());
    assert!(!b.replayed());
    assert_eq!(raw.keys(), ["a", "b"], "one request per key");
    let seen = raw.seen();
    assert_ne!(
        seen[1].connection, seen[0].connection,
        "`b` could not use the closed connection"
    );
}

// --- The Redis connection --------------------------------------------------------------

fn redis_via(relay: &Relay, extra: &str) -> String {
    format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: redis://{}/0\n{extra}",
        relay.addr
    )
}

fn redis_addr(redis: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], redis.port))
}

type RedisProxy = Proxy<RedisStore>;

#[tokio::test]
async fn a_cut_redis_connection_heals_within_a_few_requests_and_replays_still_replay() {
    let redis = RedisServer::start().await;
    let relay = Relay::start(redis_addr(&redis)).await;
    let up = Upstream::start().await;
    let proxy: RedisProxy = Proxy::redis(&redis_via(&relay, "  timeout: 300ms\n"), &up).await;
    let c = proxy.client();
    let before = c.post("/charges", "before", "{}").await;
    assert_eq!(before.status, 201, "{}", before.text());
    let connections = relay.connections();
    relay.reset_all();
    relay.wait_reset().await;

    // A retry of a completed key: 503 while the connection is re-made, then the replay;
    // never a second execution.
    let mut replayed = None;
    for _ in 0..5 {
        let r = c.post("/charges", "before", "{}").await;
        if r.replayed() {
            replayed = Some(r);
            break;
        }
        assert_problem(&r, 503, "store-unavailable");
    }
    let replayed = replayed.expect("idemgate did not recover from the cut");
    assert_eq!(replayed.body, before.body);
    assert!(
        relay.connections() > connections,
        "reconnected through the relay"
    );
    let after = c.post("/charges", "after", "{}").await;
    assert_eq!(after.status, 201, "{}", after.text());
    assert!(c.post("/charges", "after", "{}").await.replayed());
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn a_slow_redis_is_503_within_the_store_timeout_and_recovers() {
    let redis = RedisServer::start().await;
    let relay = Relay::start(redis_addr(&redis)).await;
    let up = Upstream::start().await;
    let proxy: RedisProxy = Proxy::redis(&redis_via(&relay, "  timeout: 200ms\n"), &up).await;
    let c = proxy.client();
    let warm = c.post("/charges", "warm", "{}").await;
    assert_eq!(warm.status, 201, "{}", warm.text());

    relay.set(Fault::Delay(Duration::from_millis(600)));
    for key in ["slow", "warm"] {
        // A replay needs the store as much as a first request does (docs/behaviour.md §8).
        let r = c.post("/charges", key, "{}").await;
        assert_problem(&r, 503, "store-unavailable");
        assert!(r.headers.contains_key("retry-after"));
    }
    assert_eq!(up.count(), 1, "nothing forwarded while the store is slow");

    relay.set(Fault::Pass);
    let fast = c.post("/charges", "fast", "{}").await;
    assert_eq!(fast.status, 201, "{}", fast.text());
    assert!(c.post("/charges", "warm", "{}").await.replayed());
    assert_eq!(up.count(), 2);
}

/// A duplicate waiting on a key that another request holds has seen the key taken.
/// When Redis goes away under it, forwarding it unguarded (`pass_through`) would execute
/// that request a second time: it gets 503. A request that never saw its key is still
/// passed through.
#[tokio::test]
async fn a_waiter_that_loses_redis_gets_503_and_is_never_passed_through() {
    let redis = RedisServer::start().await;
    let relay = Relay::start(redis_addr(&redis)).await;
    let up = Upstream::start().await;
    let yaml = redis_via(
        &relay,
        "  timeout: 200ms\n  on_unavailable: pass_through\n\
         idempotency:\n  on_concurrent: wait\n  lease: 1s\n  wait_timeout: 30s\n",
    );
    let proxy: RedisProxy = Proxy::redis(&yaml, &up).await;
    let c = proxy.client();
    let first = c.spawn_post("/gate/charges", "held", "{}");
    up.wait_for(1).await;
    let mut waiter = c.spawn_post("/gate/charges", "held", "{}");
    proxy.state.metrics.wait_until(|m| m.waiting() == 1).await;

    // Redis is gone: open connections are cut, new ones never answer. The waiter looks
    // again at the latest when the holder's lease would end, and cannot.
    relay.set(Fault::Hang);
    relay.reset_all();
    let waited = tokio::select! {
        waited = &mut waiter => waited.expect("waiter task"),
        () = up.wait_for(2) => {
            up.open_gate();
            panic!("the waiter went around the store: the upstream executed the key twice");
        }
    };
    assert_problem(&waited, 503, "store-unavailable");

    // A key nobody was seen holding follows `pass_through`.
    let fresh = c.post("/charges", "fresh", "{}").await;
    assert_eq!(fresh.status, 201, "{}", fresh.text());
    assert_eq!(proxy.state.metrics.requests(Outcome::StoreBypassed), 1);
    up.open_gate();
    assert_eq!(first.await.expect("first").status, 201);
    let held = up
        .seen()
        .iter()
        .filter(|seen| seen.path_and_query == "/gate/charges")
        .count();
    assert_eq!(held, 1, "the held key executed once");
}

// --- Malformed HTTP to the proxy -------------------------------------------------------

/// Sends raw bytes, half-closes, and returns what came back before the proxy closed (an
/// RST counts as closed). Fails if the proxy neither answers nor closes.
#[tokio::test]
async fn malformed_requests_get_a_4xx_or_a_closed_connection_and_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(BASIC, &up).await;
    let mut huge = b"POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: raw-3\r\n".to_vec();
    let filler = "f".repeat(1024);
    for i in 0..200 {
        huge.extend_from_slice(format!("x-filler-{i}: {filler}\r\n").as_bytes());
    }
    huge.extend_from_slice(b"content-length: 2\r\n\r\n{}");
    let cases: [(&str, &[u8]); 3] = [
        ("garbage", b"\x00\x01\x02\x03 not http \xff\xfe\r\n\r\n"),
        (
            "no version",
            b"POST /charges\r\nhost: x\r\nidempotency-key: raw-2\r\ncontent-length: 2\r\n\r\n{}",
        ),
        ("200 headers of 1 KiB", &huge),
    ];
    for (name, request) in cases {
        let answer = raw_exchange(proxy.addr, request).await;
        let status_line = answer.lines().next().unwrap_or_default();
        assert!(
            answer.is_empty() || status_line.starts_with("HTTP/1.1 4"),
            "{name}: {status_line:?}"
        );
    }
    assert_eq!(up.count(), 0);
    assert!(proxy.state.store.is_empty());
    // The proxy still serves.
    assert_eq!(
        proxy.client().post("/charges", "ok", "{}").await.status,
        201
    );
}
