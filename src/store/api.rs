//! The contract every store fulfils: the [`Store`] trait and the types its calls take
//! and return. The proxy and the admin API talk to nothing else; one suite checks every
//! implementation against it (`tests/it/store_contract.rs`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::seal::Undecryptable;
use crate::idempotency::{
    Completed, Fingerprint, InFlight, OwnerToken, Record, ScopeId, ScopedKey,
};

/// What a claim attempt is for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest {
    pub key: ScopedKey,
    /// The scope the key belongs to, kept beside its record by the embedded stores for
    /// `store.max_entries_per_scope` (docs/behaviour.md §17) and fair eviction (§25);
    /// `None` on Redis and PostgreSQL.
    pub scope: Option<ScopeId>,
    pub fingerprint: Fingerprint,
    /// The caller makes the token, so tests can choose it.
    pub token: OwnerToken,
    /// How long the marker protects the claim without a renewal.
    pub lease: Duration,
    /// How long the record (marker, then completed response) is kept.
    pub ttl: Duration,
    /// The request's body is streamed (docs/behaviour.md §19): `fingerprint` is its
    /// up-front fingerprint, and the marker says so.
    pub streamed: bool,
}

impl ClaimRequest {
    /// The in-flight marker this claim writes at `now_ms`, on the store's clock.
    pub fn marker(&self, now_ms: u64) -> InFlight {
        InFlight {
            fingerprint: self.fingerprint,
            token: self.token,
            lease_deadline_ms: now_ms + millis(self.lease),
            claimed_at_ms: Some(now_ms),
            streamed: self.streamed,
        }
    }

    /// The lease this claim gives when it writes its marker at `now_ms`.
    pub fn lease(&self, now_ms: u64) -> Lease {
        Lease {
            key: self.key,
            token: self.token,
            claimed_at_ms: now_ms,
            written: Written::new(self.marker(now_ms)),
        }
    }

    /// The lease this claim gives when it wrote `encoded`, the encoding of
    /// [`marker(now_ms)`](Self::marker): kept, so that a store fencing by comparing
    /// whole values does not encode the marker again for the complete or the release.
    pub fn lease_encoded(&self, now_ms: u64, encoded: Bytes) -> Lease {
        let marker = self.marker(now_ms);
        debug_assert_eq!(encoded, marker.encode(), "the bytes of this very marker");
        Lease {
            key: self.key,
            token: self.token,
            claimed_at_ms: now_ms,
            written: Written {
                marker: Some(marker),
                encoded: Some(encoded),
                renewed_to_ms: AtomicU64::new(0),
            },
        }
    }

    /// How long the marker's key lives: its owner may have forwarded the request, so it
    /// outlives the lease, and it never outlives the record it becomes.
    pub fn marker_ttl(&self) -> Duration {
        self.ttl.max(self.lease)
    }
}

/// Whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The result of a claim attempt: either this caller now owns the key, or someone else's
/// record is there (returned in the same round trip, so a replay costs one call).
#[derive(Debug)]
pub enum Claim {
    Acquired(Lease),
    Existing {
        record: Record,
        /// The store's clock when it read `record`, for judging the lease.
        now_ms: u64,
    },
}

/// Proof of ownership of a key. Not `Clone`: one claim, one owner.
#[derive(Debug, PartialEq, Eq)]
pub struct Lease {
    pub key: ScopedKey,
    pub token: OwnerToken,
    /// When the marker was written, on the store's clock: the record's creation time.
    pub claimed_at_ms: u64,
    /// The marker as this lease last wrote it, for a store that fences by comparing
    /// whole values (docs/behaviour.md §23).
    pub written: Written,
}

/// The in-flight marker a lease's claim wrote, with the deadline its last renewal set:
/// what a store fencing with a native compare-and-set (`SET ... IFEQ`, `DELIFEQ`)
/// expects to find under the key (docs/behaviour.md §23). Unknown (the default) for a
/// lease made by hand; such a store then checks the owner token instead.
#[derive(Debug, Default)]
pub struct Written {
    marker: Option<InFlight>,
    /// `marker`'s encoding as the claim wrote it, when the store kept it.
    encoded: Option<Bytes>,
    /// 0 until a renewal: the marker's own deadline holds.
    renewed_to_ms: AtomicU64,
}

impl Written {
    pub fn new(marker: InFlight) -> Self {
        Self {
            marker: Some(marker),
            encoded: None,
            renewed_to_ms: AtomicU64::new(0),
        }
    }

