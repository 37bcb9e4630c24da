//! Native fencing (docs/behaviour.md §23) on real servers: Valkey 9 completes, releases
//! and takes over without a script (`INFO commandstats`), redis-server 7 still runs the
//! scripts, a late owner is fenced out on both, and a cluster of Valkey and Redis 7
//! nodes (a rolling upgrade) serves every key.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate::config::Config;
use idemgate::idempotency::{Completed, Fingerprint, OwnerToken, Record, ScopedKey, StoredBody};
use idemgate::store::{Claim, ClaimRequest, Fenced, Lease, RedisStore, Store, Watch, Written};
use support::redis::{RedisCluster, RedisServer, Server};

/// A waiter woken only by the lease's end would be a failure.
const LEASE: Duration = Duration::from_secs(30);
/// The lease of a claim whose owner then pauses: it ends while the test waits.
const SHORT_LEASE: Duration = Duration::from_millis(200);
const WAKE: Duration = Duration::from_secs(2);

fn store(section: &str) -> RedisStore {
    let yaml = format!("upstream:\n  url: http://127.0.0.1:1\nstore:\n  kind: redis\n{section}");
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("config");
    RedisStore::new(&config.store).expect("store")
}

fn key(n: u32) -> ScopedKey {
    let mut bytes = [9u8; 32];
    bytes[..4].copy_from_slice(&n.to_be_bytes());
    ScopedKey::from_bytes(bytes)
}

fn req(key: ScopedKey, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        key,
        scope: None,
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease,
        ttl: Duration::from_secs(60),
        streamed: false,
    }
}

async fn acquire(s: &RedisStore, key: ScopedKey, lease: Duration) -> Lease {
    match s.claim(req(key, lease)).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing { record, .. } => panic!("expected to acquire, found {record:?}"),
    }
}

async fn existing(s: &RedisStore, key: ScopedKey) -> Record {
    match s.claim(req(key, LEASE)).await.expect("claim") {
        Claim::Existing { record, .. } => record,
        Claim::Acquired(lease) => panic!("expected a record, acquired {lease:?}"),
    }
}

fn response(body: &'static [u8]) -> Arc<Completed> {
    Arc::new(Completed::clear(
        Fingerprint::from_bytes([1; 32]),
        StatusCode::CREATED,
        Vec::new(),
        StoredBody::Stored(Bytes::from_static(body)),
    ))
}

async fn complete(s: &RedisStore, lease: &Lease, body: &'static [u8]) -> Fenced {
    s.complete(lease, response(body), Duration::from_secs(60))
        .await
        .expect("complete")
}

/// Scripts run on a server: `EVALSHA` and `EVAL` calls.
fn scripts(server: &RedisServer) -> u64 {
    server.command_calls("evalsha") + server.command_calls("eval")
}

/// The scripts each step ran on `server`, in order: a miss completed, a release, a
/// waiter woken by a completion, a take-over of a paused owner's marker, and that
/// owner's late completion, which is fenced out. Asserts what each step did.
async fn each_step(server: &RedisServer) -> [u64; 5] {
    let s = store(&format!("  url: {}\n", server.url()));
    // Connected and the version known before counting.
    let _ = acquire(&s, key(100), LEASE).await;
    let mut ran = [0; 5];
    let mut before = scripts(server);
    let mut step = |i: usize| {
        let now = scripts(server);
        ran[i] = now - before;
        before = now;
    };

    let lease = acquire(&s, key(1), LEASE).await;
    assert_eq!(complete(&s, &lease, b"miss").await, Fenced::Done);
    assert_eq!(
        existing(&s, key(1)).await,
        Record::Completed(response(b"miss"))
    );
    step(0);

    let lease = acquire(&s, key(2), LEASE).await;
    assert_eq!(s.release(&lease).await.expect("release"), Fenced::Done);
    let _ = acquire(&s, key(2), LEASE).await;
    step(1);

    let lease = acquire(&s, key(3), LEASE).await;
    let waiter = s.watch(key(3)).await.expect("watch");
    assert_eq!(complete(&s, &lease, b"waited").await, Fenced::Done);
    assert!(
        tokio::time::timeout(WAKE, waiter.changed()).await.is_ok(),
        "the completion wakes the waiter"
    );
    step(2);

    // The owner pauses past its lease; another request takes the key over.
    let paused = acquire(&s, key(4), SHORT_LEASE).await;
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let Record::InFlight(stale) = existing(&s, key(4)).await else {
        panic!("the paused owner's marker")
    };
    let newer = s
        .take_over(stale, req(key(4), LEASE))
        .await
        .expect("take over")
        .expect("the lease ended");
    step(3);

    // Waking up, the paused owner cannot overwrite the newer claim.
    assert_eq!(complete(&s, &paused, b"late").await, Fenced::LeaseLost);
    assert_eq!(
        s.release(&paused).await.expect("release"),
        Fenced::LeaseLost
    );
    assert!(matches!(existing(&s, key(4)).await, Record::InFlight(m) if m.token == newer.token));
    assert_eq!(complete(&s, &newer, b"newer").await, Fenced::Done);
    assert_eq!(
        existing(&s, key(4)).await,
        Record::Completed(response(b"newer"))
    );
    step(4);
    ran
}

