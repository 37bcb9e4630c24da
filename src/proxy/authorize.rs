//! `replay_authorization` (docs/behaviour.md §24): before an answer built from a
//! completed record goes to a retry, ask whether the retry's credentials still pass. A
//! first execution is authorized by the upstream itself; a replay never reaches it, so a
//! revoked credential would otherwise read the stored answer for the record's whole
//! `ttl`.
//!
//! One request per replay, through a pooled client: the route's upstream client for
//! `path`, the authorizers' client for `url`. It carries the listed headers of the
//! retry, never its body nor its idempotency key.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;

use super::body::{Capped, ProxyBody};
use super::budget::Budget;
use super::reply::{Reply, replay_response};
use super::state::{AppState, Live};
use super::upstream::{self, UpstreamClient, upstream_request};
use crate::config::{AuthorizerTarget, Policy, ReplayAuthorization};
use crate::error::{BoxError, ProxyError};
use crate::idempotency::source::KeySource;
use crate::idempotency::{ScopedKey, StoredResponse};
use crate::metrics::{Authorized, Outcome};

static X_IDEMPOTENCY_RECORD: HeaderName = HeaderName::from_static("x-idempotency-record");
static X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");

/// The most of a refusal's body passed to the client, and the most read of any answer.
const MAX_BODY: u64 = 64 * 1024;

/// The replay of `stored` to `req`, once the policy's `replay_authorization`, if any,
/// allowed it; its refusal (`401`/`403`, passed on) otherwise, or `503
/// authorization-unavailable` when it could not decide. The record is never touched.
pub(super) async fn replay<S>(
    state: &AppState<S>,
    live: &Live,
    policy: &Policy,
    req: Retry<'_>,
    stored: &StoredResponse,
) -> Result<Reply, ProxyError> {
    if let Some(check) = &policy.replay_authorization {
        // Boxed: a policy without the check keeps a replay's future as small as before.
        let verdict = Box::pin(ask(state, live, policy, check, req)).await;
        state.metrics.count_replay_authorization(verdict.counted());
        match verdict {
            Verdict::Allowed => {}
            Verdict::Denied(response) => {
                return Ok(Reply::new(Outcome::ReplayDenied, response));
            }
            Verdict::Error(source) => return Err(ProxyError::AuthorizationUnavailable(source)),
        }
    }
    Ok(Reply::new(
        Outcome::Replayed,
        replay_response(stored, policy),
    ))
}

/// A request's path and query as the client sent them, kept in its extensions when
/// its path was normalised (docs/behaviour.md §15): what `X-Original-URI` names.
#[derive(Debug, Clone)]
pub(super) struct Received(pub(super) http::uri::PathAndQuery);

/// The retry whose replay is checked: its head, its record and its client.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retry<'a> {
    pub(super) parts: &'a Parts,
    pub(super) scoped: &'a ScopedKey,
    pub(super) peer: SocketAddr,
}

/// What the authorizer said.
#[derive(Debug)]
enum Verdict {
    /// `2xx`.
    Allowed,
    /// `401` or `403`, as the client gets it.
    Denied(Response<ProxyBody>),
    /// Anything else, or no answer.
    Error(BoxError),
}

impl Verdict {
    fn counted(&self) -> Authorized {
        match self {
            Verdict::Allowed => Authorized::Allowed,
            Verdict::Denied(_) => Authorized::Denied,
            Verdict::Error(_) => Authorized::Error,
        }
    }
}

async fn ask<S>(
    state: &AppState<S>,
    live: &Live,
    policy: &Policy,
    check: &ReplayAuthorization,
    req: Retry<'_>,
) -> Verdict {
    let record_id = req.scoped.id(&state.config.store.key_prefix);
    let (client, request) = match &check.target {
        AuthorizerTarget::Path(path) => (
            live.client(),
            request(
                check,
                policy,
                req,
                &record_id,
                (&live.config.upstream.url, path),
                true,
            ),
        ),
        AuthorizerTarget::Url { origin, path } => {
            let Some(client) = live.authorizer_client() else {
                // Built for every configuration with a `url`: never.
                return Verdict::Error("no client for replay_authorization's url".into());
            };
            (
                client,
                request(check, policy, req, &record_id, (origin, path), false),
            )
        }
    };
    let request = match request {
        Ok(request) => request,
        Err(err) => return Verdict::Error(err),
    };
    let deadline = Instant::now() + check.timeout;
    answered(&state.budget, client, request, deadline).await
}

