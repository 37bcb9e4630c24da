//! Claiming a key (docs/behaviour.md §4): claim, [`decide`] on what is there, wait or
//! take over, and again, until this request owns the key, has a record to replay, or is
//! refused.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::KeyValue;
use tokio::time::Instant;

use super::lease::{Job, in_background, stamped};
use super::reply::abandoned_record;
use super::state::AppState;
use crate::config::Policy;
use crate::error::ProxyError;
use crate::idempotency::fingerprint::FingerprintRules;
use crate::idempotency::rules::Rules;
use crate::idempotency::{
    AfterTakeOver, Completed, Decision, Fingerprint, InFlight, OwnerToken, Record, ScopeId,
    ScopedKey, Streamed, decide,
};
use crate::store::{Claim, ClaimRequest, Lease, Opened, Store, StoreError, Watch};
use crate::telemetry;

/// How a claim ended, short of an error.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// The key is ours: forward, then record.
    Owned(Lease),
    /// A crashed owner's marker, taken over under `on_unknown_outcome: record`: what
    /// happened upstream is unknown, and that is the key's outcome.
    Abandoned(Lease),
    /// A completed response, to send again.
    Replay(Opened),
    /// A completed streamed request whose up-front fingerprint is this request's: its
    /// body decides, read to the end, then [`compared`] (docs/behaviour.md §19).
    Compare(Arc<Completed>),
    /// The store did not answer the first claim, so nothing is known of the key:
    /// `on_unavailable` decides. Never after the key was seen held: see [`claim`].
    Unavailable(StoreError),
}

/// A take-over can lose a race with another request; the key has then moved on and a
/// fresh claim sees its new state. A few rounds settle any but a pathological race.
const TAKE_OVER_RACES: u32 = 3;

/// What it takes to fingerprint a request again, under the rules of the record its key
/// found (docs/behaviour.md §24): its head, and its body, or a streamed body's declared
/// length.
pub(crate) struct Again<'a> {
    pub(crate) parts: &'a http::request::Parts,
    pub(crate) body: AgainBody<'a>,
}

pub(crate) enum AgainBody<'a> {
    Buffered(&'a Bytes),
    /// Streamed: the up-front fingerprint, with the body's `Content-Length` if any.
    Streamed(Option<u64>),
}

impl Again<'_> {
    fn under(&self, rules: &FingerprintRules<'_>) -> Fingerprint {
        let parts = self.parts;
        let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        match self.body {
            AgainBody::Buffered(bytes) => {
                Fingerprint::new(&parts.method, pq, &parts.headers, rules, bytes)
            }
            AgainBody::Streamed(declared) => {
                Fingerprint::upfront(&parts.method, pq, &parts.headers, rules, declared)
            }
        }
    }

    fn streamed(&self) -> bool {
        matches!(self.body, AgainBody::Streamed(_))
    }
}

