//! A real store with one operation that stops answering, the way a Redis call does that
//! was written and whose reply never came (or that never got written). Every other
//! operation is the inner store's own.

use std::sync::Arc;
use std::time::Duration;

use idemgate::idempotency::{Completed, OwnerToken, ScopedKey};
use idemgate::metrics::StoreOp;
use idemgate::store::{Claim, ClaimRequest, Fenced, Lease, Store, StoreError};

/// When the stalled operation stops answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Before it reaches the store: nothing is written.
    Before,
    /// After the store applied it: written, but the caller never hears so.
    After,
}

#[derive(Debug)]
pub struct Stalling<S> {
    pub inner: S,
    op: StoreOp,
    when: When,
}

impl<S: Store> Stalling<S> {
    pub fn new(inner: S, op: StoreOp, when: When) -> Self {
        Self { inner, op, when }
    }

    async fn run<T>(
        &self,
        op: StoreOp,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if op != self.op {
            return call.await;
        }
        if self.when == When::After {
            let _ = call.await;
        }
        std::future::pending().await
    }
}

impl<S: Store> Store for Stalling<S> {
    type Watch = S::Watch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        self.run(StoreOp::Claim, self.inner.claim(req)).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        record: Arc<Completed>,
        ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        self.run(StoreOp::Complete, self.inner.complete(lease, record, ttl))
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        self.run(StoreOp::Release, self.inner.release(lease)).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        self.run(StoreOp::Renew, self.inner.renew(lease, lease_for))
            .await
    }

    async fn take_over(
        &self,
        stale: OwnerToken,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        self.run(StoreOp::TakeOver, self.inner.take_over(stale, req))
            .await
    }

    async fn watch(&self, key: ScopedKey) -> Result<S::Watch, StoreError> {
        self.run(StoreOp::Watch, self.inner.watch(key)).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.run(StoreOp::Ping, self.inner.ping()).await
    }
}