    /// The encoding of [`marker()`](Self::marker): the claim's bytes until a renewal.
    pub fn marker_bytes(&self) -> Option<Bytes> {
        match &self.encoded {
            Some(encoded) if self.renewed_to_ms.load(Ordering::Acquire) == 0 => {
                Some(encoded.clone())
            }
            _ => self.marker().map(|marker| marker.encode()),
        }
    }

    /// The marker as last written: the claim's, with the last renewal's deadline.
    pub fn marker(&self) -> Option<InFlight> {
        let renewed = self.renewed_to_ms.load(Ordering::Acquire);
        self.marker.clone().map(|mut marker| {
            if renewed != 0 {
                marker.lease_deadline_ms = renewed;
            }
            marker
        })
    }

    /// A renewal wrote `deadline_ms` into the marker.
    pub fn renewed(&self, deadline_ms: u64) {
        self.renewed_to_ms.store(deadline_ms, Ordering::Release);
    }
}

impl PartialEq for Written {
    fn eq(&self, other: &Self) -> bool {
        self.marker() == other.marker()
    }
}

impl Eq for Written {}

/// What is stored under a key, as the admin API reports it (docs/behaviour.md §13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    pub record: Record,
    /// When the store drops it, unix ms on the store's clock.
    pub expires_at_ms: u64,
    /// The store's clock when it was read, for judging the lease.
    pub now_ms: u64,
}

/// Which records a listing returns (docs/behaviour.md §24): the three are disjoint, an
/// `outcome-unknown` record is not among the completed ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    InFlight,
    OutcomeUnknown,
    Completed,
}

impl StateFilter {
    pub fn matches(self, record: &Record) -> bool {
        match (self, record) {
            (Self::InFlight, Record::InFlight(_)) => true,
            (Self::OutcomeUnknown, Record::Completed(c)) => c.unknown,
            (Self::Completed, Record::Completed(c)) => !c.unknown,
            _ => false,
        }
    }
}

/// Where a listing goes on (docs/behaviour.md §24); the default starts it. A store uses
/// the parts it needs: the embedded stores and PostgreSQL list in id order and resume
/// `after` a key; Redis resumes a `SCAN` at `scan` on its `node`'th master, past the
/// keys up to `after` of that `SCAN` batch (a page may end inside one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    pub node: u32,
    pub scan: u64,
    pub after: Option<ScopedKey>,
}

/// One page of a listing: at most the limit asked, and where the next one starts
/// (`None` on the last page).
#[derive(Debug, Default)]
pub struct Page {
    pub items: Vec<(ScopedKey, Inspection)>,
    pub next: Option<Cursor>,
}

/// What a purge did (docs/behaviour.md §13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purged {
    /// The record or marker that was there is gone.
    Removed(Record),
    /// A value this version cannot decode (a later format, a damaged one) was removed:
    /// the only way to free a key that such a value blocks (it is never forwarded).
    Unreadable,
    /// An in-flight marker whose lease is live, and no `force`: nothing was changed.
    LiveLease,
    Absent,
}

/// The wall clock in unix milliseconds: what the proxy stamps a completion with, and the
/// clock the Redis store judges leases by.
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}

/// What a [`Store::replace`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaced {
    Done,
    /// Something else is stored there now (resolved or replaced meanwhile): unchanged.
    Changed,
    /// Nothing is stored there (purged, or expired).
    Absent,
}

