//! One request, start to end, in the order of its life (docs/behaviour.md §2–§4).
//! [`handle`] picks the policy; a request it does not guard streams through; a guarded
//! one is keyed, buffered and fingerprinted here, claimed in `claim.rs`, then forwarded
//! and recorded in `exchange.rs` or answered from what the claim found. Every answer,
//! error or not, is counted once, by `reply::finish`.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use opentelemetry::context::FutureExt as _;

use super::body::{Capped, ProxyBody, RequestBody, StallGuard, Stalled, collect_capped};
use super::budget::Held;
use super::claim::{self, Again, AgainBody, Claimed};
use super::exchange::{self, Guarded, Payload};
use super::reply::{Counted, Reply, finish};
use super::state::{AppState, Live, PolicyId};
use super::streamed::{self, Streaming};
use super::upload;
use super::upstream::{self, upstream_request};
use super::{authorize, cors, upgrade, view};
use crate::config::{OnUnavailable, Policy, StoreKind};
use crate::error::ProxyError;
use crate::idempotency::body::Body;
use crate::idempotency::path::{self, EscapedSlashes, PathError};
use crate::idempotency::source::{Found, KeySource, Offered};
use crate::idempotency::{Fingerprint, IdempotencyKey, ScopedKey};
use crate::metrics::Outcome;
use crate::principal::Principal;
use crate::store::{Lease, Store, StoreError};
use crate::telemetry::{self, Answered};

/// The service function: never fails, every error becomes a problem answer. Generic
/// over the request body so that tests can drive it without a socket.
pub async fn handle<S: Store, B: RequestBody>(
    state: Arc<AppState<S>>,
    req: Request<B>,
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
    // The configuration this request runs under to its end, whatever a reload does.
    let live = state.live();
    // With no exporter, this one branch is all that traces cost (docs/behaviour.md §20).
    let counted = match live.telemetry() {
        None => answer(&state, live, req, peer, &mut scoped_key).await,
        Some(telemetry) => {
            let cx = telemetry.server(req.method(), req.uri().path(), req.headers());
            Box::pin(traced(&state, live, req, peer, &mut scoped_key, cx)).await
        }
    };
    // One line per request. The key appears only as a short prefix of its scoped hash:
    // enough to correlate retries, never the raw key or a credential.
    if let Some((started, method, path)) = access {
        tracing::info!(
            target: "idemgate::access",
            %method,
            path,
            status = counted.status().as_u16(),
            outcome = counted.outcome().as_str(),
            latency_ms = started.elapsed().as_secs_f64() * 1000.0,
            key = scoped_key.as_ref().map_or_else(String::new, |k: &ScopedKey| k.to_hex()[..12].to_owned()),
        );
    }
    counted.into_response()
}

/// The request's answer, forwarded and recorded if the key is its own; counted.
async fn answer<S: Store, B: RequestBody>(
    state: &Arc<AppState<S>>,
    live: Arc<Live>,
    req: Request<B>,
    peer: SocketAddr,
    scoped_key: &mut Option<ScopedKey>,
) -> Counted {
    // One branch when `cors` is unset (docs/behaviour.md §24).
    let cors = live
        .config
        .cors
        .is_some()
        .then(|| cors_asked(&live, &req))
        .flatten();
    let mut counted = match route(state, &live, req, peer, scoped_key).await {
        Ok(Next::Exchange { id, lease, req }) => {
            exchange::execute(state, live, id, lease, req).await
        }
        Ok(Next::Answer(reply)) => finish(state, Ok(reply)),
        Err(err) => finish(state, Err(err)),
    };
    if let Some(cors) = cors {
        cors.apply(&mut counted);
    }
    counted
}

/// What the CORS headers of the answer depend on, under the policy of the request's
/// path (a path that does not normalise is answered `400`, under any).
fn cors_asked<B>(live: &Arc<Live>, req: &Request<B>) -> Option<Box<cors::Asked>> {
    let path = req.uri().path();
    let normal = path::normalise(path, live.config.escaped_slashes).unwrap_or(Cow::Borrowed(path));
    let policy = live.policy(live.policy_id(&view::match_path(&normal)));
    cors::Asked::of(live, req, policy)
}

