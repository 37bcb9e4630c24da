//! The admin key API (docs/behaviour.md §13): `GET /keys/{id}` reports what is stored
//! under a record id, `DELETE /keys/{id}` purges it so that the next retry executes
//! again; `GET /keys?state=...` lists records by state (`list.rs`, §24).
//!
//! An answer never holds the stored body, the stored headers, the raw key or a
//! credential: only the record's state, status, sizes, fingerprint and times. The id
//! is the one `idemgate key` prints, a hash the key cannot be read back from.

use std::net::SocketAddr;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AdminToken, ErrorsConfig, Policy};
use crate::error::AdminError;
use crate::idempotency::key::hex;
use crate::idempotency::rules::KeptRules;
use crate::idempotency::{Kept, Record, ScopedKey, StoredBody};
use crate::proxy::AppState;
use crate::store::{Inspection, Purged, Store};

/// Who is asking, and on which listener.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caller {
    /// The admin listener's own address: without a token, `/keys` answers only on a
    /// loopback one.
    pub(super) local: SocketAddr,
    pub(super) peer: SocketAddr,
}

/// Answers a request for `/keys`, `/keys/{id}` or `/keys/{id}/resolve` (`id` as it
/// came, still escaped).
pub(super) async fn answer<S: Store>(
    state: &AppState<S>,
    req: Request<Incoming>,
    id: &str,
    caller: Caller,
) -> Response<Full<Bytes>> {
    match serve(state, req, id, caller).await {
        Ok(response) => response,
        Err(err) => problem(&err, &state.config.errors),
    }
}

async fn serve<S: Store>(
    state: &AppState<S>,
    req: Request<Incoming>,
    id: &str,
    caller: Caller,
) -> Result<Response<Full<Bytes>>, AdminError> {
    // The token in force now: a reload may have set or changed it.
    let live = state.live();
    authorize(
        live.config.admin.token.as_ref(),
        caller.local,
        req.headers(),
    )?;
    let prefix = &state.config.store.key_prefix;
    if let Some(id) = id.strip_suffix("/resolve") {
        if req.method() != Method::POST {
            return Err(AdminError::MethodNotAllowed);
        }
        let key = parse_id(id, prefix).ok_or(AdminError::KeyNotFound)?;
        let shown = key.id(prefix);
        let max_body = live.config.largest_response_body();
        let body = read_limited(req.into_body(), resolution_limit(max_body)).await?;
        // A body that is not a resolution is refused before the store is asked.
        // A record id does not say which policy wrote it: a header any of them would
        // not keep is not kept.
        let policies: Vec<&Policy> = std::iter::once(&live.config.idempotency)
            .chain(live.config.routes.iter().map(|route| &route.policy))
            .collect();
        let resolution = super::resolve::parse(&body, max_body, &policies)?;
        let found = inspected(state, key).await?;
        let settled =
            super::resolve::resolve(state, (key, &shown), found, resolution, caller.peer).await?;
        return Ok(match settled {
            Some(record) => json(&describe(&shown, &record)),
            None => no_content(),
        });
    }
    let purge = match *req.method() {
        Method::GET | Method::HEAD => false,
        Method::DELETE => true,
        _ => return Err(AdminError::MethodNotAllowed),
    };
    let key = parse_id(id, prefix).ok_or(AdminError::KeyNotFound)?;
    let shown = key.id(prefix);
    if !purge {
        return Ok(json(&describe(&shown, &inspected(state, key).await?)));
    }
    let force = wants_force(req.uri().query());
    match state
        .store
        .purge(key, force)
        .await
        .map_err(AdminError::StoreUnavailable)?
    {
        purged @ (Purged::Removed(_) | Purged::Unreadable) => {
            let state_had = match &purged {
                Purged::Removed(record) => state_name(record),
                _ => "unreadable",
            };
            tracing::warn!(
                id = %shown,
                state = state_had,
                caller = %caller.peer,
                force,
                "admin purge: the record is removed, and the next request with its key executes again"
            );
            state.metrics.count_purge();
            Ok(no_content())
        }
        Purged::LiveLease => Err(AdminError::InFlight),
        Purged::Absent => Err(AdminError::KeyNotFound),
    }
}

