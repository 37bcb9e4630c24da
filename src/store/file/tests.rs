//! File-store internals the contract suite cannot see: flushes shared by concurrent
//! requests, what survives a reopen, the bound of `max_entries`, expiry, and refusals
//! that leave the directory as it was.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use super::*;
use crate::idempotency::{Completed, Fingerprint, OwnerToken, Record, ScopedKey, StoredBody};
use crate::store::api::millis;
use crate::store::{Claim, ClaimRequest, Fenced, Lease, Purged, Store, Watch};

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
        scope: None,
        fingerprint: Fingerprint::from_bytes([1; 32]),
        token: OwnerToken::random(),
        lease: LEASE,
        ttl: TTL,
        streamed: false,
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

fn options(dir: &Path, max_entries: usize) -> FileOptions {
    FileOptions {
        path: dir.join("store"),
        fsync: true,
        max_entries,
        max_entries_per_scope: None,
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

/// The length of the journal's frames: its bytes without the zeros written ahead of
/// them (every record these tests write ends in a byte that is not zero).
fn frames_len(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1)
}

/// The journal's length and hash, to show that a refusal changed nothing in it.
fn fingerprint(store: &Path) -> (u64, String) {
    use sha2::Digest;
    let bytes = std::fs::read(store.join(JOURNAL_FILE)).expect("read the journal");
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
    assert_eq!(s.len(), usize::try_from(claims).expect("small"));
}

/// Without `fsync` the callers write the journal themselves: every concurrent claim and
/// completion is written when answered (a caller that finds another writing waits for
/// it, then writes what is left), in the order the changes were made, and all of them
/// survive a reopen: the completed records, not the markers they replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_fsync_callers_write_for_each_other_and_every_change_lands_in_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = FileOptions {
        fsync: false,
        ..options(dir.path(), 10_000)
    };
    let keys = 1000u32;
    {
        let s = Arc::new(FileStore::open(&options).expect("open"));
        let tasks: Vec<_> = (0..keys)
            .map(|k| {
                let s = Arc::clone(&s);
                tokio::spawn(async move {
                    let Claim::Acquired(lease) = s.claim(req(k)).await.expect("claim") else {
                        panic!("a fresh key {k}");
                    };
                    s.complete(&lease, response(b"done"), TTL).await
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.expect("join").expect("complete"), Fenced::Done);
        }
        // Shared when callers overlap: never more writes than changes.
        assert!(s.flushes() <= u64::from(2 * keys), "{} writes", s.flushes());
    }
    let s = FileStore::open(&options).expect("reopen");
    assert_eq!(s.len(), usize::try_from(keys).expect("small"));
    for k in 0..keys {
        assert_eq!(existing(&s, k).await, Record::Completed(response(b"done")));
    }
}

#[tokio::test]
async fn the_disk_bytes_gauge_follows_the_file_as_it_grows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = FileStore::open(&options(dir.path(), 100_000)).expect("open");
    let file = dir.path().join("store").join(JOURNAL_FILE);
    let size = || std::fs::metadata(&file).expect("the journal").len();
    let gauge =
        |s: &FileStore| u64::try_from(s.backing.metrics.disk_bytes.get()).expect("not negative");
    assert_eq!(gauge(&s), size(), "at open");
    for k in 0..20 {
        let lease = acquire(&s, k).await;
        complete(&s, &lease, &[b'x'; 16 * 1024]).await;
        assert_eq!(gauge(&s), size(), "after {k} records");
    }
    assert!(size() > 20 * 16 * 1024, "every record is in the journal");
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
    s.backing.queue.tick(later);
    tokio::time::timeout(Duration::from_secs(5), w.changed())
        .await
        .expect("the marker's removal wakes its waiter");
    assert_eq!(s.len(), 0);
    // A write queued now is taken by the writer after the tick has run: once it is
    // settled, so is the tick's count.
    let _after = acquire(&s, 200).await;
    assert_eq!(s.backing.metrics.expired.get(), 51);
    // The removals are in the journal: a reopen finds the new marker only, whatever
    // the time.
    drop(s);
    let s = FileStore::open(&options(dir.path(), 100)).expect("reopen");
    assert_eq!(s.len(), 1);
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
    tokio::time::timeout(TICK_EVERY * 5, w.changed())
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
    assert_eq!(s.core.watched(), 0);
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
    std::fs::write(store.join(JOURNAL_FILE), vec![0xA5; 10_000]).expect("write garbage");
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
    // As a later idemgate might write it: the same header with another format number.
    let mut bytes = std::fs::read(store.join(JOURNAL_FILE)).expect("read");
    let at = journal::FORMAT_AT;
    bytes[at..at + 8].copy_from_slice(&(FORMAT + 1).to_be_bytes());
    std::fs::write(store.join(JOURNAL_FILE), &bytes).expect("write");
    let before = fingerprint(&store);
    let err = FileStore::open(&options(dir.path(), 100)).expect_err("refused");
    assert!(
        matches!(&err, OpenError::Version { found, .. } if *found == (FORMAT + 1).to_string()),
        "{err:?}"
    );
    assert_eq!(fingerprint(&store), before, "nothing was rewritten");
}

