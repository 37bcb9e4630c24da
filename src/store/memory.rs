//! The embedded store: one process, no Redis. Shards of the per-key rules' index
//! (`rules.rs`), bounded by `max_entries`. On its own it is the memory store; with a
//! [`Durability`] that journals every change it is the file store's core (`file/`).

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::clock::{Clock, TokioClock};
use super::quota::Quotas;
use super::rules::{Effects, Eviction, Index};
use super::waiters::{KeyWatch, Registry as Waiters, WaiterMap};
use super::{Claim, ClaimRequest, Fenced, Inspection, Lease, Purged, Replaced, Store, StoreError};
use crate::idempotency::{Completed, OwnerToken, Record, ScopeId, ScopedKey};

/// What makes the shards' changes outlive the process. Called under the lock of the
/// changed key's shard, so that a key's changes reach it in the order they were made.
pub trait Durability: Send + Sync + 'static {
    /// Records that `key` holds `record` until `expires_ms`, in `scope`; returns the
    /// change's ticket.
    fn put(
        &self,
        key: &ScopedKey,
        record: &Record,
        expires_ms: u64,
        scope: Option<&ScopeId>,
    ) -> u64;
    /// Records that `key` holds nothing; returns the change's ticket.
    fn remove(&self, key: &ScopedKey) -> u64;
    /// Waits until the change with `ticket`, and every one before it, is durable. An
    /// answer is given only then: nobody acts on a state a crash could take back.
    fn settle(&self, ticket: u64) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The memory store's durability: none. Every ticket is settled at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct Volatile;

impl Durability for Volatile {
    fn put(
        &self,
        _key: &ScopedKey,
        _record: &Record,
        _expires_ms: u64,
        _scope: Option<&ScopeId>,
    ) -> u64 {
        0
    }

    fn remove(&self, _key: &ScopedKey) -> u64 {
        0
    }

    fn settle(&self, _ticket: u64) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}

/// One shard: its records and the requests waiting (`on_concurrent: wait`) for one of
/// its keys to change, under one lock.
#[derive(Debug, Default)]
struct Inner {
    index: Index,
    watchers: WaiterMap,
}

/// The in-process store; with a journal behind it, the file store's core.
#[derive(Debug)]
pub struct MemoryStore<C: Clock = TokioClock, D: Durability = Volatile> {
    /// Keys are spread over shards by their hash, so that requests for different keys
    /// rarely wait on one lock, and a table rehash stalls one shard only. Shared with the
    /// watch handles, which leave their shard's watcher map when dropped.
    shards: Arc<[Mutex<Inner>]>,
    /// The bound of each shard: together never more than `max_entries`.
    shard_entries: usize,
    clock: C,
    durability: D,
    /// `store.max_entries_per_scope`: each scope's completed records, across shards.
    quotas: Option<Quotas>,
    /// Live completed records evicted early: `[full, scope_quota]`.
    evictions: [Counter; 2],
    evictions_family: Family<ReasonLabel, Counter>,
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
        Self::durable(max_entries, clock, Volatile)
    }
}

