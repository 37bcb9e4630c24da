//! Streaming standbys of a [`PgServer`]: `pg_basebackup -R` into a dir of their own,
//! started as hot standbys on a free port, synchronous when asked, for the failover and
//! durability tests of the Postgres store (docs/behaviour.md §22).

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::postmaster::{StartError, spawn_and_wait, write_harness_conf};
use super::programs::{Endpoint, as_postgres, bin, blocking, run_bounded};
use super::{POLL_INTERVAL, PgOptions, PgServer, READY_TIMEOUT};

static NEXT_STANDBY: AtomicU64 = AtomicU64::new(0);

impl PgServer {
    /// A hot standby of this server, streaming from it, with its options. Returns once
    /// the primary's `pg_stat_replication` shows it streaming, as `sync` or `async`.
    ///
    /// With `sync`, the primary's `synchronous_standby_names` becomes this standby's
    /// `application_name` alone (an earlier synchronous standby is one no longer): from
    /// then on a commit on the primary waits for it, so one dropped or killed first
    /// leaves the primary's commits waiting, as it would in production.
    pub async fn standby(&self, sync: bool) -> PgServer {
        let (primary, options) = (self.endpoint(), self.options.clone());
        blocking(move || replicate(&primary, options, sync)).await
    }

    /// Points this standby's WAL receiver at `port` of 127.0.0.1 (a relay in front of
    /// `primary`, which a test slows down or cuts) and returns once it streams through
    /// it, as synchronous as it was. `primary_conninfo` is reloaded without a restart.
    pub async fn stream_through(&self, primary: &PgServer, port: u16) {
        let name = self
            .application_name()
            .expect("stream_through: a standby made by standby()")
            .to_owned();
        let (at, primary) = (self.endpoint(), primary.endpoint());
        blocking(move || {
            let was = primary.psql(&format!(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
            ));
            at.psql(&format!(
                "ALTER SYSTEM SET primary_conninfo = \
                 'host=127.0.0.1 port={port} user=postgres application_name={name}'"
            ));
            at.psql("SELECT pg_reload_conf()");
            at.wait_for(
                &format!(
                    "SELECT status FROM pg_stat_wal_receiver WHERE conninfo LIKE '% port={port} %'"
                ),
                "streaming",
            );
            primary.wait_for(
                &format!(
                    "SELECT state, sync_state FROM pg_stat_replication \
                     WHERE application_name = '{name}'"
                ),
                &format!("streaming|{was}"),
            );
        })
        .await;
    }
}

impl PgServer {
    /// Brings a server that was killed back as a hot standby of `primary` on its own
    /// port, as an operator re-imaging the old primary after a failover does: its data
    /// dir is replaced by a `pg_basebackup` of `primary`, taken through `via_port` of
    /// 127.0.0.1 (the primary's own port, or a relay in front of it), which it then
    /// streams from. With `sync` the primary's `synchronous_standby_names` becomes this
    /// standby alone. Returns once the primary shows it streaming.
    pub async fn rebuild_as_standby_of(&self, primary: &PgServer, via_port: u16, sync: bool) {
        assert!(
            !self.is_running(),
            "postgres on port {} still runs: kill it first",
            self.port
        );
        let name = format!("node_{}", self.port);
        let (at, dir, port, options) = (
            primary.endpoint(),
            self.dir.clone(),
            self.port,
            self.options.clone(),
        );
        let data = self.data_dir();
        let postmaster = blocking(move || {
            let mut rm = Command::new("rm");
            rm.arg("-rf").arg(&data);
            let out = run_bounded(rm, READY_TIMEOUT, "rm -rf the old data dir");
            assert!(out.status.success(), "rm -rf {}", data.display());
            let via = Endpoint {
                port: via_port,
                dir: at.dir.clone(),
            };
            basebackup_into(&via, &dir, &data, &name);
            let auto = data.join("postgresql.auto.conf");
            let mut conf = OpenOptions::new()
                .append(true)
                .open(&auto)
                .unwrap_or_else(|e| panic!("open {}: {e}", auto.display()));
            writeln!(conf, "synchronous_standby_names = ''").expect("write postgresql.auto.conf");
            write_harness_conf(&dir, port, &options);
            let deadline = Instant::now() + READY_TIMEOUT;
            let postmaster = loop {
                let log = match spawn_and_wait(&dir, port) {
                    Ok(postmaster) => break postmaster,
                    Err(StartError::Failed(log)) => {
                        panic!("the rebuilt standby did not start on port {port}:\n{log}")
                    }
                    Err(StartError::AddrInUse(log) | StartError::Busy(log)) => log,
                };
                assert!(
                    Instant::now() < deadline,
                    "the rebuilt standby could not start on port {port}:\n{log}"
                );
                std::thread::sleep(POLL_INTERVAL);
            };
            if sync {
                at.psql(&format!(
                    "ALTER SYSTEM SET synchronous_standby_names = '{name}'"
                ));
                at.psql("SELECT pg_reload_conf()");
            }
            let want = if sync {
                "streaming|sync"
            } else {
                "streaming|async"
            };
            at.wait_for(
                &format!(
                    "SELECT state, sync_state FROM pg_stat_replication \
                     WHERE application_name = '{name}'"
                ),
                want,
            );
            postmaster
        })
        .await;
        *self.postmaster() = Some(postmaster);
    }
}

