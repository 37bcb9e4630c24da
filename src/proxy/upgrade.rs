//! Upgrades pass through: a passed-through request that asks for an upgrade
//! (`Connection: upgrade` with an `Upgrade` header) to a protocol listed in `upgrades`
//! is forwarded with those two headers kept (the `Upgrade` list cut down to the listed
//! protocols); when the upstream answers `101` naming one of them, the client's and the
//! upstream's connections are joined both ways, byte for byte, until either side
//! closes. A joined connection is no request any more: neither `listen_header_timeout`
//! nor `upstream.timeout` cut it, and shutdown closes it once `shutdown_timeout` has
//! passed.
//!
//! Everything joined is out of the guard's sight, so nothing else is: `h2c` is never
//! listed (every later request of a joined h2c connection would reach the upstream
//! unguarded), a request asking only for unlisted protocols is forwarded as a plain
//! request, and a `101` that names no protocol that was asked for is `502`.

use std::net::SocketAddr;

use http::header::{CONNECTION, HeaderMap, HeaderValue, UPGRADE};
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::body::{ProxyBody, RequestBody};
use super::state::{AppState, Live};
use super::upstream::{self, upstream_request};
use crate::error::ProxyError;
use crate::store::Store;

/// Whether a request asks for an upgrade: an `Upgrade` header, and `upgrade` among the
/// `Connection` options.
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|option| option.trim().eq_ignore_ascii_case("upgrade"))
}

/// The protocols of the request's `Upgrade` header that `upgrades` lists, as the
/// header to forward; `None` when it lists none of them.
pub(crate) fn listed(headers: &HeaderMap, upgrades: &[String]) -> Option<HeaderValue> {
    let kept: Vec<&str> = protocols_of(headers)
        .filter(|protocol| is_listed(protocol, upgrades))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join(", ")).ok()
}

/// The protocols an `Upgrade` header names, trimmed.
fn protocols_of(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

/// Whether `upgrades` lists `protocol` (`websocket` lists `WebSocket` and
/// `websocket/13`; an entry with a version lists that version only). `h2c` never is.
fn is_listed(protocol: &str, upgrades: &[String]) -> bool {
    let name = protocol.split_once('/').map_or(protocol, |(name, _)| name);
    if name.eq_ignore_ascii_case("h2c") {
        return false;
    }
    upgrades.iter().any(|entry| {
        if entry.contains('/') {
            entry.eq_ignore_ascii_case(protocol)
        } else {
            entry.eq_ignore_ascii_case(name)
        }
    })
}

/// Forwards an upgrade request asking for `protocols` (listed ones only); on a `101`
/// that names one of them, joins the two connections on a task of their own and
/// answers the client with the upstream's `101`.
pub(crate) async fn pass<S: Store, B: RequestBody>(
    state: &AppState<S>,
    live: &Live,
    mut req: Request<B>,
    protocols: HeaderValue,
    peer: SocketAddr,
) -> Result<Response<ProxyBody>, ProxyError> {
    let client_side = hyper::upgrade::on(&mut req);
    let (parts, body) = req.into_parts();
    let mut request = upstream_request(
        &live.config.upstream.url,
        parts,
        peer,
        ProxyBody::from_request(body),
    );
    request.headers_mut().insert(UPGRADE, protocols.clone());
    request
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    let started = Instant::now();
    let deadline = started + live.config.upstream.timeout;
    let sent = upstream::send_keeping_upgrade(live.client(), request, deadline).await;
    state.metrics.observe_upstream(started.elapsed());
    let mut response =
        sent.map_err(|failure| ProxyError::PassThroughFailed(Box::new(failure.into())))?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let asked: Vec<&str> = protocols
            .to_str()
            .map(|list| list.split(',').map(str::trim).collect())
            .unwrap_or_default();
        let switched: Vec<&str> = protocols_of(response.headers()).collect();
        let agreed = matches!(switched.as_slice(),
            [named] if asked.iter().any(|a| a.eq_ignore_ascii_case(named)));
        drop(switched);
        if !agreed {
            // Dropping the response closes the upstream connection unjoined.
            return Err(ProxyError::PassThroughFailed(Box::new(
                ProxyError::UpstreamUnreachable(
                    "the upstream answered 101 Switching Protocols naming no protocol that \
                     was asked for"
                        .into(),
                ),
            )));
        }
        let upstream_side = hyper::upgrade::on(&mut response);
        let closing = state.closing.clone();
        state.tunnels.spawn(async move {
            let (client, upstream) = match tokio::try_join!(client_side, upstream_side) {
                Ok(both) => both,
                Err(err) => {
                    tracing::debug!(error = %err, "an upgrade did not complete");
                    return;
                }
            };
            let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
            tokio::select! {
                joined = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                    if let Err(err) = joined {
                        tracing::debug!(error = %err, "an upgraded connection ended with an error");
                    }
                }
                () = closing.cancelled() => {}
            }
        });
    }
    Ok(response.map(ProxyBody::stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(UPGRADE, HeaderValue::from_str(value).expect("value"));
        headers
    }

    #[test]
    fn only_listed_protocols_are_kept_and_h2c_never() {
        let websocket = vec!["websocket".to_owned()];
        assert_eq!(
            listed(&upgrade("WebSocket"), &websocket)
                .as_ref()
                .map(HeaderValue::as_bytes),
            Some(&b"WebSocket"[..])
        );
        assert_eq!(
            listed(&upgrade("h2c, websocket/13"), &websocket)
                .as_ref()
                .map(HeaderValue::as_bytes),
            Some(&b"websocket/13"[..])
        );
        assert_eq!(listed(&upgrade("h2c"), &websocket), None);
        assert_eq!(listed(&upgrade("foo"), &websocket), None);
        let everything = vec!["h2c".to_owned(), "foo/2".to_owned()];
        assert_eq!(listed(&upgrade("h2c, H2C/1"), &everything), None);
        assert_eq!(listed(&upgrade("foo/1"), &everything), None);
        assert!(listed(&upgrade("FOO/2"), &everything).is_some());
        assert_eq!(listed(&upgrade("websocket"), &[]), None);
    }
}
