//! The rules of the file store, applied to one write transaction: is the key free,
//! is this still the owner's marker, is the store full, what has expired. The writer
//! (`writer.rs`) runs every batch through them; the in-memory index changes with the
//! transaction's log table.

use std::time::Duration;

use redb::{ReadableTable, Table};

use super::disk::{self, Head};
use super::index::{Index, Loc};
use super::op::{Answer, Op};
use crate::idempotency::{Completed, InFlight, OwnerToken, Record, ScopedKey};
use crate::store::{Claim, ClaimRequest, Fenced, Purged, StoreError, millis};

/// The log table of one transaction, the index it keeps up to date, and what changed.
pub(super) struct Tx<'t, 'i> {
    log: Table<'t, u64, &'static [u8]>,
    index: &'i mut Index,
    /// Keys whose version changed: published to readers after the commit.
    pub(super) touched: Vec<ScopedKey>,
    /// Keys whose waiters are woken after the commit.
    pub(super) changed: Vec<ScopedKey>,
    pub(super) evicted: u64,
    pub(super) expired: u64,
    written: &'i mut u64,
    claimed: &'i mut Vec<(ScopedKey, OwnerToken)>,
}

impl<'t, 'i> Tx<'t, 'i> {
    pub(super) fn new(
        log: Table<'t, u64, &'static [u8]>,
        index: &'i mut Index,
        written: &'i mut u64,
        claimed: &'i mut Vec<(ScopedKey, OwnerToken)>,
    ) -> Self {
        Self {
            log,
            index,
            touched: Vec::new(),
            changed: Vec::new(),
            evicted: 0,
            expired: 0,
            written,
            claimed,
        }
    }

    pub(super) fn apply(&mut self, op: Op, max_entries: u64) -> Result<Answer, redb::Error> {
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
    /// `force` (the admin API's purge).
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
    pub(super) fn owned(
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
    pub(super) fn remove(&mut self, key: ScopedKey) -> Result<(), redb::Error> {
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
    pub(super) fn sweep(&mut self, now: u64, limit: usize) -> Result<usize, redb::Error> {
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
