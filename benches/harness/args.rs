//! The harness's arguments: the usage text, the parsed [`Args`], and the plans of each
//! mode and pass they make.

use std::time::Duration;

use crate::{BoxError, Scenario, TargetKind, disk, memory, seal};

pub(crate) const USAGE: &str = "\
usage: cargo bench --bench harness -- [OPTIONS]
  --duration SECS     measured time per (target, scenario)      [10; smoke 0.2,
                      smoke with --account 0.5]
  --warmup SECS       unmeasured warm-up before each measure    [1; smoke 0.05]
  --concurrency N     keep-alive connections, one request each  [32; smoke 4]
                      (given, the low-load pass is skipped)
  --low-load-duration SECS
                      the low-load pass after the main one (one connection,
                      closed loop; issue 16): measured time     [5; smoke 0.05,
                      smoke with --account 0.3]
                      (there, a Redis target's row also gets a Redis round trip
                      that the harness measures right before it, a PING loop on
                      one connection for 1 s [smoke 0.05 s], and its p50 above
                      the base's in those round trips)
  --low-load-warmup SECS
                      its warm-up                               [1; smoke 0.02]
  --low-load-only     only the low-load pass (--duration and --warmup then set it)
  --no-low-load       skip the low-load pass
  --rounds N          run each pass N times over, every scenario's baseline next
                      to its targets each time; the targets are judged on the
                      median of the N rounds' values, with their range   [1]
  --smoke             a ~3 s run of everything that exits non-zero on any failure
                      (also what `cargo test --benches` runs: no arguments at all);
                      its scenarios include slow
  --targets LIST      subset of memory,redis,file,file-nosync,nginx (the default;
                      the baseline always runs), and, not in the default run:
                      other-file,other-file-nosync: the file store of the binary
                      IDEMGATE_OTHER_BIN, to compare two engines; redis-replica:
                      Redis with a replica and store.min_replicas: 1;
                      valkey: a valkey-server of its own (PATH, else
                      target/tools-venv/bin), natively fenced (issue 41);
                      memory-enc,redis-enc: store.encryption on (issue 27; redis-enc
                      shares redis's redis-server under another key_prefix);
                      memory-jwt-rs256,memory-jwt-es256: scope_principal jwt with a
                      jwks_file, every request a bearer JWT (RSA 2048 keys need the
                      openssl command); memory-jwt-raw: the same RS256 JWTs, scoped by
                      the raw header, the reference of the JWT goals; memory-otlp:
                      telemetry.otlp exporting every span (sample_ratio 1.0) to a
                      sink in the harness, against memory (issue 31; the smoke run
                      includes it); memory-otlp-0.1: the same with sample_ratio
                      0.1 (issue 41); memory-authz: replay_authorization on the
                      same upstream before every replay (the upstream answers its
                      /auth/check 204); postgres,postgres-async: the PostgreSQL store on
                      a throwaway cluster the harness starts (initdb from the
                      highest /usr/lib/postgresql/*/bin, fsync on), a database
                      each, the second with synchronous_commit off (issue 39)
  --scenarios LIST    subset of unguarded,miss,hit,json-key (the default), and,
                      not in the default run: slow: a miss whose upstream answers
                      after 20 ms (header x-bench-delay-ms), at 256 connections in
                      the main pass whatever --concurrency says (smoke: 8, 2 ms),
                      skipped at one connection; its table adds the target's RSS;
                      upload: 8 MiB bodies streamed (stream_request_body), 8
                      connections, idemgate's peak RSS reported (issue 30)
  --account           also count, in each measured window, the target process's
                      syscalls by kind (perf stat on its syscalls:sys_enter_*
                      tracepoints; needs perf and root) and its allocations and
                      allocated bytes (idemgate's /metrics and the plain proxy's
                      GET /-/alloc-stats, both only in a build with the feature:
                      cargo bench --features alloc-stats --bench harness -- --account),
                      per request; prints the account and its difference from the
                      plain proxy after each round. Counting inflates CPU and
                      latency: the issues' targets are not judged in such a run
  --idemgate-log LVL  idemgate's log.level (its access line is at info) [warn]
  --memory            instead: the memory store's footprint at max_entries with 1 KiB
                      responses, and RSS over a long miss run; exits non-zero if RSS
                      grows more than 25 % after the store is full
  --entries N         --memory: store.max_entries               [100000; smoke 1000]
                      (--duration: run that long; without it, until 3×N keys or 60 s)
  --disk              instead: the file store's directory size under a steady miss
                      load with a short ttl; exits non-zero if it grows more than
                      10 % after three ttls [--duration 120; smoke 3]
  --ttl SECS          --disk: idempotency.ttl                   [5; smoke 0.3]
  --nosync            --disk: fsync: false
  --open N            instead: the time the file store takes to open with N live
                      records (written first through the library, fsync: false)
  --seal              instead: ns per Keyring::seal and per Keyring::open of a
                      record with a 1 KiB body, one thread, the median of
                      --rounds rounds [7; smoke 5] (issue 41 item 4)
  --seal-ops N        --seal: calls of each per round           [20000; smoke 200]
  harness --plain-proxy LISTEN UPSTREAM_URL   (internal: the baseline proxy)";

/// How a pass drives each (target, scenario).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pass {
    /// Keep-alive connections, each with one request at a time (closed loop).
    pub(crate) concurrency: usize,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    /// How the `slow` scenario runs in this pass; `None`: it is skipped (one connection).
    pub(crate) slow: Option<SlowLoad>,
    /// The Redis round trip measured before each scenario's Redis targets (the PING
    /// loop's length); `None`: not measured (the main pass).
    pub(crate) redis_rtt: Option<Duration>,
}

/// The `slow` scenario's load: its own connection count, whatever the pass's, and the
/// upstream's delay.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlowLoad {
    pub(crate) concurrency: usize,
    /// What the upstream waits before answering (`x-bench-delay-ms`).
    pub(crate) delay_ms: u64,
}

impl SlowLoad {
    /// 256 connections and 20 ms (issue 29); a smoke run: 8 and 2 ms.
    fn new(smoke: bool) -> Self {
        if smoke {
            Self {
                concurrency: 8,
                delay_ms: 2,
            }
        } else {
            Self {
                concurrency: 256,
                delay_ms: 20,
            }
        }
    }
}

impl Pass {
    /// The connections of `scenario` in this pass.
    pub(crate) fn concurrency_of(&self, scenario: Scenario) -> usize {
        match (scenario, self.slow) {
            (Scenario::Slow, Some(slow)) => slow.concurrency,
            _ => self.concurrency,
        }
    }

    /// Whether `scenario` runs in this pass: `slow` only where it has its load.
    pub(crate) fn runs(&self, scenario: Scenario) -> bool {
        scenario != Scenario::Slow || self.slow.is_some()
    }
}

#[derive(Debug)]
pub(crate) struct Args {
    duration: Duration,
    warmup: Duration,
    concurrency: usize,
    /// The low-load pass (issue 16): one connection; `None` when skipped.
    pub(crate) low_load: Option<Pass>,
    /// `--low-load-only`: no main pass.
    low_load_only: bool,
    /// `--rounds`: how many times each pass runs.
    pub(crate) rounds: usize,
    /// `--rounds` was given (`--seal` has its own default).
    rounds_set: bool,
    /// `--seal`: the seal mode instead of the scenarios.
    pub(crate) seal: bool,
    /// `--seal-ops`: its calls per round.
    seal_ops: Option<usize>,
    pub(crate) smoke: bool,
    /// `--account`: syscalls and allocations per request, in every measured window.
    pub(crate) account: bool,
    pub(crate) targets: Vec<TargetKind>,
    pub(crate) scenarios: Vec<Scenario>,
    /// idemgate's `log.level`.
    pub(crate) log_level: String,
    /// The memory mode instead of the scenarios.
    pub(crate) memory: bool,
    /// `--open N`: the open mode's record count.
    pub(crate) open: Option<u64>,
    /// `--entries`: `store.max_entries` of the memory mode.
    entries: Option<usize>,
    /// `--duration` was given: the memory mode runs that long.
    duration_set: bool,
    /// The disk mode instead of the scenarios.
    pub(crate) disk: bool,
    /// `--ttl`: the disk mode's `idempotency.ttl`.
    ttl: Option<Duration>,
    /// `--nosync`: the disk mode with `fsync: false`.
    nosync: bool,
}

pub(crate) fn parse(argv: &[String]) -> Result<Option<Args>, BoxError> {
    // `cargo bench` passes `--bench`; `cargo test --benches` (or `--all-targets`) passes
    // nothing, and then a quick correctness check is what a test run wants.
    let smoke = argv.is_empty() || argv.iter().any(|a| a == "--smoke");
    let mut args = Args {
        duration: Duration::from_secs_f64(if smoke { 0.2 } else { 10.0 }),
        warmup: Duration::from_secs_f64(if smoke { 0.05 } else { 1.0 }),
        concurrency: if smoke { 4 } else { 32 },
        low_load: None,
        low_load_only: false,
        rounds: 1,
        rounds_set: false,
        seal: false,
        seal_ops: None,
        smoke,
        account: false,
        targets: [
            TargetKind::Memory,
            TargetKind::Redis,
            TargetKind::File,
            TargetKind::FileNoSync,
            TargetKind::Nginx,
        ]
        .into_iter()
        // A smoke run checks that a traced idemgate passes the same checks.
        .chain(smoke.then_some(TargetKind::MemoryOtlp))
        .collect(),
        // A smoke run checks that `slow` works too, at its small size.
        scenarios: if smoke {
            Scenario::SMOKE.to_vec()
        } else {
            Scenario::DEFAULT.to_vec()
        },
        log_level: "warn".to_owned(),
        memory: false,
        open: None,
        entries: None,
        duration_set: false,
        disk: false,
        ttl: None,
        nosync: false,
    };
    let seconds = |v: &str| -> Result<Duration, BoxError> {
        let secs: f64 = v
            .parse()
            .map_err(|_| format!("not a number of seconds: {v}"))?;
        if !(0.0..=3600.0).contains(&secs) {
            return Err(format!("seconds out of range (0..=3600): {v}").into());
        }
        Ok(Duration::from_secs_f64(secs))
    };
    let (mut warmup_set, mut concurrency_set, mut no_low_load) = (false, false, false);
    let (mut low_duration, mut low_warmup) = (None, None);
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" | "--smoke" => {}
            "--help" | "-h" => return Ok(None),
            "--duration" => {
                args.duration = seconds(value()?)?;
                args.duration_set = true;
            }
            "--memory" => args.memory = true,
            "--account" => args.account = true,
            "--disk" => args.disk = true,
            "--open" => args.open = Some(value()?.parse().map_err(|err| format!("--open: {err}"))?),
            "--nosync" => args.nosync = true,
            "--ttl" => args.ttl = Some(seconds(value()?)?).filter(|d| !d.is_zero()),
            "--entries" => {
                let v = value()?;
                args.entries = Some(
                    v.parse()
                        .ok()
                        .filter(|n| (1..=100_000_000).contains(n))
                        .ok_or_else(|| format!("--entries: 1..=100000000, not {v}"))?,
                );
            }
            "--warmup" => {
                args.warmup = seconds(value()?)?;
                warmup_set = true;
            }
            "--low-load-duration" => low_duration = Some(seconds(value()?)?),
            "--low-load-warmup" => low_warmup = Some(seconds(value()?)?),
            "--low-load-only" => args.low_load_only = true,
            "--no-low-load" => no_low_load = true,
            "--seal" => args.seal = true,
            "--seal-ops" => {
                let v = value()?;
                args.seal_ops = Some(
                    v.parse()
                        .ok()
                        .filter(|n| (1..=10_000_000).contains(n))
                        .ok_or_else(|| format!("--seal-ops: 1..=10000000, not {v}"))?,
                );
            }
            "--rounds" => {
                args.rounds_set = true;
                let v = value()?;
                args.rounds = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| format!("--rounds must be 1 to 100: {v}"))?;
            }
            "--concurrency" => {
                concurrency_set = true;
                let v = value()?;
                args.concurrency = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(|| format!("--concurrency: 1..=4096, not {v}"))?;
            }
            "--targets" => {
                args.targets = list(value()?, |name| match name {
                    "memory" => Some(TargetKind::Memory),
                    "memory-enc" => Some(TargetKind::MemoryEnc),
                    "memory-jwt-rs256" => Some(TargetKind::MemoryJwtRs256),
                    "memory-jwt-es256" => Some(TargetKind::MemoryJwtEs256),
                    "memory-jwt-raw" => Some(TargetKind::MemoryJwtRaw),
                    "memory-otlp" => Some(TargetKind::MemoryOtlp),
                    "memory-otlp-0.1" => Some(TargetKind::MemoryOtlpTenth),
                    "memory-authz" => Some(TargetKind::MemoryAuthz),
                    "redis" => Some(TargetKind::Redis),
                    "redis-enc" => Some(TargetKind::RedisEnc),
                    "redis-replica" => Some(TargetKind::RedisReplica),
                    "valkey" => Some(TargetKind::Valkey),
                    "file" => Some(TargetKind::File),
                    "file-nosync" => Some(TargetKind::FileNoSync),
                    "other-file" => Some(TargetKind::OtherFile),
                    "other-file-nosync" => Some(TargetKind::OtherFileNoSync),
                    "postgres" => Some(TargetKind::Postgres),
                    "postgres-async" => Some(TargetKind::PostgresAsync),
                    "nginx" => Some(TargetKind::Nginx),
                    _ => None,
                })?;
            }
            "--scenarios" => {
                args.scenarios = list(value()?, |name| {
                    Scenario::KNOWN.into_iter().find(|s| s.name() == name)
                })?;
            }
            "--idemgate-log" => {
                let v = value()?;
                if v.is_empty() || v.contains(['"', '\\', '\n', '\r']) {
                    return Err(format!("--idemgate-log: not a level: {v:?}").into());
                }
                v.clone_into(&mut args.log_level);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if args.duration.is_zero() {
        return Err("--duration must be more than 0".into());
    }
    // A smoke run's account needs windows longer than perf takes to start (a few tenths
    // of a second on a busy machine).
    if smoke && args.account && !args.duration_set {
        args.duration = Duration::from_secs_f64(0.5);
    }
    if args.low_load_only && (no_low_load || concurrency_set) {
        return Err(
            "--low-load-only runs at one connection: not with --no-low-load or --concurrency"
                .into(),
        );
    }
    if !no_low_load && (args.low_load_only || !concurrency_set) {
        // With --low-load-only it is the only pass, so --duration and --warmup are its own.
        let only = |set: bool, value: Duration| (args.low_load_only && set).then_some(value);
        let pass = Pass {
            concurrency: 1,
            warmup: low_warmup
                .or(only(warmup_set, args.warmup))
                .unwrap_or(Duration::from_secs_f64(if smoke { 0.02 } else { 1.0 })),
            duration: low_duration
                .or(only(args.duration_set, args.duration))
                .unwrap_or(Duration::from_secs_f64(match (smoke, args.account) {
                    (true, false) => 0.05,
                    (true, true) => 0.3,
                    (false, _) => 5.0,
                })),
            slow: None,
            redis_rtt: Some(Duration::from_secs_f64(if smoke { 0.05 } else { 1.0 })),
        };
        if pass.duration.is_zero() {
            return Err("--low-load-duration must be more than 0".into());
        }
        args.low_load = Some(pass);
    }
    Ok(Some(args))
}

impl Args {
    /// The main pass: `--concurrency` connections; `None` with `--low-load-only`.
    pub(crate) fn main_pass(&self) -> Option<Pass> {
        (!self.low_load_only).then_some(Pass {
            concurrency: self.concurrency,
            warmup: self.warmup,
            duration: self.duration,
            slow: Some(SlowLoad::new(self.smoke)),
            redis_rtt: None,
        })
    }
}

fn list<T>(value: &str, pick: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, BoxError> {
    value
        .split(',')
        .map(|name| pick(name.trim()).ok_or_else(|| format!("unknown name {name}").into()))
        .collect()
}

/// The memory mode's plan: `--entries`, else idemgate's default `max_entries` (a smoke
/// run: 1000, under a second of load).
pub(crate) fn memory_plan(args: &Args) -> memory::Plan {
    memory::Plan {
        entries: args
            .entries
            .unwrap_or(if args.smoke { 1_000 } else { 100_000 }),
        duration: args.duration_set.then_some(args.duration),
        concurrency: args.concurrency,
        log_level: args.log_level.clone(),
        smoke: args.smoke,
    }
}

/// The disk mode's plan: a 5 s ttl for two minutes (a smoke run: 0.3 s for 3 s).
pub(crate) fn disk_plan(args: &Args) -> disk::Plan {
    let (ttl, duration) = if args.smoke {
        (Duration::from_millis(300), Duration::from_secs(3))
    } else {
        (Duration::from_secs(5), Duration::from_secs(120))
    };
    disk::Plan {
        ttl: args.ttl.unwrap_or(ttl),
        duration: if args.duration_set {
            args.duration
        } else {
            duration
        },
        concurrency: args.concurrency,
        fsync: !args.nosync,
        log_level: args.log_level.clone(),
        smoke: args.smoke,
    }
}

/// The seal mode's plan: 7 rounds of 20000 calls each (a smoke run: 5 of 200).
pub(crate) fn seal_plan(args: &Args) -> seal::Plan {
    seal::Plan {
        rounds: if args.rounds_set {
            args.rounds
        } else if args.smoke {
            5
        } else {
            7
        },
        ops: args
            .seal_ops
            .unwrap_or(if args.smoke { 200 } else { 20_000 }),
    }
}
