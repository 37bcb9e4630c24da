//! The load generator: N keep-alive HTTP/1.1 connections, each sending one request after
//! another for a warm-up and then a measured window, with latencies in a histogram.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

/// The JSON every scenario POSTs: about 200 bytes, like a small payment API call.
pub(crate) const REQUEST_BODY: &str = concat!(
    r#"{"amount":4200,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3","#,
    r#""description":"Invoice 2024-0042, consulting","capture":true,"#,
    r#""metadata":{"order_id":"6735","channel":"web","note":"benchmark body"}}"#,
);

/// The upload scenario's body: 8 MiB, over `max_request_body`, so streamed
/// (docs/behaviour.md §19). Made once per run; every request sends the same bytes.
pub(crate) fn upload_body() -> Bytes {
    (0..8usize << 20)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Every request sends a credential, as real payment API calls do; idemgate hashes it
/// into the key's scope. The targets scoped by a JWT principal send a token instead
/// ([`Plan::authorization`]).
pub(crate) const AUTHORIZATION: &str = "Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc";

/// The request header that makes the harness's upstream wait before it answers, in ms
/// (servers::upstream).
pub(crate) const DELAY_HEADER: &str = "x-bench-delay-ms";

/// A request that takes longer than this counts as an error; keeps a run bounded.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Which `Idempotency-Key` each request carries.
#[derive(Debug, Clone)]
pub(crate) enum Keys {
    None,
    /// `{prefix}-{connection}-{n}`: never repeats within a harness run.
    Fresh(String),
    Fixed(String),
    /// As `Fresh`, but sent in the body as `metadata.order_id`, with no key header.
    FreshInBody(String),
}

/// One load run against one address.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) addr: SocketAddr,
    pub(crate) path: &'static str,
    pub(crate) keys: Keys,
    /// The `Authorization` value every request carries: [`AUTHORIZATION`], or a target's
    /// bearer JWT (docs/behaviour.md §17).
    pub(crate) authorization: &'static str,
    /// Must every response carry `Idempotent-Replayed: true` (or must none)?
    pub(crate) expect_replayed: bool,
    /// Sent as [`DELAY_HEADER`]: the upstream waits this long before answering (the
    /// `slow` scenario).
    pub(crate) delay_ms: Option<u64>,
    /// What every request sends, but a key in the body's.
    pub(crate) body: Bytes,
    pub(crate) concurrency: usize,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    /// Counts answers as they come, and can end the run early (the memory mode).
    pub(crate) progress: Option<Arc<Progress>>,
}

/// A live count of a run's answers, shared with whoever watches it.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    completed: AtomicU64,
    /// No new request is sent once this many were answered (0: no limit). Requests in
    /// flight still complete, so a run ends up to `concurrency - 1` above it.
    limit: u64,
}

impl Progress {
    pub(crate) fn with_limit(limit: u64) -> Self {
        Self {
            completed: AtomicU64::new(0),
            limit,
        }
    }

    /// Requests answered so far (any status).
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    fn more(&self) -> bool {
        self.limit == 0 || self.completed() < self.limit
    }
}

/// What a run saw.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Latencies of the requests completed inside the measured window.
    pub(crate) latencies: Histogram,
    /// Requests completed inside the measured window.
    pub(crate) measured: u64,
    /// Every request that got an answer, warm-up and stragglers included.
    pub(crate) completed: u64,
    pub(crate) window: Duration,
    pub(crate) non_2xx: u64,
    pub(crate) transport_errors: u64,
    /// A replay where a first execution was expected, or the other way round.
    pub(crate) replay_mismatches: u64,
    /// The first thing that went wrong, for the report.
    pub(crate) first_problem: Option<String>,
}

impl Outcome {
    pub(crate) fn rps(&self) -> f64 {
        self.measured as f64 / self.window.as_secs_f64().max(1e-9)
    }

    pub(crate) fn failures(&self) -> u64 {
        self.non_2xx + self.transport_errors + self.replay_mismatches
    }

