//! Every error the proxy answers itself, and the one table that turns each into a
//! status code and an RFC 9457 problem body.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http::header::{ALLOW, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};

use crate::config::{ErrorFormat, ErrorsConfig};
use crate::idempotency::path::PathError;
use crate::idempotency::{KeyError, Rejection};
use crate::metrics::Outcome;
use crate::principal::{CredentialError, PrincipalError};
use crate::store::StoreError;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Base of every problem `type`; the slug is appended. Stable: clients may match on it.
pub(crate) const PROBLEM_BASE: &str = "https://idemgate.dev/problems/";

/// How long a client is asked to wait after `503 store-unavailable`.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a client is asked to wait after `503 authorization-unavailable`
/// (docs/behaviour.md §24).
const AUTHORIZATION_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a client is asked to wait after `503 overloaded`.
const OVERLOADED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The `Allow` of the proxy's `405`: every method but `CONNECT` is forwarded, these
/// being the ones RFC 9110 defines (docs/behaviour.md §25).
const PROXY_ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH";

/// Why a request's authority was refused (RFC 9112 §3.2); a refused path is a
/// [`PathError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TargetError {
    #[error("the HTTP/1.1 request has no Host header")]
    MissingHost,
    #[error("the Host header is empty")]
    EmptyHost,
    #[error("the Host header holds more than one authority")]
    HostList,
    #[error("the request has more than one Host header")]
    DuplicateHost,
    #[error("the request target's authority differs from its Host header")]
    HostMismatch,
    /// `CONNECT` asks for a tunnel, which idemgate never opens: `405`.
    #[error("CONNECT asks for a tunnel, which this proxy never opens")]
    Connect,
    /// The asterisk form (`OPTIONS *`) names the server, no resource to forward to.
    #[error("the request target '*' names no resource")]
    Asterisk,
}

