//! The pooled client to the upstream, [`send`] and its failure classes, and the header
//! rewriting of RFC 9110 §7.6.1. Pass-through and the guarded exchange both send here.

use std::net::SocketAddr;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::Instant;

use super::body::{Capped, ProxyBody, collect_capped};
use super::budget::Held;
use super::connector::UpstreamConnector;
use crate::config::{UpstreamConfig, tls_client_config};
use crate::error::{BoxError, ProxyError, UnknownCause};
use crate::telemetry;
use crate::worker::PerWorker;

pub type UpstreamClient = Client<UpstreamConnector, ProxyBody>;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1, plus the
/// proxy authentication pair, which is meant for a proxy and not the origin).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Why a `101` is refused where no upgrade was forwarded.
pub(crate) const UNASKED_SWITCH: &str =
    "the upstream answered 101 Switching Protocols to a request that asked for no upgrade";

/// A header that only means something with an `Upgrade: h2c`, which is never forwarded.
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// How long a pooled upstream connection may sit unused before it is closed.
const POOL_IDLE: Duration = Duration::from_secs(30);

/// A pooled HTTP/1.1 client. hyper retries a request only when the pooled connection
/// closed before any byte of it was written (`retry_canceled_requests`), which can never
/// execute it twice; every other failure is reported to us.
///
/// For an `https://` upstream the server certificate is verified against the system
/// store plus `upstream.tls.ca_file` (docs/behaviour.md §11); the TLS handshake has
/// `connect_timeout` too.
///
/// One client, each with its own pool, for each of `workers` workers (a pooled
/// connection is driven on the runtime that opened it); the trust store is read once.
pub(crate) fn clients(config: &UpstreamConfig, workers: usize) -> PerWorker<UpstreamClient> {
    let tls = if config.url.scheme_str() == Some("https") {
        tls_client_config(config.tls.as_ref(), system_roots())
            .map_err(|(path, msg)| format!("{path}: {msg}"))
    } else {
        Err("the upstream URL is http://".to_owned())
    };
    PerWorker::new(workers, |_| {
        pooled(config.connect_timeout, POOL_IDLE, tls.clone())
    })
}

/// The pooled clients of `replay_authorization`'s `url`s (docs/behaviour.md §24), one
/// per worker as [`clients`]: with the upstream's TLS settings (`upstream.tls` and the
/// system store) and `connect_timeout`, whatever the upstream's scheme. A pool keeps
/// connections per authority, so one client serves every such `url`.
pub(crate) fn authorizer_clients(
    config: &UpstreamConfig,
    workers: usize,
) -> PerWorker<UpstreamClient> {
    let tls = tls_client_config(config.tls.as_ref(), system_roots())
        .map_err(|(path, msg)| format!("{path}: {msg}"));
    PerWorker::new(workers, |_| {
        pooled(config.connect_timeout, POOL_IDLE, tls.clone())
    })
}

/// The system trust store; certificates it holds that rustls cannot parse are skipped,
/// and an unreadable store leaves `ca_file` as the only trust anchors.
pub(super) fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for err in &native.errors {
        tracing::warn!(error = %err, "reading the system trust store for the https upstream");
    }
    let (added, skipped) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(
        added,
        skipped,
        "system trust anchors for the https upstream"
    );
    roots
}

fn pooled(
    connect_timeout: Duration,
    idle: Duration,
    tls: Result<rustls::ClientConfig, String>,
) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    // https:// URLs reach the connector too; ours does the TLS on top.
    http.enforce_http(false);
    let connector = UpstreamConnector::new(http, tls, connect_timeout);
    Client::builder(TokioExecutor::new())
        .retry_canceled_requests(true)
        // Without a timer the pool never closes an idle connection, whatever the timeout.
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(idle)
        .build(connector)
}

/// Why an exchange with the upstream failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No connection was made: the request was never written, a retry may execute.
    Unreachable(BoxError),
    /// The request may have been written: the upstream may have executed it.
    Unknown {
        cause: UnknownCause,
        source: Option<BoxError>,
    },
}

impl Failure {
    /// What a trace says of it.
    fn describe(&self) -> String {
        match self {
            Failure::Unreachable(source) => format!("could not connect: {source}"),
            Failure::Unknown {
                cause,
                source: Some(source),
            } => format!("{cause:?}: {source}"),
            Failure::Unknown {
                cause,
                source: None,
            } => format!("{cause:?}"),
        }
    }
}

impl From<Failure> for ProxyError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Unreachable(source) => ProxyError::UpstreamUnreachable(source),
            Failure::Unknown { cause, source } => ProxyError::OutcomeUnknown { cause, source },
        }
    }
}

/// Sends `request` and waits for the response head until `deadline`. Hop-by-hop headers
/// of the response are removed.
pub(crate) async fn send(
    client: &UpstreamClient,
    request: Request<ProxyBody>,
    deadline: Instant,
) -> Result<Response<Incoming>, Failure> {
    let mut response = send_raw(client, request, deadline).await?;
    strip_hop_by_hop(response.headers_mut());
    Ok(response)
}

