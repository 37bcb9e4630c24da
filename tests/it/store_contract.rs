//! The store contract: every `Store` implementation must pass these. Each test is an
//! async fn over a `Harness`, and the macro at the bottom instantiates all of them for
//! each store.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate::idempotency::{
    Completed, Fingerprint, InFlight, OwnerToken, Record, ScopedKey, StoredBody,
};
use idemgate::store::{Claim, ClaimRequest, Fenced, Lease, Purged, Replaced, Store, Written};

/// A store under test plus control over the time it sees.
trait Harness {
    type S: Store;
    fn store(&self) -> &Arc<Self::S>;
    /// Lets `d` pass on the store's clock.
    async fn advance(&self, d: Duration);
    /// The lease and ttl the tests claim with: long on a paused clock, short where time
    /// is real (a Redis server keeps its own clock).
    fn lease(&self) -> Duration;
    fn ttl(&self) -> Duration;

    fn req(&self, k: u8, token: OwnerToken) -> ClaimRequest {
        ClaimRequest {
            key: key(k),
            scope: None,
            fingerprint: fp(1),
            token,
            lease: self.lease(),
            ttl: self.ttl(),
            streamed: false,
        }
    }

    async fn acquire(&self, k: u8) -> Lease {
        match self
            .store()
            .claim(self.req(k, OwnerToken::random()))
            .await
            .expect("claim")
        {
            Claim::Acquired(lease) => lease,
            Claim::Existing { record, .. } => panic!("expected to acquire, found {record:?}"),
        }
    }

    /// Completes `lease` with a small JSON response, kept for the harness's ttl.
    async fn complete(&self, lease: &Lease, body: &'static [u8]) -> Fenced {
        self.store()
            .complete(lease, response(body), self.ttl())
            .await
            .expect("complete")
    }

    /// The in-flight marker another claim of `k` finds, with the store's clock then.
    async fn marker(&self, k: u8) -> (InFlight, u64) {
        match self
            .store()
            .claim(self.req(k, OwnerToken::random()))
            .await
            .expect("claim")
        {
            Claim::Existing {
                record: Record::InFlight(m),
                now_ms,
            } => (m, now_ms),
            other => panic!("expected an in-flight marker, got {other:?}"),
        }
    }

    async fn existing(&self, k: u8) -> Record {
        match self
            .store()
            .claim(self.req(k, OwnerToken::random()))
            .await
            .expect("claim")
        {
            Claim::Acquired(lease) => panic!("expected a record, acquired {lease:?}"),
            Claim::Existing { record, .. } => record,
        }
    }
}

const LEASE: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(60);

fn key(n: u8) -> ScopedKey {
    ScopedKey::from_bytes([n; 32])
}

fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

fn response(body: &'static [u8]) -> Arc<Completed> {
    Arc::new(Completed::clear(
        fp(1),
        StatusCode::CREATED,
        vec![(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        )],
        StoredBody::Stored(Bytes::from_static(body)),
    ))
}

async fn first_claim_acquires_then_others_see_the_marker<H: Harness>(h: H) {
    let s = h.store();
    let token = OwnerToken::random();
    let Claim::Acquired(lease) = s.claim(h.req(1, token)).await.expect("claim") else {
        panic!("not acquired")
    };
    assert_eq!(lease.token, token);
    match h.existing(1).await {
        Record::InFlight(m) => {
            assert_eq!(m.token, token);
            assert_eq!(m.fingerprint, fp(1));
        }
        other => panic!("expected in-flight, got {other:?}"),
    }
    // Other keys are independent.
    let _ = h.acquire(2).await;
}

async fn concurrent_claims_acquire_exactly_once<H: Harness>(h: H) {
    let s = h.store();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let s = Arc::clone(s);
        let req = h.req(7, OwnerToken::random());
        tasks.push(tokio::spawn(async move { s.claim(req).await }));
    }
    let mut acquired = 0;
    for t in tasks {
        if let Claim::Acquired(_) = t.await.expect("join").expect("claim") {
            acquired += 1;
        }
    }
    assert_eq!(acquired, 1);
}

