//! The owner's side of a claim: forward once, record the outcome, then answer.
//!
//! [`execute`] runs the exchange as part of the request, and on a task of its own if
//! the client goes away first ([`Detached`]): a client that disconnects cancels neither
//! the exchange nor the recording (docs/behaviour.md §4), and a retry always finds the
//! outcome. The outcome is counted there too, through [`finish`], whether or not anyone
//! hears it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_LENGTH, DATE, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use opentelemetry::context::FutureExt as _;
use tokio::time::Instant;

use super::body::{Capped, ProxyBody};
use super::budget::Held;
use super::detach::Detached;
use super::lease::LeaseGuard;
use super::reconcile::{Lookup, Verdict, mark_reconciled};
use super::reply::{
    Counted, IDEMPOTENT_REPLAYED, Reply, abandoned_response, finish, problem_response,
    replay_response, unknown_record,
};
use super::state::{AppState, Live, PolicyId};
use super::upload::{Ending, Upload};
use super::upstream::{self, Failure, upstream_request};
use crate::config::Policy;
use crate::error::ProxyError;
use crate::failpoint;
use crate::idempotency::{
    Completed, Fingerprint, IdempotencyKey, Kept, OnUnknownOutcome, ScopedKey, StoredBody, Streamed,
};
use crate::metrics::{Outcome, Reconciled};
use crate::store::{Lease, Store};
use crate::telemetry::{self, TRACEPARENT, TRACESTATE};

/// A guarded request's body: read whole, or streamed (docs/behaviour.md §19).
#[derive(Debug)]
pub(crate) enum Payload {
    Buffered(Bytes),
    /// Boxed: the buffered requests, the many, move a small `Guarded` around.
    Streamed(Box<Upload>),
}

impl Payload {
    /// Whether the request's fingerprint is the up-front one of a streamed body.
    pub(crate) fn streamed(&self) -> bool {
        matches!(self, Payload::Streamed(_))
    }

    /// The body to forward.
    pub(crate) fn into_body(self) -> ProxyBody {
        match self {
            Payload::Buffered(bytes) => ProxyBody::full(bytes),
            Payload::Streamed(upload) => ProxyBody::Boxed((*upload).boxed_unsync()),
        }
    }
}

/// A request with a valid key, its body read or on its way: what the exchange forwards.
#[derive(Debug)]
pub(crate) struct Guarded {
    pub(crate) scoped: ScopedKey,
    /// The client's key as sent, for a `reconcile` lookup; `None` for a `fingerprint`
    /// key, which the upstream never saw and so cannot be looked up by.
    pub(crate) key: Option<IdempotencyKey>,
    /// How long the record is kept: `ttl`, or a `fingerprint` key's window.
    pub(crate) ttl: Duration,
    /// The fingerprint; of a streamed body, the up-front one.
    pub(crate) fingerprint: Fingerprint,
    pub(crate) parts: Parts,
    pub(crate) body: Payload,
    pub(crate) peer: SocketAddr,
    /// The body's share of `max_buffered_bytes`, given back when the exchange ends.
    pub(crate) held: Held,
}

/// Forwards and records, then answers; finishes on its own if the client goes away.
pub(crate) async fn execute<S: Store>(
    state: &Arc<AppState<S>>,
    live: Arc<Live>,
    id: PolicyId,
    lease: Lease,
    req: Guarded,
) -> Counted {
    let task_state = Arc::clone(state);
    // A traced exchange keeps its request's context on a task of its own too.
    let traced = live.telemetry().and_then(|_| telemetry::current());
    let work = async move {
        failpoint::hit(failpoint::AFTER_CLAIM);
        let result = match traced {
            None => exchange(&task_state, &live, id, lease, req).await,
            Some(cx) => {
                Box::pin(exchange(&task_state, &live, id, lease, req).with_context(cx)).await
            }
        };
        finish(&task_state, result)
    };
    Detached::new(work, state.tasks.clone()).await
}

