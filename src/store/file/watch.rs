//! Waiters on the file store: one [`Notify`] per watched key, kept for exactly as long
//! as a watch handle on the key exists. The writer wakes a key's waiters once the
//! commit that changed the key is on disk.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use crate::idempotency::ScopedKey;
use crate::store::Watch;

#[derive(Debug)]
struct Waiters {
    notify: Arc<Notify>,
    handles: usize,
}

/// Every key someone waits on.
#[derive(Debug, Default)]
pub(super) struct Watchers(Mutex<HashMap<ScopedKey, Waiters>>);

impl Watchers {
    fn lock(&self) -> MutexGuard<'_, HashMap<ScopedKey, Waiters>> {
        // Every mutation is one insert, update or remove: a panic leaves nothing half-done.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes everyone watching `key`.
    pub(super) fn wake(&self, key: &ScopedKey) {
        if let Some(waiters) = self.lock().get(key) {
            waiters.notify.notify_waiters();
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Adds a waiter on `key`; its wake-up is armed before it is returned, so a change
/// before the first poll still wakes it.
pub(super) fn register(watchers: &Arc<Watchers>, key: ScopedKey) -> FileWatch {
    let notify = {
        let mut map = watchers.lock();
        let waiters = map.entry(key).or_insert_with(|| Waiters {
            notify: Arc::new(Notify::new()),
            handles: 0,
        });
        waiters.handles += 1;
        Arc::clone(&waiters.notify)
    };
    let mut watch = FileWatch {
        notified: Box::pin(notify.notified_owned()),
        watchers: Arc::clone(watchers),
        key,
    };
    watch.notified.as_mut().enable();
    watch
}

/// A registered wake-up for one key of the file store. Dropping the last one of a key
/// removes the key's entry.
pub struct FileWatch {
    notified: Pin<Box<OwnedNotified>>,
    watchers: Arc<Watchers>,
    key: ScopedKey,
}

impl std::fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatch")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Watch for FileWatch {
    async fn changed(mut self) {
        (&mut self.notified).await;
    }
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        let mut map = self.watchers.lock();
        if let Entry::Occupied(mut waiters) = map.entry(self.key) {
            waiters.get_mut().handles -= 1;
            if waiters.get().handles == 0 {
                waiters.remove();
            }
        }
    }
}
