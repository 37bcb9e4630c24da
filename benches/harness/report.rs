//! What the harness prints: the machine, one line per run, the table with ratios to the
//! baseline, the `slow` scenario's table with RSS, the low-load table with p50 above the
//! baseline's (and in Redis round trips), and every failed check. The targets are in
//! [`crate::goals`], the account of `--account` in [`crate::account`].

use std::path::Path;

use crate::account::Account;
use crate::args::SlowLoad;
use crate::cpu::{PerRequest, Rss, Usage};
use crate::load::Outcome;
use crate::postgres::PgUse;
use crate::procs;
use crate::{Scenario, TargetKind};

/// One measured (target, scenario).
#[derive(Debug)]
pub(crate) struct Row {
    target: TargetKind,
    scenario: Scenario,
    outcome: Outcome,
    redis: Option<RedisUse>,
    store: Option<StoreUse>,
    cpu: Cpu,
    /// Failed correctness checks.
    problems: Vec<String>,
    /// The target process's memory at the end of the measured window.
    pub(crate) rss: Option<Rss>,
    /// `--account`: its syscalls and allocations per request.
    pub(crate) account: Option<Account>,
    /// The low-load pass, a Redis target: the median Redis round trip the harness
    /// measured at one connection right before its scenario's Redis targets, in µs.
    pub(crate) redis_rtt_us: Option<f64>,
    /// A PostgreSQL target: what its database did, per request.
    pub(crate) postgres: Option<PgUse>,
}

/// What the Redis target sent to Redis during a run (warm-up included).
#[derive(Debug)]
pub(crate) struct RedisUse {
    /// Round trips per request: top-level commands, but those pipelined behind another.
    pub(crate) round_trips: f64,
    /// Commands the Lua scripts ran, per request.
    pub(crate) inside_scripts: f64,
    /// Top-level commands by name, e.g. `evalsha 123456`.
    pub(crate) commands: String,
}

/// What a file-store target flushed during a run (warm-up included), per request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreUse {
    /// Commits: each is one flush that concurrent requests share.
    pub(crate) flushes: f64,
    /// `fdatasync` calls (0 with `fsync: false`).
    pub(crate) fsyncs: f64,
}

/// Where the CPU went during the measured window, per measured request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpu {
    /// The target process (nginx: with its workers).
    pub(crate) proxy: PerRequest,
    /// The store's server: redis-server, or every process of the PostgreSQL cluster.
    pub(crate) server: Option<PerRequest>,
    /// The load generator and the upstream.
    pub(crate) harness: PerRequest,
    pub(crate) usage: Usage,
}

/// Other load above this many CPUs makes a run's ratios suspect.
const DISTURBED_CPUS: f64 = 0.10;

impl Row {
    pub(crate) fn new(
        target: TargetKind,
        scenario: Scenario,
        outcome: Outcome,
        redis: Option<RedisUse>,
        store: Option<StoreUse>,
        cpu: Cpu,
        mut problems: Vec<String>,
    ) -> Self {
        if outcome.measured == 0 {
            problems.push("no request completed in the measured window".to_owned());
        }
        if outcome.failures() > 0 {
            problems.push(format!(
                "{} failed requests ({} non-2xx, {} transport errors, {} with the wrong Idempotent-Replayed); first: {}",
                outcome.failures(),
                outcome.non_2xx,
                outcome.transport_errors,
                outcome.replay_mismatches,
                outcome.first_problem.as_deref().unwrap_or("?"),
            ));
        }
        if let Some(redis) = &redis {
            let want = scenario.round_trips();
            if redis.round_trips.round() as u64 != want {
                problems.push(format!(
                    "{:.2} Redis round trips per request ({}), want {want} (docs/behaviour.md §5)",
                    redis.round_trips,
                    if redis.commands.is_empty() {
                        "none"
                    } else {
                        &redis.commands
                    }
                ));
            }
        }
        Self {
            target,
            scenario,
            outcome,
            redis,
            store,
            cpu,
            problems,
            rss: None,
            account: None,
            redis_rtt_us: None,
            postgres: None,
        }
    }