/// What is stored under `key`; `404 key-not-found` when nothing is.
async fn inspected<S: Store>(
    state: &AppState<S>,
    key: ScopedKey,
) -> Result<Inspection, AdminError> {
    state
        .store
        .inspect(key)
        .await
        .map_err(AdminError::StoreUnavailable)?
        .ok_or(AdminError::KeyNotFound)
}

/// The most a resolution's JSON may take: its body in base64 (4/3 of it, escaped
/// text is no larger) and room for the status and headers.
fn resolution_limit(max_body: u64) -> u64 {
    max_body.saturating_mul(2).saturating_add(64 * 1024)
}

/// The request body, refused as an invalid resolution past `limit` bytes.
async fn read_limited(body: Incoming, limit: u64) -> Result<Bytes, AdminError> {
    let limited = http_body_util::Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    http_body_util::BodyExt::collect(limited)
        .await
        .map(http_body_util::Collected::to_bytes)
        .map_err(|_| {
            AdminError::InvalidResolution(format!(
                "the body could not be read, or is over {limit} bytes"
            ))
        })
}

/// With a token, only its bearer; without one, only on a loopback listener
/// (docs/behaviour.md §13).
pub(super) fn authorize(
    token: Option<&AdminToken>,
    local: SocketAddr,
    headers: &http::HeaderMap,
) -> Result<(), AdminError> {
    let Some(token) = token else {
        return if local.ip().is_loopback() {
            Ok(())
        } else {
            Err(AdminError::Forbidden)
        };
    };
    let mut offered = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (offered.next(), offered.next()) else {
        return Err(AdminError::Unauthorized);
    };
    match value.to_str().ok().and_then(bearer) {
        Some(offered) if same_secret(offered, token.expose()) => Ok(()),
        _ => Err(AdminError::Unauthorized),
    }
}

/// The credentials of `Bearer <token>` (RFC 6750; the scheme is case-insensitive).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// Compares in time independent of where the two differ, and of their lengths: the
/// digests are compared, in constant time.
fn same_secret(offered: &str, expected: &str) -> bool {
    let offered = Sha256::digest(offered.as_bytes());
    let expected = Sha256::digest(expected.as_bytes());
    offered.ct_eq(&expected).into()
}

/// The id as `idemgate key` prints it (`key_prefix` + 64 hex), or the 64 hex alone;
/// a `%XX` escape (a client escaping the prefix's `:`) is read as its byte.
fn parse_id(id: &str, prefix: &str) -> Option<ScopedKey> {
    let id = unescape(id)?;
    let hex = id.strip_prefix(prefix).unwrap_or(&id);
    ScopedKey::from_hex(hex)
}

pub(super) fn unescape(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let pair = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(pair, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn wants_force(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|pair| pair == "force=true"))
}

fn state_name(record: &Record) -> &'static str {
    match record {
        Record::InFlight(_) => "in_flight",
        Record::Completed(_) => "completed",
    }
}

/// The inspection JSON (docs/behaviour.md §13). Times a format 1 record did not keep
/// are `null`, and so are the fingerprint rules one before format 4 did not (§24).
pub(super) fn describe(id: &str, found: &Inspection) -> serde_json::Value {
    let time = |ms: u64| {
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
    };
    let expires_at = time(found.expires_at_ms);
    match &found.record {
        Record::InFlight(m) => serde_json::json!({
            "id": id,
            "state": state_name(&found.record),
            "status": null,
            "replayable": false,
            "body_bytes": null,
            "fingerprint": hex(m.fingerprint.as_bytes()),
            "fingerprint_rules": m.fingerprint.rules().map(KeptRules::to_json),
            "created_at": m.claimed_at_ms.map(time),
            "completed_at": null,
            "expires_at": expires_at,
            "lease_expires_at": time(m.lease_deadline_ms),
            "encryption_key_id": null,
        }),
        Record::Completed(c) => {
            // A sealed record is described without opening it (docs/behaviour.md §17):
            // its status and body size are inside the seal.
            let (status, body_bytes, key_id) = match &c.kept {
                Kept::Clear(response) => (
                    Some(response.status.as_u16()),
                    match &response.body {
                        StoredBody::Stored(body) => Some(body.len()),
                        StoredBody::TooLarge => None,
                    },
                    None,
                ),
                Kept::Sealed(sealed) => (None, None, Some(&*sealed.key_id)),
            };
            serde_json::json!({
                "id": id,
                "state": state_name(&found.record),
                "status": status,
                "replayable": c.replayable(),
                "body_bytes": body_bytes,
                "encryption_key_id": key_id,
                "fingerprint": hex(c.fingerprint.as_bytes()),
                "fingerprint_rules": c.fingerprint.rules().map(KeptRules::to_json),
                "created_at": c.times.map(|t| time(t.claimed_ms)),
                "completed_at": c.times.map(|t| time(t.completed_ms)),
                "expires_at": expires_at,
                "lease_expires_at": null,
            })
        }
    }
}

