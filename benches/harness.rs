//! The benchmark harness of issue 6: idemgate next to a plain reverse proxy.
//!
//! `cargo bench --bench harness -- [--duration SECS] [--concurrency N] [--smoke]`
//! `cargo bench --bench harness -- --scenarios slow,miss [--duration SECS]`
//! `cargo bench --features alloc-stats --bench harness -- --account [--targets memory,redis]`
//! `cargo bench --bench harness -- --low-load-only [--duration SECS]`
//! `cargo bench --bench harness -- --memory [--entries N] [--duration SECS]`
//! `cargo bench --bench harness -- --disk [--ttl SECS] [--nosync] [--duration SECS]`
//! `cargo bench --bench harness -- --seal [--rounds N] [--seal-ops N]`
//!
//! Starts, all on 127.0.0.1 free ports: an upstream (in this process), the baseline
//! plain proxy (this binary again, `--plain-proxy`), idemgate on the memory store, on
//! a redis-server of its own and on the file store (with and without fsync, in the
//! harness's temp dir), and nginx when it is on `PATH`; with `--targets`, also the
//! file store of another binary, Redis with a replica, the memory and Redis stores with
//! `store.encryption` (`memory-enc`, `redis-enc`), and the memory store scoped by the
//! principal of a bearer JWT whose keys and tokens are made at start (`memory-jwt-rs256`,
//! `memory-jwt-es256`; docs/behaviour.md §17), the PostgreSQL store on a throwaway
//! cluster of its own, with and without synchronous commit (`postgres`,
//! `postgres-async`; docs/behaviour.md §22), and a valkey-server of its own, natively
//! fenced (`valkey`; docs/behaviour.md §23). It then drives each target
//! in turn with the load generator and prints requests/s, p50 and p99 as ratios to the
//! baseline measured in the same run, Redis commands, PostgreSQL statements and file-store
//! flushes per request, the store server's CPU per request, and the targets of issues 6
//! and 12, of issue 27 (encryption and a JWT principal against the same store without
//! them) and of issue 39 (PostgreSQL). Unless `--concurrency` is given, a second pass
//! then measures every (target, scenario) again at low load: one keep-alive connection,
//! one request at a time, the baseline again right before each scenario's targets; its
//! table gives p50 as microseconds above the baseline's, for the targets of issues 16 and
//! 29, and
//! for a Redis target also in Redis round trips, which the harness measures itself right
//! before the scenario's Redis targets (a `PING` loop on one connection; issue 29).
//! Every row records the target process's RSS at the end of its window.
//!
//! The `slow` scenario (opt-in, `--scenarios slow`; issue 29) is a `miss` whose upstream
//! answers after 20 ms (the request header `x-bench-delay-ms`, which only the harness's
//! upstream honours), at 256 connections whatever `--concurrency` says, in the main pass
//! only; its table gives req/s, p50, p99 against the baseline's and the target's RSS. A
//! smoke run includes it, at 8 connections and 2 ms.
//!
//! `--account` (issue 29) also counts, in each measured window, the target process's
//! syscalls by kind (`perf stat` on the `syscalls:sys_enter_*` tracepoints, as root) and,
//! in a build with the feature `alloc-stats`, its allocations and allocated bytes
//! (idemgate's `/metrics`; the plain proxy answers `GET /-/alloc-stats` itself), per
//! request, and prints them after each round with each idemgate row's difference from
//! the plain proxy's. The counting inflates CPU and latency, so such a run judges no
//! target.
//!
//! `--memory` measures instead the memory store's footprint at `max_entries` with 1 KiB
//! responses, and whether idemgate's RSS stays flat once it is full. See BENCHMARKS.md.
//!
//! # Layout
//!
//! - [`args`]: the usage text and the arguments.
//! - `harness.rs`: the run plan (start targets, measure each scenario in
//!   each pass: the main one, then one connection).
//! - [`servers`]: the upstream (with the `slow` scenario's delay) and the baseline plain
//!   proxy (with its allocation totals under `alloc-stats`).
//! - [`targets`]: starting the targets; one measured (target, scenario).
//! - [`account`]: `--account`: syscalls by kind (perf) and allocations per request, and
//!   their tables.
//! - [`principal`]: the JWT targets' key pairs, JWK sets and tokens (through `jwt`, the
//!   integration tests' helpers).
//! - [`cpu`]: CPU time per request, the machine's other load and a process's RSS, from
//!   `/proc`.
//! - [`load`]: the load generator and its latency histogram.
//! - [`memory`]: the memory mode (footprint per entry, RSS over a long `miss` run).
//! - [`disk`]: the disk mode (the file store's directory under fresh keys, short ttl).
//! - [`seal`]: the seal mode (ns per seal and per open of a 1 KiB record; issue 41).
//! - [`procs`]: child processes with stop-on-drop guards, configs, Redis counters and
//!   round trips, `/metrics`.
//! - [`postgres`]: the throwaway PostgreSQL cluster, and its statement and WAL counters.
//! - [`report`]: the tables and the correctness checks.
//! - [`goals`]: the targets of issues 6, 12, 16, 27, 29, 39 and 41, PASS or FAIL (informational);
//!   issue 16's context-switch targets are shown as withdrawn by issue 29.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark reports on the terminal"
)]

