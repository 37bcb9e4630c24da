//! Chaos (docs/behaviour.md §4 "Claim is atomic", "Lease", "Fencing"; §5 store timeouts):
//! two idemgate binaries share one Redis in front of an upstream that is slow at random
//! and sometimes drops the connection after doing the work. Sixteen clients retry every
//! operation with its key, alternating replicas, while replica A is SIGKILLed and
//! restarted and Redis is frozen with SIGSTOP. At the end the upstream's own log and
//! every answer any client saw must show: at most one execution per key and scope, one
//! answer per key (replays byte-identical to it), no answer crossing scopes, a final
//! answer for every operation, and no in-flight marker left once the leases have ended.
//!
//! Phases: the load with its faults; after one lease, the operations left without a
//! final answer once more, then a scan of Redis for in-flight markers; last, every
//! operation once more, which must replay its first answer byte for byte. The figures
//! are printed on one `chaos:` line, and every attempt is written to
//! `target/tmp/chaos-attempts.log`.
//!
//! Every worker uses the same key names (`charge-0000`, ...): only the scope
//! (`Authorization`) tells two workers' operations apart, so a scoping bug shows up as a
//! duplicate, a cross-scope body or a mismatch rather than passing unnoticed.

use crate::support;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use support::bin::{Running, TempConfig};
use support::chaos::{ChaosUpstream, Execution, Replicas, XorShift};
use support::redis::RedisServer;
use tokio::sync::watch;
use tokio::task::JoinSet;

const WORKERS: usize = 16;
const OPS_PER_WORKER: usize = 300;
const OPERATIONS: usize = WORKERS * OPS_PER_WORKER;

/// The replicas' lease: how long a killed replica's claims block their keys.
const LEASE: Duration = Duration::from_secs(1);
/// The client's patience with one attempt.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Bounds on one operation; reaching either without a final answer is "unanswered".
const MAX_ATTEMPTS: u32 = 40;
const OP_DEADLINE: Duration = Duration::from_secs(20);
/// The client's pause before a retry: its retry policy, not a synchronisation.
const BACKOFF: Duration = Duration::from_millis(50);
/// How long Redis stays frozen (longer than `store.timeout`, shorter than the lease).
const REDIS_PAUSE: Duration = Duration::from_millis(700);
/// The load phase, faults included, and each later phase: far above what they take,
/// and together well under three minutes.
const LOAD_LIMIT: Duration = Duration::from_secs(90);
const PHASE_LIMIT: Duration = Duration::from_secs(30);
/// Upstream behaviour: each execution takes up to this long, and this often (in %) the
/// connection is dropped after executing instead of answering.
const MAX_DELAY: Duration = Duration::from_millis(40);
const DROP_PERCENT: u64 = 5;
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The run with faults.
    Load,
    /// Once the leases have ended: operations without a final answer, again.
    Settle,
    /// Every operation once more: each must replay its first answer.
    Verify,
}

/// One request a client sent, and what came of it.
#[derive(Debug, Clone)]
struct Attempt {
    phase: Phase,
    attempt: u32,
    replica: &'static str,
    /// When it was sent, from the start of the test.
    at: Duration,
    /// `None` for a connection error or a client timeout (see `error`).
    status: Option<u16>,
    error: Option<String>,
    body: Bytes,
    elapsed: Duration,
}

impl Attempt {
    /// An answer the client stops at: anything but in-flight, store-unavailable or none.
    fn is_final(&self) -> bool {
        matches!(self.status, Some(s) if s != 409 && s != 503)
    }
}

/// Everything one logical operation (one scope, one key) went through.
#[derive(Debug)]
struct Operation {
    worker: usize,
    op: usize,
    amount: u64,
    attempts: Vec<Attempt>,
}

impl Operation {
    fn scope(&self) -> String {
        scope(self.worker)
    }

    fn key(&self) -> String {
        format!("charge-{:04}", self.op)
    }

