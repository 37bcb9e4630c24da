//! The one thread that writes the file store's journal. It takes everything queued
//! (`queue.rs`), appends it with one write and one flush, and settles the tickets; while
//! a flush runs, the next batch queues up behind it. Once a second it also drops what
//! has expired, compacts the journal when it has grown, and, after a failed write,
//! probes for room.
//!
//! A write that fails (a full disk, an I/O error) is cut off the file again, and the
//! shards are loaded again from the journal with every lock held: the changes not on
//! disk are gone from memory too, and their callers are refused. The store is not
//! ready until a write or a probe succeeds, and recovers without a restart.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::journal::{self, Entry, Journal};
use super::queue::{Queue, Seat};
use super::{FileMetrics, Health, gauge, load};
use crate::idempotency::{OwnerToken, Record, ScopedKey};
use crate::store::api::{Fenced, Lease, Written};
use crate::store::clock::Clock;
use crate::store::memory::Core;

/// The journal is compacted when it is this much larger than after the last compaction,
/// and at least [`COMPACT_FROM`].
const COMPACT_GROWTH: u64 = 2;
/// Below this a journal is never compacted: rewriting it would cost more than it frees.
pub(super) const COMPACT_FROM: u64 = 4 << 20;

pub(super) struct Writer<C: Clock> {
    core: Core<C>,
    journal: Journal,
    queue: Arc<Queue>,
    metrics: FileMetrics,
    health: Arc<Health>,
    /// The most bytes a failed write tried to write since the last one that succeeded:
    /// what a probe writes to find out whether there is room again.
    failed_bytes: u64,
    /// Claims whose write failed. Their callers were refused, so nothing was forwarded
    /// for them, but a compaction may have put their markers in the journal already:
    /// they are removed, so that a retry executes instead of waiting out a lease nobody
    /// holds.
    unsure: Vec<(ScopedKey, OwnerToken)>,
    /// The journal's size after the last compaction (or when it was opened).
    compacted: u64,
    compaction: Option<Compaction>,
    /// A write from a caller's seat found the writer cannot go on.
    stopped: bool,
    /// The buffer the queue's entries are swapped into, for a caller's write.
    spare: Vec<u8>,
}

impl<C: Clock + Clone> Writer<C> {
    pub(super) fn new(
        core: Core<C>,
        journal: Journal,
        queue: Arc<Queue>,
        metrics: FileMetrics,
        health: Arc<Health>,
    ) -> Self {
        let compacted = journal.len();
        Self {
            core,
            journal,
            queue,
            metrics,
            health,
            failed_bytes: 0,
            unsure: Vec::new(),
            compacted,
            compaction: None,
            stopped: false,
            spare: Vec::new(),
        }
    }

    /// Writes until the store is dropped and the queue drained. With `fsync: false` the
    /// callers write what is queued themselves (`Seat`), and this thread runs the ticks
    /// and writes only what nobody waits for.
    pub(super) fn run(self) {
        let queue = Arc::clone(&self.queue);
        // However the loop ends, a panic included, waiters and `/readyz` learn of it.
        let _stopped = Stopped(Arc::clone(&queue), Arc::clone(&self.health));
        let seat: Arc<Mutex<Self>> = Arc::new(Mutex::new(self));
        let weak: std::sync::Weak<Mutex<Self>> = Arc::downgrade(&seat);
        queue.seat(weak);
        loop {
            let tick = queue.wait_for_work();
            let mut writer = seat.lock().unwrap_or_else(PoisonError::into_inner);
            if writer.stopped || !writer.write_queued() {
                return;
            }
            let Some(tick) = tick else {
                // Closed, and what was queued is written.
                writer.abandon_compaction();
                writer.close();
                return;
            };
            if let Some(now) = tick
                && !(writer.tick(now) && writer.write_queued())
            {
                return;
            }
            writer.finish_compaction();
            drop(writer);
            queue.released();
        }
    }

    /// Writes what is queued, if anything, while this writer is held; false when the
    /// writer cannot go on.
    fn write_queued(&mut self) -> bool {
        let spare = std::mem::take(&mut self.spare);
        let Some(work) = self.queue.take(spare) else {
            return true;
        };
        let wrote = self.write(&work.entries, work.last);
        self.spare = work.entries;
        wrote
    }

