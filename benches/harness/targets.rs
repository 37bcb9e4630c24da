//! Starting the targets (the baseline, idemgate on each store, nginx) and measuring one
//! (target, scenario): priming, load, CPU, RSS, Redis and PostgreSQL counters, checks,
//! and with `--account` the syscalls and allocations of the window.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::account::{self, Account, AllocSource, Allocs, Counting};
use crate::args::Pass;
use crate::postgres::{self, Cluster, PgUse};
use crate::procs::{self, Proc, Store, Tuning};
use crate::report::{self, Row};
use crate::{BoxError, Scenario, TargetKind, cpu, load, memory, principal, servers};

/// How long before the measured window a window's perf is started: it takes a few tens
/// of ms to open its events (its count is per request of its own window, which the
/// harness ends with the measured one, so a slower start only shortens it).
const PERF_LEAD: Duration = Duration::from_millis(100);

/// One started target. Its processes are stopped when [`Started::procs`] is dropped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub(crate) kind: TargetKind,
    addr: SocketAddr,
    pid: u32,
    redis: Option<Redis>,
    /// The PostgreSQL database behind a postgres target.
    postgres: Option<Pg>,
    /// The admin port of a file-store target, whose flush counters are read, and of every
    /// idemgate target with `--account`.
    admin: Option<u16>,
    /// With `--account`: where its allocation totals are read.
    pub(crate) alloc: Option<AllocSource>,
    /// The `Authorization` value of its requests: [`load::AUTHORIZATION`], or a bearer
    /// JWT for the targets scoped by its principal.
    authorization: &'static str,
    /// The other tokens of a target scoped by a JWT principal, for the checks of `hit`.
    tokens: Option<principal::Tokens>,
}

impl Target {
    /// A target on `addr` (its process `pid`) sending the usual credential, with no
    /// redis-server or admin port of its own to read.
    fn new(kind: TargetKind, addr: SocketAddr, pid: u32) -> Self {
        Self {
            kind,
            addr,
            pid,
            redis: None,
            postgres: None,
            admin: None,
            alloc: None,
            authorization: load::AUTHORIZATION,
            tokens: None,
        }
    }
}

impl Target {
    /// The port of its redis-server, if it has one.
    pub(crate) fn redis_port(&self) -> Option<u16> {
        self.redis.map(|r| r.port)
    }
}

/// The redis-server behind a target.
#[derive(Debug, Clone, Copy)]
struct Redis {
    port: u16,
    pid: u32,
}

/// The PostgreSQL database behind a target: its cluster (where the statistics are read,
/// and whose processes' CPU is counted) and its name.
#[derive(Debug, Clone, Copy)]
struct Pg {
    cluster: Cluster,
    database: &'static str,
}

/// Everything [`start`] started.
#[derive(Debug)]
pub(crate) struct Started {
    /// Every process, to be dropped (stopped) when the harness is done.
    pub(crate) procs: Vec<Proc>,
    pub(crate) targets: Vec<Target>,
    /// Targets skipped, and why.
    pub(crate) notes: Vec<String>,
    pub(crate) idemgate: PathBuf,
    pub(crate) redis_server: Option<PathBuf>,
    /// The valkey-server of the `valkey` target, when it ran.
    pub(crate) valkey_server: Option<PathBuf>,
    pub(crate) nginx: Option<PathBuf>,
    /// The `postgres` binary the cluster ran, when it ran.
    pub(crate) postgres: Option<PathBuf>,
}