async fn complete_then_claim_returns_the_record<H: Harness>(h: H) {
    let lease = h.acquire(1).await;
    assert_eq!(h.complete(&lease, b"{\"id\":1}").await, Fenced::Done);
    assert_eq!(
        h.existing(1).await,
        Record::Completed(response(b"{\"id\":1}"))
    );
    // Repeating the same completion is done (a retry after a timed-out call); a
    // different record finds no marker: the record is final.
    assert_eq!(h.complete(&lease, b"{\"id\":1}").await, Fenced::Done);
    assert_eq!(h.complete(&lease, b"other").await, Fenced::LeaseLost);
    assert_eq!(
        h.existing(1).await,
        Record::Completed(response(b"{\"id\":1}"))
    );
}

async fn wrong_token_changes_nothing<H: Harness>(h: H) {
    let s = h.store();
    let lease = h.acquire(1).await;
    let thief = Lease {
        key: lease.key,
        token: OwnerToken::random(),
        claimed_at_ms: 0,
        written: Written::default(),
    };
    assert_eq!(h.complete(&thief, b"x").await, Fenced::LeaseLost);
    assert_eq!(s.release(&thief).await.expect("release"), Fenced::LeaseLost);
    assert_eq!(
        s.renew(&thief, h.lease()).await.expect("renew"),
        Fenced::LeaseLost
    );
    assert!(matches!(h.existing(1).await, Record::InFlight(m) if m.token == lease.token));
    // Operations on a key nobody claimed do nothing either.
    let nobody = Lease {
        key: key(9),
        token: OwnerToken::random(),
        claimed_at_ms: 0,
        written: Written::default(),
    };
    assert_eq!(
        s.release(&nobody).await.expect("release"),
        Fenced::LeaseLost
    );
    assert_eq!(h.complete(&nobody, b"x").await, Fenced::LeaseLost);
    let _ = h.acquire(9).await;
}

async fn release_lets_the_next_claim_acquire<H: Harness>(h: H) {
    let s = h.store();
    let lease = h.acquire(1).await;
    assert_eq!(s.release(&lease).await.expect("release"), Fenced::Done);
    assert_eq!(s.release(&lease).await.expect("release"), Fenced::LeaseLost);
    let _ = h.acquire(1).await;
}

async fn lease_expires_without_renewal<H: Harness>(h: H) {
    let lease = h.acquire(1).await;
    h.advance(h.lease() - h.lease() / 5).await;
    let (m, now_ms) = h.marker(1).await;
    assert!(now_ms < m.lease_deadline_ms);
    h.advance(h.lease() / 2).await;
    // The marker outlives its lease: its owner may have forwarded the request.
    let (m, now_ms) = h.marker(1).await;
    assert_eq!(m.token, lease.token);
    assert!(now_ms >= m.lease_deadline_ms);
}

async fn renewal_extends_the_lease<H: Harness>(h: H) {
    let s = h.store();
    let lease = h.acquire(1).await;
    for _ in 0..5 {
        h.advance(h.lease() / 2).await;
        assert_eq!(
            s.renew(&lease, h.lease()).await.expect("renew"),
            Fenced::Done
        );
    }
    let (m, now_ms) = h.marker(1).await;
    assert!(now_ms < m.lease_deadline_ms);
    assert_eq!(h.complete(&lease, b"late").await, Fenced::Done);
}

async fn take_over_needs_the_stale_token_and_an_ended_lease<H: Harness>(h: H) {
    let s = h.store();
    let old = h.acquire(1).await;
    let new_token = OwnerToken::random();
    let (stale, _) = h.marker(1).await;
    assert_eq!(
        s.take_over(stale.clone(), h.req(1, new_token))
            .await
            .expect("take over"),
        None,
        "lease still live"
    );
    h.advance(h.lease() + h.lease() / 10).await;
    let wrong = InFlight {
        token: OwnerToken::random(),
        ..stale.clone()
    };
    assert_eq!(
        s.take_over(wrong, h.req(1, new_token))
            .await
            .expect("take over"),
        None,
        "wrong token"
    );
    let lease = s
        .take_over(stale, h.req(1, new_token))
        .await
        .expect("take over")
        .expect("taken over");
    assert_eq!(lease.token, new_token);
    // The crashed owner is fenced out; the new owner records.
    assert_eq!(h.complete(&old, b"old").await, Fenced::LeaseLost);
    assert_eq!(h.complete(&lease, b"new").await, Fenced::Done);
    assert_eq!(h.existing(1).await, Record::Completed(response(b"new")));
}

