//! Guarded uploads larger than memory (docs/behaviour.md §19), with real sizes: the
//! `idemgate` binary between a client that generates 200 MiB bodies as it sends them and
//! an upstream that checks every byte as it arrives, on every store kind.

use crate::support::bin::{Running, TempConfig};
use crate::support::postgres::PgServer;
use crate::support::redis::{RedisCluster, RedisServer};
use crate::support::uploads::{Generated, MIB, UploadServer, abandon, memory, small, upload};

const SIZE: u64 = 200 * MIB;

/// A store for the binary to run on, kept alive as long as the test needs it.
enum Kind {
    Memory,
    File(tempfile::TempDir),
    Redis(RedisServer),
    Cluster(RedisCluster),
    Postgres(PgServer),
}

impl Kind {
    async fn memory() -> Self {
        Kind::Memory
    }

    async fn file() -> Self {
        Kind::File(tempfile::tempdir().expect("temp dir"))
    }

    async fn redis() -> Self {
        Kind::Redis(RedisServer::start().await)
    }

    async fn cluster() -> Self {
        Kind::Cluster(RedisCluster::start().await)
    }

    async fn postgres() -> Self {
        Kind::Postgres(PgServer::start().await)
    }

    fn store(&self) -> String {
        match self {
            Kind::Memory => "  kind: memory\n".to_owned(),
            Kind::File(dir) => format!(
                "  kind: file\n  path: {}\n",
                dir.path().join("store").display()
            ),
            Kind::Redis(server) => format!("  kind: redis\n  url: {}\n", server.url()),
            Kind::Cluster(cluster) => format!(
                "  kind: redis\n  cluster: true\n  urls: [{}]\n",
                cluster.seed_urls().join(", ")
            ),
            Kind::Postgres(server) => format!("  kind: postgres\n  url: {}\n", server.url()),
        }
    }
}

/// The binary on `kind`'s store in front of `up`, streaming bodies over 1 MiB.
/// `on_concurrent: wait`, so that a retry that finds the key held waits for it to be
/// settled rather than racing it.
async fn start(kind: &Kind, up: &UploadServer) -> (Running, TempConfig) {
    let yaml = format!(
        "upstream:\n  url: {}\n  timeout: 300s\nstore:\n{}idempotency:\n  \
         stream_request_body: true\n  on_concurrent: wait\n  wait_timeout: 300s\n\
         admin:\n  listen: null\n",
        up.url(),
        kind.store()
    );
    let config = TempConfig::new(&yaml);
    let path = config.path().to_string_lossy().into_owned();
    let running = Running::start(&["--config", &path]).await;
    (running, config)
}

/// A 200 MiB upload executes once, and a retry sending the same 200 MiB replays it; a
/// retry whose last byte differs is `422`; with `Content-Length` and chunked alike.
async fn executes_once_and_replays(kind: Kind) {
    let up = UploadServer::start().await;
    let (mut proxy, _config) = start(&kind, &up).await;
    for (n, body) in [Generated::new(SIZE), Generated::new(SIZE).chunked()]
        .into_iter()
        .enumerate()
    {
        let key = format!("document-{n}");
        let first = upload(proxy.addr, "/documents", &key, body).await;
        assert_eq!(first.status, 201, "{}", first.text());
        assert!(!first.replayed());
        let seen = up.received();
        assert_eq!(seen.len(), n + 1, "executed once");
        let seen = &seen[n];
        assert_eq!(seen.bytes, SIZE);
        assert!(seen.intact && seen.complete, "{seen:?}");
        let declared = (!body.chunked).then_some(SIZE);
        assert_eq!(seen.content_length, declared);

        let retry = upload(proxy.addr, "/documents", &key, body).await;
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert!(retry.replayed());
        assert_eq!(retry.body, first.body);

        let other = upload(proxy.addr, "/documents", &key, body.last_byte_changed()).await;
        assert_eq!(other.status, 422, "{}", other.text());
        assert!(other.text().contains("key-reused"), "{}", other.text());
        assert_eq!(up.received().len(), n + 1, "never executed again");
    }
    proxy.terminate().await;
    assert!(proxy.wait_exit().await.success(), "{}", proxy.stderr());
}