/// Starts the baseline and the `wanted` targets in front of `upstream`, their configs
/// and logs in `dir`. On an error, what was started so far is stopped. With `account`,
/// each target also gets where its allocation totals are read (every idemgate an admin
/// port for it).
pub(crate) async fn start(
    dir: &Path,
    upstream: SocketAddr,
    wanted: &[TargetKind],
    log_level: &str,
    (json_key_route, upload_route): (bool, bool),
    account: bool,
) -> Result<Started, BoxError> {
    let mut procs: Vec<Proc> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut targets = Vec::new();
    let exe = std::env::current_exe()?;
    let (proc, addr) = procs::spawn_server("plain-proxy", dir, true, |port| {
        let mut cmd = Command::new(&exe);
        cmd.arg("--plain-proxy")
            .arg(format!("127.0.0.1:{port}"))
            .arg(format!("http://{upstream}"));
        Ok(cmd)
    })
    .await?;
    targets.push(Target {
        alloc: account.then_some(AllocSource {
            port: addr.port(),
            path: servers::ALLOC_STATS_PATH,
        }),
        ..Target::new(TargetKind::Baseline, addr, proc.pid())
    });
    procs.push(proc);

    let idemgate = procs::idemgate_bin()?;
    let other = [TargetKind::OtherFile, TargetKind::OtherFileNoSync]
        .iter()
        .any(|kind| wanted.contains(kind))
        .then(procs::other_bin)
        .transpose()?;
    // `tuning` says what differs from the plain config: the admin port, encryption, the
    // key prefix, the JWK set. The target it returns has its admin port (a file target's,
    // for its flush counters; every one's with --account, for its allocation counters).
    let start_idemgate = |kind: TargetKind, store: Store, tuning: Tuning| {
        let dir = dir.to_owned();
        let bin = match (&store, &other) {
            (Store::File { other: true, .. }, Some(other)) => other.clone(),
            _ => idemgate.clone(),
        };
        async move {
            let admin = match tuning.admin_port {
                None if account => Some(procs::free_port()?),
                admin => admin,
            };
            let config = dir.join(format!("{}.yaml", kind.name()));
            let (proc, addr) = procs::spawn_server(kind.name(), &dir, false, |port| {
                let tuning = Tuning {
                    admin_port: admin.filter(|admin| *admin != port),
                    json_key_route,
                    upload_route,
                    ..tuning
                };
                std::fs::write(
                    &config,
                    procs::idemgate_yaml(port, upstream, store, log_level, tuning, &dir),
                )?;
                let mut cmd = Command::new(&bin);
                cmd.arg("--config").arg(&config);
                Ok(cmd)
            })
            .await?;
            let target = Target {
                admin,
                alloc: admin.filter(|_| account).map(|port| AllocSource {
                    port,
                    path: "/metrics",
                }),
                ..Target::new(kind, addr, proc.pid())
            };
            Ok::<_, BoxError>((proc, target))
        }
    };
    // The sink of the traced target, in this process for the whole run.
    let otlp = if wanted.contains(&TargetKind::MemoryOtlp)
        || wanted.contains(&TargetKind::MemoryOtlpTenth)
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let sink = listener.local_addr()?;
        tokio::spawn(servers::otlp_sink(listener));
        Some(sink)
    } else {
        None
    };
    // The memory store plain, encrypted, scoped by the principal of a JWT, and traced.
    let mut rs256: Option<principal::Tokens> = None;
    for kind in [
        TargetKind::Memory,
        TargetKind::MemoryEnc,
        TargetKind::MemoryJwtRs256,
        TargetKind::MemoryJwtEs256,
        TargetKind::MemoryJwtRaw,
        TargetKind::MemoryOtlp,
        TargetKind::MemoryOtlpTenth,
        TargetKind::MemoryAuthz,
    ] {
        if !wanted.contains(&kind) {
            continue;
        }
        let alg = match kind {
            TargetKind::MemoryJwtRs256 | TargetKind::MemoryJwtRaw => Some(principal::Alg::Rs256),
            TargetKind::MemoryJwtEs256 => Some(principal::Alg::Es256),
            _ => None,
        };
        // The JWK set must be in place before idemgate loads its config. The raw target
        // gets tokens of the same size, but no scope_principal (and so no principal
        // checks: its `tokens` are left out below).
        let tokens = match (kind, rs256) {
            (TargetKind::MemoryJwtRaw, Some(tokens)) => Some(tokens),
            _ => alg.map(|alg| principal::make(dir, alg)).transpose()?,
        };
        if kind == TargetKind::MemoryJwtRs256 {
            rs256 = tokens;
        }
        let scoped = kind != TargetKind::MemoryJwtRaw;
        let tuning = Tuning {
            encryption: kind == TargetKind::MemoryEnc,
            jwks_file: alg.filter(|_| scoped).map(principal::Alg::jwks_file),
            otlp: otlp.and_then(|sink| match kind {
                TargetKind::MemoryOtlp => Some((sink, 1.0)),
                TargetKind::MemoryOtlpTenth => Some((sink, 0.1)),
                _ => None,
            }),
            replay_authorization: kind == TargetKind::MemoryAuthz,
            ..Tuning::default()
        };
        let (proc, target) = start_idemgate(kind, Store::Memory, tuning).await?;
        targets.push(Target {
            authorization: tokens.map_or(load::AUTHORIZATION, |t| t.authorization),
            tokens: tokens.filter(|_| scoped),
            ..target
        });
        procs.push(proc);
    }
    // One redis-server for `redis` and `redis-enc`, each under a key prefix of its own.
    let redis_server = procs::on_path("redis-server");
    let redis_kinds = [
        (TargetKind::Redis, false, None),
        (TargetKind::RedisEnc, true, Some("idemgate-enc:")),
    ];
    if redis_kinds.iter().any(|(kind, ..)| wanted.contains(kind)) {
        match &redis_server {
            Some(redis) => {
                let redis_dir = dir.to_owned();
                let (proc, redis_addr) = procs::spawn_server("redis-server", dir, false, |port| {
                    let mut cmd = Command::new(redis);
                    cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                        .arg("--dir")
                        .arg(&redis_dir);
                    Ok(cmd)
                })
                .await?;
                let redis = Redis {
                    port: redis_addr.port(),
                    pid: proc.pid(),
                };
                procs.push(proc);
                for (kind, encryption, key_prefix) in redis_kinds {
                    if !wanted.contains(&kind) {
                        continue;
                    }
                    let tuning = Tuning {
                        encryption,
                        key_prefix,
                        ..Tuning::default()
                    };
                    let (proc, target) =
                        start_idemgate(kind, Store::Redis(redis.port), tuning).await?;
                    targets.push(Target {
                        redis: Some(redis),
                        ..target
                    });
                    procs.push(proc);
                }
            }
            None => {
                for (kind, ..) in redis_kinds {
                    if wanted.contains(&kind) {
                        notes.push(format!(
                            "{} skipped: redis-server is not on PATH",
                            kind.name()
                        ));
                    }
                }
            }
        }
    }
    // A valkey-server of its own, started as the redis-server is: idemgate finds it
    // speaks Valkey 9 and fences with its native commands (docs/behaviour.md §23).
    let valkey_server = if wanted.contains(&TargetKind::Valkey) {
        let found = procs::valkey_server();
        match &found {
            Some(valkey) => {
                let valkey_dir = dir.join("valkey");
                std::fs::create_dir_all(&valkey_dir)?;
                let (proc, addr) = procs::spawn_server("valkey-server", dir, false, |port| {
                    let mut cmd = Command::new(valkey);
                    cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                        .arg("--dir")
                        .arg(&valkey_dir);
                    Ok(cmd)
                })
                .await?;
                let valkey = Redis {
                    port: addr.port(),
                    pid: proc.pid(),
                };
                procs.push(proc);
                let (proc, target) = start_idemgate(
                    TargetKind::Valkey,
                    Store::Redis(valkey.port),
                    Tuning::default(),
                )
                .await?;
                targets.push(Target {
                    redis: Some(valkey),
                    ..target
                });
                procs.push(proc);
            }
            None => notes.push(
                "idemgate-valkey skipped: valkey-server is neither on PATH nor in target/tools-venv/bin (scripts/test.sh installs it)"
                    .to_owned(),
            ),
        }
        found
    } else {
        None
    };
    // A master and its replica, and idemgate with `min_replicas: 1`
    // (docs/behaviour.md §14).
    if wanted.contains(&TargetKind::RedisReplica) {
        match &redis_server {
            Some(redis) => {
                let redis_server = |name: &'static str, replica_of: Option<u16>| {
                    let dir = dir.join(name);
                    let redis = redis.clone();
                    async move {
                        std::fs::create_dir_all(&dir)?;
                        procs::spawn_server(name, &dir, false, |port| {
                            let mut cmd = Command::new(&redis);
                            cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                                .args(["--repl-diskless-sync-delay", "0"])
                                .arg("--dir")
                                .arg(&dir);
                            if let Some(master) = replica_of {
                                cmd.args(["--replicaof", "127.0.0.1", &master.to_string()]);
                            }
                            Ok(cmd)
                        })
                        .await
                    }
                };
                let (master, master_addr) = redis_server("redis-master", None).await?;
                let redis = Redis {
                    port: master_addr.port(),
                    pid: master.pid(),
                };
                procs.push(master);
                let (replica, _) = redis_server("redis-replica", Some(redis.port)).await?;
                procs.push(replica);
                procs::wait_replica(redis.port).await?;
                let (proc, target) = start_idemgate(
                    TargetKind::RedisReplica,
                    Store::RedisReplicated(redis.port),
                    Tuning::default(),
                )
                .await?;
                targets.push(Target {
                    redis: Some(redis),
                    ..target
                });
                procs.push(proc);
            }
            None => {
                notes
                    .push("idemgate-redis-replica skipped: redis-server is not on PATH".to_owned());
            }
        }
    }
    // The file store in the harness's temp dir, with and without fsync; its admin port
    // serves the flush counters.
    for (kind, fsync, other) in [
        (TargetKind::File, true, false),
        (TargetKind::FileNoSync, false, false),
        (TargetKind::OtherFile, true, true),
        (TargetKind::OtherFileNoSync, false, true),
    ] {
        if wanted.contains(&kind) {
            let admin = procs::free_port()?;
            let store = Store::File { fsync, other };
            let tuning = Tuning {
                admin_port: Some(admin),
                ..Tuning::default()
            };
            let (proc, target) = start_idemgate(kind, store, tuning).await?;
            targets.push(target);
            procs.push(proc);
        }
    }
    // One PostgreSQL cluster for both targets, a database each; the async one's commits
    // do not wait for the WAL flush (docs/behaviour.md §22). It runs first: a backend
    // reports its WAL flushes at most once a second, and the last second of a run 10 s
    // after it, in the next run's counts; the async run's few are lost in the sync
    // run's, while the sync run's would double the async run's.
    let pg_kinds = [
        (TargetKind::PostgresAsync, postgres::ASYNC_DATABASE),
        (TargetKind::Postgres, postgres::SYNC_DATABASE),
    ];
    let mut postgres_bin = None;
    if pg_kinds.iter().any(|(kind, _)| wanted.contains(kind)) {
        match postgres::bin_dir() {
            Some(bin) => {
                let (proc, cluster) = postgres::start(dir, &bin).await?;
                procs.push(proc);
                postgres_bin = Some(bin.join("postgres"));
                for (kind, database) in pg_kinds {
                    if !wanted.contains(&kind) {
                        continue;
                    }
                    let store = Store::Postgres {
                        port: cluster.port,
                        database,
                    };
                    let (proc, target) = start_idemgate(kind, store, Tuning::default()).await?;
                    targets.push(Target {
                        postgres: Some(Pg { cluster, database }),
                        ..target
                    });
                    procs.push(proc);
                }
            }
            None => {
                for (kind, _) in pg_kinds {
                    if wanted.contains(&kind) {
                        notes.push(format!(
                            "{} skipped: no PostgreSQL (no /usr/lib/postgresql/*/bin, no initdb on PATH)",
                            kind.name()
                        ));
                    }
                }
            }
        }
    }
    let nginx = procs::on_path("nginx");
    if wanted.contains(&TargetKind::Nginx) {
        match &nginx {
            Some(nginx) => {
                let conf = dir.join("nginx.conf");
                let prefix = dir.to_owned();
                let (proc, addr) = procs::spawn_server("nginx", dir, false, |port| {
                    std::fs::write(&conf, procs::nginx_conf(port, upstream, &prefix))?;
                    let mut cmd = Command::new(nginx);
                    cmd.arg("-p").arg(&prefix).arg("-c").arg(&conf);
                    Ok(cmd)
                })
                .await?;
                targets.push(Target::new(TargetKind::Nginx, addr, proc.pid()));
                procs.push(proc);
            }
            None => notes.push("nginx skipped: not on PATH".to_owned()),
        }
    }

    Ok(Started {
        procs,
        targets,
        notes,
        idemgate,
        redis_server,
        valkey_server,
        nginx,
        postgres: postgres_bin,
    })
}