async fn completed_records_expire_after_ttl<H: Harness>(h: H) {
    let lease = h.acquire(1).await;
    h.advance(h.lease() / 2).await;
    assert_eq!(h.complete(&lease, b"x").await, Fenced::Done);
    // The ttl counts from completion.
    h.advance(h.ttl() - h.ttl() / 5).await;
    assert!(matches!(h.existing(1).await, Record::Completed(_)));
    h.advance(h.ttl() * 2 / 5).await;
    let _ = h.acquire(1).await;
}

async fn abandoned_markers_expire_after_ttl<H: Harness>(h: H) {
    let _lease = h.acquire(1).await;
    h.advance(h.ttl() + h.ttl() / 5).await;
    let _ = h.acquire(1).await;
}

async fn late_owner_cannot_overwrite_a_newer_claim<H: Harness>(h: H) {
    let s = h.store();
    let first = h.acquire(1).await;
    h.advance(h.lease() + h.lease() / 5).await;
    let (stale, _) = h.marker(1).await;
    let second = s
        .take_over(stale, h.req(1, OwnerToken::random()))
        .await
        .expect("take over")
        .expect("taken");
    assert_eq!(
        s.renew(&first, h.lease()).await.expect("renew"),
        Fenced::LeaseLost
    );
    assert_eq!(s.release(&first).await.expect("release"), Fenced::LeaseLost);
    assert!(matches!(h.existing(1).await, Record::InFlight(m) if m.token == second.token));
}

async fn watchers_wake_on_complete_release_and_take_over<H: Harness>(h: H) {
    use idemgate::store::Watch;
    let s = h.store();
    let woken = |w: <H::S as Store>::Watch| async move {
        tokio::time::timeout(Duration::from_secs(5), w.changed())
            .await
            .is_ok()
    };
    let lease = h.acquire(1).await;
    let w = s.watch(key(1)).await.expect("watch");
    assert_eq!(h.complete(&lease, b"x").await, Fenced::Done);
    assert!(woken(w).await, "complete wakes watchers");

    let lease = h.acquire(2).await;
    let w = s.watch(key(2)).await.expect("watch");
    assert_eq!(s.release(&lease).await.expect("release"), Fenced::Done);
    assert!(woken(w).await, "release wakes watchers");

    let _old = h.acquire(3).await;
    let w = s.watch(key(3)).await.expect("watch");
    h.advance(h.lease() + h.lease() / 10).await;
    let (stale, _) = h.marker(3).await;
    let _new = s
        .take_over(stale, h.req(3, OwnerToken::random()))
        .await
        .expect("take over")
        .expect("taken");
    assert!(woken(w).await, "take-over wakes watchers");

    // A watch on a key nobody touches stays asleep.
    let _held = h.acquire(4).await;
    let w = s.watch(key(4)).await.expect("watch");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), w.changed())
            .await
            .is_err()
    );
}

async fn inspect_reports_what_is_there_until_it_expires<H: Harness>(h: H) {
    let s = h.store();
    assert_eq!(s.inspect(key(1)).await.expect("inspect"), None);
    let lease = h.acquire(1).await;
    let seen = s.inspect(key(1)).await.expect("inspect").expect("a marker");
    let Record::InFlight(m) = &seen.record else {
        panic!("expected the marker, got {:?}", seen.record)
    };
    assert_eq!(m.token, lease.token);
    assert_eq!(m.claimed_at_ms, Some(lease.claimed_at_ms));
    assert!(lease.claimed_at_ms <= seen.now_ms && seen.now_ms < m.lease_deadline_ms);
    assert!(seen.expires_at_ms >= m.lease_deadline_ms, "{seen:?}");
    assert_eq!(h.complete(&lease, b"done").await, Fenced::Done);
    let seen = s
        .inspect(key(1))
        .await
        .expect("inspect")
        .expect("the record");
    assert_eq!(seen.record, Record::Completed(response(b"done")));
    let ttl = u64::try_from(h.ttl().as_millis()).expect("small");
    assert!(
        seen.expires_at_ms > seen.now_ms && seen.expires_at_ms <= seen.now_ms + ttl,
        "expires within the ttl: {seen:?}"
    );
    // Reading changes nothing.
    assert_eq!(h.existing(1).await, Record::Completed(response(b"done")));
    h.advance(h.ttl() + h.ttl() / 5).await;
    assert_eq!(s.inspect(key(1)).await.expect("inspect"), None);
}