/// Why the upstream's outcome is unknown after the request may have reached it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnknownCause {
    /// `upstream.timeout` passed: 504.
    Timeout,
    /// The connection failed after the request may have been written: 502.
    Reset,
    /// The owner of the claim stopped renewing (crashed) before recording: 502.
    LeaseExpired,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    #[error("the route requires an idempotency key in {wanted}")]
    MissingKey { wanted: String },
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[source] KeyError),
    /// A credential was sent and did not verify (docs/behaviour.md §17); the message
    /// says what was wrong, never with which value.
    #[error("invalid credentials")]
    InvalidCredentials(#[source] CredentialError),
    #[error("this route requires credentials that say who the caller is")]
    MissingCredentials,
    /// The token names a key the set lacks, and the read of the set it waited on failed
    /// or timed out (docs/behaviour.md §25).
    #[error("the key set that could verify the token could not be read; retry later")]
    PrincipalUnavailable { retry_after: Duration },
    /// `replay_authorization` could not say whether the retry may read the record
    /// (docs/behaviour.md §24): another status, no answer in time, no connection.
    #[error("the replay's authorization could not be checked; retry later")]
    AuthorizationUnavailable(#[source] BoxError),
    #[error("a request with this key is still being executed")]
    InFlight { retry_after: Duration },
    #[error("the response to this key was too large to keep and cannot be replayed")]
    NotReplayable,
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("the request body could not be read")]
    BadRequestBody(#[source] BoxError),
    #[error("the request body stalled or did not arrive in time")]
    BodyTimeout,
    #[error("the request target is refused")]
    BadTarget(#[source] TargetError),
    #[error("the request path is refused")]
    BadPath(#[source] PathError),
    #[error("the proxy holds as many buffered bodies as it may")]
    Overloaded,
    /// An unguarded request failed upstream: answered as `inner`, counted apart.
    #[error("{0}")]
    PassThroughFailed(Box<ProxyError>),
    #[error("this key was used for a different request")]
    KeyReused,
    #[error("could not connect to the upstream")]
    UpstreamUnreachable(#[source] BoxError),
    #[error("the upstream's outcome is unknown ({cause:?})")]
    OutcomeUnknown {
        cause: UnknownCause,
        source: Option<BoxError>,
    },
    #[error("the idempotency store is unavailable")]
    StoreUnavailable(#[source] StoreError),
}

/// Why the admin key API (docs/behaviour.md §13) refused or could not answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    #[error("this endpoint needs the bearer token of admin.token")]
    Unauthorized,
    #[error("without admin.token, /keys answers only on a loopback admin.listen")]
    Forbidden,
    #[error("no record or in-flight marker under this id")]
    KeyNotFound,
    #[error(
        "the request with this key is still in flight (its lease is live); add ?force=true to purge it anyway"
    )]
    InFlight,
    #[error("/keys/{{id}} takes GET and DELETE, /keys/{{id}}/resolve takes POST")]
    MethodNotAllowed,
    #[error("the idempotency store is unavailable")]
    StoreUnavailable(#[source] StoreError),
    /// `POST /keys/{id}/resolve` with a body that is not a resolution
    /// (docs/behaviour.md §18).
    #[error("not a resolution: {0}")]
    InvalidResolution(String),
    /// `POST /keys/{id}/resolve` on a record whose outcome is known, or on a marker.
    #[error(
        "only a record whose outcome is unknown can be resolved; this is {0} (it may have been resolved meanwhile)"
    )]
    NotUnknown(&'static str),
    /// `GET /keys?state=...` with a state, limit or cursor it does not take
    /// (docs/behaviour.md §24).
    #[error("not a listing: {0}")]
    InvalidListing(String),
}

impl AdminError {
    /// The admin API's own status table, exhaustive like [`ProxyError::problem`].
    pub(crate) fn problem(&self) -> Problem {
        use AdminError as E;
        let (status, slug, title, retry_after) = match self {
            E::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Admin token required",
                None,
            ),
            E::Forbidden => (
                StatusCode::FORBIDDEN,
                "forbidden",
                "Admin key API not open here",
                None,
            ),
            E::KeyNotFound => (
                StatusCode::NOT_FOUND,
                "key-not-found",
                "Key not found",
                None,
            ),
            E::InFlight => (
                StatusCode::CONFLICT,
                "in-flight",
                "Request still in flight",
                None,
            ),
            E::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                None,
            ),
            E::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                Some(STORE_RETRY_AFTER),
            ),
            E::InvalidResolution(_) => (
                StatusCode::BAD_REQUEST,
                "invalid-resolution",
                "Invalid resolution",
                None,
            ),
            E::NotUnknown(_) => (
                StatusCode::CONFLICT,
                "not-unknown",
                "Outcome not unknown",
                None,
            ),
            E::InvalidListing(_) => (
                StatusCode::BAD_REQUEST,
                "invalid-listing",
                "Invalid listing",
                None,
            ),
        };
        Problem {
            status,
            slug,
            title,
            detail: format!("{}.", capitalised(&self.to_string())),
            retry_after,
            // The key API's handler writes its own, per endpoint.
            allow: None,
        }
    }
}

impl From<PrincipalError> for ProxyError {
    fn from(err: PrincipalError) -> Self {
        match err {
            PrincipalError::Invalid(err) => ProxyError::InvalidCredentials(err),
            PrincipalError::Unavailable { retry_after } => {
                ProxyError::PrincipalUnavailable { retry_after }
            }
        }
    }
}

impl From<Rejection> for ProxyError {
    fn from(r: Rejection) -> Self {
        match r {
            Rejection::KeyReused => ProxyError::KeyReused,
            Rejection::InFlight { retry_after } => ProxyError::InFlight { retry_after },
            Rejection::NotReplayable => ProxyError::NotReplayable,
        }
    }
}

/// A problem answer, ready to send or to store as a recorded outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    pub(crate) slug: &'static str,
    pub(crate) title: &'static str,
    pub(crate) detail: String,
    pub(crate) retry_after: Option<Duration>,
    /// The `Allow` of a `405` (RFC 9110 §15.5.6: a 405 lists what the target allows).
    pub(crate) allow: Option<&'static str>,
}