impl<C: Clock, D: Durability> MemoryStore<C, D> {
    /// A store whose changes go through `durability`.
    pub(crate) fn durable(max_entries: usize, clock: C, durability: D) -> Self {
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
            durability,
            quotas: None,
            evictions,
            evictions_family,
            entries: Gauge::default(),
            stored_bytes: Gauge::default(),
        }
    }

    /// With at most `max` completed records per scope (`store.max_entries_per_scope`,
    /// docs/behaviour.md §17): past it a scope's own oldest record is evicted.
    #[must_use]
    pub fn with_scope_quota(mut self, max: Option<usize>) -> Self {
        self.quotas = max.map(Quotas::new);
        self
    }

    /// Live records evicted early because the store was full.
    pub fn evictions(&self) -> u64 {
        self.evictions[0].get()
    }

    /// Live records evicted early because their scope was over its quota.
    pub fn quota_evictions(&self) -> u64 {
        self.evictions[1].get()
    }

    /// Entries held, expired ones not yet dropped included.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).index.len())
            .sum()
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
        Shard::new(
            lock(shard_of(&self.shards, key)),
            &self.entries,
            &self.stored_bytes,
        )
    }

    /// Runs a rule on `key`'s shard; returns its outcome and the ticket to settle.
    fn apply<T>(
        &self,
        key: &ScopedKey,
        rule: impl FnOnce(&mut Index, &mut Fx<'_, D>) -> T,
    ) -> (T, u64) {
        let (out, ran) = self.run(key, rule);
        if let Some(scope) = ran.joined {
            self.enforce_quota(&scope);
        }
        (out, ran.ticket)
    }

    /// Runs a rule on `key`'s shard and counts its evictions.
    fn run<T>(
        &self,
        key: &ScopedKey,
        rule: impl FnOnce(&mut Index, &mut Fx<'_, D>) -> T,
    ) -> (T, Ran) {
        let (out, ran) = self
            .shard(key)
            .run(&self.durability, self.quotas.as_ref(), rule);
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
    fn enforce_quota(&self, scope: &ScopeId) {
        let Some(quotas) = &self.quotas else {
            return;
        };
        while let Some((place, key)) = quotas.over(scope) {
            let now = self.clock.now_ms();
            self.run(&key, |index, fx| index.evict_placed(&key, place, now, fx));
        }
    }

    /// Runs a rule, then waits until what it answers from is durable.
    async fn settled<T>(
        &self,
        key: &ScopedKey,
        rule: impl FnOnce(&mut Index, &mut Fx<'_, D>) -> T,
    ) -> Result<T, StoreError> {
        let (out, ticket) = self.apply(key, rule);
        self.durability.settle(ticket).await?;
        Ok(out)
    }

    /// Drops what has expired by `now` from every shard that may hold some, waking its
    /// waiters. Returns how many entries went.
    pub(crate) fn sweep(&self, now: u64) -> u64 {
        let mut gone = 0;
        for shard in self.shards.iter() {
            let mut shard = Shard::new(lock(shard), &self.entries, &self.stored_bytes);
            if shard.inner.index.may_have_expired(now) {
                let quotas = self.quotas.as_ref();
                gone += shard
                    .run(&self.durability, quotas, |index, fx| index.sweep(now, fx))
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
    pub(crate) fn release_at(&self, lease: &Lease, now: u64) -> Fenced {
        self.apply(&lease.key, |index, fx| index.release(lease, now, fx))
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
            quotas: self.quotas.as_ref(),
        }
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
struct Fx<'a, D> {
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
pub struct MemoryShards(Arc<[Mutex<Inner>]>);

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

fn lock(shard: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
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

impl<C: Clock, D: Durability> Store for MemoryStore<C, D> {
    type Watch = MemoryWatch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let now = self.clock.now_ms();
        let max = self.shard_entries;
        self.settled(&req.key, |index, fx| index.claim(&req, now, max, fx))
            .await?
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
        self.settled(&lease.key, |index, fx| {
            index.complete(lease, &record, compact, ttl, now, fx)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        let now = self.clock.now_ms();
        self.settled(&lease.key, |index, fx| index.release(lease, now, fx))
            .await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        let now = self.clock.now_ms();
        self.settled(&lease.key, |index, fx| {
            index.renew(lease, lease_for, now, fx)
        })
        .await
    }

    async fn take_over(
        &self,
        stale: OwnerToken,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        let now = self.clock.now_ms();
        self.settled(&req.key, |index, fx| index.take_over(stale, &req, now, fx))
            .await
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
        self.settled(&key, |index, fx| index.inspect(&key, now, fx))
            .await
    }

    async fn purge(&self, key: ScopedKey, force: bool) -> Result<Purged, StoreError> {
        let now = self.clock.now_ms();
        self.settled(&key, |index, fx| index.purge(&key, force, now, fx))
            .await
    }

    async fn replace(
        &self,
        key: ScopedKey,
        expected: &Record,
        new: Option<Arc<Completed>>,
    ) -> Result<Replaced, StoreError> {
        let new = new.map(|record| Arc::new(record.compacted()));
        let now = self.clock.now_ms();
        self.settled(&key, |index, fx| {
            index.replace(&key, expected, new, now, fx)
        })
        .await
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.register_shared_metrics(registry, "memory");
    }
}

impl<C: Clock, D: Durability> MemoryStore<C, D> {
    /// The metrics every embedded store has; `kind` names it in their help.
    pub(crate) fn register_shared_metrics(&self, registry: &mut Registry, kind: &str) {
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

#[cfg(test)]
mod tests;
