//! Failover at scale (issue 42; docs/behaviour.md §4 "At most once", §14, §22): three
//! real `idemgate` replicas share one store with replicas, in front of an upstream that
//! keeps its own ledger of executions; a pool of clients sends fresh keys and retries
//! each with the same key until a definitive answer (`load.rs`), while the store's
//! master or primary is killed with SIGKILL several times at random moments, a replica
//! promoted and the old node brought back as a replica each time (`topology.rs`), and
//! one idemgate replica is paused (SIGSTOP) past its lease once. Then every key is sent
//! once more, as a client whose answer was lost would, and the ledger is read
//! (`figures.rs`): keys executed twice, keys without a definitive answer, records lost,
//! the unavailability window of each failover, latencies.
//!
//! The CI-sized runs below assert what the configurations promise: with `min_replicas:
//! 1` (Sentinel) and a synchronous PostgreSQL standby no key executes twice, and no
//! configuration wedges a replica. Redis Cluster refuses `min_replicas` (config), so its
//! run has none. `scripts/chaos.sh` runs the full-size run, [`from_the_command_line`],
//! with its flags in `IDEMGATE_CHAOS_*` variables.

mod figures;
mod load;
mod topology;

use crate::support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use figures::{Failover, Figures};
use load::Pass;
use support::bin::{Running, TempConfig};
use support::chaos::{ChaosUpstream, XorShift};
use topology::{Kind, Topology};

/// idemgate's lease: how long a paused replica's claims hold their keys.
const LEASE: Duration = Duration::from_secs(2);
/// The upstream takes up to this long per execution.
const UPSTREAM_DELAY: Duration = Duration::from_millis(10);
/// How long the replica is paused: past its lease.
const PAUSE: Duration = Duration::from_secs(3);

/// What a run does.
#[derive(Debug, Clone)]
struct Settings {
    kind: Kind,
    min_replicas: u32,
    async_standby: bool,
    keys: usize,
    failovers: usize,
    workers: usize,
    seed: u64,
    /// The whole run, both passes, ends within this or fails.
    limit: Duration,
}

impl Settings {
    /// The CI-sized run: a few hundred keys, two failovers.
    fn quick(kind: Kind) -> Settings {
        Settings {
            kind,
            min_replicas: u32::from(kind == Kind::Sentinel),
            async_standby: false,
            keys: 300,
            failovers: 2,
            workers: 12,
            seed: 0x5EED_0042,
            limit: Duration::from_secs(100),
        }
    }

    /// From `IDEMGATE_CHAOS_TOPOLOGY`, `_MIN_REPLICAS`, `_ASYNC_STANDBY`, `_KEYS`,
    /// `_FAILOVERS`, `_SEED` and `_QUICK` (what scripts/chaos.sh sets from its flags).
    fn from_env() -> Option<Settings> {
        let var = |name: &str| std::env::var(format!("IDEMGATE_CHAOS_{name}")).ok();
        let number = |name: &str| {
            var(name).map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|e| panic!("IDEMGATE_CHAOS_{name}={v}: {e}"))
            })
        };
        let kind = Kind::parse(&var("TOPOLOGY")?);
        let quick = var("QUICK").is_some_and(|v| v == "1");
        let mut s = Settings::quick(kind);
        if !quick {
            s.keys = 10_000;
            s.failovers = 5;
            s.workers = 32;
            s.limit = Duration::from_secs(20 * 60);
        }
        if let Some(n) = number("MIN_REPLICAS") {
            s.min_replicas = u32::try_from(n).expect("a small number");
        }
        s.async_standby = var("ASYNC_STANDBY").is_some_and(|v| v == "1");
        if let Some(n) = number("KEYS") {
            s.keys = usize::try_from(n).expect("a key count");
        }
        if let Some(n) = number("FAILOVERS") {
            s.failovers = usize::try_from(n).expect("a failover count");
        }
        if let Some(n) = number("SEED") {
            s.seed = n;
        }
        Some(s)
    }

    /// One fresh key per this long, so that the keys last about as long as the
    /// failovers take (each kill also waits for its share of keys to be sent).
    fn pace(&self) -> Duration {
        let cycle = match self.kind {
            Kind::Cluster => Duration::from_secs(12),
            Kind::Sentinel => Duration::from_secs(9),
            Kind::Postgres => Duration::from_secs(3),
        };
        let load = cycle * u32::try_from(self.failovers + 1).expect("a few") + PAUSE;
        load / u32::try_from(self.keys).expect("keys fit u32")
    }

    fn describe(&self) -> String {
        match self.kind {
            Kind::Postgres if self.async_standby => "postgres, asynchronous standby".to_owned(),
            Kind::Postgres => "postgres, synchronous standby".to_owned(),
            kind => format!("{}, min_replicas: {}", kind.name(), self.min_replicas),
        }
    }
}