async fn exchange<S: Store>(
    state: &Arc<AppState<S>>,
    live: &Live,
    id: PolicyId,
    lease: Lease,
    req: Guarded,
) -> Result<Reply, ProxyError> {
    let policy = live.policy(id);
    let mut lease = LeaseGuard::new(state, lease, policy.lease);
    let deadline = Instant::now() + live.config.upstream.timeout;
    // The request body's share of the buffer budget is held until the exchange ends.
    let Guarded {
        fingerprint,
        ttl,
        parts,
        body,
        peer,
        held: _request_held,
        key,
        ..
    } = req;
    // Taken before the request is consumed; only under `record`, where it is used.
    let lookup = match (policy.on_unknown_outcome, &policy.reconcile, key) {
        (OnUnknownOutcome::Record, Some(reconcile), Some(key)) => {
            Some(Lookup::capture(reconcile, key, &parts.headers))
        }
        _ => None,
    };
    // How a streamed body ended, once it has.
    let ending = match &body {
        Payload::Buffered(_) => None,
        Payload::Streamed(upload) => Some(upload.ending()),
    };
    // How the key is settled if the exchange fails.
    let mut settle = Settle {
        policy,
        fingerprint,
        streamed: None,
        ttl,
        lookup,
        peer,
    };
    let request = upstream_request(&live.config.upstream.url, parts, peer, body.into_body());
    let started = Instant::now();
    let sent = lease
        .renewing(upstream::send(live.client(), request, deadline))
        .await;
    // A guarded request never asks for an upgrade: a `101` is a connection that is no
    // longer HTTP after the request was written, which is a reset, and is never joined.
    let sent = sent.and_then(|response| {
        if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            Err(Failure::Unknown {
                cause: crate::error::UnknownCause::Reset,
                source: Some(upstream::UNASKED_SWITCH.into()),
            })
        } else {
            Ok(response)
        }
    });
    let (mut head, body) = match sent {
        Ok(response) => response.into_parts(),
        Err(failure) => {
            state.metrics.observe_upstream(started.elapsed());
            // The client's body was cut short: the upstream request was aborted before it
            // was whole, so it is not the request the key names; nothing is recorded
            // (docs/behaviour.md §19).
            if let Some(cut) = ending.as_ref().and_then(Ending::cut) {
                lease.release().await;
                return Err(cut.error());
            }
            settle.ended(fingerprint, ending.as_ref());
            return Box::pin(failed(state, live, lease, settle, failure)).await;
        }
    };
    // The replay marker is ours to set: an upstream's own must not make a first response
    // look replayed, nor be stored and replayed as if it were.
    head.headers.remove(&IDEMPOTENT_REPLAYED);
    if policy.release_statuses.contains(&head.status) {
        // The upstream refused before doing work; free the key before answering so that
        // an immediate retry executes.
        state.metrics.observe_upstream(started.elapsed());
        lease.release().await;
        let response = Response::from_parts(head, ProxyBody::stream(body));
        return Ok(Reply::new(Outcome::Released, response));
    }
    let mut held = state.budget.counting();
    let read = lease
        .renewing(upstream::read_body(
            body,
            policy.max_response_body,
            deadline,
            &mut held,
        ))
        .await;
    state.metrics.observe_upstream(started.elapsed());
    // An upstream that answered before reading the whole body has its answer recorded
    // under what was known up front (docs/behaviour.md §19).
    settle.ended(fingerprint, ending.as_ref());
    let (stored, to_client) = match read {
        Ok(capped) => kept(capped),
        Err(failure) => return Box::pin(failed(state, live, lease, settle, failure)).await,
    };
    failpoint::hit(failpoint::AFTER_FORWARD);
    let record = Completed {
        streamed: settle.streamed,
        ..Completed::clear(
            settle.fingerprint,
            head.status,
            stored_headers(&head.headers, &[policy]),
            stored,
        )
    };
    let outcome = lease.complete(record, ttl).await;
    failpoint::hit(failpoint::AFTER_RECORD);
    Ok(Reply::new(outcome, Response::from_parts(head, to_client)))
}

/// What is stored of a response body, and what the client gets.
fn kept(capped: Capped<Incoming>) -> (StoredBody, ProxyBody) {
    match capped {
        Capped::Complete(body) => (StoredBody::Stored(body.clone()), ProxyBody::full(body)),
        Capped::Overflow { prefix, rest } => (
            StoredBody::TooLarge,
            ProxyBody::Stream {
                prefix: Some(prefix),
                rest,
            },
        ),
        // `read_body` turns this into a failure; a counting share never refuses.
        Capped::OverBudget => (StoredBody::TooLarge, ProxyBody::empty()),
    }
}