async fn purge_never_removes_a_live_marker_unless_forced<H: Harness>(h: H) {
    let s = h.store();
    assert_eq!(s.purge(key(1), false).await.expect("purge"), Purged::Absent);
    assert_eq!(s.purge(key(1), true).await.expect("purge"), Purged::Absent);
    let first = h.acquire(1).await;
    assert_eq!(
        s.purge(key(1), false).await.expect("purge"),
        Purged::LiveLease
    );
    assert!(matches!(h.existing(1).await, Record::InFlight(m) if m.token == first.token));
    match s.purge(key(1), true).await.expect("purge") {
        Purged::Removed(Record::InFlight(m)) => assert_eq!(m.token, first.token),
        other => panic!("expected the marker removed, got {other:?}"),
    }
    // The key executes again, and the purged owner is fenced off that new claim.
    let second = h.acquire(1).await;
    assert_eq!(h.complete(&first, b"late").await, Fenced::LeaseLost);
    assert_eq!(
        s.renew(&first, h.lease()).await.expect("renew"),
        Fenced::LeaseLost
    );
    assert_eq!(h.complete(&second, b"new").await, Fenced::Done);
    assert_eq!(h.existing(1).await, Record::Completed(response(b"new")));
}

async fn purge_removes_records_and_markers_whose_lease_ended<H: Harness>(h: H) {
    use idemgate::store::Watch;
    let s = h.store();
    let lease = h.acquire(1).await;
    assert_eq!(h.complete(&lease, b"done").await, Fenced::Done);
    let w = s.watch(key(1)).await.expect("watch");
    assert_eq!(
        s.purge(key(1), false).await.expect("purge"),
        Purged::Removed(Record::Completed(response(b"done")))
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(5), w.changed())
            .await
            .is_ok(),
        "a purge wakes watchers"
    );
    assert_eq!(s.inspect(key(1)).await.expect("inspect"), None);
    assert_eq!(s.purge(key(1), false).await.expect("purge"), Purged::Absent);
    let _again = h.acquire(1).await;

    let crashed = h.acquire(2).await;
    h.advance(h.lease() + h.lease() / 5).await;
    match s.purge(key(2), false).await.expect("purge") {
        Purged::Removed(Record::InFlight(m)) => assert_eq!(m.token, crashed.token),
        other => panic!("expected the ended marker removed, got {other:?}"),
    }
    let _next = h.acquire(2).await;
}

/// `replace` changes a record only if it is still the one expected, keeping its expiry
/// (docs/behaviour.md §18): how a resolution is never lost to a concurrent one.
async fn replace_is_a_compare_and_set_that_keeps_the_expiry<H: Harness>(h: H) {
    let s = h.store();
    let lease = h.acquire(1).await;
    assert_eq!(h.complete(&lease, b"unknown").await, Fenced::Done);
    let before = s.inspect(key(1)).await.expect("inspect").expect("stored");
    let stale = Record::Completed(response(b"something else"));
    assert_eq!(
        s.replace(key(1), &stale, None).await.expect("replace"),
        Replaced::Changed
    );
    h.advance(h.ttl() / 2).await;
    assert_eq!(
        s.replace(key(1), &before.record, Some(response(b"resolved")))
            .await
            .expect("replace"),
        Replaced::Done
    );
    let after = s.inspect(key(1)).await.expect("inspect").expect("stored");
    assert_eq!(after.record, Record::Completed(response(b"resolved")));
    // The same instant (Redis keeps the remaining PTTL, to the ms): a replacement that
    // set the ttl anew would be half a ttl later.
    let slack = u64::try_from((h.ttl() / 10).as_millis()).expect("ms");
    assert!(
        after.expires_at_ms.abs_diff(before.expires_at_ms) < slack,
        "{} vs {}",
        after.expires_at_ms,
        before.expires_at_ms
    );
    // A second resolution of the same unknown record finds it changed.
    assert_eq!(
        s.replace(key(1), &before.record, None)
            .await
            .expect("replace"),
        Replaced::Changed
    );
    assert_eq!(
        s.replace(key(1), &after.record, None)
            .await
            .expect("replace"),
        Replaced::Done
    );
    assert_eq!(s.inspect(key(1)).await.expect("inspect"), None);
    assert_eq!(
        s.replace(key(1), &after.record, None)
            .await
            .expect("replace"),
        Replaced::Absent
    );
    // It expires when the original would have.
    let lease = h.acquire(2).await;
    assert_eq!(h.complete(&lease, b"unknown").await, Fenced::Done);
    let found = s.inspect(key(2)).await.expect("inspect").expect("stored");
    h.advance(h.ttl() / 2).await;
    s.replace(key(2), &found.record, Some(response(b"resolved")))
        .await
        .expect("replace");
    // Past the original expiry, short of a ttl counted from the replacement.
    h.advance(h.ttl() / 2 + h.ttl() / 5).await;
    assert_eq!(s.inspect(key(2)).await.expect("inspect"), None);
}

