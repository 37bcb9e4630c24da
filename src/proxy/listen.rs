//! What a client connection may hold, and for how long: the accept loop's error
//! handling, and [`drive`], which runs one connection under the deadlines that hyper
//! does not keep itself.
//!
//! - A connection that sends no complete request head within `listen_header_timeout`
//!   is closed: HTTP/1 and HTTP/2 alike, and before the protocol is known, which
//!   hyper's own header timeout does not cover.
//! - A connection with no request open for `listen_idle_timeout` is shut down
//!   gracefully (`GOAWAY` on HTTP/2, a close between requests on HTTP/1): an HTTP/2
//!   session idle after one request would otherwise hold its place in
//!   `max_connections` for ever, and a few of them fill the proxy.
//! - Shutdown asks every connection to finish gracefully in the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
