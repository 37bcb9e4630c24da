//! The client pool of a scale run: workers that take fresh keys in order and send each
//! one, retrying with the same key and body, until a definitive answer (a first
//! execution or a replay). `409`, `503`, failed connections, client timeouts and
//! `outcome-unknown` are retried with a capped back-off; a key still unsettled at its
//! deadline, or answered `outcome-unknown` [`OUTCOME_UNKNOWN_ANSWERS`] times, has no
//! definitive answer. Keys are released in segments (`allowed`), so that the fault
//! injector can place its failovers among them.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use support::TestClient;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The client's patience with one attempt: a paused replica answers nothing, and its
/// clients go to another before its lease ends (`LEASE` in mod.rs).
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Back-off between attempts at one key: doubled from the first to the cap.
const BACKOFF_FIRST: Duration = Duration::from_millis(10);
const BACKOFF_CAP: Duration = Duration::from_millis(200);
/// A key is given up after this long without a definitive answer.
const KEY_DEADLINE: Duration = Duration::from_secs(60);
/// `outcome-unknown` is what a key keeps answering under `on_unknown_outcome: record`:
/// after this many, the client stops.
const OUTCOME_UNKNOWN_ANSWERS: u32 = 3;

/// How a key's attempts ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// The first execution's own answer (2xx, not a replay).
    Executed,
    /// A stored answer replayed.
    Replayed,
    /// `outcome-unknown`, [`OUTCOME_UNKNOWN_ANSWERS`] times: no definitive answer.
    OutcomeUnknown,
}

/// What became of one key in one pass.
#[derive(Debug, Default, Clone)]
pub(super) struct KeyLog {
    pub(super) first_sent: Option<Instant>,
    pub(super) answered: Option<(Instant, Answer)>,
    /// Attempts retried (`409`, `503`, a failed connection, a timeout, ...).
    pub(super) retried: u32,
    pub(super) last_refusal: Option<String>,
    /// Answers no client expects (neither definitive nor to retry), retried anyway.
    pub(super) unexpected: u32,
}

impl KeyLog {
    /// Settled with a first execution or a replay.
    pub(super) fn definitive(&self) -> Option<Instant> {
        match self.answered {
            Some((at, Answer::Executed | Answer::Replayed)) => Some(at),
            _ => None,
        }
    }
}

pub(super) fn key_name(n: usize) -> String {
    format!("cs-{n}")
}

/// One pass over `keys` keys by `workers` clients.
pub(super) struct Pass {
    replicas: Vec<TestClient>,
    keys: Mutex<Vec<KeyLog>>,
    /// Keys taken by a worker so far.
    pub(super) taken: AtomicUsize,
    pub(super) answered: AtomicUsize,
    allowed: watch::Sender<usize>,
    /// Fresh keys start at most one per `pace`: the load runs on through the faults.
    pace: Duration,
    next_start: Mutex<Instant>,
}

impl Pass {
    /// A pass whose first `allowed` keys may be sent, one per `pace` at most.
    pub(super) fn new(
        replicas: &[SocketAddr],
        keys: usize,
        allowed: usize,
        pace: Duration,
    ) -> Arc<Pass> {
        Arc::new(Pass {
            replicas: replicas.iter().map(|a| TestClient::new(*a)).collect(),
            keys: Mutex::new(vec![KeyLog::default(); keys]),
            taken: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
            allowed: watch::Sender::new(allowed),
            pace,
            next_start: Mutex::new(Instant::now()),
        })
    }

    /// Lets workers send keys below `n`.
    pub(super) fn allow(&self, n: usize) {
        self.allowed
            .send_modify(|allowed| *allowed = (*allowed).max(n));
    }

    pub(super) fn len(&self) -> usize {
        self.keys().len()
    }

    fn keys(&self) -> MutexGuard<'_, Vec<KeyLog>> {
        self.keys.lock().expect("lock")
    }

    pub(super) fn logs(&self) -> Vec<KeyLog> {
        self.keys().clone()
    }

    /// Runs `workers` clients until every key is taken and settled or given up.
    pub(super) async fn run(self: &Arc<Self>, workers: usize) {
        let mut tasks = JoinSet::new();
        for id in 0..workers {
            let pass = Arc::clone(self);
            tasks.spawn(async move { pass.worker(id).await });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("worker");
        }
    }

    async fn worker(&self, id: usize) {
        let mut allowed = self.allowed.subscribe();
        let mut attempt = id;
        loop {
            let n = self.taken.fetch_add(1, Ordering::SeqCst);
            if n >= self.len() {
                return;
            }
            allowed
                .wait_for(|allowed| *allowed > n)
                .await
                .expect("the pass holds the sender");
            let slot = {
                let mut next = self.next_start.lock().expect("lock");
                let slot = (*next).max(Instant::now());
                *next = slot + self.pace;
                slot
            };
            // The pace of fresh keys is the load's shape, not a synchronisation.
            tokio::time::sleep_until(slot.into()).await;
            self.settle(n, &mut attempt).await;
            self.answered.fetch_add(1, Ordering::SeqCst);
        }
    }

    async fn settle(&self, n: usize, attempt: &mut usize) {
        let (key, body) = (key_name(n), format!("{{\"charge\":{n}}}"));
        let headers = [
            ("idempotency-key", key.as_str()),
            ("content-type", "application/json"),
        ];
        let started = Instant::now();
        self.keys()[n].first_sent = Some(started);
        let (mut backoff, mut unknown) = (BACKOFF_FIRST, 0);
        while started.elapsed() < KEY_DEADLINE {
            let replica = &self.replicas[*attempt % self.replicas.len()];
            *attempt += 1;
            let sent = tokio::time::timeout(
                ATTEMPT_TIMEOUT,
                replica.try_send_bytes("POST", "/charges", &headers, body.clone().into_bytes()),
            )
            .await;
            let refusal = match sent {
                Ok(Ok(resp)) => {
                    let status = resp.status.as_u16();
                    let slug = problem_slug(&resp.body);
                    let answer = match status {
                        502 | 504 if slug.as_deref() == Some("outcome-unknown") => {
                            unknown += 1;
                            (unknown >= OUTCOME_UNKNOWN_ANSWERS).then_some(Answer::OutcomeUnknown)
                        }
                        200..=299 if resp.replayed() => Some(Answer::Replayed),
                        200..=299 => Some(Answer::Executed),
                        _ => None,
                    };
                    if let Some(answer) = answer {
                        self.keys()[n].answered = Some((Instant::now(), answer));
                        return;
                    }
                    if !matches!(status, 409 | 503 | 502 | 504) {
                        self.keys()[n].unexpected += 1;
                    }
                    format!("{status} {}", String::from_utf8_lossy(&resp.body))
                }
                Ok(Err(err)) => format!("connection: {err}"),
                Err(_) => "client timeout".to_owned(),
            };
            {
                let mut keys = self.keys();
                keys[n].retried += 1;
                keys[n].last_refusal = Some(refusal);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_CAP);
        }
    }
}

fn problem_slug(body: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let ty = json["type"].as_str()?;
    Some(ty.rsplit('/').next()?.to_owned())
}
