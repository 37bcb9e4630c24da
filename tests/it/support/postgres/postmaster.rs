//! The server process of a [`super::PgServer`]: its cluster made by `initdb`, the
//! settings this helper adds, and its postmaster, started until it accepts connections and
//! shut down (immediate, then SIGKILL) when dropped.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::programs::{Endpoint, as_postgres, as_root, bin, run_bounded};
use super::{HARNESS_CONF, IMMEDIATE_TIMEOUT, POLL_INTERVAL, PgOptions, READY_TIMEOUT};

/// A running postmaster, shut down when dropped.
#[derive(Debug)]
pub(super) struct Postmaster {
    /// `None` once reaped.
    child: Option<Child>,
}

impl Postmaster {
    /// `None` once it has exited and been reaped.
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it has exited (and is reaped).
    pub(super) fn exited(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            None | Some(Ok(Some(_))) => {
                self.child = None;
                true
            }
            Some(Ok(None)) => false,
            Some(Err(e)) => panic!("try_wait postgres: {e}"),
        }
    }

    /// Polls until it has exited, at most `limit`; true if it did.
    pub(super) fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.exited() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// `kill -SIGNAL pid`: it runs as another user when the tests run as root, which
    /// root may signal.
    pub(super) fn signal(&self, signal: &str) {
        // Reaped, its pid may be another process's by now.
        let Some(pid) = self.pid() else { return };
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .stderr(Stdio::null())
            .status();
    }

    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Postmaster {
    fn drop(&mut self) {
        // SIGQUIT: the postmaster stops its backends and exits without a checkpoint.
        self.signal("QUIT");
        if !self.wait_exit(IMMEDIATE_TIMEOUT) {
            self.kill();
        }
    }
}

pub(super) enum StartError {
    /// The port was taken between choosing it and the server binding it.
    AddrInUse(String),
    /// The backends of a killed postmaster still hold its shared memory.
    Busy(String),
    Failed(String),
}

pub(super) fn log_path(dir: &Path) -> PathBuf {
    dir.join("postgres.log")
}

/// `initdb` of `dir/data` with superuser `postgres` and trust for local and 127.0.0.1
/// (replication included), in the C locale whatever the caller's.
pub(super) fn initdb(dir: &Path) {
    let mut cmd = as_postgres(&bin("initdb"), dir);
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args(["-U", "postgres", "--auth=trust", "--locale=C", "-E", "UTF8"])
        .arg("--no-sync");
    let out = run_bounded(cmd, READY_TIMEOUT, "initdb");
    assert!(
        out.status.success(),
        "initdb in {}: {}{}\n{}\n{}",
        dir.display(),
        out.status,
        if as_root() {
            " (as root it runs as postgres, which must reach the temp dir: check TMPDIR)"
        } else {
            ""
        },
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// This helper's settings, last in `postgresql.conf`: the address, port and socket of this
/// server, and what replication needs (the defaults, said here so they hold whatever
/// the package's).
pub(super) fn write_harness_conf(dir: &Path, port: u16, options: &PgOptions) {
    let mut text = format!(
        "# Written by tests/it/support/postgres.rs at every start on a new port.\n\
         listen_addresses = '127.0.0.1'\n\
         port = {port}\n\
         unix_socket_directories = '{}'\n\
         fsync = {}\n\
         shared_buffers = 16MB\n\
         wal_level = replica\n\
         max_wal_senders = 10\n\
         hot_standby = on\n",
        dir.display(),
        if options.fsync { "on" } else { "off" },
    );
    for line in &options.conf {
        text.push_str(line);
        text.push('\n');
    }
    let path = dir.join("data").join(HARNESS_CONF);
    fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Starts the postmaster on `dir/data` and waits until it accepts connections. Only the
/// log this start wrote decides why it failed.
pub(super) fn spawn_and_wait(dir: &Path, port: u16) -> Result<Postmaster, StartError> {
    let path = log_path(dir);
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let from = log.metadata().map_or(0, |m| m.len());
    let _ = writeln!(
        log,
        "--- tests/it/support/postgres.rs: start on port {port}"
    );
    let log_err = log.try_clone().expect("clone log handle");
    let mut cmd = as_postgres(&bin("postgres"), dir);
    let child = cmd
        .arg("-D")
        .arg(dir.join("data"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn postgres ({cmd:?}): {e}"));
    // Owns the child from here on: an error below shuts it down.
    let mut postmaster = Postmaster { child: Some(child) };
    let at = Endpoint {
        port,
        dir: dir.to_owned(),
    };
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if postmaster.exited() {
            let all = at.log();
            let this = all
                .get(usize::try_from(from).unwrap_or(0)..)
                .unwrap_or(&all);
            let log = format!("postgres exited\n{this}");
            return Err(if this.contains("Address already in use") {
                StartError::AddrInUse(log)
            } else if this.contains("is still in use") {
                StartError::Busy(log)
            } else {
                StartError::Failed(log)
            });
        }
        if at.ready() {
            return Ok(postmaster);
        }
        if Instant::now() > deadline {
            return Err(StartError::Failed(format!(
                "not accepting connections within {READY_TIMEOUT:?}\n{}",
                at.log()
            )));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}
