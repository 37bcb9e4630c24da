//! What a PostgreSQL failover loses (issue 39; docs/behaviour.md §22 "Durability" and
//! "Failover"), measured on real servers: a primary and a standby, two idemgate replicas
//! whose URL names both hosts with `target_session_attrs=read-write`, and a pool of
//! clients retrying each of [`KEYS`] fresh keys until it gets a definitive answer. The
//! standby streams through a relay that delays the WAL by [`REPLICATION_LAG`], as a
//! link between zones does (the same lag as the Redis failover test, `failover.rs`), and
//! idemgate reaches the primary through a relay too. A third of the way in, the
//! primary's host goes: both links are cut (what the WAL link still carried is lost),
//! the primary is killed with SIGKILL, and the standby is promoted; idemgate is not
//! restarted. Then every key is sent once more, as a client whose answer was lost
//! would, and the upstream's own record is counted per key.
//!
//! With a synchronous standby no key may execute twice: every claim idemgate
//! acknowledged (and so forwarded) was on the standby before the acknowledgement. With
//! an asynchronous one the claims the standby had not received yet are lost with the
//! primary, and their retries execute again: the figure README "What a failover can
//! lose" sets beside it (`cargo nextest run --test it postgres_failover --no-capture`).

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate::store::PostgresStore;
use support::fault::{Fault, Relay};
use support::postgres::PgServer;
use support::{Proxy, Resp, TestClient, Upstream};
use tokio::task::JoinHandle;

type PgProxy = Proxy<PostgresStore>;

/// How late the standby gets each write.
const REPLICATION_LAG: Duration = Duration::from_millis(20);
/// Fresh keys sent, each retried until it is answered.
const KEYS: usize = 2400;
/// Clients sending at once, each one key after another; their attempts alternate
/// between the two idemgate replicas.
const CLIENTS: usize = 16;
/// Keys answered before the primary is killed (in the first pass).
const ANSWERED_BEFORE_KILL: usize = KEYS / 3;
/// The whole load, failover included, ends within this or the test fails.
const LIMIT: Duration = Duration::from_secs(75);
/// Back-off between attempts at one key: doubled from the first to the cap.
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
const BACKOFF_CAP: Duration = Duration::from_millis(100);

/// The answers that settle a key: a client does not retry after one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The first execution's own answer (2xx, not a replay).
    Executed,
    /// A stored answer replayed: the key was settled by an earlier attempt.
    Replayed,
    /// `outcome-unknown` (docs/behaviour.md §4): a marker whose owner never recorded
    /// its outcome, answered instead of executing again under `on_unknown_outcome:
    /// record`.
    OutcomeUnknown,
}

/// What became of one key in one pass.
#[derive(Debug, Default, Clone)]
struct KeyLog {
    first_sent: Option<Instant>,
    answered: Option<(Instant, Answer)>,
    /// The last answer that was retried (`409`, `503`, or a failed connection).
    last_refusal: Option<String>,
}

