//! The PostgreSQL programs this helper runs: where they are, as which user, bounded in
//! time, and `psql` against one server.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

pub(super) use crate::support::commands::{blocking, run_bounded};

use super::postmaster::log_path;
use super::{POLL_INTERVAL, PSQL_TIMEOUT, READY_TIMEOUT};

/// A server's port and dir: enough to run `psql` and read the log on any thread.
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    pub(super) port: u16,
    pub(super) dir: PathBuf,
}

impl Endpoint {
    pub(super) fn log(&self) -> String {
        fs::read_to_string(log_path(&self.dir)).unwrap_or_else(|e| format!("<no log: {e}>"))
    }

    pub(super) fn psql(&self, sql: &str) -> String {
        self.try_psql(sql).unwrap_or_else(|error| {
            panic!(
                "psql -p {} -c {sql:?}: {error}\nserver log:\n{}",
                self.port,
                self.log()
            )
        })
    }

    pub(super) fn psql_command(&self) -> Command {
        let mut cmd = Command::new(bin("psql"));
        cmd.args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1"])
            .args(["-U", "postgres", "-d", "postgres", "-p"])
            .arg(self.port.to_string())
            .env("PGCONNECT_TIMEOUT", "5");
        cmd
    }

    pub(super) fn try_psql(&self, sql: &str) -> Result<String, String> {
        let mut cmd = self.psql_command();
        cmd.arg("-c").arg(sql);
        let out = run_bounded(cmd, PSQL_TIMEOUT, &format!("psql -c {sql:?}"));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    pub(super) fn wait_for(&self, sql: &str, want: &str) {
        if let Err(got) = self.poll(sql, want) {
            panic!(
                "{sql:?} on port {} still answers {got:?}, not {want:?}, after \
                 {READY_TIMEOUT:?}\nserver log:\n{}",
                self.port,
                self.log()
            );
        }
    }

    /// Runs `sql` until it answers `want`, at most `READY_TIMEOUT`; `Err` has the last
    /// answer (or error).
    pub(super) fn poll(&self, sql: &str, want: &str) -> Result<(), Result<String, String>> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let got = self.try_psql(sql);
            if got.as_deref() == Ok(want) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(got);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// `pg_isready`: accepting connections (a hot standby once it is consistent).
    pub(super) fn ready(&self) -> bool {
        Command::new(bin("pg_isready"))
            .args(["-q", "-t", "1", "-h", "127.0.0.1"])
            .args(["-U", "postgres", "-d", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("run pg_isready: {e}"))
            .success()
    }
}

/// Whether this process runs as root, when PostgreSQL's programs must not.
pub(super) fn as_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        let out = Command::new("id").arg("-u").output().expect("run id -u");
        let root = String::from_utf8_lossy(&out.stdout).trim() == "0";
        if root {
            let user = Command::new("id").arg("postgres").output();
            assert!(
                user.is_ok_and(|out| out.status.success()),
                "the tests run as root, so PostgreSQL runs as the user postgres, which does \
                 not exist (Debian's postgresql package creates it; scripts/test.sh installs it)"
            );
        }
        root
    })
}

/// `program`, run as `postgres` when the tests run as root (`setpriv` execs it, so the
/// child is the program itself), in `dir` with `HOME` there: the caller's may be closed
/// to that user.
pub(super) fn as_postgres(program: &Path, dir: &Path) -> Command {
    let mut cmd = if as_root() {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=postgres", "--regid=postgres"])
            .args(["--init-groups", "--"])
            .arg(program);
        cmd
    } else {
        Command::new(program)
    };
    cmd.current_dir(dir).env("HOME", dir);
    cmd
}

/// A PostgreSQL program: from the highest `/usr/lib/postgresql/N/bin` that has `initdb`
/// (Debian's packages put only wrappers on PATH, and no `initdb`), else from
/// `pg_config --bindir`, else from PATH.
pub(super) fn bin(name: &str) -> PathBuf {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let debian = fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let version: u32 = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").is_file().then_some((version, bin))
            })
            .max_by_key(|(version, _)| *version)
            .map(|(_, bin)| bin);
        debian.or_else(|| {
            let out = Command::new("pg_config").arg("--bindir").output().ok()?;
            let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            (out.status.success() && bin.join("initdb").is_file()).then_some(bin)
        })
    });
    dir.as_ref()
        .map_or_else(|| PathBuf::from(name), |dir| dir.join(name))
}