    fn answered(&self, phase: Phase) -> bool {
        self.attempts
            .iter()
            .any(|a| a.phase == phase && a.is_final())
    }
}

fn scope(worker: usize) -> String {
    format!("Bearer worker-{worker}")
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[derive(Debug)]
struct Worker {
    id: usize,
    client: HttpClient,
    rng: XorShift,
    replicas: Arc<Replicas>,
    epoch: Instant,
}

impl Worker {
    fn new(id: usize, replicas: Arc<Replicas>, epoch: Instant) -> Self {
        Self {
            id,
            client: Client::builder(TokioExecutor::new()).build_http(),
            rng: XorShift::new(SEED, id as u64),
            replicas,
            epoch,
        }
    }

    /// Sends the operation until a final answer, alternating replicas from a random one,
    /// within [`MAX_ATTEMPTS`] and [`OP_DEADLINE`].
    async fn run(&mut self, operation: &mut Operation, phase: Phase) {
        let started = Instant::now();
        let first = self.rng.below(self.replicas.count() as u64) as usize;
        for attempt in 1..=MAX_ATTEMPTS {
            if started.elapsed() > OP_DEADLINE {
                return;
            }
            let (replica, addr) = self.replicas.pick(first + attempt as usize);
            let sent = Instant::now();
            let result = tokio::time::timeout(ATTEMPT_TIMEOUT, self.send(addr, operation)).await;
            let (status, error, body) = match result {
                Ok(Ok((status, body))) => (Some(status), None, body),
                Ok(Err(error)) => (None, Some(error), Bytes::new()),
                Err(_) => (None, Some("client timeout".to_owned()), Bytes::new()),
            };
            let answer = Attempt {
                phase,
                attempt,
                replica,
                at: sent - self.epoch,
                status,
                error,
                body,
                elapsed: sent.elapsed(),
            };
            let done = answer.is_final();
            operation.attempts.push(answer);
            if done {
                return;
            }
            tokio::time::sleep(BACKOFF).await;
        }
    }

    async fn send(&self, addr: SocketAddr, operation: &Operation) -> Result<(u16, Bytes), String> {
        let req = Request::post(format!("http://{addr}/charges"))
            .header("authorization", operation.scope())
            .header("idempotency-key", operation.key())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(
                "{{\"amount\":{}}}",
                operation.amount
            ))))
            .expect("request");
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e:?}"))?;
        Ok((status, body.to_bytes()))
    }
}

// --- Faults ----------------------------------------------------------------------------

#[derive(Debug)]
struct Faults {
    injected: usize,
    /// What happened when, from the start of the test.
    timeline: Vec<String>,
    /// The restarted replica A, kept alive until the end of the test.
    restarted: Option<Running>,
}

/// At a third of the operations SIGKILLs replica A and swaps in a fresh one; at two
/// thirds freezes Redis for [`REDIS_PAUSE`]. Stops early if the load ends first.
async fn inject_faults(
    mut a: Running,
    config: String,
    redis: Arc<RedisServer>,
    replicas: Arc<Replicas>,
    mut progress: watch::Receiver<usize>,
    epoch: Instant,
) -> Faults {
    let mut faults = Faults {
        injected: 0,
        timeline: Vec::new(),
        restarted: None,
    };
    if progress
        .wait_for(|done| *done >= OPERATIONS / 3)
        .await
        .is_err()
    {
        return faults;
    }
    a.kill().await;
    faults.injected += 1;
    faults
        .timeline
        .push(format!("A killed at {:?}", epoch.elapsed()));
    let restarted = Running::start(&["--config", &config]).await;
    replicas.replace("A", ("A2", restarted.addr));
    faults
        .timeline
        .push(format!("A2 in at {:?}", epoch.elapsed()));
    faults.restarted = Some(restarted);
    if progress
        .wait_for(|done| *done >= 2 * OPERATIONS / 3)
        .await
        .is_err()
    {
        return faults;
    }
    tokio::task::block_in_place(|| redis.pause());
    faults.injected += 1;
    faults
        .timeline
        .push(format!("Redis stopped at {:?}", epoch.elapsed()));
    // The freeze itself is the fault: time passing is the behaviour here.
    tokio::time::sleep(REDIS_PAUSE).await;
    tokio::task::block_in_place(|| redis.resume());
    faults
        .timeline
        .push(format!("Redis resumed at {:?}", epoch.elapsed()));
    faults
}