// A crate root finds its modules next to itself; these live in `benches/harness/`.
#[path = "harness/account.rs"]
mod account;
#[path = "harness/args.rs"]
mod args;
#[path = "harness/cpu.rs"]
mod cpu;
#[path = "harness/disk.rs"]
mod disk;
#[path = "harness/goals.rs"]
mod goals;
// The integration tests' key pairs, tokens and JWK sets, for the `memory-jwt-*` targets
// (benches build with the dev-dependencies); the tests' HTTPS identity provider is unused.
#[path = "../tests/it/support/jwt.rs"]
#[allow(dead_code, unreachable_pub)]
mod jwt;
#[path = "harness/load.rs"]
mod load;
#[path = "harness/memory.rs"]
mod memory;
#[path = "harness/open.rs"]
mod open;
#[path = "harness/postgres.rs"]
mod postgres;
#[path = "harness/principal.rs"]
mod principal;
#[path = "harness/procs.rs"]
mod procs;
#[path = "harness/report.rs"]
mod report;
#[path = "harness/seal.rs"]
mod seal;
#[path = "harness/servers.rs"]
mod servers;
#[path = "harness/targets.rs"]
mod targets;

use std::process::ExitCode;
use std::time::Instant;

use args::{Args, Pass, USAGE};
use procs::{Proc, TempDir};
use report::Row;
use targets::{Started, Target};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetKind {
    Baseline,
    Memory,
    /// The memory store with `store.encryption` (docs/behaviour.md §17).
    MemoryEnc,
    /// The memory store, scoped by the principal of an RS256 JWT (docs/behaviour.md §17).
    MemoryJwtRs256,
    /// The same with an ES256 JWT.
    MemoryJwtEs256,
    /// The memory store scoped by the raw `Authorization` header (the default), sent the
    /// RS256 JWTs: what the JWT targets cost beyond the bytes of their tokens.
    MemoryJwtRaw,
    /// The memory store with `telemetry.otlp` (`sample_ratio: 1.0`) exporting every
    /// request's spans to a sink in the harness (docs/behaviour.md §20): what traces cost.
    MemoryOtlp,
    /// The same with `sample_ratio: 0.1`: one trace in ten exported (issue 41).
    MemoryOtlpTenth,
    /// The memory store with `replay_authorization: {path: /auth/check}` on the same
    /// upstream (docs/behaviour.md §24): what a check before every replay costs.
    MemoryAuthz,
    Redis,
    /// Redis with `store.encryption`, on the same redis-server under another `key_prefix`.
    RedisEnc,
    /// Redis with a replica and `store.min_replicas: 1` (docs/behaviour.md §14).
    RedisReplica,
    /// A valkey-server of its own, where the complete and the release are Valkey's own
    /// compare-and-set commands instead of scripts (docs/behaviour.md §23; issue 41).
    Valkey,
    /// The file store with `fsync: true` (docs/behaviour.md §12).
    File,
    /// The file store with `fsync: false`.
    FileNoSync,
    /// The file store of another idemgate binary (`IDEMGATE_OTHER_BIN`), with `fsync:
    /// true`: two engines compared on the same run.
    OtherFile,
    /// The same with `fsync: false`.
    OtherFileNoSync,
    /// The PostgreSQL store on a database of the harness's cluster, whose commits wait
    /// for the WAL flush (`synchronous_commit = on`; docs/behaviour.md §22).
    Postgres,
    /// The same on a database with `synchronous_commit = off`.
    PostgresAsync,
    Nginx,
}

