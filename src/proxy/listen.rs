//! What a client connection may hold, and for how long: the accept loop's error
//! handling, and [`drive`], which runs one connection under the deadlines that hyper
//! does not keep itself.
//!
//! - A connection that sends no complete request head within `listen_header_timeout`
//!   is closed: HTTP/1 and HTTP/2 alike, and before the protocol is known, which
//!   hyper's own header timeout does not cover.
//! - A connection with no request open (a response still being sent counts as open)
//!   for `listen_idle_timeout` is shut down gracefully (`GOAWAY` on HTTP/2, a close
//!   between requests on HTTP/1): an HTTP/2
//!   session idle after one request would otherwise hold its place in
//!   `max_connections` for ever, and a few of them fill the proxy.
//! - Shutdown asks every connection to finish gracefully in the same way.
//!
//! [`serve`] is the accept loop of one worker: each connection gets its place in
//! `max_connections`, the handler as its service, and [`drive`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use super::body::ProxyBody;
use super::handler;
use super::state::AppState;
use crate::store::Store;

/// What a connection's service tells the connection's driver: whether a request head
/// arrived, how many requests are open, when the last one ended.
#[derive(Debug, Clone)]
pub(crate) struct Activity(Arc<Counts>);

#[derive(Debug)]
struct Counts {
    seen: AtomicBool,
    open: AtomicUsize,
    /// When the last request ended, in milliseconds after `born`.
    last_end_ms: AtomicU64,
    born: Instant,
}

impl Default for Activity {
    fn default() -> Self {
        Self(Arc::new(Counts {
            seen: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
            born: Instant::now(),
        }))
    }
}

impl Activity {
    /// A request head arrived; the request is open until the guard drops.
    pub(crate) fn start(&self) -> Open {
        if !self.0.seen.load(Ordering::Relaxed) {
            self.0.seen.store(true, Ordering::Relaxed);
        }
        self.0.open.fetch_add(1, Ordering::Relaxed);
        Open(self.clone())
    }

    fn seen(&self) -> bool {
        self.0.seen.load(Ordering::Relaxed)
    }

    /// When the connection will have been idle for `limit`, if nothing starts: `None`
    /// while a request is open.
    fn idle_at(&self, limit: Duration) -> Option<Instant> {
        if self.0.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ended = Duration::from_millis(self.0.last_end_ms.load(Ordering::Acquire));
        Some(self.0.born + ended + limit)
    }
}

/// An open request of a connection; dropped when its handler has answered.
#[derive(Debug)]
pub(crate) struct Open(Activity);

/// A response body that keeps its request open for the connection's idle count until
/// hyper has sent it (and drops it).
struct Sending {
    body: ProxyBody,
    _open: Open,
}

impl hyper::body::Body for Sending {
    type Data = bytes::Bytes;
    type Error = crate::error::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let counts = &self.0.0;
        let now = u64::try_from(counts.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        counts.last_end_ms.fetch_max(now, Ordering::Release);
        counts.open.fetch_sub(1, Ordering::Release);
    }
}

/// How a connection ended.
#[derive(Debug)]
pub(crate) enum Ended<E> {
    /// The connection finished (the client closed, or it went away when asked).
    Closed(Result<(), E>),
    /// No complete request head within `listen_header_timeout`.
    NoHead,
    /// Asked to go away when idle, it did not within another idle period (a client
    /// that reads nothing must not keep its place).
    Dropped,
}

/// Drives a connection to its end under the header and idle deadlines, and shuts it
/// down gracefully when `stop` is cancelled.
pub(crate) async fn drive<C: GracefulConnection>(
    conn: C,
    header_limit: Duration,
    idle_limit: Duration,
    activity: &Activity,
    stop: &CancellationToken,
) -> Ended<C::Error> {
    tokio::pin!(conn);
    let head_by = Instant::now() + header_limit;
    loop {
        let now = Instant::now();
        let wake = if activity.seen() {
            // While a request is open, look again after a whole idle period: it cannot
            // have been idle for longer by then.
            activity.idle_at(idle_limit).unwrap_or(now + idle_limit)
        } else {
            // A first request may come and go before the head deadline.
            head_by.min(now + idle_limit)
        };
        tokio::select! {
            out = &mut conn => return Ended::Closed(out),
            () = tokio::time::sleep_until(wake) => {}
            // Shutdown waits for open requests; `shutdown_timeout` bounds it.
            () = stop.cancelled() => return going_away(conn, None).await,
        }
        if !activity.seen() {
            if Instant::now() < head_by {
                continue;
            }
            conn.as_mut().graceful_shutdown();
            // A silent client is not waited for: the socket is dropped.
            return match tokio::time::timeout(Duration::ZERO, &mut conn).await {
                Ok(out) => Ended::Closed(out),
                Err(_) => Ended::NoHead,
            };
        }
        if activity
            .idle_at(idle_limit)
            .is_some_and(|at| at <= Instant::now())
        {
            return going_away(conn, Some(idle_limit)).await;
        }
    }
}

