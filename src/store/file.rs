//! The durable embedded store (docs/behaviour.md §12): one process, no Redis, keys that
//! survive a restart and a `kill -9`. Built on redb (one file, copy-on-write B-tree,
//! checksummed commits): see the README for why redb rather than fjall.
//!
//! - Reads (a replay, a duplicate finding a marker) are served on the caller's thread
//!   from a read transaction, which sees only committed data.
//! - Every change goes through one writer thread (`writer.rs`) that commits what is
//!   queued in one transaction: a claim is on disk before `claim` returns `Acquired`,
//!   a record before `complete` returns, and concurrent requests share one flush.
//! - Semantics are the memory store's: ttl from completion, leases and fencing, eviction
//!   of completed records oldest first at `max_entries`, never a marker, `Full` when
//!   only markers are left. Times are wall-clock Unix milliseconds, so a marker written
//!   before a crash is judged against the clock after the restart.
//! - Expired entries are removed in the background (a sweep every second, and a few
//!   with every commit), so a steady load of fresh keys keeps the file's size flat.
//! - A failed write (a full disk) is refused, and the database is opened again at once;
//!   the store is not ready until a write succeeds, which it tries every second.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use redb::{ReadableDatabase, ReadableTable};
use tokio::sync::oneshot;

use super::clock::{Clock, TokioClock};
use super::{Claim, ClaimRequest, Fenced, Inspection, Lease, Purged, Store, StoreError};
use crate::idempotency::{Completed, OwnerToken, ScopedKey};
use backend::Settings;
use db::{Db, Reopen};
pub use disk::{DB_FILE, FORMAT, LOCK_FILE, OpenError, check_path};
use index::{Index, Published};
use op::Op;
pub use watch::{FileWaiters, FileWatch};
use writer::Writer;

mod backend;
mod db;
mod disk;
mod index;
mod op;
mod tx;
mod watch;
mod writer;

/// How often expired entries are looked for when nothing else commits.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What `store` says about a file store.
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// The directory; created if missing.
    pub path: PathBuf,
    /// Flush every commit to stable storage.
    pub fsync: bool,
    pub max_entries: usize,
}

impl FileOptions {
    /// What `store` says, for `kind: file`.
    pub fn from_config(store: &crate::config::StoreConfig) -> Self {
        Self {
            path: store.path.clone(),
            fsync: store.fsync,
            max_entries: store.max_entries,
        }
    }
}

/// The file store's gauges and counters, shared with its writer thread.
#[derive(Debug, Clone)]
pub(super) struct FileMetrics {
    entries: Gauge,
    bytes: Gauge,
    disk_bytes: Gauge,
    evictions: Counter,
    expired: Counter,
    flushes: Counter,
    /// `fdatasync` calls; redb may make more than one per commit.
    syncs: Counter,
    flush_seconds: Histogram,
}

impl FileMetrics {
    fn new() -> Self {
        Self {
            entries: Gauge::default(),
            bytes: Gauge::default(),
            disk_bytes: Gauge::default(),
            evictions: Counter::default(),
            expired: Counter::default(),
            flushes: Counter::default(),
            syncs: Counter::default(),
            // 50 µs .. ~1.6 s: a page-cache commit to a slow disk's flush.
            flush_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
        }
    }

    fn observe_commit(&self, elapsed: Duration, index: &Index) {
        self.flushes.inc();
        self.flush_seconds.observe(elapsed.as_secs_f64());
        self.set_counts(index);
    }