    /// Appends one batch; false when the writer cannot go on.
    fn write(&mut self, entries: &[u8], last: u64) -> bool {
        let started = Instant::now();
        let syncs = self.journal.syncs();
        // After a failed write, a small one (a claim) may still fit where the records
        // that follow it will not: until a probe as large as the failed write (up to
        // 1 MiB) fits, every write fails, so that claims are refused rather than
        // executed with outcomes that cannot be recorded.
        let room = if self.health.failing.load(Ordering::Relaxed) {
            self.journal.probe(self.failed_bytes)
        } else {
            Ok(())
        };
        match room.and_then(|()| self.journal.append(entries)) {
            Ok(()) => {
                // The metrics first: whoever the settlement wakes sees them up to date.
                self.metrics.flushes.inc();
                self.metrics.syncs.inc_by(self.journal.syncs() - syncs);
                self.metrics
                    .flush_seconds
                    .observe(started.elapsed().as_secs_f64());
                self.metrics.disk_bytes.set(gauge(self.journal.size()));
                if let Some(compaction) = &mut self.compaction {
                    compaction.tail.extend_from_slice(entries);
                }
                self.queue.settle(last);
                self.succeeded();
                true
            }
            Err(err) => {
                tracing::error!(error = %err, path = %self.core_path(), "file store: write failed");
                self.failed_bytes = self.failed_bytes.max(entries.len() as u64);
                self.failed(entries)
            }
        }
    }

    fn core_path(&self) -> String {
        self.journal.path().display().to_string()
    }

    /// A write or a probe succeeded: ready again.
    fn succeeded(&mut self) {
        self.unsure.clear();
        self.failed_bytes = 0;
        if self.health.failing.swap(false, Ordering::Relaxed) {
            tracing::info!(path = %self.core_path(), "file store: writes succeed again");
        }
    }

    /// Every change not on disk fails; the shards are loaded again from the journal.
    fn failed(&mut self, entries: &[u8]) -> bool {
        self.health.failing.store(true, Ordering::Relaxed);
        self.abandon_compaction();
        let mut shards = self.core.lock_all();
        let dropped = self.queue.fail_all();
        for batch in [entries, &dropped] {
            journal::entries(batch, |entry| {
                if let Entry::Put { key, record, .. } = entry
                    && let Ok(Record::InFlight(marker)) =
                        Record::decode(bytes::Bytes::copy_from_slice(record))
                {
                    self.unsure.push((key, marker.token));
                }
            });
        }
        shards.clear();
        let mut undecodable = None;
        let read = self.journal.replay(|entry| {
            if let Err(why) = load(&mut shards, entry) {
                undecodable.get_or_insert(why);
            }
        });
        drop(shards);
        if let Some(why) = undecodable {
            tracing::warn!(reason = %why, "file store: a record read back does not decode; skipped");
        }
        if let Err(err) = read {
            tracing::error!(error = %err, path = %self.core_path(), "file store: cannot read its journal again; stopping");
            return false;
        }
        let mut freed = 0;
        for (key, token) in &self.unsure {
            // Whatever the time: a marker with this token is the failed claim's. The
            // removal is journaled with the next write.
            let lease = Lease {
                key: *key,
                token: *token,
                claimed_at_ms: 0,
                written: Written::default(),
            };
            freed += usize::from(self.core.release_at(&*self.queue, &lease, 0) == Fenced::Done);
        }
        if freed > 0 {
            tracing::info!(
                freed,
                "file store: removed the markers of claims whose write failed"
            );
        }
        true
    }

    /// The once-a-second work; false when the writer cannot go on.
    fn tick(&mut self, now: u64) -> bool {
        self.metrics
            .expired
            .inc_by(self.core.sweep(&*self.queue, now));
        if self.health.failing.load(Ordering::Relaxed) {
            match self.journal.probe(self.failed_bytes) {
                Ok(()) => self.succeeded(),
                Err(err) => tracing::debug!(error = %err, "file store: still no room"),
            }
            return true;
        }
        let threshold = (self.compacted * COMPACT_GROWTH).max(COMPACT_FROM);
        if self.compaction.is_none() && self.journal.len() > threshold {
            self.compact(now);
        }
        true
    }

