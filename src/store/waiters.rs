//! Waiters on the embedded stores (`on_concurrent: wait`), written once for both: one
//! [`Notify`] per watched key, kept for exactly as long as a watch handle on the key
//! exists, so the map is bounded by the live waiters, not by the keys ever waited on.
//!
//! Where the map lives is the store's choice ([`Registry`]): the memory store keeps one
//! in each shard, under the lock that also guards the shard's records, and the file
//! store one behind a lock of its own, woken by its writer once a commit is on disk.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use crate::idempotency::ScopedKey;
use crate::store::Watch;

/// The waiters of one key.
#[derive(Debug)]
struct Waiters {
    notify: Arc<Notify>,
    handles: usize,
}

/// Every key someone waits on, and who.
#[derive(Debug, Default)]
pub struct WaiterMap(HashMap<ScopedKey, Waiters>);

impl WaiterMap {
    /// Wakes everyone watching `key`; their entry goes with their last handle.
    pub(crate) fn wake(&self, key: &ScopedKey) {
        if let Some(waiters) = self.0.get(key) {
            waiters.notify.notify_waiters();
        }
    }

    /// Wakes everyone watching any key (the store was loaded again from disk).
    pub(crate) fn wake_all(&self) {
        for waiters in self.0.values() {
            waiters.notify.notify_waiters();
        }
    }

    /// How many keys are watched.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    fn join(&mut self, key: ScopedKey) -> Arc<Notify> {
        let waiters = self.0.entry(key).or_insert_with(|| Waiters {
            notify: Arc::new(Notify::new()),
            handles: 0,
        });
        waiters.handles += 1;
        Arc::clone(&waiters.notify)
    }

    fn leave(&mut self, key: ScopedKey) {
        if let Entry::Occupied(mut waiters) = self.0.entry(key) {
            waiters.get_mut().handles -= 1;
            if waiters.get().handles == 0 {
                waiters.remove();
            }
        }
    }
}

/// Where a store keeps the [`WaiterMap`] of a key, and under which lock: a handle,
/// cloned into every watch so that dropping it can leave the map.
pub trait Registry: Clone + Send + Sync + 'static {
    fn with_map<T>(&self, key: &ScopedKey, f: impl FnOnce(&mut WaiterMap) -> T) -> T;
}

/// A registered wake-up for one key. Dropping the last one of a key removes the key's
/// entry.
pub struct KeyWatch<R: Registry> {
    notified: Pin<Box<OwnedNotified>>,
    registry: R,
    key: ScopedKey,
}

impl<R: Registry> KeyWatch<R> {
    /// Adds a waiter on `key`; its wake-up is armed before it is returned, so a change
    /// before the first poll still wakes it.
    pub(crate) fn register(registry: &R, key: ScopedKey) -> Self {
        let notify = registry.with_map(&key, |map| map.join(key));
        // Counted from here on: dropping it undoes the registration.
        let mut watch = KeyWatch {
            notified: Box::pin(notify.notified_owned()),
            registry: registry.clone(),
            key,
        };
        watch.notified.as_mut().enable();
        watch
    }
}

impl<R: Registry> std::fmt::Debug for KeyWatch<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyWatch")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<R: Registry> Watch for KeyWatch<R> {
    async fn changed(mut self) {
        (&mut self.notified).await;
    }
}

impl<R: Registry> Drop for KeyWatch<R> {
    /// Leaves the key's waiters; the last one out removes the entry.
    fn drop(&mut self) {
        let key = self.key;
        self.registry.with_map(&key, |map| map.leave(key));
    }
}