/// What settling a failed exchange needs of it.
struct Settle<'p> {
    policy: &'p Policy,
    /// What the record is stored under: the request's fingerprint, or of a streamed
    /// one, see [`Settle::ended`].
    fingerprint: Fingerprint,
    streamed: Option<Streamed>,
    ttl: Duration,
    lookup: Option<Lookup<'p>>,
    peer: SocketAddr,
}

impl Settle<'_> {
    /// A streamed request's record is stored under its full fingerprint when the body
    /// went by whole, else under the `upfront` one, and only that is compared then
    /// (docs/behaviour.md §19).
    fn ended(&mut self, upfront: Fingerprint, ending: Option<&Ending>) {
        let Some(ending) = ending else { return };
        let (fingerprint, whole) = match ending.whole() {
            Some(full) => (full, true),
            None => (upfront, false),
        };
        self.fingerprint = fingerprint;
        self.streamed = Some(Streamed { upfront, whole });
    }
}

/// The exchange failed: settle the key as its life says (docs/behaviour.md §4), asking
/// the upstream first under `reconcile` (§18), and answer.
///
/// Its callers await it boxed: inline, its future (a reconcile lookup in it) would make
/// every exchange's several KiB larger, all of it moved into the box that [`Detached`]
/// keeps (BENCHMARKS.md, issue 29).
async fn failed<S: Store>(
    state: &Arc<AppState<S>>,
    live: &Live,
    lease: LeaseGuard<S>,
    settle: Settle<'_>,
    failure: Failure,
) -> Result<Reply, ProxyError> {
    let Settle {
        policy,
        fingerprint,
        streamed,
        ttl,
        lookup,
        peer,
    } = settle;
    let err = ProxyError::from(failure);
    match (&err, policy.on_unknown_outcome, lookup) {
        // Never written: nothing happened upstream, so a retry may execute.
        (ProxyError::UpstreamUnreachable(_), _, _) | (_, OnUnknownOutcome::Release, _) => {
            lease.release().await;
        }
        (ProxyError::OutcomeUnknown { .. }, OnUnknownOutcome::Record, Some(lookup)) => {
            let settle = Settle {
                policy,
                fingerprint,
                streamed,
                ttl,
                lookup: None,
                peer,
            };
            match reconciled(state, live, lease, &lookup, &settle).await {
                Ok(settled) => return settled,
                Err(lease) => record_unknown(state, lease, &err, &settle).await,
            }
        }
        // The upstream may have executed it: retries get this same answer.
        (_, OnUnknownOutcome::Record, _) => {
            let settle = Settle {
                policy,
                fingerprint,
                streamed,
                ttl,
                lookup: None,
                peer,
            };
            record_unknown(state, lease, &err, &settle).await;
        }
    }
    Err(err)
}

/// Asks the upstream under `reconcile` (docs/behaviour.md §18) whether the request was
/// executed, and settles the key if it knows: executed, its answer is recorded and sent;
/// not executed, the key is released and the answer is `upstream-unreachable`. Hands the
/// lease back when the upstream cannot say, for `outcome-unknown` to be recorded.
async fn reconciled<S: Store>(
    state: &Arc<AppState<S>>,
    live: &Live,
    mut lease: LeaseGuard<S>,
    lookup: &Lookup<'_>,
    settle: &Settle<'_>,
) -> Result<Result<Reply, ProxyError>, LeaseGuard<S>> {
    let mut held = state.budget.counting();
    let limit = settle.policy.max_response_body;
    let asked = lookup.ask(
        live.client(),
        &live.config.upstream.url,
        settle.peer,
        limit,
        &mut held,
    );
    match lease.renewing(asked).await {
        Verdict::Executed(mut head, capped) => {
            state.metrics.count_reconciliation(Reconciled::Executed);
            tracing::info!(status = %head.status, "reconcile: the upstream executed the request");
            head.headers.remove(&IDEMPOTENT_REPLAYED);
            mark_reconciled(&mut head.headers);
            let (stored, to_client) = kept(capped);
            let headers = stored_headers(&head.headers, &[settle.policy]);
            let record = Completed {
                streamed: settle.streamed,
                ..Completed::clear(settle.fingerprint, head.status, headers, stored)
            };
            let outcome = lease.complete(record, settle.ttl).await;
            Ok(Ok(Reply::new(
                outcome,
                Response::from_parts(head, to_client),
            )))
        }
        Verdict::NotExecuted => {
            state.metrics.count_reconciliation(Reconciled::NotExecuted);
            tracing::info!("reconcile: the upstream did not execute the request; released");
            lease.release().await;
            Ok(Err(ProxyError::UpstreamUnreachable(NOT_EXECUTED.into())))
        }
        Verdict::Unknown => {
            state.metrics.count_reconciliation(Reconciled::Unknown);
            Err(lease)
        }
    }
}

