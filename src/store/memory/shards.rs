//! The shards of an embedded store and what they share: each one a lock over the per-key
//! rules' index and the requests waiting on its keys. A rule runs on a locked shard and
//! tells its effects to an [`Fx`]: changes to the store's [`Durability`], wake-ups to
//! the shard's waiters, scopes' records to the quotas; the gauges follow on unlock.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Durability;
use crate::idempotency::{Record, ScopeId, ScopedKey};
use crate::store::api::{Fenced, Lease};
use crate::store::clock::Clock;
use crate::store::quota::Quotas;
use crate::store::rules::{Effects, Eviction, Index};
use crate::store::waiters::{KeyWatch, Registry as Waiters, WaiterMap};

/// One shard: its records and the requests waiting (`on_concurrent: wait`) for one of
/// its keys to change, under one lock.
#[derive(Debug, Default)]
pub(super) struct Inner {
    pub(super) index: Index,
    pub(super) watchers: WaiterMap,
}

/// The shards and what they share across shards (the scopes' order, the metrics). A
/// handle: its clones share all of it, so that the file store's writer thread, which
/// sweeps the shards and loads them again from disk, holds one.
#[derive(Debug, Clone)]
pub(crate) struct Core<C: Clock> {
    /// Keys are spread over shards by their hash, so that requests for different keys
    /// rarely wait on one lock, and a table rehash stalls one shard only. Shared with the
    /// watch handles, which leave their shard's watcher map when dropped.
    pub(super) shards: Arc<[Mutex<Inner>]>,
    /// The bound of each shard: together never more than `max_entries`.
    pub(super) shard_entries: usize,
    pub(super) clock: C,
    /// `store.max_entries_per_scope`: each scope's completed records, across shards.
    pub(super) quotas: Option<Arc<Quotas>>,
    /// Live completed records evicted early: `[full, scope_quota]`.
    pub(super) evictions: [Counter; 2],
    evictions_family: Family<ReasonLabel, Counter>,
    pub(super) entries: Gauge,
    pub(super) stored_bytes: Gauge,
}

impl<C: Clock> Core<C> {
    /// Shards for `max_entries` in all, with at most `per_scope` completed records per
    /// scope when given.
    pub(crate) fn new(max_entries: usize, clock: C, per_scope: Option<usize>) -> Self {
        let max_entries = max_entries.max(1);
        // A small store keeps one shard, so that eviction is exactly oldest-first over
        // the whole store; a large one evicts oldest-first within each shard.
        let shards = if max_entries >= SHARDS * 1024 {
            SHARDS
        } else {
            1
        };
        let evictions_family = Family::<ReasonLabel, Counter>::default();
        let evictions = ["full", "scope_quota"]
            .map(|reason| evictions_family.get_or_create_owned(&ReasonLabel { reason }));
        Self {
            shards: (0..shards).map(|_| Mutex::new(Inner::default())).collect(),
            shard_entries: max_entries / shards,
            clock,
            quotas: per_scope.map(|max| Arc::new(Quotas::new(max))),
            evictions,
            evictions_family,
            entries: Gauge::default(),
            stored_bytes: Gauge::default(),
        }
    }