/// A store of the previous format (redb's `idemgate.redb`) is not read: it is refused,
/// naming the path and the file, and left as it is.
#[tokio::test]
async fn a_store_of_the_redb_format_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("mkdir");
    let old: Vec<u8> = b"redb\x1A\x0A\xA9\x0D\x0A"
        .iter()
        .copied()
        .chain([7u8; 4000])
        .collect();
    std::fs::write(store.join("idemgate.redb"), &old).expect("write");
    let err = FileStore::open(&options(dir.path(), 100)).expect_err("refused");
    let said = err.to_string();
    assert!(said.contains(&store.display().to_string()), "{said}");
    assert!(said.contains("idemgate.redb"), "{said}");
    assert_eq!(
        std::fs::read(store.join("idemgate.redb")).expect("read"),
        old
    );
    assert!(
        !store.join(JOURNAL_FILE).exists(),
        "no journal was started next to it"
    );
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
        max_entries_per_scope: None,
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
    std::fs::write(store.join(JOURNAL_FILE), b"").expect("an empty file");
    let err = FileStore::open(&options(dir.path(), 100)).expect_err("refused");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&store.display().to_string()),
        "{err}"
    );
    assert_eq!(fingerprint(&store).0, 0, "still empty: nothing was created");
}

/// A journal cut inside its header is refused and left as it is; so is one cut by a
/// byte after a clean shutdown, which recorded its whole length as durable
/// (docs/behaviour.md §25). One cut inside its last write after a crash (a torn tail:
/// the write the crash interrupted) opens without that write, and every record
/// acknowledged before it is there.
#[tokio::test]
async fn a_torn_tail_is_cut_off_and_a_cut_header_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    let crashed = {
        let s = FileStore::open(&options(dir.path(), 1000)).expect("open");
        for k in 0..50 {
            let lease = acquire(&s, k).await;
            complete(&s, &lease, b"a response worth keeping").await;
        }
        // The file as a `kill -9` now would leave it: every write done, no shutdown.
        std::fs::read(store.join(JOURNAL_FILE)).expect("read the journal")
    };
    let whole = std::fs::read(store.join(JOURNAL_FILE)).expect("read the journal");
    for len in [4, journal::FORMAT_AT + 3, whole.len() - 1] {
        std::fs::write(store.join(JOURNAL_FILE), &whole[..len]).expect("truncate");
        let before = fingerprint(&store);
        let err = FileStore::open(&options(dir.path(), 1000)).expect_err("refused");
        assert!(
            matches!(err, OpenError::Corrupt { .. }),
            "cut to {len}: {err:?}"
        );
        assert_eq!(fingerprint(&store), before, "cut to {len}: left as it is");
    }
    let end = frames_len(&crashed);
    assert_eq!(
        end,
        whole.len(),
        "the same frames, without the zeros written ahead"
    );
    std::fs::write(store.join(JOURNAL_FILE), &crashed[..end - 1]).expect("truncate");
    let s = FileStore::open(&options(dir.path(), 1000)).expect("a torn tail opens");
    // The last write was the completion of key 49: its marker is what is left.
    assert!(matches!(existing(&s, 49).await, Record::InFlight(_)));
    for k in 0..49 {
        assert_eq!(
            existing(&s, k).await,
            Record::Completed(response(b"a response worth keeping"))
        );
    }
}