// --- The checker -----------------------------------------------------------------------

#[derive(Debug, Default)]
struct Figures {
    duplicates: usize,
    cross_scope: usize,
    mismatches: usize,
    unexpected: usize,
    unanswered: usize,
    outcome_unknown: usize,
    /// Human-readable lines naming what went wrong, for the assertion messages.
    findings: Vec<String>,
}

/// The worker numbers of every `Bearer worker-N` a body carries.
fn scopes_in(body: &[u8]) -> Vec<usize> {
    let text = String::from_utf8_lossy(body);
    text.split("Bearer worker-")
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

fn problem_slug(body: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let ty = json["type"].as_str()?;
    Some(ty.rsplit('/').next()?.to_owned())
}

fn describe(op: &Operation) -> String {
    let mut out = format!("{} key {} amount {}:", op.scope(), op.key(), op.amount);
    for a in &op.attempts {
        out.push_str(&format!(
            "\n    {:?} #{} at {:?} via {} took {:?}: {} {}",
            a.phase,
            a.attempt,
            a.at,
            a.replica,
            a.elapsed,
            a.status.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            a.error
                .clone()
                .unwrap_or_else(|| String::from_utf8_lossy(&a.body).into_owned()),
        ));
    }
    out
}

fn check(operations: &[Operation], log: &[Execution]) -> Figures {
    let mut figures = Figures::default();
    let mut executions: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, e) in log.iter().enumerate() {
        executions
            .entry((&e.scope, &e.key))
            .or_default()
            .push(i + 1);
    }
    for ((scope, key), numbers) in &executions {
        if numbers.len() > 1 {
            figures.duplicates += numbers.len() - 1;
            figures
                .findings
                .push(format!("{scope} key {key} executed as {numbers:?}"));
        }
    }
    for op in operations {
        let (scope, key) = (op.scope(), op.key());
        let mut bad = Vec::new();
        if !op.answered(Phase::Load) {
            figures.unanswered += 1;
            bad.push("no final answer during the run");
        }
        if op
            .attempts
            .iter()
            .any(|a| scopes_in(&a.body).iter().any(|w| *w != op.worker))
        {
            figures.cross_scope += 1;
            bad.push("a body carries another scope");
        }
        let mut finals = op.attempts.iter().filter(|a| a.is_final());
        if let Some(first) = finals.next() {
            if finals.any(|a| a.body != first.body) {
                figures.mismatches += 1;
                bad.push("answers differ");
            }
            let slug = problem_slug(&first.body);
            match first.status {
                Some(201) => {
                    let json: serde_json::Value =
                        serde_json::from_slice(&first.body).unwrap_or_default();
                    let n = json["execution"].as_u64().unwrap_or(0) as usize;
                    let ran = n.checked_sub(1).and_then(|i| log.get(i));
                    let ours = ran.is_some_and(|e| e.scope == scope && e.key == key);
                    if json["key"] != key.as_str() || !ours {
                        figures.mismatches += 1;
                        bad.push("201 names another execution");
                    }
                }
                Some(502 | 504) if slug.as_deref() == Some("outcome-unknown") => {
                    figures.outcome_unknown += 1;
                }
                _ => {
                    figures.unexpected += 1;
                    bad.push("unexpected final answer");
                }
            }
        }
        if !bad.is_empty() {
            figures
                .findings
                .push(format!("{}: {}", bad.join(", "), describe(op)));
        }
    }
    figures
}