impl ProxyError {
    /// The status table (docs/behaviour.md §7). Exhaustive on purpose: a new error must
    /// be placed.
    pub(crate) fn problem(&self) -> Problem {
        use ProxyError as E;
        let (status, slug, title, retry_after) = match self {
            E::MissingKey { .. } => (
                StatusCode::BAD_REQUEST,
                "missing-key",
                "Idempotency key required",
                None,
            ),
            E::InvalidKey(_) => (
                StatusCode::BAD_REQUEST,
                "invalid-key",
                "Invalid idempotency key",
                None,
            ),
            E::InvalidCredentials(_) => (
                StatusCode::UNAUTHORIZED,
                "invalid-credentials",
                "Invalid credentials",
                None,
            ),
            E::MissingCredentials => (
                StatusCode::UNAUTHORIZED,
                "missing-credentials",
                "Credentials required",
                None,
            ),
            E::PrincipalUnavailable { retry_after } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "principal-unavailable",
                "Credentials cannot be verified now",
                Some(*retry_after),
            ),
            E::AuthorizationUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "authorization-unavailable",
                "Authorization cannot be checked now",
                Some(AUTHORIZATION_RETRY_AFTER),
            ),
            E::BadRequestBody(_) => (
                StatusCode::BAD_REQUEST,
                "bad-request",
                "Request body could not be read",
                None,
            ),
            E::BadTarget(TargetError::Connect) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                None,
            ),
            E::BadTarget(
                TargetError::MissingHost
                | TargetError::EmptyHost
                | TargetError::HostList
                | TargetError::DuplicateHost
                | TargetError::HostMismatch
                | TargetError::Asterisk,
            )
            | E::BadPath(PathError::AboveRoot | PathError::BadPercent) => (
                StatusCode::BAD_REQUEST,
                "bad-request",
                "Request target refused",
                None,
            ),
            // Spellings that servers behind the proxy may read as another path.
            E::BadPath(PathError::EscapedSlash | PathError::DotParameter | PathError::Nul) => (
                StatusCode::BAD_REQUEST,
                "invalid-path",
                "Request path refused",
                None,
            ),
            E::Overloaded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "Proxy overloaded",
                Some(OVERLOADED_RETRY_AFTER),
            ),
            E::PassThroughFailed(inner) => return inner.problem(),
            E::BodyTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body too slow",
                None,
            ),
            E::InFlight { retry_after } => (
                StatusCode::CONFLICT,
                "in-flight",
                "Request still in flight",
                Some(*retry_after),
            ),
            E::NotReplayable => (
                StatusCode::CONFLICT,
                "not-replayable",
                "Response not replayable",
                None,
            ),
            E::BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                None,
            ),
            E::KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency key reused",
                None,
            ),
            E::UpstreamUnreachable(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream unreachable",
                None,
            ),
            E::OutcomeUnknown {
                cause: UnknownCause::Timeout,
                ..
            } => (
                StatusCode::GATEWAY_TIMEOUT,
                "outcome-unknown",
                "Outcome unknown",
                None,
            ),
            E::OutcomeUnknown {
                cause: UnknownCause::Reset | UnknownCause::LeaseExpired,
                ..
            } => (
                StatusCode::BAD_GATEWAY,
                "outcome-unknown",
                "Outcome unknown",
                None,
            ),
            E::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                Some(STORE_RETRY_AFTER),
            ),
        };
        Problem {
            status,
            slug,
            title,
            detail: self.detail(),
            retry_after,
            // Every method but CONNECT is forwarded: the one 405 the proxy makes.
            allow: (status == StatusCode::METHOD_NOT_ALLOWED).then_some(PROXY_ALLOW),
        }
    }

    /// The metric label of each error, beside its status: exhaustive, like the table.
    pub(crate) fn outcome(&self) -> Outcome {
        use ProxyError as E;
        match self {
            E::MissingKey { .. } => Outcome::MissingKey,
            E::InvalidKey(_) => Outcome::InvalidKey,
            E::InvalidCredentials(_) => Outcome::InvalidCredentials,
            E::MissingCredentials => Outcome::MissingCredentials,
            E::PrincipalUnavailable { .. } => Outcome::PrincipalUnavailable,
            E::AuthorizationUnavailable(_) => Outcome::AuthorizationUnavailable,
            E::InFlight { .. } => Outcome::InFlight,
            E::NotReplayable => Outcome::NotReplayable,
            E::BodyTooLarge { .. } => Outcome::TooLarge,
            E::BadRequestBody(_) | E::BodyTimeout | E::BadTarget(_) | E::BadPath(_) => {
                Outcome::BadRequest
            }
            E::Overloaded => Outcome::Overloaded,
            E::PassThroughFailed(_) => Outcome::PassthroughError,
            E::KeyReused => Outcome::KeyReused,
            E::UpstreamUnreachable(_) => Outcome::UpstreamUnreachable,
            E::OutcomeUnknown { .. } => Outcome::OutcomeUnknown,
            E::StoreUnavailable(_) => Outcome::StoreUnavailable,
        }
    }

    /// Whether the error is about our infrastructure (store, upstream), which an
    /// operator must hear of, rather than about the client's request.
    pub(crate) fn is_infrastructure(&self) -> bool {
        use ProxyError as E;
        match self {
            E::StoreUnavailable(_)
            | E::UpstreamUnreachable(_)
            | E::OutcomeUnknown { .. }
            | E::AuthorizationUnavailable(_) => true,
            E::PassThroughFailed(inner) => inner.is_infrastructure(),
            E::MissingKey { .. }
            | E::InvalidKey(_)
            | E::InvalidCredentials(_)
            | E::MissingCredentials
            // The failed read of the key set is logged and counted once, not per request.
            | E::PrincipalUnavailable { .. }
            | E::InFlight { .. }
            | E::NotReplayable
            | E::BodyTooLarge { .. }
            | E::BadRequestBody(_)
            | E::BodyTimeout
            | E::BadTarget(_)
            | E::BadPath(_)
            | E::Overloaded
            | E::KeyReused => false,
        }
    }

    /// A sentence for the client; never contains the key or credentials.
    fn detail(&self) -> String {
        match self {
            ProxyError::OutcomeUnknown { cause: UnknownCause::Timeout, .. } => {
                "The upstream did not answer in time after the request was sent; it may or may not have been executed. Retries with this key get this same answer.".to_owned()
            }
            ProxyError::OutcomeUnknown { cause: UnknownCause::Reset, .. } => {
                "The connection to the upstream failed after the request was sent; it may or may not have been executed. Retries with this key get this same answer.".to_owned()
            }
            ProxyError::OutcomeUnknown { cause: UnknownCause::LeaseExpired, .. } => {
                "The proxy handling the first request with this key stopped before recording its outcome; it may or may not have been executed.".to_owned()
            }
            // The store's and the upstream's own errors stay in the logs: they describe
            // infrastructure, not the client's request.
            ProxyError::StoreUnavailable(_) | ProxyError::UpstreamUnreachable(_) => {
                format!("{}.", capitalised(&self.to_string()))
            }
            other => {
                let mut s = capitalised(&other.to_string());
                if let Some(src) = std::error::Error::source(other) {
                    s.push_str(": ");
                    s.push_str(&src.to_string());
                }
                s.push('.');
                s
            }
        }
    }
}