/// [`answer`] inside the request's server span `cx` (docs/behaviour.md §20): the store
/// and upstream calls find it there, and it ends with the answer's attributes.
async fn traced<S: Store, B: RequestBody>(
    state: &Arc<AppState<S>>,
    live: Arc<Live>,
    req: Request<B>,
    peer: SocketAddr,
    scoped_key: &mut Option<ScopedKey>,
    cx: opentelemetry::Context,
) -> Counted {
    let counted = answer(state, live, req, peer, scoped_key)
        .with_context(cx.clone())
        .await;
    let record_id = scoped_key
        .as_ref()
        .map(|key| key.id(&state.config.store.key_prefix));
    telemetry::end_server(
        &cx,
        Answered {
            status: counted.status(),
            outcome: counted.outcome(),
            replayed: counted.replayed(),
            record_id,
        },
    );
    counted
}

/// Where a request goes after the handler. Moved once, so the large variant stays
/// inline: boxing it would cost an allocation per guarded request.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// Answered here (pass-through, replay, refusal).
    Answer(Reply),
    /// The key is ours: forward and record.
    Exchange {
        id: PolicyId,
        lease: Lease,
        req: Guarded,
    },
}

/// Whether a request is guarded or passed through (docs/behaviour.md §2).
///
/// The paths no common request takes (a take-over, an unavailable store, a key source
/// that read the body and found nothing, an unscoped fingerprint) are awaited boxed:
/// inline, each would add its future's size to every request's, which hyper moves and
/// keeps for the request's life (BENCHMARKS.md, issue 29).
async fn route<S: Store, B: RequestBody>(
    state: &Arc<AppState<S>>,
    live: &Live,
    req: Request<B>,
    peer: SocketAddr,
    scoped_key: &mut Option<ScopedKey>,
) -> Result<Next, ProxyError> {
    let req = one_view(req, live.config.escaped_slashes)?;
    let id = live.policy_id(&view::match_path(req.uri().path()));
    let policy = live.policy(id);
    if !policy.enabled || !view::guarded_method(req.method(), req.headers(), &policy.methods) {
        return pass_through(state, live, req, peer).await;
    }
    let head = Offered {
        headers: req.headers(),
        query: req.uri().query(),
        body: None,
    };
    let found = policy.find_key(head).map_err(ProxyError::InvalidKey)?;
    if found == Found::Absent {
        return keyless(state, live, policy, req, peer).await;
    }
    // Before the body is read: a refused credential costs no buffering.
    let principal = principal(live, id, policy, req.headers()).await?;
    let principal = principal.as_ref();
    let read = match (read_body(state, live, policy, req, &found).await?, found) {
        (Loaded::Whole(read), found) => (read, found),
        // Too large to buffer: claimed with what is known up front (docs/behaviour.md §19).
        (Loaded::Streamed(streaming), Found::Key(source, key)) => {
            let req =
                streamed::guard_streamed(state, policy, streaming, peer, principal, source, key);
            return claimed(state, live, id, (policy, principal), req, scoped_key).await;
        }
        // `Policy::streams` lets only a key found in the head stream.
        (Loaded::Streamed(_), _) => {
            return Err(ProxyError::BodyTooLarge {
                limit: policy.max_request_body,
            });
        }
    };
    let (read, found) = read;
    // Parsed at most once, for the key and the fingerprint alike.
    let bytes = read.body.clone();
    let body = Body::new(&bytes);
    let found = match found {
        Found::Key(source, key) => Found::Key(source, key),
        // A source that reads the body was reached: look again, with it.
        _ => policy
            .find_key(read.offered(&body))
            .map_err(ProxyError::InvalidKey)?,
    };
    let req = match found {
        Found::Key(source, key) => guard(policy, read, body, peer, principal, source, Some(key)),
        // No identity to scope it by: one anonymous scope would make two clients'
        // identical requests one. Forwarded as keyless, whatever `required` says, since
        // it never applies to a fingerprint source.
        Found::Fingerprint(_) if !policy.identifies(&read.parts.headers, principal) => {
            drop(body);
            let (req, _held) = read.into_request();
            let mut next = Box::pin(pass_through(state, live, req, peer)).await?;
            if let Next::Answer(reply) = &mut next {
                reply.outcome = Outcome::Unscoped;
            }
            return Ok(next);
        }
        Found::Fingerprint(source) => guard(policy, read, body, peer, principal, source, None),
        Found::Absent | Found::NeedsBody => {
            drop(body);
            // The bytes stay counted in `max_buffered_bytes` until they are forwarded.
            let (req, _held) = read.into_request();
            return Box::pin(keyless(state, live, policy, req, peer)).await;
        }
    };
    claimed(state, live, id, (policy, principal), req, scoped_key).await
}

