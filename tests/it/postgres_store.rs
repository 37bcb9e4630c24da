//! The proxy on the PostgreSQL store, over real sockets and real PostgreSQL servers
//! (docs/behaviour.md §22): the statement budget, restarts of either side, a standby,
//! the table's version, waiters across replicas, and what `--check` and the log say.

use crate::support;

use std::time::{Duration, Instant};

use idemgate::store::PostgresStore;
use support::bin::{Running, TempConfig, idemgate, run};
use support::postgres::PgServer;
use support::{Proxy, Upstream};

fn pg_yaml(url: &str, extra: &str) -> String {
    format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: postgres\n  url: {url}\n  timeout: 500ms\n{extra}"
    )
}

type PgProxy = Proxy<PostgresStore>;

/// The statements the server executed, as its log (`log_statement = all`) shows them,
/// from `from` bytes of it on.
fn executed(server: &PgServer, from: usize) -> Vec<String> {
    server.log()[from..]
        .lines()
        .filter(|line| line.contains("LOG:  execute") || line.contains("LOG:  statement:"))
        .map(str::to_owned)
        .collect()
}

/// Polls `f` until it answers `Some`, for at most `limit`.
async fn eventually<T>(limit: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// docs/behaviour.md §22 "Round trips": a first execution is two statements (claim,
/// complete) and a replay one, with no explicit transaction.
#[tokio::test]
async fn a_replay_is_one_statement_and_a_first_execution_two() {
    let server = PgServer::builder()
        .conf("log_statement = 'all'")
        .start()
        .await;
    let up = Upstream::start().await;
    let proxy: PgProxy = Proxy::postgres(&pg_yaml(&server.url(), ""), &up).await;
    let c = proxy.client();
    let from = server.log().len();
    for i in 0..10 {
        let r = c.post("/charges", &format!("first-{i}"), "{}").await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let firsts = executed(&server, from);
    assert_eq!(
        firsts.len(),
        20,
        "two statements per first execution:\n{firsts:#?}"
    );
    let from = server.log().len();
    for i in 0..10 {
        let r = c.post("/charges", &format!("first-{i}"), "{}").await;
        assert!(r.replayed());
    }
    let replays = executed(&server, from);
    assert_eq!(replays.len(), 10, "one statement per replay:\n{replays:#?}");
    assert!(
        !firsts
            .iter()
            .chain(&replays)
            .any(|l| l.contains("BEGIN") || l.contains("COMMIT")),
        "no explicit transaction on the hot path"
    );
    assert_eq!(up.count(), 10);
}

/// Every record survives a restart of idemgate: a new process (a new store) replays
/// them all.
#[tokio::test]
async fn a_restart_of_idemgate_keeps_every_record() {
    let server = PgServer::start().await;
    let up = Upstream::start().await;
    let yaml = pg_yaml(&server.url(), "");
    let first: PgProxy = Proxy::postgres(&yaml, &up).await;
    let mut bodies = Vec::new();
    for i in 0..20 {
        let r = first
            .client()
            .post("/charges", &format!("k{i}"), "{}")
            .await;
        assert_eq!(r.status, 201);
        bodies.push(r.body);
    }
    first.stop().await;
    let second: PgProxy = Proxy::postgres(&yaml, &up).await;
    for (i, body) in bodies.iter().enumerate() {
        let r = second
            .client()
            .post("/charges", &format!("k{i}"), "{}")
            .await;
        assert!(r.replayed(), "k{i} executed again");
        assert_eq!(&r.body, body);
    }
    assert_eq!(up.count(), 20);
}

/// The database stopped is `503 store-unavailable`; started again, it is followed
/// without a restart of idemgate, and what it held replays.
#[tokio::test]
async fn the_database_stopped_and_started_again_is_followed() {
    let server = PgServer::start().await;
    let up = Upstream::start().await;
    let proxy: PgProxy = Proxy::postgres(&pg_yaml(&server.url(), ""), &up).await;
    let c = proxy.client();
    let before = c.post("/charges", "before", "{}").await;
    assert_eq!(before.status, 201);
    server.stop().await;
    let down = c.post("/charges", "during", "{}").await;
    assert_eq!(down.status, 503, "{}", down.text());
    assert_eq!(down.problem(), "store-unavailable");
    server.start_again().await;
    let after = eventually(Duration::from_secs(20), async || {
        let r = c.post("/charges", "after", "{}").await;
        (r.status == 201).then_some(r)
    })
    .await;
    assert!(!after.replayed());
    let replay = c.post("/charges", "before", "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, before.body);
    assert_eq!(
        up.count(),
        2,
        "nothing executed while the database was down"
    );
}

/// A standby refuses writes: a claim there is `503 store-unavailable`, never forwarded,
/// and `/readyz` says not ready.
#[tokio::test]
async fn a_standby_is_store_unavailable() {
    let primary = PgServer::start().await;
    let up = Upstream::start().await;
    // The table is made on the primary and replicated.
    let _maker: PgProxy = Proxy::postgres(&pg_yaml(&primary.url(), ""), &up).await;
    let standby = primary.standby(false).await;
    standby
        .wait_for(
            "SELECT count(*) FROM pg_class WHERE relname = 'idemgate_records'",
            "1",
        )
        .await;
    let proxy: PgProxy = Proxy::postgres(&pg_yaml(&standby.url(), ""), &up).await;
    let r = proxy.client().post("/charges", "on-standby", "{}").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.problem(), "store-unavailable");
    assert_eq!(up.count(), 0);
    let admin = proxy.admin().await;
    let ready = admin.send("GET", "/readyz", &[], "").await;
    assert_eq!(ready.status, 503, "{}", ready.text());
}

/// The synchronous standby gone, every commit waits for it and every call times out
/// (`503 store-unavailable`). The statement each timed-out call leaves is cancelled as
/// its connection is closed: the server keeps no more processes than the pool has
/// connections, instead of one more per timeout until it refuses every client.
#[tokio::test]
async fn calls_timed_out_on_a_stalled_commit_leave_no_server_process_behind() {
    let primary = PgServer::start().await;
    let standby = primary.standby(true).await;
    let up = Upstream::start().await;
    let proxy: PgProxy = Proxy::postgres(&pg_yaml(&primary.url(), "  pool_size: 4\n"), &up).await;
    let c = proxy.client();
    assert_eq!(c.post("/charges", "before", "{}").await.status, 201);
    standby.kill9();
    for i in 0..12 {
        let r = c.post("/charges", &format!("stalled-{i}"), "{}").await;
        assert_eq!(r.status, 503, "{}", r.text());
    }
    primary
        .wait_for(
            "SELECT count(*) <= 4 FROM pg_stat_activity WHERE application_name = 'idemgate'",
            "t",
        )
        .await;
    assert_eq!(up.count(), 1, "nothing forwarded without its claim");
}

/// Two replicas on one table, `on_concurrent: wait`: the waiter on the other replica is
/// woken by the completion's notification and replays.
#[tokio::test]
async fn a_waiter_on_another_replica_replays_the_completion() {
    let server = PgServer::start().await;
    let up = Upstream::start().await;
    let yaml = pg_yaml(
        &server.url(),
        "idempotency:\n  on_concurrent: wait\n  wait_timeout: 10s\n",
    );
    let a: PgProxy = Proxy::postgres(&yaml, &up).await;
    let b: PgProxy = Proxy::postgres(&yaml, &up).await;
    let first = a.client().spawn_post("/gate/charges", "waited", "{}");
    up.wait_for(1).await;
    let second = b.client().spawn_post("/gate/charges", "waited", "{}");
    // The waiter listens before it is woken.
    server
        .wait_for(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'LISTEN%'",
            "t",
        )
        .await;
    // The completion notifies the table's channel with the row's id: a session of the
    // test's own hears it.
    let (listener, mut connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let (heard, mut hear) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(note) = message {
                let _ = heard.send(note.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute("LISTEN idemgate_idemgate_records")
        .await
        .expect("LISTEN");
    up.open_gate();
    let first = first.await.expect("join");
    let second = second.await.expect("join");
    assert_eq!(first.status, 201);
    assert!(second.replayed(), "{}", second.text());
    let id = a.record_id("/gate/charges", "waited");
    let note = tokio::time::timeout(Duration::from_secs(10), hear.recv())
        .await
        .expect("a notification")
        .expect("the session is open");
    assert!(id.ends_with(&note), "{note} is not {id}'s row");
    assert_eq!(second.body, first.body);
    assert_eq!(up.count(), 1);
}

async fn exits_naming_the_table(server: &PgServer, extra: &str, says: &str) {
    let up = Upstream::start().await;
    let yaml = pg_yaml(&server.url(), extra).replace("{upstream}", &up.url());
    let config = TempConfig::new(&yaml);
    let path = config.path().to_string_lossy().into_owned();
    let out = run(idemgate().args(["--config", &path, "--listen", "127.0.0.1:0"])).await;
    assert_eq!(out.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains(says), "{}", out.stderr);
}

/// docs/behaviour.md §22 "Its version": a table of another version, one that is not
/// idemgate's, or none with `create_table: false`, stops idemgate naming it, and the
/// table is left as it was.
#[tokio::test]
async fn a_table_that_is_not_this_versions_is_refused_and_left_alone() {
    let server = PgServer::start().await;
    server.psql("CREATE TABLE orders (id int PRIMARY KEY); INSERT INTO orders VALUES (7)");
    exits_naming_the_table(
        &server,
        "  table: orders\n",
        "table orders exists and is not idemgate's",
    )
    .await;
    assert_eq!(server.psql("SELECT id FROM orders"), "7");
    assert_eq!(
        server.psql("SELECT count(*) FROM information_schema.columns WHERE table_name = 'orders'"),
        "1",
        "not altered"
    );
    server.psql(
        "CREATE TABLE future (id text PRIMARY KEY); COMMENT ON TABLE future IS 'idemgate_schema 2'",
    );
    exits_naming_the_table(
        &server,
        "  table: future\n",
        "table future is idemgate_schema 2",
    )
    .await;
    exits_naming_the_table(
        &server,
        "  table: ops.missing\n  create_table: false\n",
        "table ops.missing does not exist and store.create_table is false",
    )
    .await;
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_class WHERE relname = 'missing'"),
        "0"
    );
}

/// A schema-qualified table is made in its schema; the log warns that no standby is
/// synchronous; `--check` prints the URL with its password masked.
#[tokio::test]
async fn start_up_makes_the_table_warns_and_check_masks_the_password() {
    let server = PgServer::start().await;
    server.psql("CREATE SCHEMA ops");
    let up = Upstream::start().await;
    let url = server.url().replace("postgres@", "postgres:s3cret@");
    let yaml = pg_yaml(&url, "  table: ops.idem\n").replace("{upstream}", &up.url());
    let config = TempConfig::new(&yaml);
    let path = config.path().to_string_lossy().into_owned();
    let check = run(idemgate().args(["--config", &path, "--check"])).await;
    assert_eq!(check.code(), Some(0), "{}", check.stderr);
    assert!(
        check.stdout.contains("postgres:***@127.0.0.1"),
        "{}",
        check.stdout
    );
    assert!(!check.stdout.contains("s3cret") && !check.stderr.contains("s3cret"));
    let mut running = Running::start(&["--config", &path]).await;
    let r = support::TestClient::new(running.addr)
        .post("/charges", "one", "{}")
        .await;
    assert_eq!(r.status, 201, "{}", running.stderr());
    assert_eq!(
        server.psql("SELECT obj_description('ops.idem'::regclass, 'pg_class')"),
        "idemgate_schema 1"
    );
    assert_eq!(server.psql("SELECT count(*) FROM ops.idem"), "1");
    let log = running.stderr();
    assert!(log.contains("synchronous_standby_names is empty"), "{log}");
    assert!(!log.contains("s3cret"), "{log}");
    running.terminate().await;
}

/// Expired rows are absent at once and deleted by the sweep, which the metric counts.
#[tokio::test]
async fn expired_rows_are_swept() {
    let server = PgServer::start().await;
    let up = Upstream::start().await;
    let yaml = pg_yaml(
        &server.url(),
        "  sweep_interval: 200ms\nidempotency:\n  ttl: 1s\n",
    );
    let proxy: PgProxy = Proxy::postgres(&yaml, &up).await;
    for i in 0..5 {
        let r = proxy
            .client()
            .post("/charges", &format!("s{i}"), "{}")
            .await;
        assert_eq!(r.status, 201);
    }
    assert_eq!(server.psql("SELECT count(*) FROM idemgate_records"), "5");
    server
        .wait_for("SELECT count(*) FROM idemgate_records", "0")
        .await;
    let admin = proxy.admin().await;
    let metrics = admin.send("GET", "/metrics", &[], "").await.text();
    assert!(
        metrics.contains("idemgate_store_expired_total 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("idemgate_store_pool_connections{state=\"idle\"}"),
        "{metrics}"
    );
    // Gone, so executed again: the ttl ended.
    let again = proxy.client().post("/charges", "s0", "{}").await;
    assert!(!again.replayed());
}

/// A database that stops answering (a partition, a stalled primary) is `503` within
/// `store.timeout`, and the connections it held are closed, never handed out again: once
/// it answers, requests go through on fresh connections without a restart.
#[tokio::test]
async fn a_hung_connection_is_closed_not_reused() {
    use support::fault::{Fault, Relay};
    let server = PgServer::start().await;
    let relay = Relay::start(([127, 0, 0, 1], server.port).into()).await;
    let up = Upstream::start().await;
    let url = format!("postgres://postgres@{}/postgres", relay.addr);
    let proxy: PgProxy = Proxy::postgres(&pg_yaml(&url, "  pool_size: 2\n"), &up).await;
    let c = proxy.client();
    assert_eq!(c.post("/charges", "warm", "{}").await.status, 201);
    relay.set(Fault::Hang);
    for i in 0..3 {
        let r = c.post("/charges", &format!("hung-{i}"), "{}").await;
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.problem(), "store-unavailable");
    }
    // Held, not lost, by this relay: only closing them frees them.
    tokio::time::timeout(Duration::from_secs(10), relay.wait_open(0))
        .await
        .expect("every connection that hung was closed");
    let hung = relay.connections();
    relay.set(Fault::Pass);
    let r = eventually(Duration::from_secs(10), async || {
        let r = c.post("/charges", "after", "{}").await;
        (r.status == 201).then_some(r)
    })
    .await;
    assert!(!r.replayed());
    assert!(relay.connections() > hung, "a fresh connection carried it");
    assert_eq!(up.count(), 2);
}

/// A table idemgate may not create stops it with the server's own reason, and a role
/// with only the grants docs/stores.md lists serves from a table made for it.
#[tokio::test]
async fn a_role_without_create_is_told_why_and_the_documented_grants_suffice() {
    let server = PgServer::start().await;
    server.psql("CREATE ROLE app LOGIN; CREATE SCHEMA ops");
    let url = server.url().replace("postgres@", "app@");
    let up = Upstream::start().await;
    let yaml = pg_yaml(&url, "  table: ops.idem\n").replace("{upstream}", &up.url());
    let config = TempConfig::new(&yaml);
    let path = config.path().to_string_lossy().into_owned();
    let out = run(idemgate().args(["--config", &path, "--listen", "127.0.0.1:0"])).await;
    assert_eq!(out.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("table ops.idem")
            && out.stderr.contains("permission denied for schema ops"),
        "{}",
        out.stderr
    );
    for statement in idemgate::store::create_statements("ops.idem") {
        server.psql(&statement);
    }
    server.psql("GRANT USAGE ON SCHEMA ops TO app");
    server.psql("GRANT SELECT, INSERT, UPDATE, DELETE ON ops.idem TO app");
    let yaml = pg_yaml(
        &url,
        "  table: ops.idem\n  create_table: false\nidempotency:\n  on_concurrent: wait\n",
    );
    let proxy: PgProxy = Proxy::postgres(&yaml, &up).await;
    let first = proxy.client().post("/charges", "granted", "{}").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(
        proxy
            .client()
            .post("/charges", "granted", "{}")
            .await
            .replayed()
    );
}

/// docs/behaviour.md §22 "Failover": a first host that accepts connections and never
/// answers them (a paused machine) does not keep idemgate from the second, and once a
/// host answered, new connections go to it first.
#[tokio::test]
async fn a_silent_first_host_does_not_hide_the_second() {
    use support::fault::{Fault, Relay};
    let server = PgServer::start().await;
    let silent = Relay::start(([127, 0, 0, 1], server.port).into()).await;
    silent.set(Fault::Hang);
    let up = Upstream::start().await;
    let url = format!(
        "postgres://postgres@{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        silent.addr, server.port
    );
    let proxy: PgProxy = Proxy::postgres(&pg_yaml(&url, ""), &up).await;
    let first = eventually(Duration::from_secs(10), async || {
        let r = proxy.client().post("/charges", "two-hosts", "{}").await;
        (r.status == 201).then_some(r)
    })
    .await;
    assert!(!first.replayed());
    let tried = silent.connections();
    for i in 0..5 {
        let r = proxy
            .client()
            .post("/charges", &format!("more-{i}"), "{}")
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    assert_eq!(
        silent.connections(),
        tried,
        "new connections went to the host that answered"
    );
}
