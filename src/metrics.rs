//! What the proxy counts, exposed on the admin listener's `/metrics` through
//! prometheus-client: [`Metrics`], the one registry and the handles the hot path counts
//! with. The label values are in `labels.rs`; the two text formats `/metrics` speaks,
//! in `format.rs`.

mod format;
mod labels;

pub use format::Format;
use format::prometheus_text;
pub use labels::{Authorized, Outcome, Reconciled, StoreOp};
use labels::{ExecutedLabel, OpLabel, OutcomeLabel, ResultLabel};

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

fn store_histogram() -> Histogram {
    // 100 µs .. ~3 s: a local Redis answers in well under a millisecond.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// `idemgate_trace_spans_dropped_total`, as the trace exporter counts it: from its own
/// thread and from the request that ended a span it had no room for.
#[derive(Debug, Clone)]
pub struct SpanDrops {
    counter: Counter,
    changed: Option<Arc<tokio::sync::Notify>>,
}

impl SpanDrops {
    pub fn add(&self, spans: u64) {
        self.counter.inc_by(spans);
        if let Some(changed) = &self.changed {
            changed.notify_waiters();
        }
    }
}

/// Every metric of `/metrics`. The families live in the registry for rendering; the hot
/// path holds a handle per label value, so counting is one atomic operation.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: [Counter; Outcome::ALL.len()],
    store_ops: [Histogram; StoreOp::ALL.len()],
    upstream: Histogram,
    in_flight: Gauge,
    /// Duplicates parked by `on_concurrent: wait`.
    waiting: Gauge,
    /// Recordings that failed and were retried in the background.
    record_retries: Counter,
    /// Background recordings that landed after the client had its answer.
    late_records: Counter,
    /// Claims whose call timed out, released once the store answered again.
    orphans_released: Counter,
    /// Responses whose background recording never landed (lease ended or was lost).
    records_lost: Counter,
    /// SIGHUP reloads: `[ok, error]`.
    reloads: [Counter; 2],
    /// Reloads that changed how record addresses are computed.
    reload_address_changes: Counter,
    /// Records fewer replicas acknowledged than `store.min_replicas` asks
    /// (docs/behaviour.md §14).
    replication_shortfall: Counter,
    /// Keys removed through the admin API (docs/behaviour.md §13).
    admin_purges: Counter,
    /// Sealed records that did not open (docs/behaviour.md §17).
    undecryptable: Counter,
    /// Unknown outcomes resolved through the admin API: `[executed false, true]`
    /// (docs/behaviour.md §18).
    resolutions: [Counter; 2],
    /// Reads of a JWKS that failed, the last good set kept (docs/behaviour.md §17).
    jwks_refresh_failures: Counter,
    /// Unknown outcomes the upstream was asked about, by [`Reconciled`]
    /// (docs/behaviour.md §18).
    reconciliations: [Counter; Reconciled::ALL.len()],
    /// Spans the trace exporter could not deliver (docs/behaviour.md §20).
    spans_dropped: Counter,
    /// Checks of `replay_authorization`, by [`Authorized`] (docs/behaviour.md §24).
    replay_authorizations: [Counter; Authorized::ALL.len()],
    /// Woken on every count, so that a test can wait for a condition. Only
    /// [`Metrics::observable`] has one: in production counting stays one atomic add.
    changed: Option<Arc<tokio::sync::Notify>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests_family = Family::<OutcomeLabel, Counter>::default();
        let requests = Outcome::ALL.map(|o| {
            requests_family.get_or_create_owned(&OutcomeLabel {
                outcome: o.as_str(),
            })
        });
        registry.register(
            "idemgate_requests",
            "Requests by how they ended",
            requests_family,
        );
        let store_family =
            Family::<OpLabel, Histogram, fn() -> Histogram>::new_with_constructor(store_histogram);
        let store_ops =
            StoreOp::ALL.map(|op| store_family.get_or_create_owned(&OpLabel { op: op.as_str() }));
        registry.register_with_unit(
            "idemgate_store_duration",
            "Store operation latency",
            Unit::Seconds,
            store_family,
        );
        let upstream = Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        registry.register_with_unit(
            "idemgate_upstream_duration",
            "Upstream exchange latency, to the end of the response body for guarded requests",
            Unit::Seconds,
            upstream.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "idemgate_in_flight",
            "Requests being handled",
            in_flight.clone(),
        );
        let waiting = Gauge::default();
        registry.register(
            "idemgate_waiting",
            "Duplicates waiting for the first request (on_concurrent: wait)",
            waiting.clone(),
        );
        let record_retries = Counter::default();
        registry.register(
            "idemgate_record_retries",
            "Recordings retried after a store failure",
            record_retries.clone(),
        );
        let late_records = Counter::default();
        registry.register(
            "idemgate_late_records",
            "Recordings that landed after the response was sent",
            late_records.clone(),
        );
        let records_lost = Counter::default();
        registry.register(
            "idemgate_records_lost",
            "Responses answered but never recorded: their keys follow on_unknown_outcome",
            records_lost.clone(),
        );
        let orphans_released = Counter::default();
        registry.register(
            "idemgate_orphans_released",
            "Claims released in the background once the store answered again (timed-out claims, failed releases)",
            orphans_released.clone(),
        );
        let reloads_family = Family::<ResultLabel, Counter>::default();
        let reloads = ["ok", "error"]
            .map(|result| reloads_family.get_or_create_owned(&ResultLabel { result }));
        registry.register(
            "idemgate_config_reloads",
            "Configuration reloads (SIGHUP) by result; an error leaves the running configuration in force",
            reloads_family,
        );
        let reload_address_changes = Counter::default();
        registry.register(
            "idemgate_reload_address_changes",
            "Reloads that changed how record addresses are computed (key_from, scope_headers, scope_cookies): retries of requests completed before them execute again",
            reload_address_changes.clone(),
        );
        let replication_shortfall = Counter::default();
        registry.register(
            "idemgate_replication_shortfall",
            "Records that fewer Redis replicas acknowledged than store.min_replicas within store.timeout: answered, but a failover may lose them",
            replication_shortfall.clone(),
        );
        let admin_purges = Counter::default();
        registry.register(
            "idemgate_admin_purges",
            "Records and markers removed through the admin API (DELETE /keys/{id})",
            admin_purges.clone(),
        );
        let resolutions_family = Family::<ExecutedLabel, Counter>::default();
        let resolutions = ["false", "true"]
            .map(|executed| resolutions_family.get_or_create_owned(&ExecutedLabel { executed }));
        registry.register(
            "idemgate_admin_resolutions",
            "Unknown outcomes resolved through the admin API (POST /keys/{id}/resolve), by whether the operator said the request executed",
            resolutions_family,
        );
        let reconciliations_family = Family::<ResultLabel, Counter>::default();
        let reconciliations = Reconciled::ALL.map(|r| {
            reconciliations_family.get_or_create_owned(&ResultLabel { result: r.as_str() })
        });
        registry.register(
            "idemgate_reconciliations",
            "Unknown outcomes the upstream was asked about (reconcile), by what its lookup said: executed (recorded), not_executed (released) or unknown (outcome-unknown recorded)",
            reconciliations_family,
        );
        let authorizations_family = Family::<ResultLabel, Counter>::default();
        let replay_authorizations = Authorized::ALL.map(|a| {
            authorizations_family.get_or_create_owned(&ResultLabel { result: a.as_str() })
        });
        registry.register(
            "idemgate_replay_authorizations",
            "Replays checked by replay_authorization, by what it said: allowed (replayed), denied (its 401 or 403 passed on) or error (503 authorization-unavailable)",
            authorizations_family,
        );
        let undecryptable = Counter::default();
        registry.register(
            "idemgate_store_undecryptable",
            "Sealed records that did not decrypt (their key is no longer listed in store.encryption, or they were altered): answered 503, never replayed",
            undecryptable.clone(),
        );
        let jwks_refresh_failures = Counter::default();
        registry.register(
            "idemgate_jwks_refresh_failures",
            "Reads of a scope_principal JWKS (file or URL) that failed; the last good key set stays in use",
            jwks_refresh_failures.clone(),
        );
        // Always present, exporter or not, so that an alert on it needs no `absent()`.
        let spans_dropped = Counter::default();
        registry.register(
            "idemgate_trace_spans_dropped",
            "Spans the OTLP exporter did not deliver: its queue was full (a slow collector) or the collector refused or could not be reached",
            spans_dropped.clone(),
        );
        #[cfg(feature = "alloc-stats")]
        registry.register_collector(Box::new(crate::alloc_stats::AllocCounters));
        Self {
            registry,
            resolutions,
            reconciliations,
            undecryptable,
            requests,
            jwks_refresh_failures,
            replication_shortfall,
            reloads,
            reload_address_changes,
            admin_purges,
            store_ops,
            upstream,
            in_flight,
            waiting,
            record_retries,
            late_records,
            orphans_released,
            records_lost,
            spans_dropped,
            replay_authorizations,
            changed: None,
        }
    }

    /// Metrics that [`Metrics::wait_until`] can wait on: every count also wakes the
    /// waiters, which takes a lock. For tests and tools, not for the proxy's hot path.
    pub fn observable() -> Self {
        Self {
            changed: Some(Arc::new(tokio::sync::Notify::new())),
            ..Self::new()
        }
    }

    /// Handles on the store-latency histograms, for the store's timing decorator.
    pub fn store_timings(&self) -> StoreTimings {
        StoreTimings(self.store_ops.clone())
    }

    /// The count of dropped spans, for the trace exporter's thread.
    pub fn span_drops(&self) -> SpanDrops {
        SpanDrops {
            counter: self.spans_dropped.clone(),
            changed: self.changed.clone(),
        }
    }

    /// Spans dropped so far.
    pub fn spans_dropped(&self) -> u64 {
        self.spans_dropped.get()
    }

    /// The counter of failed JWKS reads, for the verifiers that read them.
    pub fn jwks_refresh_failures(&self) -> Counter {
        self.jwks_refresh_failures.clone()
    }

    pub fn count(&self, outcome: Outcome) {
        self.requests[outcome.index()].inc();
        self.wake();
    }

    /// Resolves once `cond` holds; re-checked after every count.
    ///
    /// # Panics
    ///
    /// On metrics not made by [`Metrics::observable`]: nothing would ever wake it.
    pub async fn wait_until(&self, cond: impl Fn(&Metrics) -> bool) {
        let changed = self
            .changed
            .as_ref()
            .expect("wait_until needs metrics made by Metrics::observable()");
        loop {
            // Registered before the condition is read, so a count in between wakes it.
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if cond(self) {
                return;
            }
            notified.await;
        }
    }

    fn wake(&self) {
        if let Some(changed) = &self.changed {
            changed.notify_waiters();
        }
    }

    /// Counts a configuration reload (docs/behaviour.md §14).
    pub fn count_reload(&self, ok: bool) {
        self.reloads[usize::from(!ok)].inc();
        self.wake();
    }

    /// Counts a reload that changed how record addresses are computed.
    pub fn count_address_change(&self) {
        self.reload_address_changes.inc();
        self.wake();
    }

    /// Reloads so far that changed how record addresses are computed.
    pub fn address_changes(&self) -> u64 {
        self.reload_address_changes.get()
    }

    /// Counts a purge through the admin API (docs/behaviour.md §13).
    pub fn count_purge(&self) {
        self.admin_purges.inc();
        self.wake();
    }

    pub fn purges(&self) -> u64 {
        self.admin_purges.get()
    }

    /// Reloads so far: `(ok, error)`.
    pub fn reloads(&self) -> (u64, u64) {
        (self.reloads[0].get(), self.reloads[1].get())
    }

    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.requests[outcome.index()].get()
    }

    pub fn observe_upstream(&self, elapsed: Duration) {
        self.upstream.observe(elapsed.as_secs_f64());
    }

    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// Counts a request being handled for as long as the guard lives.
    pub fn track_in_flight(&self) -> GaugeGuard<'_> {
        self.in_flight.inc();
        GaugeGuard(&self.in_flight)
    }

    pub fn waiting(&self) -> i64 {
        self.waiting.get()
    }

    /// Counts a waiting duplicate for as long as the guard lives.
    pub fn track_waiting(&self) -> GaugeGuard<'_> {
        self.waiting.inc();
        self.wake();
        GaugeGuard(&self.waiting)
    }

    pub fn record_retry(&self) {
        self.record_retries.inc();
    }

    pub fn record_retries(&self) -> u64 {
        self.record_retries.get()
    }

    pub fn late_record(&self) {
        self.late_records.inc();
        self.wake();
    }

    pub fn late_records(&self) -> u64 {
        self.late_records.get()
    }

    pub fn record_lost(&self) {
        self.records_lost.inc();
        self.wake();
    }

    pub fn records_lost(&self) -> u64 {
        self.records_lost.get()
    }

    pub fn count_resolution(&self, executed: bool) {
        self.resolutions[usize::from(executed)].inc();
        self.wake();
    }

    pub fn count_reconciliation(&self, result: Reconciled) {
        self.reconciliations[result as usize].inc();
        self.wake();
    }

    pub fn reconciliations(&self, result: Reconciled) -> u64 {
        self.reconciliations[result as usize].get()
    }

    pub fn count_replay_authorization(&self, result: Authorized) {
        self.replay_authorizations[result as usize].inc();
        self.wake();
    }

    pub fn replay_authorizations(&self, result: Authorized) -> u64 {
        self.replay_authorizations[result as usize].get()
    }

    pub fn undecryptable(&self) {
        self.undecryptable.inc();
        self.wake();
    }

    pub fn orphan_released(&self) {
        self.orphans_released.inc();
        self.wake();
    }

    pub fn orphans_released(&self) -> u64 {
        self.orphans_released.get()
    }

    /// A handle on `idemgate_replication_shortfall_total`, for the store that counts it.
    pub fn replication_shortfall(&self) -> Counter {
        self.replication_shortfall.clone()
    }

    /// The Prometheus (OpenMetrics) text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The exposition in `format`.
    pub fn render_as(&self, format: Format) -> String {
        match format {
            Format::OpenMetrics => self.render(),
            Format::PrometheusText => prometheus_text(&self.render()),
        }
    }

    /// Adds a metric whose value lives elsewhere (a store's own counters).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }
}

