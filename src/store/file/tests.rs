//! File-store internals the contract suite cannot see: flushes shared by concurrent
//! requests, what survives a reopen, the bound of `max_entries`, expiry, and refusals
//! that leave the directory as it was.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use super::*;
use crate::idempotency::{Fingerprint, Record, StoredBody};
use crate::store::{Watch, millis};

const LEASE: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(60);

fn key(n: u32) -> ScopedKey {
    let mut bytes = [7u8; 32];
    bytes[..4].copy_from_slice(&n.to_be_bytes());
    ScopedKey::from_bytes(bytes)
}

fn req(k: u32) -> ClaimRequest {
    ClaimRequest {
        key: key(k),
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease: LEASE,
        ttl: TTL,
    }
}

fn response(body: &'static [u8]) -> Arc<Completed> {
    Arc::new(Completed {
        fingerprint: Fingerprint::from_bytes([1; 32]),
        status: StatusCode::CREATED,
        headers: Vec::new(),
        body: StoredBody::Stored(Bytes::from_static(body)),
        times: None,
    })
}

fn options(dir: &Path, max_entries: usize) -> FileOptions {
    FileOptions {
        path: dir.join("store"),
        fsync: true,
        max_entries,
    }
}

async fn acquire(s: &FileStore, k: u32) -> Lease {
    match s.claim(req(k)).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing { record, .. } => panic!("expected to acquire {k}, found {record:?}"),
    }
}

async fn existing(s: &FileStore, k: u32) -> Record {
    match s.claim(req(k)).await.expect("claim") {
        Claim::Existing { record, .. } => record,
        Claim::Acquired(lease) => panic!("expected a record under {k}, acquired {lease:?}"),
    }
}

async fn complete(s: &FileStore, lease: &Lease, body: &'static [u8]) {
    let done = s
        .complete(lease, response(body), TTL)
        .await
        .expect("complete");
    assert_eq!(done, Fenced::Done);
}

/// The database file's length and hash, to show that a refusal changed nothing in it.
fn fingerprint(store: &Path) -> (u64, String) {
    use sha2::Digest;
    let bytes = std::fs::read(store.join(DB_FILE)).expect("read the database file");
    let hash = sha2::Sha256::digest(&bytes);
    let hex = hash.iter().map(|b| format!("{b:02x}")).collect();
    (bytes.len() as u64, hex)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_share_flushes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Arc::new(FileStore::open(&options(dir.path(), 10_000)).expect("open"));
    let before = s.flushes();
    let claims = 400;
    let tasks: Vec<_> = (0..claims)
        .map(|k| {
            let s = Arc::clone(&s);
            tokio::spawn(async move { s.claim(req(k)).await })
        })
        .collect();
    for task in tasks {
        assert!(matches!(
            task.await.expect("join").expect("claim"),
            Claim::Acquired(_)
        ));
    }
    let flushes = s.flushes() - before;
    assert!(
        flushes * 4 <= u64::from(claims),
        "{claims} concurrent claims took {flushes} flushes: not grouped"
    );
    assert_eq!(s.len(), u64::from(claims));
}

#[tokio::test]
async fn the_disk_bytes_gauge_follows_the_file_as_it_grows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = FileStore::open(&options(dir.path(), 100_000)).expect("open");
    let file = dir.path().join("store").join(disk::DB_FILE);
    let size = || std::fs::metadata(&file).expect("the database file").len();
    let gauge = |s: &FileStore| u64::try_from(s.metrics.disk_bytes.get()).expect("not negative");
    assert_eq!(gauge(&s), size(), "at open");
    let start = size();
    let mut k = 0;
    // Large records, until redb has had to grow the file.
    while size() == start {
        let lease = acquire(&s, k).await;
        complete(&s, &lease, &[b'x'; 16 * 1024]).await;
        k += 1;
        assert!(k < 10_000, "the file never grew");
    }
    assert_eq!(gauge(&s), size(), "after {k} records");
}

#[tokio::test]
async fn records_and_markers_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let marker_token;
    {
        let s = FileStore::open(&options(dir.path(), 100)).expect("open");
        let lease = acquire(&s, 1).await;
        complete(&s, &lease, b"{\"id\":1}").await;
        marker_token = acquire(&s, 2).await.token;
    }
    let s = FileStore::open(&options(dir.path(), 100)).expect("reopen");
    assert_eq!(s.len(), 2);
    assert_eq!(
        existing(&s, 1).await,
        Record::Completed(response(b"{\"id\":1}"))
    );
    assert!(matches!(existing(&s, 2).await, Record::InFlight(m) if m.token == marker_token));
    // Completion order carries on after the reopen: the new record is the youngest.
    let lease = acquire(&s, 3).await;
    complete(&s, &lease, b"3").await;
}

