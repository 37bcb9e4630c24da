//! Which completed record a full shard gives up (docs/behaviour.md §25): one whose ttl
//! has passed if there is one (it costs nothing), else the oldest record of the scope
//! that arrived last, the one whose oldest record is the youngest. All of that scope's
//! records are younger than the oldest record of every other scope, so a client minting
//! scopes (a new made-up `Authorization` or cookie per request) evicts its own records
//! before it touches a scope that was there before it.
//!
//! Kept exactly, with no stale entries: every change is a few B-tree operations,
//! O(log n), and choosing is O(log n) too; no claim scans the records.

use std::collections::{BTreeMap, BTreeSet};

use crate::idempotency::{ScopeId, ScopedKey};

/// A scope as the order groups records by: the records claimed without one (a store
/// whose caller does not say) form one group of their own.
type Group = Option<[u8; 16]>;

fn group(scope: Option<&ScopeId>) -> Group {
    scope.map(|scope| *scope.as_bytes())
}

/// The record a full shard gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Victim {
    pub(crate) key: ScopedKey,
    /// Its ttl had passed: dropping it evicts nothing live.
    pub(crate) expired: bool,
    /// Its place in the completion order, and its scope.
    pub(crate) seq: u64,
    pub(crate) scope: Option<ScopeId>,
}

/// The completed records of one shard, in the orders eviction chooses by.
#[derive(Debug, Default)]
pub(crate) struct EvictionOrder {
    /// Every completed record, by scope, then completion order (`seq`, unique within
    /// the shard): its key and expiry.
    by_scope: BTreeMap<(Group, u64), (ScopedKey, u64)>,
    /// Every scope that holds a completed record, by the `seq` of its oldest one.
    arrivals: BTreeSet<(u64, Group)>,
    /// Every completed record by expiry: `(expires_ms, seq)` -> its scope.
    by_expiry: BTreeMap<(u64, u64), Group>,
}