    /// Starts writing a new journal of the live records, on a thread of its own: the
    /// writer goes on appending meanwhile, and keeps a copy of what it appends.
    fn compact(&mut self, now: u64) {
        let core = self.core.clone();
        let dir = self.journal.dir().to_owned();
        let spawned = std::thread::Builder::new()
            .name("idemgate-file-compact".to_owned())
            .spawn(move || {
                let mut live = Vec::new();
                core.for_each_live(now, |key, record, expires_ms, scope| {
                    journal::encode_put(key, expires_ms, record, scope, &mut live);
                });
                journal::stage(&dir, &live)
            });
        match spawned {
            Ok(thread) => {
                self.compaction = Some(Compaction {
                    thread,
                    tail: Vec::new(),
                    started: Instant::now(),
                    before: self.journal.len(),
                });
            }
            Err(err) => tracing::warn!(error = %err, "file store: cannot start a compaction"),
        }
    }

    /// Puts the compacted journal in place once it is written, with what was appended
    /// meanwhile.
    fn finish_compaction(&mut self) {
        if !self
            .compaction
            .as_ref()
            .is_some_and(|c| c.thread.is_finished())
        {
            return;
        }
        let Some(compaction) = self.compaction.take() else {
            return;
        };
        let staged = compaction
            .thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the compaction thread panicked")));
        match staged.and_then(|staged| self.journal.adopt(staged, &compaction.tail)) {
            Ok(()) => {
                self.compacted = self.journal.len();
                self.metrics.disk_bytes.set(gauge(self.journal.size()));
                tracing::debug!(
                    before = compaction.before,
                    after = self.compacted,
                    ms = compaction.started.elapsed().as_millis() as u64,
                    "file store: journal compacted"
                );
            }
            Err(err) => {
                tracing::warn!(error = %err, path = %self.core_path(), "file store: compaction failed; the journal is kept as it is");
            }
        }
    }

    /// A clean shutdown: the journal records its whole length as durable
    /// (docs/behaviour.md §25). A failure leaves what the appends recorded, as a crash.
    fn close(&mut self) {
        if let Err(err) = self.journal.close() {
            tracing::warn!(error = %err, path = %self.core_path(), "file store: cannot record the journal's length at shutdown");
        }
    }

    /// Drops a compaction under way: what it read may hold changes that a failed write
    /// has just taken back.
    fn abandon_compaction(&mut self) {
        if let Some(compaction) = self.compaction.take() {
            if let Ok(Ok(staged)) = compaction.thread.join() {
                drop(staged);
            }
            let _ = journal::dir::remove_staging(self.journal.dir());
        }
    }
}

impl<C: Clock + Clone> Seat for Mutex<Writer<C>> {
    fn write_queued(&self) -> bool {
        let (wrote, queue) = {
            let Some(mut writer) = held(self) else {
                return false;
            };
            (writer.write_for_a_caller(), Arc::clone(&writer.queue))
        };
        queue.released();
        wrote
    }
}

/// The writer, if nobody else holds it.
fn held<C: Clock>(seat: &Mutex<Writer<C>>) -> Option<std::sync::MutexGuard<'_, Writer<C>>> {
    match seat.try_lock() {
        Ok(writer) => Some(writer),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

impl<C: Clock + Clone> Writer<C> {
    /// A caller's write of what is queued (`fsync: false`); false when the writer has
    /// stopped.
    fn write_for_a_caller(&mut self) -> bool {
        if self.stopped {
            return false;
        }
        if !self.write_queued() {
            // The thread finds it when it next holds the writer, and stops; the queue
            // answers the waiters now.
            self.stopped = true;
            self.health.alive.store(false, Ordering::Relaxed);
            self.queue.stopped();
            return false;
        }
        self.finish_compaction();
        true
    }
}

/// A compaction under way.
struct Compaction {
    thread: std::thread::JoinHandle<std::io::Result<journal::Staged>>,
    /// The entries appended to the old journal since the live records were read.
    tail: Vec<u8>,
    started: Instant,
    before: u64,
}

/// Tells the waiters and `/readyz` that the writer has stopped, when dropped.
struct Stopped(Arc<Queue>, Arc<Health>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.1.alive.store(false, Ordering::Relaxed);
        self.0.stopped();
    }
}