async fn send_raw(
    client: &UpstreamClient,
    mut request: Request<ProxyBody>,
    deadline: Instant,
) -> Result<Response<Incoming>, Failure> {
    // Traced: the upstream sees this call's span as its parent (docs/behaviour.md §20).
    let Some(span) = telemetry::upstream(&mut request) else {
        return exchange_head(client, request, deadline).await;
    };
    let sent = exchange_head(client, request, deadline).await;
    let answered = match &sent {
        Ok(response) => Ok(response.status()),
        Err(failure) => Err(failure.describe()),
    };
    telemetry::upstream_ended(span, answered);
    sent
}

async fn exchange_head(
    client: &UpstreamClient,
    request: Request<ProxyBody>,
    deadline: Instant,
) -> Result<Response<Incoming>, Failure> {
    match tokio::time::timeout_at(deadline, client.request(request)).await {
        Err(_) => Err(Failure::Unknown {
            cause: UnknownCause::Timeout,
            source: None,
        }),
        Ok(Err(err)) if err.is_connect() || refused_in_tls_handshake(&err) => {
            Err(Failure::Unreachable(err.into()))
        }
        Ok(Err(err)) => Err(Failure::Unknown {
            cause: UnknownCause::Reset,
            source: Some(err.into()),
        }),
        Ok(Ok(response)) => Ok(response),
    }
}

/// Whether the upstream's TLS layer refused the connection with a handshake alert.
///
/// Under TLS 1.3 the client's handshake is over before the server has checked the
/// client certificate, so a server that requires one (mutual TLS) and got none or a bad
/// one answers the first write with an alert such as `certificate_required`: the
/// request was written into a connection the server never accepted, and never reached
/// its application. These alerts belong to the handshake only, so a connection that
/// once carried an exchange cannot produce them.
fn refused_in_tls_handshake(err: &hyper_util::client::legacy::Error) -> bool {
    use rustls::AlertDescription as A;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(current) = next {
        let tls = current.downcast_ref::<rustls::Error>().or_else(|| {
            current
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::AlertReceived(alert)) = tls {
            return matches!(
                alert,
                A::CertificateRequired
                    | A::BadCertificate
                    | A::UnsupportedCertificate
                    | A::CertificateRevoked
                    | A::CertificateExpired
                    | A::CertificateUnknown
                    | A::UnknownCA
                    | A::HandshakeFailure
                    | A::AccessDenied
            );
        }
        next = current.source();
    }
    false
}

/// [`send`] for a request that asks for an upgrade: a `101` answer keeps its `Upgrade`
/// header and `Connection: upgrade`, which make it one.
pub(crate) async fn send_keeping_upgrade(
    client: &UpstreamClient,
    request: Request<ProxyBody>,
    deadline: Instant,
) -> Result<Response<Incoming>, Failure> {
    let mut response = send_raw(client, request, deadline).await?;
    let switching = response.status() == http::StatusCode::SWITCHING_PROTOCOLS;
    let protocol = response.headers().get(header::UPGRADE).cloned();
    strip_hop_by_hop(response.headers_mut());
    if let (true, Some(protocol)) = (switching, protocol) {
        response.headers_mut().insert(header::UPGRADE, protocol);
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    Ok(response)
}

/// Reads a response body up to `limit` bytes until `deadline`: the rest of the same
/// exchange, failing the same ways.
pub(crate) async fn read_body(
    body: Incoming,
    limit: u64,
    deadline: Instant,
    held: &mut Held,
) -> Result<Capped<Incoming>, Failure> {
    match tokio::time::timeout_at(deadline, collect_capped(body, limit, held)).await {
        Err(_) => Err(Failure::Unknown {
            cause: UnknownCause::Timeout,
            source: None,
        }),
        Ok(Err(err)) => Err(Failure::Unknown {
            cause: UnknownCause::Reset,
            source: Some(err.into()),
        }),
        // A counting share never refuses; should one be passed, say so.
        Ok(Ok(Capped::OverBudget)) => Err(Failure::Unknown {
            cause: UnknownCause::Reset,
            source: Some("max_buffered_bytes refused a response body".into()),
        }),
        Ok(Ok(capped)) => Ok(capped),
    }
}

/// Whether `name` is hop-by-hop in a message whose `Connection` names `named`.
pub(crate) fn is_hop_by_hop(name: &HeaderName, named: &[HeaderName]) -> bool {
    HOP_BY_HOP.contains(name) || named.contains(name)
}

/// Headers named in `Connection` are hop-by-hop too.
pub(crate) fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

/// Removes hop-by-hop headers in place.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named = connection_named(headers);
    for name in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(name);
    }
}

