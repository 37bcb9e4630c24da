//! The CORS headers of `cors` (docs/behaviour.md §24): on the answers idemgate makes
//! itself, on replays (computed for the retry's origin, never the first caller's), and
//! on preflights of a guarded path, which a legacy upstream answers without the key
//! header or not at all. An answer the upstream gives to a first execution passes as the
//! upstream made it.
//!
//! The handler takes what it needs of the request ([`Asked`]) before the request is
//! consumed, and puts the headers on the counted answer, whichever path made it.

use std::sync::Arc;

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};

use super::body::ProxyBody;
use super::reply::Counted;
use super::state::Live;
use crate::config::{AllowOrigins, CorsConfig, Policy};
use crate::idempotency::source::KeySource;
use crate::metrics::Outcome;

/// What idemgate always exposes: the headers a client of an idempotent API reads.
const EXPOSED: &str = "Idempotent-Replayed, Retry-After, Idempotency-Reconciled";

/// What the CORS headers of a request's answer depend on, taken when it arrives.
#[derive(Debug)]
pub(crate) struct Asked {
    live: Arc<Live>,
    origin: Option<HeaderValue>,
    /// A preflight idemgate may complete: allowed origin, guarded path, key header asked.
    preflight: Option<Preflight>,
}

#[derive(Debug)]
struct Preflight {
    /// The path's guarded methods.
    methods: Vec<Method>,
    /// The key header, as the preflight named it.
    key: HeaderName,
    /// `Access-Control-Request-Headers` as sent.
    requested: HeaderValue,
}

impl Asked {
    /// `None` when `cors` is unset: then nothing is taken and nothing added. Boxed, so
    /// that a request's future grows by a pointer.
    pub(crate) fn of<B>(live: &Arc<Live>, req: &Request<B>, policy: &Policy) -> Option<Box<Asked>> {
        let cors = live.config.cors.as_ref()?;
        let origin = req.headers().get(ORIGIN).cloned();
        let preflight = (req.method() == Method::OPTIONS
            && policy.enabled
            && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD)
            && allow_origin(cors, origin.as_ref()).is_some())
        .then(|| preflight(req.headers(), policy))
        .flatten();
        Some(Box::new(Asked {
            live: Arc::clone(live),
            origin,
            preflight,
        }))
    }

    /// Puts the CORS headers on `counted`, as [`made_by`] its outcome says.
    pub(crate) fn apply(self, counted: &mut Counted) {
        let Some(cors) = self.live.config.cors.as_ref() else {
            return;
        };
        let outcome = counted.outcome();
        let response = counted.response_mut();
        match (made_by(outcome), self.preflight) {
            (Maker::Upstream, None) => {}
            (Maker::Upstream, Some(preflight)) => {
                complete_preflight(cors, self.origin.as_ref(), preflight, response);
            }
            (Maker::Idemgate, _) => {
                let headers = response.headers_mut();
                // A replay's stored ones were computed for the first caller.
                let stored: Vec<HeaderName> = headers
                    .keys()
                    .filter(|name| name.as_str().starts_with("access-control-"))
                    .cloned()
                    .collect();
                for name in stored {
                    headers.remove(name);
                }
                if let Some(allowed) = allow_origin(cors, self.origin.as_ref()) {
                    put_origin(cors, allowed, headers);
                    if let Ok(exposed) = HeaderValue::from_str(&exposed(cors)) {
                        headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, exposed);
                    }
                }
                vary_origin(headers);
            }
        }
    }
}

/// Who made an answer: the upstream, for a first execution or a request passed through,
/// or idemgate (a problem, a replay). One exhaustive table, so that a new outcome is
/// placed on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Maker {
    Upstream,
    Idemgate,
}

fn made_by(outcome: Outcome) -> Maker {
    match outcome {
        Outcome::Forwarded
        | Outcome::Passthrough
        | Outcome::StoreBypassed
        | Outcome::LeaseLost
        | Outcome::Released
        | Outcome::Unscoped => Maker::Upstream,
        Outcome::Replayed
        | Outcome::InFlight
        | Outcome::KeyReused
        | Outcome::MissingKey
        | Outcome::InvalidKey
        | Outcome::TooLarge
        | Outcome::StoreUnavailable
        | Outcome::OutcomeUnknown
        | Outcome::NotReplayable
        | Outcome::UpstreamUnreachable
        | Outcome::BadRequest
        | Outcome::Overloaded
        | Outcome::PassthroughError
        | Outcome::InvalidCredentials
        | Outcome::MissingCredentials
        | Outcome::PrincipalUnavailable
        // The authorizer's 401/403 is passed by idemgate in place of a replay
        // (docs/behaviour.md §24): the upstream did not answer this request.
        | Outcome::ReplayDenied
        | Outcome::AuthorizationUnavailable => Maker::Idemgate,
    }
}