#[tokio::test]
async fn evicts_completed_oldest_first_never_markers_and_refuses_when_only_markers_are_left() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = FileStore::open(&options(dir.path(), 3)).expect("open");
    for k in 1..=2 {
        let lease = acquire(&s, k).await;
        complete(&s, &lease, b"x").await;
    }
    let _marker = acquire(&s, 3).await;
    // Full: the oldest completed record (1) makes room.
    let _four = acquire(&s, 4).await;
    assert_eq!(s.evictions(), 1);
    assert!(matches!(existing(&s, 2).await, Record::Completed(_)));
    let _one = acquire(&s, 1).await;
    assert_eq!(s.evictions(), 2);
    // Only markers (3, 4, 1) are left: a new key is refused, existing ones still answer.
    assert!(matches!(s.claim(req(5)).await, Err(StoreError::Full)));
    assert!(matches!(existing(&s, 3).await, Record::InFlight(_)));
    assert_eq!(s.len(), 3);
}

#[tokio::test]
async fn a_sweep_removes_what_expired_and_wakes_its_waiters() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = FileStore::open(&options(dir.path(), 100)).expect("open");
    for k in 0..50 {
        let lease = acquire(&s, k).await;
        complete(&s, &lease, b"x").await;
    }
    let _marker = acquire(&s, 99).await;
    let w = s.watch(key(99)).await.expect("watch");
    assert_eq!(s.len(), 51);
    // Time is an input: a sweep as of two ttls from now finds everything expired.
    let later = TokioClock::default().now_ms() + 2 * millis(TTL + LEASE);
    s.ops.send(Op::Sweep { now: later }).expect("writer");
    tokio::time::timeout(Duration::from_secs(5), w.changed())
        .await
        .expect("the marker's removal wakes its waiter");
    assert_eq!(s.len(), 0);
    assert_eq!(s.metrics.expired.get(), 51);
    assert_eq!(
        s.published.next_expiry(),
        u64::MAX,
        "nothing is left to expire"
    );
}

/// Real time: the sweeper runs on its own timer, and the writer on its own thread.
#[tokio::test]
async fn the_background_expiry_runs_on_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = FileStore::open(&options(dir.path(), 100)).expect("open");
    let short = ClaimRequest {
        ttl: Duration::from_millis(100),
        lease: Duration::from_millis(100),
        ..req(1)
    };
    let Claim::Acquired(lease) = s.claim(short).await.expect("claim") else {
        panic!("a fresh key")
    };
    let done = s
        .complete(&lease, response(b"x"), Duration::from_millis(100))
        .await
        .expect("complete");
    assert_eq!(done, Fenced::Done);
    let w = s.watch(key(1)).await.expect("watch");
    tokio::time::timeout(SWEEP_EVERY * 5, w.changed())
        .await
        .expect("the expired record was swept without any request");
    assert!(s.is_empty());
}

#[tokio::test]
async fn dropped_watches_leave_no_watchers_behind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = FileStore::open(&options(dir.path(), 100)).expect("open");
    for k in 0..20 {
        let lease = acquire(&s, k).await;
        drop(s.watch(key(k)).await.expect("watch"));
        let woken = s.watch(key(k)).await.expect("watch");
        let dropped = s.watch(key(k)).await.expect("watch");
        complete(&s, &lease, b"x").await;
        tokio::time::timeout(Duration::from_secs(5), woken.changed())
            .await
            .expect("completion wakes");
        drop(dropped);
    }
    assert_eq!(s.watchers.len(), 0);
}

#[tokio::test]
async fn a_second_open_of_the_same_path_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = FileStore::open(&options(dir.path(), 100)).expect("open");
    let second = FileStore::open(&options(dir.path(), 100));
    assert!(
        matches!(&second, Err(OpenError::InUse { path }) if path == &dir.path().join("store")),
        "{second:?}"
    );
    drop(first);
    FileStore::open(&options(dir.path(), 100)).expect("free again once closed");
}

#[tokio::test]
async fn a_file_that_is_not_a_store_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("mkdir");
    std::fs::write(store.join(DB_FILE), vec![0xA5; 10_000]).expect("write garbage");
    let before = fingerprint(&store);
    let err = FileStore::open(&options(dir.path(), 100)).expect_err("refused");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&store.display().to_string()),
        "{err}"
    );
    assert_eq!(fingerprint(&store), before);
}

#[tokio::test]
async fn a_store_of_another_format_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let s = FileStore::open(&options(dir.path(), 100)).expect("open");
        let lease = acquire(&s, 1).await;
        complete(&s, &lease, b"kept").await;
    }
    let store = dir.path().join("store");
    {
        let db = redb::Database::create(store.join(DB_FILE)).expect("open with redb");
        let txn = db.begin_write().expect("txn");
        txn.open_table(redb::TableDefinition::<&str, u64>::new("meta"))
            .expect("meta")
            .insert("format", FORMAT + 1)
            .expect("insert");
        txn.commit().expect("commit");
    }
    let before = fingerprint(&store);
    let err = FileStore::open(&options(dir.path(), 100)).expect_err("refused");
    assert!(
        matches!(&err, OpenError::Version { found, .. } if *found == (FORMAT + 1).to_string()),
        "{err:?}"
    );
    assert_eq!(fingerprint(&store), before, "nothing was rewritten");
}

