//! The PostgreSQL cluster of the `postgres` and `postgres-async` targets (issue 39), and
//! what a target's statements did.
//!
//! One throwaway cluster per run: `initdb` into the harness's temp dir, the server on a
//! free port of 127.0.0.1 (no Unix socket), stopped with SIGQUIT (nothing of it is kept)
//! and removed with the temp dir however the harness ends. As root it runs as the
//! `postgres` user (`setpriv`, which execs, so the child is the postmaster): PostgreSQL
//! refuses to run as root. Each target has a database of its own in it; the async one's
//! has `synchronous_commit = off`, so that the two differ in that alone.
//!
//! What a target did is read before and after its run: its statements from
//! `pg_stat_statements`, which counts each one as it ends (the cumulative statistics,
//! `pg_stat_database` and `pg_stat_wal`, are reported by each backend at most once a
//! second, and by an idle one 10 s later), and the cluster's WAL flushes from
//! `pg_stat_wal`, which lag so (see [`PgUse::wal_syncs`]).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::BoxError;
use crate::procs::{self, Proc};

/// The postmaster's name among the harness's processes (its CPU is counted with its
/// whole tree).
pub(crate) const PROC_NAME: &str = "postgres";

/// The database of the `postgres` target: the server's settings as they are.
pub(crate) const SYNC_DATABASE: &str = "idemgate_sync";
/// The database of `postgres-async`: `synchronous_commit = off`, nothing else changed.
pub(crate) const ASYNC_DATABASE: &str = "idemgate_async";

/// The superuser `initdb` makes, whom every local connection is trusted as; as root,
/// also the system user the cluster runs as.
const USER: &str = "postgres";

/// How long `initdb`, and then the server's start-up until it takes queries, may take.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a read of the statistics may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The server's settings, on its command line. Durable as a production server is
/// (`fsync`, `synchronous_commit` on); `shared_buffers` Debian's default;
/// `max_connections` well above the two idemgate pools (16 each) and the harness's own
/// reads; `pg_stat_statements` to count the statements, and the time WAL flushes take
/// (`track_wal_io_timing`). The rest is PostgreSQL's defaults (checkpoints every 5 min
/// or 1 GB of WAL, `wal_level = replica`, `full_page_writes`).
const SETTINGS: [(&str, &str); 10] = [
    ("listen_addresses", "127.0.0.1"),
    ("unix_socket_directories", ""),
    ("fsync", "on"),
    ("synchronous_commit", "on"),
    ("shared_buffers", "128MB"),
    ("max_connections", "100"),
    ("shared_preload_libraries", "pg_stat_statements"),
    ("pg_stat_statements.track", "top"),
    ("pg_stat_statements.save", "off"),
    ("track_wal_io_timing", "on"),
];

/// The directory of the newest PostgreSQL installed: the highest
/// `/usr/lib/postgresql/N/bin` (Debian's layout), else where `initdb` is on `PATH`.
pub(crate) fn bin_dir() -> Option<PathBuf> {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").is_file() && bin.join("postgres").is_file())
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin);
    newest.or_else(|| Some(procs::on_path("initdb")?.parent()?.to_owned()))
}

/// The running cluster.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cluster {
    pub(crate) port: u16,
    /// The postmaster: the root of every process of the cluster.
    pub(crate) pid: u32,
}

