//! The durable embedded store (docs/behaviour.md §12): one process, no Redis, keys that
//! survive a restart and a `kill -9`. It is the memory store's code ([`Embedded`]: its
//! shards, the per-key rules of `rules.rs`) backed by a [`Disk`], whose journal every
//! change is also appended to: see docs/stores.md for why a journal rather than redb or
//! fjall.
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

use super::api::StoreError;
use super::clock::{Clock, TokioClock};
use super::memory::{AllShards, Backing, Core, Embedded, MemoryWatch};
use crate::idempotency::Record;
pub use journal::dir::{LOCK_FILE, OpenError, check_path};
use journal::{Entry, Journal};
pub use journal::{FORMAT, FORMAT_AT, HEADER_LEN, JOURNAL_FILE};
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

/// The file store: the embedded store's shards, backed by a journal on disk.
pub type FileStore<C = TokioClock> = Embedded<C, Disk>;

/// The file store's backing: the journal's queue, the writer thread that appends it, and
/// what `/readyz` and `/metrics` report of them. Dropping it stops the writer once it has
/// written what is queued.
#[derive(Debug)]
pub struct Disk {
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
fn load(shards: &mut AllShards<'_>, entry: Entry<'_>) -> Result<(), String> {
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
        let core = Core::new(
            options.max_entries,
            clock.clone(),
            options.max_entries_per_scope,
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
            core.clone(),
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
            backing: Disk {
                queue,
                writer: Some(writer),
                health,
                metrics,
                path: options.path.clone(),
            },
        })
    }
}

impl<C: Clock> FileStore<C> {
    /// Writes to the journal so far (each one flush with `fsync`).
    pub fn flushes(&self) -> u64 {
        self.backing.metrics.flushes.get()
    }

    /// The directory the store lives in.
    pub fn path(&self) -> &Path {
        &self.backing.path
    }
}

impl Drop for Disk {
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

impl Backing for Disk {
    type Durability = Queue;
    const KIND: &'static str = "file";

    fn durability(&self) -> &Queue {
        &self.queue
    }

    /// Ready while the writer runs and no write has failed since the last one that
    /// succeeded.
    fn ping(&self) -> Result<(), StoreError> {
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