/// Whether an owner-checked operation found the caller still owning the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Fenced {
    Done,
    /// The marker was gone or held another token: nothing was changed.
    LeaseLost,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the store is full of in-flight markers")]
    Full,
    #[error("the store is unreachable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the store answered something unexpected: {0}")]
    Protocol(&'static str),
    #[error("the store returned a record that cannot be decoded")]
    Corrupt(#[source] crate::idempotency::record::DecodeError),
    /// A sealed record that the keyring of `store.encryption` does not open
    /// (docs/behaviour.md §17): never replayed, never forwarded again.
    #[error("the stored record does not decrypt: {0}")]
    Undecryptable(#[source] Undecryptable),
    /// `store.min_replicas` (docs/behaviour.md §14): the claim was written, but fewer
    /// replicas than asked acknowledged it in time, so a failover could lose it. It must
    /// not be forwarded, whatever `on_unavailable` says, and is released.
    #[error("only {acked} of the {wanted} replicas asked for acknowledged the claim in time")]
    Unreplicated { acked: u32, wanted: u32 },
}

/// The operations the engine needs from a store. Every mutation after a claim is
/// owner-checked against the lease's token.
pub trait Store: Send + Sync + 'static {
    type Watch: Watch;

    /// Atomically: if nothing is stored under the key, write an in-flight marker and
    /// return `Acquired`; otherwise return what is there.
    fn claim(&self, req: ClaimRequest) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Replace the caller's marker with the completed response, kept for `ttl`.
    /// Idempotent: repeating it after it landed (a retry after a timed-out call) is
    /// `Done`; a different record over it is `LeaseLost`.
    fn complete(
        &self,
        lease: &Lease,
        record: Arc<Completed>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Delete the caller's marker so that a retry executes.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Push the caller's lease deadline to `now + lease`.
    fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Replace a marker whose lease ended (still `stale`, the marker the caller read)
    /// with a fresh marker for `req`. `None` when someone else changed the key first.
    /// Its owner token is what counts; a store that compares whole values starts from
    /// the marker's bytes (docs/behaviour.md §23).
    fn take_over(
        &self,
        stale: InFlight,
        req: ClaimRequest,
    ) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;

    /// Subscribes to the next change of `key` (completed, released, taken over). Call it
    /// before re-reading the key, so that a change in between is not missed.
    fn watch(&self, key: ScopedKey)
    -> impl Future<Output = Result<Self::Watch, StoreError>> + Send;

    /// Cheap liveness check for `/readyz`.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The clock the store judges leases and expiry by, in unix ms: what a completion is
    /// stamped with, so that a record's times and its expiry agree.
    fn clock_ms(&self) -> u64 {
        wall_clock_ms()
    }

    /// What is under `key`, unexpired, for the admin API. Reads only.
    fn inspect(
        &self,
        key: ScopedKey,
    ) -> impl Future<Output = Result<Option<Inspection>, StoreError>> + Send;

    /// Records in `state`, unexpired, at most `limit` of them, from `cursor` on
    /// (docs/behaviour.md §24). Reads only, in bounded steps: never a lock or a command
    /// that holds the hot path for the whole store. A record changed while a listing
    /// goes on may be missed or seen twice; one unchanged is listed once.
    fn list(
        &self,
        state: StateFilter,
        cursor: Cursor,
        limit: usize,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// Atomically removes what is under `key`, waking its waiters, unless it is an
    /// in-flight marker whose lease is live and `force` is false. The owner of a marker
    /// removed by force finds its lease lost when it records (fencing).
    fn purge(
        &self,
        key: ScopedKey,
        force: bool,
    ) -> impl Future<Output = Result<Purged, StoreError>> + Send;

    /// Atomically replaces what is under `key` with `new`, or removes it when `None`,
    /// only if it still holds `expected`; a replacement keeps the key's expiry. How an
    /// operator resolves an unknown outcome (docs/behaviour.md §18): a concurrent resolve
    /// or purge is never overwritten.
    fn replace(
        &self,
        key: ScopedKey,
        expected: &Record,
        new: Option<Arc<Completed>>,
    ) -> impl Future<Output = Result<Replaced, StoreError>> + Send;

    /// Adds the store's own metrics (e.g. evictions) to `/metrics`.
    fn register_metrics(&self, _registry: &mut prometheus_client::registry::Registry) {}

    /// Hands over `idemgate_replication_shortfall_total`, which the proxy exports for
    /// every store; only a store with replicas (Redis, `min_replicas`) counts in it.
    fn count_shortfalls_in(&self, _counter: prometheus_client::metrics::counter::Counter) {}
}

/// A subscription to one key's next change, from [`Store::watch`].
pub trait Watch: Send + 'static {
    /// Resolves when the key changed after the subscription was made. May also resolve
    /// spuriously; callers re-read the key either way.
    fn changed(self) -> impl Future<Output = ()> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_gives_the_bytes_of_the_marker_as_last_written() {
        let req = ClaimRequest {
            key: ScopedKey::from_bytes([7; 32]),
            scope: None,
            fingerprint: Fingerprint::from_bytes([1; 32]),
            token: OwnerToken::random(),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(3600),
            streamed: false,
        };
        let encoded = req.marker(1_000).encode();
        let kept = req.lease_encoded(1_000, encoded.clone());
        let made = req.lease(1_000);
        assert_eq!(kept.written.marker_bytes(), Some(encoded.clone()));
        assert_eq!(made.written.marker_bytes(), Some(encoded));
        assert_eq!(kept, made);
        // A renewal moved the deadline inside the marker: the claim's bytes are stale.
        for lease in [&kept, &made] {
            lease.written.renewed(99_000);
            let mut renewed = req.marker(1_000);
            renewed.lease_deadline_ms = 99_000;
            assert_eq!(lease.written.marker_bytes(), Some(renewed.encode()));
        }
        assert_eq!(Written::default().marker_bytes(), None);
    }
}