/// What the run printed, and its figures.
struct Outcome {
    figures: Figures,
    json: String,
    logs: String,
}

async fn run(settings: Settings) -> Outcome {
    assert!(
        !(settings.kind == Kind::Cluster && settings.min_replicas > 0),
        "idemgate refuses min_replicas with a Redis Cluster (docs/configuration.md store.min_replicas)"
    );
    assert!(settings.failovers >= 1 && settings.keys >= 10 * (settings.failovers + 1));
    let started = Instant::now();
    let mut rng = XorShift::new(settings.seed, 1);
    let mut store = Topology::start(&settings).await;
    let upstream = ChaosUpstream::start(XorShift::new(settings.seed, 2), UPSTREAM_DELAY, 0).await;
    let yaml = format!(
        "upstream:\n  url: {}\n  timeout: 5s\n{}idempotency:\n  lease: {}ms\nadmin:\n  listen: null\nlog:\n  level: warn\n",
        upstream.url(),
        store.store_yaml(settings.min_replicas),
        LEASE.as_millis()
    );
    let file = TempConfig::new(&yaml);
    let config = file.path().to_string_lossy().into_owned();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Running::start(&["--config", &config]).await);
    }
    let addrs: Vec<_> = replicas.iter().map(|r| r.addr).collect();

    // Keys come in failovers + 1 segments; each failover releases the next.
    let segment = settings.keys / (settings.failovers + 1);
    let first = Pass::new(&addrs, settings.keys, segment, settings.pace());
    let load = first.run(settings.workers);
    let mut paused = None;
    let inject = async {
        let mut done = Vec::new();
        for j in 1..=settings.failovers {
            // At a random moment in the last half of the segment.
            let at = j * segment - segment / 2 + rng.below(segment as u64 / 2) as usize;
            while first.taken.load(Ordering::SeqCst) < at {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let (killed, what) = store.kill(&mut rng).await;
            first.allow((j + 1) * segment);
            let promoted = store.recover().await;
            done.push(Failover {
                what,
                killed,
                promoted,
                rejoined: Instant::now(),
            });
            if j == 1 {
                // Past its lease: its claims end while it sleeps, and its late records
                // are fenced off when it wakes.
                replicas[2].signal("STOP").await;
                let stopped = Instant::now();
                tokio::time::sleep(PAUSE).await;
                replicas[2].signal("CONT").await;
                paused = Some((stopped - started, first.taken.load(Ordering::SeqCst)));
                // Its orphaned claims end before the next kill, whose window they would
                // otherwise widen.
                tokio::time::sleep(LEASE).await;
            }
        }
        first.allow(settings.keys);
        done
    };
    let ((), failovers) =
        tokio::time::timeout(settings.limit, async { tokio::join!(load, inject) })
            .await
            .unwrap_or_else(|_| panic!("the load did not end within {:?}", settings.limit));
    // Claims of the paused replica and of killed masters end within a lease.
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    let second = Pass::new(&addrs, settings.keys, settings.keys, Duration::ZERO);
    let left = settings.limit.saturating_sub(started.elapsed());
    tokio::time::timeout(left, second.run(settings.workers))
        .await
        .unwrap_or_else(|_| panic!("the second pass did not end within {:?}", settings.limit));

    let figures = figures::measure(&first.logs(), &second.logs(), &upstream.log(), &failovers);
    let (table, json) = figures::render(&settings, &figures, started.elapsed());
    let timeline: Vec<String> = failovers
        .iter()
        .map(|f| {
            format!(
                "{} killed at {:.1}s, promoted +{} ms, back +{} ms",
                f.what,
                (f.killed - started).as_secs_f64(),
                (f.promoted - f.killed).as_millis(),
                (f.rejoined - f.killed).as_millis()
            )
        })
        .collect();
    let logs = format!(
        "{table}\nfailovers:\n  {}\n  replica 3 paused {PAUSE:?} at {paused:?} (time, keys taken)\nfindings:\n  {}\nreplica logs (tails):\n{}",
        timeline.join("\n  "),
        figures.findings.join("\n  "),
        replicas
            .iter()
            .map(|r| tail(&r.stderr()))
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    Outcome {
        figures,
        json,
        logs,
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

#[expect(clippy::print_stdout, reason = "the run's table is its report")]
fn print_report(outcome: &Outcome) {
    for line in outcome.logs.lines() {
        println!("chaos-scale| {line}");
    }
    println!("chaos-scale| {}", outcome.json);
}

/// Every key answered but those a paused replica or a killed master left
/// `outcome-unknown` (docs/behaviour.md §4 "Lease"), and every answer true.
fn assert_served(o: &Outcome) {
    let f = &o.figures;
    assert_eq!(f.failovers, 2, "{}", o.logs);
    assert_eq!(f.answered_unexecuted, 0, "{}", o.logs);
    assert_eq!(f.unexpected, 0, "{}", o.logs);
    assert_eq!(
        f.no_answer, f.outcome_unknown,
        "keys left without any answer: a replica wedged?\n{}",
        o.logs
    );
}

/// `scripts/chaos.sh` runs this with its flags in `IDEMGATE_CHAOS_*`; it prints the
/// table, then the JSON line last, each line prefixed `chaos-scale| `.
#[cfg(feature = "chaos-cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_command_line() {
    let settings = Settings::from_env().expect("IDEMGATE_CHAOS_TOPOLOGY is set");
    let outcome = run(settings).await;
    print_report(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_min_replicas_1_executes_no_key_twice_through_failovers() {
    let outcome = run(Settings::quick(Kind::Sentinel)).await;
    print_report(&outcome);
    assert_eq!(outcome.figures.executed_twice, 0, "{}", outcome.logs);
    assert_eq!(outcome.figures.records_lost, 0, "{}", outcome.logs);
    assert_served(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_with_a_synchronous_standby_executes_no_key_twice_through_failovers() {
    let outcome = run(Settings::quick(Kind::Postgres)).await;
    print_report(&outcome);
    assert_eq!(outcome.figures.executed_twice, 0, "{}", outcome.logs);
    assert_eq!(outcome.figures.records_lost, 0, "{}", outcome.logs);
    assert_served(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serves_every_key_again_through_shard_failovers() {
    let outcome = run(Settings::quick(Kind::Cluster)).await;
    print_report(&outcome);
    assert_served(&outcome);
}

#[test]
fn the_settings_come_from_the_environment_only_when_a_topology_is_named() {
    // Read-only: the test process's own variables are not changed here.
    if std::env::var_os("IDEMGATE_CHAOS_TOPOLOGY").is_none() {
        assert!(Settings::from_env().is_none());
    }
    let quick = Settings::quick(Kind::Sentinel);
    assert_eq!((quick.min_replicas, quick.failovers), (1, 2));
    assert_eq!(Settings::quick(Kind::Cluster).min_replicas, 0);
}
