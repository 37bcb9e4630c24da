//! Upgrades pass through (SPEC §11): a passed-through request that asks for an upgrade
//! (`Connection: upgrade` with an `Upgrade` header) is forwarded with those two headers
//! kept; when the upstream answers `101`, the client's and the upstream's connections
//! are joined both ways, byte for byte, until either side closes. A joined connection
//! is no request any more: neither `listen_header_timeout` nor `upstream.timeout` cut
//! it, and shutdown closes it once `shutdown_timeout` has passed.

use std::net::SocketAddr;

use http::header::{CONNECTION, HeaderMap, HeaderValue, UPGRADE};
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::body::{ProxyBody, RequestBody};
use super::upstream::{self, upstream_request};
use super::{AppState, Live};
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

/// Forwards an upgrade request; on `101`, joins the two connections on a task of their
/// own and answers the client with the upstream's `101`.
pub(crate) async fn pass<S: Store, B: RequestBody>(
    state: &AppState<S>,
    live: &Live,
    mut req: Request<B>,
    peer: SocketAddr,
) -> Result<Response<ProxyBody>, ProxyError> {
    let client_side = hyper::upgrade::on(&mut req);
    let (parts, body) = req.into_parts();
    let protocol = parts.headers.get(UPGRADE).cloned();
    let mut request = upstream_request(
        &live.config.upstream.url,
        parts,
        peer,
        ProxyBody::from_request(body),
    );
    if let Some(protocol) = &protocol {
        request.headers_mut().insert(UPGRADE, protocol.clone());
        request
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let started = Instant::now();
    let deadline = started + live.config.upstream.timeout;
    let sent = upstream::send_keeping_upgrade(live.client(), request, deadline).await;
    state.metrics.observe_upstream(started.elapsed());
    let mut response =
        sent.map_err(|failure| ProxyError::PassThroughFailed(Box::new(failure.into())))?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
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