    /// The shard holding `key`, locked; its size changes reach the gauges on release.
    fn shard(&self, key: &ScopedKey) -> Shard<'_> {
        Shard::new(
            lock(shard_of(&self.shards, key)),
            &self.entries,
            &self.stored_bytes,
        )
    }

    /// Runs a rule on `key`'s shard; returns its outcome and the ticket to settle.
    pub(super) fn apply<D: Durability, T>(
        &self,
        durability: &D,
        key: &ScopedKey,
        rule: impl FnOnce(&mut Index, &mut Fx<'_, D>) -> T,
    ) -> (T, u64) {
        let (out, ran) = self.run(durability, key, rule);
        if let Some(scope) = ran.joined {
            self.enforce_quota(durability, &scope);
        }
        (out, ran.ticket)
    }

    /// Runs a rule on `key`'s shard and counts its evictions.
    fn run<D: Durability, T>(
        &self,
        durability: &D,
        key: &ScopedKey,
        rule: impl FnOnce(&mut Index, &mut Fx<'_, D>) -> T,
    ) -> (T, Ran) {
        let (out, ran) = self
            .shard(key)
            .run(durability, self.quotas.as_deref(), rule);
        self.count(&ran);
        (out, ran)
    }

    fn count(&self, ran: &Ran) {
        for (counter, n) in self.evictions.iter().zip(ran.evicted) {
            if n > 0 {
                counter.inc_by(n);
            }
        }
    }

    /// Evicts `scope`'s oldest completed records while it holds more than its quota,
    /// with no other lock held: the scope's records are in any shard.
    fn enforce_quota<D: Durability>(&self, durability: &D, scope: &ScopeId) {
        let Some(quotas) = &self.quotas else {
            return;
        };
        while let Some((place, key)) = quotas.over(scope) {
            let now = self.clock.now_ms();
            self.run(durability, &key, |index, fx| {
                index.evict_placed(&key, place, now, fx);
            });
        }
    }

    /// Drops what has expired by `now` from every shard that may hold some, waking its
    /// waiters. Returns how many entries went.
    pub(crate) fn sweep<D: Durability>(&self, durability: &D, now: u64) -> u64 {
        let mut gone = 0;
        for shard in self.shards.iter() {
            let mut shard = Shard::new(lock(shard), &self.entries, &self.stored_bytes);
            if shard.inner.index.may_have_expired(now) {
                let quotas = self.quotas.as_deref();
                gone += shard
                    .run(durability, quotas, |index, fx| index.sweep(now, fx))
                    .0;
            }
        }
        gone
    }

    /// Keys someone waits on, over every shard.
    #[cfg(test)]
    pub(crate) fn watched(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).watchers.len())
            .sum()
    }

    /// Releases `lease` as of `now`, without waiting for the removal to be durable
    /// (the file store's writer, freeing the markers of claims that failed).
    pub(crate) fn release_at<D: Durability>(
        &self,
        durability: &D,
        lease: &Lease,
        now: u64,
    ) -> Fenced {
        self.apply(durability, &lease.key, |index, fx| {
            index.release(lease, now, fx)
        })
        .0
    }

    /// Calls `f` with every live entry. Each shard is locked only while its entries are
    /// copied (records are shared, not cloned), so that `f` can take its time: a key
    /// changed meanwhile is seen before or after the change, never half.
    pub(crate) fn for_each_live(
        &self,
        now: u64,
        mut f: impl FnMut(&ScopedKey, &Record, u64, Option<&ScopeId>),
    ) {
        let mut entries = Vec::new();
        for shard in self.shards.iter() {
            entries.clear();
            entries.extend(
                lock(shard)
                    .index
                    .live(now)
                    .map(|(key, slot)| (*key, slot.record.clone(), slot.expires_ms, slot.scope)),
            );
            for (key, record, expires_ms, scope) in &entries {
                f(key, record, *expires_ms, scope.as_ref());
            }
        }
    }

    /// Every shard locked at once, to be emptied and loaded again from disk.
    pub(crate) fn lock_all(&self) -> AllShards<'_> {
        AllShards {
            shards: self
                .shards
                .iter()
                .map(|shard| Shard::new(lock(shard), &self.entries, &self.stored_bytes))
                .collect(),
            quotas: self.quotas.as_deref(),
        }
    }

    /// The metrics of the shards; `kind` names the store in their help.
    pub(super) fn register_metrics(&self, registry: &mut Registry, kind: &str) {
        registry.register(
            "idemgate_store_evictions",
            format!(
                "Completed records of the {kind} store evicted before their ttl, by reason: full (store.max_entries reached), scope_quota (their scope held store.max_entries_per_scope)"
            ),
            self.evictions_family.clone(),
        );
        registry.register(
            "idemgate_store_entries",
            format!("Records and markers held by the {kind} store"),
            self.entries.clone(),
        );
        registry.register_with_unit(
            "idemgate_store",
            format!("Approximate bytes of records held by the {kind} store"),
            prometheus_client::registry::Unit::Bytes,
            self.stored_bytes.clone(),
        );
    }
}

/// Every shard of a store, locked; released (and the gauges moved) when dropped.
pub(crate) struct AllShards<'a> {
    shards: Vec<Shard<'a>>,
    quotas: Option<&'a Quotas>,
}

impl AllShards<'_> {
    fn index(&mut self, key: &ScopedKey) -> (&mut Index, Bookkeeping<'_>) {
        let at = usize::from(key.as_bytes()[0]) % self.shards.len();
        (&mut self.shards[at].inner.index, Bookkeeping(self.quotas))
    }

    /// Puts `record` under `key`, in `scope`, as read from disk.
    pub(crate) fn load(
        &mut self,
        key: ScopedKey,
        record: Record,
        expires_ms: u64,
        scope: Option<ScopeId>,
    ) {
        let (index, mut fx) = self.index(&key);
        index.load(key, record, expires_ms, scope, &mut fx);
    }

    /// Removes `key`, as read from disk.
    pub(crate) fn unload(&mut self, key: &ScopedKey) {
        let (index, mut fx) = self.index(key);
        index.unload(key, &mut fx);
    }

    /// Empties every shard and wakes every waiter: what they waited for may be gone.
    pub(crate) fn clear(&mut self) {
        for shard in &mut self.shards {
            shard.inner.index.clear();
            shard.inner.watchers.wake_all();
        }
        if let Some(quotas) = self.quotas {
            quotas.clear();
        }
    }
}

/// The effects of loading from disk: nothing is written or woken, only the scopes'
/// order is kept (`store.max_entries_per_scope`).
struct Bookkeeping<'a>(Option<&'a Quotas>);

