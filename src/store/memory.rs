//! The embedded store: one process, no Redis. Bounded by `max_entries`; completed
//! records expire after their ttl and are evicted oldest first when full; in-flight
//! markers are never evicted (evicting one would let a duplicate execute).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::clock::{Clock, TokioClock};
use super::waiters::{KeyWatch, Registry as Waiters, WaiterMap};
use super::{Claim, ClaimRequest, Fenced, Inspection, Lease, Purged, Store, StoreError, millis};
use crate::idempotency::record::IN_FLIGHT_LEN;
use crate::idempotency::{Completed, OwnerToken, Record, ScopedKey, StoredBody};

#[derive(Debug)]
struct Slot {
    record: Record,
    expires_ms: u64,
    /// Position in the completion order; only completed records have one.
    seq: Option<u64>,
}

#[derive(Debug)]
struct Inner {
    map: HashMap<ScopedKey, Slot>,
    /// Completed records by completion order: the eviction queue. Entries of records
    /// removed since are left in place and skipped when they come up (their `seq` no
    /// longer matches), so every operation on it is O(1).
    order: VecDeque<(u64, ScopedKey)>,
    next_seq: u64,
    /// Requests waiting (`on_concurrent: wait`) for a key's marker to change.
    watchers: WaiterMap,
    /// Approximate bytes held by the records (bodies, headers, markers).
    bytes: u64,
    /// No in-flight marker here expires before this: a lower bound, exact after a scan.
    /// A shard full of live markers then refuses a claim without scanning.
    markers_expire_from: u64,
    /// Scans for expired entries, for the tests.
    #[cfg(test)]
    scans: usize,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            next_seq: 0,
            watchers: WaiterMap::default(),
            bytes: 0,
            markers_expire_from: u64::MAX,
            #[cfg(test)]
            scans: 0,
        }
    }
}

/// What a slot costs, roughly: its payload, not the map's own overhead.
fn size(slot: &Slot) -> u64 {
    match &slot.record {
        Record::InFlight(_) => IN_FLIGHT_LEN as u64,
        Record::Completed(c) => {
            let body = match &c.body {
                StoredBody::Stored(b) => b.len(),
                StoredBody::TooLarge => 0,
            };
            let headers: usize = c
                .headers
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len())
                .sum();
            (body + headers + IN_FLIGHT_LEN) as u64
        }
    }
}

impl Inner {
    /// Wakes everyone watching `key`; their entry goes with their last handle.
    fn changed(&self, key: &ScopedKey) {
        self.watchers.wake(key);
    }

    /// Removes what is under `key`, waking its waiters (an expiry, an eviction).
    fn remove(&mut self, key: &ScopedKey) {
        if let Some(slot) = self.map.remove(key) {
            self.bytes -= size(&slot);
            self.changed(key);
        }
    }

    fn insert(&mut self, key: ScopedKey, slot: Slot) {
        if matches!(slot.record, Record::InFlight(_)) {
            self.markers_expire_from = self.markers_expire_from.min(slot.expires_ms);
        }
        self.bytes += size(&slot);
        if let Some(old) = self.map.insert(key, slot) {
            self.bytes -= size(&old);
        }
    }

    /// Queues a completed record for eviction; drops stale queue entries when they
    /// outnumber the live ones, so the queue stays proportional to the map.
    fn enqueue(&mut self, seq: u64, key: ScopedKey) {
        self.order.push_back((seq, key));
        if self.order.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.order
                .retain(|(seq, key)| map.get(key).is_some_and(|s| s.seq == Some(*seq)));
        }
    }

    /// The live marker under `key`, if it holds `token`.
    fn owned(&mut self, key: &ScopedKey, token: OwnerToken, now: u64) -> Option<&mut Slot> {
        let slot = self.map.get_mut(key)?;
        let mine = matches!(&slot.record, Record::InFlight(m) if m.token == token)
            && slot.expires_ms > now;
        mine.then_some(slot)
    }

    /// Makes room for one more entry: evicts completed records oldest first, then drops
    /// markers whose ttl has passed. Returns how many live records were evicted.
    fn make_room(&mut self, max_entries: usize, now: u64) -> Result<u64, StoreError> {
        let mut evicted = 0;
        while self.map.len() >= max_entries {
            if let Some((seq, key)) = self.order.pop_front() {
                if let Some(slot) = self.map.get(&key)
                    && slot.seq == Some(seq)
                {
                    evicted += u64::from(slot.expires_ms > now);
                    self.remove(&key);
                }
                continue;
            }
            // Every completed record is queued: only markers are left. Until the
            // earliest of them expires, a scan would find nothing to drop.
            if now < self.markers_expire_from {
                return Err(StoreError::Full);
            }
            let before = self.map.len();
            self.drop_expired(now);
            if self.map.len() == before {
                return Err(StoreError::Full);
            }
        }
        Ok(evicted)
    }

    /// Drops every entry whose ttl has passed, waking its waiters, and learns when the
    /// earliest remaining marker expires.
    fn drop_expired(&mut self, now: u64) {
        #[cfg(test)]
        {
            self.scans += 1;
        }
        let watchers = &self.watchers;
        let mut freed = 0;
        let mut earliest = u64::MAX;
        self.map.retain(|key, slot| {
            if slot.expires_ms > now {
                if matches!(slot.record, Record::InFlight(_)) {
                    earliest = earliest.min(slot.expires_ms);
                }
                return true;
            }
            freed += size(slot);
            watchers.wake(key);
            false
        });
        self.bytes -= freed;
        self.markers_expire_from = earliest;
    }
}

