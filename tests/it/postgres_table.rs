//! Replicas starting at once on a database without the table (docs/behaviour.md §22):
//! one creates it, the others wait for it and use it. Found by the failover runs
//! (`chaos_scale.rs`), where the second of three replicas started on a fresh database
//! exited with `relation "idemgate_records" already exists`.

use crate::support;

use std::time::{Duration, Instant};

use support::bin::{Running, TempConfig};
use support::postgres::PgServer;
use support::{TestClient, Upstream};

const TABLE: &str = "idemgate_records";

/// Another replica holds the creation lock: this one finds no table, waits for the lock,
/// and must then see the table the other one committed meanwhile instead of creating it
/// again (a transaction begun before the wait would not).
#[tokio::test]
async fn a_replica_that_waited_for_another_to_create_the_table_uses_it() {
    let server = PgServer::start().await;
    let (other, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let connection = tokio::spawn(connection);
    // The other replica, midway through its creation: the lock held, nothing committed.
    other
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('idemgate table {TABLE}'))"
        ))
        .await
        .expect("take the creation lock");

    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {}\nstore:\n  kind: postgres\n  url: {}\n  timeout: 500ms\n",
        up.url(),
        server.url()
    );
    let config = TempConfig::new(&yaml);
    let path = config.path().to_string_lossy().into_owned();
    // It listens before it checks the table (src/cli.rs), so it is up while it waits.
    let mut replica = Running::start(&["--config", &path]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        != "1"
    {
        assert!(
            Instant::now() < deadline && !replica.has_exited(),
            "the replica never waited for the creation lock:\n{}",
            replica.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for statement in idemgate::store::create_statements(TABLE) {
        other.batch_execute(&statement).await.expect("create");
    }
    other.batch_execute("COMMIT").await.expect("commit");

    let sent = TestClient::new(replica.addr)
        .try_send_bytes(
            "POST",
            "/charges",
            &[("idempotency-key", "after-the-wait")],
            b"{}".to_vec(),
        )
        .await;
    let answer = sent.unwrap_or_else(|e| panic!("{e}; the replica's log:\n{}", replica.stderr()));
    assert_eq!(answer.status, 201, "{}", replica.stderr());
    assert!(!replica.has_exited(), "{}", replica.stderr());
    assert_eq!(server.psql(&format!("SELECT count(*) FROM {TABLE}")), "1");
    drop(other);
    connection.abort();
    replica.terminate().await;
}