/// A client killed half-way: the upstream saw an incomplete request, nothing was
/// recorded, and a retry (which waits while the key is still held) executes.
async fn a_client_killed_half_way_frees_the_key(kind: Kind) {
    let up = UploadServer::start().await;
    let (mut proxy, _config) = start(&kind, &up).await;
    let body = Generated::new(64 * MIB);
    abandon(proxy.addr, "/documents", "killed", body, 32 * MIB).await;
    up.wait_for(1).await;
    let cut = &up.received()[0];
    assert!(
        !cut.complete,
        "the upstream saw the body end early: {cut:?}"
    );
    assert!(cut.bytes < 64 * MIB && cut.intact, "{cut:?}");

    let retry = upload(proxy.addr, "/documents", "killed", body).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(
        !retry.replayed(),
        "executed, not replayed: nothing was recorded"
    );
    let seen = up.received();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[1].complete && seen[1].bytes == 64 * MIB,
        "{:?}",
        seen[1]
    );
    proxy.terminate().await;
    assert!(proxy.wait_exit().await.success(), "{}", proxy.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_executes_once_and_replays() {
    executes_once_and_replays(Kind::memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_executes_once_and_replays() {
    executes_once_and_replays(Kind::file().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_executes_once_and_replays() {
    executes_once_and_replays(Kind::redis().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_executes_once_and_replays() {
    executes_once_and_replays(Kind::cluster().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_executes_once_and_replays() {
    executes_once_and_replays(Kind::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_client_killed_half_way() {
    a_client_killed_half_way_frees_the_key(Kind::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_client_killed_half_way() {
    a_client_killed_half_way_frees_the_key(Kind::memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_client_killed_half_way() {
    a_client_killed_half_way_frees_the_key(Kind::file().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_client_killed_half_way() {
    a_client_killed_half_way_frees_the_key(Kind::redis().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_client_killed_half_way() {
    a_client_killed_half_way_frees_the_key(Kind::cluster().await).await;
}

/// Four concurrent 200 MiB uploads raise idemgate's peak resident memory by less than
/// 64 MiB over what it holds idle (warmed up by one streamed upload first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_concurrent_uploads_stay_within_64_mib() {
    let up = UploadServer::start().await;
    let kind = Kind::memory().await;
    let (mut proxy, _config) = start(&kind, &up).await;
    let warm = upload(proxy.addr, "/documents", "warm-up", Generated::new(8 * MIB)).await;
    assert_eq!(warm.status, 201, "{}", warm.text());
    assert_eq!(small(proxy.addr, "/charges", "small").await.status, 201);
    let (idle, _) = memory(proxy.pid());
    let uploads: Vec<_> = (0..4)
        .map(|n| {
            let addr = proxy.addr;
            let body = if n % 2 == 0 {
                Generated::new(SIZE)
            } else {
                Generated::new(SIZE).chunked()
            };
            tokio::spawn(
                async move { upload(addr, "/documents", &format!("four-{n}"), body).await },
            )
        })
        .collect();
    for handle in uploads {
        let answer = handle.await.expect("upload task");
        assert_eq!(answer.status, 201, "{}", answer.text());
    }
    let (_, peak) = memory(proxy.pid());
    let seen = up.received();
    assert_eq!(seen.len(), 6);
    let uploads = seen.iter().filter(|r| r.path == "/documents");
    assert!(uploads.clone().all(|r| r.intact && r.complete), "{seen:?}");
    assert_eq!(uploads.count(), 5);
    assert!(
        peak < idle + 64 * MIB,
        "peak RSS {} MiB, idle {} MiB: more than 64 MiB above idle",
        peak / MIB,
        idle / MIB
    );
    proxy.terminate().await;
    assert!(proxy.wait_exit().await.success(), "{}", proxy.stderr());
}
