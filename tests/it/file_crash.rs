//! The file store across `kill -9` (docs/behaviour.md §12 "Crash and restart"): the real
//! binary is killed at an exact moment (the crash points of `failpoint.rs`) or at a
//! random one, restarted on the same `path`, and a retry either replays or gets `502
//! outcome-unknown`. The upstream, a real one on a socket, counts executions per key:
//! never two. Needs the `failpoints` feature (scripts/test.sh sets it).

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use support::bin::{Running, TempConfig};
use support::{TestClient, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEASE: Duration = Duration::from_millis(1500);

fn yaml(up: &Upstream, dir: &Path, fsync: bool) -> String {
    format!(
        "upstream:\n  url: {}\nstore:\n  kind: file\n  path: {}\n  fsync: {fsync}\nidempotency:\n  lease: {}ms\n  on_unknown_outcome: record\nadmin:\n  listen: null\n",
        up.url(),
        dir.display(),
        LEASE.as_millis()
    )
}

/// One guarded POST; what came back before the connection closed (nothing, when the
/// proxy died first).
async fn post_raw(addr: SocketAddr, key: &str) -> String {
    let Ok(mut socket) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let request = format!(
        "POST /charges HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    if socket.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Executions per idempotency key, as the upstream saw them.
fn executions(up: &Upstream) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for seen in up.seen() {
        if let Some(key) = seen.headers.get("idempotency-key") {
            let key = key.to_str().expect("ascii key").to_owned();
            *counts.entry(key).or_default() += 1;
        }
    }
    counts
}

/// A proxy on the file store that crashes at `point` handling key `k`.
struct Crashed {
    up: Upstream,
    _dir: tempfile::TempDir,
    file: TempConfig,
    at: Instant,
}

async fn crash(point: &str, fsync: bool) -> Crashed {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = TempConfig::new(&yaml(&up, &dir.path().join("keys"), fsync));
    let path = file.path().to_string_lossy().into_owned();
    let mut proxy =
        Running::start_with_env(&["--config", &path], &[("IDEMGATE_CRASH_AT", point)]).await;
    let answer = post_raw(proxy.addr, "k").await;
    let status = proxy.wait_exit().await;
    let at = Instant::now();
    assert!(
        !status.success(),
        "crashed at {point} ({status}): {answer:?}"
    );
    assert!(answer.is_empty(), "nothing was answered: {answer:?}");
    Crashed {
        up,
        _dir: dir,
        file,
        at,
    }
}

impl Crashed {
    async fn restart(&self) -> (Running, TestClient) {
        let path = self.file.path().to_string_lossy().into_owned();
        let running = Running::start(&["--config", &path]).await;
        let client = TestClient::new(running.addr);
        (running, client)
    }

    /// While the crashed claim's lease may still run, a retry must be told to wait.
    async fn expect_in_flight_while_the_lease_runs(&self, c: &TestClient) {
        let early = c.post("/charges", "k", "{}").await;
        if self.at.elapsed() < LEASE - Duration::from_millis(300) {
            assert_eq!(early.status, 409, "{}", early.text());
            assert_eq!(early.problem(), "in-flight");
        }
    }

    /// Past the lease, on the wall clock across the restart.
    async fn after_the_lease(&self) {
        if let Some(left) = LEASE.checked_sub(self.at.elapsed()) {
            // The lease is the behaviour under test: let it run out.
            tokio::time::sleep(left + Duration::from_millis(50)).await;
        }
    }
}

/// A claim whose write fails in its flush, after its bytes were written to the journal:
/// the request is refused (503) and never forwarded, and the store cuts the write off
/// the journal and loads its shards again from what is on disk, so the marker is gone
/// before anyone reads it: a retry executes at once instead of waiting out a lease
/// nobody holds and then turning `outcome-unknown`.
#[tokio::test]
async fn a_claim_whose_flush_failed_is_refused_and_its_marker_does_not_hold_the_retry() {
    a_failed_claim_is_refused_and_its_retry_executes(true).await;
}

/// The same without `fsync`, where the request's own task writes the journal (not the
/// writer thread) and so is the one that finds the write failed and loads the store
/// again.
#[tokio::test]
async fn without_fsync_a_claim_whose_write_failed_is_refused_and_its_retry_executes() {
    a_failed_claim_is_refused_and_its_retry_executes(false).await;
}

/// idemgate on a file store in `dir` whose flushes fail at the hits `fail_at` lists
/// (`IDEMGATE_FAIL_AT`); the config goes with it.
async fn failing_at(
    up: &Upstream,
    dir: &Path,
    fsync: bool,
    fail_at: &str,
) -> (Running, TempConfig) {
    let file = TempConfig::new(&yaml(up, &dir.join("keys"), fsync));
    let path = file.path().to_string_lossy().into_owned();
    let proxy =
        Running::start_with_env(&["--config", &path], &[("IDEMGATE_FAIL_AT", fail_at)]).await;
    (proxy, file)
}

async fn a_failed_claim_is_refused_and_its_retry_executes(fsync: bool) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (proxy, _file) = failing_at(&up, dir.path(), fsync, "during-flush@1").await;
    let c = TestClient::new(proxy.addr);
    let refused = c.post("/charges", "k", "{}").await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.problem(), "store-unavailable");
    assert_eq!(up.count(), 0, "a refused claim is never forwarded");

    let retry = c.post("/charges", "k", "{}").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(!retry.replayed());
    assert!(c.post("/charges", "k", "{}").await.replayed());
    assert_eq!(up.count(), 1);
}