#[tokio::test]
async fn on_valkey_no_script_runs_for_a_miss_a_release_a_wait_or_a_take_over() {
    let server = RedisServer::start_on(Server::Valkey, &[]).await;
    let sets = server.command_calls("set");
    assert_eq!(each_step(&server).await, [0; 5]);
    // The writes were the native commands.
    assert!(server.command_calls("set") > sets);
    assert!(server.command_calls("delifeq") >= 1);
}

#[tokio::test]
async fn on_redis_7_the_scripts_still_run_and_fence_alike() {
    let server = RedisServer::start_on(Server::Redis, &[]).await;
    let ran = each_step(&server).await;
    // The late owner's complete and release are one script each, as is every other step's
    // fenced write.
    assert!(ran.iter().all(|&n| n >= 1), "{ran:?}");
    assert_eq!(server.command_calls("delifeq"), 0);
}

/// A cluster in a rolling upgrade: Valkey 9 and Redis 7 masters. Every key is claimed,
/// completed and replayed, or released and claimed again, whichever node holds it; the
/// Valkey nodes complete without a script, the Redis node with one.
#[tokio::test]
async fn a_cluster_of_valkey_and_redis_7_nodes_serves_every_key() {
    let cluster = RedisCluster::start_of(&[Server::Valkey, Server::Redis, Server::Valkey]).await;
    let s = store(&format!(
        "  cluster: true\n  urls: [{}]\n  timeout: 2s\n",
        cluster.seed_urls().join(", ")
    ));
    let _ = acquire(&s, key(1000), LEASE).await;
    let before: Vec<u64> = cluster.nodes.iter().map(scripts).collect();
    let keys = 48;
    for n in 0..keys {
        let lease = acquire(&s, key(n), LEASE).await;
        assert_eq!(complete(&s, &lease, b"done").await, Fenced::Done, "key {n}");
        assert_eq!(
            existing(&s, key(n)).await,
            Record::Completed(response(b"done"))
        );
    }
    let after: Vec<u64> = cluster.nodes.iter().map(scripts).collect();
    for (i, node) in cluster.nodes.iter().enumerate() {
        let ran = after[i] - before[i];
        match node.server() {
            Server::Valkey => assert_eq!(ran, 0, "Valkey node {}", node.port),
            Server::Redis => assert!(ran > 0, "Redis node {}", node.port),
        }
    }
    for n in keys..2 * keys {
        let lease = acquire(&s, key(n), LEASE).await;
        assert_eq!(s.release(&lease).await.expect("release"), Fenced::Done);
        let again = acquire(&s, key(n), LEASE).await;
        assert_eq!(complete(&s, &again, b"again").await, Fenced::Done);
    }
}

/// Renews `lease`'s claim through another lease of the same token, which does not tell
/// `lease`: as if the renewal's answer had been lost.
async fn renew_unheard(s: &RedisStore, lease: &Lease) {
    let unheard = Lease {
        key: lease.key,
        token: lease.token,
        claimed_at_ms: lease.claimed_at_ms,
        written: Written::default(),
    };
    assert_eq!(
        s.renew(&unheard, LEASE * 2).await.expect("renew"),
        Fenced::Done
    );
}

/// A renewal whose answer never came moved the marker's deadline without the lease
/// knowing: the completion still lands, natively, against the marker it finds with its
/// own token (docs/behaviour.md §23).
#[tokio::test]
async fn a_renewal_the_lease_did_not_hear_of_does_not_lose_it() {
    for server in [Server::Valkey, Server::Redis] {
        let server = RedisServer::start_on(server, &[]).await;
        let s = store(&format!("  url: {}\n", server.url()));
        let lease = acquire(&s, key(1), LEASE).await;
        renew_unheard(&s, &lease).await;
        let before = scripts(&server);
        assert_eq!(complete(&s, &lease, b"renewed").await, Fenced::Done);
        assert_eq!(
            existing(&s, key(1)).await,
            Record::Completed(response(b"renewed"))
        );
        if server.server() == Server::Valkey {
            assert_eq!(scripts(&server), before, "completed natively");
        }

        let lease = acquire(&s, key(2), LEASE).await;
        renew_unheard(&s, &lease).await;
        assert_eq!(s.release(&lease).await.expect("release"), Fenced::Done);
        let _ = acquire(&s, key(2), LEASE).await;
    }
}
