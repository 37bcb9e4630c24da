//! Decorators around any [`Store`], the way tower puts a timeout in a layer: an
//! [`Around`] wraps every call of a [`Layered`] store. [`Deadline`] puts `store.timeout`
//! and the latency histogram on every call, so the proxy talks to a [`Timed`] store and
//! never times a call by hand; tests wrap the real stores in layers of their own (a call
//! that stops answering) the same way.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use opentelemetry::trace::SpanKind;

use super::api::{
    Claim, ClaimRequest, Cursor, Fenced, Inspection, Lease, Page, Purged, Replaced, StateFilter,
    Store, StoreError,
};
use crate::idempotency::{Completed, InFlight, Record, ScopedKey};
use crate::metrics::{StoreOp, StoreTimings};

/// What a layer does around each store call, named by its operation.
pub trait Around: Send + Sync + 'static {
    fn around<T: Send>(
        &self,
        op: StoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send;
}

/// A store whose every call goes through `around`.
#[derive(Debug)]
pub struct Layered<S, A> {
    /// Shared: whoever else holds it (the start-up check of Redis, a test looking into
    /// the store) sees what the calls through the layer did.
    inner: Arc<S>,
    around: A,
}

impl<S: Store, A: Around> Layered<S, A> {
    pub fn new(inner: Arc<S>, around: A) -> Self {
        Self { inner, around }
    }
}

/// The backend's own methods (its size, its gauges) stay reachable; every [`Store`] call
/// goes through the layer, whose methods take precedence.
impl<S, A> std::ops::Deref for Layered<S, A> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.inner
    }
}

/// A store whose every call ends within `store.timeout` and is timed.
pub type Timed<S> = Layered<S, Deadline>;

/// Every call ends within `limit` (as [`StoreError::Timeout`]) and is observed in
/// `idemgate_store_duration_seconds{op}`.
#[derive(Debug)]
pub struct Deadline {
    limit: Duration,
    timings: StoreTimings,
}

impl Deadline {
    pub fn new(limit: Duration, timings: StoreTimings) -> Self {
        Self { limit, timings }
    }
}

impl Around for Deadline {
    /// A call that is done at once (the memory store) never arms a timer.
    async fn around<T: Send>(
        &self,
        op: StoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        let started = tokio::time::Instant::now();
        // A child of the request's server span, when it is traced (docs/behaviour.md §20).
        let span = crate::telemetry::child(op.span_name(), SpanKind::Internal);
        let mut call = pin!(call);
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        let result = match first {
            Poll::Ready(result) => result,
            Poll::Pending => tokio::time::timeout(self.limit, call)
                .await
                .unwrap_or(Err(StoreError::Timeout(self.limit))),
        };
        self.timings.observe(op, started.elapsed());
        if let Some(span) = span {
            crate::telemetry::store_ended(span, &result);
        }
        result
    }
}

