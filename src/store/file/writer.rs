//! The one thread that writes the file store. Requests queue their operations; the
//! writer takes everything queued, applies it in order in one transaction, commits
//! (one flush for all of them: group commit), and only then answers each caller and
//! wakes the waiters. While a flush runs, the next batch queues up behind it.
//!
//! Every decision (is the key free, is this still the owner's marker, is the store full)
//! is taken inside the transaction, which sees the batch's own earlier writes, so the
//! writer is the single place where claims are serialised.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use redb::{Database, ReadableTable, Table};

use super::FileMetrics;
use super::db::{self, Db, Reopen};
use super::disk::{self, Head, LOG};
use super::index::{Index, Loc, Published};
use super::op::{Answer, Op};
use super::watch::Watchers;
use crate::idempotency::{Completed, InFlight, OwnerToken, Record, ScopedKey};
use crate::store::{Claim, ClaimRequest, Fenced, Purged, StoreError, millis};

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
    pub(super) watchers: Arc<Watchers>,
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

/// The log table of one transaction, the index it keeps up to date, and what changed.
struct Tx<'t, 'i> {
    log: Table<'t, u64, &'static [u8]>,
    index: &'i mut Index,
    /// Keys whose version changed: published to readers after the commit.
    touched: Vec<ScopedKey>,
    /// Keys whose waiters are woken after the commit.
    changed: Vec<ScopedKey>,
    evicted: u64,
    expired: u64,
    written: &'i mut u64,
    claimed: &'i mut Vec<(ScopedKey, OwnerToken)>,
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
            let mut tx = Tx {
                log: txn.open_table(LOG)?,
                index: &mut self.index,
                touched: Vec::new(),
                changed: Vec::new(),
                evicted: 0,
                expired: 0,
                written: &mut self.written,
                claimed: &mut self.claimed,
            };
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
            let mut tx = Tx {
                log: txn.open_table(LOG)?,
                index: &mut self.index,
                touched: Vec::new(),
                changed: Vec::new(),
                evicted: 0,
                expired: 0,
                written: &mut self.written,
                claimed: &mut self.claimed,
            };
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

impl Tx<'_, '_> {
    fn apply(&mut self, op: Op, max_entries: u64) -> Result<Answer, redb::Error> {
        Ok(match op {
            Op::Claim { req, now, reply } => {
                Answer::Claim(reply, self.claim(&req, now, max_entries)?)
            }
            Op::Complete {
                key,
                token,
                record,
                ttl,
                now,
                reply,
            } => match self.complete(key, token, &record, ttl, now)? {
                Ok(fenced) => Answer::Fenced(reply, fenced),
                Err(err) => Answer::Failed(reply, err),
            },
            Op::Release {
                key,
                token,
                now,
                reply,
            } => {
                let fenced = if self.owned(key, token, now)?.is_some() {
                    self.remove(key)?;
                    Fenced::Done
                } else {
                    Fenced::LeaseLost
                };
                Answer::Fenced(reply, fenced)
            }
            Op::Renew {
                key,
                token,
                lease_for,
                now,
                reply,
            } => {
                let fenced = match self.owned(key, token, now)? {
                    Some((loc, mut marker)) => {
                        let deadline = now + millis(lease_for);
                        marker.lease_deadline_ms = deadline;
                        self.put(key, loc.expires_ms.max(deadline), &marker.encode(), false)?;
                        Fenced::Done
                    }
                    None => Fenced::LeaseLost,
                };
                Answer::Fenced(reply, fenced)
            }
            Op::TakeOver {
                stale,
                req,
                now,
                reply,
            } => {
                let lease = match self.owned(req.key, stale, now)? {
                    // The lease must still be over: a late renewal by a live owner wins.
                    Some((_, marker)) if marker.lease_deadline_ms <= now => {
                        self.put(
                            req.key,
                            marker_expiry(&req, now),
                            &req.marker(now).encode(),
                            false,
                        )?;
                        self.changed.push(req.key);
                        Some(req.lease(now))
                    }
                    _ => None,
                };
                Answer::TakeOver(reply, lease)
            }
            Op::Purge {
                key,
                force,
                now,
                reply,
            } => match self.purge(key, force, now)? {
                Ok(purged) => Answer::Purged(reply, purged),
                Err(err) => Answer::PurgeFailed(reply, err),
            },
            Op::Sweep { .. } => Answer::None,
        })
    }

    fn claim(
        &mut self,
        req: &ClaimRequest,
        now: u64,
        max_entries: u64,
    ) -> Result<Result<Claim, StoreError>, redb::Error> {
        if let Some(loc) = self.index.keys.get(&req.key).copied() {
            if loc.expires_ms > now {
                return Ok(self.read(loc.id)?.map(|record| Claim::Existing {
                    record,
                    now_ms: now,
                }));
            }
            // Expired: its waiters are woken and find the new marker.
            self.remove(req.key)?;
        }
        if let Err(full) = self.make_room(max_entries, now)? {
            return Ok(Err(full));
        }
        self.put(
            req.key,
            marker_expiry(req, now),
            &req.marker(now).encode(),
            false,
        )?;
        self.claimed.push((req.key, req.token));
        Ok(Ok(Claim::Acquired(req.lease(now))))
    }

