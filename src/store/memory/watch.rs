//! Waiters on the memory store: one [`Notify`] per watched key, kept in the key's shard
//! for exactly as long as a watch handle on the key exists.

use std::collections::hash_map::Entry;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::{Inner, lock, shard_of};
use crate::idempotency::ScopedKey;
use crate::store::Watch;

/// The waiters of one key. The entry goes with the last [`MemoryWatch`] on the key, so
/// the map is bounded by the live waiters, not by the keys ever waited on.
#[derive(Debug)]
pub(super) struct Waiters {
    notify: Arc<Notify>,
    handles: usize,
}

impl Waiters {
    pub(super) fn wake(&self) {
        self.notify.notify_waiters();
    }
}

/// Adds a waiter on `key`; its wake-up is armed before it is returned, so a change
/// before the first poll still wakes it.
pub(super) fn register(shards: &Arc<[Mutex<Inner>]>, key: ScopedKey) -> MemoryWatch {
    let notify = {
        let mut inner = lock(shard_of(shards, &key));
        let waiters = inner.watchers.entry(key).or_insert_with(|| Waiters {
            notify: Arc::new(Notify::new()),
            handles: 0,
        });
        waiters.handles += 1;
        Arc::clone(&waiters.notify)
    };
    // Counted from here on: dropping it undoes the registration.
    let mut watch = MemoryWatch {
        notified: Box::pin(notify.notified_owned()),
        shards: Arc::clone(shards),
        key,
    };
    watch.notified.as_mut().enable();
    watch
}

/// A registered wake-up for one key of the memory store. Dropping the last one of a key
/// removes the key's watcher entry.
pub struct MemoryWatch {
    notified: Pin<Box<OwnedNotified>>,
    shards: Arc<[Mutex<Inner>]>,
    key: ScopedKey,
}

impl std::fmt::Debug for MemoryWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWatch")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Watch for MemoryWatch {
    async fn changed(mut self) {
        (&mut self.notified).await;
    }
}

impl Drop for MemoryWatch {
    /// Leaves the key's waiters; the last one out removes the entry.
    fn drop(&mut self) {
        let mut inner = lock(shard_of(&self.shards, &self.key));
        if let Entry::Occupied(mut waiters) = inner.watchers.entry(self.key) {
            waiters.get_mut().handles -= 1;
            if waiters.get().handles == 0 {
                waiters.remove();
            }
        }
    }
}