/// Makes and starts the cluster in `dir` with the binaries of `bin`, its databases made:
/// the postmaster's guard (stopped by SIGQUIT when dropped) and where it listens.
pub(crate) async fn start(dir: &Path, bin: &Path) -> Result<(Proc, Cluster), BoxError> {
    let home = dir.join("postgres");
    std::fs::create_dir_all(&home)?;
    let as_root = std::fs::metadata("/proc/self")?.uid() == 0;
    if as_root {
        let (uid, gid) = user_ids(USER)?;
        std::os::unix::fs::chown(&home, Some(uid), Some(gid))?;
        // The user must be able to reach its directory, whatever the umask made of ours.
        let mode = std::fs::metadata(dir)?.permissions().mode();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o711))?;
    }
    let command = |program: &str| {
        let program = bin.join(program);
        if as_root {
            let mut cmd = Command::new("setpriv");
            cmd.args(["--reuid", USER, "--regid", USER, "--init-groups", "--"])
                .arg(program);
            cmd
        } else {
            Command::new(program)
        }
    };
    let data = home.join("data");
    // `--no-sync`: the template databases need not reach the disk; what is measured
    // runs with fsync on.
    let mut initdb = command("initdb");
    initdb
        .arg("-D")
        .arg(&data)
        .args(["-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync"])
        .stdin(Stdio::null());
    let mut initdb = tokio::process::Command::from(initdb);
    initdb.kill_on_drop(true);
    let out = tokio::time::timeout(START_TIMEOUT, initdb.output())
        .await
        .map_err(|_| format!("initdb did not finish within {START_TIMEOUT:?}"))??;
    if !out.status.success() {
        return Err(format!(
            "initdb exited with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let (proc, addr) = procs::spawn_server(PROC_NAME, dir, false, |port| {
        let mut cmd = command("postgres");
        cmd.arg("-D").arg(&data).arg("-p").arg(port.to_string());
        for (name, value) in SETTINGS {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        Ok(cmd)
    })
    .await?;
    // Immediate shutdown: the postmaster ends every backend at once and writes no
    // checkpoint; SIGTERM would wait for idemgate's connections to close.
    let proc = proc.stopped_by("-QUIT");
    let cluster = Cluster {
        port: addr.port(),
        pid: proc.pid(),
    };
    // It listens before it takes queries (the startup process runs first).
    let deadline = Instant::now() + START_TIMEOUT;
    let client = loop {
        match cluster.connect("postgres").await {
            Ok(client) => break client,
            Err(err) if Instant::now() > deadline => {
                return Err(format!(
                    "PostgreSQL took no query within {START_TIMEOUT:?}: {err}\n{}",
                    proc.log_tail()
                )
                .into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    // One statement each: CREATE DATABASE refuses to run in a transaction block, which
    // a string of several statements is.
    for statement in [
        "CREATE EXTENSION pg_stat_statements".to_owned(),
        format!("CREATE DATABASE {SYNC_DATABASE}"),
        format!("CREATE DATABASE {ASYNC_DATABASE}"),
        format!("ALTER DATABASE {ASYNC_DATABASE} SET synchronous_commit = off"),
    ] {
        client
            .batch_execute(&statement)
            .await
            .map_err(|err| format!("{statement}: {err}"))?;
    }
    Ok((proc, cluster))
}

/// The uid and gid of `user`, from `/etc/passwd`.
fn user_ids(user: &str) -> Result<(u32, u32), BoxError> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&user))
                .then(|| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))?
        })
        .ok_or_else(|| {
            format!("no user {user} in /etc/passwd: PostgreSQL will not run as root").into()
        })
}

/// What a target's database and the cluster had done at one instant.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    /// Executions per statement of the database, by [`label`].
    calls: BTreeMap<String, u64>,
    /// The WAL the database's statements wrote, in bytes.
    wal_bytes: f64,
    /// The cluster's WAL flushes, and the ms they took (`pg_stat_wal`); `None` on a
    /// server whose `pg_stat_wal` has no such columns (PostgreSQL 18 moved them).
    wal_syncs: Option<(i64, f64)>,
}

