//! One request, start to end. [`handle`] turns errors into problem answers, counts and
//! logs; the inner functions use `?` and read top to bottom like SPEC §2–§4.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Request, Response};
use hyper::body::Incoming;

use super::body::{Capped, ProxyBody, collect_capped};
use super::upstream::{strip_hop_by_hop, upstream_request};
use super::{AppState, PolicyId, exchange};
use crate::config::OnUnavailable;
use crate::error::{Problem, ProxyError, UnknownCause};
use crate::idempotency::key::parse_key;
use crate::idempotency::{
    AfterTakeOver, Completed, Decision, Fingerprint, OwnerToken, ScopedKey, StoredBody, decide,
};
use crate::metrics::{Outcome, StoreOp};
use crate::store::{Claim, ClaimRequest, Fenced, Lease, Store, StoreError, Watch};

pub(crate) static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A finished answer and how it came about.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) outcome: Outcome,
    pub(crate) response: Response<ProxyBody>,
    /// Already counted by the task that produced it (which outlives the client).
    pub(crate) counted: bool,
}

impl Reply {
    pub(crate) fn new(outcome: Outcome, response: Response<ProxyBody>) -> Self {
        Self {
            outcome,
            response,
            counted: false,
        }
    }
}

/// The service function: never fails, every error becomes a problem answer.
pub async fn handle<S: Store>(
    state: Arc<AppState<S>>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<ProxyBody> {
    let _in_flight = state.metrics.track_in_flight();
    // What the access line needs (clock read included) is taken only when that line is
    // written.
    let access = tracing::enabled!(target: "idemgate::access", tracing::Level::INFO).then(|| {
        (
            Instant::now(),
            req.method().clone(),
            req.uri().path().to_owned(),
        )
    });
    let mut scoped_key = None;
    let reply = match route(&state, req, peer, &mut scoped_key).await {
        Ok(reply) => reply,
        Err(err) => {
            let outcome = outcome_of(&err);
            if matches!(
                outcome,
                Outcome::StoreUnavailable | Outcome::OutcomeUnknown | Outcome::UpstreamUnreachable
            ) {
                tracing::warn!(error = %err, source = ?std::error::Error::source(&err).map(ToString::to_string), "request failed");
            }
            Reply::new(outcome, problem_response(&err.problem(), false))
        }
    };
    if !reply.counted {
        state.metrics.count(reply.outcome);
    }
    // One line per request. The key appears only as a short prefix of its scoped hash:
    // enough to correlate retries, never the raw key or a credential.
    if let Some((started, method, path)) = access {
        tracing::info!(
            target: "idemgate::access",
            %method,
            path,
            status = reply.response.status().as_u16(),
            outcome = reply.outcome.as_str(),
            latency_ms = started.elapsed().as_secs_f64() * 1000.0,
            key = scoped_key.as_ref().map_or_else(String::new, |k: &ScopedKey| k.to_hex()[..12].to_owned()),
        );
    }
    reply.response
}

/// Which of the ways of SPEC §2 a request takes.
async fn route<S: Store>(
    state: &Arc<AppState<S>>,
    req: Request<Incoming>,
    peer: SocketAddr,
    scoped_key: &mut Option<ScopedKey>,
) -> Result<Reply, ProxyError> {
    let id = state.policy_id(req.uri().path());
    let policy = state.policy(id);
    if !policy.enabled || !policy.methods.contains(req.method()) {
        return pass_through(state, req, peer).await;
    }
    let Some(key) = parse_key(req.headers(), &policy.header).map_err(ProxyError::InvalidKey)?
    else {
        if policy.required {
            return Err(ProxyError::MissingKey {
                header: policy.header.clone(),
            });
        }
        return pass_through(state, req, peer).await;
    };
    let scoped = ScopedKey::new(req.headers(), &policy.scope_headers, &key);
    *scoped_key = Some(scoped);
    let limit = policy.max_request_body;
    if content_length(req.headers()).is_some_and(|len| len > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let (parts, body) = req.into_parts();
    // A guarded body is buffered before anything is claimed; a client that trickles it
    // gets as long as the upstream would, then 408, holding no claim.
    let read = tokio::time::timeout(state.config.upstream.timeout, collect_capped(body, limit));
    let body = match read
        .await
        .map_err(|_| ProxyError::BodyTimeout)?
        .map_err(ProxyError::BadRequestBody)?
    {
        Capped::Complete(body) => body,
        Capped::Overflow { .. } => return Err(ProxyError::BodyTooLarge { limit }),
    };
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let fingerprint = Fingerprint::new(
        &parts.method,
        pq,
        &parts.headers,
        &policy.fingerprint_headers,
        &body,
    );
    guarded(
        state,
        id,
        Guarded {
            scoped,
            fingerprint,
            parts,
            body,
            peer,
        },
    )
    .await
}

/// A buffered request with a valid key, ready to claim.
#[derive(Debug)]
pub(crate) struct Guarded {
    pub(crate) scoped: ScopedKey,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) parts: Parts,
    pub(crate) body: Bytes,
    pub(crate) peer: SocketAddr,
}

/// Claims the key and follows the decision table.
async fn guarded<S: Store>(
    state: &Arc<AppState<S>>,
    id: PolicyId,
    req: Guarded,
) -> Result<Reply, ProxyError> {
    let policy = state.policy(id);
    let in_flight = || ProxyError::InFlight {
        retry_after: Duration::from_secs(1),
    };
    // `on_concurrent: wait`: subscribed before the key is read again, and waited on
    // until this deadline.
    let mut watch: Option<S::Watch> = None;
    let mut wait_until: Option<tokio::time::Instant> = None;
    // A take-over can lose a race with another request; the key has then moved on and
    // a fresh claim sees its new state. A few rounds settle any but a pathological race.
    let mut races = 0;
    loop {
        let claim = ClaimRequest {
            key: req.scoped,
            fingerprint: req.fingerprint,
            token: OwnerToken::random(),
            lease: policy.lease,
            ttl: policy.ttl,
        };
        let (record, now_ms) = match state
            .store_call(StoreOp::Claim, state.store.claim(claim))
            .await
        {
            Ok(Claim::Acquired(lease)) => return Ok(exchange::execute(state, id, lease, req).await),
            Ok(Claim::Existing { record, now_ms }) => (record, now_ms),
            Err(err) => {
                if matches!(err, StoreError::Timeout(_)) {
                    release_in_background(
                        state,
                        Lease {
                            key: claim.key,
                            token: claim.token,
                        },
                        policy.lease,
                    );
                }
                return store_unavailable(state, err, req).await;
            }
        };
        match decide(
            &record,
            &req.fingerprint,
            now_ms,
            policy.on_concurrent,
            policy.on_unknown_outcome,
        ) {
            Decision::Replay(completed) => {
                return Ok(Reply::new(Outcome::Replayed, replay_response(&completed)));
            }
            Decision::Reject(rejection) => return Err(rejection.into()),
            Decision::Wait { lease_left } => {
                let deadline = *wait_until
                    .get_or_insert_with(|| tokio::time::Instant::now() + policy.wait_timeout);
                match watch.take() {
                    None => match state
                        .store_call(StoreOp::Watch, state.store.watch(req.scoped))
                        .await
                    {
                        Ok(w) => watch = Some(w),
                        // Another request holds this key: forwarding it unguarded
                        // (pass_through) would knowingly execute it twice.
                        Err(err) => return Err(ProxyError::StoreUnavailable(err)),
                    },
                    Some(w) => {
                        if tokio::time::Instant::now() >= deadline {
                            return Err(in_flight());
                        }
                        // A crashed owner never says it is done: look again when its lease ends.
                        let wake = deadline.min(tokio::time::Instant::now() + lease_left);
                        let _waiting = state.metrics.track_waiting();
                        let _ = tokio::time::timeout_at(wake, w.changed()).await;
                    }
                }
            }
            Decision::TakeOver { stale, then } => {
                let lease = match state
                    .store_call(StoreOp::TakeOver, state.store.take_over(stale, claim))
                    .await
                {
                    Ok(Some(lease)) => lease,
                    Ok(None) if races < 3 => {
                        races += 1;
                        continue;
                    }
                    Ok(None) => return Err(in_flight()),
                    // As above: the key is known to be taken.
                    Err(err) => return Err(ProxyError::StoreUnavailable(err)),
                };
                return match then {
                    AfterTakeOver::Forward => Ok(exchange::execute(state, id, lease, req).await),
                    AfterTakeOver::RecordUnknown => {
                        exchange::record_lease_expired(state, policy, lease, req.fingerprint).await
                    }
                };
            }
        }
    }
}

/// SPEC §8 "Orphaned claims": a claim that timed out may still have been written, and
/// a release that failed left its marker. Once the store answers again, remove it if it
/// is still ours, so that a request that never executed is not mistaken for a crashed
/// owner (which would turn the key into `outcome-unknown`). Best effort, for `lease`.
pub(super) fn release_in_background<S: Store>(
    state: &Arc<AppState<S>>,
    lease: Lease,
    lease_for: Duration,
) {
    let state = Arc::clone(state);
    let give_up = tokio::time::Instant::now() + lease_for;
    state.tasks.clone().spawn(async move {
        let mut pause = Duration::from_millis(50);
        while tokio::time::Instant::now() < give_up {
            match state
                .store_call(StoreOp::Release, state.store.release(&lease))
                .await
            {
                Ok(Fenced::Done) => {
                    state.metrics.orphan_released();
                    return;
                }
                // Never written, or already gone.
                Ok(Fenced::LeaseLost) => return,
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    });
}

/// The store failed: `on_unavailable` decides.
async fn store_unavailable<S: Store>(
    state: &Arc<AppState<S>>,
    err: StoreError,
    req: Guarded,
) -> Result<Reply, ProxyError> {
    match state.config.store.on_unavailable {
        // A memory store full of in-flight markers is working, not down: forwarding
        // unguarded would let duplicates of those very requests through (SPEC §8).
        _ if matches!(err, StoreError::Full) => Err(ProxyError::StoreUnavailable(err)),
        OnUnavailable::Reject => Err(ProxyError::StoreUnavailable(err)),
        OnUnavailable::PassThrough => {
            tracing::warn!(error = %err, "store unavailable: forwarding without idempotency");
            let response =
                forward_unguarded(state, req.parts, ProxyBody::full(req.body), req.peer).await?;
            Ok(Reply::new(Outcome::StoreBypassed, response))
        }
    }
}

/// Streams a request to the upstream and its answer back, with no store access.
async fn pass_through<S: Store>(
    state: &Arc<AppState<S>>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Reply, ProxyError> {
    let (parts, body) = req.into_parts();
    let response = forward_unguarded(state, parts, ProxyBody::stream(body), peer).await?;
    Ok(Reply::new(Outcome::Passthrough, response))
}

async fn forward_unguarded<S: Store>(
    state: &Arc<AppState<S>>,
    parts: Parts,
    body: ProxyBody,
    peer: SocketAddr,
) -> Result<Response<ProxyBody>, ProxyError> {
    let request = upstream_request(&state.config.upstream.url, parts, peer, body);
    let started = Instant::now();
    let sent =
        tokio::time::timeout(state.config.upstream.timeout, state.client.request(request)).await;
    state.metrics.observe_upstream(started.elapsed());
    match sent {
        Err(_) => Err(ProxyError::OutcomeUnknown {
            cause: UnknownCause::Timeout,
            source: None,
        }),
        Ok(Err(err)) if err.is_connect() => Err(ProxyError::UpstreamUnreachable(err.into())),
        Ok(Err(err)) => Err(ProxyError::OutcomeUnknown {
            cause: UnknownCause::Reset,
            source: Some(err.into()),
        }),
        Ok(Ok(response)) => {
            let (mut head, body) = response.into_parts();
            strip_hop_by_hop(&mut head.headers);
            Ok(Response::from_parts(head, ProxyBody::stream(body)))
        }
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// A stored response, sent again. `Date` and `Content-Length` are made anew by hyper.
pub(crate) fn replay_response(completed: &Completed) -> Response<ProxyBody> {
    let body = match &completed.body {
        StoredBody::Stored(body) => ProxyBody::full(body.clone()),
        StoredBody::TooLarge => ProxyBody::empty(),
    };
    let mut response = Response::new(body);
    *response.status_mut() = completed.status;
    let headers = response.headers_mut();
    for (name, value) in &completed.headers {
        headers.append(name, value.clone());
    }
    headers.insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// A problem answer; `replayed` when it comes from a stored record.
pub(crate) fn problem_response(problem: &Problem, replayed: bool) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(problem.body()));
    *response.status_mut() = problem.status;
    let headers = response.headers_mut();
    for (name, value) in problem.headers() {
        headers.append(name, value);
    }
    if replayed {
        headers.insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// The metric label of each error. Exhaustive, like the status table.
fn outcome_of(err: &ProxyError) -> Outcome {
    match err {
        ProxyError::MissingKey { .. } => Outcome::MissingKey,
        ProxyError::InvalidKey(_) => Outcome::InvalidKey,
        ProxyError::InFlight { .. } => Outcome::InFlight,
        ProxyError::NotReplayable => Outcome::NotReplayable,
        ProxyError::BodyTooLarge { .. } => Outcome::TooLarge,
        ProxyError::BadRequestBody(_) | ProxyError::BodyTimeout => Outcome::BadRequest,
        ProxyError::KeyReused => Outcome::KeyReused,
        ProxyError::UpstreamUnreachable(_) => Outcome::UpstreamUnreachable,
        ProxyError::OutcomeUnknown { .. } => Outcome::OutcomeUnknown,
        ProxyError::StoreUnavailable(_) => Outcome::StoreUnavailable,
    }
}
