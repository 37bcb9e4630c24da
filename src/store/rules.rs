//! The per-key rules of the embedded stores, written once (docs/behaviour.md §5–§8,
//! §12): a claim takes a free or expired key, a completion lands only for the owner of
//! a live marker (fencing), a take-over only once the lease is over, a purge spares a
//! live lease unless forced; completed records live for their ttl and, when the store
//! is full, are evicted fairly between scopes (`eviction.rs`, docs/behaviour.md §25);
//! markers never are (evicting one would let a duplicate execute), and a store holding
//! only live markers refuses with `Full`.
//!
//! [`Index`] is one shard of records in memory with these rules as methods. The memory
//! store is shards of it; the file store is the same shards whose every change is also
//! appended to a journal. What a rule changes is told to an [`Effects`]: the key's new
//! state or its removal (what the file store journals, answering with a ticket that the
//! caller waits on before it answers), and the keys whose waiters to wake.

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::api::{
    Claim, ClaimRequest, Fenced, Inspection, Lease, Purged, Replaced, StateFilter, StoreError,
    millis,
};
use crate::idempotency::record::IN_FLIGHT_LEN;
use crate::idempotency::{Completed, OwnerToken, Record, ScopeId, ScopedKey};
use eviction::EvictionOrder;

mod eviction;

/// Why a live completed record was evicted before its ttl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// `store.max_entries` was reached.
    Full,
    /// Its scope held `store.max_entries_per_scope` records (docs/behaviour.md §17).
    ScopeQuota,
}

/// What a rule changed, for the store to make durable and to wake waiters by.
pub(crate) trait Effects {
    /// `key` now holds `record` until `expires_ms`, in `scope`. Returns the ticket of the
    /// change: whoever answers from this state waits until that ticket is durable.
    fn put(
        &mut self,
        key: &ScopedKey,
        record: &Record,
        expires_ms: u64,
        scope: Option<&ScopeId>,
    ) -> u64;
    /// `key` holds nothing any more (released, purged, expired, evicted).
    fn remove(&mut self, key: &ScopedKey) -> u64;
    /// The answer given depends on the state written under `ticket`.
    fn saw(&mut self, ticket: u64);
    /// Wakes whoever waits for `key`'s marker to change.
    fn changed(&mut self, key: &ScopedKey);
    /// A live completed record was evicted to make room.
    fn evicted(&mut self, _why: Eviction) {}
    /// A completed record of `scope` is now under `key`: its place in the scope's
    /// eviction order (`store.max_entries_per_scope`), or `None` without a quota.
    fn joined(&mut self, _scope: &ScopeId, _key: &ScopedKey) -> Option<u64> {
        None
    }
    /// The completed record that had `place` in `scope`'s order is gone.
    fn left(&mut self, _scope: &ScopeId, _place: u64) {}
}

/// One key's state.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) record: Record,
    pub(crate) expires_ms: u64,
    /// Position in the completion order; only completed records have one.
    seq: Option<u64>,
    /// The ticket of the change that wrote this state.
    ticket: u64,
    /// The scope of the request that claimed the key (docs/behaviour.md §17).
    pub(crate) scope: Option<ScopeId>,
    /// A completed record's place in its scope's order, when a quota is kept.
    place: Option<u64>,
}

/// One shard of records and the rules that change them.
#[derive(Debug)]
pub(crate) struct Index {
    map: HashMap<ScopedKey, Slot>,
    /// Completed records by completion order: what compaction writes, so that a reopened
    /// store knows the order again. Entries of records removed since are left in place
    /// and skipped (their `seq` no longer matches), so every operation on it is O(1).
    order: VecDeque<(u64, ScopedKey)>,
    /// Which completed record goes when the shard is full.
    eviction: EvictionOrder,
    next_seq: u64,
    /// Approximate bytes held by the records (bodies, headers, markers).
    bytes: u64,
    /// No in-flight marker here expires before this: a lower bound, exact after a scan.
    /// A shard full of live markers then refuses a claim without scanning.
    markers_expire_from: u64,
    /// No entry here expires before this: a lower bound, exact after a scan.
    expire_from: u64,
    /// The ticket of the latest removal: an answer that finds a key absent depends on it.
    removed: u64,
    /// Scans for expired entries, for the tests.
    #[cfg(test)]
    pub(crate) scans: usize,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            eviction: EvictionOrder::default(),
            next_seq: 0,
            bytes: 0,
            markers_expire_from: u64::MAX,
            expire_from: u64::MAX,
            removed: 0,
            #[cfg(test)]
            scans: 0,
        }
    }
}