    fn complete(
        &mut self,
        key: ScopedKey,
        token: OwnerToken,
        record: &Completed,
        ttl: Duration,
        now: u64,
    ) -> Result<Result<Fenced, StoreError>, redb::Error> {
        if self.owned(key, token, now)?.is_some() {
            self.put(key, now + millis(ttl), &record.encode(), true)?;
            self.changed.push(key);
            return Ok(Ok(Fenced::Done));
        }
        // Repeating a completion that already landed is done, as on every store.
        let Some(loc) = self.index.keys.get(&key).copied() else {
            return Ok(Ok(Fenced::LeaseLost));
        };
        if loc.expires_ms <= now || !loc.completed {
            return Ok(Ok(Fenced::LeaseLost));
        }
        Ok(match self.read(loc.id)? {
            Ok(Record::Completed(stored)) if *stored == *record => Ok(Fenced::Done),
            Ok(_) => Ok(Fenced::LeaseLost),
            Err(err) => Err(err),
        })
    }

    /// Removes what is under `key` unless it is a marker with a live lease and not
    /// `force` (SPEC §13).
    fn purge(
        &mut self,
        key: ScopedKey,
        force: bool,
        now: u64,
    ) -> Result<Result<Purged, StoreError>, redb::Error> {
        let Some(loc) = self.index.keys.get(&key).copied() else {
            return Ok(Ok(Purged::Absent));
        };
        if loc.expires_ms <= now {
            return Ok(Ok(Purged::Absent));
        }
        let record = match self.read(loc.id)? {
            Ok(record) => record,
            Err(StoreError::Corrupt(_)) => {
                self.remove(key)?;
                return Ok(Ok(Purged::Unreadable));
            }
            Err(err) => return Ok(Err(err)),
        };
        if !force && matches!(&record, Record::InFlight(m) if m.lease_deadline_ms > now) {
            return Ok(Ok(Purged::LiveLease));
        }
        self.remove(key)?;
        Ok(Ok(Purged::Removed(record)))
    }

    /// The record stored under log id `id` (written by this transaction or before).
    fn read(&self, id: u64) -> Result<Result<Record, StoreError>, redb::Error> {
        let Some(value) = self.log.get(id)? else {
            return Ok(Err(StoreError::Protocol(
                "the file store's index names a row that is not in its log",
            )));
        };
        Ok(disk::record(value.value()).map_err(StoreError::Corrupt))
    }

    /// The live marker under `key`, if it holds `token`.
    fn owned(
        &self,
        key: ScopedKey,
        token: OwnerToken,
        now: u64,
    ) -> Result<Option<(Loc, InFlight)>, redb::Error> {
        let Some(loc) = self.index.keys.get(&key).copied() else {
            return Ok(None);
        };
        if loc.expires_ms <= now || loc.completed {
            return Ok(None);
        }
        Ok(match self.read(loc.id)? {
            Ok(Record::InFlight(marker)) if marker.token == token => Some((loc, marker)),
            _ => None,
        })
    }

    /// Appends a new version of `key` to the log and deletes its previous one.
    fn put(
        &mut self,
        key: ScopedKey,
        expires_ms: u64,
        record: &[u8],
        completed: bool,
    ) -> Result<(), redb::Error> {
        if let Some(old) = self.index.remove(&key) {
            self.log.remove(old.id)?;
        }
        let id = self.index.next_id;
        self.index.next_id += 1;
        let value = disk::encode(Head { key, expires_ms }, record);
        *self.written += value.len() as u64;
        self.log.insert(id, value.as_slice())?;
        self.index.insert(
            key,
            Loc {
                id,
                expires_ms,
                completed,
                len: value.len() as u64,
            },
        );
        self.touched.push(key);
        Ok(())
    }

    /// Deletes `key`'s version, waking its waiters.
    fn remove(&mut self, key: ScopedKey) -> Result<(), redb::Error> {
        if let Some(old) = self.index.remove(&key) {
            self.log.remove(old.id)?;
            self.touched.push(key);
            self.changed.push(key);
        }
        Ok(())
    }

    /// Makes room for one more entry: evicts completed records oldest first, then drops
    /// markers whose ttl has passed; `Full` when only live markers are left.
    fn make_room(
        &mut self,
        max_entries: u64,
        now: u64,
    ) -> Result<Result<(), StoreError>, redb::Error> {
        while self.index.keys.len() as u64 >= max_entries {
            if let Some((_, key)) = self.index.completed.first_key_value() {
                let key = *key;
                let live = self
                    .index
                    .keys
                    .get(&key)
                    .is_some_and(|loc| loc.expires_ms > now);
                self.evicted += u64::from(live);
                self.remove(key)?;
                continue;
            }
            if self.sweep(now, 1)? == 0 {
                return Ok(Err(StoreError::Full));
            }
        }
        Ok(Ok(()))
    }

    /// Removes up to `limit` entries whose ttl has passed, earliest first.
    fn sweep(&mut self, now: u64, limit: usize) -> Result<usize, redb::Error> {
        let due: Vec<ScopedKey> = self
            .index
            .expiry
            .range(..(now.saturating_add(1), 0))
            .take(limit)
            .map(|(_, key)| *key)
            .collect();
        for key in &due {
            self.remove(*key)?;
            self.expired += 1;
        }
        Ok(due.len())
    }
}

fn marker_expiry(req: &ClaimRequest, now: u64) -> u64 {
    now + millis(req.marker_ttl())
}