/// The in-process store.
#[derive(Debug)]
pub struct MemoryStore<C: Clock = TokioClock> {
    /// Keys are spread over shards by their hash, so that requests for different keys
    /// rarely wait on one lock, and a table rehash stalls one shard only. Shared with the
    /// watch handles, which leave their shard's watcher map when dropped.
    shards: Arc<[Mutex<Inner>]>,
    /// The bound of each shard: together never more than `max_entries`.
    shard_entries: usize,
    clock: C,
    /// Live completed records evicted early because the store was full.
    evictions: Counter,
    entries: Gauge,
    stored_bytes: Gauge,
}

impl MemoryStore<TokioClock> {
    pub fn new(max_entries: usize) -> Self {
        Self::with_clock(max_entries, TokioClock::default())
    }
}

impl<C: Clock> MemoryStore<C> {
    pub fn with_clock(max_entries: usize, clock: C) -> Self {
        let max_entries = max_entries.max(1);
        // A small store keeps one shard, so that eviction is exactly oldest-first over
        // the whole store; a large one evicts oldest-first within each shard.
        let shards = if max_entries >= SHARDS * 1024 {
            SHARDS
        } else {
            1
        };
        Self {
            shards: (0..shards).map(|_| Mutex::new(Inner::default())).collect(),
            shard_entries: max_entries / shards,
            clock,
            evictions: Counter::default(),
            entries: Gauge::default(),
            stored_bytes: Gauge::default(),
        }
    }

    /// Live records evicted early because the store was full.
    pub fn evictions(&self) -> u64 {
        self.evictions.get()
    }

    /// Entries held, expired ones not yet dropped included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).map.len()).sum()
    }

    /// Entries as `idemgate_store_entries` shows them.
    pub fn entries_gauge(&self) -> i64 {
        self.entries.get()
    }

    /// Approximate bytes of the records held (what `idemgate_store_bytes` shows).
    pub fn stored_bytes(&self) -> i64 {
        self.stored_bytes.get()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard holding `key`, locked; its size changes reach the gauges on release.
    fn shard(&self, key: &ScopedKey) -> Shard<'_> {
        let inner = lock(shard_of(&self.shards, key));
        Shard {
            len: inner.map.len(),
            bytes: inner.bytes,
            inner,
            entries: &self.entries,
            stored_bytes: &self.stored_bytes,
        }
    }

    fn marker(req: &ClaimRequest, now: u64) -> Slot {
        Slot {
            record: Record::InFlight(req.marker(now)),
            expires_ms: now + millis(req.marker_ttl()),
            seq: None,
        }
    }
}

/// The shards of a memory store, as its watch handles hold them: a waiter's entry lives
/// in its key's shard, under the lock that guards the shard's records.
#[derive(Debug, Clone)]
pub struct MemoryShards(Arc<[Mutex<Inner>]>);

impl Waiters for MemoryShards {
    fn with_map<T>(&self, key: &ScopedKey, f: impl FnOnce(&mut WaiterMap) -> T) -> T {
        f(&mut lock(shard_of(&self.0, key)).watchers)
    }
}

/// A registered wake-up for one key of the memory store.
pub type MemoryWatch = KeyWatch<MemoryShards>;

/// How many shards a large memory store has.
const SHARDS: usize = 16;

/// The shard `key` belongs to. Keys are hashes already: their first byte is uniform.
fn shard_of<'a>(shards: &'a [Mutex<Inner>], key: &ScopedKey) -> &'a Mutex<Inner> {
    &shards[usize::from(key.as_bytes()[0]) % shards.len()]
}

fn lock(shard: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave a half-written entry: every mutation
    // is a single insert or remove.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A locked shard. Dropping it moves the store's gauges by what changed meanwhile.
struct Shard<'a> {
    inner: MutexGuard<'a, Inner>,
    len: usize,
    bytes: u64,
    entries: &'a Gauge,
    stored_bytes: &'a Gauge,
}

impl std::ops::Deref for Shard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl std::ops::DerefMut for Shard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }
}