/// One pass over every key by [`CLIENTS`] clients: each key sent, and retried, until it
/// is settled.
#[derive(Default)]
struct Pass {
    next: AtomicUsize,
    answered: AtomicUsize,
    refused: AtomicUsize,
    keys: Mutex<Vec<KeyLog>>,
    /// An answer that is neither definitive nor to be retried stops the pass.
    unexpected: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// A pass under way: its record and its clients.
struct Running {
    pass: Arc<Pass>,
    clients: Vec<JoinHandle<()>>,
}

impl Pass {
    fn start(replicas: [&PgProxy; 2]) -> Running {
        let pass = Arc::new(Pass {
            keys: Mutex::new(vec![KeyLog::default(); KEYS]),
            ..Pass::default()
        });
        let clients = (0..CLIENTS)
            .map(|id| {
                let replicas = [replicas[0].client(), replicas[1].client()];
                tokio::spawn(client(replicas, id, Arc::clone(&pass)))
            })
            .collect();
        Running { pass, clients }
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, Vec<KeyLog>> {
        self.keys.lock().expect("lock")
    }
}

impl Running {
    async fn wait_answered(&self, n: usize, deadline: Instant) {
        while self.pass.answered.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "fewer than {n} keys answered within {LIMIT:?} (before the failover)"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until every key is settled or `deadline`, then stops the clients. Returns
    /// what became of each key, and how many attempts were refused.
    async fn finish(self, deadline: Instant) -> (Vec<KeyLog>, usize) {
        let pass = self.pass;
        while pass.answered.load(Ordering::SeqCst) < KEYS
            && !pass.stop.load(Ordering::SeqCst)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pass.stop.store(true, Ordering::SeqCst);
        for c in self.clients {
            c.await.expect("client");
        }
        let unexpected = pass.unexpected.lock().expect("lock").clone();
        assert!(
            unexpected.is_empty(),
            "answers that neither settle a key nor ask for a retry: {unexpected:?}"
        );
        let keys = pass.keys().clone();
        (keys, pass.refused.load(Ordering::SeqCst))
    }
}

fn key_name(n: usize) -> String {
    format!("pgf-{n}")
}

/// Settles a key, asks for another attempt (`None`), or names what no client expects.
fn settles(resp: &Resp) -> Result<Option<Answer>, String> {
    let status = resp.status.as_u16();
    match status {
        502 | 504 if resp.problem() == "outcome-unknown" => Ok(Some(Answer::OutcomeUnknown)),
        200..=299 if resp.replayed() => Ok(Some(Answer::Replayed)),
        200..=299 => Ok(Some(Answer::Executed)),
        409 | 503 if !resp.replayed() => Ok(None),
        _ => Err(format!("{status} {}", resp.text())),
    }
}

/// One client: the next key, retried with the same key and body on `409`, `503` and
/// failed connections, with a capped back-off, until it is settled.
async fn client(replicas: [TestClient; 2], id: usize, pass: Arc<Pass>) {
    let mut attempt = id;
    loop {
        let n = pass.next.fetch_add(1, Ordering::SeqCst);
        if n >= KEYS {
            return;
        }
        let (key, body) = (key_name(n), format!("{{\"charge\":{n}}}"));
        let headers = [
            ("idempotency-key", key.as_str()),
            ("content-type", "application/json"),
        ];
        pass.keys()[n].first_sent = Some(Instant::now());
        let mut backoff = BACKOFF_FIRST;
        loop {
            if pass.stop.load(Ordering::SeqCst) {
                return;
            }
            let replica = &replicas[attempt % 2];
            attempt += 1;
            let sent = replica
                .try_send_bytes("POST", "/charges", &headers, body.clone().into_bytes())
                .await;
            let refusal = match sent {
                Ok(resp) => match settles(&resp) {
                    Ok(Some(answer)) => {
                        pass.keys()[n].answered = Some((Instant::now(), answer));
                        pass.answered.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    Ok(None) => format!("{} {}", resp.status, resp.text()),
                    Err(unexpected) => {
                        pass.unexpected
                            .lock()
                            .expect("lock")
                            .push(format!("{key}: {unexpected}"));
                        pass.stop.store(true, Ordering::SeqCst);
                        return;
                    }
                },
                Err(err) => format!("connection: {err}"),
            };
            pass.refused.fetch_add(1, Ordering::SeqCst);
            pass.keys()[n].last_refusal = Some(refusal);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_CAP);
        }
    }
}

/// What a run measured.
#[derive(Debug)]
struct Figures {
    keys: usize,
    executions: usize,
    executed_twice: usize,
    /// Keys the second pass executed: their record was lost in the failover.
    executed_again: usize,
    /// Keys without a definitive answer in either pass.
    no_answer: usize,
    /// Keys the first pass settled with `outcome-unknown`.
    outcome_unknown: usize,
    /// Attempts answered `409` or `503`, or refused a connection, and retried.
    refused: usize,
    /// Keys answered 2xx that the upstream never saw: an answer made up.
    answered_unexecuted: usize,
    /// The unavailability window: from the kill to the first definitive answer of a key
    /// first sent after the kill (`None` when none was answered).
    window: Option<Duration>,
    /// When the test saw the standby promoted, from the kill (the test promotes at once;
    /// a failover manager adds its detection time).
    promoted_after: Duration,
    /// Unanswered keys with the last refusal each got, for the failure message.
    stuck: Vec<String>,
}

async fn failover_under_load(sync: bool) -> Figures {
    // A promotion that comes while the standby is between losing its primary and waiting
    // to retry it waits out the retry interval (5 s by default, in about one run in four
    // here); a failover manager promotes later than this test does, so it does not.
    let primary = PgServer::builder()
        .conf("wal_retrieve_retry_interval = '100ms'")
        .start()
        .await;
    let standby = primary.standby(sync).await;
    let link = Relay::start(([127, 0, 0, 1], primary.port).into()).await;
    standby.stream_through(&primary, link.addr.port()).await;
    link.set(Fault::Delay(REPLICATION_LAG));
    // A SIGKILLed postmaster's backends run on until they next wait, and one may still
    // answer a statement sent after the kill; a host that is gone answers nothing.
    let host = Relay::start(([127, 0, 0, 1], primary.port).into()).await;
    let up = Upstream::start().await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        host.addr.port(),
        standby.port
    );
    // A short lease, so that the markers the crash orphans end soon and answer
    // `outcome-unknown` (on_unknown_outcome: record, the default).
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: postgres\n  url: {url}\n  timeout: 500ms\n\
         idempotency:\n  lease: 2s\n"
    );
    let a: PgProxy = Proxy::postgres(&yaml, &up).await;
    let b: PgProxy = Proxy::postgres(&yaml, &up).await;
    let deadline = Instant::now() + LIMIT;