    fn set_counts(&self, index: &Index) {
        self.entries.set(gauge(index.keys.len() as u64));
        self.bytes.set(gauge(index.bytes));
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A store error that is not the store's data but its machinery.
fn unavailable(why: String) -> StoreError {
    StoreError::Unavailable(why.into())
}

fn db_error(err: impl Into<redb::Error>) -> StoreError {
    StoreError::Unavailable(Box::new(err.into()))
}

/// The file store. Dropping it stops the writer (after what is queued) and closes the
/// database cleanly.
#[derive(Debug)]
pub struct FileStore<C: Clock = TokioClock> {
    /// Opened again by the writer after a failed write.
    db: Arc<Db>,
    /// Each key's committed log id, kept by the writer.
    published: Arc<Published>,
    /// Shared with the sweeper only weakly, so that dropping the store stops the writer.
    ops: Arc<Sender<Op>>,
    writer: Option<std::thread::JoinHandle<()>>,
    watchers: FileWaiters,
    metrics: FileMetrics,
    alive: Arc<AtomicBool>,
    clock: C,
    path: PathBuf,
}

impl FileStore<TokioClock> {
    /// Opens (or creates) the store at `options.path`. Needs a tokio runtime: the
    /// background expiry runs on it.
    pub fn open(options: &FileOptions) -> Result<Self, OpenError> {
        Self::open_with_clock(options, TokioClock::default())
    }
}

impl<C: Clock + Clone> FileStore<C> {
    pub fn open_with_clock(options: &FileOptions, clock: C) -> Result<Self, OpenError> {
        let metrics = FileMetrics::new();
        let serving = Arc::new(AtomicBool::new(false));
        let settings = Settings {
            fsync: options.fsync,
            syncs: metrics.syncs.clone(),
            size: metrics.disk_bytes.clone(),
            serving: Arc::clone(&serving),
        };
        let opened = disk::open(&options.path, settings.clone())?;
        let index = Index::load(&opened.db).map_err(|err| OpenError::Corrupt {
            path: options.path.clone(),
            reason: err.to_string(),
        })?;
        metrics.set_counts(&index);
        let published = Arc::new(Published::from(&index));
        if let Ok(meta) = std::fs::metadata(&opened.file) {
            metrics.disk_bytes.set(gauge(meta.len()));
        }
        let db = Arc::new(Db::new(opened.db));
        let reopen = Reopen {
            path: options.path.clone(),
            file: opened.file.clone(),
            settings,
        };
        let watchers = FileWaiters::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (ops, queue) = std::sync::mpsc::channel();
        let writer = Writer {
            db: Arc::clone(&db),
            reopen,
            max_entries: options.max_entries.max(1) as u64,
            index,
            published: Arc::clone(&published),
            metrics: metrics.clone(),
            watchers: watchers.clone(),
            file: opened.file,
            alive: Arc::clone(&alive),
            failed_bytes: 0,
            written: 0,
            claimed: Vec::new(),
            unsure: Vec::new(),
        };
        // The lock file goes with the writer: held until the database is closed.
        let lock = opened.lock;
        let writer = std::thread::Builder::new()
            .name("idemgate-file-store".to_owned())
            .spawn(move || {
                writer.run(&queue);
                drop(lock);
            })
            .map_err(|source| OpenError::NotWritable {
                path: options.path.clone(),
                source,
            })?;
        serving.store(true, Ordering::Relaxed);
        let ops = Arc::new(ops);
        tokio::spawn(sweep(
            Arc::downgrade(&ops),
            Arc::downgrade(&published),
            Arc::downgrade(&db),
            clock.clone(),
        ));
        Ok(Self {
            db,
            published,
            ops,
            writer: Some(writer),
            watchers,
            metrics,
            alive,
            clock,
            path: options.path.clone(),
        })
    }
}

impl<C: Clock> FileStore<C> {
    /// Entries held, expired ones not yet removed included.
    pub fn len(&self) -> u64 {
        u64::try_from(self.metrics.entries.get()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live records evicted early because the store was full.
    pub fn evictions(&self) -> u64 {
        self.metrics.evictions.get()
    }

    /// Commits so far (each one flush).
    pub fn flushes(&self) -> u64 {
        self.metrics.flushes.get()
    }

    /// The directory the store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `op` and waits for the writer's answer, given once it is on disk.
    async fn send<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Op,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.ops
            .send(op(reply))
            .map_err(|_| unavailable("the file store's writer has stopped".to_owned()))?;
        answer.await.unwrap_or_else(|_| {
            Err(unavailable(
                "the file store's writer did not answer (commit failed or writer stopped)"
                    .to_owned(),
            ))
        })
    }

    /// What a claim finds without writing: a live record, or `None` when the key is
    /// free (or expired) and the writer has to decide.
    ///
    /// The published id may already be gone from the log (a commit replaced it since):
    /// then the writer decides, as for a free key.
    fn read(&self, key: &ScopedKey, now: u64) -> Result<Option<Claim>, StoreError> {
        Ok(self.read_committed(key, now)?.map(|found| Claim::Existing {
            record: found.record,
            now_ms: now,
        }))
    }

    /// The committed, unexpired version of `key`.
    fn read_committed(&self, key: &ScopedKey, now: u64) -> Result<Option<Inspection>, StoreError> {
        let Some(id) = self.published.id(key) else {
            return Ok(None);
        };
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let log = txn.open_table(disk::LOG).map_err(db_error)?;
        let Some(value) = log.get(id).map_err(db_error)? else {
            return Ok(None);
        };
        let value = value.value();
        match disk::head(value) {
            Ok(head) if head.key == *key && head.expires_ms > now => Ok(Some(Inspection {
                record: disk::record(value).map_err(StoreError::Corrupt)?,
                expires_at_ms: head.expires_ms,
                now_ms: now,
            })),
            _ => Ok(None),
        }
    }
}

impl<C: Clock> Drop for FileStore<C> {
    fn drop(&mut self) {
        // Closing the queue stops the writer once it has committed what was queued;
        // it closes the database cleanly and releases the lock.
        let (closed, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.ops, Arc::new(closed)));
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The background expiry: asks the writer to sweep when something has expired, and
/// every time while a failed write has not been followed by a good one: the writer then
/// writes a probe of its own, so the store becomes ready again once there is room.
async fn sweep<C: Clock>(
    ops: Weak<Sender<Op>>,
    published: Weak<Published>,
    db: Weak<Db>,
    clock: C,
) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = clock.now_ms();
        let Some(published) = published.upgrade() else {
            return;
        };
        let unhealthy = db.upgrade().is_some_and(|db| !db.healthy());
        let due = published.next_expiry() <= now || unhealthy;
        drop(published);
        if due {
            let Some(ops) = ops.upgrade() else { return };
            if ops.send(Op::Sweep { now }).is_err() {
                return;
            }
        }
    }
}

impl<C: Clock> Store for FileStore<C> {
    type Watch = FileWatch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let now = self.clock.now_ms();
        if let Some(existing) = self.read(&req.key, now)? {
            return Ok(existing);
        }
        self.send(|reply| Op::Claim { req, now, reply }).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        record: Arc<Completed>,
        ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        let now = self.clock.now_ms();
        let (key, token) = (lease.key, lease.token);
        self.send(|reply| Op::Complete {
            key,
            token,
            record,
            ttl,
            now,
            reply,
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        let now = self.clock.now_ms();
        let (key, token) = (lease.key, lease.token);
        self.send(|reply| Op::Release {
            key,
            token,
            now,
            reply,
        })
        .await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        let now = self.clock.now_ms();
        let (key, token) = (lease.key, lease.token);
        self.send(|reply| Op::Renew {
            key,
            token,
            lease_for,
            now,
            reply,
        })
        .await
    }

    async fn take_over(
        &self,
        stale: OwnerToken,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        let now = self.clock.now_ms();
        self.send(|reply| Op::TakeOver {
            stale,
            req,
            now,
            reply,
        })
        .await
    }

    async fn watch(&self, key: ScopedKey) -> Result<FileWatch, StoreError> {
        Ok(crate::store::KeyWatch::register(&self.watchers, key))
    }

    fn clock_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    async fn inspect(&self, key: ScopedKey) -> Result<Option<Inspection>, StoreError> {
        self.read_committed(&key, self.clock.now_ms())
    }

    async fn purge(&self, key: ScopedKey, force: bool) -> Result<Purged, StoreError> {
        let now = self.clock.now_ms();
        self.send(|reply| Op::Purge {
            key,
            force,
            now,
            reply,
        })
        .await
    }

    /// Ready while the database is open, its writer runs, and no write has failed since
    /// the last one that succeeded.
    async fn ping(&self) -> Result<(), StoreError> {
        if !self.alive.load(Ordering::Relaxed) {
            return Err(unavailable(
                "the file store's writer has stopped".to_owned(),
            ));
        }
        if !self.db.healthy() {
            return Err(unavailable(
                "the file store's last write failed (disk full?); retrying".to_owned(),
            ));
        }
        self.db.get()?.begin_read().map(drop).map_err(db_error)
    }

    fn register_metrics(&self, registry: &mut Registry) {
        let m = &self.metrics;
        registry.register(
            "idemgate_store_evictions",
            "Completed records evicted before their ttl because the file store was full",
            m.evictions.clone(),
        );
        registry.register(
            "idemgate_store_expired",
            "Records and markers removed by the file store's background expiry",
            m.expired.clone(),
        );
        registry.register(
            "idemgate_store_entries",
            "Records and markers held by the file store",
            m.entries.clone(),
        );
        registry.register_with_unit(
            "idemgate_store",
            "Bytes of records held by the file store (values as stored)",
            Unit::Bytes,
            m.bytes.clone(),
        );
        registry.register_with_unit(
            "idemgate_store_disk",
            "Size of the file store's database file",
            Unit::Bytes,
            m.disk_bytes.clone(),
        );
        registry.register(
            "idemgate_store_flushes",
            "Commits of the file store; concurrent requests share one (group commit)",
            m.flushes.clone(),
        );
        registry.register(
            "idemgate_store_fsyncs",
            "Flushes to stable storage (fdatasync) made by the file store's commits",
            m.syncs.clone(),
        );
        registry.register_with_unit(
            "idemgate_store_flush",
            "Time to apply and commit one batch of the file store, flush included",
            Unit::Seconds,
            m.flush_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests;
