//! The HTTP servers the harness runs itself: the upstream and the OTLP sink (in the
//! harness process) and the baseline plain reverse proxy (in a child process, see
//! [`plain_proxy_main`]).

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::{BoxError, load};

/// What the upstream answers to every request: a charge, about 200 bytes of JSON.
pub(crate) const RESPONSE_BODY: &str = concat!(
    r#"{"id":"ch_3MmlLrLkdIwHu7ix0snN0B15","object":"charge","amount":4200,"#,
    r#""currency":"eur","status":"succeeded","customer":"cus_9s6XKzkNRiz8i3","#,
    r#""created":1700000000,"paid":true,"captured":true,"livemode":false}"#,
);

/// A charge like [`RESPONSE_BODY`], padded in its `description` to exactly `len` bytes
/// of JSON (at least [`RESPONSE_BODY`]'s length): the memory mode's 1 KiB response.
pub(crate) fn padded_body(len: usize) -> Bytes {
    let head =
        r#"{"id":"ch_3MmlLrLkdIwHu7ix0snN0B15","object":"charge","amount":4200,"description":""#;
    let tail = concat!(
        r#"","currency":"eur","status":"succeeded","customer":"cus_9s6XKzkNRiz8i3","#,
        r#""created":1700000000,"paid":true,"captured":true,"livemode":false}"#,
    );
    let pad = len.saturating_sub(head.len() + tail.len());
    let mut body = String::with_capacity(len);
    body.push_str(head);
    body.extend(std::iter::repeat_n('x', pad));
    body.push_str(tail);
    Bytes::from(body)
}

/// The longest wait [`upstream`] honours in [`load::DELAY_HEADER`].
const MAX_DELAY: Duration = Duration::from_secs(10);