    pub(crate) fn target(&self) -> TargetKind {
        self.target
    }

    pub(crate) fn scenario(&self) -> Scenario {
        self.scenario
    }

    pub(crate) fn rps(&self) -> f64 {
        self.outcome.rps()
    }

    /// The target process's CPU time per measured request, in µs.
    pub(crate) fn cpu_us(&self) -> f64 {
        self.cpu.proxy.cpu_us
    }

    /// The store server's CPU time per measured request (redis-server, or the whole
    /// PostgreSQL cluster), in µs; NaN without one.
    pub(crate) fn server_cpu_us(&self) -> f64 {
        self.cpu.server.map_or(f64::NAN, |r| r.cpu_us)
    }

    /// Store round trips per request: Redis's, or PostgreSQL statements; `None` for a
    /// target without a store server.
    fn store_round_trips(&self) -> Option<f64> {
        self.redis
            .as_ref()
            .map(|r| r.round_trips)
            .or(self.postgres.as_ref().map(|pg| pg.statements))
    }

    /// The target process's RSS at the end of the measured window, in MiB; NaN unknown.
    pub(crate) fn rss_mib(&self) -> f64 {
        self.rss.map_or(f64::NAN, |r| r.now_kib as f64 / 1024.0)
    }

    /// The Redis round trip measured before this row, in µs; NaN when none was.
    pub(crate) fn redis_rtt_us(&self) -> f64 {
        self.redis_rtt_us.unwrap_or(f64::NAN)
    }

    fn p50_ms(&self) -> f64 {
        self.outcome.latencies.quantile(0.50).as_secs_f64() * 1e3
    }

    pub(crate) fn p99_ms(&self) -> f64 {
        self.outcome.latencies.quantile(0.99).as_secs_f64() * 1e3
    }

    pub(crate) fn p50_us(&self) -> f64 {
        self.p50_ms() * 1e3
    }

    fn p99_us(&self) -> f64 {
        self.p99_ms() * 1e3
    }
}

/// The machine the numbers come from.
pub(crate) fn machine(
    idemgate: &Path,
    redis: Option<&Path>,
    valkey: Option<&Path>,
    nginx: Option<&Path>,
    postgres: Option<&Path>,
) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |text: &str, key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".to_owned(), |(_, v)| v.trim().to_owned())
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    println!("machine: nproc {nproc}, {}", field(&cpuinfo, "model name"));
    println!(
        "         memory {}, kernel {}",
        field(&meminfo, "MemTotal"),
        kernel.trim()
    );
    println!("idemgate: {}", idemgate.display());
    if let Some(redis) = redis {
        println!("redis: {}", procs::first_line(redis, &["--version"]));
    }
    if let Some(valkey) = valkey {
        println!("valkey: {}", procs::first_line(valkey, &["--version"]));
    }
    if let Some(nginx) = nginx {
        println!("nginx: {}", procs::first_line(nginx, &["-v"]));
    }
    if let Some(postgres) = postgres {
        println!("postgres: {}", procs::first_line(postgres, &["--version"]));
    }
}

/// One line as soon as a run ends.
pub(crate) fn progress(row: &Row) {
    println!(
        "  {:<25} {:<10} {:>7.0} req/s  p50 {:>6.3} ms  p99 {:>6.3} ms  proxy cpu {:>5.1} µs/req  other load {:.2} CPUs{}",
        row.target.name(),
        row.scenario.name(),
        row.outcome.rps(),
        row.p50_ms(),
        row.p99_ms(),
        row.cpu.proxy.cpu_us,
        row.cpu.usage.other_cpus,
        if row.problems.is_empty() {
            ""
        } else {
            "  FAILED"
        },
    );
}

/// One round of the main pass: its table and notes.
pub(crate) fn summary(rows: &[Row], notes: &[String]) {
    table(rows);
    println!();
    store_notes(rows);
    load_notes(rows);
    for note in notes {
        println!("note: {note}");
    }
}

