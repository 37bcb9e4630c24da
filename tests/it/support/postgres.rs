//! Throwaway PostgreSQL clusters for the tests of the Postgres store (docs/behaviour.md §22):
//! each an `initdb` of its own under the temp dir, listening on a free port of 127.0.0.1
//! with trust authentication (user `postgres`, no password), its Unix socket and its log
//! in that dir. Dropping a handle shuts its server down (immediate shutdown, SIGKILL if
//! that hangs) and removes the dir, also when the test panics.
//!
//! PostgreSQL refuses to run as root, so when the tests do (CI), `initdb`, the server,
//! `pg_basebackup` and `pg_ctl` run as the `postgres` user through `setpriv`, which execs:
//! the child this helper holds is the postmaster itself, signalled and reaped directly.
//!
//! Deadlines use the wall clock, as in `redis.rs`: a test that pauses tokio's clock must
//! still wait for a real process.

mod postmaster;
mod programs;
mod standby;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::bin::free_port;
use postmaster::{Postmaster, StartError, initdb, spawn_and_wait, write_harness_conf};
use programs::{Endpoint, as_postgres, as_root, bin, blocking, run_bounded};

/// How long `initdb`, a start (crash recovery included), a promotion or a standby's
/// catching up may take on a busy two-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a fast shutdown may take before `stop` fails the test.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an immediate shutdown may take on drop before the postmaster is SIGKILLed.
const IMMEDIATE_TIMEOUT: Duration = Duration::from_secs(5);
/// A `psql` call taking longer than this is killed (a commit waiting for a standby that
/// is gone waits forever).
const PSQL_TIMEOUT: Duration = Duration::from_secs(20);
/// Sleep between probes; it never decides an outcome.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Attempts at finding a port the server can bind before giving up.
const PORT_ATTEMPTS: usize = 5;
/// The file, in the data dir, that holds this helper's settings; `postgresql.conf`
/// includes it last, so it overrides the defaults, and a standby's copy is rewritten.
const HARNESS_CONF: &str = "idemgate-harness.conf";

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// How a cluster is set up; a standby inherits its primary's.
#[derive(Debug, Clone, Default)]
pub struct PgOptions {
    fsync: bool,
    conf: Vec<String>,
}

impl PgOptions {
    /// `fsync` (off by default: a killed process loses nothing the kernel holds, so only
    /// a test of the machine's own crash would need it).
    pub fn fsync(mut self, on: bool) -> Self {
        self.fsync = on;
        self
    }

    /// A `postgresql.conf` line (`"max_connections = 20"`), after this helper's own, so
    /// it may override them.
    pub fn conf(mut self, line: &str) -> Self {
        self.conf.push(line.to_owned());
        self
    }

    pub async fn start(self) -> PgServer {
        blocking(move || PgServer::launch(self)).await
    }
}

/// One cluster and, while it runs, its postmaster.
#[derive(Debug)]
pub struct PgServer {
    pub port: u16,
    /// Holds the data dir (`data`), the socket and the log; removed on drop.
    dir: PathBuf,
    options: PgOptions,
    /// A standby's `application_name`, as the primary's `pg_stat_replication` shows it.
    name: Option<String>,
    postmaster: Mutex<Option<Postmaster>>,
}

impl PgServer {
    /// A primary with the default options.
    pub async fn start() -> PgServer {
        PgOptions::default().start().await
    }

    pub fn builder() -> PgOptions {
        PgOptions::default()
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: trust authentication, no password.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A standby's `application_name`; `None` for a server made by `start`.
    pub fn application_name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The postmaster's process id while one runs.
    pub fn pid(&self) -> Option<u32> {
        self.postmaster().as_ref().and_then(Postmaster::pid)
    }

    /// Whether the postmaster this handle started is still alive (false after `stop`,
    /// `kill9`, or a crash of its own).
    pub fn is_running(&self) -> bool {
        self.postmaster()
            .as_mut()
            .is_some_and(|postmaster| !postmaster.exited())
    }

    /// The server's log so far, every start of it.
    pub fn log(&self) -> String {
        self.endpoint().log()
    }

    /// Runs `sql` with `psql -At` as `postgres` and returns its trimmed output. Panics
    /// with `psql`'s error and the server log when it fails, and after `PSQL_TIMEOUT`.
    pub fn psql(&self, sql: &str) -> String {
        self.endpoint().psql(sql)
    }

    /// [`PgServer::psql`] that returns `psql`'s error output instead of panicking on an
    /// SQL or connection error (still panics after `PSQL_TIMEOUT`).
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        self.endpoint().try_psql(sql)
    }

    /// `psql -X -q -At -v ON_ERROR_STOP=1` connected to this server as `postgres`, for a
    /// session the test runs on its own (one held open, a statement that must not
    /// finish first); add `-c SQL` or `-f FILE`.
    pub fn psql_command(&self) -> Command {
        self.endpoint().psql_command()
    }

    /// Polls `sql` until its output is `want`; fails the test after `READY_TIMEOUT`
    /// with the last answer and the log. Errors count as not yet (a standby replaying).
    pub async fn wait_for(&self, sql: &str, want: &str) {
        let (at, sql, want) = (self.endpoint(), sql.to_owned(), want.to_owned());
        blocking(move || at.wait_for(&sql, &want)).await;
    }

    /// Fast shutdown (SIGINT: sessions are ended, a checkpoint is written) and waits
    /// until the postmaster has exited.
    pub async fn stop(&self) {
        let mut postmaster = self.take_running("stop");
        let at = self.endpoint();
        blocking(move || {
            postmaster.signal("INT");
            if !postmaster.wait_exit(STOP_TIMEOUT) {
                panic!(
                    "postgres on port {} still running {STOP_TIMEOUT:?} after a fast shutdown:\n{}",
                    at.port,
                    at.log()
                );
            }
        })
        .await;
    }