/// A store written before records kept their times (format 1) opens: its records load,
/// and the store is marked format 2, which the versions that wrote format 1 refuse at
/// open instead of failing on its newer records one by one.
#[tokio::test]
async fn a_store_of_format_1_opens_and_is_marked_format_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    let meta = redb::TableDefinition::<&str, u64>::new("meta");
    let format_of = |store: &std::path::Path| {
        let db = redb::Database::create(store.join(DB_FILE)).expect("open with redb");
        let txn = db.begin_read().expect("txn");
        let table = txn.open_table(meta).expect("meta");
        table.get("format").expect("get").expect("a format").value()
    };
    {
        let s = FileStore::open(&options(dir.path(), 100)).expect("open");
        let lease = acquire(&s, 1).await;
        complete(&s, &lease, b"kept").await;
    }
    {
        let db = redb::Database::create(store.join(DB_FILE)).expect("open with redb");
        let txn = db.begin_write().expect("txn");
        txn.open_table(meta)
            .expect("meta")
            .insert("format", 1)
            .expect("insert");
        txn.commit().expect("commit");
    }
    assert_eq!(format_of(&store), 1);
    {
        let s = FileStore::open(&options(dir.path(), 100)).expect("a format 1 store opens");
        assert!(matches!(
            s.claim(req(1)).await.expect("claim"),
            Claim::Existing {
                record: Record::Completed(_),
                ..
            }
        ));
    }
    assert_eq!(format_of(&store), FORMAT);
    assert_eq!(FORMAT, 2);
}

#[tokio::test]
async fn a_path_that_cannot_be_created_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("write");
    let path = file.join("store");
    let err = FileStore::open(&FileOptions {
        path: path.clone(),
        fsync: true,
        max_entries: 10,
    })
    .expect_err("refused");
    assert!(matches!(err, OpenError::Create { .. }), "{err:?}");
    assert!(
        matches!(check_path(&path), Err(OpenError::Create { .. })),
        "--check says so too"
    );
    check_path(&dir.path().join("new/deeper")).expect("a path that can be created");
    assert!(!dir.path().join("new").exists(), "checking creates nothing");
}

/// A store that lost its contents is a damaged store, not a new one: starting empty
/// would forget every key it held, and retries would execute again.
#[tokio::test]
async fn a_zero_length_store_file_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("mkdir");
    std::fs::write(store.join(DB_FILE), b"").expect("an empty file");
    let err = FileStore::open(&options(dir.path(), 100)).expect_err("refused");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&store.display().to_string()),
        "{err}"
    );
    assert_eq!(fingerprint(&store).0, 0, "still empty: nothing was created");
}

/// A store cut short (a copy that stopped, a filesystem that lost its tail) is refused
/// at every length, the one that keeps only redb's header included.
#[tokio::test]
async fn a_truncated_store_file_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let s = FileStore::open(&options(dir.path(), 1000)).expect("open");
        for k in 0..50 {
            let lease = acquire(&s, k).await;
            complete(&s, &lease, b"a response worth keeping").await;
        }
    }
    let store = dir.path().join("store");
    let whole = std::fs::read(store.join(DB_FILE)).expect("read the database file");
    for len in [4, 9, 512, 4096, whole.len() / 2, whole.len() - 1] {
        std::fs::write(store.join(DB_FILE), &whole[..len]).expect("truncate");
        let before = fingerprint(&store);
        let err = FileStore::open(&options(dir.path(), 1000)).expect_err("refused");
        assert!(
            matches!(err, OpenError::Corrupt { .. }),
            "cut to {len} of {} bytes: {err:?}",
            whole.len()
        );
        assert!(
            err.to_string().contains(&store.display().to_string()),
            "{err}"
        );
        assert_eq!(fingerprint(&store), before, "cut to {len}: left as it is");
    }
}

/// A directory with files in it but no database may be a store whose file was lost:
/// no new store starts there. A creation that did not finish (the lock and a staging
/// file) is not a store, and the next open starts afresh.
#[tokio::test]
async fn a_new_store_starts_only_in_an_empty_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("mkdir");
    std::fs::write(store.join("notes.txt"), b"not ours").expect("a stray file");
    let err = FileStore::open(&options(dir.path(), 100)).expect_err("refused");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert!(!store.join(DB_FILE).exists(), "nothing was created");

    std::fs::remove_file(store.join("notes.txt")).expect("rm");
    std::fs::write(store.join(LOCK_FILE), b"").expect("a lock file");
    std::fs::write(store.join("idemgate.redb.new"), b"half made").expect("staging");
    let s = FileStore::open(&options(dir.path(), 100)).expect("a new store");
    let lease = acquire(&s, 1).await;
    complete(&s, &lease, b"1").await;
    drop(s);
    assert!(
        !store.join("idemgate.redb.new").exists(),
        "renamed into place"
    );
    let s = FileStore::open(&options(dir.path(), 100)).expect("reopen");
    assert_eq!(existing(&s, 1).await, Record::Completed(response(b"1")));
}