/// The low-load pass (one connection): its table, p50 as microseconds above the
/// baseline's of the same scenario.
pub(crate) fn low_load(rows: &[Row]) {
    println!(
        "| target | scenario | req/s | p50 µs | p50 +µs vs base | p99 µs | proxy CPU µs/req | proxy ctx sw/req | server CPU µs/req | redis RTT µs | p50 + in RTTs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let Some(b) = base(rows, row.scenario) else {
            continue;
        };
        let rtt = row.redis_rtt_us.filter(|rtt| *rtt > 0.0);
        println!(
            "| {} | {} | {:.0} | {:.0} | {:+.0} | {:.0} | {:.1} | {:.3} | {} | {} | {} |",
            row.target.name(),
            row.scenario.name(),
            row.outcome.rps(),
            row.p50_us(),
            row.p50_us() - b.p50_us(),
            row.p99_us(),
            row.cpu.proxy.cpu_us,
            row.cpu.proxy.switches,
            row.cpu
                .server
                .map_or_else(|| "-".to_owned(), |r| format!("{:.1}", r.cpu_us)),
            rtt.map_or_else(|| "-".to_owned(), |rtt| format!("{rtt:.0}")),
            rtt.map_or_else(
                || "-".to_owned(),
                |rtt| format!("{:+.2}", (row.p50_us() - b.p50_us()) / rtt)
            ),
        );
    }
    println!();
    if rows.iter().any(|r| r.redis_rtt_us.is_some()) {
        println!(
            "redis RTT: the median PING round trip at one connection, measured by the harness right before the scenario's Redis targets with nothing else running; p50 + in RTTs = (p50 - base p50) / RTT"
        );
    }
    load_notes(rows);
}

/// The `slow` scenario of one round (main pass): rates, latency against the plain
/// proxy's, and each target's memory with 256 requests waiting on the upstream.
pub(crate) fn slow(rows: &[Row], load: SlowLoad) {
    let slow: Vec<&Row> = rows
        .iter()
        .filter(|r| r.scenario == Scenario::Slow)
        .collect();
    let Some(b) = base(rows, Scenario::Slow) else {
        return;
    };
    println!(
        "slow: a miss to an upstream that answers after {} ms, {} connections",
        load.delay_ms, load.concurrency
    );
    println!(
        "| target | req/s | × base | p50 ms | p99 ms | p99 - base p99 (ms) | RSS MiB | peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in slow {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:+.2} | {:.1} | {} |",
            row.target.name(),
            row.outcome.rps(),
            ratio(row.outcome.rps(), b.outcome.rps()),
            row.p50_ms(),
            row.p99_ms(),
            row.p99_ms() - b.p99_ms(),
            row.rss_mib(),
            row.rss.map_or_else(
                || "-".to_owned(),
                |r| format!("{:.1}", r.peak_kib as f64 / 1024.0)
            ),
        );
    }
    println!(
        "RSS: VmRSS of the target process at the end of the measured window; peak: its VmHWM, the most since it started (earlier scenarios included)"
    );
}

/// The baseline's row of `scenario` among `rows` (one pass).
pub(crate) fn base(rows: &[Row], scenario: Scenario) -> Option<&Row> {
    rows.iter()
        .find(|r| r.target == TargetKind::Baseline && r.scenario == scenario)
}

pub(crate) fn ratio(value: f64, of: f64) -> f64 {
    if of > 0.0 { value / of } else { f64::NAN }
}