    /// SIGKILLs the postmaster and reaps it: a crash. Its backends notice on their own and
    /// exit; the port refuses connections from here on.
    pub fn kill9(&self) {
        self.take_running("kill9").kill();
    }

    /// SIGKILLs the postmaster and every process it started at once, then reaps it: the
    /// host is gone. After `kill9` alone a backend runs on until it next waits and may
    /// still commit and answer a statement; after this nothing of the server answers.
    pub fn kill_host(&self) {
        let mut postmaster = self.take_running("kill_host");
        if let Some(pid) = postmaster.pid() {
            let mut pids = children_of(pid);
            pids.push(pid);
            let _ = Command::new("kill")
                .arg("-KILL")
                .args(pids.iter().map(u32::to_string))
                .stderr(std::process::Stdio::null())
                .status();
        }
        postmaster.kill();
    }

    /// Starts the server again on its data dir and port (crash recovery after `kill9`),
    /// and waits until it accepts connections. Panics if it still runs.
    pub async fn start_again(&self) {
        assert!(
            !self.is_running(),
            "postgres on port {} still runs: stop() or kill9() first",
            self.port
        );
        let (dir, port) = (self.dir.clone(), self.port);
        let started = blocking(move || {
            let deadline = Instant::now() + READY_TIMEOUT;
            loop {
                let log = match spawn_and_wait(&dir, port) {
                    Ok(postmaster) => return postmaster,
                    Err(StartError::Failed(log)) => {
                        panic!("postgres did not start again on port {port}:\n{log}")
                    }
                    // The old socket not yet released, or the killed postmaster's backends
                    // still attached to its shared memory: both go away by themselves.
                    Err(StartError::AddrInUse(log) | StartError::Busy(log)) => log,
                };
                assert!(
                    Instant::now() < deadline,
                    "postgres could not start again on port {port} within {READY_TIMEOUT:?}:\n{log}"
                );
                std::thread::sleep(POLL_INTERVAL);
            }
        })
        .await;
        *self.postmaster() = Some(started);
    }

    /// `pg_ctl promote`, then waits until `pg_is_in_recovery()` is false.
    pub async fn promote(&self) {
        let (dir, at) = (self.dir.clone(), self.endpoint());
        blocking(move || {
            let data = dir.join("data");
            let mut cmd = as_postgres(&bin("pg_ctl"), &dir);
            cmd.arg("promote").arg("-W").arg("-D").arg(&data);
            let out = run_bounded(cmd, READY_TIMEOUT, "pg_ctl promote");
            assert!(
                out.status.success(),
                "pg_ctl promote: {}\n{}\nlog:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                at.log()
            );
            at.wait_for("SELECT pg_is_in_recovery()", "f");
        })
        .await;
    }

    /// What `psql` and the waits need, cheap to move onto a blocking thread.
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            port: self.port,
            dir: self.dir.clone(),
        }
    }

    fn postmaster(&self) -> MutexGuard<'_, Option<Postmaster>> {
        // A panic while holding the lock leaves the child as it was: still ours to stop.
        self.postmaster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take_running(&self, what: &str) -> Postmaster {
        self.postmaster()
            .take()
            .unwrap_or_else(|| panic!("{what}: postgres on port {} is not running", self.port))
    }

    /// A new dir with a fresh cluster in it, started on free ports until one binds.
    fn launch(options: PgOptions) -> PgServer {
        let mut server = PgServer::empty(options, None);
        initdb(&server.dir);
        let mut conf = OpenOptions::new()
            .append(true)
            .open(server.data_dir().join("postgresql.conf"))
            .expect("open postgresql.conf");
        writeln!(conf, "\ninclude '{HARNESS_CONF}'").expect("write postgresql.conf");
        server.start_on_free_port();
        server
    }

    /// A handle owning a new, empty dir that `postgres` may write; no server yet.
    fn empty(options: PgOptions, name: Option<String>) -> PgServer {
        let n = NEXT_DIR.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("idemgate-pg-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        // Owns the dir from here on, so every way out below removes it.
        let server = PgServer {
            port: 0,
            dir,
            options,
            name,
            postmaster: Mutex::new(None),
        };
        if as_root() {
            let mut chown = Command::new("chown");
            chown.arg("postgres").arg(&server.dir);
            let out = run_bounded(chown, READY_TIMEOUT, "chown postgres");
            assert!(
                out.status.success(),
                "chown postgres {}: {}",
                server.dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        server
    }

    /// Writes the harness settings for a free port and starts; a port taken meanwhile
    /// is replaced by another.
    fn start_on_free_port(&mut self) {
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            write_harness_conf(&self.dir, port, &self.options);
            match spawn_and_wait(&self.dir, port) {
                Ok(postmaster) => {
                    self.port = port;
                    *self.postmaster() = Some(postmaster);
                    return;
                }
                Err(StartError::AddrInUse(log)) => last = log,
                Err(StartError::Busy(log) | StartError::Failed(log)) => {
                    panic!("postgres did not start on port {port}:\n{log}")
                }
            }
        }
        panic!("postgres found no free port in {PORT_ATTEMPTS} attempts; last log:\n{last}")
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Immediate shutdown, then SIGKILL (Postmaster's drop), before the dir goes.
        let postmaster = self
            .postmaster
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(postmaster);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The processes whose parent is `pid`, from `/proc/*/stat`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`: comm may hold spaces, so from the last `)`.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}
