//! `reconcile` (docs/behaviour.md §18): before an unknown outcome is recorded, ask the
//! upstream whether it executed the request, by its key.
//!
//! The lookup is a read sent to the same upstream through the same pooled client; the
//! original request is never sent again, so however the lookup fails it cannot become a
//! second execution. Its headers are taken from the original request in
//! [`Lookup::capture`], before that request is consumed by the exchange.

use std::net::SocketAddr;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::response;
use http::{Request, StatusCode, Uri};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::body::{Capped, ProxyBody};
use super::budget::Held;
use super::upstream::{self, UpstreamClient, upstream_request};
use crate::config::Reconcile;
use crate::idempotency::IdempotencyKey;
use crate::telemetry::ShownPath;

/// Set on a response that a lookup, not the exchange itself, found: on the waiting
/// client's answer and, being stored, on every replay of it.
pub(crate) static IDEMPOTENCY_RECONCILED: HeaderName =
    HeaderName::from_static("idempotency-reconciled");

/// The first pause between two lookups, and the most it grows to.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// A lookup ready to be sent: the policy's `reconcile`, the client's raw key, and the
/// headers copied from the original request.
#[derive(Debug)]
pub(crate) struct Lookup<'p> {
    reconcile: &'p Reconcile,
    key: IdempotencyKey,
    headers: HeaderMap,
}

/// What the upstream said about the request.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// `2xx`: it executed; this answer, body read up to the limit, is its outcome.
    Executed(response::Parts, Capped<Incoming>),
    /// `404`: it did not execute.
    NotExecuted,
    /// Any other answer, or none from any attempt.
    Unknown,
}

/// What one answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Executed,
    NotExecuted,
    /// A `5xx`: the lookup failed, not the request; asked again.
    Again,
    Unknown,
}

fn classify(status: StatusCode) -> Class {
    match status {
        s if s.is_success() => Class::Executed,
        StatusCode::NOT_FOUND => Class::NotExecuted,
        s if s.is_server_error() => Class::Again,
        _ => Class::Unknown,
    }
}

impl<'p> Lookup<'p> {
    /// Copies the headers the lookup needs from the original request: `copy_headers`
    /// (its credentials, typically), and its `Host`, so that a virtual-hosted upstream
    /// is asked under the name it was sent the request under.
    pub(crate) fn capture(reconcile: &'p Reconcile, key: IdempotencyKey, from: &HeaderMap) -> Self {
        let mut headers = HeaderMap::new();
        for name in reconcile.copy_headers.iter().chain([&header::HOST]) {
            for value in from.get_all(name) {
                headers.append(name, value.clone());
            }
        }
        Self {
            reconcile,
            key,
            headers,
        }
    }

    /// The lookup request as the upstream gets it; `None` if its path is no valid URI
    /// (the configuration checks the path and the key is percent-encoded, so never).
    fn request(&self, upstream: &Uri, peer: SocketAddr) -> Option<Request<ProxyBody>> {
        let path = self.reconcile.path_for(self.key.as_str());
        let (mut parts, ()) = Request::builder()
            .method(self.reconcile.method.clone())
            .uri(path)
            .body(())
            .ok()?
            .into_parts();
        parts.headers = self.headers.clone();
        parts
            .extensions
            .insert(ShownPath(self.shown_path(upstream)));
        Some(upstream_request(upstream, parts, peer, ProxyBody::empty()))
    }

    /// The lookup's path as a span shows it: as sent (under the upstream's base path),
    /// but with `{key}` in place of the raw key (docs/behaviour.md §25); the record id
    /// identifies the key.
    fn shown_path(&self, upstream: &Uri) -> String {
        let path = &self.reconcile.path;
        let path = path
            .split_once('?')
            .map_or(path.as_str(), |(path, _query)| path);
        format!("{}{path}", upstream.path().trim_end_matches('/'))
    }