/// Why a request the upstream was sent is answered `upstream-unreachable`.
const NOT_EXECUTED: &str = "the request timed out or was reset, and the reconcile lookup \
                            says the upstream did not execute it";

/// Stores `outcome-unknown` as the key's outcome: retries get this same answer.
async fn record_unknown<S: Store>(
    state: &AppState<S>,
    lease: LeaseGuard<S>,
    err: &ProxyError,
    settle: &Settle<'_>,
) {
    let record = unknown_record(
        &err.problem(),
        &state.config.errors,
        settle.fingerprint,
        settle.streamed,
    );
    // The count is outcome_unknown whether or not the record could be kept.
    let _ = lease.complete(record, settle.ttl).await;
}

/// A crashed owner's marker was taken over under `on_unknown_outcome: record`: under
/// `reconcile`, ask the upstream first, with this retry's key and headers
/// (docs/behaviour.md §18); otherwise, or when it cannot say, store `outcome-unknown` as
/// the key's outcome and answer with it, as a replay.
pub(crate) async fn record_abandoned<S: Store>(
    state: &Arc<AppState<S>>,
    live: &Live,
    policy: &Policy,
    lease: Lease,
    req: Guarded,
) -> Reply {
    let (fingerprint, ttl) = (req.fingerprint, req.ttl);
    // A streamed request's body is never read here: only its up-front fingerprint counts.
    let streamed = req.body.streamed().then_some(Streamed {
        upfront: fingerprint,
        whole: false,
    });
    let mut lease = LeaseGuard::new(state, lease, policy.lease);
    if let (Some(reconcile), Some(key)) = (&policy.reconcile, req.key.clone()) {
        let lookup = Lookup::capture(reconcile, key, &req.parts.headers);
        let settle = Settle {
            policy,
            fingerprint,
            streamed,
            ttl,
            lookup: None,
            peer: req.peer,
        };
        lease = match reconciled(state, live, lease, &lookup, &settle).await {
            Ok(Ok(reply)) => return reply,
            Ok(Err(err)) => {
                let problem = err.problem();
                let response = problem_response(&problem, &state.config.errors);
                return Reply::new(err.outcome(), response);
            }
            Err(lease) => lease,
        };
    }
    let stored = abandoned_response(&state.config.errors);
    let response = replay_response(&stored, policy);
    let record = Completed {
        fingerprint,
        kept: Kept::Clear(stored),
        times: None,
        unknown: true,
        streamed,
    };
    let _ = lease.complete(record, ttl).await;
    Reply::new(Outcome::OutcomeUnknown, response)
}

/// What a record keeps of a response's headers (docs/behaviour.md §4, §17, §25): the
/// end-to-end ones (never the hop-by-hop ones and those `Connection` names, which an
/// upstream's answer has lost already), less `Date` and `Content-Length` (made anew on
/// every replay), the trace context, and what any of `policies` drops from replays
/// (`replay_drop_headers`) or from records (`record_exclude_headers`). One rule for an
/// upstream's answer, under its policy, and for an operator's resolution (§18), under
/// every policy, since a record id does not say which one wrote it.
pub(crate) fn stored_headers(
    headers: &HeaderMap,
    policies: &[&Policy],
) -> Vec<(HeaderName, HeaderValue)> {
    let named = upstream::connection_named(headers);
    // Trace context belongs to the first request's exchange: a replay never carries it
    // (docs/behaviour.md §20).
    let kept = |name: &HeaderName| {
        *name != DATE
            && *name != CONTENT_LENGTH
            && *name != TRACEPARENT
            && *name != TRACESTATE
            && !upstream::is_hop_by_hop(name, &named)
            && policies.iter().all(|policy| {
                !policy.replay_drop_headers.contains(name)
                    && !policy.record_exclude_headers.contains(name)
            })
    };
    headers
        .iter()
        .filter(|(name, _)| kept(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}
