//! The binary with several workers (issue 16): each a thread with its own listener
//! socket on the one address, its own upstream connections and its own Redis
//! connection; the store, the connection limit and shutdown shared by all.

use crate::support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::bin::{Running, TempConfig, idemgate, run};
use support::redis::RedisServer;
use support::{Resp, TestClient, Upstream};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// An upstream that remembers the source port of every connection that reaches it.
struct PortsUpstream {
    addr: SocketAddr,
    ports: Arc<Mutex<HashSet<u16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PortsUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let ports = Arc::new(Mutex::new(HashSet::new()));
        let seen = Arc::clone(&ports);
        let task = tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                seen.lock().expect("lock").insert(peer.port());
                tokio::spawn(async move {
                    let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .status(201)
                                .body(Full::new(Bytes::from_static(b"{}")))
                                .expect("response"),
                        )
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, ports, task }
    }

    fn connections(&self) -> usize {
        self.ports.lock().expect("lock").len()
    }
}

impl Drop for PortsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `idemgate --config FILE` with `workers` and no admin listener, in front of
/// `upstream`; `extra` is more YAML. The file lives as long as the returned guard.
async fn start(upstream: &str, workers: usize, extra: &str) -> (TempConfig, Running) {
    let file = TempConfig::new(&format!(
        "upstream:\n  url: {upstream}\nadmin:\n  listen: null\nworkers: {workers}\n{extra}"
    ));
    let path = file.path().to_string_lossy().into_owned();
    let running = Running::start(&["--config", &path]).await;
    (file, running)
}

/// A POST on a connection of its own (`connection: close`): the kernel gives each to
/// one of the workers' listeners.
async fn post(addr: SocketAddr, path: &str, key: Option<&str>) -> Resp {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("connection", "close"),
    ];
    headers.extend(key.map(|k| ("idempotency-key", k)));
    TestClient::new(addr)
        .send("POST", path, &headers, "{}")
        .await
}

/// The process's thread names once `done` holds of them (at most 10 s): the port
/// answers as soon as it is bound, before the worker threads are started and named.
async fn thread_names_when(pid: u32, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let mut names = thread_names(pid);
    for _ in 0..1000 {
        if done(&names) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        names = thread_names(pid);
    }
    names
}

fn thread_names(pid: u32) -> Vec<String> {
    let mut names = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc") {
        let comm = task.expect("task").path().join("comm");
        if let Ok(name) = std::fs::read_to_string(comm) {
            names.push(name.trim().to_owned());
        }
    }
    names
}

#[tokio::test]
async fn each_worker_serves_on_its_own_thread_with_its_own_upstream_connections() {
    let up = PortsUpstream::start().await;
    let (_file, running) = start(&format!("http://{}", up.addr), 4, "").await;
    let names = thread_names_when(running.pid(), |names| {
        (1..4).all(|i| names.contains(&format!("worker-{i}")))
    })
    .await;
    for i in 1..4 {
        assert!(
            names.contains(&format!("worker-{i}")),
            "no thread for worker {i}: {names:?}"
        );
    }
    // The start-up line is read from the child's pipe by a task of its own: wait for it
    // (at most 10 s) rather than assume it has been read already.
    for _ in 0..1000 {
        if running.stderr().contains("workers=4") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        running.stderr().contains("workers=4"),
        "{}",
        running.stderr()
    );
    // One request at a time, each on a connection of its own: one shared pool would
    // reach the upstream over one kept-alive connection; the kernel spreads these 40
    // over the 4 listeners (all on one: a chance of 4 in 4^40), and each worker opens
    // its own.
    for i in 0..40 {
        let answer = post(running.addr, "/pass", None).await;
        assert_eq!(answer.status, 201, "request {i}: {answer:?}");
        let key = format!("k-{i}");
        let answer = post(running.addr, "/guarded", Some(&key)).await;
        assert_eq!(answer.status, 201, "request {i}: {answer:?}");
    }
    let connections = up.connections();
    assert!(
        (2..=8).contains(&connections),
        "{connections} upstream connections for 80 sequential requests on 4 workers"
    );
}

