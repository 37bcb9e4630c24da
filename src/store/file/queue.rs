//! The file store's durability: every change the rules make to a shard is encoded as a
//! journal entry under that shard's lock and queued here with a ticket. The writer
//! thread (`writer.rs`) appends everything queued with one write and, with `fsync`, one
//! flush (group commit), then settles the tickets; a caller answers only once the
//! ticket its answer depends on is settled.
//!
//! A write that fails takes every ticket not yet on disk with it: the writer loads the
//! shards again from the journal, and those tickets' callers get an error.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::journal::{self, Entry};
use super::unavailable;
use crate::idempotency::{Record, ScopeId, ScopedKey};
use crate::store::api::StoreError;
use crate::store::memory::Durability;

/// Failed ranges remembered; a ticket older than all of them that may have failed is
/// answered as failed (a refused request the client retries, never a lost one).
const FAILURES_KEPT: usize = 1024;

/// The changes waiting for the writer.
#[derive(Debug, Default)]
struct Pending {
    entries: Vec<u8>,
    /// The ticket of the newest change queued.
    last: u64,
    /// The writer sleeps and must be woken for the next change.
    writer_idle: bool,
    /// The time of a tick the writer is asked to run (expiry, compaction, a probe).
    tick: Option<u64>,
    closed: bool,
}

/// What callers wait on.
#[derive(Debug, Default)]
struct Settled {
    /// Every ticket up to here is on disk, except those in `failed`.
    durable: u64,
    /// Ranges of tickets whose write failed, oldest first.
    failed: VecDeque<(u64, u64)>,
    /// The writer has stopped: nothing queued will be settled any more.
    stopped: bool,
}

impl Settled {
    fn outcome(&self, ticket: u64) -> Option<Result<(), StoreError>> {
        let failed = self
            .failed
            .iter()
            .any(|(from, to)| (*from..=*to).contains(&ticket))
            || self.failed.front().is_some_and(|(from, _)| ticket < *from)
                && self.failed.len() == FAILURES_KEPT;
        if failed {
            return Some(Err(unavailable(
                "the file store could not write this change (disk full or an I/O error)".to_owned(),
            )));
        }
        if ticket <= self.durable {
            return Some(Ok(()));
        }
        self.stopped.then(|| {
            Err(unavailable(
                "the file store's writer has stopped".to_owned(),
            ))
        })
    }
}

/// Where a caller writes what is queued itself (`fsync: false`): the writer, when no
/// one else holds it.
pub(super) trait Seat: Send + Sync {
    /// Writes everything queued if the writer is free; false when it is not (someone
    /// else writes, and settles) or it has stopped.
    fn write_queued(&self) -> bool;
}

