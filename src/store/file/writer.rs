//! The one thread that writes the file store. Requests queue their operations; the
//! writer takes everything queued, applies it in order in one transaction, commits
//! (one flush for all of them: group commit), and only then answers each caller and
//! wakes the waiters. While a flush runs, the next batch queues up behind it.
//!
//! Every decision (is the key free, is this still the owner's marker, is the store full)
//! is taken inside the transaction (the rules in `tx.rs`), which sees the batch's own
//! earlier writes, so the writer is the single place where claims are serialised.
//!
//! A commit that fails (a full disk, an I/O error) fails its batch; the writer then
//! opens the database again (`db.rs`) and carries on, so the store recovers without a
//! restart once the disk has room.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::Instant;

use redb::Database;

use super::FileMetrics;
use super::db::{self, Db, Reopen};
use super::disk::LOG;
use super::index::{Index, Published};
use super::op::{Answer, Op};
use super::tx::Tx;
use super::watch::FileWaiters;
use crate::idempotency::{OwnerToken, ScopedKey};

/// At most this many operations share one commit.
const MAX_BATCH: usize = 4096;
/// Expired entries removed along with each commit, besides the timer's sweeps.
const SWEEP_PER_COMMIT: usize = 256;
/// Expired entries removed by one timed sweep.
pub(super) const SWEEP_PER_TICK: usize = 8192;

pub(super) struct Writer {
    pub(super) db: Arc<Db>,
    pub(super) reopen: Reopen,
    pub(super) max_entries: u64,
    pub(super) index: Index,
    pub(super) published: Arc<Published>,
    pub(super) metrics: FileMetrics,
    pub(super) watchers: FileWaiters,
    pub(super) file: std::path::PathBuf,
    /// Cleared when the writer stops, so that `/readyz` reports it.
    pub(super) alive: Arc<AtomicBool>,
    /// The most bytes a failed commit tried to write since the last commit that
    /// succeeded: what a probe writes to find out whether there is room again.
    pub(super) failed_bytes: u64,
    /// Bytes of values written by the commit being made.
    pub(super) written: u64,
    /// The markers the commit being made claims.
    pub(super) claimed: Vec<(ScopedKey, OwnerToken)>,
    /// Markers claimed by commits that failed. Their callers were refused, so nothing
    /// was forwarded for them, but a commit can fail after it reached the file (its
    /// last flush): the reopened database is rid of them before anyone reads it, so
    /// that a retry executes instead of waiting out a lease nobody holds.
    pub(super) unsure: Vec<(ScopedKey, OwnerToken)>,
}