/// The store-latency histograms, one per operation, shared with [`Metrics`].
#[derive(Debug, Clone)]
pub struct StoreTimings([Histogram; StoreOp::ALL.len()]);

impl StoreTimings {
    pub fn observe(&self, op: StoreOp, elapsed: Duration) {
        self.0[op as usize].observe(elapsed.as_secs_f64());
    }
}

/// Holds a gauge up by one while it lives.
#[derive(Debug)]
pub struct GaugeGuard<'a>(&'a Gauge);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_own_counter_and_label() {
        let m = Metrics::new();
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
            m.count(*o);
        }
        let labels: std::collections::HashSet<_> =
            Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), Outcome::ALL.len());
        assert!(Outcome::ALL.iter().all(|o| m.requests(*o) == 1));
        let text = m.render();
        assert!(
            text.contains("idemgate_requests_total{outcome=\"forwarded\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn renders_the_metrics_spec_names() {
        let m = Metrics::new();
        m.store_timings()
            .observe(StoreOp::Claim, Duration::from_millis(1));
        m.observe_upstream(Duration::from_millis(3));
        let _g = m.track_in_flight();
        let text = m.render();
        for needle in [
            "idemgate_store_duration_seconds_bucket{le=",
            "idemgate_store_duration_seconds_count{op=\"claim\"} 1",
            "idemgate_upstream_duration_seconds_count 1",
            "idemgate_in_flight 1",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
    }

    #[test]
    fn the_prometheus_text_format_names_counter_families_with_total_and_drops_unit_and_eof() {
        let m = Metrics::new();
        m.count(Outcome::Replayed);
        m.observe_upstream(Duration::from_millis(3));
        let open = m.render();
        assert!(
            open.contains("# TYPE idemgate_requests counter\n"),
            "{open}"
        );
        assert!(
            open.contains("# UNIT ") && open.ends_with("# EOF\n"),
            "{open}"
        );
        let text = m.render_as(Format::PrometheusText);
        assert!(text.contains("# HELP idemgate_requests_total Requests by how they ended"));
        assert!(
            text.contains("# TYPE idemgate_requests_total counter\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE idemgate_upstream_duration_seconds histogram\n"));
        assert!(text.contains("# TYPE idemgate_in_flight gauge\n"));
        assert!(
            !text.contains("# UNIT ") && !text.contains("# EOF"),
            "{text}"
        );
        // The samples are the same lines in both formats.
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&open), samples(&text));
        assert!(text.contains("idemgate_requests_total{outcome=\"replayed\"} 1\n"));
        assert_eq!(
            prometheus_text("# HELP x X.\n# TYPE x unknown\nx 1\n# EOF\n"),
            "# HELP x X.\n# TYPE x untyped\nx 1\n"
        );
    }

    #[tokio::test]
    async fn observable_metrics_wake_a_waiter_when_a_count_makes_its_condition_true() {
        let m = std::sync::Arc::new(Metrics::observable());
        let waiter = tokio::spawn({
            let m = std::sync::Arc::clone(&m);
            async move { m.wait_until(|m| m.requests(Outcome::Replayed) == 2).await }
        });
        m.count(Outcome::Replayed);
        m.count(Outcome::Replayed);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .expect("waiter task");
    }

    #[tokio::test]
    #[should_panic(expected = "Metrics::observable")]
    async fn plain_metrics_cannot_be_waited_on() {
        Metrics::new().wait_until(|_| false).await;
    }
}
