//! What the proxy counts. Counters are plain atomics on the hot path; the admin listener
//! renders them.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// How a request ended, one label value of `idemgate_requests_total{outcome=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Claimed, forwarded and recorded.
    Forwarded,
    /// Answered from a stored record.
    Replayed,
    InFlight,
    KeyReused,
    MissingKey,
    InvalidKey,
    TooLarge,
    /// Not guarded: method, disabled route, or no key where none is required.
    Passthrough,
    StoreUnavailable,
    /// The store was down and `on_unavailable: pass_through` forwarded it unguarded.
    StoreBypassed,
    OutcomeUnknown,
    /// Forwarded, but the claim was lost before recording: the response was not stored.
    LeaseLost,
    NotReplayable,
    /// Forwarded, and the claim released (`release_statuses`).
    Released,
    UpstreamUnreachable,
    BadRequest,
}

impl Outcome {
    pub const ALL: [Outcome; 16] = [
        Outcome::Forwarded,
        Outcome::Replayed,
        Outcome::InFlight,
        Outcome::KeyReused,
        Outcome::MissingKey,
        Outcome::InvalidKey,
        Outcome::TooLarge,
        Outcome::Passthrough,
        Outcome::StoreUnavailable,
        Outcome::StoreBypassed,
        Outcome::OutcomeUnknown,
        Outcome::LeaseLost,
        Outcome::NotReplayable,
        Outcome::Released,
        Outcome::UpstreamUnreachable,
        Outcome::BadRequest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::KeyReused => "key_reused",
            Outcome::MissingKey => "missing_key",
            Outcome::InvalidKey => "invalid_key",
            Outcome::TooLarge => "too_large",
            Outcome::Passthrough => "passthrough",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::StoreBypassed => "store_bypassed",
            Outcome::OutcomeUnknown => "outcome_unknown",
            Outcome::LeaseLost => "lease_lost",
            Outcome::NotReplayable => "not_replayable",
            Outcome::Released => "released",
            Outcome::UpstreamUnreachable => "upstream_unreachable",
            Outcome::BadRequest => "bad_request",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    requests: [AtomicU64; Outcome::ALL.len()],
    in_flight: AtomicI64,
    /// Duplicates parked by `on_concurrent: wait`.
    waiting: AtomicI64,
    /// Recordings that failed and were retried in the background.
    record_retries: AtomicU64,
    /// Background recordings that landed after the client had its answer.
    late_records: AtomicU64,
    /// Claims whose call timed out, released once the store answered again.
    orphans_released: AtomicU64,
    /// Woken on every count, so a test or a reader can wait for a condition.
    changed: tokio::sync::Notify,
}

impl Metrics {
    pub fn count(&self, outcome: Outcome) {
        self.requests[outcome.index()].fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// Resolves once `cond` holds; re-checked after every count.
    pub async fn wait_until(&self, cond: impl Fn(&Metrics) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if cond(self) {
                return;
            }
            notified.await;
        }
    }

    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.requests[outcome.index()].load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn waiting(&self) -> i64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Counts a waiting duplicate for as long as the guard lives.
    pub fn track_waiting(&self) -> Gauge<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
        Gauge(&self.waiting)
    }

    pub fn record_retry(&self) {
        self.record_retries.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_retries(&self) -> u64 {
        self.record_retries.load(Ordering::Relaxed)
    }

    pub fn late_record(&self) {
        self.late_records.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    pub fn late_records(&self) -> u64 {
        self.late_records.load(Ordering::Relaxed)
    }

    pub fn orphan_released(&self) {
        self.orphans_released.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    pub fn orphans_released(&self) -> u64 {
        self.orphans_released.load(Ordering::Relaxed)
    }

    /// Counts a forwarded request for as long as the guard lives.
    pub fn track_in_flight(&self) -> Gauge<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Gauge(&self.in_flight)
    }
}

/// Holds a gauge up by one while it lives.
#[derive(Debug)]
pub struct Gauge<'a>(&'a AtomicI64);

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_own_counter_and_label() {
        let m = Metrics::default();
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
            m.count(*o);
        }
        let labels: std::collections::HashSet<_> =
            Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), Outcome::ALL.len());
        assert!(Outcome::ALL.iter().all(|o| m.requests(*o) == 1));
    }
}