/// Claims `key` for a request fingerprinted as `fingerprint`. When the record found was
/// made under other fingerprint rules, the request is fingerprinted again under them
/// (`again`) and compared with that; `fingerprint` is then that one, and whatever this
/// request writes keeps those rules (docs/behaviour.md §24).
pub(crate) async fn claim<S: Store>(
    state: &Arc<AppState<S>>,
    policy: &Policy,
    (key, scope): (ScopedKey, Option<ScopeId>),
    (fingerprint, again): (&mut Fingerprint, &Again<'_>),
    ttl: Duration,
) -> Result<Claimed, ProxyError> {
    let streamed = again.streamed();
    let mut waiter = Waiter::default();
    let mut races = 0;
    // Whether the store has shown this key held (a marker to wait on or to take over).
    // From then on the store going away is a refusal: forwarding unguarded under
    // `pass_through` would knowingly execute the key a second time.
    let mut seen = false;
    loop {
        let mut claim = ClaimRequest {
            key,
            scope,
            fingerprint: *fingerprint,
            token: OwnerToken::random(),
            lease: policy.lease,
            ttl,
            streamed,
        };
        let (record, now_ms) = match state.store.claim(claim).await {
            Ok(Claim::Acquired(lease)) => return Ok(Claimed::Owned(lease)),
            Ok(Claim::Existing { record, now_ms }) => (record, now_ms),
            Err(err) => {
                // Timed out: our marker may have been written all the same. Unreplicated:
                // it was, and is not to be forwarded (docs/behaviour.md §14).
                if matches!(
                    err,
                    StoreError::Timeout(_) | StoreError::Unreplicated { .. }
                ) {
                    orphaned(state, policy, claim, Job::Release);
                }
                if seen {
                    return Err(ProxyError::StoreUnavailable(err));
                }
                return Ok(Claimed::Unavailable(err));
            }
        };
        seen = true;
        // A sealed record is opened before anything reads what it keeps in clear (its
        // fingerprint, its flags): one altered at rest does not open, and is refused
        // whatever those fields say (docs/behaviour.md §25). Opened once: a replay
        // below finds its response kept.
        if let Record::Completed(completed) = &record {
            opened(state, key, Arc::clone(completed))?;
        }
        if let Some(rules) = other_rules(&record, fingerprint) {
            *fingerprint = again.under(&rules.as_rules());
            claim.fingerprint = *fingerprint;
        }
        let decision = decide(
            &record,
            fingerprint,
            streamed,
            now_ms,
            policy.on_concurrent,
            policy.on_unknown_outcome,
        );
        match decision {
            Decision::Replay(completed) => {
                return opened(state, key, completed).map(Claimed::Replay);
            }
            Decision::Compare(completed) => return Ok(Claimed::Compare(completed)),
            Decision::Reject(rejection) => return Err(rejection.into()),
            Decision::Wait {
                lease_left,
                retry_after,
            } => {
                waiter
                    .wait(state, policy, key, (lease_left, retry_after))
                    .await?;
            }
            Decision::TakeOver { stale, then } => {
                telemetry::event("idempotency.take_over", || {
                    let then = match then {
                        AfterTakeOver::Forward => "forward",
                        AfterTakeOver::RecordUnknown => "record_unknown",
                    };
                    vec![KeyValue::new("idempotency.then", then)]
                });
                match take_over(state, policy, stale, claim, then).await? {
                    Some(claimed) => return Ok(claimed),
                    None if races < TAKE_OVER_RACES => races += 1,
                    // The markers seen had expired: no lease to wait out.
                    None => return Err(in_flight(TAKE_OVER_LOST)),
                }
            }
        }
    }
}

/// The rules `record` was made under, when they are not those that made `fingerprint`:
/// `None` for a record that predates kept rules, compared under the rules in force.
fn other_rules(record: &Record, fingerprint: &Fingerprint) -> Option<Rules> {
    let kept = match record {
        Record::InFlight(marker) => marker.fingerprint.rules(),
        Record::Completed(completed) => completed.fingerprint.rules(),
    }?;
    // Interned: the same rules are the same allocation.
    let same = fingerprint
        .rules()
        .is_some_and(|ours| std::ptr::eq(ours, kept));
    (!same).then_some(kept)
}

/// The response of a record to replay: opened when it is sealed
/// (docs/behaviour.md §17). One that does not open is never replayed and never
/// forwarded again: `503`.
fn opened<S: Store>(
    state: &AppState<S>,
    key: ScopedKey,
    completed: Arc<Completed>,
) -> Result<Opened, ProxyError> {
    state
        .open(&key, completed)
        .map_err(|err| ProxyError::StoreUnavailable(StoreError::Undecryptable(err)))
}

/// The record of [`Claimed::Compare`], now that the request's body hashed to `full`:
/// opened to replay when it is the same request, else refused (docs/behaviour.md §19).
pub(crate) fn compared<S: Store>(
    state: &AppState<S>,
    key: ScopedKey,
    completed: Arc<Completed>,
    full: &Fingerprint,
) -> Result<Opened, ProxyError> {
    crate::idempotency::compared(&completed, full)?;
    opened(state, key, completed)
}

/// The `Retry-After` of a take-over that kept losing races (docs/behaviour.md §18): the
/// markers it saw had expired, so there is no lease or run to wait out.
const TAKE_OVER_LOST: Duration = Duration::from_secs(1);

/// `409 in-flight`, its `Retry-After` as [`retry_after`] computed it from the holder's
/// marker (docs/behaviour.md §25).
fn in_flight(retry_after: Duration) -> ProxyError {
    ProxyError::InFlight { retry_after }
}

/// Replaces a crashed owner's marker with ours. `None` when another request changed the
/// key first.
async fn take_over<S: Store>(
    state: &Arc<AppState<S>>,
    policy: &Policy,
    stale: InFlight,
    claim: ClaimRequest,
    then: AfterTakeOver,
) -> Result<Option<Claimed>, ProxyError> {
    match state.store.take_over(stale, claim).await {
        Ok(Some(lease)) => Ok(Some(match then {
            AfterTakeOver::Forward => Claimed::Owned(lease),
            AfterTakeOver::RecordUnknown => Claimed::Abandoned(lease),
        })),
        Ok(None) => Ok(None),
        Err(err) => {
            if matches!(
                err,
                StoreError::Timeout(_) | StoreError::Unreplicated { .. }
            ) {
                // Our marker may be there (or is, but not on enough replicas): finish what the take-over was for, so that
                // the key does not wait out a lease nobody holds. Under `release` the
                // key is freed; under `record` the unknown outcome is recorded, never
                // freed (the crashed owner may have executed the request).
                orphaned(state, policy, claim, |lease| match then {
                    AfterTakeOver::Forward => Job::Release(lease),
                    AfterTakeOver::RecordUnknown => Job::Record {
                        record: Arc::new(state.seal(
                            &lease.key,
                            stamped(
                                abandoned_record(
                                    &state.config.errors,
                                    claim.fingerprint,
                                    claim.streamed.then_some(Streamed {
                                        upfront: claim.fingerprint,
                                        whole: false,
                                    }),
                                ),
                                &lease,
                                lease.claimed_at_ms,
                            ),
                        )),
                        lease,
                        ttl: claim.ttl,
                    },
                });
            }
            // The key is known to be taken: forwarding it unguarded (`pass_through`)
            // would knowingly execute it twice.
            Err(ProxyError::StoreUnavailable(err))
        }
    }
}

/// Orphaned claims (docs/behaviour.md §8): a call that timed out may still have been
/// written. Once the store answers again, `job` settles the marker if it is still ours.
fn orphaned<S: Store>(
    state: &Arc<AppState<S>>,
    policy: &Policy,
    claim: ClaimRequest,
    job: impl FnOnce(Lease) -> Job,
) {
    // The claim's own time is unknown (its call timed out): now is close to it.
    let lease = claim.lease(state.store.clock_ms());
    in_background(state, job(lease), Instant::now() + policy.lease);
}

/// `on_concurrent: wait`: subscribed before the key is read again, and waiting until
/// one deadline however many times the key is looked at.
struct Waiter<W> {
    watch: Option<W>,
    deadline: Option<Instant>,
}

impl<W> Default for Waiter<W> {
    fn default() -> Self {
        Self {
            watch: None,
            deadline: None,
        }
    }
}

impl<W: Watch> Waiter<W> {
    /// Subscribes on the first call (the caller then claims again); waits for a change
    /// on the next ones. `retry_after` is what the duplicate is told if its wait ends
    /// with the key still held.
    async fn wait<S: Store<Watch = W>>(
        &mut self,
        state: &AppState<S>,
        policy: &Policy,
        key: ScopedKey,
        (lease_left, retry_after): (Duration, Duration),
    ) -> Result<(), ProxyError> {
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + policy.wait_timeout);
        match self.watch.take() {
            // Another request holds this key: forwarding it unguarded (pass_through)
            // would knowingly execute it twice.
            None => {
                let watch = state
                    .store
                    .watch(key)
                    .await
                    .map_err(ProxyError::StoreUnavailable)?;
                self.watch = Some(watch);
            }
            Some(watch) => {
                if Instant::now() >= deadline {
                    // As the claim just before this call saw the holder.
                    return Err(in_flight(retry_after));
                }
                // A crashed owner never says it is done: look again when its lease ends.
                let wake = deadline.min(Instant::now() + lease_left);
                telemetry::event("idempotency.wait", || {
                    let ms = i64::try_from(lease_left.as_millis()).unwrap_or(i64::MAX);
                    vec![KeyValue::new("idempotency.lease_left_ms", ms)]
                });
                let _waiting = state.metrics.track_waiting();
                let _ = tokio::time::timeout_at(wake, watch.changed()).await;
            }
        }
        Ok(())
    }
}