#[tokio::test]
async fn one_key_executes_once_whichever_workers_its_retries_reach() {
    let up = Upstream::start().await;
    let (_file, running) = start(&up.url(), 4, "").await;
    let addr = running.addr;
    // The first holds the key at the gate; the rest arrive on other connections, so on
    // every worker, while it is in flight.
    let first = tokio::spawn(async move { post(addr, "/gate/pay", Some("same")).await });
    up.wait_for(1).await;
    let mut others = JoinSet::new();
    for _ in 0..24 {
        others.spawn(async move { post(addr, "/gate/pay", Some("same")).await });
    }
    while let Some(answer) = others.join_next().await {
        let answer = answer.expect("task");
        assert_eq!(answer.status, 409, "{answer:?}");
    }
    up.open_gate();
    let answer = first.await.expect("task");
    assert_eq!(answer.status, 201, "{answer:?}");
    for _ in 0..24 {
        let answer = post(addr, "/gate/pay", Some("same")).await;
        assert_eq!(answer.status, 201, "{answer:?}");
        assert!(answer.replayed(), "{answer:?}");
    }
    assert_eq!(up.count(), 1, "one execution");
}

#[tokio::test]
async fn a_port_another_idemgate_listens_on_is_refused() {
    let up = Upstream::start().await;
    let (file, running) = start(&up.url(), 2, "").await;
    let path = file.path().to_string_lossy().into_owned();
    // SO_REUSEPORT would let a second process with it share the port and take half of
    // the connections; idemgate checks the address first.
    let second =
        run(idemgate().args(["--config", &path, "--listen", &running.addr.to_string()])).await;
    assert_eq!(second.code(), Some(1), "{}", second.stderr);
    assert!(
        second.stderr.contains("cannot listen on"),
        "{}",
        second.stderr
    );
    let answer = post(running.addr, "/pass", None).await;
    assert_eq!(answer.status, 201, "the first still serves: {answer:?}");
}

#[tokio::test]
async fn sigterm_drains_the_requests_of_every_worker() {
    let up = Upstream::start().await;
    let (_file, mut running) = start(&up.url(), 4, "").await;
    let addr = running.addr;
    let mut in_flight = JoinSet::new();
    for i in 0..16 {
        let key = format!("drain-{i}");
        in_flight.spawn(async move { post(addr, "/gate/pay", Some(&key)).await });
    }
    up.wait_for(16).await;
    running.terminate().await;
    running.wait_refusing().await;
    up.open_gate();
    while let Some(answer) = in_flight.join_next().await {
        let answer = answer.expect("task");
        assert_eq!(answer.status, 201, "{answer:?}");
    }
    let exit = running.wait_exit().await;
    assert!(exit.success(), "{exit}: {}", running.stderr());
}

#[tokio::test]
async fn each_worker_has_its_own_redis_connection() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let store = format!("store:\n  kind: redis\n  url: {}\n", redis.url());
    let (_file, running) = start(&up.url(), 3, &store).await;
    for i in 0..30 {
        let key = format!("r-{i}");
        let answer = post(running.addr, "/pay", Some(&key)).await;
        assert_eq!(answer.status, 201, "{answer:?}");
        let answer = post(running.addr, "/pay", Some(&key)).await;
        assert!(answer.replayed(), "{answer:?}");
    }
    assert_eq!(up.count(), 30);
    // `redis-cli` itself is one of the clients listed.
    let clients = redis.cli(&["CLIENT", "LIST"]).lines().count() - 1;
    assert!(
        (2..=3).contains(&clients),
        "{clients} idemgate connections to Redis for 3 workers:\n{}",
        redis.cli(&["CLIENT", "LIST"])
    );
}

/// Waits (at most 10 s) until the child's log holds `count` access lines.
async fn access_lines(running: &Running, count: usize) -> usize {
    let seen = || running.stderr().matches("idemgate::access").count();
    for _ in 0..1000 {
        if seen() >= count {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    seen()
}

#[tokio::test]
async fn access_lines_are_written_once_the_workers_are_idle_in_both_modes() {
    let up = Upstream::start().await;
    for workers in ["2", "shared"] {
        let file = TempConfig::new(&format!(
            "upstream:\n  url: {}\nadmin:\n  listen: null\nworkers: {workers}\n",
            up.url()
        ));
        let path = file.path().to_string_lossy().into_owned();
        let running = Running::start(&["--config", &path]).await;
        let names = thread_names_when(running.pid(), |names| {
            names.iter().any(|n| n.starts_with("worker-")) == (workers == "2")
        })
        .await;
        assert_eq!(
            names.iter().any(|n| n.starts_with("worker-")),
            workers == "2",
            "workers: {workers}: {names:?}"
        );
        for i in 0..10 {
            let key = format!("{workers}-{i}");
            let answer = post(running.addr, "/pay", Some(&key)).await;
            assert_eq!(answer.status, 201, "{answer:?}");
        }
        // Batched, but written when the worker has nothing left to do: no shutdown
        // and no more traffic needed.
        assert_eq!(
            access_lines(&running, 10).await,
            10,
            "workers: {workers}:\n{}",
            running.stderr()
        );
    }
    assert_eq!(up.count(), 20);
}
