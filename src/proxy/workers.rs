//! Workers that own their connections: `workers` threads, each a single-threaded
//! runtime with its own listener socket on the one address (`SO_REUSEPORT`), so the
//! kernel spreads new connections over them and a request is accepted, claimed,
//! forwarded, recorded and answered on one thread. The upstream pools and the Redis
//! connections are kept per worker (`crate::worker`); the store's shards, the metrics
//! and the configuration stay shared.
//!
//! The calling thread is worker 0: it keeps running what else the process does (the
//! admin listener, reloads, the store's background work) on its runtime.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;

use super::listen::{Shutdown, serve};
use super::state::AppState;
use crate::store::Store;

/// The listen backlog of each socket, as `TcpListener::bind` has it.
const BACKLOG: u32 = 1024;

/// Binds `count` listener sockets to `addr` (one when `count` is 1), registered on the
/// calling runtime. The address is first bound without `SO_REUSEPORT`, so an address
/// another process listens on is refused as it would be without workers, even when
/// that process shares its port; port 0 becomes one free port for all of them.
pub async fn bind_workers(addr: SocketAddr, count: usize) -> std::io::Result<Vec<TcpListener>> {
    let probe = socket_for(addr)?;
    probe.bind(addr)?;
    if count <= 1 {
        return Ok(vec![probe.listen(BACKLOG)?]);
    }
    let addr = probe.local_addr()?;
    drop(probe);
    (0..count)
        .map(|_| {
            let socket = socket_for(addr)?;
            socket.set_reuseport(true)?;
            socket.bind(addr)?;
            socket.listen(BACKLOG)
        })
        .collect()
}

fn socket_for(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As `TcpListener::bind`: connections of an earlier run in TIME_WAIT do not block a
    // restart (Linux never lets this share a port someone listens on).
    socket.set_reuseaddr(true)?;
    Ok(socket)
}

/// Why the workers could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start worker {index}: {source}")]
    Start {
        index: usize,
        #[source]
        source: std::io::Error,
    },
}

/// Serves each listener on its own worker until `shutdown` resolves, then drains as
/// [`serve`] does. The first listener is served on the calling runtime (worker 0), each
/// other on a new thread with a single-threaded runtime; returns when all have ended.
pub async fn serve_workers<S: Store>(
    listeners: Vec<TcpListener>,
    state: Arc<AppState<S>>,
    shutdown: impl Future<Output = ()>,
) -> Result<Shutdown, WorkerError> {
    let stop = CancellationToken::new();
    let mut listeners = listeners.into_iter();
    let Some(first) = listeners.next() else {
        return Ok(Shutdown::Drained);
    };
    // Everything that can fail is done before the first worker starts, so a failure
    // leaves nothing running.
    let mut started = Vec::new();
    for (offset, listener) in listeners.enumerate() {
        let index = offset + 1;
        let start = |source| WorkerError::Start { index, source };
        let listener = listener.into_std().map_err(start)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(crate::logs::flush)
            .build()
            .map_err(start)?;
        started.push((index, listener, runtime));
    }
    let mut ended = Vec::new();
    for (index, listener, runtime) in started {
        let (done, finished) = tokio::sync::oneshot::channel();
        let state = Arc::clone(&state);
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("worker-{index}"))
            .spawn(move || {
                crate::worker::enter(index);
                crate::logs::batch_on_this_thread();
                let outcome = runtime.block_on(async {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            Ok(serve(listener, state, stopping.clone().cancelled_owned()).await)
                        }
                        Err(source) => {
                            // The others must not serve on without it.
                            stopping.cancel();
                            Err(WorkerError::Start { index, source })
                        }
                    }
                });
                // Tasks still held by this runtime (a tunnel past shutdown_timeout) go
                // with it.
                drop(runtime);
                crate::logs::flush();
                let _ = done.send(outcome);
            });
        match thread {
            Ok(_) => ended.push(finished),
            Err(source) => {
                stop.cancel();
                return Err(WorkerError::Start { index, source });
            }
        }
    }
    let outcome = serve(first, state, async {
        tokio::select! {
            () = shutdown => {},
            () = stop.cancelled() => {},
        }
        stop.cancel();
    })
    .await;
    let mut result = Ok(outcome);
    for finished in ended {
        let worker = finished.await.unwrap_or(Ok(Shutdown::TimedOut));
        result = match (result, worker) {
            (Err(err), _) | (Ok(_), Err(err)) => Err(err),
            (Ok(Shutdown::TimedOut), Ok(_)) | (Ok(_), Ok(Shutdown::TimedOut)) => {
                Ok(Shutdown::TimedOut)
            }
            (Ok(Shutdown::Drained), Ok(Shutdown::Drained)) => Ok(Shutdown::Drained),
        };
    }
    result
}