fn no_content() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

pub(super) fn json(value: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// In the shape `errors` gives every answer idemgate makes itself (docs/behaviour.md §16).
pub(super) fn problem(err: &AdminError, errors: &ErrorsConfig) -> Response<Full<Bytes>> {
    let problem = err.problem();
    let mut response = Response::new(Full::new(problem.body(errors)));
    *response.status_mut() = problem.status;
    let headers = response.headers_mut();
    for (name, value) in problem.headers(errors) {
        headers.append(name, value);
    }
    match err {
        AdminError::Unauthorized => {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"idemgate admin\""),
            );
        }
        AdminError::MethodNotAllowed => {
            headers.insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, DELETE, POST"),
            );
        }
        AdminError::Forbidden
        | AdminError::KeyNotFound
        | AdminError::InFlight
        | AdminError::StoreUnavailable(_)
        | AdminError::InvalidResolution(_)
        | AdminError::NotUnknown(_)
        | AdminError::InvalidListing(_) => {}
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: &[&str]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for value in authorization {
            map.append(
                header::AUTHORIZATION,
                HeaderValue::from_str(value).expect("visible"),
            );
        }
        map
    }

    const LOOPBACK: &str = "127.0.0.1:9901";
    const ANY: &str = "0.0.0.0:9901";

    #[test]
    fn a_token_is_required_exactly_when_set() {
        let token = AdminToken::new("s3cret-token");
        let on = |addr: &str| addr.parse::<SocketAddr>().expect("address");
        for local in [LOOPBACK, ANY] {
            let check = |h: &[&str]| authorize(Some(&token), on(local), &headers(h));
            assert!(check(&["Bearer s3cret-token"]).is_ok());
            assert!(check(&["bearer   s3cret-token"]).is_ok());
            for refused in [
                &[][..],
                &["Bearer s3cret-toke"],
                &["Bearer s3cret-token2"],
                &["Basic s3cret-token"],
                &["s3cret-token"],
                &["Bearer"],
                &["Bearer s3cret-token", "Bearer s3cret-token"],
            ] {
                assert!(
                    matches!(check(refused), Err(AdminError::Unauthorized)),
                    "{local} {refused:?}"
                );
            }
        }
        assert!(authorize(None, on(LOOPBACK), &headers(&[])).is_ok());
        assert!(authorize(None, on("[::1]:9901"), &headers(&[])).is_ok());
        assert!(matches!(
            authorize(None, on(ANY), &headers(&["Bearer anything"])),
            Err(AdminError::Forbidden)
        ));
    }

    #[test]
    fn ids_are_read_with_or_without_the_prefix() {
        let key = ScopedKey::from_bytes([0xab; 32]);
        let hex = key.to_hex();
        for id in [
            format!("idemgate:{hex}"),
            hex.clone(),
            hex.to_uppercase(),
            format!("idemgate%3A{hex}"),
            format!("idemgate%3a{hex}"),
        ] {
            assert_eq!(parse_id(&id, "idemgate:"), Some(key), "{id}");
        }
        for id in [
            String::new(),
            format!("other:{hex}"),
            format!("idemgate:{}", &hex[1..]),
            format!("idemgate:{hex}0"),
            format!("idemgate%3{hex}"),
            format!("idemgate%zz{hex}"),
            "%".to_owned(),
        ] {
            assert_eq!(parse_id(&id, "idemgate:"), None, "{id}");
        }
    }

    #[test]
    fn only_force_true_forces() {
        assert!(wants_force(Some("force=true")));
        assert!(wants_force(Some("a=1&force=true")));
        for q in [
            None,
            Some(""),
            Some("force=false"),
            Some("force"),
            Some("xforce=true"),
        ] {
            assert!(!wants_force(q), "{q:?}");
        }
    }
}