impl TargetKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            TargetKind::Baseline => "plain-proxy",
            TargetKind::Memory => "idemgate-memory",
            TargetKind::MemoryEnc => "idemgate-memory-enc",
            TargetKind::MemoryJwtRs256 => "idemgate-memory-jwt-rs256",
            TargetKind::MemoryJwtEs256 => "idemgate-memory-jwt-es256",
            TargetKind::MemoryJwtRaw => "idemgate-memory-jwt-raw",
            TargetKind::MemoryOtlp => "idemgate-memory-otlp",
            TargetKind::MemoryOtlpTenth => "idemgate-memory-otlp-0.1",
            TargetKind::MemoryAuthz => "idemgate-memory-authz",
            TargetKind::Redis => "idemgate-redis",
            TargetKind::RedisEnc => "idemgate-redis-enc",
            TargetKind::RedisReplica => "idemgate-redis-replica",
            TargetKind::Valkey => "idemgate-valkey",
            TargetKind::File => "idemgate-file",
            TargetKind::FileNoSync => "idemgate-file-nosync",
            TargetKind::OtherFile => "other-file",
            TargetKind::OtherFileNoSync => "other-file-nosync",
            TargetKind::Postgres => "idemgate-postgres",
            TargetKind::PostgresAsync => "idemgate-postgres-async",
            TargetKind::Nginx => "nginx",
        }
    }

    /// A file-store target, whose admin port serves the flush counters.
    fn is_file(self) -> bool {
        matches!(
            self,
            TargetKind::File
                | TargetKind::FileNoSync
                | TargetKind::OtherFile
                | TargetKind::OtherFileNoSync
        )
    }

    pub(crate) fn is_idemgate(self) -> bool {
        matches!(
            self,
            TargetKind::Memory
                | TargetKind::MemoryEnc
                | TargetKind::MemoryJwtRs256
                | TargetKind::MemoryJwtEs256
                | TargetKind::MemoryJwtRaw
                | TargetKind::MemoryOtlp
                | TargetKind::MemoryOtlpTenth
                | TargetKind::MemoryAuthz
                | TargetKind::Redis
                | TargetKind::RedisEnc
                | TargetKind::RedisReplica
                | TargetKind::Valkey
                | TargetKind::File
                | TargetKind::FileNoSync
                | TargetKind::OtherFile
                | TargetKind::OtherFileNoSync
                | TargetKind::Postgres
                | TargetKind::PostgresAsync
        )
    }
}

/// The request shape of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// `POST /unguarded`, no key: a route with `enabled: false`.
    Unguarded,
    /// `POST /charges` with a fresh key per request: claim, forward, record.
    Miss,
    /// `POST /charges` with one key, executed once before the run: every request replays.
    Hit,
    /// `POST /orders` with a fresh key in the JSON body (`key_from: [{json:
    /// /metadata/order_id}]`, `fingerprint_body: json`): a `miss` whose key and
    /// fingerprint come from the parsed body (docs/behaviour.md §9, §10).
    JsonKey,
    /// `POST /charges` with a fresh key per request, as `miss`, to an upstream that
    /// answers after 20 ms (`x-bench-delay-ms`), at 256 connections: a legacy API behind
    /// a sidecar (issue 29). Main pass only.
    Slow,
    /// `POST /documents` with a fresh key and an 8 MiB body over 8 connections: a `miss`
    /// whose body is streamed while hashed, under `stream_request_body`
    /// (docs/behaviour.md §19). Not in the default run: `--scenarios upload` asks for it.
    Upload,
}