/// In-flight markers (record kind byte 1) among the store's keys.
const COUNT_IN_FLIGHT: &str = "local n=0 for _,k in ipairs(redis.call('KEYS','idemgate:*')) do \
     local v=redis.call('GET',k) if v and string.byte(v,2)==1 then n=n+1 end end return n";

fn config_yaml(redis: &RedisServer, upstream: &ChaosUpstream) -> String {
    format!(
        "upstream:\n  url: {}\n  timeout: 2s\nstore:\n  kind: redis\n  url: {}\n  timeout: 300ms\n\
         idempotency:\n  lease: {}ms\n  on_unknown_outcome: record\nadmin:\n  listen: null\nlog:\n  level: warn\n",
        upstream.url(),
        redis.url(),
        LEASE.as_millis()
    )
}

/// Runs every worker's operations of `phase` (those `select` picks) concurrently.
async fn run_phase(
    workers: Vec<(Worker, Vec<Operation>)>,
    phase: Phase,
    select: fn(&Operation) -> bool,
    progress: Option<Arc<watch::Sender<usize>>>,
) -> Vec<(Worker, Vec<Operation>)> {
    let mut tasks = JoinSet::new();
    for (mut worker, mut ops) in workers {
        let progress = progress.clone();
        tasks.spawn(async move {
            for op in ops.iter_mut().filter(|op| select(op)) {
                worker.run(op, phase).await;
                if let Some(progress) = &progress {
                    progress.send_modify(|done| *done += 1);
                }
            }
            (worker, ops)
        });
    }
    let mut out = Vec::new();
    while let Some(done) = tasks.join_next().await {
        out.push(done.expect("worker task"));
    }
    out.sort_by_key(|(worker, _)| worker.id);
    out
}

async fn within<T>(limit: Duration, what: &str, phase: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, phase)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

/// Writes every attempt of every operation, and the upstream's log, under cargo's temp
/// dir for integration tests (overwritten by the next run).
fn write_attempts_log(timeline: &[String], operations: &[Operation], log: &[Execution]) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chaos-attempts.log");
    let mut out = format!("faults: {}\n", timeline.join(", "));
    for op in operations {
        out.push_str(&describe(op));
        out.push('\n');
    }
    out.push_str("upstream executions:\n");
    for (i, e) in log.iter().enumerate() {
        out.push_str(&format!("  {} {} {}\n", i + 1, e.scope, e.key));
    }
    std::fs::write(&path, out).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// The end of a replica's log, enough to see its last warnings.
fn tail(log: &str) -> &str {
    let start = log.len().saturating_sub(4000);
    let start = (start..log.len())
        .find(|&i| log.is_char_boundary(i))
        .unwrap_or(log.len());
    &log[start..]
}