impl Cluster {
    /// A connection as the superuser to `database`, driven by a task of its own until
    /// the client is dropped.
    async fn connect(self, database: &str) -> Result<tokio_postgres::Client, BoxError> {
        let config = format!(
            "host=127.0.0.1 port={} user={USER} dbname={database} connect_timeout=5",
            self.port
        );
        let (client, connection) = tokio_postgres::connect(&config, tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// The counters of `database` now, on a connection to another database (`postgres`),
    /// so that the reads are not among what they count.
    pub(crate) async fn counters(self, database: &str) -> Result<Counters, BoxError> {
        let read = async {
            let client = self.connect("postgres").await?;
            let rows = client
                .query(
                    "SELECT s.query, s.calls, s.wal_bytes::float8 FROM pg_stat_statements s \
                     JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1",
                    &[&database],
                )
                .await?;
            let mut counters = Counters::default();
            for row in rows {
                let query: String = row.try_get(0)?;
                let calls: i64 = row.try_get(1)?;
                *counters.calls.entry(label(&query)).or_default() +=
                    u64::try_from(calls).unwrap_or(0);
                counters.wal_bytes += row.try_get::<_, f64>(2)?;
            }
            // Through JSON, so that a server without the columns answers NULL.
            let wal = client
                .query_one(
                    "SELECT (to_jsonb(w) ->> 'wal_sync')::int8, \
                     (to_jsonb(w) ->> 'wal_sync_time')::float8 FROM pg_stat_wal w",
                    &[],
                )
                .await?;
            let syncs: Option<i64> = wal.try_get(0)?;
            let ms: Option<f64> = wal.try_get(1)?;
            counters.wal_syncs = syncs.map(|n| (n, ms.unwrap_or(f64::NAN)));
            Ok::<_, BoxError>(counters)
        };
        tokio::time::timeout(READ_TIMEOUT, read)
            .await
            .map_err(|_| format!("pg_stat_statements: no answer within {READ_TIMEOUT:?}"))?
    }
}

/// What a statement of the store is, for the report: `claim` and `complete` (the two
/// of a first execution, docs/behaviour.md §22), else its first words. The text is as
/// `pg_stat_statements` keeps it, every constant (`NULL` too) a `$n`.
fn label(query: &str) -> String {
    let words: Vec<&str> = query.split_whitespace().collect();
    let text = words.join(" ");
    if text.starts_with("WITH ins AS (INSERT") {
        "claim".to_owned()
    } else if text.starts_with("WITH c AS (UPDATE")
        && text.contains("WHERE id = $1 AND owner = $2 AND expires_at > $5")
    {
        "complete".to_owned()
    } else {
        let head: String = text.chars().take(40).collect();
        if head.len() < text.len() {
            format!("{head}…")
        } else {
            head
        }
    }
}

/// What a PostgreSQL target's database did during a run (warm-up included), per request.
#[derive(Debug, Clone)]
pub(crate) struct PgUse {
    /// Statements executed: each is one round trip (none is pipelined) and, outside a
    /// transaction, one commit.
    pub(crate) statements: f64,
    /// Per statement, e.g. `claim 1.00, complete 1.00`.
    pub(crate) by_statement: String,
    /// WAL its statements wrote, in bytes.
    pub(crate) wal_bytes: f64,
    /// The cluster's WAL flushes (fdatasync), and the µs they took, per request. Each
    /// backend reports these at most once a second, so a run's last second is missing
    /// (and is counted in whatever runs 10 s later): read them as ±10 %.
    pub(crate) wal_syncs: Option<(f64, f64)>,
}

impl PgUse {
    pub(crate) fn between(before: &Counters, after: &Counters, requests: u64) -> Self {
        let n = requests.max(1) as f64;
        let mut total = 0;
        let mut by_statement = Vec::new();
        for (label, calls) in &after.calls {
            let delta = calls.saturating_sub(before.calls.get(label).copied().unwrap_or(0));
            if delta > 0 {
                total += delta;
                by_statement.push(format!("{label} {:.2}", delta as f64 / n));
            }
        }
        Self {
            statements: total as f64 / n,
            by_statement: if by_statement.is_empty() {
                "none".to_owned()
            } else {
                by_statement.join(", ")
            },
            wal_bytes: (after.wal_bytes - before.wal_bytes).max(0.0) / n,
            wal_syncs: match (before.wal_syncs, after.wal_syncs) {
                (Some((syncs_a, ms_a)), Some((syncs_b, ms_b))) => Some((
                    (syncs_b - syncs_a).max(0) as f64 / n,
                    (ms_b - ms_a).max(0.0) * 1e3 / n,
                )),
                _ => None,
            },
        }
    }
}
