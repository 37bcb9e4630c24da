//! The handler's side of a streamed body (docs/behaviour.md §19): a guarded body too
//! large to buffer is fingerprinted by what is known up front and claimed, then
//! forwarded as an [`Upload`]; a retry of a completed streamed request reads its body
//! here, to compare it with the record.

use std::net::SocketAddr;
use std::sync::Arc;

use http::Request;
use http::request::Parts;
use http_body_util::BodyExt;

use super::authorize::{self, Retry};
use super::body::{RequestBody, StallGuard, Stalled};
use super::claim;
use super::exchange::{Guarded, Payload};
use super::reply::Reply;
use super::state::{AppState, Live};
use super::upload::{self, Cut, Upload};
use crate::config::Policy;
use crate::error::{BoxError, ProxyError};
use crate::idempotency::source::KeySource;
use crate::idempotency::{Completed, Fingerprint, IdempotencyKey};
use crate::principal::Principal;
use crate::store::Store;

/// A retry of a completed streamed request (docs/behaviour.md §19): its body is read to
/// the end, hashed and discarded, then it replays the record or is refused.
pub(super) async fn compare<S: Store>(
    state: &AppState<S>,
    live: &Live,
    policy: &Policy,
    req: Guarded,
    completed: Arc<Completed>,
) -> Result<Reply, ProxyError> {
    // Only a streamed request is sent to compare its body; a buffered one never has the
    // fingerprint of a streamed record.
    let Payload::Streamed(upload) = req.body else {
        return Err(ProxyError::KeyReused);
    };
    let full = tokio::time::timeout(live.config.upstream.timeout, (*upload).drain())
        .await
        .map_err(|_| ProxyError::BodyTimeout)?
        .map_err(Cut::error)?;
    let opened = claim::compared(state, req.scoped, completed, &full)?;
    authorize::replay(
        state,
        live,
        policy,
        Retry {
            parts: &req.parts,
            scoped: &req.scoped,
            peer: req.peer,
        },
        opened.response(),
    )
    .await
}

/// A guarded body too large to buffer, about to be streamed (docs/behaviour.md §19).
pub(super) struct Streaming {
    pub(super) parts: Parts,
    pub(super) body: upload::Parts,
}

/// A body whose `Content-Length` is over `max_request_body`, streamed from its first
/// byte, up to `max_streamed_body` (docs/behaviour.md §19).
pub(super) fn streaming<S: Store, B: RequestBody>(
    state: &AppState<S>,
    live: &Live,
    policy: &Policy,
    req: Request<B>,
    length: Option<u64>,
) -> Result<Streaming, ProxyError> {
    let limit = policy.max_streamed_body;
    if length.is_some_and(|len| len > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let (parts, body) = req.into_parts();
    let body = StallGuard::new(body, live.config.listen_body_timeout);
    let body = upload::Parts {
        prefix: None,
        rest: body.map_err(boxed_stall).boxed_unsync(),
        declared: length,
        limit,
        held: state.budget.counting(),
    };
    Ok(Streaming { parts, body })
}

/// A stalled body's error, its cause boxed.
pub(super) fn boxed_stall<E: Into<BoxError>>(err: Stalled<E>) -> Stalled<BoxError> {
    match err {
        Stalled::Stalled => Stalled::Stalled,
        Stalled::Body(err) => Stalled::Body(err.into()),
    }
}

/// Addresses a streamed request and fingerprints what is known of it up front: method,
/// target, `fingerprint_headers` and declared length (docs/behaviour.md §19). The body
/// is hashed as it goes by.
pub(super) fn guard_streamed<S: Store>(
    state: &AppState<S>,
    policy: &Policy,
    streaming: Streaming,
    peer: SocketAddr,
    principal: Option<&Principal>,
    source: &KeySource,
    key: IdempotencyKey,
) -> Guarded {
    let Streaming { parts, body } = streaming;
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let fingerprint = Fingerprint::upfront(
        &parts.method,
        pq,
        &parts.headers,
        &policy.fingerprint_rules(),
        body.declared,
    );
    let scoped = policy.address(&parts.headers, principal, source, &key);
    Guarded {
        scoped,
        key: Some(key),
        ttl: policy.record_ttl(source),
        fingerprint,
        parts,
        body: Payload::Streamed(Box::new(Upload::new(body, &fingerprint))),
        peer,
        // The upload holds its own share, as its bytes go by.
        held: state.budget.counting(),
    }
}