/// A failed write takes only the changes not yet on disk: the record written before it
/// stays and replays, and the refused key executes on its retry.
///
/// Flushes: 1 the first claim, 2 its record, 3 the second claim (fails).
#[tokio::test]
async fn a_failed_write_keeps_what_was_written_before_it() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (proxy, _file) = failing_at(&up, dir.path(), true, "during-flush@3").await;
    let c = TestClient::new(proxy.addr);
    let first = c.post("/charges", "first", "{}").await;
    assert_eq!(first.status, 201, "{}", first.text());
    let refused = c.post("/charges", "second", "{}").await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(up.count(), 1, "the refused claim was not forwarded");

    let again = c.post("/charges", "first", "{}").await;
    assert!(again.replayed(), "{} {}", again.status, again.text());
    assert_eq!(again.body, first.body);
    let retry = c.post("/charges", "second", "{}").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(!retry.replayed());
    assert_eq!(up.count(), 2, "each key executed once");
}

#[tokio::test]
async fn killed_after_claiming_the_marker_survives_the_restart_and_turns_outcome_unknown() {
    let crashed = crash("after-claim", true).await;
    assert_eq!(crashed.up.count(), 0);
    let (_proxy, c) = crashed.restart().await;
    crashed.expect_in_flight_while_the_lease_runs(&c).await;
    crashed.after_the_lease().await;
    let late = c.post("/charges", "k", "{}").await;
    assert_eq!(late.status, 502, "{}", late.text());
    assert_eq!(late.problem(), "outcome-unknown");
    assert!(late.replayed());
    assert_eq!(
        crashed.up.count(),
        0,
        "a marker is never executed by a retry"
    );
}

#[tokio::test]
async fn killed_after_forwarding_a_retry_after_the_restart_gets_outcome_unknown_never_a_second_execution()
 {
    let crashed = crash("after-forward", true).await;
    assert_eq!(crashed.up.count(), 1);
    let (_proxy, c) = crashed.restart().await;
    crashed.expect_in_flight_while_the_lease_runs(&c).await;
    crashed.after_the_lease().await;
    let late = c.post("/charges", "k", "{}").await;
    assert_eq!(late.status, 502, "{}", late.text());
    assert_eq!(late.problem(), "outcome-unknown");
    let again = c.post("/charges", "k", "{}").await;
    assert_eq!(again.body, late.body, "the outcome is recorded");
    assert_eq!(crashed.up.count(), 1);
}

#[tokio::test]
async fn killed_after_recording_the_retry_replays_at_once_after_the_restart() {
    for fsync in [true, false] {
        let crashed = crash("after-record", fsync).await;
        let (_proxy, c) = crashed.restart().await;
        let r = c.post("/charges", "k", "{}").await;
        assert_eq!(r.status, 201, "fsync {fsync}: {}", r.text());
        assert!(r.replayed());
        assert_eq!(r.json()["execution"], 1);
        assert_eq!(crashed.up.count(), 1);
    }
}

/// The claim's commit is being flushed when the process dies: either the marker made
/// it (the retry waits out the lease, then outcome-unknown) or it did not (the request
/// was never forwarded, and the retry executes it once). Never twice.
#[tokio::test]
async fn killed_during_the_claims_flush_the_key_executes_at_most_once() {
    for fsync in [true, false] {
        let crashed = crash("during-flush", fsync).await;
        assert_eq!(crashed.up.count(), 0, "killed before forwarding");
        let (_proxy, c) = crashed.restart().await;
        crashed.after_the_lease().await;
        let retry = c.post("/charges", "k", "{}").await;
        match retry.status.as_u16() {
            201 => assert!(!retry.replayed(), "first execution: {}", retry.text()),
            502 => assert_eq!(retry.problem(), "outcome-unknown"),
            other => panic!("fsync {fsync}: {other} {}", retry.text()),
        }
        let again = c.post("/charges", "k", "{}").await;
        assert_eq!(again.status, retry.status);
        assert!(again.replayed());
        assert!(crashed.up.count() <= 1, "fsync {fsync}: executed twice");
    }
}