/// A directory with files in it but no journal may be a store whose file was lost: no
/// new store starts there. A creation that did not finish (the lock and a staging file)
/// is not a store, and the next open starts afresh.
#[tokio::test]
async fn a_new_store_starts_only_in_an_empty_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("mkdir");
    std::fs::write(store.join("notes.txt"), b"not ours").expect("a stray file");
    let err = FileStore::open(&options(dir.path(), 100)).expect_err("refused");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert!(!store.join(JOURNAL_FILE).exists(), "nothing was created");

    std::fs::remove_file(store.join("notes.txt")).expect("rm");
    std::fs::write(store.join(LOCK_FILE), b"").expect("a lock file");
    std::fs::write(store.join("idemgate.journal.new"), b"half made").expect("staging");
    let s = FileStore::open(&options(dir.path(), 100)).expect("a new store");
    let lease = acquire(&s, 1).await;
    complete(&s, &lease, b"1").await;
    drop(s);
    assert!(!store.join("idemgate.journal.new").exists(), "gone");
    let s = FileStore::open(&options(dir.path(), 100)).expect("reopen");
    assert_eq!(existing(&s, 1).await, Record::Completed(response(b"1")));
}

/// Compaction: a journal grown past its threshold by rewrites of the same keys is
/// replaced by one holding the live records only, which a reopen reads back whole.
#[tokio::test]
async fn compaction_keeps_exactly_the_live_records() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("store").join(JOURNAL_FILE);
    let size = || std::fs::metadata(&file).expect("the journal").len();
    static BODY: [u8; 8 * 1024] = [b'y'; 8 * 1024];
    {
        let s = FileStore::open(&options(dir.path(), 1000)).expect("open");
        // Ten live records; then churn: short-lived keys until the journal passes the
        // compaction threshold.
        for k in 0..10 {
            let lease = acquire(&s, k).await;
            complete(&s, &lease, b"live").await;
        }
        let mut k = 1000;
        while size() <= writer::COMPACT_FROM {
            let lease = acquire(&s, k).await;
            assert_eq!(s.release(&lease).await.expect("release"), Fenced::Done);
            let lease = acquire(&s, k).await;
            let done = s
                .complete(&lease, response(&BODY), TTL)
                .await
                .expect("complete");
            assert_eq!(done, Fenced::Done);
            let purged = s.purge(key(k), true).await.expect("purge");
            assert!(matches!(purged, Purged::Removed(_)));
            k += 1;
        }
        let grown = size();
        s.backing.queue.tick(TokioClock::default().now_ms());
        // The compaction runs on a thread of its own, and the writer puts its journal in
        // place after a write that finds it done: writes go on meanwhile, and land.
        let mut writes = 0;
        while size() >= grown {
            let lease = acquire(&s, 5000 + writes).await;
            assert_eq!(s.release(&lease).await.expect("release"), Fenced::Done);
            writes += 1;
            assert!(writes < 100_000, "never compacted");
        }
        let lease = acquire(&s, 10).await;
        complete(&s, &lease, b"after").await;
        let frames = frames_len(&std::fs::read(&file).expect("read"));
        assert!(size() < grown, "compacted: {} of {grown} bytes", size());
        assert!(frames < 64 * 1024, "live records only: {frames} bytes");
    }
    let s = FileStore::open(&options(dir.path(), 1000)).expect("reopen");
    assert_eq!(s.len(), 11);
    for k in 0..10 {
        assert_eq!(existing(&s, k).await, Record::Completed(response(b"live")));
    }
    assert_eq!(
        existing(&s, 10).await,
        Record::Completed(response(b"after"))
    );
}
