//! The owner's side of a claim: forward once, record the outcome, then answer.
//!
//! This runs in a task of its own, so a client that goes away does not cancel the
//! exchange or the recording (SPEC §4): a retry always finds the outcome.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use http::header::{CONTENT_LENGTH, DATE, HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

use super::body::{Capped, ProxyBody, collect_capped};
use super::detach::Detached;
use super::handler::{Guarded, IDEMPOTENT_REPLAYED, Reply, problem_response};
use super::upstream::{strip_hop_by_hop, upstream_request};
use super::{AppState, PolicyId};
use crate::config::{OnUnknownOutcome, Policy};
use crate::error::{BoxError, ProxyError, UnknownCause};
use crate::failpoint;
use crate::idempotency::{Completed, Fingerprint, StoredBody};
use crate::metrics::{Outcome, StoreOp};
use crate::store::{Fenced, Lease, Store};

/// Runs the exchange as part of this request, detached onto its own task only if the
/// client goes away before it is done.
pub(super) async fn execute<S: Store>(
    state: &Arc<AppState<S>>,
    id: PolicyId,
    lease: Lease,
    req: Guarded,
) -> Reply {
    let task_state = Arc::clone(state);
    let work = async move {
        failpoint::hit(failpoint::AFTER_CLAIM);
        let mut reply = run(&task_state, id, lease, req).await;
        // Counted here: the client may be gone, the outcome is recorded either way.
        task_state.metrics.count(reply.outcome);
        reply.counted = true;
        reply
    };
    Detached::new(work, state.tasks.clone()).await
}

/// Keeps the lease alive while the upstream works.
#[derive(Debug)]
struct Keeper<S> {
    state: Arc<AppState<S>>,
    lease: Lease,
    lease_for: Duration,
    /// When the lease ends unless renewed: the last successful renewal plus `lease`.
    expires: Instant,
    /// When to renew next: `lease/3` after the last attempt.
    next_renewal: Instant,
    lost: bool,
}

impl<S: Store> Keeper<S> {
    /// Takes charge of a lease acquired just now.
    fn new(state: &Arc<AppState<S>>, lease: Lease, lease_for: Duration) -> Self {
        let now = Instant::now();
        Self {
            state: Arc::clone(state),
            lease,
            lease_for,
            expires: now + lease_for,
            next_renewal: now + lease_for / 3,
            lost: false,
        }
    }

    /// Awaits `work` until `deadline`, renewing the lease every `lease/3` meanwhile.
    /// `Err(())` when the deadline passed first. One timer serves both purposes.
    async fn renewing<F: Future>(&mut self, deadline: Instant, work: F) -> Result<F::Output, ()> {
        tokio::pin!(work);
        let wake = |k: &Self| {
            if k.lost {
                deadline
            } else {
                deadline.min(k.next_renewal)
            }
        };
        let timer = tokio::time::sleep_until(wake(self));
        tokio::pin!(timer);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return Ok(out),
                () = &mut timer => {
                    if Instant::now() >= deadline {
                        return Err(());
                    }
                    self.renew().await;
                    timer.as_mut().reset(wake(self));
                }
            }
        }
    }

    async fn renew(&mut self) {
        let asked = Instant::now();
        self.next_renewal = asked + self.lease_for / 3;
        match self
            .state
            .store_call(
                StoreOp::Renew,
                self.state.store.renew(&self.lease, self.lease_for),
            )
            .await
        {
            Ok(Fenced::Done) => self.expires = asked + self.lease_for,
            Ok(Fenced::LeaseLost) => self.lost = true,
            // Tried again at the next period; the lease holds until `expires` meanwhile.
            Err(err) => tracing::warn!(error = %err, "lease renewal failed"),
        }
    }
}