    fn merge(&mut self, other: Outcome) {
        self.latencies.merge(&other.latencies);
        self.measured += other.measured;
        self.completed += other.completed;
        self.non_2xx += other.non_2xx;
        self.transport_errors += other.transport_errors;
        self.replay_mismatches += other.replay_mismatches;
        if self.first_problem.is_none() {
            self.first_problem = other.first_problem;
        }
    }

    fn problem(&mut self, what: impl FnOnce() -> String) {
        if self.first_problem.is_none() {
            self.first_problem = Some(what());
        }
    }
}

/// Runs the plan: all connections start together, the warm-up is not measured.
pub(crate) async fn run(plan: Arc<Plan>) -> Outcome {
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let end = measure_from + plan.duration;
    let workers: Vec<_> = (0..plan.concurrency)
        .map(|id| tokio::spawn(worker(Arc::clone(&plan), id, measure_from, end)))
        .collect();
    let mut total = Outcome {
        window: plan.duration,
        ..Outcome::default()
    };
    for worker in workers {
        match worker.await {
            Ok(outcome) => total.merge(outcome),
            Err(err) => {
                total.transport_errors += 1;
                total.problem(|| format!("load worker failed: {err}"));
            }
        }
    }
    total
}

/// One request on a fresh connection, outside any measurement (to prime the `hit` key).
/// Returns the status and whether the answer was a replay.
pub(crate) async fn one_request(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    authorization: &str,
) -> Result<(StatusCode, bool), String> {
    let host = host_value(addr);
    let mut sender = connect(addr).await?;
    let body = Bytes::from_static(REQUEST_BODY.as_bytes());
    let req = request(&host, path, key, authorization, None, body)?;
    tokio::time::timeout(REQUEST_TIMEOUT, exchange(&mut sender, req))
        .await
        .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?
}

async fn worker(plan: Arc<Plan>, id: usize, measure_from: Instant, end: Instant) -> Outcome {
    let mut out = Outcome::default();
    let host = host_value(plan.addr);
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    let mut seq: u64 = 0;
    let more = || plan.progress.as_ref().is_none_or(|p| p.more());
    while Instant::now() < end && more() {
        let conn = match sender.as_mut() {
            Some(conn) => conn,
            None => match connect(plan.addr).await {
                Ok(conn) => sender.insert(conn),
                Err(err) => {
                    out.transport_errors += 1;
                    out.problem(|| err);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        seq += 1;
        let fresh;
        let key = match &plan.keys {
            Keys::None => None,
            Keys::Fixed(key) => Some(key.as_str()),
            Keys::Fresh(prefix) | Keys::FreshInBody(prefix) => {
                fresh = format!("{prefix}-{id}-{seq}");
                Some(fresh.as_str())
            }
        };
        let built = match (&plan.keys, key) {
            (Keys::FreshInBody(_), Some(key)) => {
                request_keyed_in_body(&host, plan.path, key, plan.authorization)
            }
            _ => request(
                &host,
                plan.path,
                key,
                plan.authorization,
                plan.delay_ms,
                plan.body.clone(),
            ),
        };
        let req = match built {
            Ok(req) => req,
            Err(err) => {
                out.transport_errors += 1;
                out.problem(|| err);
                break;
            }
        };
        let sent = Instant::now();
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, exchange(conn, req)).await;
        let done = Instant::now();
        let (status, replayed) = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(err)) => {
                out.transport_errors += 1;
                out.problem(|| err);
                sender = None;
                continue;
            }
            Err(_) => {
                out.transport_errors += 1;
                out.problem(|| format!("no answer within {REQUEST_TIMEOUT:?}"));
                sender = None;
                continue;
            }
        };
        out.completed += 1;
        if let Some(progress) = &plan.progress {
            progress.completed.fetch_add(1, Ordering::Relaxed);
        }
        if done >= measure_from && done <= end {
            out.measured += 1;
            out.latencies.record(done - sent);
        }
        if !status.is_success() {
            out.non_2xx += 1;
            out.problem(|| format!("{} {} answered {status}", plan.path, key.unwrap_or("")));
        } else if replayed != plan.expect_replayed {
            out.replay_mismatches += 1;
            out.problem(|| {
                format!(
                    "{} answered {status} with Idempotent-Replayed {}, expected {}",
                    plan.path,
                    if replayed { "true" } else { "absent" },
                    if plan.expect_replayed {
                        "true"
                    } else {
                        "absent"
                    },
                )
            });
        }
    }
    out
}