macro_rules! contract {
    ($store:ident, $harness:expr, $test:meta) => {
        mod $store {
            use super::*;
            contract!(@tests $harness, $test;
                first_claim_acquires_then_others_see_the_marker,
                concurrent_claims_acquire_exactly_once,
                complete_then_claim_returns_the_record,
                wrong_token_changes_nothing,
                release_lets_the_next_claim_acquire,
                lease_expires_without_renewal,
                renewal_extends_the_lease,
                take_over_needs_the_stale_token_and_an_ended_lease,
                completed_records_expire_after_ttl,
                abandoned_markers_expire_after_ttl,
                late_owner_cannot_overwrite_a_newer_claim,
                watchers_wake_on_complete_release_and_take_over,
                inspect_reports_what_is_there_until_it_expires,
                purge_never_removes_a_live_marker_unless_forced,
                purge_removes_records_and_markers_whose_lease_ended,
                replace_is_a_compare_and_set_that_keeps_the_expiry,
            );
        }
    };
    (@tests $harness:expr, $test:meta; $($name:ident),* $(,)?) => {
        $(
            #[$test]
            async fn $name() {
                super::$name($harness).await;
            }
        )*
    };
}

mod memory_harness {
    use super::*;
    use idemgate::store::MemoryStore;

    pub(crate) struct Memory(pub(crate) Arc<MemoryStore>);

    pub(crate) fn new() -> Memory {
        Memory(Arc::new(MemoryStore::new(1000)))
    }

    impl Harness for Memory {
        type S = MemoryStore;
        fn store(&self) -> &Arc<MemoryStore> {
            &self.0
        }
        async fn advance(&self, d: Duration) {
            tokio::time::advance(d).await;
        }
        fn lease(&self) -> Duration {
            LEASE
        }
        fn ttl(&self) -> Duration {
            TTL
        }
    }
}

contract!(
    memory,
    memory_harness::new(),
    tokio::test(start_paused = true)
);

mod redis_harness {
    use super::*;
    use idemgate::config::Config;
    use idemgate::store::RedisStore;
    use support::redis::{RedisCluster, RedisServer, Server};

    /// A store on its own server or cluster, stopped with the harness.
    pub(crate) struct Redis {
        store: Arc<RedisStore>,
        _server: Servers,
    }

    #[allow(dead_code, reason = "held to stop the servers with the harness")]
    enum Servers {
        Single(RedisServer),
        Cluster(RedisCluster),
    }

    pub(crate) async fn new() -> Redis {
        on(Server::from_env()).await
    }

    /// A standalone `server` (Redis or Valkey).
    pub(crate) async fn on(server: Server) -> Redis {
        let server = RedisServer::start_on(server, &[]).await;
        let yaml = format!(
            "upstream:\n  url: http://127.0.0.1:1\nstore:\n  kind: redis\n  url: {}\n",
            server.url()
        );
        Redis {
            store: store(&yaml),
            _server: Servers::Single(server),
        }
    }

