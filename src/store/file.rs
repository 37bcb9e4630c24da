//! The durable embedded store (docs/behaviour.md §12): one process, no Redis, keys that
//! survive a restart and a `kill -9`. It is the memory store's shards (the per-key rules
//! of `rules.rs`, the same code) whose every change is also appended to a journal on
//! disk: see the README for why a journal rather than redb or fjall.
//!
//! - Every change is encoded under its key's shard lock and queued (`queue.rs`); one
//!   writer thread (`writer.rs`) appends what is queued with one write and, with
//!   `fsync`, one `fdatasync`: concurrent requests share one flush (group commit).
//! - An answer waits until the change it depends on is on disk: a claim is on disk
//!   before `claim` returns `Acquired`, a record before `complete` returns, and a
//!   duplicate never replays a record a crash could take back.
//! - Reads (a replay, a duplicate finding a marker) come from memory.
//! - On open the journal is read once into the shards (`journal.rs`: checksummed
//!   frames, a torn tail past the length the header says was made durable cut off,
//!   anything short of it refused). When it has grown past twice its size after the
//!   last compaction, the live records are written to a new journal that replaces it.
//!   Dropping the store is a clean shutdown: the header records the whole length.
//! - Times are wall-clock Unix milliseconds, so a marker written before a crash is
//!   judged against the clock after the restart. Expired entries are dropped every
//!   second.
//! - A failed write (a full disk) fails every change not yet on disk, and the shards
//!   are loaded again from the journal; the store is not ready until a write succeeds,
//!   which it probes for every second.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::clock::{Clock, TokioClock};
use super::memory::MemoryWatch;
use super::{
    Claim, ClaimRequest, Fenced, Inspection, Lease, MemoryStore, Purged, Replaced, Store,
    StoreError,
};
use crate::idempotency::{Completed, OwnerToken, Record, ScopedKey};
pub use journal::dir::{LOCK_FILE, OpenError, check_path};
use journal::{Entry, Journal};
pub use journal::{FORMAT, FORMAT_AT, HEADER_LEN, JOURNAL_FILE};
pub use queue::Journaled;
use queue::Queue;
use writer::Writer;

mod journal;
mod queue;
mod writer;

/// How often expired entries are dropped, compaction considered, and room probed for.
const TICK_EVERY: Duration = Duration::from_secs(1);

/// What `store` says about a file store.
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// The directory; created if missing.
    pub path: PathBuf,
    /// Flush every commit to stable storage.
    pub fsync: bool,
    pub max_entries: usize,
    /// `store.max_entries_per_scope` (docs/behaviour.md §17).
    pub max_entries_per_scope: Option<usize>,
}

impl FileOptions {
    /// What `store` says, for `kind: file`.
    pub fn from_config(store: &crate::config::StoreConfig) -> Self {
        Self {
            path: store.path.clone(),
            fsync: store.fsync,
            max_entries: store.max_entries,
            max_entries_per_scope: store.max_entries_per_scope,
        }
    }
}

/// The file store's own gauges and counters, shared with its writer thread.
#[derive(Debug, Clone)]
pub(super) struct FileMetrics {
    disk_bytes: Gauge,
    expired: Counter,
    flushes: Counter,
    /// `fdatasync` calls.
    syncs: Counter,
    flush_seconds: Histogram,
}