impl Target {
    /// One (target, scenario) run, with its correctness checks; with `counting`
    /// (`--account`), its syscalls and allocations too.
    pub(crate) async fn measure(
        self,
        scenario: Scenario,
        pass: Pass,
        nonce: &str,
        watched: &[cpu::Watched],
        counting: Option<&Counting>,
    ) -> Row {
        let mut problems = Vec::new();
        let keys = match scenario {
            Scenario::Unguarded => load::Keys::None,
            Scenario::Miss => load::Keys::Fresh(format!("miss-{nonce}-{}", self.kind.name())),
            Scenario::Slow => load::Keys::Fresh(format!("slow-{nonce}-{}", self.kind.name())),
            Scenario::Hit => load::Keys::Fixed(format!("hit-{nonce}-{}", self.kind.name())),
            Scenario::JsonKey => {
                load::Keys::FreshInBody(format!("json-{nonce}-{}", self.kind.name()))
            }
            Scenario::Upload => load::Keys::Fresh(format!("upload-{nonce}-{}", self.kind.name())),
        };
        if let load::Keys::Fixed(key) = &keys {
            // The first request executes; it is made before the run so that every measured
            // request is a replay (and none races the first into 409 in-flight).
            match load::one_request(self.addr, scenario.path(), Some(key), self.authorization).await
            {
                Ok((status, false)) if status.is_success() => {}
                Ok((status, replayed)) => problems.push(format!(
                    "priming the hit key: {status}, replayed {replayed} (want 2xx, first execution)"
                )),
                Err(err) => problems.push(format!("priming the hit key: {err}")),
            }
            if let Some(tokens) = self.tokens {
                self.check_principal(scenario.path(), key, tokens, &mut problems)
                    .await;
            }
        }
        let before = match self.redis {
            Some(redis) => procs::command_stats(redis.port).await.map(Some),
            None => Ok(None),
        };
        let pg_before = match self.postgres {
            Some(pg) => pg.cluster.counters(pg.database).await.map(Some),
            None => Ok(None),
        };
        let file_admin = self.admin.filter(|_| self.kind.is_file());
        let flushes_before = match file_admin {
            Some(port) => flush_counters(port).await.map(Some),
            None => Ok(None),
        };
        // With --account, the answers are counted as they come, for perf's own window.
        let progress = counting.map(|_| Arc::new(load::Progress::with_limit(0)));
        let plan = Arc::new(load::Plan {
            addr: self.addr,
            path: scenario.path(),
            keys,
            authorization: self.authorization,
            expect_replayed: self.kind.is_idemgate() && scenario == Scenario::Hit,
            delay_ms: pass
                .slow
                .filter(|_| scenario == Scenario::Slow)
                .map(|slow| slow.delay_ms),
            body: scenario.body(),
            concurrency: scenario
                .concurrency()
                .unwrap_or_else(|| pass.concurrency_of(scenario)),
            warmup: pass.warmup,
            duration: pass.duration,
            progress: progress.clone(),
        });
        // CPU is sampled over the measured window only, next to the load run.
        let run = tokio::spawn(load::run(plan));
        let lead = if counting.is_some() {
            PERF_LEAD.min(pass.warmup)
        } else {
            Duration::ZERO
        };
        tokio::time::sleep(pass.warmup - lead).await;
        // Sent (or dropped) as the window ends: perf's window ends then too.
        let (end_perf, perf_ends) = tokio::sync::oneshot::channel();
        let syscalls = match (counting, progress) {
            (Some(counting), Some(progress)) => Some(match counting.perf() {
                // nginx works in its worker processes, which `-p` of the master misses.
                Some(_) if self.kind == TargetKind::Nginx => {
                    Err("nginx's workers are not counted".to_owned())
                }
                Some(perf) => Ok(tokio::spawn(account::syscalls(
                    perf.to_owned(),
                    self.pid,
                    perf_ends,
                    progress,
                ))),
                None => Err("perf is unavailable (see the notes at the start)".to_owned()),
            }),
            _ => None,
        };
        tokio::time::sleep(lead).await;
        let window = tokio::time::Instant::now();
        let cpu_from = cpu::snapshot(watched);
        let alloc = counting.and(self.alloc);
        let allocs_from = match alloc {
            Some(source) => Some(account::alloc_totals(source).await),
            None => None,
        };
        tokio::time::sleep_until(window + pass.duration).await;
        let cpu_to = cpu::snapshot(watched);
        let _ = end_perf.send(());
        let rss = cpu::Rss::of(self.pid);
        let allocs_to = match alloc {
            Some(source) => Some(account::alloc_totals(source).await),
            None => None,
        };
        let outcome = run.await.unwrap_or_else(|err| {
            problems.push(format!("the load run failed: {err}"));
            load::Outcome::default()
        });
        let account = match syscalls {
            Some(syscalls) => {
                let syscalls = match syscalls {
                    Ok(task) => task
                        .await
                        .unwrap_or_else(|err| Err(format!("the perf task failed: {err}"))),
                    Err(why) => Err(why),
                };
                let allocs = match (allocs_from, allocs_to) {
                    (Some(Ok(from)), Some(Ok(to))) => {
                        Ok(Allocs::between(from, to, outcome.measured))
                    }
                    (Some(Err(err)), _) | (_, Some(Err(err))) => Err(err),
                    _ => Err("no allocation counters for this target".to_owned()),
                };
                Some(Account { syscalls, allocs })
            }
            None => None,
        };
        // Issue 30: what streaming 8 MiB bodies costs idemgate in memory.
        if scenario == Scenario::Upload && self.kind.is_idemgate() {
            let mib = |field| {
                memory::status_kib(self.pid, field).map_or(f64::NAN, |kib| kib as f64 / 1024.0)
            };
            println!(
                "  upload on {}: idemgate VmRSS {:.1} MiB, peak (VmHWM) {:.1} MiB",
                self.kind.name(),
                mib("VmRSS"),
                mib("VmHWM")
            );
        }
        let per_request = |pid: u32| {
            let index = watched.iter().position(|w| w.pid == pid)?;
            Some(cpu::per_request(
                &cpu_from,
                &cpu_to,
                index,
                outcome.measured,
            ))
        };
        let unknown = cpu::PerRequest {
            cpu_us: f64::NAN,
            switches: f64::NAN,
        };
        let server = self
            .redis
            .map(|r| r.pid)
            .or(self.postgres.map(|pg| pg.cluster.pid));
        let cpu = report::Cpu {
            proxy: per_request(self.pid).unwrap_or(unknown),
            server: server.and_then(per_request),
            harness: per_request(std::process::id()).unwrap_or(unknown),
            usage: cpu::Usage::between(&cpu_from, &cpu_to),
        };
        let mut redis = None;
        if let Some(r) = self.redis {
            match (before, procs::command_stats(r.port).await) {
                (Ok(Some(before)), Ok(after)) => {
                    let (top, inside) = procs::command_delta(&before, &after);
                    let per = |n: u64| n as f64 / outcome.completed.max(1) as f64;
                    redis = Some(report::RedisUse {
                        round_trips: per(procs::round_trips(&top)),
                        inside_scripts: per(inside),
                        commands: top
                            .iter()
                            .map(|(name, calls)| format!("{name} {calls}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
                (Err(err), _) | (_, Err(err)) => problems.push(format!("INFO commandstats: {err}")),
                (Ok(None), _) => {}
            }
        }
        let mut pg = None;
        if let Some(p) = self.postgres {
            match (pg_before, p.cluster.counters(p.database).await) {
                (Ok(Some(before)), Ok(after)) => {
                    let used = PgUse::between(&before, &after, outcome.completed);
                    let want = scenario.round_trips();
                    if used.statements.round() as u64 != want {
                        problems.push(format!(
                            "{:.2} PostgreSQL statements per request ({}), want {want} (docs/behaviour.md §22)",
                            used.statements, used.by_statement
                        ));
                    }
                    pg = Some(used);
                }
                (Err(err), _) | (_, Err(err)) => problems.push(format!("PostgreSQL: {err}")),
                (Ok(None), _) => {}
            }
        }
        let mut store = None;
        if let Some(port) = file_admin {
            match (flushes_before, flush_counters(port).await) {
                (Ok(Some(before)), Ok(after)) => {
                    let per = |n: u64| n as f64 / outcome.completed.max(1) as f64;
                    store = Some(report::StoreUse {
                        flushes: per(after.0.saturating_sub(before.0)),
                        fsyncs: per(after.1.saturating_sub(before.1)),
                    });
                }
                (Err(err), _) | (_, Err(err)) => {
                    problems.push(format!("file store /metrics: {err}"));
                }
                (Ok(None), _) => {}
            }
        }
        let mut row = Row::new(self.kind, scenario, outcome, redis, store, cpu, problems);
        row.rss = rss;
        row.account = account;
        row.postgres = pg;
        row
    }
}

impl Target {
    /// That the key just executed with the load's token is scoped by the token's
    /// principal, not by the raw `Authorization` value (docs/behaviour.md §17): another
    /// token for the same `iss` and `sub` replays it, a token for another `sub` executes
    /// it anew in its own scope, and a forged signature is refused with `401`.
    async fn check_principal(
        self,
        path: &str,
        key: &str,
        tokens: principal::Tokens,
        problems: &mut Vec<String>,
    ) {
        let checks = [
            (
                "a refreshed token of the same principal",
                tokens.refreshed,
                Some(true),
            ),
            ("a token of another principal", tokens.other, Some(false)),
            ("a forged token", tokens.forged, None),
        ];
        for (what, authorization, want_replayed) in checks {
            let answer = load::one_request(self.addr, path, Some(key), authorization).await;
            let ok = match (&answer, want_replayed) {
                (Ok((status, replayed)), Some(want)) => status.is_success() && *replayed == want,
                (Ok((status, _)), None) => *status == http::StatusCode::UNAUTHORIZED,
                (Err(_), _) => false,
            };
            if !ok {
                let want = match want_replayed {
                    Some(true) => "2xx, replayed",
                    Some(false) => "2xx, first execution",
                    None => "401",
                };
                problems.push(format!(
                    "the hit key with {what}: {answer:?} (want {want}): not scoped by the principal"
                ));
            }
        }
    }
}

/// A file-store target's commits and fdatasync calls so far.
async fn flush_counters(admin_port: u16) -> Result<(u64, u64), BoxError> {
    let metrics = procs::scrape(admin_port).await?;
    Ok((
        procs::metric(&metrics, "idemgate_store_flushes_total")?,
        procs::metric(&metrics, "idemgate_store_fsyncs_total")?,
    ))
}
