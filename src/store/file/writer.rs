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
use tokio::sync::oneshot;

use super::disk::{self, COMPLETED, EXPIRY, Head, RECORDS};
use super::watch::Watchers;
use super::{FileMetrics, unavailable};
use crate::idempotency::{Completed, OwnerToken, Record, ScopedKey};
use crate::store::{Claim, ClaimRequest, Fenced, Lease, StoreError, millis};

/// At most this many operations share one commit.
const MAX_BATCH: usize = 4096;
/// Expired entries removed along with each commit, besides the timer's sweeps.
const SWEEP_PER_COMMIT: usize = 256;
/// Expired entries removed by one timed sweep.
pub(super) const SWEEP_PER_TICK: usize = 8192;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One queued operation, with the caller's clock reading and where to answer.
#[derive(Debug)]
pub(super) enum Op {
    Claim {
        req: ClaimRequest,
        now: u64,
        reply: Reply<Claim>,
    },
    Complete {
        key: ScopedKey,
        token: OwnerToken,
        record: Arc<Completed>,
        ttl: Duration,
        now: u64,
        reply: Reply<Fenced>,
    },
    Release {
        key: ScopedKey,
        token: OwnerToken,
        now: u64,
        reply: Reply<Fenced>,
    },
    Renew {
        key: ScopedKey,
        token: OwnerToken,
        lease_for: Duration,
        now: u64,
        reply: Reply<Fenced>,
    },
    TakeOver {
        stale: OwnerToken,
        req: ClaimRequest,
        now: u64,
        reply: Reply<Option<Lease>>,
    },
    /// Removes entries whose ttl has passed (the background expiry).
    Sweep { now: u64 },
}

impl Op {
    fn now(&self) -> u64 {
        match self {
            Op::Claim { now, .. }
            | Op::Complete { now, .. }
            | Op::Release { now, .. }
            | Op::Renew { now, .. }
            | Op::TakeOver { now, .. }
            | Op::Sweep { now } => *now,
        }
    }
}

/// An answer decided inside the transaction, sent once it is committed.
enum Answer {
    Claim(Reply<Claim>, Result<Claim, StoreError>),
    Fenced(Reply<Fenced>, Fenced),
    TakeOver(Reply<Option<Lease>>, Option<Lease>),
    Failed(Reply<Fenced>, StoreError),
    None,
}

impl Answer {
    fn send(self) {
        // A caller that gave up (its deadline passed) no longer listens: nothing to do.
        match self {
            Answer::Claim(reply, result) => drop(reply.send(result)),
            Answer::Fenced(reply, fenced) => drop(reply.send(Ok(fenced))),
            Answer::TakeOver(reply, lease) => drop(reply.send(Ok(lease))),
            Answer::Failed(reply, err) => drop(reply.send(Err(err))),
            Answer::None => {}
        }
    }

    fn fail(self, why: &str) {
        let err = || unavailable(why.to_owned());
        match self {
            Answer::Claim(reply, _) => drop(reply.send(Err(err()))),
            Answer::Fenced(reply, _) | Answer::Failed(reply, _) => drop(reply.send(Err(err()))),
            Answer::TakeOver(reply, _) => drop(reply.send(Err(err()))),
            Answer::None => {}
        }
    }
}

/// The writer's own view of the store's size, kept with every commit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counts {
    pub(super) entries: u64,
    pub(super) bytes: u64,
    pub(super) next_seq: u64,
}

pub(super) struct Writer {
    pub(super) db: Arc<Database>,
    pub(super) max_entries: u64,
    pub(super) counts: Counts,
    pub(super) metrics: FileMetrics,
    pub(super) watchers: Arc<Watchers>,
    pub(super) file: std::path::PathBuf,
    /// Cleared when the writer stops, so that `/readyz` reports it.
    pub(super) alive: Arc<AtomicBool>,
}

/// The open tables of one transaction, and what it changed.
struct Tx<'t> {
    records: Table<'t, &'static [u8], &'static [u8]>,
    expiry: Table<'t, &'static [u8], ()>,
    completed: Table<'t, u64, &'static [u8]>,
    counts: Counts,
    changed: Vec<ScopedKey>,
    /// Whether anything was written: a transaction that wrote nothing is not committed.
    wrote: bool,
    evicted: u64,
    expired: u64,
}

impl Writer {
    /// Serves batches until every sender is gone.
    pub(super) fn run(mut self, ops: &Receiver<Op>) {
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
        self.alive.store(false, Ordering::Relaxed);
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
        let mut answers = Vec::with_capacity(batch.len());
        match self.transact(batch, now, sweep_limit, &mut answers) {
            Ok(Some(done)) => {
                self.counts = done.counts;
                self.metrics.evictions.inc_by(done.evicted);
                self.metrics.expired.inc_by(done.expired);
                self.metrics
                    .observe_commit(started.elapsed(), self.counts, &self.file);
                for key in &done.changed {
                    self.watchers.wake(key);
                }
                for answer in answers {
                    answer.send();
                }
            }
            // Nothing was written: nothing to flush, the answers stand as they are.
            Ok(None) => {
                for answer in answers {
                    answer.send();
                }
            }
            Err(err) => {
                tracing::error!(error = %err, file = %self.file.display(), "file store: commit failed");
                let why = format!("the file store could not commit: {err}");
                for answer in answers {
                    answer.fail(&why);
                }
                // The operations not reached drop their reply: their callers see the
                // writer's answer missing, which is the same error.
            }
        }
    }

