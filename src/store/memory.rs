//! The embedded stores: one process, no Redis. [`Embedded`] is shards of the per-key
//! rules' index (`rules.rs`), bounded by `max_entries`, whose every change also goes to
//! the [`Durability`] of its [`Backing`]. Backed by [`Volatile`] (nothing) it is the
//! memory store; backed by the journal of `file/` it is the file store. The rules, the
//! shards and the [`Store`] impl are the same code for both.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

use super::api::{
    Claim, ClaimRequest, Cursor, Fenced, Inspection, Lease, Page, Purged, Replaced, StateFilter,
    Store, StoreError,
};
use super::clock::{Clock, TokioClock};
use super::quota::Quotas;
use super::rules::Index;
use super::waiters::KeyWatch;
use crate::idempotency::{Completed, InFlight, Record, ScopeId, ScopedKey};
pub(crate) use shards::{AllShards, Core};
use shards::{Fx, lock};
pub use shards::{MemoryShards, MemoryWatch};

mod shards;

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

/// What an embedded store keeps beside its shards: where their changes go, and what
/// `/readyz` and `/metrics` report of it.
pub trait Backing: Send + Sync + 'static {
    type Durability: Durability;
    /// The store's name in the help of its metrics.
    const KIND: &'static str;
    fn durability(&self) -> &Self::Durability;
    /// Whether the store can answer, for `/readyz`.
    fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Its own metrics, beside those of the shards.
    fn register_metrics(&self, _registry: &mut Registry) {}
}

/// The memory store's backing: none. Every ticket is settled at once.
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

impl Backing for Volatile {
    type Durability = Self;
    const KIND: &'static str = "memory";

    fn durability(&self) -> &Self {
        self
    }
}

/// An embedded store: its shards, and its backing.
#[derive(Debug)]
pub struct Embedded<C: Clock = TokioClock, B: Backing = Volatile> {
    pub(super) core: Core<C>,
    pub(super) backing: B,
}

/// The in-process store: shards and nothing else.
pub type MemoryStore<C = TokioClock> = Embedded<C, Volatile>;

impl MemoryStore<TokioClock> {
    pub fn new(max_entries: usize) -> Self {
        Self::with_clock(max_entries, TokioClock::default())
    }
}

impl<C: Clock> MemoryStore<C> {
    pub fn with_clock(max_entries: usize, clock: C) -> Self {
        Self {
            core: Core::new(max_entries, clock, None),
            backing: Volatile,
        }
    }

    /// With at most `max` completed records per scope (`store.max_entries_per_scope`,
    /// docs/behaviour.md §17): past it a scope's own oldest record is evicted.
    #[must_use]
    pub fn with_scope_quota(mut self, max: Option<usize>) -> Self {
        self.core.quotas = max.map(|max| Arc::new(Quotas::new(max)));
        self
    }
}

impl<C: Clock, B: Backing> Embedded<C, B> {
    /// Live records evicted early because the store was full.
    pub fn evictions(&self) -> u64 {
        self.core.evictions[0].get()
    }

    /// Live records evicted early because their scope was over its quota.
    pub fn quota_evictions(&self) -> u64 {
        self.core.evictions[1].get()
    }

    /// Entries held, expired ones not yet dropped included.
    pub fn len(&self) -> usize {
        self.core
            .shards
            .iter()
            .map(|shard| lock(shard).index.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries as `idemgate_store_entries` shows them.
    pub fn entries_gauge(&self) -> i64 {
        self.core.entries.get()
    }

    /// Approximate bytes of the records held (what `idemgate_store_bytes` shows).
    pub fn stored_bytes(&self) -> i64 {
        self.core.stored_bytes.get()
    }

    /// Runs a rule, then waits until what it answers from is durable.
    async fn settled<T>(
        &self,
        key: &ScopedKey,
        rule: impl FnOnce(&mut Index, &mut Fx<'_, B::Durability>) -> T,
    ) -> Result<T, StoreError> {
        let durability = self.backing.durability();
        let (out, ticket) = self.core.apply(durability, key, rule);
        durability.settle(ticket).await?;
        Ok(out)
    }
}

impl<C: Clock, B: Backing> Store for Embedded<C, B> {
    type Watch = MemoryWatch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let now = self.core.clock.now_ms();
        let max = self.core.shard_entries;
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
        let now = self.core.clock.now_ms();
        self.settled(&lease.key, |index, fx| {
            index.complete(lease, &record, compact, ttl, now, fx)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        let now = self.core.clock.now_ms();
        self.settled(&lease.key, |index, fx| index.release(lease, now, fx))
            .await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        let now = self.core.clock.now_ms();
        self.settled(&lease.key, |index, fx| {
            index.renew(lease, lease_for, now, fx)
        })
        .await
    }

    async fn take_over(
        &self,
        stale: InFlight,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        let now = self.core.clock.now_ms();
        let stale = stale.token;
        self.settled(&req.key, |index, fx| index.take_over(stale, &req, now, fx))
            .await
    }

    async fn watch(&self, key: ScopedKey) -> Result<MemoryWatch, StoreError> {
        Ok(KeyWatch::register(
            &MemoryShards(Arc::clone(&self.core.shards)),
            key,
        ))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.backing.ping()
    }

    fn clock_ms(&self) -> u64 {
        self.core.clock.now_ms()
    }

    async fn inspect(&self, key: ScopedKey) -> Result<Option<Inspection>, StoreError> {
        let now = self.core.clock.now_ms();
        self.settled(&key, |index, fx| index.inspect(&key, now, fx))
            .await
    }

    async fn list(
        &self,
        state: StateFilter,
        cursor: Cursor,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let now = self.core.clock.now_ms();
        // One more than asked says whether another page follows. Each shard is locked
        // for its own pass only (docs/behaviour.md §24).
        let want = limit.saturating_add(1);
        let mut items = Vec::new();
        for shard in self.core.shards.iter() {
            let page = lock(shard)
                .index
                .page(state, cursor.after.as_ref(), want, now);
            items.extend(page);
        }
        items.sort_unstable_by_key(|(key, _)| *key);
        items.truncate(want);
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            Cursor {
                after: items.last().map(|(key, _)| *key),
                ..Cursor::default()
            }
        });
        Ok(Page { items, next })
    }

    async fn purge(&self, key: ScopedKey, force: bool) -> Result<Purged, StoreError> {
        let now = self.core.clock.now_ms();
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
        let now = self.core.clock.now_ms();
        self.settled(&key, |index, fx| {
            index.replace(&key, expected, new, now, fx)
        })
        .await
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.core.register_metrics(registry, B::KIND);
        self.backing.register_metrics(registry);
    }
}

#[cfg(test)]
mod tests;