/// The record's commit is being flushed when the process dies (the second flush of the
/// only request: the first was its claim's). The upstream executed it; after the restart
/// the retry replays the record if it made it to disk, or finds the marker and, once the
/// lease has ended, gets `outcome-unknown`. Never a second execution.
#[tokio::test]
async fn killed_during_the_records_flush_the_key_is_never_executed_again() {
    for fsync in [true, false] {
        let crashed = crash("during-flush@2", fsync).await;
        assert_eq!(
            crashed.up.count(),
            1,
            "killed after forwarding, while recording"
        );
        let (_proxy, c) = crashed.restart().await;
        crashed.after_the_lease().await;
        let retry = c.post("/charges", "k", "{}").await;
        match retry.status.as_u16() {
            201 => {
                assert!(retry.replayed(), "the record: {}", retry.text());
                assert_eq!(retry.json()["execution"], 1);
            }
            502 => assert_eq!(retry.problem(), "outcome-unknown"),
            other => panic!("fsync {fsync}: {other} {}", retry.text()),
        }
        let again = c.post("/charges", "k", "{}").await;
        assert_eq!(again.status, retry.status);
        assert!(again.replayed());
        assert_eq!(crashed.up.count(), 1, "fsync {fsync}: executed twice");
    }
}

/// Rounds of concurrent requests (fresh keys and keys of earlier rounds) against a
/// proxy that is killed at a random moment, or aborts at a random crash point; all on
/// one store directory. Afterwards every key resolves to a recorded answer, and no key
/// reached the upstream twice.
#[tokio::test]
async fn a_randomized_crash_loop_never_executes_a_key_twice() {
    // 200 rounds take about 11 s here; `IDEMGATE_CRASH_ROUNDS=N` for a longer run.
    let rounds: usize = std::env::var("IDEMGATE_CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    const REQUESTS: usize = 16;
    const POINTS: [&str; 7] = [
        "",
        "after-claim",
        "after-forward",
        "after-record",
        "during-flush",
        "during-flush@2",
        "during-flush@5",
    ];
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let fsync = rng.bool();
    let file = TempConfig::new(&yaml(&up, &dir.path().join("keys"), fsync));
    let path = file.path().to_string_lossy().into_owned();
    let mut keys: Vec<String> = Vec::new();
    for round in 0..rounds {
        let point = POINTS[rng.usize(..POINTS.len())];
        let env: &[(&str, &str)] = if point.is_empty() {
            &[]
        } else {
            &[("IDEMGATE_CRASH_AT", point)]
        };
        let mut proxy = Running::start_with_env(&["--config", &path], env).await;
        let batch: Vec<String> = (0..REQUESTS)
            .map(|i| {
                if !keys.is_empty() && rng.u8(..4) == 0 {
                    keys[rng.usize(..keys.len())].clone()
                } else {
                    format!("r{round}-{i}")
                }
            })
            .collect();
        keys.extend(batch.iter().cloned());
        let addr = proxy.addr;
        let sent: Vec<_> = batch
            .into_iter()
            .map(|key| tokio::spawn(async move { post_raw(addr, &key).await }))
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.u64(0..40))).await;
        proxy.kill().await;
        for answer in sent {
            let _ = answer.await;
        }
        let _ = proxy.wait_exit().await;
    }
    keys.sort();
    keys.dedup();

    let proxy = Running::start(&["--config", &path]).await;
    let c = TestClient::new(proxy.addr);
    // Markers left by the last crash end their lease on the wall clock.
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    for key in &keys {
        let r = c.post("/charges", key, "{}").await;
        match r.status.as_u16() {
            201 => {}
            502 => assert_eq!(r.problem(), "outcome-unknown", "key {key}"),
            other => panic!("seed {seed}, key {key}: {other} {}", r.text()),
        }
        let again = c.post("/charges", key, "{}").await;
        assert!(again.replayed(), "seed {seed}, key {key}: {}", again.text());
        assert_eq!(again.body, r.body, "seed {seed}, key {key}");
    }
    let duplicates: Vec<_> = executions(&up)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert_eq!(duplicates, [], "seed {seed}: keys executed more than once");
    report(&format!(
        "{rounds} crash rounds (fsync: {fsync}), {} keys, {} executions, no key twice (seed {seed})",
        keys.len(),
        up.count()
    ));
    drop(proxy);
}

#[expect(
    clippy::print_stdout,
    reason = "the crash loop's figures are the test's report"
)]
fn report(line: &str) {
    println!("{line}");
}