/// Claims a guarded request's key, and goes where the claim says.
async fn claimed<S: Store>(
    state: &Arc<AppState<S>>,
    live: &Live,
    id: PolicyId,
    (policy, principal): (&Policy, Option<&Principal>),
    mut req: Guarded,
    scoped_key: &mut Option<ScopedKey>,
) -> Result<Next, ProxyError> {
    *scoped_key = Some(req.scoped);
    // The embedded stores keep it for their quota (docs/behaviour.md §17) and for fair
    // eviction (§25); Redis and PostgreSQL have no use for it.
    let scope = matches!(state.config.store.kind, StoreKind::Memory | StoreKind::File)
        .then(|| policy.scope_id(&req.parts.headers, principal));
    let mut fingerprint = req.fingerprint;
    let again = Again {
        parts: &req.parts,
        body: match &req.body {
            Payload::Buffered(bytes) => AgainBody::Buffered(bytes),
            Payload::Streamed(upload) => AgainBody::Streamed(upload.declared()),
        },
    };
    let claimed = claim::claim(
        state,
        policy,
        (req.scoped, scope),
        (&mut fingerprint, &again),
        req.ttl,
    )
    .await?;
    // Fingerprinted again under its record's rules: this request goes on with those
    // (docs/behaviour.md §24).
    if let Payload::Streamed(upload) = &mut req.body {
        upload.rehash(&fingerprint);
    }
    req.fingerprint = fingerprint;
    let next = match claimed {
        Claimed::Owned(lease) => Next::Exchange { id, lease, req },
        Claimed::Abandoned(lease) => Next::Answer(
            Box::pin(exchange::record_abandoned(state, live, policy, lease, req)).await,
        ),
        Claimed::Replay(completed) => Next::Answer(
            authorize::replay(
                state,
                live,
                policy,
                authorize::Retry {
                    parts: &req.parts,
                    scoped: &req.scoped,
                    peer: req.peer,
                },
                completed.response(),
            )
            .await?,
        ),
        Claimed::Compare(completed) => {
            Next::Answer(Box::pin(streamed::compare(state, live, policy, req, completed)).await?)
        }
        Claimed::Unavailable(err) => {
            Next::Answer(Box::pin(store_unavailable(state, live, err, req)).await?)
        }
    };
    Ok(next)
}

/// The verified principal of a keyed request under a policy with `scope_principal`
/// (docs/behaviour.md §17): a credential that does not verify is refused, and so is none
/// under `require_principal`, and a token whose key could not be read is answered
/// unavailable (docs/behaviour.md §25); nothing is claimed or forwarded for any.
async fn principal(
    live: &Live,
    id: PolicyId,
    policy: &Policy,
    headers: &http::HeaderMap,
) -> Result<Option<Principal>, ProxyError> {
    let Some(verifier) = live.verifier(id) else {
        return Ok(None);
    };
    let principal = verifier.principal(headers).await?;
    if principal.is_none() && policy.require_principal {
        return Err(ProxyError::MissingCredentials);
    }
    Ok(principal)
}

/// The request as both the guard and the upstream see it: a target that is never
/// forwarded refused, `Host` checked, the path normalised in its URI (the query is
/// kept as sent).
fn one_view<B>(mut req: Request<B>, slashes: EscapedSlashes) -> Result<Request<B>, ProxyError> {
    view::check_target(req.method(), req.uri()).map_err(ProxyError::BadTarget)?;
    view::check_host(req.version(), req.uri(), req.headers()).map_err(ProxyError::BadTarget)?;
    let normal = match path::normalise(req.uri().path(), slashes).map_err(ProxyError::BadPath)? {
        Cow::Borrowed(_) => return Ok(req),
        Cow::Owned(normal) => normal,
    };
    // As received, for a replay check's `X-Original-URI` (docs/behaviour.md §24).
    if let Some(received) = req.uri().path_and_query().cloned() {
        req.extensions_mut().insert(authorize::Received(received));
    }
    let mut parts = req.uri().clone().into_parts();
    let target = match req.uri().query() {
        Some(query) => format!("{normal}?{query}"),
        None => normal,
    };
    // Built from a valid path by decoding unreserved characters and slashes only.
    parts.path_and_query = Some(
        target
            .parse()
            .map_err(|_| ProxyError::BadPath(PathError::BadPercent))?,
    );
    *req.uri_mut() =
        Uri::from_parts(parts).map_err(|_| ProxyError::BadPath(PathError::BadPercent))?;
    Ok(req)
}