async fn run<S: Store>(
    state: &Arc<AppState<S>>,
    id: PolicyId,
    lease: Lease,
    req: Guarded,
) -> Reply {
    let policy = state.policy(id);
    let mut keeper = Keeper::new(state, lease, policy.lease);
    let deadline = Instant::now() + state.config.upstream.timeout;
    let request = upstream_request(
        &state.config.upstream.url,
        req.parts,
        req.peer,
        ProxyBody::full(req.body),
    );
    let upstream_started = Instant::now();
    let sent = keeper
        .renewing(deadline, state.client.request(request))
        .await;
    if !matches!(sent, Ok(Ok(_))) {
        state.metrics.observe_upstream(upstream_started.elapsed());
    }
    let response = match sent {
        Err(_) => {
            return unknown(keeper, policy, req.fingerprint, UnknownCause::Timeout, None).await;
        }
        Ok(Err(err)) if err.is_connect() => {
            // Never written: nothing happened upstream, so a retry may execute.
            keeper.release().await;
            let err = ProxyError::UpstreamUnreachable(err.into());
            return Reply::new(
                Outcome::UpstreamUnreachable,
                problem_response(&err.problem(), false),
            );
        }
        Ok(Err(err)) => {
            return unknown(
                keeper,
                policy,
                req.fingerprint,
                UnknownCause::Reset,
                Some(err.into()),
            )
            .await;
        }
        Ok(Ok(response)) => response,
    };
    let (mut head, body) = response.into_parts();
    strip_hop_by_hop(&mut head.headers);
    // The replay marker is ours to set: an upstream's own must not make a first response
    // look replayed, nor be stored and replayed as if it were.
    head.headers.remove(&IDEMPOTENT_REPLAYED);
    if policy.release_statuses.contains(&head.status) {
        // The upstream refused before doing work; free the key before answering so that
        // an immediate retry executes.
        state.metrics.observe_upstream(upstream_started.elapsed());
        keeper.release().await;
        return Reply::new(
            Outcome::Released,
            Response::from_parts(head, ProxyBody::stream(body)),
        );
    }
    let collected = keeper
        .renewing(deadline, collect_capped(body, policy.max_response_body))
        .await;
    state.metrics.observe_upstream(upstream_started.elapsed());
    let (stored, to_client) = match collected {
        Err(_) => {
            return unknown(keeper, policy, req.fingerprint, UnknownCause::Timeout, None).await;
        }
        Ok(Err(err)) => {
            return unknown(
                keeper,
                policy,
                req.fingerprint,
                UnknownCause::Reset,
                Some(err.into()),
            )
            .await;
        }
        Ok(Ok(Capped::Complete(body))) => (StoredBody::Stored(body.clone()), ProxyBody::full(body)),
        Ok(Ok(Capped::Overflow { prefix, rest })) => (
            StoredBody::TooLarge,
            ProxyBody::Stream {
                prefix: Some(prefix),
                rest,
            },
        ),
    };
    failpoint::hit(failpoint::AFTER_FORWARD);
    let record = Completed {
        fingerprint: req.fingerprint,
        status: head.status,
        headers: stored_headers(&head.headers, &policy.replay_drop_headers),
        body: stored,
    };
    let outcome = keeper.record(record, policy.ttl).await;
    failpoint::hit(failpoint::AFTER_RECORD);
    Reply::new(outcome, Response::from_parts(head, to_client))
}

/// The upstream may have executed the request but we cannot know its answer.
async fn unknown<S: Store>(
    keeper: Keeper<S>,
    policy: &Policy,
    fingerprint: Fingerprint,
    cause: UnknownCause,
    source: Option<BoxError>,
) -> Reply {
    if let Some(source) = &source {
        tracing::warn!(error = %source, ?cause, "upstream outcome unknown");
    }
    let err = ProxyError::OutcomeUnknown { cause, source };
    let problem = err.problem();
    match policy.on_unknown_outcome {
        OnUnknownOutcome::Release => keeper.release().await,
        OnUnknownOutcome::Record => {
            let record = Completed {
                fingerprint,
                status: problem.status,
                headers: problem.headers(),
                body: StoredBody::Stored(problem.body()),
            };
            // The count is outcome_unknown whether or not the record could be kept.
            let _ = keeper.record(record, policy.ttl).await;
        }
    }
    Reply::new(Outcome::OutcomeUnknown, problem_response(&problem, false))
}