fn host_value(addr: SocketAddr) -> String {
    addr.to_string()
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake {addr}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn request(
    host: &str,
    path: &str,
    key: Option<&str>,
    authorization: &str,
    delay_ms: Option<u64>,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, String> {
    let mut builder = Request::post(path)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, authorization);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    if let Some(ms) = delay_ms {
        builder = builder.header(DELAY_HEADER, ms);
    }
    builder
        .body(Full::new(body))
        .map_err(|e| format!("build request: {e}"))
}

/// The request of [`REQUEST_BODY`] with `key` as its `metadata.order_id` and no key
/// header: a key source in the body (docs/behaviour.md §9). The key is ASCII without
/// quotes or backslashes, so it needs no JSON escaping.
fn request_keyed_in_body(
    host: &str,
    path: &str,
    key: &str,
    authorization: &str,
) -> Result<Request<Full<Bytes>>, String> {
    let body = REQUEST_BODY.replacen(r#""order_id":"6735""#, &format!(r#""order_id":"{key}""#), 1);
    Request::post(path)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, authorization)
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("build request: {e}"))
}

/// Sends one request and reads the whole answer.
async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Result<(StatusCode, bool), String> {
    sender
        .ready()
        .await
        .map_err(|e| format!("connection closed: {e}"))?;
    let response = sender
        .send_request(req)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status();
    let replayed =
        response.headers().get("idempotent-replayed") == Some(&HeaderValue::from_static("true"));
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("read body: {e}"))?;
    Ok((status, replayed))
}

/// Sub-buckets per power of two: values are kept within 1/128 (< 0.8 %).
const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) << SUB_BITS;

/// A log-linear latency histogram in nanoseconds: fixed size, whatever the duration.
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }
}

impl Histogram {
    pub(crate) fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.counts[index(ns)] += 1;
        self.total += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
    }

    /// The latency below which a fraction `q` of the requests finished.
    pub(crate) fn quantile(&self, q: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Duration::from_nanos(midpoint(i));
            }
        }
        Duration::from_nanos(midpoint(BUCKETS - 1))
    }
}

fn index(ns: u64) -> usize {
    let ns = ns.max(1);
    let msb = 63 - ns.leading_zeros();
    if msb < SUB_BITS {
        return ns as usize;
    }
    let shift = msb - SUB_BITS;
    (((shift + 1) as usize) << SUB_BITS) + ((ns >> shift) as usize - SUB)
}

fn midpoint(index: usize) -> u64 {
    if index < 2 * SUB {
        return index as u64;
    }
    let shift = (index / SUB - 1) as u32;
    let mantissa = (index % SUB + SUB) as u64;
    (mantissa << shift) + ((1u64 << shift) - 1) / 2
}

/// Checks the histogram arithmetic; `--smoke` runs it so that it cannot rot.
pub(crate) fn self_check() -> Result<(), String> {
    for ns in [
        1,
        127,
        128,
        255,
        256,
        1_000,
        123_456,
        987_654_321,
        u64::MAX / 3,
    ] {
        let got = midpoint(index(ns)) as f64;
        if (got - ns as f64).abs() > ns as f64 / 100.0 {
            return Err(format!("histogram: {ns} ns kept as {got}"));
        }
    }
    let mut h = Histogram::default();
    for us in 1..=1000 {
        h.record(Duration::from_micros(us));
    }
    let (p50, p99) = (h.quantile(0.50).as_micros(), h.quantile(0.99).as_micros());
    if !(495..=505).contains(&p50) || !(980..=1000).contains(&p99) {
        return Err(format!(
            "histogram: 1..=1000 us gave p50 {p50} us, p99 {p99} us"
        ));
    }
    Ok(())
}