/// A guarded request with its body read whole.
struct Read {
    parts: Parts,
    body: Bytes,
    /// The body's share of `max_buffered_bytes`.
    held: Held,
}

impl Read {
    /// What the key sources may read, with `body`, the parse-once view of its body.
    fn offered<'a>(&'a self, body: &'a Body<'a>) -> Offered<'a> {
        Offered {
            headers: &self.parts.headers,
            query: self.parts.uri.query(),
            body: Some(body),
        }
    }

    /// The request again, to forward unguarded with the very same body bytes, and the
    /// body's share of the buffer budget.
    fn into_request(self) -> (Request<Full<Bytes>>, Held) {
        (
            Request::from_parts(self.parts, Full::new(self.body)),
            self.held,
        )
    }
}

/// A guarded request's body as [`read_body`] left it.
enum Loaded {
    Whole(Read),
    Streamed(Streaming),
}

/// Reads a guarded body whole, before anything is claimed; a client that stalls for
/// `listen_body_timeout`, or trickles it for longer than the upstream would get, is
/// answered 408, holding no claim. Under `stream_request_body`, a body too large to
/// buffer is left to stream instead, behind what was read of it.
async fn read_body<S: Store, B: RequestBody>(
    state: &AppState<S>,
    live: &Live,
    policy: &Policy,
    req: Request<B>,
    found: &Found<'_>,
) -> Result<Loaded, ProxyError> {
    let limit = policy.max_request_body;
    let length = content_length(req.headers());
    if length.is_some_and(|len| len > limit) {
        if !policy.streams(found) {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        return streamed::streaming(state, live, policy, req, length).map(Loaded::Streamed);
    }
    // Bytes are taken from `max_buffered_bytes` as they arrive, not as announced: a few
    // connections declaring large bodies they never send must not starve every other
    // guarded request. A body that stalls for `listen_body_timeout` gives its share back.
    let mut held = state.budget.strict();
    let (parts, body) = req.into_parts();
    let body = StallGuard::new(body, live.config.listen_body_timeout);
    let read = collect_capped(body, limit, &mut held);
    let read = tokio::time::timeout(live.config.upstream.timeout, read);
    let body = match read
        .await
        .map_err(|_| ProxyError::BodyTimeout)?
        .map_err(|err| match err {
            Stalled::Stalled => ProxyError::BodyTimeout,
            Stalled::Body(err) => ProxyError::BadRequestBody(err.into()),
        })? {
        Capped::Complete(body) => body,
        Capped::Overflow { prefix, rest } if policy.streams(found) => {
            // A chunked body that outgrew the buffer: what was read goes first.
            let body = upload::Parts {
                prefix: Some((prefix, held)),
                rest: rest.map_err(streamed::boxed_stall).boxed_unsync(),
                declared: None,
                limit: policy.max_streamed_body,
                held: state.budget.counting(),
            };
            return Ok(Loaded::Streamed(Streaming { parts, body }));
        }
        Capped::Overflow { .. } => return Err(ProxyError::BodyTooLarge { limit }),
        Capped::OverBudget => return Err(ProxyError::Overloaded),
    };
    Ok(Loaded::Whole(Read { parts, body, held }))
}

/// Fingerprints a read request and addresses its record: under its key and source, or,
/// for the `fingerprint` source (`key` is `None`), under the fingerprint itself.
fn guard(
    policy: &Policy,
    read: Read,
    json: Body<'_>,
    peer: SocketAddr,
    principal: Option<&Principal>,
    source: &KeySource,
    key: Option<IdempotencyKey>,
) -> Guarded {
    let Read { parts, body, held } = read;
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let fingerprint = Fingerprint::of(
        &parts.method,
        pq,
        &parts.headers,
        &policy.fingerprint_rules(),
        json,
    );
    // A `fingerprint` source's key is the fingerprint itself. The client's key is kept
    // for a `reconcile` lookup, without a copy.
    let scoped = match &key {
        Some(key) => policy.address(&parts.headers, principal, source, key),
        None => {
            let own = IdempotencyKey::from_digest(fingerprint.as_bytes());
            policy.address(&parts.headers, principal, source, &own)
        }
    };
    Guarded {
        scoped,
        key,
        ttl: policy.record_ttl(source),
        fingerprint,
        parts,
        body: Payload::Buffered(body),
        peer,
        held,
    }
}

/// A guarded request in which no source found a key: refused under `required`,
/// forwarded unguarded otherwise.
async fn keyless<S: Store, B: RequestBody>(
    state: &AppState<S>,
    live: &Live,
    policy: &Policy,
    req: Request<B>,
    peer: SocketAddr,
) -> Result<Next, ProxyError> {
    if policy.required {
        return Err(ProxyError::MissingKey {
            wanted: wanted(&policy.key_from),
        });
    }
    pass_through(state, live, req, peer).await
}

/// Where a key may be sent, for a client that sent none: "the Idempotency-Key header",
/// "the X-Request-Id header or the request_id query parameter".
fn wanted(sources: &[KeySource]) -> String {
    let described: Vec<String> = sources.iter().map(KeySource::describe).collect();
    match described.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => "an idempotency key".to_owned(),
    }
}