#[expect(
    clippy::print_stdout,
    reason = "the chaos figures are the test's report"
)]
fn print_summary(line: &str) {
    println!("{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_through_replica_kills_and_store_freezes_execute_once_and_replay_the_same_answer() {
    let started = Instant::now();
    let redis = Arc::new(RedisServer::start().await);
    let upstream =
        ChaosUpstream::start(XorShift::new(SEED, u64::MAX), MAX_DELAY, DROP_PERCENT).await;
    let file = TempConfig::new(&config_yaml(&redis, &upstream));
    let config = file.path().to_string_lossy().into_owned();
    let a = Running::start(&["--config", &config]).await;
    let b = Running::start(&["--config", &config]).await;
    let replicas = Arc::new(Replicas::new(vec![("A", a.addr), ("B", b.addr)]));

    let (progress, watch_progress) = watch::channel(0usize);
    let faults = tokio::spawn(inject_faults(
        a,
        config.clone(),
        Arc::clone(&redis),
        Arc::clone(&replicas),
        watch_progress,
        started,
    ));

    let mut amounts = XorShift::new(SEED, u64::MAX - 1);
    let workers: Vec<(Worker, Vec<Operation>)> = (0..WORKERS)
        .map(|id| {
            let ops = (0..OPS_PER_WORKER)
                .map(|op| Operation {
                    worker: id,
                    op,
                    amount: 1 + amounts.below(10_000),
                    attempts: Vec::new(),
                })
                .collect();
            (Worker::new(id, Arc::clone(&replicas), started), ops)
        })
        .collect();
    let load = run_phase(workers, Phase::Load, |_| true, Some(Arc::new(progress)));
    let workers = within(LOAD_LIMIT, "the load", load).await;
    let load_time = started.elapsed();
    let faults = faults.await.expect("fault task");

    // Claims of the killed replica and claims orphaned by the freeze block their keys for
    // one lease at most: waiting it out is the behaviour under test.
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    let settle = run_phase(workers, Phase::Settle, |op| !op.answered(Phase::Load), None);
    let workers = within(PHASE_LIMIT, "the settling", settle).await;
    let leaks: usize = tokio::task::block_in_place(|| redis.cli(&["EVAL", COUNT_IN_FLIGHT, "0"]))
        .parse()
        .expect("EVAL returns a count");
    let verify = run_phase(workers, Phase::Verify, |_| true, None);
    let workers = within(PHASE_LIMIT, "the verification", verify).await;

    let operations: Vec<Operation> = workers.into_iter().flat_map(|(_, ops)| ops).collect();
    let log = upstream.log();
    let figures = check(&operations, &log);
    let load: Vec<&Attempt> = operations
        .iter()
        .flat_map(|op| &op.attempts)
        .filter(|a| a.phase == Phase::Load)
        .collect();
    let load_attempts = load.len();
    let with_status = |s: u16| load.iter().filter(|a| a.status == Some(s)).count();
    let timeouts = load
        .iter()
        .filter(|a| a.error.as_deref() == Some("client timeout"))
        .count();
    let conn_errors = load.iter().filter(|a| a.error.is_some()).count() - timeouts;
    let summary = format!(
        "chaos: operations={} attempts={load_attempts} retries={} faults={} executions={} \
         duplicates={} cross_scope={} mismatches={} unanswered={} leaks={leaks} \
         unexpected={} outcome_unknown={} upstream_drops={} in_flight_409={} \
         unavailable_503={} conn_errors={conn_errors} timeouts={timeouts} \
         load={:.1}s wall={:.1}s",
        operations.len(),
        load_attempts - operations.len(),
        faults.injected,
        log.len(),
        figures.duplicates,
        figures.cross_scope,
        figures.mismatches,
        figures.unanswered,
        figures.unexpected,
        figures.outcome_unknown,
        upstream.drops(),
        with_status(409),
        with_status(503),
        load_time.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    print_summary(&summary);
    let attempts_log = write_attempts_log(&faults.timeline, &operations, &log);
    print_summary(&format!(
        "chaos: {}; every attempt in {}",
        faults.timeline.join(", "),
        attempts_log.display()
    ));

    let mut findings = figures.findings.clone();
    findings.truncate(20);
    let logs = format!(
        "{summary}\n{}\nreplica B log:\n{}\nreplica A2 log:\n{}",
        findings.join("\n"),
        tail(&b.stderr()),
        tail(
            &faults
                .restarted
                .as_ref()
                .map(Running::stderr)
                .unwrap_or_default()
        ),
    );
    assert_eq!(faults.injected, 2, "both faults hit the run\n{logs}");
    assert_eq!(figures.duplicates, 0, "at most once per key\n{logs}");
    assert_eq!(figures.cross_scope, 0, "scopes never cross\n{logs}");
    assert_eq!(figures.mismatches, 0, "one answer per key\n{logs}");
    assert_eq!(figures.unexpected, 0, "only 201 or outcome-unknown\n{logs}");
    assert_eq!(figures.unanswered, 0, "every operation answered\n{logs}");
    assert_eq!(leaks, 0, "no in-flight marker outlives the leases\n{logs}");
}