/// What a record costs, roughly: its payload, not the map's own overhead.
pub(crate) fn size(record: &Record) -> u64 {
    match record {
        Record::InFlight(_) => IN_FLIGHT_LEN as u64,
        Record::Completed(c) => (c.payload_len() + IN_FLIGHT_LEN) as u64,
    }
}

impl Index {
    /// Entries held, expired ones not yet dropped included.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Approximate bytes of the records held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether something here may have expired by `now`.
    pub(crate) fn may_have_expired(&self, now: u64) -> bool {
        self.expire_from <= now
    }

    /// Every unexpired entry, completed records in completion order after the markers:
    /// what the file store's compaction writes, replayed in this order on open.
    pub(crate) fn live(&self, now: u64) -> impl Iterator<Item = (&ScopedKey, &Slot)> {
        let markers = self
            .map
            .iter()
            .filter(move |(_, slot)| slot.seq.is_none() && slot.expires_ms > now);
        let completed = self.order.iter().filter_map(move |(seq, key)| {
            let slot = self.map.get(key)?;
            (slot.seq == Some(*seq) && slot.expires_ms > now).then_some((key, slot))
        });
        markers.chain(completed)
    }

    /// Puts `record` under `key` as read back from disk: no rules, and no effects but
    /// the scope's bookkeeping.
    pub(crate) fn load(
        &mut self,
        key: ScopedKey,
        record: Record,
        expires_ms: u64,
        scope: Option<ScopeId>,
        fx: &mut impl Effects,
    ) {
        self.insert(key, record, expires_ms, 0, scope, fx);
    }

    /// Removes `key` as read back from disk.
    pub(crate) fn unload(&mut self, key: &ScopedKey, fx: &mut impl Effects) {
        if let Some(old) = self.map.remove(key) {
            self.forget(&old, fx);
        }
    }