impl Drop for Shard<'_> {
    fn drop(&mut self) {
        let delta = |now: u64, before: u64| {
            i64::try_from(now).unwrap_or(i64::MAX) - i64::try_from(before).unwrap_or(i64::MAX)
        };
        if self.inner.map.len() != self.len {
            self.entries
                .inc_by(delta(self.inner.map.len() as u64, self.len as u64));
        }
        if self.inner.bytes != self.bytes {
            self.stored_bytes
                .inc_by(delta(self.inner.bytes, self.bytes));
        }
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    type Watch = MemoryWatch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let now = self.clock.now_ms();
        let mut inner = self.shard(&req.key);
        match inner.map.get(&req.key) {
            Some(slot) if slot.expires_ms > now => {
                return Ok(Claim::Existing {
                    record: slot.record.clone(),
                    now_ms: now,
                });
            }
            // Expired: its waiters are woken and find the new marker.
            Some(_) => inner.remove(&req.key),
            None => {}
        }
        let evicted = inner.make_room(self.shard_entries, now)?;
        self.evictions.inc_by(evicted);
        inner.insert(req.key, Self::marker(&req, now));
        Ok(Claim::Acquired(req.lease(now)))
    }

    async fn complete(
        &self,
        lease: &Lease,
        record: Arc<Completed>,
        ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        // Kept for hours: in allocations of its own, not slices of hyper's read buffers.
        // Copied before the lock is taken.
        let compact = Arc::new(record.compacted());
        let now = self.clock.now_ms();
        let mut guard = self.shard(&lease.key);
        let inner = &mut *guard;
        let seq = inner.next_seq;
        if inner.owned(&lease.key, lease.token, now).is_none() {
            // Repeating a completion that already landed is done, as on every store.
            let landed = matches!(inner.map.get(&lease.key), Some(Slot { record: Record::Completed(c), expires_ms, .. })
                if *expires_ms > now && (Arc::ptr_eq(c, &record) || **c == *record));
            return Ok(if landed {
                Fenced::Done
            } else {
                Fenced::LeaseLost
            });
        }
        inner.insert(
            lease.key,
            Slot {
                record: Record::Completed(compact),
                expires_ms: now + millis(ttl),
                seq: Some(seq),
            },
        );
        inner.next_seq += 1;
        inner.enqueue(seq, lease.key);
        inner.changed(&lease.key);
        Ok(Fenced::Done)
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        let now = self.clock.now_ms();
        let mut inner = self.shard(&lease.key);
        if inner.owned(&lease.key, lease.token, now).is_none() {
            return Ok(Fenced::LeaseLost);
        }
        // Wakes the waiters: the key is free for their retry.
        inner.remove(&lease.key);
        Ok(Fenced::Done)
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        let now = self.clock.now_ms();
        let mut inner = self.shard(&lease.key);
        let Some(slot) = inner.owned(&lease.key, lease.token, now) else {
            return Ok(Fenced::LeaseLost);
        };
        let deadline = now + millis(lease_for);
        if let Record::InFlight(m) = &mut slot.record {
            m.lease_deadline_ms = deadline;
        }
        slot.expires_ms = slot.expires_ms.max(deadline);
        Ok(Fenced::Done)
    }

    async fn take_over(
        &self,
        stale: OwnerToken,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        let now = self.clock.now_ms();
        let mut inner = self.shard(&req.key);
        // The lease must still be over: a late renewal by a live owner wins.
        let Some(slot) = inner.owned(&req.key, stale, now) else {
            return Ok(None);
        };
        if matches!(&slot.record, Record::InFlight(m) if m.lease_deadline_ms > now) {
            return Ok(None);
        }
        inner.insert(req.key, Self::marker(&req, now));
        inner.changed(&req.key);
        Ok(Some(req.lease(now)))
    }

    async fn watch(&self, key: ScopedKey) -> Result<MemoryWatch, StoreError> {
        Ok(KeyWatch::register(
            &MemoryShards(Arc::clone(&self.shards)),
            key,
        ))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn clock_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    async fn inspect(&self, key: ScopedKey) -> Result<Option<Inspection>, StoreError> {
        let now = self.clock.now_ms();
        let inner = self.shard(&key);
        Ok(inner
            .map
            .get(&key)
            .filter(|slot| slot.expires_ms > now)
            .map(|slot| Inspection {
                record: slot.record.clone(),
                expires_at_ms: slot.expires_ms,
                now_ms: now,
            }))
    }

    async fn purge(&self, key: ScopedKey, force: bool) -> Result<Purged, StoreError> {
        let now = self.clock.now_ms();
        let mut inner = self.shard(&key);
        let Some(slot) = inner.map.get(&key).filter(|slot| slot.expires_ms > now) else {
            return Ok(Purged::Absent);
        };
        if !force && matches!(&slot.record, Record::InFlight(m) if m.lease_deadline_ms > now) {
            return Ok(Purged::LiveLease);
        }
        let record = slot.record.clone();
        // Wakes the waiters: the key is free for their retry.
        inner.remove(&key);
        Ok(Purged::Removed(record))
    }

    fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "idemgate_store_evictions",
            "Completed records evicted before their ttl because the memory store was full",
            self.evictions.clone(),
        );
        registry.register(
            "idemgate_store_entries",
            "Records and markers held by the memory store",
            self.entries.clone(),
        );
        registry.register_with_unit(
            "idemgate_store",
            "Approximate bytes of records held by the memory store",
            prometheus_client::registry::Unit::Bytes,
            self.stored_bytes.clone(),
        );
    }
}

#[cfg(test)]
mod tests;