impl Scenario {
    /// The scenarios a run measures unless `--scenarios` says otherwise (a smoke run:
    /// [`Scenario::ALL`]). `slow` is not among them: at 256 connections it adds about a
    /// minute to the default run.
    const DEFAULT: [Scenario; 4] = [
        Scenario::Unguarded,
        Scenario::Miss,
        Scenario::Hit,
        Scenario::JsonKey,
    ];

    /// What a smoke run measures: every scenario but `upload` (8 MiB bodies), `slow` at
    /// its small size.
    const SMOKE: [Scenario; 5] = [
        Scenario::Unguarded,
        Scenario::Miss,
        Scenario::Hit,
        Scenario::JsonKey,
        Scenario::Slow,
    ];

    /// Every scenario `--scenarios` knows.
    const KNOWN: [Scenario; 6] = [
        Scenario::Unguarded,
        Scenario::Miss,
        Scenario::Hit,
        Scenario::JsonKey,
        Scenario::Slow,
        Scenario::Upload,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Unguarded => "unguarded",
            Scenario::Miss => "miss",
            Scenario::Hit => "hit",
            Scenario::JsonKey => "json-key",
            Scenario::Slow => "slow",
            Scenario::Upload => "upload",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Scenario::Unguarded => "/unguarded",
            Scenario::Miss | Scenario::Hit | Scenario::Slow => "/charges",
            Scenario::JsonKey => "/orders",
            Scenario::Upload => "/documents",
        }
    }

    /// The request body: the small JSON of every scenario, or the upload's 8 MiB.
    fn body(self) -> bytes::Bytes {
        match self {
            Scenario::Upload => load::upload_body(),
            Scenario::Unguarded
            | Scenario::Miss
            | Scenario::Hit
            | Scenario::JsonKey
            | Scenario::Slow => bytes::Bytes::from_static(load::REQUEST_BODY.as_bytes()),
        }
    }

    /// The connections a scenario runs on whatever `--concurrency` says.
    fn concurrency(self) -> Option<usize> {
        match self {
            Scenario::Upload => Some(8),
            _ => None,
        }
    }

    /// Store round trips a request costs, top-level Redis commands or PostgreSQL
    /// statements: a replay one, a first execution two, a pass-through none
    /// (docs/behaviour.md §5, §22).
    pub(crate) fn round_trips(self) -> u64 {
        match self {
            Scenario::Unguarded => 0,
            Scenario::Miss | Scenario::JsonKey | Scenario::Slow | Scenario::Upload => 2,
            Scenario::Hit => 1,
        }
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = argv.iter().position(|a| a == "--plain-proxy") {
        return match (argv.get(i + 1), argv.get(i + 2)) {
            (Some(listen), Some(upstream)) => servers::plain_proxy_main(listen, upstream),
            _ => {
                eprintln!("{USAGE}");
                ExitCode::FAILURE
            }
        };
    }
    let args = match args::parse(&argv) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("harness: {err}\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("harness: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    // On SIGINT or SIGTERM the bench future is dropped, and with it every process guard.
    let result = runtime.block_on(async {
        tokio::select! {
            result = bench(&args) => result,
            signal = interrupted() => Err(format!("stopped by {signal}").into()),
        }
    });
    // Stops the upstream and any load task left behind by an error.
    drop(runtime);
    let took = started.elapsed().as_secs_f64();
    match result {
        Ok(true) => {
            println!("\nharness: ok in {took:.1} s");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("\nharness: FAILED (see the problems above), {took:.1} s");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("\nharness: error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGINT or SIGTERM with the signal's name.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// Starts everything, measures every (scenario, target) in sequence, prints the report.
/// `Ok(false)`: it ran, but some check failed.
async fn bench(args: &Args) -> Result<bool, BoxError> {
    if args.smoke {
        load::self_check()?;
        account::self_check()?;
    }
    if args.memory {
        return memory::run(&args::memory_plan(args)).await;
    }
    if args.disk {
        return disk::run(&args::disk_plan(args)).await;
    }
    if let Some(records) = args.open {
        return open::run(records).await;
    }
    if args.seal {
        return seal::run(args::seal_plan(args));
    }
    // Dropped last: the processes below write their logs into it until they stop.
    let dir = TempDir::new()?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let upstream = listener.local_addr()?;
    tokio::spawn(servers::upstream(
        listener,
        bytes::Bytes::from_static(servers::RESPONSE_BODY.as_bytes()),
    ));

    let Started {
        mut procs,
        targets,
        mut notes,
        idemgate,
        redis_server,
        valkey_server,
        nginx,
        postgres,
    } = targets::start(
        dir.path(),
        upstream,
        &args.targets,
        &args.log_level,
        (
            args.scenarios.contains(&Scenario::JsonKey),
            args.scenarios.contains(&Scenario::Upload),
        ),
        args.account,
    )
    .await?;
    // --account: perf (and its holder), and whether every target's allocations can be read.
    let counting = if args.account {
        let counting = account::Counting::start(dir.path()).await;
        notes.extend(counting.note());
        for target in &targets {
            notes.extend(account::probe(target.kind, target.alloc).await);
        }
        Some(counting)
    } else {
        None
    };

    report::machine(
        &idemgate,
        redis_server.as_deref(),
        valkey_server.as_deref(),
        nginx.as_deref(),
        postgres.as_deref(),
    );
    let passes: Vec<String> = [args.main_pass(), args.low_load]
        .into_iter()
        .flatten()
        .map(|pass| {
            format!(
                "{} keep-alive connection{}, {:.2} s warm-up + {:.2} s measured per run",
                pass.concurrency,
                if pass.concurrency == 1 { "" } else { "s" },
                pass.warmup.as_secs_f64(),
                pass.duration.as_secs_f64(),
            )
        })
        .collect();
    println!(
        "load: rust generator (wrk is not used), {}; request body {} B, response body {} B",
        passes.join("; then "),
        load::REQUEST_BODY.len(),
        servers::RESPONSE_BODY.len(),
    );
    println!(
        "upstream: {upstream} (in the harness process); idemgate log.level {}",
        args.log_level
    );
    for proc in &procs {
        println!("started: {} pid {}", proc.name, proc.pid());
    }
    for note in &notes {
        println!("note: {note}");
    }
    if args.account {
        println!(
            "account: syscalls (perf stat) and allocations of each target process, per request; the counting inflates CPU and latency, so this run's timings are not for the targets"
        );
    }
    println!();

    // Every run gets keys no other run used, even against a long-lived Redis.
    let nonce = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    );
    // The harness itself (load generator and upstream) and every process started.
    let watched: Vec<cpu::Watched> = std::iter::once(cpu::Watched {
        pid: std::process::id(),
        tree: false,
    })
    .chain(procs.iter().map(|p| cpu::Watched {
        pid: p.pid(),
        // nginx works in its workers, PostgreSQL in its backends and background processes.
        tree: p.name == "nginx" || p.name == postgres::PROC_NAME,
    }))
    .collect();
    let rounds = args.rounds;
    let judge = !args.smoke && !args.account;
    let heading = |round: usize| {
        if rounds > 1 {
            println!("round {} of {rounds}", round + 1);
        }
    };
    let mut main = Vec::new();
    if let Some(pass) = args.main_pass() {
        for round in 0..rounds {
            heading(round);
            let rows = run_pass(
                pass,
                &targets,
                &args.scenarios,
                &round_nonce(&nonce, round),
                &watched,
                &mut procs,
                counting.as_ref(),
            )
            .await?;
            println!();
            report::summary(&rows, &notes);
            println!();
            if let Some(slow) = pass.slow
                && rows.iter().any(|r| r.scenario() == Scenario::Slow)
            {
                report::slow(&rows, slow);
                println!();
            }
            if counting.is_some() {
                account::report(&rows);
            }
            main.push(rows);
        }
        // A smoke run judges correctness only: targets need real durations; an account
        // run's timings are inflated by the counting.
        if judge {
            goals::issues_6_and_12(&main);
            goals::issue_27(&main);
            goals::issue_31(&main);
            goals::issue_39(&main);
            goals::issue_41_main(&main);
            if args.scenarios.contains(&Scenario::Upload) {
                goals::issue_30(&main);
            }
        }
    }
    // Issue 16: the same runs at one connection, where latency is a request's own cost
    // and not queueing behind the other connections.
    let mut low = Vec::new();
    if let Some(pass) = args.low_load {
        if !main.is_empty() {
            println!();
        }
        println!("low load: one connection, closed loop (one request at a time)");
        for round in 0..rounds {
            heading(round);
            // Keys of their own: the main pass's `hit` key is already executed, and its
            // `miss` keys would repeat.
            let nonce = format!("{}-1c", round_nonce(&nonce, round));
            let rows = run_pass(
                pass,
                &targets,
                &args.scenarios,
                &nonce,
                &watched,
                &mut procs,
                counting.as_ref(),
            )
            .await?;
            println!();
            report::low_load(&rows);
            println!();
            if counting.is_some() {
                account::report(&rows);
            }
            low.push(rows);
        }
    }
    // Ends perf's holder: while it runs, every syscall on the machine takes the traced
    // path (other tenants' too).
    drop(counting);
    if judge {
        goals::issue_16(&main, &low);
        goals::issue_29(&main, &low);
        goals::issue_41_one_connection(&low);
    } else if args.account && !args.smoke {
        println!(
            "\ntargets not judged: an --account run's CPU and latency are inflated by the counting"
        );
    }
    let rows: Vec<Row> = main.into_iter().flatten().collect();
    let low: Vec<Row> = low.into_iter().flatten().collect();
    let ok = report::problems(&rows, &low, args.smoke, redis_server.is_some());
    if !args.smoke {
        return Ok(ok);
    }
    // The smoke run also checks that the memory mode runs, at a small size.
    drop(procs);
    println!("\nmemory mode, smoke size:");
    let memory_ok = memory::run(&args::memory_plan(args)).await?;
    println!("\ndisk mode, smoke size:");
    let disk_ok = disk::run(&args::disk_plan(args)).await?;
    println!("\nseal mode, smoke size:");
    let seal_ok = seal::run(args::seal_plan(args))?;
    Ok(ok && memory_ok && disk_ok && seal_ok)
}

/// The keys of one round: none repeats another round's.
fn round_nonce(nonce: &str, round: usize) -> String {
    if round == 0 {
        nonce.to_owned()
    } else {
        format!("{nonce}-r{round}")
    }
}

/// Measures every (scenario, target) in sequence, printing a line after each run. The
/// baseline comes first among the targets, so it runs right before each scenario's others.
/// `slow` runs only in a pass that has its load (not at one connection). In a pass that
/// measures Redis round trips (one connection), each redis-server's is measured right
/// before the first of the scenario's targets on it, with no other load.
async fn run_pass(
    pass: Pass,
    targets: &[Target],
    scenarios: &[Scenario],
    nonce: &str,
    watched: &[cpu::Watched],
    procs: &mut [Proc],
    counting: Option<&account::Counting>,
) -> Result<Vec<Row>, BoxError> {
    let mut rows = Vec::new();
    for &scenario in scenarios.iter().filter(|s| pass.runs(**s)) {
        // The round trip of each redis-server, this scenario: port -> µs (or why not).
        let mut rtts: Vec<(u16, Option<f64>)> = Vec::new();
        for &target in targets {
            let rtt = match (pass.redis_rtt, target.redis_port()) {
                (Some(duration), Some(port)) => match rtts.iter().find(|(p, _)| *p == port) {
                    Some((_, rtt)) => *rtt,
                    None => {
                        let rtt = match procs::redis_rtt(port, duration).await {
                            Ok(rtt) => Some(rtt),
                            Err(err) => {
                                println!("  redis round trip on port {port}: {err}");
                                None
                            }
                        };
                        rtts.push((port, rtt));
                        rtt
                    }
                },
                _ => None,
            };
            let mut row = target
                .measure(scenario, pass, nonce, watched, counting)
                .await;
            row.redis_rtt_us = rtt;
            alive(procs)?;
            report::progress(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// An error naming a started process that has exited, with its log.
fn alive(procs: &mut [Proc]) -> Result<(), String> {
    for proc in procs.iter_mut() {
        if let Some(status) = proc.exited() {
            return Err(format!(
                "{} exited during the run with {status}:\n{}",
                proc.name,
                proc.log_tail()
            ));
        }
    }
    Ok(())
}
