//! `store.max_entries_per_scope` (docs/behaviour.md §17): one client that floods fresh
//! keys evicts its own oldest records, never another client's.
//!
//! A scope's records are spread over every shard (shards go by key), so the order of
//! each scope is kept here, across them: the completed records of each scope by the
//! order they were written. The shards tell it when a scope's record arrives or goes
//! (under their lock, which is taken before this one, never after), and the store asks
//! it, with no shard locked, which record a scope over its quota gives up.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::idempotency::{ScopeId, ScopedKey};

/// The completed records of every scope, in the order they were written.
#[derive(Debug)]
pub(crate) struct Quotas {
    max: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per scope: place -> key. A scope with no record left has no entry.
    scopes: HashMap<ScopeId, BTreeMap<u64, ScopedKey>>,
    next: u64,
}

impl Quotas {
    /// At most `max` completed records per scope.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every change below is one insert or remove: a panic cannot leave half of one.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A completed record of `scope` is now under `key`; returns its place.
    pub(crate) fn joined(&self, scope: &ScopeId, key: &ScopedKey) -> u64 {
        let mut inner = self.lock();
        let place = inner.next;
        inner.next += 1;
        inner.scopes.entry(*scope).or_default().insert(place, *key);
        place
    }

    /// The record that had `place` in `scope` is gone.
    pub(crate) fn left(&self, scope: &ScopeId, place: u64) {
        let mut inner = self.lock();
        if let Some(order) = inner.scopes.get_mut(scope) {
            order.remove(&place);
            if order.is_empty() {
                inner.scopes.remove(scope);
            }
        }
    }

    /// The oldest record of `scope` while it holds more than its quota, taken out of
    /// its order: the caller evicts it (if its key still holds that record).
    pub(crate) fn over(&self, scope: &ScopeId) -> Option<(u64, ScopedKey)> {
        let mut inner = self.lock();
        let order = inner.scopes.get_mut(scope)?;
        if order.len() <= self.max {
            return None;
        }
        order.pop_first()
    }

    /// Forgets every scope: the shards are emptied, to be loaded again.
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.scopes.clear();
    }

    /// Records `scope` holds, for the tests.
    #[cfg(test)]
    pub(crate) fn held(&self, scope: &ScopeId) -> usize {
        self.lock().scopes.get(scope).map_or(0, BTreeMap::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> ScopedKey {
        ScopedKey::from_bytes([n; 32])
    }

    #[test]
    fn a_scope_over_its_quota_gives_up_its_oldest_records_only() {
        let quotas = Quotas::new(2);
        let (a, b) = (ScopeId::from_bytes([1; 16]), ScopeId::from_bytes([2; 16]));
        let first = quotas.joined(&a, &key(1));
        quotas.joined(&b, &key(9));
        quotas.joined(&a, &key(2));
        assert_eq!(quotas.over(&a), None, "at its quota, not over it");
        quotas.joined(&a, &key(3));
        assert_eq!(quotas.over(&a), Some((first, key(1))));
        assert_eq!(quotas.over(&a), None);
        assert_eq!(quotas.over(&b), None);
        assert_eq!((quotas.held(&a), quotas.held(&b)), (2, 1));
    }

    #[test]
    fn records_that_go_otherwise_leave_the_order() {
        let quotas = Quotas::new(1);
        let a = ScopeId::from_bytes([1; 16]);
        let first = quotas.joined(&a, &key(1));
        quotas.left(&a, first);
        quotas.joined(&a, &key(2));
        assert_eq!(quotas.over(&a), None, "the expired one no longer counts");
        let second = quotas.joined(&a, &key(3));
        assert!(second > first);
        assert!(quotas.over(&a).is_some());
        quotas.clear();
        assert_eq!(quotas.held(&a), 0);
    }
}
