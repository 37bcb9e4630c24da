//! The writer's in-memory index of the log table: where each key's current version is,
//! when each entry expires, and the completion order. Rebuilt from the table by one
//! scan when the store opens (and after a failed commit); never written to disk, so a
//! commit touches the log's newest and oldest pages only.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use redb::{ReadableDatabase, ReadableTable};

use super::disk::{self, LOG};
use crate::idempotency::ScopedKey;
use crate::idempotency::record::KIND_COMPLETED;

/// Where a key's current version is in the log, and what it is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loc {
    pub(super) id: u64,
    pub(super) expires_ms: u64,
    pub(super) completed: bool,
    pub(super) len: u64,
}

#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) keys: HashMap<ScopedKey, Loc>,
    /// Every entry by expiry, for the sweep.
    pub(super) expiry: BTreeMap<(u64, u64), ScopedKey>,
    /// Completed records by id, which is completion order: the eviction queue.
    pub(super) completed: BTreeMap<u64, ScopedKey>,
    /// Bytes of the values held.
    pub(super) bytes: u64,
    /// The id the next write gets; ids are never reused.
    pub(super) next_id: u64,
}

impl Index {
    /// Reads the whole log.
    pub(super) fn load(db: &impl ReadableDatabase) -> Result<Index, redb::Error> {
        let txn = db.begin_read()?;
        let log = txn.open_table(LOG)?;
        let mut index = Index {
            next_id: 1,
            ..Index::default()
        };
        for row in log.iter()? {
            let (id, value) = row?;
            let (id, value) = (id.value(), value.value());
            index.next_id = index.next_id.max(id + 1);
            // A row too short to read is dropped at the next write of its key or by
            // nobody: it is not indexed, so it is never served.
            let Ok(head) = disk::head(value) else {
                continue;
            };
            let completed = disk::record_bytes(value).get(1) == Some(&KIND_COMPLETED);
            index.insert(
                head.key,
                Loc {
                    id,
                    expires_ms: head.expires_ms,
                    completed,
                    len: value.len() as u64,
                },
            );
        }
        Ok(index)
    }

    pub(super) fn insert(&mut self, key: ScopedKey, loc: Loc) {
        if let Some(old) = self.keys.insert(key, loc) {
            self.forget(&old);
        }
        self.expiry.insert((loc.expires_ms, loc.id), key);
        if loc.completed {
            self.completed.insert(loc.id, key);
        }
        self.bytes += loc.len;
    }

    pub(super) fn remove(&mut self, key: &ScopedKey) -> Option<Loc> {
        let old = self.keys.remove(key)?;
        self.forget(&old);
        Some(old)
    }

    fn forget(&mut self, old: &Loc) {
        self.expiry.remove(&(old.expires_ms, old.id));
        if old.completed {
            self.completed.remove(&old.id);
        }
        self.bytes -= old.len;
    }

    /// When the earliest entry expires (`u64::MAX`: nothing held).
    pub(super) fn first_expiry(&self) -> u64 {
        self.expiry.keys().next().map_or(u64::MAX, |(at, _)| *at)
    }
}

/// What readers see: each key's committed version, published after every commit.
#[derive(Debug, Default)]
pub(super) struct Published {
    ids: RwLock<HashMap<ScopedKey, u64>>,
    /// The earliest expiry, for the background sweep.
    next_expiry: AtomicU64,
}

impl Published {
    pub(super) fn from(index: &Index) -> Self {
        Self {
            ids: RwLock::new(index.keys.iter().map(|(k, loc)| (*k, loc.id)).collect()),
            next_expiry: AtomicU64::new(index.first_expiry()),
        }
    }

    /// The log id of `key`'s committed version.
    pub(super) fn id(&self, key: &ScopedKey) -> Option<u64> {
        // A panic cannot leave the map half-updated: each update is one insert or remove.
        let ids = self.ids.read().unwrap_or_else(PoisonError::into_inner);
        ids.get(key).copied()
    }

    /// Publishes the committed state of `keys`.
    pub(super) fn update(&self, index: &Index, keys: &[ScopedKey]) {
        if !keys.is_empty() {
            let mut ids = self.ids.write().unwrap_or_else(PoisonError::into_inner);
            for key in keys {
                match index.keys.get(key) {
                    Some(loc) => ids.insert(*key, loc.id),
                    None => ids.remove(key),
                };
            }
        }
        self.next_expiry
            .store(index.first_expiry(), Ordering::Relaxed);
    }

    /// Publishes everything again (after a failed commit reloaded the index).
    pub(super) fn reset(&self, index: &Index) {
        let mut ids = self.ids.write().unwrap_or_else(PoisonError::into_inner);
        *ids = index.keys.iter().map(|(k, loc)| (*k, loc.id)).collect();
        self.next_expiry
            .store(index.first_expiry(), Ordering::Relaxed);
    }

    pub(super) fn next_expiry(&self) -> u64 {
        self.next_expiry.load(Ordering::Relaxed)
    }
}