    /// Applies `batch` in one transaction and commits it if it wrote anything.
    fn transact(
        &self,
        batch: Vec<Op>,
        now: u64,
        sweep_limit: usize,
        answers: &mut Vec<Answer>,
    ) -> Result<Option<Done>, redb::Error> {
        let txn = self.db.begin_write()?;
        let done = {
            let mut tx = Tx {
                records: txn.open_table(RECORDS)?,
                expiry: txn.open_table(EXPIRY)?,
                completed: txn.open_table(COMPLETED)?,
                counts: self.counts,
                changed: Vec::new(),
                wrote: false,
                evicted: 0,
                expired: 0,
            };
            for op in batch {
                answers.push(tx.apply(op, self.max_entries)?);
            }
            tx.sweep(now, sweep_limit)?;
            tx.wrote.then_some(Done {
                counts: tx.counts,
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
                txn.commit()?;
                Ok(Some(done))
            }
        }
    }
}

/// What a committed transaction changed.
struct Done {
    counts: Counts,
    changed: Vec<ScopedKey>,
    evicted: u64,
    expired: u64,
}

fn bad_record(err: crate::idempotency::record::DecodeError) -> StoreError {
    StoreError::Corrupt(err)
}

impl Tx<'_> {
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
                let fenced = match self.owned(key, token, now)? {
                    Some((head, _)) => {
                        self.remove(key, head)?;
                        Fenced::Done
                    }
                    None => Fenced::LeaseLost,
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
                    Some((head, mut marker)) => {
                        let deadline = now + millis(lease_for);
                        marker.lease_deadline_ms = deadline;
                        let renewed = Head {
                            expires_ms: head.expires_ms.max(deadline),
                            seq: 0,
                        };
                        self.put(key, renewed, &marker.encode(), Some(head))?;
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
                    Some((head, marker)) if marker.lease_deadline_ms <= now => {
                        self.put(
                            req.key,
                            marker_head(&req, now),
                            &req.marker(now).encode(),
                            Some(head),
                        )?;
                        self.changed.push(req.key);
                        Some(Lease {
                            key: req.key,
                            token: req.token,
                        })
                    }
                    _ => None,
                };
                Answer::TakeOver(reply, lease)
            }
            Op::Sweep { .. } => Answer::None,
        })
    }

    fn claim(
        &mut self,
        req: &ClaimRequest,
        now: u64,
        max_entries: u64,
    ) -> Result<Result<Claim, StoreError>, redb::Error> {
        if let Some((head, value)) = self.get(req.key)? {
            if head.expires_ms > now {
                return Ok(disk::record(&value)
                    .map(|record| Claim::Existing {
                        record,
                        now_ms: now,
                    })
                    .map_err(bad_record));
            }
            // Expired: its waiters are woken and find the new marker.
            self.remove(req.key, head)?;
        }
        if let Err(full) = self.make_room(max_entries, now)? {
            return Ok(Err(full));
        }
        self.put(
            req.key,
            marker_head(req, now),
            &req.marker(now).encode(),
            None,
        )?;
        Ok(Ok(Claim::Acquired(Lease {
            key: req.key,
            token: req.token,
        })))
    }

    fn complete(
        &mut self,
        key: ScopedKey,
        token: OwnerToken,
        record: &Completed,
        ttl: Duration,
        now: u64,
    ) -> Result<Result<Fenced, StoreError>, redb::Error> {
        match self.owned(key, token, now)? {
            Some((head, _)) => {
                let seq = self.counts.next_seq;
                self.counts.next_seq += 1;
                let done = Head {
                    expires_ms: now + millis(ttl),
                    seq,
                };
                self.put(key, done, &record.encode(), Some(head))?;
                self.changed.push(key);
                Ok(Ok(Fenced::Done))
            }
            None => {
                // Repeating a completion that already landed is done, as on every store.
                let Some((head, value)) = self.get(key)? else {
                    return Ok(Ok(Fenced::LeaseLost));
                };
                if head.expires_ms <= now || head.seq == 0 {
                    return Ok(Ok(Fenced::LeaseLost));
                }
                Ok(match disk::record(&value) {
                    Ok(Record::Completed(stored)) if *stored == *record => Ok(Fenced::Done),
                    Ok(_) => Ok(Fenced::LeaseLost),
                    Err(err) => Err(bad_record(err)),
                })
            }
        }
    }

    fn get(&self, key: ScopedKey) -> Result<Option<(Head, Vec<u8>)>, redb::Error> {
        let Some(value) = self.records.get(key.as_bytes().as_slice())? else {
            return Ok(None);
        };
        let value = value.value().to_vec();
        match disk::head(&value) {
            Ok(head) => Ok(Some((head, value))),
            // A value too short to have a head: as good as expired, it is replaced.
            Err(_) => Ok(Some((
                Head {
                    expires_ms: 0,
                    seq: 0,
                },
                value,
            ))),
        }
    }

    /// The live marker under `key`, if it holds `token`.
    fn owned(
        &self,
        key: ScopedKey,
        token: OwnerToken,
        now: u64,
    ) -> Result<Option<(Head, crate::idempotency::InFlight)>, redb::Error> {
        let Some((head, value)) = self.get(key)? else {
            return Ok(None);
        };
        if head.expires_ms <= now {
            return Ok(None);
        }
        Ok(match disk::record(&value) {
            Ok(Record::InFlight(marker)) if marker.token == token => Some((head, marker)),
            _ => None,
        })
    }

    /// Writes `record` under `key`, replacing what `old` describes.
    fn put(
        &mut self,
        key: ScopedKey,
        head: Head,
        record: &[u8],
        old: Option<Head>,
    ) -> Result<(), redb::Error> {
        let k = key.as_bytes().as_slice();
        if let Some(old) = old {
            self.expiry
                .remove(disk::expiry_key(old.expires_ms, k).as_slice())?;
            if old.seq != 0 {
                self.completed.remove(old.seq)?;
            }
        }
        self.wrote = true;
        let value = disk::encode(head, record);
        let replaced = self.records.insert(k, value.as_slice())?;
        match replaced {
            Some(previous) => self.counts.bytes -= previous.value().len() as u64,
            None => self.counts.entries += 1,
        }
        self.counts.bytes += value.len() as u64;
        self.expiry
            .insert(disk::expiry_key(head.expires_ms, k).as_slice(), ())?;
        if head.seq != 0 {
            self.completed.insert(head.seq, k)?;
        }
        Ok(())
    }

    /// Removes what is under `key` (described by `head`), waking its waiters.
    fn remove(&mut self, key: ScopedKey, head: Head) -> Result<(), redb::Error> {
        let k = key.as_bytes().as_slice();
        self.wrote = true;
        if let Some(value) = self.records.remove(k)? {
            self.counts.entries -= 1;
            self.counts.bytes -= value.value().len() as u64;
        }
        self.expiry
            .remove(disk::expiry_key(head.expires_ms, k).as_slice())?;
        if head.seq != 0 {
            self.completed.remove(head.seq)?;
        }
        self.changed.push(key);
        Ok(())
    }

    /// Makes room for one more entry: evicts completed records oldest first, then drops
    /// markers whose ttl has passed; `Full` when only live markers are left.
    fn make_room(
        &mut self,
        max_entries: u64,
        now: u64,
    ) -> Result<Result<(), StoreError>, redb::Error> {
        while self.counts.entries >= max_entries {
            let oldest = self.completed.first()?.map(|(_, key)| key.value().to_vec());
            if let Some(key) = oldest {
                let key = scoped(&key);
                match self.get(key)? {
                    Some((head, _)) => {
                        self.evicted += u64::from(head.expires_ms > now);
                        self.remove(key, head)?;
                    }
                    // An order entry without its record: drop it and look again.
                    None => {
                        self.wrote = true;
                        self.completed.pop_first()?;
                    }
                }
                continue;
            }
            if self.sweep(now, 1)? == 0 {
                return Ok(Err(StoreError::Full));
            }
        }
        Ok(Ok(()))
    }

    /// Removes up to `limit` entries whose ttl has passed, oldest first.
    fn sweep(&mut self, now: u64, limit: usize) -> Result<usize, redb::Error> {
        let end = disk::expiry_key(now.saturating_add(1), &[]);
        let due: Vec<Vec<u8>> = self
            .expiry
            .range(..end.as_slice())?
            .take(limit)
            .map(|row| row.map(|(key, _)| key.value().to_vec()))
            .collect::<Result<_, _>>()?;
        for entry in &due {
            let key = scoped(&entry[8..]);
            match self.get(key)? {
                Some((head, _)) if head.expires_ms <= now => {
                    self.remove(key, head)?;
                    self.expired += 1;
                }
                // A stale index entry (the record moved on): just drop it.
                _ => {
                    self.wrote = true;
                    self.expiry.remove(entry.as_slice())?;
                }
            }
        }
        Ok(due.len())
    }
}

fn marker_head(req: &ClaimRequest, now: u64) -> Head {
    Head {
        expires_ms: now + millis(req.marker_ttl()),
        seq: 0,
    }
}

/// A key as stored; anything but 32 bytes maps to a key no request can have.
fn scoped(bytes: &[u8]) -> ScopedKey {
    let mut key = [0u8; 32];
    let n = bytes.len().min(32);
    key[..n].copy_from_slice(&bytes[..n]);
    ScopedKey::from_bytes(key)
}
