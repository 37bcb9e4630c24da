//! The admin listener, never on the proxy port: `/healthz` (the process serves),
//! `/readyz` (the store answers within `store.timeout`), `/metrics` (Prometheus), and
//! the key API `/keys/{id}` (`keys.rs`, `resolve.rs` for `/keys/{id}/resolve`, `list.rs`
//! for `/keys?state=...`), the only part behind `admin.token`.

mod keys;
mod list;
mod resolve;

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::metrics::Format;
use crate::proxy::{Activity, AppState, Ended, drive};
use crate::store::Store;
use keys::Caller;

/// `/readyz` asks the store at most this often; probes in between get the last answer.
const READY_CHECK_EVERY: Duration = Duration::from_secs(1);

/// The last readiness answer and when it was taken.
#[derive(Debug, Default)]
pub struct Readiness(Mutex<Option<(Instant, bool)>>);

impl Readiness {
    fn cached(&self, now: Instant) -> Option<bool> {
        let last = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        last.filter(|(at, _)| now.duration_since(*at) < READY_CHECK_EVERY)
            .map(|(_, ready)| ready)
    }

    fn remember(&self, at: Instant, ready: bool) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((at, ready));
    }
}

/// Serves the admin endpoints until `shutdown` resolves.
pub async fn serve_admin<S: Store>(
    listener: TcpListener,
    state: Arc<AppState<S>>,
    shutdown: impl Future<Output = ()>,
) {
    let readiness = Arc::new(Readiness::default());
    let local = match listener.local_addr() {
        Ok(local) => local,
        Err(err) => {
            tracing::error!(error = %err, "admin listener has no address; not serving");
            return;
        }
    };
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = crate::proxy::accept(&listener) => accepted,
            () = &mut shutdown => return,
        };
        let caller = Caller { local, peer };
        let limit = state.config.listen_header_timeout;
        let idle = state.config.listen_idle_timeout;
        let state = Arc::clone(&state);
        let readiness = Arc::clone(&readiness);
        tokio::spawn(async move {
            let activity = Activity::default();
            let seen = activity.clone();
            let svc = service_fn(move |req| {
                let open = seen.start();
                let state = Arc::clone(&state);
                let readiness = Arc::clone(&readiness);
                async move {
                    let response = answer(&state, &readiness, req, caller).await;
                    drop(open);
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limit)
                .serve_connection(TokioIo::new(stream), svc);
            // Admin connections are not drained at shutdown: nothing stops them early.
            let never = tokio_util::sync::CancellationToken::new();
            match drive(conn, limit, idle, &activity, &never).await {
                Ended::Closed(Err(err)) => {
                    tracing::debug!(error = %err, "admin connection ended with an error");
                }
                Ended::Closed(Ok(())) => {}
                Ended::NoHead => {
                    tracing::debug!("admin connection closed: no request head in time");
                }
                Ended::Dropped => tracing::debug!("admin connection dropped: idle"),
            }
        });
    }
}

async fn answer<S: Store>(
    state: &AppState<S>,
    readiness: &Readiness,
    req: Request<Incoming>,
    caller: Caller,
) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if let Some(id) = path.strip_prefix("/keys/") {
        let id = id.to_owned();
        return keys::answer(state, req, &id, caller).await;
    }
    if path == "/keys" {
        return list::answer(state, req, caller).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if ready(state, readiness).await {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
            }
        }
        "/metrics" => {
            let format = metrics_format(req.headers());
            let body = state.metrics.render_as(format);
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(format.content_type()),
            );
            response
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz, /readyz, /metrics or /keys/{id}\n",
        ),
    }
}

/// OpenMetrics for a scraper that asks for it (Prometheus does), else the Prometheus
/// text format 0.0.4, which every reader understands (as Prometheus' own Go client does).
fn metrics_format(headers: &http::HeaderMap) -> Format {
    let asks_openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if asks_openmetrics {
        Format::OpenMetrics
    } else {
        Format::PrometheusText
    }
}

async fn ready<S: Store>(state: &AppState<S>, readiness: &Readiness) -> bool {
    let now = Instant::now();
    if let Some(ready) = readiness.cached(now) {
        return ready;
    }
    let ready = match state.store.ping().await {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!(error = %err, "readiness check: store unavailable");
            false
        }
    };
    readiness.remember(now, ready);
    ready
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