impl Problem {
    /// The `type` URI: a stable base plus the slug.
    pub(crate) fn type_uri(&self) -> String {
        format!("{PROBLEM_BASE}{}", self.slug)
    }

    /// The body: the JSON of RFC 9457, or the operator's template (docs/behaviour.md §16).
    pub(crate) fn body(&self, errors: &ErrorsConfig) -> Bytes {
        match errors.format {
            ErrorFormat::Problem => {
                let body = serde_json::json!({
                    "type": self.type_uri(),
                    "title": self.title,
                    "status": self.status.as_u16(),
                    "detail": self.detail,
                });
                Bytes::from(body.to_string())
            }
            ErrorFormat::Template => Bytes::from(errors.fill(
                self.slug,
                &self.type_uri(),
                self.title,
                self.status.as_u16(),
                &self.detail,
            )),
        }
    }

    /// Headers of the answer, in the order they are sent and stored.
    pub(crate) fn headers(&self, errors: &ErrorsConfig) -> Vec<(HeaderName, HeaderValue)> {
        let content_type = match errors.format {
            ErrorFormat::Problem => HeaderValue::from_static("application/problem+json"),
            ErrorFormat::Template => errors.content_type.clone(),
        };
        let mut headers = vec![(CONTENT_TYPE, content_type)];
        if let Some(after) = self.retry_after {
            headers.push((RETRY_AFTER, HeaderValue::from(after.as_secs().max(1))));
        }
        if let Some(allow) = self.allow {
            headers.push((ALLOW, HeaderValue::from_static(allow)));
        }
        headers
    }
}

fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}