impl FileMetrics {
    fn new() -> Self {
        Self {
            disk_bytes: Gauge::default(),
            expired: Counter::default(),
            flushes: Counter::default(),
            syncs: Counter::default(),
            // 50 µs .. ~1.6 s: a page-cache write to a slow disk's flush.
            flush_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
        }
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A store error that is not the store's data but its machinery.
fn unavailable(why: String) -> StoreError {
    StoreError::Unavailable(why.into())
}

/// Whether the writer runs and its last write succeeded: what `/readyz` reports.
#[derive(Debug, Default)]
pub(super) struct Health {
    alive: AtomicBool,
    failing: AtomicBool,
}

/// The file store. Dropping it stops the writer once it has written what is queued.
#[derive(Debug)]
pub struct FileStore<C: Clock = TokioClock> {
    core: Arc<MemoryStore<C, Journaled>>,
    queue: Arc<Queue>,
    writer: Option<std::thread::JoinHandle<()>>,
    health: Arc<Health>,
    metrics: FileMetrics,
    path: PathBuf,
}

impl FileStore<TokioClock> {
    /// Opens (or creates) the store at `options.path`. Needs a tokio runtime: the
    /// background expiry runs on it.
    pub fn open(options: &FileOptions) -> Result<Self, OpenError> {
        Self::open_with_clock(options, TokioClock::default())
    }
}

/// Loads one journal entry into the locked shards; a record that does not decode is
/// reported (a checksummed frame held it: the store is not one this version reads).
fn load(shards: &mut super::memory::AllShards<'_>, entry: Entry<'_>) -> Result<(), String> {
    match entry {
        Entry::Put {
            key,
            expires_ms,
            record,
            scope,
        } => {
            let record = Record::decode(Bytes::copy_from_slice(record)).map_err(|err| {
                format!("a record of key {} does not decode: {err}", key.to_hex())
            })?;
            shards.load(key, record, expires_ms, scope);
        }
        Entry::Remove { key } => shards.unload(&key),
    }
    Ok(())
}

impl<C: Clock + Clone> FileStore<C> {
    pub fn open_with_clock(options: &FileOptions, clock: C) -> Result<Self, OpenError> {
        let metrics = FileMetrics::new();
        let queue = Queue::new(0, !options.fsync);
        let core = Arc::new(
            MemoryStore::durable(
                options.max_entries,
                clock.clone(),
                Journaled(Arc::clone(&queue)),
            )
            .with_scope_quota(options.max_entries_per_scope),
        );
        let mut undecodable = None;
        let journal = {
            let mut shards = core.lock_all();
            Journal::open(&options.path, options.fsync, |entry| {
                if undecodable.is_none()
                    && let Err(why) = load(&mut shards, entry)
                {
                    undecodable = Some(why);
                }
            })?
        };
        if let Some(reason) = undecodable {
            return Err(OpenError::Corrupt {
                path: options.path.clone(),
                reason,
            });
        }
        metrics.disk_bytes.set(gauge(journal.size()));
        let health = Arc::new(Health::default());
        health.alive.store(true, Ordering::Relaxed);
        let writer = Writer::new(
            Arc::clone(&core),
            journal,
            Arc::clone(&queue),
            metrics.clone(),
            Arc::clone(&health),
        );
        let writer = std::thread::Builder::new()
            .name("idemgate-file-store".to_owned())
            .spawn(move || writer.run())
            .map_err(|source| OpenError::NotWritable {
                path: options.path.clone(),
                source,
            })?;
        tokio::spawn(tick(Arc::downgrade(&queue), clock));
        Ok(Self {
            core,
            queue,
            writer: Some(writer),
            health,
            metrics,
            path: options.path.clone(),
        })
    }
}

impl<C: Clock> FileStore<C> {
    /// Entries held, expired ones not yet removed included.
    pub fn len(&self) -> u64 {
        self.core.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live records evicted early because the store was full.
    pub fn evictions(&self) -> u64 {
        self.core.evictions()
    }

    /// Writes to the journal so far (each one flush with `fsync`).
    pub fn flushes(&self) -> u64 {
        self.metrics.flushes.get()
    }

    /// The directory the store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl<C: Clock> Drop for FileStore<C> {
    fn drop(&mut self) {
        self.queue.close();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The writer's clock: asks it every second to drop what has expired, to compact the
/// journal when it has grown, and to probe for room after a failed write.
async fn tick<C: Clock>(queue: Weak<Queue>, clock: C) {
    let mut every = tokio::time::interval(TICK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(queue) = queue.upgrade() else {
            return;
        };
        queue.tick(clock.now_ms());
    }
}

/// A registered wake-up for one key of the file store.
pub type FileWatch = MemoryWatch;

impl<C: Clock> Store for FileStore<C> {
    type Watch = FileWatch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        self.core.claim(req).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        record: Arc<Completed>,
        ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        self.core.complete(lease, record, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        self.core.release(lease).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        self.core.renew(lease, lease_for).await
    }

    async fn take_over(
        &self,
        stale: OwnerToken,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        self.core.take_over(stale, req).await
    }

    async fn watch(&self, key: ScopedKey) -> Result<FileWatch, StoreError> {
        self.core.watch(key).await
    }

    fn clock_ms(&self) -> u64 {
        self.core.clock_ms()
    }

    async fn inspect(&self, key: ScopedKey) -> Result<Option<Inspection>, StoreError> {
        self.core.inspect(key).await
    }

    async fn purge(&self, key: ScopedKey, force: bool) -> Result<Purged, StoreError> {
        self.core.purge(key, force).await
    }

    async fn replace(
        &self,
        key: ScopedKey,
        expected: &Record,
        new: Option<Arc<Completed>>,
    ) -> Result<Replaced, StoreError> {
        self.core.replace(key, expected, new).await
    }

    /// Ready while the writer runs and no write has failed since the last one that
    /// succeeded.
    async fn ping(&self) -> Result<(), StoreError> {
        if !self.health.alive.load(Ordering::Relaxed) {
            return Err(unavailable(
                "the file store's writer has stopped".to_owned(),
            ));
        }
        if self.health.failing.load(Ordering::Relaxed) {
            return Err(unavailable(
                "the file store's last write failed (disk full?); retrying".to_owned(),
            ));
        }
        Ok(())
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.core.register_shared_metrics(registry, "file");
        let m = &self.metrics;
        registry.register(
            "idemgate_store_expired",
            "Records and markers removed by the file store's background expiry",
            m.expired.clone(),
        );
        registry.register_with_unit(
            "idemgate_store_disk",
            "Size of the file store's journal file",
            Unit::Bytes,
            m.disk_bytes.clone(),
        );
        registry.register(
            "idemgate_store_flushes",
            "Writes to the file store's journal; concurrent requests share one (group commit)",
            m.flushes.clone(),
        );
        registry.register(
            "idemgate_store_fsyncs",
            "Flushes to stable storage (fdatasync) made by the file store",
            m.syncs.clone(),
        );
        registry.register_with_unit(
            "idemgate_store_flush",
            "Time to write and flush one batch of the file store's journal",
            Unit::Seconds,
            m.flush_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests;