    /// A cluster of three masters, each running its entry of `servers`.
    pub(crate) async fn cluster_of(servers: &[Server]) -> Redis {
        let cluster = RedisCluster::start_of(servers).await;
        let yaml = format!(
            "upstream:\n  url: http://127.0.0.1:1\nstore:\n  kind: redis\n  cluster: true\n  urls: [{}]\n",
            cluster.seed_urls().join(", ")
        );
        Redis {
            store: store(&yaml),
            _server: Servers::Cluster(cluster),
        }
    }

    fn store(yaml: &str) -> Arc<RedisStore> {
        let config = Config::from_yaml_str(yaml, &|_| None).expect("config");
        Arc::new(RedisStore::new(&config.store).expect("store"))
    }

    impl Harness for Redis {
        type S = RedisStore;
        fn store(&self) -> &Arc<RedisStore> {
            &self.store
        }
        /// Redis keeps its own clock: time has to really pass.
        async fn advance(&self, d: Duration) {
            tokio::time::sleep(d).await;
        }
        fn lease(&self) -> Duration {
            Duration::from_millis(500)
        }
        fn ttl(&self) -> Duration {
            Duration::from_millis(1500)
        }
    }
}

contract!(redis, redis_harness::new().await, tokio::test);
// Valkey 9 fences natively (docs/behaviour.md §23); a cluster of Valkey and Redis 7
// nodes, as in a rolling upgrade, fences natively where a node can.
contract!(
    valkey,
    redis_harness::on(support::redis::Server::Valkey).await,
    tokio::test
);
contract!(
    valkey_cluster,
    redis_harness::cluster_of(&[support::redis::Server::Valkey; 3]).await,
    tokio::test
);
contract!(
    mixed_cluster,
    redis_harness::cluster_of(&[
        support::redis::Server::Valkey,
        support::redis::Server::Redis,
        support::redis::Server::Valkey,
    ])
    .await,
    tokio::test
);

mod file_harness {
    use super::*;
    use idemgate::store::{FileOptions, FileStore};

    /// A store in a directory of its own, removed with the harness (after the store is
    /// dropped, which closes it).
    pub(crate) struct File {
        store: Arc<FileStore>,
        _dir: tempfile::TempDir,
    }

    pub(crate) fn new() -> File {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = FileStore::open(&FileOptions {
            path: dir.path().join("store"),
            fsync: true,
            max_entries: 1000,
            max_entries_per_scope: None,
        })
        .expect("open the file store");
        File {
            store: Arc::new(store),
            _dir: dir,
        }
    }

    impl Harness for File {
        type S = FileStore;
        fn store(&self) -> &Arc<FileStore> {
            &self.store
        }
        /// The file store keeps wall-clock time (it must, across restarts), and its
        /// background expiry ticks on tokio's clock: time has to really pass.
        async fn advance(&self, d: Duration) {
            tokio::time::sleep(d).await;
        }
        fn lease(&self) -> Duration {
            Duration::from_millis(500)
        }
        fn ttl(&self) -> Duration {
            Duration::from_millis(1500)
        }
    }
}

contract!(file, file_harness::new(), tokio::test);

mod postgres_harness {
    use super::*;
    use idemgate::config::Config;
    use idemgate::store::PostgresStore;
    use support::postgres::PgServer;

    /// A store on its own throwaway PostgreSQL, stopped with the harness (the store, and
    /// with it the pool, goes first).
    pub(crate) struct Postgres {
        store: Arc<PostgresStore>,
        _server: PgServer,
    }

    pub(crate) async fn new() -> Postgres {
        let server = PgServer::start().await;
        let yaml = format!(
            "upstream:\n  url: http://127.0.0.1:1\nstore:\n  kind: postgres\n  url: {}\n",
            server.url()
        );
        let config = Config::from_yaml_str(&yaml, &|_| None).expect("config");
        let store = Arc::new(PostgresStore::new(&config.store).expect("store"));
        store.start().await.expect("the table is made");
        Postgres {
            store,
            _server: server,
        }
    }