    /// Empties the shard, before it is loaded again from disk.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
        self.eviction.clear();
        self.bytes = 0;
        self.markers_expire_from = u64::MAX;
        self.expire_from = u64::MAX;
        // What is loaded next is on disk: nothing waits on an earlier removal.
        self.removed = 0;
    }

    pub(crate) fn claim(
        &mut self,
        req: &ClaimRequest,
        now: u64,
        max_entries: usize,
        fx: &mut impl Effects,
    ) -> Result<Claim, StoreError> {
        match self.map.get(&req.key) {
            Some(slot) if slot.expires_ms > now => {
                fx.saw(slot.ticket);
                return Ok(Claim::Existing {
                    record: slot.record.clone(),
                    now_ms: now,
                });
            }
            // Expired: its waiters are woken and find the new marker.
            Some(_) => {
                self.remove(&req.key, fx);
            }
            None => {}
        }
        self.make_room(max_entries, now, fx)?;
        self.put(
            req.key,
            Record::InFlight(req.marker(now)),
            now + millis(req.marker_ttl()),
            req.scope,
            fx,
        );
        Ok(Claim::Acquired(req.lease(now)))
    }

    /// Stores `record` for the owner of `lease`. `compact` is the record as kept (in
    /// allocations of its own, not slices of the read buffers it was received in).
    pub(crate) fn complete(
        &mut self,
        lease: &Lease,
        record: &Arc<Completed>,
        compact: Arc<Completed>,
        ttl: Duration,
        now: u64,
        fx: &mut impl Effects,
    ) -> Fenced {
        let Some(marker) = self.owned(&lease.key, lease.token, now) else {
            // Repeating a completion that already landed is done, as on every store.
            return match self.map.get(&lease.key) {
                Some(Slot {
                    record: Record::Completed(c),
                    expires_ms,
                    ticket,
                    ..
                }) if *expires_ms > now && (Arc::ptr_eq(c, record) || **c == **record) => {
                    fx.saw(*ticket);
                    Fenced::Done
                }
                _ => Fenced::LeaseLost,
            };
        };
        let scope = marker.scope;
        self.put(
            lease.key,
            Record::Completed(compact),
            now + millis(ttl),
            scope,
            fx,
        );
        fx.changed(&lease.key);
        Fenced::Done
    }

    pub(crate) fn release(&mut self, lease: &Lease, now: u64, fx: &mut impl Effects) -> Fenced {
        if self.owned(&lease.key, lease.token, now).is_none() {
            return Fenced::LeaseLost;
        }
        // Wakes the waiters: the key is free for their retry.
        self.remove(&lease.key, fx);
        Fenced::Done
    }

    pub(crate) fn renew(
        &mut self,
        lease: &Lease,
        lease_for: Duration,
        now: u64,
        fx: &mut impl Effects,
    ) -> Fenced {
        let Some(slot) = self.owned(&lease.key, lease.token, now) else {
            return Fenced::LeaseLost;
        };
        let deadline = now + millis(lease_for);
        if let Record::InFlight(m) = &mut slot.record {
            m.lease_deadline_ms = deadline;
        }
        slot.expires_ms = slot.expires_ms.max(deadline);
        slot.ticket = fx.put(
            &lease.key,
            &slot.record,
            slot.expires_ms,
            slot.scope.as_ref(),
        );
        fx.saw(slot.ticket);
        Fenced::Done
    }

    pub(crate) fn take_over(
        &mut self,
        stale: OwnerToken,
        req: &ClaimRequest,
        now: u64,
        fx: &mut impl Effects,
    ) -> Option<Lease> {
        // The lease must still be over: a late renewal by a live owner wins.
        let slot = self.owned(&req.key, stale, now)?;
        if matches!(&slot.record, Record::InFlight(m) if m.lease_deadline_ms > now) {
            fx.saw(slot.ticket);
            return None;
        }
        self.put(
            req.key,
            Record::InFlight(req.marker(now)),
            now + millis(req.marker_ttl()),
            req.scope,
            fx,
        );
        fx.changed(&req.key);
        Some(req.lease(now))
    }

    pub(crate) fn inspect(
        &self,
        key: &ScopedKey,
        now: u64,
        fx: &mut impl Effects,
    ) -> Option<Inspection> {
        let Some(slot) = self.map.get(key).filter(|slot| slot.expires_ms > now) else {
            fx.saw(self.removed);
            return None;
        };
        fx.saw(slot.ticket);
        Some(Inspection {
            record: slot.record.clone(),
            expires_at_ms: slot.expires_ms,
            now_ms: now,
        })
    }

    /// The unexpired records in `state` whose keys come after `after`: the `limit`
    /// smallest such keys, in key order (docs/behaviour.md §24). One pass over the
    /// shard with a heap of `limit` keys, so a listing holds the lock for a bounded
    /// time and copies one page.
    pub(crate) fn page(
        &self,
        state: StateFilter,
        after: Option<&ScopedKey>,
        limit: usize,
        now: u64,
    ) -> Vec<(ScopedKey, Inspection)> {
        let mut heap = BinaryHeap::with_capacity(limit.saturating_add(1).min(4096));
        for (key, slot) in &self.map {
            if slot.expires_ms <= now
                || after.is_some_and(|after| key <= after)
                || !state.matches(&slot.record)
            {
                continue;
            }
            if heap.len() < limit {
                heap.push(*key);
            } else if heap.peek().is_some_and(|largest| key < largest) {
                heap.pop();
                heap.push(*key);
            }
        }
        heap.into_sorted_vec()
            .into_iter()
            .filter_map(|key| {
                let slot = self.map.get(&key)?;
                let found = Inspection {
                    record: slot.record.clone(),
                    expires_at_ms: slot.expires_ms,
                    now_ms: now,
                };
                Some((key, found))
            })
            .collect()
    }

    /// Removes what is under `key` unless it is a marker with a live lease and not
    /// `force` (the admin API's purge, docs/behaviour.md §13).
    pub(crate) fn purge(
        &mut self,
        key: &ScopedKey,
        force: bool,
        now: u64,
        fx: &mut impl Effects,
    ) -> Purged {
        let Some(slot) = self.map.get(key).filter(|slot| slot.expires_ms > now) else {
            fx.saw(self.removed);
            return Purged::Absent;
        };
        if !force && matches!(&slot.record, Record::InFlight(m) if m.lease_deadline_ms > now) {
            fx.saw(slot.ticket);
            return Purged::LiveLease;
        }
        let record = slot.record.clone();
        // Wakes the waiters: the key is free for their retry.
        self.remove(key, fx);
        Purged::Removed(record)
    }

    /// Replaces the live record under `key` with `new` (or removes it), keeping its
    /// expiry and scope, only if it is still `expected` (docs/behaviour.md §18).
    pub(crate) fn replace(
        &mut self,
        key: &ScopedKey,
        expected: &Record,
        new: Option<Arc<Completed>>,
        now: u64,
        fx: &mut impl Effects,
    ) -> Replaced {
        let Some(slot) = self.map.get(key).filter(|slot| slot.expires_ms > now) else {
            fx.saw(self.removed);
            return Replaced::Absent;
        };
        if slot.record != *expected {
            fx.saw(slot.ticket);
            return Replaced::Changed;
        }
        match new {
            Some(record) => {
                let (expires_ms, scope) = (slot.expires_ms, slot.scope);
                self.put(*key, Record::Completed(record), expires_ms, scope, fx);
            }
            None => {
                self.remove(key, fx);
            }
        }
        Replaced::Done
    }

    /// Drops every entry whose ttl has passed, waking its waiters, and learns when the
    /// earliest remaining one expires. Returns how many were dropped.
    pub(crate) fn sweep(&mut self, now: u64, fx: &mut impl Effects) -> u64 {
        #[cfg(test)]
        {
            self.scans += 1;
        }
        let mut freed = 0;
        let mut markers_from = u64::MAX;
        let mut from = u64::MAX;
        let mut gone = Vec::new();
        self.map.retain(|key, slot| {
            if slot.expires_ms > now {
                if matches!(slot.record, Record::InFlight(_)) {
                    markers_from = markers_from.min(slot.expires_ms);
                }
                from = from.min(slot.expires_ms);
                return true;
            }
            freed += size(&slot.record);
            gone.push((*key, slot.seq, slot.scope, slot.place));
            false
        });
        self.bytes -= freed;
        self.markers_expire_from = markers_from;
        self.expire_from = from;
        for (key, seq, scope, place) in &gone {
            if let Some(seq) = seq {
                self.eviction.remove(*seq, scope.as_ref());
            }
            if let (Some(scope), Some(place)) = (scope, place) {
                fx.left(scope, *place);
            }
            self.removed = fx.remove(key);
            fx.changed(key);
        }
        gone.len() as u64
    }

    /// The live marker under `key`, if it holds `token`.
    fn owned(&mut self, key: &ScopedKey, token: OwnerToken, now: u64) -> Option<&mut Slot> {
        let slot = self.map.get_mut(key)?;
        let mine = matches!(&slot.record, Record::InFlight(m) if m.token == token)
            && slot.expires_ms > now;
        mine.then_some(slot)
    }

    /// Makes room for one more entry: drops a completed record whose ttl has passed,
    /// else evicts one fairly between scopes (`eviction.rs`, docs/behaviour.md §25); with
    /// no completed record left, drops markers whose ttl has passed.
    fn make_room(
        &mut self,
        max_entries: usize,
        now: u64,
        fx: &mut impl Effects,
    ) -> Result<(), StoreError> {
        while self.map.len() >= max_entries {
            if let Some(victim) = self.eviction.victim(now) {
                if !victim.expired {
                    fx.evicted(Eviction::Full);
                }
                // The order holds exactly the map's completed records: the removal takes
                // the victim out of it too, so the loop moves on. Were it ever not held,
                // it leaves the order all the same: a loop under the lock never spins.
                if !self.remove(&victim.key, fx) {
                    debug_assert!(false, "an evicted record was not held");
                    self.eviction.remove(victim.seq, victim.scope.as_ref());
                }
                continue;
            }
            // The order holds no completed record: only markers are left. Until the
            // earliest of them expires, a scan would find nothing to drop.
            if now < self.markers_expire_from {
                return Err(StoreError::Full);
            }
            if self.sweep(now, fx) == 0 {
                return Err(StoreError::Full);
            }
        }
        Ok(())
    }

    /// Evicts the record that had `place` in its scope's order, if `key` still holds it:
    /// its scope is over `store.max_entries_per_scope` (docs/behaviour.md §17).
    pub(crate) fn evict_placed(
        &mut self,
        key: &ScopedKey,
        place: u64,
        now: u64,
        fx: &mut impl Effects,
    ) {
        let Some(slot) = self.map.get(key) else {
            return;
        };
        if slot.place != Some(place) {
            return;
        }
        if slot.expires_ms > now {
            fx.evicted(Eviction::ScopeQuota);
        }
        self.remove(key, fx);
    }

    /// Writes `key`'s new state through `fx`.
    fn put(
        &mut self,
        key: ScopedKey,
        record: Record,
        expires_ms: u64,
        scope: Option<ScopeId>,
        fx: &mut impl Effects,
    ) {
        let ticket = fx.put(&key, &record, expires_ms, scope.as_ref());
        fx.saw(ticket);
        self.insert(key, record, expires_ms, ticket, scope, fx);
    }

    fn insert(
        &mut self,
        key: ScopedKey,
        record: Record,
        expires_ms: u64,
        ticket: u64,
        scope: Option<ScopeId>,
        fx: &mut impl Effects,
    ) {
        let completed = matches!(record, Record::Completed(_));
        let place = scope
            .as_ref()
            .filter(|_| completed)
            .and_then(|scope| fx.joined(scope, &key));
        let seq = completed.then(|| {
            let seq = self.next_seq;
            self.next_seq += 1;
            seq
        });
        if seq.is_none() {
            self.markers_expire_from = self.markers_expire_from.min(expires_ms);
        }
        self.expire_from = self.expire_from.min(expires_ms);
        self.bytes += size(&record);
        let slot = Slot {
            record,
            expires_ms,
            seq,
            ticket,
            scope,
            place,
        };
        // One lookup: what the key held before is replaced in place (a marker by its
        // record), not removed and inserted again (BENCHMARKS.md, issue 29).
        if let Some(old) = self.map.insert(key, slot) {
            self.forget(&old, fx);
        }
        // Queued once the map holds it: compacting the queue keeps only the entries
        // whose key holds that very `seq`. The old record left the eviction order above.
        if let Some(seq) = seq {
            self.eviction.insert(key, seq, scope.as_ref(), expires_ms);
            self.enqueue(seq, key);
        }
    }

    fn forget(&mut self, old: &Slot, fx: &mut impl Effects) {
        self.bytes -= size(&old.record);
        if let Some(seq) = old.seq {
            self.eviction.remove(seq, old.scope.as_ref());
        }
        if let (Some(scope), Some(place)) = (&old.scope, old.place) {
            fx.left(scope, place);
        }
    }

    /// Removes what is under `key`, waking its waiters (an expiry, an eviction); false
    /// when nothing was.
    fn remove(&mut self, key: &ScopedKey, fx: &mut impl Effects) -> bool {
        let Some(old) = self.map.remove(key) else {
            return false;
        };
        self.forget(&old, fx);
        self.removed = fx.remove(key);
        fx.saw(self.removed);
        fx.changed(key);
        true
    }

    /// Queues a completed record in completion order; drops stale queue entries when
    /// they outnumber the live ones, so the queue stays proportional to the map.
    fn enqueue(&mut self, seq: u64, key: ScopedKey) {
        self.order.push_back((seq, key));
        if self.order.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.order
                .retain(|(seq, key)| map.get(key).is_some_and(|s| s.seq == Some(*seq)));
        }
    }
}