    /// Asks until an answer settles it or `attempts` are spent: a failed lookup (no
    /// connection, a reset, past `timeout`) or a `5xx` is tried again after a jittered,
    /// growing pause. A `2xx` body is read up to `limit` bytes, counted in `held`.
    pub(crate) async fn ask(
        &self,
        client: &UpstreamClient,
        upstream: &Uri,
        peer: SocketAddr,
        limit: u64,
        held: &mut Held,
    ) -> Verdict {
        let mut pause = FIRST_PAUSE;
        for attempt in 1..=self.reconcile.attempts {
            if attempt > 1 {
                tokio::time::sleep(jittered(pause)).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            let Some(request) = self.request(upstream, peer) else {
                return Verdict::Unknown;
            };
            let deadline = Instant::now() + self.reconcile.timeout;
            let response = match upstream::send(client, request, deadline).await {
                Ok(response) => response,
                Err(failure) => {
                    tracing::debug!(attempt, ?failure, "reconcile lookup failed");
                    continue;
                }
            };
            let (head, body) = response.into_parts();
            match classify(head.status) {
                Class::Executed => match upstream::read_body(body, limit, deadline, held).await {
                    Ok(capped) => return Verdict::Executed(head, capped),
                    Err(failure) => {
                        tracing::debug!(attempt, ?failure, "reconcile lookup body failed");
                    }
                },
                Class::NotExecuted => return Verdict::NotExecuted,
                Class::Unknown => {
                    tracing::warn!(status = %head.status, "reconcile lookup answered neither 2xx nor 404");
                    return Verdict::Unknown;
                }
                Class::Again => {
                    tracing::debug!(attempt, status = %head.status, "reconcile lookup answered 5xx");
                }
            }
        }
        Verdict::Unknown
    }
}

/// Marks a lookup's answer as one, for the waiting client and every replay.
pub(crate) fn mark_reconciled(headers: &mut HeaderMap) {
    headers.insert(&IDEMPOTENCY_RECONCILED, HeaderValue::from_static("true"));
}

/// Between half of `pause` and all of it, so that the lookups of many requests that
/// timed out together do not reach a struggling upstream together.
fn jittered(pause: Duration) -> Duration {
    let half = pause / 2;
    half + half.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reconcile() -> Reconcile {
        Reconcile {
            method: http::Method::GET,
            path: "/charges/by-key/{key}".to_owned(),
            copy_headers: vec![header::AUTHORIZATION],
            timeout: Duration::from_secs(1),
            attempts: 3,
        }
    }

    #[test]
    fn answers_are_classified_as_the_contract_says() {
        assert_eq!(classify(StatusCode::OK), Class::Executed);
        assert_eq!(classify(StatusCode::CREATED), Class::Executed);
        assert_eq!(classify(StatusCode::NOT_FOUND), Class::NotExecuted);
        assert_eq!(classify(StatusCode::INTERNAL_SERVER_ERROR), Class::Again);
        assert_eq!(classify(StatusCode::SERVICE_UNAVAILABLE), Class::Again);
        for other in [
            StatusCode::FORBIDDEN,
            StatusCode::GONE,
            StatusCode::MOVED_PERMANENTLY,
            StatusCode::CONFLICT,
        ] {
            assert_eq!(classify(other), Class::Unknown, "{other}");
        }
    }

    #[test]
    fn the_lookup_copies_only_the_listed_headers_and_the_host() {
        let r = reconcile();
        let mut original = HeaderMap::new();
        original.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        original.insert(header::HOST, HeaderValue::from_static("api.example"));
        original.insert(header::COOKIE, HeaderValue::from_static("s=1"));
        original.insert(header::CONTENT_TYPE, HeaderValue::from_static("x/y"));
        let key = crate::idempotency::key::parse_value(b"order#7/a").expect("key");
        let lookup = Lookup::capture(&r, key, &original);
        let upstream: Uri = "http://10.0.0.1:8080/base".parse().expect("uri");
        let peer: SocketAddr = "127.0.0.1:5000".parse().expect("addr");
        let request = lookup.request(&upstream, peer).expect("a valid request");
        assert_eq!(request.method(), http::Method::GET);
        assert_eq!(
            request.uri().to_string(),
            "http://10.0.0.1:8080/base/charges/by-key/order%237%2Fa"
        );
        assert_eq!(
            request
                .extensions()
                .get::<ShownPath>()
                .map(|p| p.0.as_str()),
            Some("/base/charges/by-key/{key}"),
            "a span shows the path without the raw key"
        );
        let headers = request.headers();
        assert_eq!(headers[header::AUTHORIZATION], "Bearer t");
        assert_eq!(headers[header::HOST], "api.example");
        assert!(!headers.contains_key(header::COOKIE));
        assert!(!headers.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn pauses_are_jittered_within_half_and_all_of_the_period() {
        for _ in 0..1000 {
            let wait = jittered(Duration::from_millis(200));
            assert!(wait >= Duration::from_millis(100) && wait <= Duration::from_millis(200));
        }
    }
}