impl Effects for Bookkeeping<'_> {
    fn put(&mut self, _: &ScopedKey, _: &Record, _: u64, _: Option<&ScopeId>) -> u64 {
        0
    }

    fn remove(&mut self, _: &ScopedKey) -> u64 {
        0
    }

    fn saw(&mut self, _: u64) {}

    fn changed(&mut self, _: &ScopedKey) {}

    fn joined(&mut self, scope: &ScopeId, key: &ScopedKey) -> Option<u64> {
        Some(self.0?.joined(scope, key))
    }

    fn left(&mut self, scope: &ScopeId, place: u64) {
        if let Some(quotas) = self.0 {
            quotas.left(scope, place);
        }
    }
}

/// What running a rule did besides its outcome.
#[derive(Debug, Default)]
struct Ran {
    /// The ticket to settle before answering.
    ticket: u64,
    /// Live records evicted: `[full, scope_quota]`.
    evicted: [u64; 2],
    /// A scope that gained a completed record, whose quota to check.
    joined: Option<ScopeId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The effects of a rule on a shard: changes go to the durability, wake-ups to the
/// shard's waiters, scopes' records to the quotas.
pub(super) struct Fx<'a, D> {
    durability: &'a D,
    watchers: &'a WaiterMap,
    quotas: Option<&'a Quotas>,
    ran: Ran,
}

impl<D: Durability> Effects for Fx<'_, D> {
    fn put(
        &mut self,
        key: &ScopedKey,
        record: &Record,
        expires_ms: u64,
        scope: Option<&ScopeId>,
    ) -> u64 {
        self.durability.put(key, record, expires_ms, scope)
    }

    fn remove(&mut self, key: &ScopedKey) -> u64 {
        self.durability.remove(key)
    }

    fn saw(&mut self, ticket: u64) {
        self.ran.ticket = self.ran.ticket.max(ticket);
    }

    fn changed(&mut self, key: &ScopedKey) {
        self.watchers.wake(key);
    }

    fn evicted(&mut self, why: Eviction) {
        self.ran.evicted[match why {
            Eviction::Full => 0,
            Eviction::ScopeQuota => 1,
        }] += 1;
    }

    fn joined(&mut self, scope: &ScopeId, key: &ScopedKey) -> Option<u64> {
        let place = self.quotas?.joined(scope, key);
        self.ran.joined = Some(*scope);
        Some(place)
    }

    fn left(&mut self, scope: &ScopeId, place: u64) {
        if let Some(quotas) = self.quotas {
            quotas.left(scope, place);
        }
    }
}

/// The shards of a memory store, as its watch handles hold them: a waiter's entry lives
/// in its key's shard, under the lock that guards the shard's records.
#[derive(Debug, Clone)]
pub struct MemoryShards(pub(super) Arc<[Mutex<Inner>]>);

impl Waiters for MemoryShards {
    fn with_map<T>(&self, key: &ScopedKey, f: impl FnOnce(&mut WaiterMap) -> T) -> T {
        f(&mut lock(shard_of(&self.0, key)).watchers)
    }
}

/// A registered wake-up for one key of an embedded store.
pub type MemoryWatch = KeyWatch<MemoryShards>;

/// How many shards a large store has.
const SHARDS: usize = 16;

/// The shard `key` belongs to. Keys are hashes already: their first byte is uniform.
fn shard_of<'a>(shards: &'a [Mutex<Inner>], key: &ScopedKey) -> &'a Mutex<Inner> {
    &shards[usize::from(key.as_bytes()[0]) % shards.len()]
}

pub(super) fn lock(shard: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave a half-written entry: every mutation
    // of the index is a single insert or remove.
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

impl<'a> Shard<'a> {
    fn new(inner: MutexGuard<'a, Inner>, entries: &'a Gauge, stored_bytes: &'a Gauge) -> Self {
        Self {
            len: inner.index.len(),
            bytes: inner.index.bytes(),
            inner,
            entries,
            stored_bytes,
        }
    }
}

impl Shard<'_> {
    /// Runs a rule on this shard; returns its outcome and what else it did.
    fn run<T, D: Durability>(
        &mut self,
        durability: &D,
        quotas: Option<&Quotas>,
        rule: impl FnOnce(&mut Index, &mut Fx<'_, D>) -> T,
    ) -> (T, Ran) {
        let Inner { index, watchers } = &mut *self.inner;
        let mut fx = Fx {
            durability,
            watchers,
            quotas,
            ran: Ran::default(),
        };
        let out = rule(index, &mut fx);
        (out, fx.ran)
    }
}

impl Drop for Shard<'_> {
    fn drop(&mut self) {
        let delta = |now: u64, before: u64| {
            i64::try_from(now).unwrap_or(i64::MAX) - i64::try_from(before).unwrap_or(i64::MAX)
        };
        let (len, bytes) = (self.inner.index.len(), self.inner.index.bytes());
        if len != self.len {
            self.entries.inc_by(delta(len as u64, self.len as u64));
        }
        if bytes != self.bytes {
            self.stored_bytes.inc_by(delta(bytes, self.bytes));
        }
    }
}