/// Builds the request to the upstream: same method, path and query on the upstream's
/// authority, hop-by-hop headers dropped, `X-Forwarded-*` added. The `Host` the client
/// sent is kept, as a transparent sidecar would.
pub(crate) fn upstream_request(
    upstream: &Uri,
    mut parts: Parts,
    client: SocketAddr,
    body: ProxyBody,
) -> Request<ProxyBody> {
    let mut target = upstream.clone().into_parts();
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let base = upstream.path().trim_end_matches('/');
    target.path_and_query = if base.is_empty() {
        parts.uri.path_and_query().cloned()
    } else {
        format!("{base}{pq}").parse().ok()
    };
    if target.path_and_query.is_none() {
        target.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    if !parts.headers.contains_key(header::HOST)
        && let Some(authority) = parts.uri.authority()
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        parts.headers.insert(header::HOST, host);
    }
    // Only the path and query changed, which were valid in the request; the scheme and
    // authority come from the validated upstream URL.
    parts.uri = Uri::from_parts(target).unwrap_or_else(|_| upstream.clone());
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(&HTTP2_SETTINGS);
    add_forwarded(&mut parts.headers, client);
    Request::from_parts(parts, body)
}

/// `X-Forwarded-For` is appended to (several header lines are folded into one list),
/// `X-Forwarded-Proto` is set.
fn add_forwarded(headers: &mut HeaderMap, client: SocketAddr) {
    let ip = client.ip().to_string();
    // Most requests come with none: then the address is the value, in the one
    // allocation that formatted it (BENCHMARKS.md, issue 29).
    let value = if headers.contains_key(&X_FORWARDED_FOR) {
        let mut prior: Vec<&str> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .collect();
        prior.push(&ip);
        prior.join(", ")
    } else {
        ip
    };
    // Built from visible ASCII values and an IP address.
    if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(&X_FORWARDED_FOR, value);
    }
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::builder().method("POST").uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    #[test]
    fn keeps_path_and_query_and_rewrites_authority() {
        let up: Uri = "http://127.0.0.1:9000".parse().expect("uri");
        let req = upstream_request(
            &up,
            parts("/charges/1?x=%20y", &[]),
            "10.0.0.1:5".parse().expect("addr"),
            ProxyBody::empty(),
        );
        assert_eq!(
            req.uri().to_string(),
            "http://127.0.0.1:9000/charges/1?x=%20y"
        );
        let base: Uri = "http://127.0.0.1:9000/api/".parse().expect("uri");
        let req = upstream_request(
            &base,
            parts("/charges?a", &[]),
            "10.0.0.1:5".parse().expect("addr"),
            ProxyBody::empty(),
        );
        assert_eq!(req.uri().to_string(), "http://127.0.0.1:9000/api/charges?a");
    }

    #[test]
    fn drops_hop_by_hop_and_connection_named_headers() {
        let up: Uri = "http://127.0.0.1:9000".parse().expect("uri");
        let p = parts(
            "/",
            &[
                ("connection", "keep-alive, x-secret-hop"),
                ("x-secret-hop", "1"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("upgrade", "websocket"),
                ("proxy-authorization", "Basic x"),
                ("idempotency-key", "k1"),
                ("authorization", "Bearer t"),
            ],
        );
        let req = upstream_request(
            &up,
            p,
            "127.0.0.1:5".parse().expect("addr"),
            ProxyBody::empty(),
        );
        let h = req.headers();
        for gone in [
            "connection",
            "x-secret-hop",
            "keep-alive",
            "te",
            "upgrade",
            "proxy-authorization",
        ] {
            assert!(!h.contains_key(gone), "{gone} must be dropped");
        }
        assert_eq!(h["idempotency-key"], "k1");
        assert_eq!(h["authorization"], "Bearer t");
    }

    #[test]
    fn appends_x_forwarded_for() {
        let up: Uri = "http://127.0.0.1:9000".parse().expect("uri");
        let p = parts(
            "/",
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "2.2.2.2, 3.3.3.3"),
                ("x-forwarded-proto", "https"),
            ],
        );
        let req = upstream_request(
            &up,
            p,
            "127.0.0.9:5".parse().expect("addr"),
            ProxyBody::empty(),
        );
        assert_eq!(
            req.headers()["x-forwarded-for"],
            "1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.9"
        );
        assert_eq!(req.headers()["x-forwarded-proto"], "http");
        let req = upstream_request(
            &up,
            parts("/", &[]),
            "127.0.0.9:5".parse().expect("addr"),
            ProxyBody::empty(),
        );
        assert_eq!(req.headers()["x-forwarded-for"], "127.0.0.9");
    }

    /// A pooled connection left unused past the idle timeout is closed: without a timer
    /// the pool kept every one of them open for good.
    #[tokio::test]
    async fn an_idle_pooled_connection_is_closed() {
        use hyper::server::conn::http1;
        use hyper::service::service_fn;
        use hyper_util::rt::TokioIo;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (closed, mut closes) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let closed = closed.clone();
                tokio::spawn(async move {
                    let svc = service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(ProxyBody::empty()))
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                    let _ = closed.send(());
                });
            }
        });
        let client = pooled(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Err("http only".to_owned()),
        );
        let uri: Uri = format!("http://{addr}/").parse().expect("uri");
        let response = client
            .request(Request::get(uri).body(ProxyBody::empty()).expect("request"))
            .await
            .expect("response");
        assert_eq!(response.status(), 200);
        drop(response);
        tokio::time::timeout(Duration::from_secs(10), closes.recv())
            .await
            .expect("the idle connection was never closed")
            .expect("server task");
    }
}