/// Asks the connection to finish (`GOAWAY`; HTTP/1 closes after the response being
/// written), and drops it if it has not within `cap`.
async fn going_away<C: GracefulConnection>(
    mut conn: std::pin::Pin<&mut C>,
    cap: Option<Duration>,
) -> Ended<C::Error> {
    conn.as_mut().graceful_shutdown();
    match cap {
        None => Ended::Closed(conn.await),
        Some(cap) => match tokio::time::timeout(cap, conn).await {
            Ok(out) => Ended::Closed(out),
            Err(_) => Ended::Dropped,
        },
    }
}

/// The next connection. Accept errors (out of file descriptors and the like) are logged
/// and waited out instead of spinning; they never end a listener.
pub async fn accept(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(conn) => return conn,
            Err(err) => {
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// How serving ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Every in-flight request finished and was recorded.
    Drained,
    /// `shutdown_timeout` passed first; abandoned markers follow the lease rules.
    TimedOut,
}

/// How often [`keep_a_timer_near`] ticks: half the store's deadline, so that every
/// store call's deadline lies beyond the timer it keeps, within 10 to 250 ms.
fn near_timer_period(store_timeout: Duration) -> Duration {
    (store_timeout / 2).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// Keeps a timer due within `period` on this runtime while it serves. tokio wakes its
/// own driver (an `eventfd` write, and an `epoll_wait` that returns at once) whenever a
/// timer is set to fire before the earliest one it knew of when the runtime last parked.
/// With no timer pending at that moment, which is every idle moment of a worker, the
/// deadline of the next store call paid that: 0.28 `write` and as many `epoll_wait` per
/// first execution on Redis (BENCHMARKS.md, "Valkey and native fencing"). A deadline
/// later than a pending timer is only inserted into the wheel.
async fn keep_a_timer_near(period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// Serves until `shutdown` resolves, then stops accepting at once and lets in-flight
/// requests (and their recordings) finish for up to `shutdown_timeout`.
pub async fn serve<S: Store>(
    listener: TcpListener,
    state: Arc<AppState<S>>,
    shutdown: impl Future<Output = ()>,
) -> Shutdown {
    let header_timeout = state.config.listen_header_timeout;
    let idle_timeout = state.config.listen_idle_timeout;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        // Each open connection keeps a read buffer of up to this size; hyper's default
        // (about 400 KiB) made stalled connections cost far more than their bodies. It
        // also bounds a request head: a larger one is answered 431.
        .max_buf_size(64 * 1024)
        .keep_alive(true);
    let connections = TaskTracker::new();
    let stop = CancellationToken::new();
    let _near = AbortOnDropHandle::new(tokio::spawn(keep_a_timer_near(near_timer_period(
        state.config.store.timeout,
    ))));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener) => accepted,
            () = &mut shutdown => break,
        };
        // Past `max_connections`, connections wait in the listen backlog
        // (docs/behaviour.md §15). The limit is shared by the workers, so a connection is
        // accepted before it waits for its place: a worker holding a place while it waits
        // for a connection that the kernel gave another worker would leave that one
        // unserved below the limit. Each worker holds at most this one connection
        // unserved.
        let permit = tokio::select! {
            permit = Arc::clone(&state.connections).acquire_owned() => permit,
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let activity = Activity::default();
        let seen = activity.clone();
        let svc = service_fn(move |req| {
            let open = seen.start();
            let state = Arc::clone(&state);
            async move {
                let response = handler::handle(state, req, peer).await;
                // Open until its body is sent: a response still streaming (a download,
                // server-sent events) is not an idle connection (docs/behaviour.md §21).
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| Sending { body, _open: open }),
                )
            }
        });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let stop = stop.clone();
        connections.spawn(async move {
            let _open = permit;
            match drive(conn, header_timeout, idle_timeout, &activity, &stop).await {
                Ended::Closed(Err(err)) => {
                    tracing::debug!(error = %err, %peer, "connection ended with an error");
                }
                Ended::Closed(Ok(())) => {}
                Ended::NoHead => {
                    tracing::debug!(%peer, "closed: no request head within listen_header_timeout");
                }
                Ended::Dropped => {
                    tracing::debug!(%peer, "dropped: idle, and did not go away when asked");
                }
            }
        });
    }
    drop(listener);
    tracing::info!(
        worker = crate::worker::index(),
        "shutting down: listener closed, finishing in-flight requests"
    );
    // A reload may have changed it (docs/behaviour.md §14).
    let limit = state.live().config.shutdown_timeout;
    let until = tokio::time::Instant::now() + limit;
    state.tasks.close();
    stop.cancel();
    connections.close();
    let drained = async {
        connections.wait().await;
        state.tasks.wait().await;
    };
    let how = match tokio::time::timeout_at(until, drained).await {
        Ok(()) => Shutdown::Drained,
        Err(_) => {
            tracing::warn!(
                ?limit,
                "shutdown_timeout passed with requests still in flight"
            );
            Shutdown::TimedOut
        }
    };
    // Upgraded connections are no requests: they may go on until shutdown_timeout, and
    // are then closed, whatever became of the requests.
    state.tunnels.close();
    if tokio::time::timeout_at(until, state.tunnels.wait())
        .await
        .is_err()
    {
        tracing::info!("closing upgraded connections at shutdown_timeout");
    }
    state.closing.cancel();
    state.tunnels.wait().await;
    how
}