impl Writer {
    /// Serves batches until every sender is gone.
    pub(super) fn run(mut self, ops: &Receiver<Op>) {
        // However the loop ends, a panic included, `/readyz` learns of it.
        let _stopped = Stopped(Arc::clone(&self.alive));
        while let Ok(first) = ops.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match ops.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.commit(batch);
        }
        // Closed here, before the lock file is let go.
        self.db.close();
    }

    fn commit(&mut self, batch: Vec<Op>) {
        let started = Instant::now();
        let requests = batch.iter().any(|op| !matches!(op, Op::Sweep { .. }));
        let sweep_limit = if requests {
            SWEEP_PER_COMMIT
        } else {
            SWEEP_PER_TICK
        };
        let now = batch.iter().map(Op::now).max().unwrap_or(0);
        let Some(db) = self.database() else {
            for op in batch {
                op.fail("the file store cannot open its database again after a failed write");
            }
            return;
        };
        // After a failed write, a write of its own as large tells whether there is room
        // again, even when nothing else is written.
        let probe = (!self.db.healthy()).then_some(self.failed_bytes);
        self.written = 0;
        self.claimed.clear();
        let mut answers = Vec::with_capacity(batch.len());
        match self.transact(&db, batch, now, sweep_limit, probe, &mut answers) {
            Ok(Some(done)) => {
                // Committed: these claims are acknowledged, whatever a probe does next.
                self.claimed.clear();
                self.published.update(&self.index, &done.touched);
                self.metrics.evictions.inc_by(done.evicted);
                self.metrics.expired.inc_by(done.expired);
                self.metrics.observe_commit(started.elapsed(), &self.index);
                for key in &done.changed {
                    self.watchers.wake(key);
                }
                for answer in answers {
                    answer.send();
                }
                if probe.is_some() {
                    if let Err(err) = db::remove_probe(&db) {
                        return self.write_failed(db, &err);
                    }
                    tracing::info!(file = %self.file.display(), "file store: writes succeed again");
                }
                self.failed_bytes = 0;
                self.db.set_healthy(true);
            }
            // Nothing was written: nothing to flush, the answers stand as they are.
            Ok(None) => {
                for answer in answers {
                    answer.send();
                }
            }
            Err(err) => {
                let why = format!("the file store could not commit: {err}");
                for answer in answers {
                    answer.fail(&why);
                }
                // The operations not reached drop their reply: their callers see the
                // writer's answer missing, which is the same error.
                self.write_failed(db, &err);
            }
        }
    }

    /// A commit failed: not ready until one succeeds. redb refuses every write after a
    /// failed one, and the index may hold the failed batch: open the database again
    /// and read the index from what is committed.
    fn write_failed(&mut self, db: Arc<Database>, err: &redb::Error) {
        tracing::error!(error = %err, file = %self.file.display(), "file store: commit failed");
        self.failed_bytes = self.failed_bytes.max(self.written);
        self.unsure.append(&mut self.claimed);
        self.db.set_healthy(false);
        drop(db);
        self.db.close();
        self.database();
    }

    /// The open database, opened again first if a failed write closed it. `None` while
    /// it cannot be (the disk still full, say): the next batch or probe tries again.
    fn database(&mut self) -> Option<Arc<Database>> {
        if let Ok(db) = self.db.get() {
            return Some(db);
        }
        let db = match self.reopen.open() {
            Ok(db) => db,
            Err(err) => {
                tracing::warn!(error = %err, "file store: cannot open the database again yet");
                return None;
            }
        };
        match Index::load(&db) {
            Ok(index) => self.index = index,
            Err(err) => {
                tracing::warn!(error = %err, "file store: cannot read its index again yet");
                return None;
            }
        }
        if let Err(err) = self.settle_unsure(&db) {
            tracing::warn!(error = %err, "file store: cannot remove the markers of failed claims yet");
            return None;
        }
        self.published.reset(&self.index);
        self.metrics.set_counts(&self.index);
        self.db.put(db);
        self.db.get().ok()
    }

    /// Removes the markers of failed claims that reached the file all the same.
    fn settle_unsure(&mut self, db: &Database) -> Result<(), redb::Error> {
        if self.unsure.is_empty() {
            return Ok(());
        }
        let txn = db.begin_write()?;
        let changed = {
            let mut tx = Tx::new(
                txn.open_table(LOG)?,
                &mut self.index,
                &mut self.written,
                &mut self.claimed,
            );
            for (key, token) in &self.unsure {
                // Whatever the time: a marker with this token is the failed claim's.
                if tx.owned(*key, *token, 0)?.is_some() {
                    tx.remove(*key)?;
                }
            }
            tx.changed
        };
        if changed.is_empty() {
            txn.abort()?;
        } else {
            txn.commit()?;
            tracing::info!(
                removed = changed.len(),
                "file store: removed the markers of failed claims"
            );
            for key in &changed {
                self.watchers.wake(key);
            }
        }
        self.unsure.clear();
        Ok(())
    }

    /// Applies `batch` in one transaction and commits it if it wrote anything.
    fn transact(
        &mut self,
        db: &Database,
        batch: Vec<Op>,
        now: u64,
        sweep_limit: usize,
        probe: Option<u64>,
        answers: &mut Vec<Answer>,
    ) -> Result<Option<Done>, redb::Error> {
        let txn = db.begin_write()?;
        let done = {
            let mut tx = Tx::new(
                txn.open_table(LOG)?,
                &mut self.index,
                &mut self.written,
                &mut self.claimed,
            );
            for op in batch {
                answers.push(tx.apply(op, self.max_entries)?);
            }
            tx.sweep(now, sweep_limit)?;
            (!tx.touched.is_empty() || probe.is_some()).then_some(Done {
                touched: tx.touched,
                changed: tx.changed,
                evicted: tx.evicted,
                expired: tx.expired,
            })
        };
        match done {
            None => {
                txn.abort()?;
                Ok(None)
            }
            Some(done) => {
                if let Some(bytes) = probe {
                    db::write_probe(&txn, bytes)?;
                }
                txn.commit()?;
                Ok(Some(done))
            }
        }
    }
}

/// Clears the writer's liveness flag when dropped.
struct Stopped(Arc<AtomicBool>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// What a committed transaction changed.
struct Done {
    touched: Vec<ScopedKey>,
    changed: Vec<ScopedKey>,
    evicted: u64,
    expired: u64,
}