    impl Harness for Postgres {
        type S = PostgresStore;
        fn store(&self) -> &Arc<PostgresStore> {
            &self.store
        }
        /// Rows expire by the replicas' wall clock: time has to really pass.
        async fn advance(&self, d: Duration) {
            tokio::time::sleep(d).await;
        }
        fn lease(&self) -> Duration {
            Duration::from_millis(500)
        }
        fn ttl(&self) -> Duration {
            Duration::from_millis(1500)
        }
    }
}

contract!(postgres, postgres_harness::new().await, tokio::test);

/// Memory-store specifics: the bound of `max_entries`.
mod memory_bounds {
    use super::*;

    const MARKER: i64 = 58;
    use idemgate::store::{MemoryStore, StoreError};

    /// The contract runs on one paused thread; this one races real threads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_claims_on_real_threads_acquire_exactly_once() {
        for _ in 0..20 {
            super::concurrent_claims_acquire_exactly_once(super::memory_harness::new()).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn evicts_completed_oldest_first_never_markers() {
        let h = super::memory_harness::Memory(Arc::new(MemoryStore::new(3)));
        let s = h.store();
        for k in 1..=2 {
            let lease = h.acquire(k).await;
            assert_eq!(
                s.complete(&lease, response(b"x"), TTL)
                    .await
                    .expect("complete"),
                Fenced::Done
            );
        }
        let _marker = h.acquire(3).await;
        // Bytes held: two completed records (marker-sized head, headers, body) and a marker.
        let record = MARKER + ("content-type".len() + "application/json".len() + 1) as i64;
        assert_eq!(s.stored_bytes(), 2 * record + MARKER);
        // Full: the oldest completed record (1) makes room.
        let _ = h.acquire(4).await;
        assert_eq!(s.evictions(), 1);
        assert!(matches!(h.existing(2).await, Record::Completed(_)));
        let _ = h.acquire(1).await;
        assert!(matches!(h.existing(3).await, Record::InFlight(_)));
        assert_eq!(s.len(), 3);
        // Three markers remain (3, 4 and 1 again); evicted records no longer count.
        assert_eq!(s.stored_bytes(), 3 * MARKER);
    }

    #[tokio::test(start_paused = true)]
    async fn full_of_markers_refuses_new_claims() {
        let h = super::memory_harness::Memory(Arc::new(MemoryStore::new(2)));
        let s = h.store();
        let _a = h.acquire(1).await;
        let _b = h.acquire(2).await;
        assert!(matches!(
            s.claim(h.req(3, OwnerToken::random())).await,
            Err(StoreError::Full)
        ));
        // Existing keys still answer.
        assert!(matches!(h.existing(1).await, Record::InFlight(_)));
        // Once the markers' ttl is over, they make room.
        tokio::time::advance(TTL + LEASE).await;
        let _ = h.acquire(3).await;
    }

    /// A large store is sharded: the bound holds over the whole, and the gauges follow
    /// every change (releases included).
    #[tokio::test(start_paused = true)]
    async fn a_large_store_stays_within_its_bound_and_its_gauges_follow() {
        let max = 32 * 1024;
        let s = MemoryStore::new(max);
        for i in 0..(max + 10_000) {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let req = ClaimRequest {
                key: ScopedKey::from_bytes(bytes),
                scope: None,
                fingerprint: fp(1),
                token: OwnerToken::random(),
                lease: LEASE,
                ttl: TTL,
                streamed: false,
            };
            let Claim::Acquired(lease) = s.claim(req).await.expect("claim") else {
                panic!("fresh key")
            };
            if i % 11 == 0 {
                assert_eq!(s.release(&lease).await.expect("release"), Fenced::Done);
            } else {
                assert_eq!(
                    s.complete(&lease, response(b"x"), TTL)
                        .await
                        .expect("complete"),
                    Fenced::Done
                );
            }
        }
        assert!(s.len() <= max, "{} entries over a bound of {max}", s.len());
        assert!(
            s.len() > max - 16 * 64,
            "the shards fill up evenly: {}",
            s.len()
        );
        assert!(s.evictions() > 0);
        assert_eq!(s.entries_gauge(), s.len() as i64);
        let record = MARKER + ("content-type".len() + "application/json".len() + 1) as i64;
        assert_eq!(s.stored_bytes(), s.len() as i64 * record);
    }
}