/// Sends the check and reads its answer, all before `deadline`. The body is read (up to
/// [`MAX_BODY`]) whatever the status, so that the connection goes back to the pool.
async fn answered(
    budget: &Arc<Budget>,
    client: &UpstreamClient,
    request: Request<ProxyBody>,
    deadline: Instant,
) -> Verdict {
    let response = match upstream::send(client, request, deadline).await {
        Ok(response) => response,
        Err(failure) => return Verdict::Error(format!("{failure:?}").into()),
    };
    let (head, body) = response.into_parts();
    let mut held = budget.counting();
    let body = match upstream::read_body(body, MAX_BODY, deadline, &mut held).await {
        Ok(Capped::Complete(body)) => body,
        Ok(Capped::Overflow { prefix, .. }) => prefix.slice(..prefix.len().min(MAX_BODY as usize)),
        Ok(Capped::OverBudget) => Bytes::new(),
        Err(failure) => return Verdict::Error(format!("{failure:?}").into()),
    };
    match head.status {
        status if status.is_success() => Verdict::Allowed,
        status @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
            let mut response = Response::new(ProxyBody::full(body));
            *response.status_mut() = status;
            for name in [header::CONTENT_TYPE, header::WWW_AUTHENTICATE] {
                for value in head.headers.get_all(&name) {
                    response.headers_mut().append(&name, value.clone());
                }
            }
            Verdict::Denied(response)
        }
        status => Verdict::Error(format!("the authorizer answered {status}").into()),
    }
}

/// The check as it is sent to `to` (a base URL and a path and query): the method, the
/// copied headers, the record and the original request named, no body. `host`: the
/// retry's `Host` goes too, as to the upstream, for a check on the same upstream.
fn request(
    check: &ReplayAuthorization,
    policy: &Policy,
    req: Retry<'_>,
    record_id: &str,
    (base, path): (&http::Uri, &http::uri::PathAndQuery),
    host: bool,
) -> Result<Request<ProxyBody>, BoxError> {
    let (mut parts, ()) = Request::builder()
        .method(check.method.clone())
        .uri(path.clone())
        .body(())?
        .into_parts();
    let from = &req.parts.headers;
    let headers = &mut parts.headers;
    let host = host.then_some(&header::HOST);
    for name in check.copied(&policy.scope_headers).into_iter().chain(host) {
        for value in from.get_all(name) {
            headers.append(name, value.clone());
        }
    }
    // Never the idempotency key, even if listed: the authorizer is told the record.
    for source in &policy.key_from {
        if let KeySource::Header(name) = source {
            headers.remove(name);
        }
    }
    headers.insert(&X_IDEMPOTENCY_RECORD, HeaderValue::from_str(record_id)?);
    headers.insert(
        &X_ORIGINAL_METHOD,
        HeaderValue::from_str(req.parts.method.as_str())?,
    );
    let received = req.parts.extensions.get::<Received>();
    let original = match received {
        Some(Received(received)) => {
            original_uri(received.path(), received.query(), &policy.key_from)
        }
        None => original_uri(
            req.parts.uri.path(),
            req.parts.uri.query(),
            &policy.key_from,
        ),
    };
    headers.insert(&X_ORIGINAL_URI, HeaderValue::from_str(&original)?);
    Ok(upstream_request(base, parts, req.peer, ProxyBody::empty()))
}

/// The retry's path and query as received, less the query parameters a key source reads
/// the key from: the check never carries the key.
fn original_uri(path: &str, query: Option<&str>, sources: &[KeySource]) -> String {
    let Some(query) = query else {
        return path.to_owned();
    };
    let is_key = |pair: &str| {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        sources
            .iter()
            .any(|source| matches!(source, KeySource::Query(key) if key == name))
    };
    let kept: Vec<&str> = query.split('&').filter(|pair| !is_key(pair)).collect();
    if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_original_uri_keeps_the_query_but_the_key() {
        let sources = [KeySource::Query("idem".to_owned())];
        assert_eq!(
            original_uri("/a", Some("x=1&idem=k&y"), &sources),
            "/a?x=1&y"
        );
        assert_eq!(original_uri("/a", Some("idem=k"), &sources), "/a");
        assert_eq!(original_uri("/a", Some("x=1"), &[]), "/a?x=1");
        assert_eq!(original_uri("/a", None, &sources), "/a");
    }
}