/// Serves the upstream on `listener` until the task is dropped: reads the whole request
/// body, answers `201` with `body` (the scenarios: [`RESPONSE_BODY`]; the memory mode:
/// [`padded_body`]), keeps the connection alive. A request with the header
/// [`load::DELAY_HEADER`] (the `slow` scenario) is answered that many milliseconds
/// later, up to [`MAX_DELAY`]: a tokio sleep, which holds no thread.
pub(crate) async fn upstream(listener: TcpListener, body: Bytes) {
    serve(listener, move |req| {
        let body = body.clone();
        async move {
            let delay = req
                .headers()
                .get(load::DELAY_HEADER)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .map(|ms| Duration::from_millis(ms).min(MAX_DELAY));
            let check = req.uri().path() == crate::procs::AUTH_CHECK;
            // A real backend reads what it was sent; so does this one.
            let _ = req.into_body().collect().await;
            // `replay_authorization`'s check (the memory-authz target): allowed, no body.
            if check {
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::NO_CONTENT;
                return response;
            }
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let mut response = Response::new(Full::new(body));
            *response.status_mut() = StatusCode::CREATED;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
    })
    .await;
}

/// Serves an OpenTelemetry collector that keeps nothing on `listener`, for the
/// `memory-otlp` target: every export is read whole and answered `200` with an empty
/// `ExportTraceServiceResponse` (an empty protobuf message is zero bytes), as fast as a
/// collector on the same host could.
pub(crate) async fn otlp_sink(listener: TcpListener) {
    serve(listener, |req| async move {
        let _ = req.into_body().collect().await;
        let mut response = Response::new(Full::new(Bytes::new()));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        response
    })
    .await;
}

/// Serves HTTP/1.1 keep-alive connections on `listener` (with `TCP_NODELAY`), each
/// request answered by `answer`, until the task is dropped.
async fn serve<F, Fut>(listener: TcpListener, answer: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let answer = answer.clone();
        let svc = service_fn(move |req: Request<Incoming>| {
            let reply = answer(req);
            async move { Ok::<_, Infallible>(reply.await) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Headers that describe one connection (RFC 9110 §7.6.1), dropped both ways, as any
/// reverse proxy does.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

type PlainClient = Client<HttpConnector, Incoming>;
type PlainBody = Either<Incoming, Full<Bytes>>;

/// `harness --plain-proxy LISTEN UPSTREAM`: the baseline. The least a reverse proxy on
/// the same stack as idemgate does (hyper-util's auto server with the same HTTP/1
/// settings, its pooled client with `TCP_NODELAY`, the default multi-thread runtime,
/// hop-by-hop headers dropped, `X-Forwarded-*` added), with bodies streamed both ways.
/// It runs in its own process so that it competes for the CPUs exactly like idemgate,
/// and exits when its stdin closes, so it cannot outlive the harness.
pub(crate) fn plain_proxy_main(listen: &str, upstream: &str) -> ExitCode {
    match plain_proxy(listen, upstream) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("plain proxy: {err}");
            ExitCode::FAILURE
        }
    }
}

fn plain_proxy(listen: &str, upstream: &str) -> Result<(), BoxError> {
    let listen: SocketAddr = listen.parse()?;
    let upstream: Uri = upstream.parse()?;
    let authority = upstream
        .authority()
        .ok_or("the upstream URL has no authority")?
        .clone();
    std::thread::spawn(|| {
        // EOF (or an error) on stdin: the harness is gone.
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: PlainClient = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30))
            .keep_alive(true);
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(conn) => conn,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let client = client.clone();
            let authority = authority.clone();
            let svc = service_fn(move |req| forward(client.clone(), authority.clone(), req, peer));
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    })
}

async fn forward(
    client: PlainClient,
    authority: http::uri::Authority,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<PlainBody>, Infallible> {
    #[cfg(feature = "alloc-stats")]
    if req.method() == http::Method::GET && req.uri().path() == ALLOC_STATS_PATH {
        return Ok(alloc_stats());
    }
    let (mut parts, body) = req.into_parts();
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(http::uri::Scheme::HTTP);
    uri.authority = Some(authority);
    uri.path_and_query = parts.uri.path_and_query().cloned();
    let Ok(uri) = Uri::from_parts(uri) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    if let Ok(ip) = HeaderValue::from_str(&peer.ip().to_string()) {
        parts.headers.append("x-forwarded-for", ip);
    }
    parts
        .headers
        .insert("x-forwarded-proto", HeaderValue::from_static("http"));
    match client.request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut head, body) = response.into_parts();
            for name in &HOP_BY_HOP {
                head.headers.remove(name);
            }
            Ok(Response::from_parts(head, Either::Left(body)))
        }
        Err(_) => Ok(status(StatusCode::BAD_GATEWAY)),
    }
}

fn status(code: StatusCode) -> Response<PlainBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    *response.status_mut() = code;
    response
}

/// The path at which the plain proxy answers its own allocation totals, in a build with
/// the feature `alloc-stats` (the harness's `--account`); never forwarded then.
pub(crate) const ALLOC_STATS_PATH: &str = "/-/alloc-stats";

/// The plain proxy's allocation totals since it started, as idemgate's `/metrics` shows
/// its own: `idemgate_alloc_calls_total N` and `idemgate_alloc_bytes_total N`, one a
/// line. The counting allocator is idemgate's (the library this harness links declares
/// it, src/alloc_stats.rs), so the two processes count the same way; its totals are
/// read through the only door the library opens on them, a [`Metrics`] registry,
/// made once.
///
/// [`Metrics`]: idemgate::metrics::Metrics
#[cfg(feature = "alloc-stats")]
fn alloc_stats() -> Response<PlainBody> {
    static METRICS: std::sync::OnceLock<idemgate::metrics::Metrics> = std::sync::OnceLock::new();
    let text = METRICS
        .get_or_init(idemgate::metrics::Metrics::new)
        .render();
    let totals: String = text
        .lines()
        .filter(|line| {
            line.starts_with("idemgate_alloc_calls_total ")
                || line.starts_with("idemgate_alloc_bytes_total ")
        })
        .flat_map(|line| [line, "\n"])
        .collect();
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(totals))));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