/// The store did not answer the claim: `on_unavailable` decides.
async fn store_unavailable<S: Store>(
    state: &AppState<S>,
    live: &Live,
    err: StoreError,
    req: Guarded,
) -> Result<Reply, ProxyError> {
    match state.config.store.on_unavailable {
        // A memory store full of in-flight markers is working, not down: forwarding
        // unguarded would let duplicates of those very requests through
        // (docs/behaviour.md §8). A record this version cannot read (a newer format, a
        // damaged value) is still a record: the key is taken, and forwarding could
        // execute it twice. A claim too few replicas hold was written: it is never
        // forwarded (docs/behaviour.md §14).
        _ if matches!(
            err,
            StoreError::Full | StoreError::Corrupt(_) | StoreError::Unreplicated { .. }
        ) =>
        {
            Err(ProxyError::StoreUnavailable(err))
        }
        OnUnavailable::Reject => Err(ProxyError::StoreUnavailable(err)),
        OnUnavailable::PassThrough => {
            tracing::warn!(error = %err, "store unavailable: forwarding without idempotency");
            let response =
                forward_unguarded(state, live, req.parts, req.body.into_body(), req.peer).await?;
            Ok(Reply::new(Outcome::StoreBypassed, response))
        }
    }
}

/// Streams a request to the upstream and its answer back, with no store access.
async fn pass_through<S: Store, B: RequestBody>(
    state: &AppState<S>,
    live: &Live,
    req: Request<B>,
    peer: SocketAddr,
) -> Result<Next, ProxyError> {
    // An upgrade to a protocol `upgrades` does not list is forwarded as a plain request:
    // its `Upgrade` (and `HTTP2-Settings`) go, as hop-by-hop headers do.
    if upgrade::wanted(req.headers())
        && let Some(protocols) = upgrade::listed(req.headers(), &live.config.upgrades)
    {
        let response = upgrade::pass(state, live, req, protocols, peer).await?;
        return Ok(Next::Answer(Reply::new(Outcome::Passthrough, response)));
    }
    let (parts, body) = req.into_parts();
    let response =
        forward_unguarded(state, live, parts, ProxyBody::from_request(body), peer).await?;
    Ok(Next::Answer(Reply::new(Outcome::Passthrough, response)))
}

async fn forward_unguarded<S: Store>(
    state: &AppState<S>,
    live: &Live,
    parts: Parts,
    body: ProxyBody,
    peer: SocketAddr,
) -> Result<Response<ProxyBody>, ProxyError> {
    let request = upstream_request(&live.config.upstream.url, parts, peer, body);
    let started = tokio::time::Instant::now();
    let deadline = started + live.config.upstream.timeout;
    let sent = upstream::send(live.client(), request, deadline).await;
    state.metrics.observe_upstream(started.elapsed());
    match sent {
        // Joining would let every later request on the connection past the guard.
        Ok(response) if response.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
            Err(ProxyError::PassThroughFailed(Box::new(
                ProxyError::UpstreamUnreachable(upstream::UNASKED_SWITCH.into()),
            )))
        }
        Ok(response) => Ok(response.map(ProxyBody::stream)),
        // Not guarded: counted apart from the guarded outcomes (docs/behaviour.md §16).
        Err(failure) => Err(ProxyError::PassThroughFailed(Box::new(failure.into()))),
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