impl<S: Store, A: Around> Store for Layered<S, A> {
    type Watch = S::Watch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        self.around
            .around(StoreOp::Claim, self.inner.claim(req))
            .await
    }

    async fn complete(
        &self,
        lease: &Lease,
        record: Arc<Completed>,
        ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        let call = self.inner.complete(lease, record, ttl);
        self.around.around(StoreOp::Complete, call).await
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        let call = self.inner.release(lease);
        self.around.around(StoreOp::Release, call).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        let call = self.inner.renew(lease, lease_for);
        self.around.around(StoreOp::Renew, call).await
    }

    async fn take_over(
        &self,
        stale: InFlight,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        let call = self.inner.take_over(stale, req);
        self.around.around(StoreOp::TakeOver, call).await
    }

    async fn watch(&self, key: ScopedKey) -> Result<S::Watch, StoreError> {
        self.around
            .around(StoreOp::Watch, self.inner.watch(key))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.around.around(StoreOp::Ping, self.inner.ping()).await
    }

    fn clock_ms(&self) -> u64 {
        self.inner.clock_ms()
    }

    async fn inspect(&self, key: ScopedKey) -> Result<Option<Inspection>, StoreError> {
        self.around
            .around(StoreOp::Inspect, self.inner.inspect(key))
            .await
    }

    async fn list(
        &self,
        state: StateFilter,
        cursor: Cursor,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.around
            .around(StoreOp::Inspect, self.inner.list(state, cursor, limit))
            .await
    }

    async fn purge(&self, key: ScopedKey, force: bool) -> Result<Purged, StoreError> {
        self.around
            .around(StoreOp::Purge, self.inner.purge(key, force))
            .await
    }

    async fn replace(
        &self,
        key: ScopedKey,
        expected: &Record,
        new: Option<Arc<Completed>>,
    ) -> Result<Replaced, StoreError> {
        self.around
            .around(StoreOp::Resolve, self.inner.replace(key, expected, new))
            .await
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.inner.register_metrics(registry);
    }

    fn count_shortfalls_in(&self, counter: prometheus_client::metrics::counter::Counter) {
        self.inner.count_shortfalls_in(counter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    /// A store whose every call hangs: only the decorator's deadline ends it.
    struct Hanging;

    #[derive(Debug)]
    struct NoWatch;

    impl crate::store::Watch for NoWatch {
        async fn changed(self) {}
    }

    impl Store for Hanging {
        type Watch = NoWatch;
        async fn claim(&self, _: ClaimRequest) -> Result<Claim, StoreError> {
            std::future::pending().await
        }
        async fn complete(
            &self,
            _: &Lease,
            _: Arc<Completed>,
            _: Duration,
        ) -> Result<Fenced, StoreError> {
            std::future::pending().await
        }
        async fn release(&self, _: &Lease) -> Result<Fenced, StoreError> {
            std::future::pending().await
        }
        async fn renew(&self, _: &Lease, _: Duration) -> Result<Fenced, StoreError> {
            std::future::pending().await
        }
        async fn take_over(
            &self,
            _: InFlight,
            _: ClaimRequest,
        ) -> Result<Option<Lease>, StoreError> {
            std::future::pending().await
        }
        async fn watch(&self, _: ScopedKey) -> Result<NoWatch, StoreError> {
            std::future::pending().await
        }
        async fn ping(&self) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn inspect(&self, _: ScopedKey) -> Result<Option<Inspection>, StoreError> {
            std::future::pending().await
        }
        async fn list(&self, _: StateFilter, _: Cursor, _: usize) -> Result<Page, StoreError> {
            std::future::pending().await
        }
        async fn purge(&self, _: ScopedKey, _: bool) -> Result<Purged, StoreError> {
            std::future::pending().await
        }
        async fn replace(
            &self,
            _: ScopedKey,
            _: &Record,
            _: Option<Arc<Completed>>,
        ) -> Result<Replaced, StoreError> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_does_not_answer_times_out_and_is_observed() {
        let metrics = Metrics::new();
        let limit = Duration::from_millis(250);
        let store = Timed::new(
            Arc::new(Hanging),
            Deadline::new(limit, metrics.store_timings()),
        );
        let started = tokio::time::Instant::now();
        assert!(matches!(store.ping().await, Err(StoreError::Timeout(l)) if l == limit));
        assert_eq!(started.elapsed(), limit);
        assert!(
            metrics
                .render()
                .contains("idemgate_store_duration_seconds_count{op=\"ping\"} 1")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_ready_call_is_observed_under_its_own_op() {
        let metrics = Metrics::new();
        let store = Timed::new(
            Arc::new(crate::store::MemoryStore::new(8)),
            Deadline::new(Duration::from_secs(1), metrics.store_timings()),
        );
        store.ping().await.expect("memory store answers");
        assert!(
            metrics
                .render()
                .contains("idemgate_store_duration_seconds_count{op=\"ping\"} 1")
        );
    }
}