/// The queue between the shards and the writer.
pub struct Queue {
    /// With `fsync: false` a write costs a few µs: the caller waiting for it writes
    /// what is queued itself rather than waking the writer thread and waiting to be
    /// woken in turn. With `fsync: true` a flush would block a worker thread.
    inline: bool,
    seat: std::sync::OnceLock<std::sync::Weak<dyn Seat>>,
    pending: Mutex<Pending>,
    wake_writer: Condvar,
    /// `Settled::durable`, readable without a lock.
    durable: AtomicU64,
    /// The newest ticket of any failed write: below `durable` and above this, a ticket
    /// is settled without looking further.
    failed_up_to: AtomicU64,
    settled: watch::Sender<Settled>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("inline", &self.inline)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

/// What the writer takes from the queue at once.
#[derive(Debug, Default)]
pub(super) struct Work {
    /// Encoded entries, in ticket order.
    pub(super) entries: Vec<u8>,
    /// The ticket of the last of them.
    pub(super) last: u64,
}

impl Queue {
    /// A queue whose first ticket follows `durable` (what is already on disk); its
    /// callers write themselves when `inline`.
    pub(super) fn new(durable: u64, inline: bool) -> Arc<Self> {
        Arc::new(Self {
            inline,
            seat: std::sync::OnceLock::new(),
            pending: Mutex::new(Pending {
                last: durable,
                ..Pending::default()
            }),
            wake_writer: Condvar::new(),
            durable: AtomicU64::new(durable),
            failed_up_to: AtomicU64::new(0),
            settled: watch::Sender::new(Settled {
                durable,
                ..Settled::default()
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Every mutation completes an entry before the lock is let go.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, encode: impl FnOnce(&mut Vec<u8>)) -> u64 {
        let mut pending = self.lock();
        encode(&mut pending.entries);
        pending.last += 1;
        if pending.writer_idle && !self.inline {
            pending.writer_idle = false;
            self.wake_writer.notify_one();
        }
        pending.last
    }

    /// The writer callers write through, when `inline`.
    pub(super) fn seat(&self, seat: std::sync::Weak<dyn Seat>) {
        let _ = self.seat.set(seat);
    }

    /// What is queued, if anything, without waiting. Called only by whoever holds the
    /// writer.
    pub(super) fn take(&self, mut spare: Vec<u8>) -> Option<Work> {
        let mut pending = self.lock();
        if pending.entries.is_empty() {
            return None;
        }
        spare.clear();
        let entries = std::mem::replace(&mut pending.entries, spare);
        Some(Work {
            entries,
            last: pending.last,
        })
    }

    /// Asks the writer to run a tick at `now`.
    pub(super) fn tick(&self, now: u64) {
        let mut pending = self.lock();
        pending.tick = Some(now);
        if pending.writer_idle {
            pending.writer_idle = false;
            self.wake_writer.notify_one();
        }
    }

    /// Stops the writer once it has written what is queued.
    pub(super) fn close(&self) {
        let mut pending = self.lock();
        pending.closed = true;
        self.wake_writer.notify_one();
    }

    /// Waits until the writer thread has something to do: queued entries (unless the
    /// callers write them, `inline`), or a tick. Returns the tick's time, if one was
    /// asked for; `None` once the queue is closed. Takes no entries: whoever writes
    /// takes them while it holds the writer, so that batches reach the journal in
    /// ticket order.
    pub(super) fn wait_for_work(&self) -> Option<Option<u64>> {
        let mut pending = self.lock();
        loop {
            let tick = pending.tick.take();
            if tick.is_some() || !self.inline && !pending.entries.is_empty() {
                return Some(tick);
            }
            if pending.closed {
                return None;
            }
            pending.writer_idle = true;
            pending = self
                .wake_writer
                .wait(pending)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Tickets up to `last` are on disk.
    pub(super) fn settle(&self, last: u64) {
        self.durable.fetch_max(last, Ordering::Release);
        self.settled
            .send_modify(|s| s.durable = s.durable.max(last));
    }

    /// Every ticket after the durable ones failed: the queued entries are dropped (the
    /// caller loads the shards again from disk while it holds their locks). Returns the
    /// dropped entries, so that the caller can tell which claims they held.
    pub(super) fn fail_all(&self) -> Vec<u8> {
        let mut pending = self.lock();
        let durable = self.durable.load(Ordering::Acquire);
        let last = pending.last;
        let dropped = std::mem::take(&mut pending.entries);
        drop(pending);
        self.failed_up_to.store(last, Ordering::Release);
        self.settled.send_modify(|s| {
            if s.failed.len() == FAILURES_KEPT {
                s.failed.pop_front();
            }
            s.failed.push_back((durable + 1, last));
        });
        dropped
    }

    /// Whoever held the writer has let it go: if entries are queued, the callers that
    /// found it held try again (they wait for a change of the settlements).
    pub(super) fn released(&self) {
        if self.inline && !self.lock().entries.is_empty() {
            self.settled.send_modify(|_| {});
        }
    }

    /// The writer has stopped; whoever still waits is answered.
    pub(super) fn stopped(&self) {
        self.settled.send_modify(|s| s.stopped = true);
    }

    async fn wait(&self, ticket: u64) -> Result<(), StoreError> {
        if ticket <= self.durable.load(Ordering::Acquire)
            && ticket > self.failed_up_to.load(Ordering::Acquire)
        {
            return Ok(());
        }
        loop {
            // Subscribed before the writer is tried: a settlement made by whoever holds
            // it from now on is seen below.
            let mut settled = self.settled.subscribe();
            if let Some(outcome) = settled.borrow_and_update().outcome(ticket) {
                return outcome;
            }
            let wrote = self.inline
                && self
                    .seat
                    .get()
                    .and_then(std::sync::Weak::upgrade)
                    .is_some_and(|seat| seat.write_queued());
            if !wrote && settled.changed().await.is_err() {
                return Err(unavailable(
                    "the file store's writer has stopped".to_owned(),
                ));
            }
        }
    }
}

/// The file store's [`Durability`]: changes go to the journal through the queue.
impl Durability for Queue {
    fn put(
        &self,
        key: &ScopedKey,
        record: &Record,
        expires_ms: u64,
        scope: Option<&ScopeId>,
    ) -> u64 {
        self.push(|buf| journal::encode_put(key, expires_ms, record, scope, buf))
    }

    fn remove(&self, key: &ScopedKey) -> u64 {
        self.push(|buf| journal::encode(&Entry::Remove { key: *key }, buf))
    }

    async fn settle(&self, ticket: u64) -> Result<(), StoreError> {
        if ticket == 0 {
            return Ok(());
        }
        self.wait(ticket).await
    }
}