/// A crashed owner's marker was taken over under `on_unknown_outcome: record`: store
/// `outcome-unknown` as the key's outcome and answer with it, as a replay.
pub(super) async fn record_lease_expired<S: Store>(
    state: &Arc<AppState<S>>,
    policy: &Policy,
    lease: Lease,
    fingerprint: Fingerprint,
) -> Result<Reply, ProxyError> {
    let problem = ProxyError::OutcomeUnknown {
        cause: UnknownCause::LeaseExpired,
        source: None,
    }
    .problem();
    let record = Completed {
        fingerprint,
        status: problem.status,
        headers: problem.headers(),
        body: StoredBody::Stored(problem.body()),
    };
    let keeper = Keeper::new(state, lease, policy.lease);
    let _ = keeper.record(record, policy.ttl).await;
    Ok(Reply::new(
        Outcome::OutcomeUnknown,
        problem_response(&problem, true),
    ))
}

impl<S: Store> Keeper<S> {
    /// Records before the answer is sent, consuming the lease. A store failure does not
    /// hold the client back: the recording is retried in the background until the lease
    /// would end (SPEC §5).
    async fn record(self, record: Completed, ttl: Duration) -> Outcome {
        let record = Arc::new(record);
        let state = &self.state;
        match state
            .store_call(
                StoreOp::Complete,
                state.store.complete(&self.lease, Arc::clone(&record), ttl),
            )
            .await
        {
            Ok(Fenced::Done) => Outcome::Forwarded,
            Ok(Fenced::LeaseLost) => lease_lost(),
            Err(err) => {
                tracing::warn!(error = %err, "recording failed; retrying in the background");
                let tasks = state.tasks.clone();
                tasks.spawn(self.retry_record(record, ttl));
                Outcome::Forwarded
            }
        }
    }

    async fn retry_record(self, record: Arc<Completed>, ttl: Duration) {
        let mut pause = Duration::from_millis(50);
        loop {
            if Instant::now() + pause >= self.expires {
                tracing::error!(
                    "recording failed until the lease ended; the key will answer outcome-unknown"
                );
                self.state.metrics.record_lost();
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
            self.state.metrics.record_retry();
            match self
                .state
                .store_call(
                    StoreOp::Complete,
                    self.state
                        .store
                        .complete(&self.lease, Arc::clone(&record), ttl),
                )
                .await
            {
                Ok(Fenced::Done) => {
                    self.state.metrics.late_record();
                    return;
                }
                // The request was counted when it was answered; this is about the record.
                Ok(Fenced::LeaseLost) => {
                    self.state.metrics.record_lost();
                    let _ = lease_lost();
                    return;
                }
                Err(err) => tracing::debug!(error = %err, "recording retry failed"),
            }
        }
    }

    /// Frees the key so that a retry executes, consuming the lease.
    async fn release(self) {
        let state = &self.state;
        match state
            .store_call(StoreOp::Release, state.store.release(&self.lease))
            .await
        {
            Ok(Fenced::Done) => {}
            Ok(Fenced::LeaseLost) => tracing::warn!("claim already lost when releasing it"),
            Err(err) => {
                tracing::warn!(error = %err, "releasing a claim failed; retrying in the background");
                super::handler::release_in_background(&self.state, self.lease, self.lease_for);
            }
        }
    }
}

fn lease_lost() -> Outcome {
    tracing::warn!("claim lost before the response was recorded; the response was not stored");
    Outcome::LeaseLost
}

/// What is kept of the upstream's headers: end-to-end ones (hop-by-hop are already
/// gone), minus `replay_drop_headers`; `Date` and `Content-Length` are made anew.
fn stored_headers(headers: &HeaderMap, drop: &[HeaderName]) -> Vec<(HeaderName, HeaderValue)> {
    headers
        .iter()
        .filter(|(name, _)| **name != DATE && **name != CONTENT_LENGTH && !drop.contains(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}