impl EvictionOrder {
    /// Completed records held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_scope.len()
    }

    /// A completed record of `scope` is now under `key`, `seq` in the completion order.
    pub(crate) fn insert(
        &mut self,
        key: ScopedKey,
        seq: u64,
        scope: Option<&ScopeId>,
        expires_ms: u64,
    ) {
        let group = group(scope);
        let oldest = self.oldest(group);
        self.by_scope.insert((group, seq), (key, expires_ms));
        self.by_expiry.insert((expires_ms, seq), group);
        match oldest {
            // Records arrive in completion order: the scope's oldest stays its oldest.
            Some(oldest) if oldest < seq => {}
            Some(oldest) => {
                self.arrivals.remove(&(oldest, group));
                self.arrivals.insert((seq, group));
            }
            None => {
                self.arrivals.insert((seq, group));
            }
        }
    }

    /// The completed record `seq` of `scope` is gone.
    pub(crate) fn remove(&mut self, seq: u64, scope: Option<&ScopeId>) {
        let group = group(scope);
        let Some((_, expires_ms)) = self.by_scope.remove(&(group, seq)) else {
            return;
        };
        self.by_expiry.remove(&(expires_ms, seq));
        // The scope's oldest went: it now arrived with its next one, if any.
        if self.arrivals.remove(&(seq, group))
            && let Some(next) = self.oldest(group)
        {
            self.arrivals.insert((next, group));
        }
    }

    /// The record to give up when the shard is full at `now`, if any is held.
    pub(crate) fn victim(&self, now: u64) -> Option<Victim> {
        if let Some((&(expires_ms, seq), group)) = self.by_expiry.first_key_value()
            && expires_ms <= now
        {
            return self.victim_at(*group, seq, true);
        }
        let &(seq, group) = self.arrivals.last()?;
        self.victim_at(group, seq, false)
    }

    fn victim_at(&self, group: Group, seq: u64, expired: bool) -> Option<Victim> {
        let (key, _) = self.by_scope.get(&(group, seq))?;
        Some(Victim {
            key: *key,
            expired,
            seq,
            scope: group.map(ScopeId::from_bytes),
        })
    }

    pub(crate) fn clear(&mut self) {
        self.by_scope.clear();
        self.arrivals.clear();
        self.by_expiry.clear();
    }

    /// The `seq` of `group`'s oldest record.
    fn oldest(&self, group: Group) -> Option<u64> {
        self.by_scope
            .range((group, 0)..=(group, u64::MAX))
            .next()
            .map(|(&(_, seq), _)| seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> ScopedKey {
        ScopedKey::from_bytes([n; 32])
    }

    fn scope(n: u8) -> ScopeId {
        ScopeId::from_bytes([n; 16])
    }

    /// Puts record `n` (key `n`, `seq` `n`, expiring at 1000 + `n`) in scope `s`.
    fn insert(order: &mut EvictionOrder, n: u8, s: u8) {
        order.insert(key(n), u64::from(n), Some(&scope(s)), 1000 + u64::from(n));
    }

    fn remove(order: &mut EvictionOrder, n: u8, s: u8) {
        order.remove(u64::from(n), Some(&scope(s)));
    }

    fn victim(order: &EvictionOrder, now: u64) -> Option<(u8, bool)> {
        order.victim(now).map(|v| (v.key.as_bytes()[0], v.expired))
    }

    #[test]
    fn the_scope_that_arrived_last_gives_up_its_oldest_record() {
        let mut order = EvictionOrder::default();
        assert_eq!(victim(&order, 0), None);
        // Scope 0 was there first; scope 1 came after it and interleaves with it.
        for (n, s) in [(0, 0), (1, 0), (2, 1), (3, 0), (4, 1)] {
            insert(&mut order, n, s);
        }
        assert_eq!(victim(&order, 0), Some((2, false)), "scope 1's oldest");
        // Scopes minted one per record: the latest one goes, never scope 0 or 1.
        insert(&mut order, 5, 2);
        insert(&mut order, 6, 3);
        assert_eq!(victim(&order, 0), Some((6, false)));
        remove(&mut order, 6, 3);
        assert_eq!(victim(&order, 0), Some((5, false)));
        remove(&mut order, 5, 2);
        // Scope 1 loses its oldest and arrives with its next; it is still the latest.
        remove(&mut order, 2, 1);
        assert_eq!(victim(&order, 0), Some((4, false)));
        remove(&mut order, 4, 1);
        // One scope left: oldest first, as without scopes.
        assert_eq!(victim(&order, 0), Some((0, false)));
        assert_eq!(order.len(), 3);
    }

    #[test]
    fn a_scope_whose_oldest_record_went_arrives_anew() {
        let mut order = EvictionOrder::default();
        for (n, s) in [(0, 0), (1, 1), (2, 0), (3, 2)] {
            insert(&mut order, n, s);
        }
        assert_eq!(victim(&order, 0), Some((3, false)));
        // Scope 0's oldest is gone (purged, replaced): its next is younger than scope
        // 1's oldest, so scope 0 is now the later arrival of the two.
        remove(&mut order, 0, 0);
        remove(&mut order, 3, 2);
        assert_eq!(victim(&order, 0), Some((2, false)));
        // Removing what is not held changes nothing.
        remove(&mut order, 0, 0);
        remove(&mut order, 7, 1);
        assert_eq!(victim(&order, 0), Some((2, false)));
    }

    #[test]
    fn a_record_whose_ttl_passed_goes_before_any_live_one() {
        let mut order = EvictionOrder::default();
        for (n, s) in [(0, 0), (1, 1), (2, 2)] {
            insert(&mut order, n, s);
        }
        // Record 0 expires at 1000: before then the latest scope gives up its own.
        assert_eq!(victim(&order, 999), Some((2, false)));
        assert_eq!(victim(&order, 1000), Some((0, true)));
        assert_eq!(
            victim(&order, 1001),
            Some((0, true)),
            "the earliest expiry first"
        );
    }

    #[test]
    fn records_without_a_scope_are_one_scope() {
        let mut order = EvictionOrder::default();
        let unscoped = |order: &mut EvictionOrder, n: u8| {
            order.insert(key(n), u64::from(n), None, 5000);
        };
        unscoped(&mut order, 0);
        insert(&mut order, 1, 0);
        unscoped(&mut order, 2);
        assert_eq!(victim(&order, 0), Some((1, false)));
        remove(&mut order, 1, 0);
        assert_eq!(victim(&order, 0), Some((0, false)));
        order.clear();
        assert_eq!((order.len(), victim(&order, 0)), (0, None));
    }
}