fn table(rows: &[Row]) {
    println!(
        "| target | scenario | req/s | × base | p50 ms | × base | p99 ms | × base | proxy CPU µs/req | × base | proxy ctx sw/req | store round trips/req | server CPU µs/req | other load (CPUs) | RSS MiB |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let Some(b) = base(rows, row.scenario) else {
            continue;
        };
        let dash = || "-".to_owned();
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.3} | {:.2} | {:.3} | {:.2} | {:.1} | {:.2} | {:.3} | {} | {} | {:.2} | {:.1} |",
            row.target.name(),
            row.scenario.name(),
            row.outcome.rps(),
            ratio(row.outcome.rps(), b.outcome.rps()),
            row.p50_ms(),
            ratio(row.p50_ms(), b.p50_ms()),
            row.p99_ms(),
            ratio(row.p99_ms(), b.p99_ms()),
            row.cpu.proxy.cpu_us,
            ratio(row.cpu.proxy.cpu_us, b.cpu.proxy.cpu_us),
            row.cpu.proxy.switches,
            row.store_round_trips()
                .map_or_else(dash, |n| format!("{n:.2}")),
            row.cpu
                .server
                .map_or_else(dash, |r| format!("{:.1}", r.cpu_us)),
            row.cpu.usage.other_cpus,
            row.rss_mib(),
        );
    }
}

/// What Redis, PostgreSQL and the file store did per request.
fn store_notes(rows: &[Row]) {
    for row in rows {
        if let Some(redis) = &row.redis {
            println!(
                "{}, {}: top-level commands (each a round trip, but a pipelined getrange): {}; {:.2} more per request inside the scripts",
                row.target.name(),
                row.scenario.name(),
                if redis.commands.is_empty() {
                    "none"
                } else {
                    &redis.commands
                },
                redis.inside_scripts,
            );
        }
    }
    for row in rows {
        if let Some(pg) = &row.postgres {
            let syncs = pg.wal_syncs.map_or_else(
                || "WAL flushes not counted (no pg_stat_wal.wal_sync)".to_owned(),
                |(syncs, us)| {
                    format!(
                        "the cluster's WAL flushes {syncs:.3} and {us:.0} µs of them per request (pg_stat_wal, ±10 %)"
                    )
                },
            );
            println!(
                "{}, {}: {:.2} statements per request ({}), WAL {:.0} B per request, {syncs}",
                row.target.name(),
                row.scenario.name(),
                pg.statements,
                pg.by_statement,
                pg.wal_bytes,
            );
        }
    }
    for row in rows {
        if let Some(store) = &row.store {
            println!(
                "{}, {}: {:.3} flushes (commits) per request, {:.3} fdatasync calls per request",
                row.target.name(),
                row.scenario.name(),
                store.flushes,
                store.fsyncs,
            );
        }
    }
}

/// The harness's own CPU, and what else ran on the machine meanwhile.
fn load_notes(rows: &[Row]) {
    let harness: Vec<String> = rows
        .iter()
        .map(|r| format!("{:.0}", r.cpu.harness.cpu_us))
        .collect();
    println!(
        "the harness process (load generator + upstream), CPU µs/req, row by row: {}",
        harness.join(", ")
    );
    let steal = rows
        .iter()
        .map(|r| r.cpu.usage.steal_cpus)
        .fold(0.0, f64::max);
    if steal > 0.05 {
        println!("hypervisor steal: up to {steal:.2} CPUs during a run");
    }
    let disturbed: Vec<String> = rows
        .iter()
        .filter(|r| r.cpu.usage.other_cpus > DISTURBED_CPUS)
        .map(|r| format!("{} {}", r.target.name(), r.scenario.name()))
        .collect();
    if !disturbed.is_empty() {
        println!(
            "WARNING: other processes used more than {DISTURBED_CPUS} CPUs during: {}; their ratios are unreliable",
            disturbed.join(", ")
        );
    }
}

/// Prints every failed check of both passes; `true` when there is none.
pub(crate) fn problems(main: &[Row], low_load: &[Row], smoke: bool, have_redis: bool) -> bool {
    let mut ok = true;
    for (rows, pass) in [(main, ""), (low_load, " (one connection)")] {
        for row in rows {
            for problem in &row.problems {
                ok = false;
                eprintln!(
                    "PROBLEM {} {}{pass}: {problem}",
                    row.target.name(),
                    row.scenario.name()
                );
            }
        }
    }
    if smoke && !have_redis {
        ok = false;
        eprintln!("PROBLEM: the smoke run needs redis-server on PATH");
    }
    ok
}
