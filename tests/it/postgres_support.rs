//! The PostgreSQL test helpers do what the Postgres store's tests (docs/behaviour.md §22)
//! rely on: a throwaway cluster that answers, keeps committed data across a fast stop
//! and a SIGKILL, a synchronous hot standby that refuses writes until promoted, and
//! nothing left running or on disk after the handle is gone, also after a panic.

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};

use support::postgres::PgServer;
use tokio::net::TcpStream;

fn pid_alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run kill -0")
        .success()
}

/// The processes whose command line names `data_dir` (the postmaster's `-D`), as
/// `pgrep -af` would list them, read from /proc so that procps need not be installed.
fn processes_of(data_dir: &Path) -> String {
    let dir = data_dir.to_string_lossy();
    let mut found = String::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue; // exited meanwhile, or not a process
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(dir.as_ref()) {
            found.push_str(&format!(
                "{} {cmdline}\n",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

async fn refuses(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).await.is_err()
}

#[tokio::test]
async fn starts_answers_and_has_a_url() {
    let pg = PgServer::start().await;
    assert_ne!(pg.port, 0);
    assert!(pg.is_running());
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port)
    );
    assert_eq!(pg.psql("SELECT 1"), "1");
    assert_eq!(pg.psql("SHOW fsync"), "off", "off unless asked for");
    assert_eq!(pg.psql("SHOW listen_addresses"), "127.0.0.1");
    let error = pg.try_psql("SELECT nonsense").expect_err("an SQL error");
    assert!(error.contains("nonsense"), "{error}");
}

#[tokio::test]
async fn options_reach_the_server() {
    let pg = PgServer::builder()
        .fsync(true)
        .conf("work_mem = '5MB'")
        .conf("max_connections = 20")
        .start()
        .await;
    assert_eq!(pg.psql("SHOW fsync"), "on");
    assert_eq!(pg.psql("SHOW work_mem"), "5MB");
    assert_eq!(pg.psql("SHOW max_connections"), "20");
}

#[tokio::test]
async fn data_survives_stop_and_start_again_on_the_same_port() {
    let pg = PgServer::start().await;
    let port = pg.port;
    pg.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (7)");

    pg.stop().await;
    assert!(!pg.is_running());
    assert!(pg.pid().is_none());
    assert!(refuses(port).await, "port still accepts after stop");
    assert!(
        pg.log().contains("database system is shut down"),
        "{}",
        pg.log()
    );

    pg.start_again().await;
    assert!(pg.is_running());
    assert_eq!(pg.port, port);
    assert_eq!(pg.psql("SELECT v FROM t"), "7");
}

#[tokio::test]
async fn after_kill9_the_port_refuses_and_start_again_recovers_committed_data() {
    let pg = PgServer::start().await;
    let port = pg.port;
    pg.psql("CREATE TABLE t (v int)");
    pg.psql("INSERT INTO t VALUES (1)");
    let old_pid = pg.pid().expect("running");

    pg.kill9();
    assert!(!pg.is_running());
    assert!(!pid_alive(old_pid), "the killed postmaster is reaped");
    assert!(refuses(port).await, "port still accepts after kill -9");

    pg.start_again().await;
    assert_ne!(pg.pid(), Some(old_pid));
    assert_eq!(pg.psql("SELECT v FROM t"), "1");
    let log = pg.log();
    assert!(
        log.contains("database system was interrupted") || log.contains("not properly shut down"),
        "no crash recovery in the log:\n{log}"
    );
}

/// A backend busy in a statement does not notice its postmaster's death until the
/// statement ends, and holds the old shared memory until then: the new postmaster
/// refuses to start (`is still in use`) and `start_again` tries again until it can.
#[tokio::test]
async fn start_again_waits_for_the_busy_backends_of_a_killed_postmaster() {
    let pg = PgServer::start().await;
    pg.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)");
    let busy = "DO $$ BEGIN WHILE clock_timestamp() < now() + interval '1 s' LOOP END LOOP; END $$";
    let mut client = pg
        .psql_command()
        .args(["-c", busy])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn psql");
    pg.wait_for(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'DO %'",
        "1",
    )
    .await;

    pg.kill9();
    pg.start_again().await;
    assert_eq!(pg.psql("SELECT v FROM t"), "1");
    let log = pg.log();
    assert!(log.contains("is still in use"), "no refused start:\n{log}");
    let _ = client.wait();
}

#[tokio::test]
async fn a_sync_standby_follows_refuses_writes_and_accepts_them_once_promoted() {
    let primary = PgServer::start().await;
    let standby = primary.standby(true).await;
    assert_ne!(standby.port, primary.port);
    let name = standby.application_name().expect("a standby has a name");
    assert_eq!(
        primary.psql(&format!(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
        )),
        "sync"
    );
    assert_eq!(primary.psql("SHOW synchronous_standby_names"), name);
    assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "t");

    primary.psql("CREATE TABLE t (v int)");
    primary.psql("INSERT INTO t VALUES (1)");
    // A synchronous commit waits for the standby's flush, not for its replay.
    standby.wait_for("SELECT count(*) FROM t", "1").await;
    let refused = standby
        .try_psql("INSERT INTO t VALUES (2)")
        .expect_err("a standby is read-only");
    assert!(
        refused.contains("cannot execute INSERT in a read-only transaction"),
        "{refused}"
    );

    standby.promote().await;
    assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "f");
    standby.psql("INSERT INTO t VALUES (2)");
    assert_eq!(standby.psql("SELECT sum(v) FROM t"), "3");
    assert_eq!(standby.psql("SHOW synchronous_standby_names"), "");
}

#[tokio::test]
async fn an_async_standby_streams_as_async() {
    let primary = PgServer::start().await;
    let standby = primary.standby(false).await;
    let name = standby.application_name().expect("a standby has a name");
    assert_eq!(
        primary.psql(&format!(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
        )),
        "streaming|async"
    );
    assert_eq!(primary.psql("SHOW synchronous_standby_names"), "");
}

#[tokio::test]
async fn drop_leaves_no_postgres_and_no_dir() {
    let primary = PgServer::start().await;
    let standby = primary.standby(true).await;
    let dirs = [primary.data_dir(), standby.data_dir()];
    for dir in &dirs {
        assert!(
            !processes_of(dir).is_empty(),
            "pgrep finds {}",
            dir.display()
        );
    }

    drop(standby);
    drop(primary);
    for dir in &dirs {
        assert_eq!(processes_of(dir), "", "left running");
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

#[tokio::test]
async fn a_test_that_panics_leaves_no_postgres() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let failed = tokio::spawn(async move {
        let pg = PgServer::start().await;
        tx.send(pg.data_dir()).expect("the test waits");
        panic!("a failing test holding {}", pg.url());
    })
    .await;
    assert!(failed.expect_err("it panicked").is_panic());
    let dir = rx.await.expect("started before panicking");
    assert_eq!(processes_of(&dir), "", "left running");
    assert!(!dir.exists(), "{} left behind", dir.display());
}
