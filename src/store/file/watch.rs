//! Waiters on the file store: the shared registry of `store/waiters.rs` behind a lock of
//! its own. The writer wakes a key's waiters once the commit that changed the key is on
//! disk.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::idempotency::ScopedKey;
use crate::store::{KeyWatch, Registry, WaiterMap};

/// Every key someone waits on in the file store, shared by the store, its writer and
/// the watch handles.
#[derive(Debug, Default, Clone)]
pub struct FileWaiters(Arc<Mutex<WaiterMap>>);

impl FileWaiters {
    fn lock(&self) -> MutexGuard<'_, WaiterMap> {
        // Every mutation is one insert, update or remove: a panic leaves nothing half-done.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes everyone watching `key`.
    pub(super) fn wake(&self, key: &ScopedKey) {
        self.lock().wake(key);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Registry for FileWaiters {
    fn with_map<T>(&self, _key: &ScopedKey, f: impl FnOnce(&mut WaiterMap) -> T) -> T {
        f(&mut self.lock())
    }
}

/// A registered wake-up for one key of the file store.
pub type FileWatch = KeyWatch<FileWaiters>;