/// The preflight of `headers` when its `Access-Control-Request-Headers` name one of the
/// policy's key headers.
fn preflight(headers: &HeaderMap, policy: &Policy) -> Option<Preflight> {
    let requested = headers.get(ACCESS_CONTROL_REQUEST_HEADERS)?;
    let key = policy.key_from.iter().find_map(|source| match source {
        KeySource::Header(name) if lists(requested, name.as_str()) => Some(name.clone()),
        KeySource::Header(_)
        | KeySource::Query(_)
        | KeySource::Json(_)
        | KeySource::Fingerprint(_) => None,
    })?;
    Some(Preflight {
        methods: policy.methods.clone(),
        key,
        requested: requested.clone(),
    })
}

/// Whether a comma-separated header value lists `name`, in any case.
fn lists(value: &HeaderValue, name: &str) -> bool {
    value
        .as_bytes()
        .split(|b| *b == b',')
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(name.as_bytes()))
}

/// The upstream's answer to a preflight idemgate may complete: its allowed headers
/// gain the key header when it answered `2xx` without it; a `404`, `405` or `501` (an
/// upstream that does not do CORS) becomes idemgate's own `204`.
fn complete_preflight(
    cors: &CorsConfig,
    origin: Option<&HeaderValue>,
    preflight: Preflight,
    response: &mut Response<ProxyBody>,
) {
    let Some(allowed) = allow_origin(cors, origin) else {
        return;
    };
    let status = response.status();
    if status.is_success() {
        let headers = response.headers_mut();
        let listed = headers
            .get_all(ACCESS_CONTROL_ALLOW_HEADERS)
            .iter()
            .any(|value| {
                lists(value, preflight.key.as_str())
                    || (!cors.allow_credentials && lists(value, "*"))
            });
        if !listed {
            let key = HeaderValue::from_str(preflight.key.as_str())
                .expect("a header name is a header value");
            headers.append(ACCESS_CONTROL_ALLOW_HEADERS, key);
            vary_origin(headers);
        }
        return;
    }
    if !matches!(
        status,
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED
    ) {
        return;
    }
    let mut own = Response::new(ProxyBody::empty());
    *own.status_mut() = StatusCode::NO_CONTENT;
    let headers = own.headers_mut();
    put_origin(cors, allowed, headers);
    let methods: Vec<&str> = preflight.methods.iter().map(Method::as_str).collect();
    if let Ok(methods) = HeaderValue::from_str(&methods.join(", ")) {
        headers.insert(ACCESS_CONTROL_ALLOW_METHODS, methods);
    }
    headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, preflight.requested);
    headers.insert(
        ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from(cors.max_age.as_secs()),
    );
    vary_origin(headers);
    *response = own;
}

/// `Access-Control-Allow-Origin` for `origin`, when it is allowed: itself, or `*` for
/// `"*"` without credentials (whatever the origin, or none).
fn allow_origin(cors: &CorsConfig, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
    match (&cors.allow_origins, cors.allow_credentials) {
        (AllowOrigins::Any, false) => Some(HeaderValue::from_static("*")),
        (AllowOrigins::Any, true) => origin.cloned(),
        (AllowOrigins::Listed(listed), _) => origin
            .filter(|origin| listed.iter().any(|l| l.as_bytes() == origin.as_bytes()))
            .cloned(),
        (AllowOrigins::Missing, _) => None,
    }
}

fn put_origin(cors: &CorsConfig, allowed: HeaderValue, headers: &mut HeaderMap) {
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
    if cors.allow_credentials {
        headers.insert(
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
}

fn exposed(cors: &CorsConfig) -> String {
    let mut exposed = EXPOSED.to_owned();
    for name in &cors.expose_headers {
        exposed.push_str(", ");
        exposed.push_str(name.as_str());
    }
    exposed
}

/// `Vary: Origin`, beside what the answer varies on already.
fn vary_origin(headers: &mut HeaderMap) {
    let varies = headers
        .get_all(VARY)
        .iter()
        .any(|value| lists(value, "origin") || lists(value, "*"));
    if !varies {
        headers.append(VARY, HeaderValue::from_static("Origin"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_list_names_a_header_in_any_case() {
        let value = HeaderValue::from_static("content-type, Idempotency-Key");
        assert!(lists(&value, "idempotency-key"));
        assert!(!lists(&value, "idempotency"));
    }

    #[test]
    fn vary_origin_is_merged_once() {
        let mut headers = HeaderMap::new();
        headers.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
        vary_origin(&mut headers);
        vary_origin(&mut headers);
        let all: Vec<_> = headers.get_all(VARY).iter().collect();
        assert_eq!(all, ["Accept-Encoding", "Origin"]);
    }
}