    let first = Pass::start([&a, &b]);
    first.wait_answered(ANSWERED_BEFORE_KILL, deadline).await;
    // The primary's host goes, and the WAL its link still carried with it: the links are
    // cut first, so that no chunk they hold is let through on the way.
    let killed = Instant::now();
    for relay in [&link, &host] {
        relay.reset_all();
        relay.set(Fault::Reset);
    }
    primary.kill9();
    standby.promote().await;
    let promoted_after = killed.elapsed();
    let (first, refused_first) = first.finish(deadline).await;
    // Every key once more, as a client whose answer was lost would: a record the
    // failover lost executes again here.
    let (second, refused_second) = Pass::start([&a, &b]).finish(deadline).await;

    let mut executions: HashMap<String, usize> = HashMap::new();
    for seen in up.seen() {
        let key = seen.headers["idempotency-key"]
            .to_str()
            .expect("ascii")
            .to_owned();
        *executions.entry(key).or_default() += 1;
    }
    let window = first
        .iter()
        .filter(|k| k.first_sent.is_some_and(|at| at > killed))
        .filter_map(|k| k.answered.map(|(at, _)| at))
        .min()
        .map(|at| at - killed);
    let stuck = [("first pass", &first), ("second pass", &second)]
        .into_iter()
        .flat_map(|(pass, keys)| {
            keys.iter()
                .enumerate()
                .filter(|(_, k)| k.answered.is_none())
                .map(move |(n, k)| format!("{pass}: {}: {:?}", key_name(n), k.last_refusal))
        })
        .collect::<Vec<_>>();
    let answered = |keys: &[KeyLog], which: &[Answer]| {
        keys.iter()
            .filter(|k| k.answered.is_some_and(|(_, a)| which.contains(&a)))
            .count()
    };
    Figures {
        keys: KEYS,
        executions: executions.values().sum(),
        executed_twice: executions.values().filter(|n| **n > 1).count(),
        executed_again: answered(&second, &[Answer::Executed]),
        no_answer: first
            .iter()
            .zip(&second)
            .filter(|(one, two)| one.answered.is_none() || two.answered.is_none())
            .count(),
        outcome_unknown: answered(&first, &[Answer::OutcomeUnknown]),
        refused: refused_first + refused_second,
        answered_unexecuted: first
            .iter()
            .enumerate()
            .filter(|(n, k)| {
                matches!(k.answered, Some((_, Answer::Executed | Answer::Replayed)))
                    && !executions.contains_key(&key_name(*n))
            })
            .count(),
        window,
        promoted_after,
        stuck,
    }
}

/// The figures go into README "What a failover can lose".
#[allow(clippy::print_stderr)]
fn report(sync: bool, f: &Figures) {
    let standby = if sync {
        "a synchronous"
    } else {
        "an asynchronous"
    };
    let window = f
        .window
        .map_or_else(|| "none".to_owned(), |w| format!("{} ms", w.as_millis()));
    eprintln!(
        "postgres failover to {standby} standby, replication lag {REPLICATION_LAG:?}: {} keys, \
         {} executions, {} keys executed twice ({} by the second pass), {} keys without an \
         answer, {} keys outcome-unknown, {} attempts 409/503 retried, window {window} (kill \
         to the first answer of a key sent after it; promotion seen {} ms after the kill)",
        f.keys,
        f.executions,
        f.executed_twice,
        f.executed_again,
        f.no_answer,
        f.outcome_unknown,
        f.refused,
        f.promoted_after.as_millis(),
    );
}

/// Every key answered in both passes, and idemgate serving keys sent after the failover,
/// without a restart.
fn assert_served(f: &Figures) {
    assert_eq!(
        f.no_answer,
        0,
        "{} keys without a definitive answer {LIMIT:?} after the start (idemgate wedged \
         after the promotion?); the first: {:?}",
        f.no_answer,
        &f.stuck[..f.stuck.len().min(5)]
    );
    assert!(
        f.window.is_some(),
        "no key sent after the kill was answered"
    );
    assert_eq!(
        f.answered_unexecuted, 0,
        "keys answered 2xx that never reached the upstream: {f:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_promoted_executes_no_key_twice() {
    let figures = failover_under_load(true).await;
    report(true, &figures);
    assert_served(&figures);
    assert_eq!(
        figures.executed_twice, 0,
        "a key executed twice across a failover to a synchronous standby: {figures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_standby_promoted_serves_again_and_its_losses_are_counted() {
    let figures = failover_under_load(false).await;
    report(false, &figures);
    // Keys executed twice are the figure this run exists for; they are not an error.
    assert_served(&figures);
}

/// How soon idemgate must serve again once the standby is promoted, when the old
/// primary's host went silent: its pooled connections each cost one `store.timeout`.
const SERVED_AGAIN: Duration = Duration::from_secs(10);

/// A primary whose host stops answering without closing anything (a partition, a
/// machine lost) leaves idemgate's pooled connections to it open and silent: each call
/// on one ends at `store.timeout`. Such a connection must not go back to the pool, or
/// idemgate keeps answering 503 long after the standby was promoted, for as long as the
/// kernel keeps the connection open (docs/behaviour.md §22 "Failover").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_gone_silent_is_left_for_the_promoted_standby() {
    let primary = PgServer::start().await;
    let standby = primary.standby(true).await;
    let host = Relay::start(([127, 0, 0, 1], primary.port).into()).await;
    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: postgres\n  \
         url: postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write\n  \
         timeout: 500ms\n  pool_size: 4\n",
        host.addr.port(),
        standby.port
    );
    let proxy: PgProxy = Proxy::postgres(&yaml, &up).await;
    let c = proxy.client();
    // A full pool, every connection to the primary: none is made while they last.
    let before: Vec<_> = (0..8)
        .map(|i| c.spawn_post("/charges", &format!("before-{i}"), "{}"))
        .collect();
    for answer in before {
        assert_eq!(answer.await.expect("join").status, 201);
    }
    let pool = proxy.state.metrics.render();
    assert!(
        pool.contains("idemgate_store_pool_connections{state=\"idle\"} 4"),
        "{pool}"
    );

    // The primary runs on behind the relay: killing it would close the relay's
    // connections, which a host that is gone does not.
    host.set(Fault::Blackhole);
    standby.promote().await;
    let promoted = Instant::now();
    let mut refused = 0;
    loop {
        let r = c.post("/charges", &format!("after-{refused}"), "{}").await;
        if r.status == 201 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        refused += 1;
        assert!(
            promoted.elapsed() < SERVED_AGAIN,
            "still 503 {SERVED_AGAIN:?} after the promotion ({refused} refused): {}",
            r.text()
        );
    }
    report_silent(promoted.elapsed(), refused);
    assert_eq!(up.count(), 9, "every key once");
}

#[allow(clippy::print_stderr)]
fn report_silent(after: Duration, refused: usize) {
    eprintln!(
        "postgres primary gone silent: served again {} ms after the promotion, \
         {refused} requests refused 503 meanwhile",
        after.as_millis()
    );
}