fn replicate(primary: &Endpoint, options: PgOptions, sync: bool) -> PgServer {
    let name = format!("standby_{}", NEXT_STANDBY.fetch_add(1, Ordering::SeqCst));
    let mut standby = PgServer::empty(options, Some(name.clone()));
    basebackup(primary, &standby, &name);
    // `ALTER SYSTEM` on the primary may have named a synchronous standby, and the copy
    // keeps it: promoted, this server would then wait for a standby it does not have.
    // A line appended to postgresql.auto.conf wins over the earlier one.
    let auto = standby.data_dir().join("postgresql.auto.conf");
    let mut conf = OpenOptions::new()
        .append(true)
        .open(&auto)
        .unwrap_or_else(|e| panic!("open {}: {e}", auto.display()));
    writeln!(conf, "synchronous_standby_names = ''").expect("write postgresql.auto.conf");
    standby.start_on_free_port();
    if sync {
        // Not in one `-c`: ALTER SYSTEM refuses to run inside a transaction block.
        primary.psql(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{name}'"
        ));
        primary.psql("SELECT pg_reload_conf()");
    }
    let want = if sync {
        "streaming|sync"
    } else {
        "streaming|async"
    };
    let sql = format!(
        "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
    );
    if let Err(got) = primary.poll(&sql, want) {
        panic!(
            "standby {name} on port {} not {want:?} after {READY_TIMEOUT:?}: {got:?}\n\
             primary log:\n{}\nstandby log:\n{}",
            standby.port,
            primary.log(),
            standby.log()
        );
    }
    standby
}

/// `pg_basebackup -R -X stream` of `primary` into the standby's data dir; `-R` writes
/// `standby.signal` and a `primary_conninfo` that carries `application_name`.
fn basebackup(primary: &Endpoint, standby: &PgServer, name: &str) {
    basebackup_into(primary, &standby.dir, &standby.data_dir(), name);
}

fn basebackup_into(primary: &Endpoint, dir: &Path, data: &Path, name: &str) {
    let mut cmd = as_postgres(&bin("pg_basebackup"), dir);
    cmd.arg("-d")
        .arg(format!(
            "host=127.0.0.1 port={} user=postgres application_name={name}",
            primary.port
        ))
        .arg("-D")
        .arg(data)
        .args(["-R", "-X", "stream", "--checkpoint=fast"]);
    let out = run_bounded(cmd, READY_TIMEOUT, "pg_basebackup");
    assert!(
        out.status.success(),
        "pg_basebackup from port {}: {}\n{}\nprimary log:\n{}",
        primary.port,
        out.status,
        String::from_utf8_lossy(&out.stderr),
        primary.log()
    );
}
