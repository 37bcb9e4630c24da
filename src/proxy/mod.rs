//! The HTTP side: accept loop, graceful shutdown, and the shared state of a running
//! proxy. `main` and the tests both call [`serve`] with a bound listener.
//!
//! A request visits the files of this module in this order, and each depends only on
//! those after it:
//!
//! 1. `handler.rs`: policy, key, body, fingerprint; pass-through or guarded;
//!    `view.rs` gives it one view of the request: the normalised path, the method, the
//!    `Host` checks;
//! 2. `claim.rs`: claim -> decide -> wait / take over, until the key is ours or answered;
//! 3. `exchange.rs`: forward once and record (on its own task if the client leaves);
//! 4. `lease.rs`: renew while forwarding, complete, release; bounded background retries;
//! 5. `reply.rs`: replays, problems, and the one place an answer is counted and logged;
//! 6. `upstream.rs`: the pooled client, `send`, header rewriting; `body.rs`: body types.
//!
//! `workers.rs` runs [`serve`] once per worker thread, each on its own listener socket.

mod body;
mod budget;
mod claim;
mod connector;
mod detach;
mod exchange;
mod handler;
mod lease;
mod listen;
pub mod reload;
mod reply;
mod upgrade;
mod upstream;
mod view;
mod workers;

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, Policy};
use crate::metrics::Metrics;
use crate::store::{Deadline, Store, Timed};
use crate::worker::PerWorker;
pub use body::{ProxyBody, RequestBody};
pub use handler::{RecordIdError, handle, record_id};
pub use listen::accept;
pub(crate) use listen::{Activity, Ended, drive};
pub use upstream::UpstreamClient;
pub use workers::{WorkerError, bind_workers, serve_workers};

/// Which policy a request runs under: a route's, or the top-level `idempotency`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyId(Option<usize>);

/// What a reload replaces (docs/behaviour.md §14): the configuration requests start
/// under, and the upstream clients built from its `upstream` section. A request takes one
/// `Live` when it starts and keeps it to the end, so it finishes under the policy it
/// started with.
#[derive(Debug)]
pub struct Live {
    pub config: Arc<Config>,
    /// One connection pool per worker: a pooled connection is driven by a task on the
    /// runtime that opened it, so sharing one pool would hand requests across threads.
    clients: PerWorker<UpstreamClient>,
}

impl Live {
    pub fn new(config: Arc<Config>) -> Self {
        let clients = upstream::clients(&config.upstream, config.workers.resolve());
        Self { config, clients }
    }

    /// The calling worker's upstream client.
    pub fn client(&self) -> &UpstreamClient {
        self.clients.get()
    }

    pub fn policy_id(&self, path: &str) -> PolicyId {
        PolicyId(self.config.route_index(path))
    }

    pub fn policy(&self, id: PolicyId) -> &Policy {
        match id.0.and_then(|i| self.config.routes.get(i)) {
            Some(route) => &route.policy,
            None => &self.config.idempotency,
        }
    }
}

/// Everything a request needs, shared by all connections.
#[derive(Debug)]
pub struct AppState<S> {
    /// The configuration the process started with: what a reload cannot change
    /// (`listen`, `store`, the limits of the accept loop). Per-request settings are in
    /// [`AppState::live`].
    pub config: Arc<Config>,
    /// Swapped whole by a reload; read without a lock.
    live: ArcSwap<Live>,
    /// Every call under `store.timeout` and timed, by the decorator.
    pub store: Timed<S>,
    pub metrics: Metrics,
    /// Forward-and-record tasks, which outlive a disconnected client, and background
    /// retries; shutdown waits for them.
    tasks: TaskTracker,
    /// Bounds how many background retries run at once (`lease.rs`).
    retries: Arc<Semaphore>,
    /// `max_connections`: places for open client connections, shared by the workers.
    connections: Arc<Semaphore>,
    /// `max_buffered_bytes`: the bodies held in memory at once (`budget.rs`).
    budget: Arc<budget::Budget>,
    /// Upgraded connections joined to the upstream (`upgrade.rs`), and what closes them
    /// at shutdown.
    tunnels: TaskTracker,
    closing: CancellationToken,
}

impl<S: Store> AppState<S> {
    pub fn new(config: Arc<Config>, store: S) -> Self {
        Self::with_metrics(config, store, Metrics::new())
    }

    /// With metrics of the caller's making, e.g. [`Metrics::observable`] in tests.
    pub fn with_metrics(config: Arc<Config>, store: S, mut metrics: Metrics) -> Self {
        let live = ArcSwap::from_pointee(Live::new(Arc::clone(&config)));
        store.register_metrics(metrics.registry_mut());
        store.count_shortfalls_in(metrics.replication_shortfall());
        let deadline = Deadline::new(config.store.timeout, metrics.store_timings());
        let store = Timed::new(store, deadline);
        let budget = budget::Budget::new(config.max_buffered_bytes);
        metrics.registry_mut().register_with_unit(
            "idemgate_buffered",
            "Request and response bodies held in memory (bounded by max_buffered_bytes)",
            prometheus_client::registry::Unit::Bytes,
            budget.gauge(),
        );
        Self {
            budget,
            connections: Arc::new(Semaphore::new(config.max_connections)),
            config,
            live,
            store,
            metrics,
            tasks: TaskTracker::new(),
            retries: Arc::new(Semaphore::new(lease::MAX_BACKGROUND_RETRIES)),
            tunnels: TaskTracker::new(),
            closing: CancellationToken::new(),
        }
    }

    /// The configuration new requests start under, and its upstream client.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Puts `config` in force for new requests (docs/behaviour.md §14), after
    /// `reload::check` accepted it. The upstream client is kept when `upstream` did not
    /// change; when it did, the old client goes with the last request that holds it, and
    /// its idle connections with it.
    pub fn apply(&self, config: Config) {
        let current = self.live.load();
        let live = if config.upstream == current.config.upstream {
            Live {
                config: Arc::new(config),
                clients: current.clients.clone(),
            }
        } else {
            Live::new(Arc::new(config))
        };
        self.live.store(Arc::new(live));
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
                drop(open);
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let stop = stop.clone();
        connections.spawn(async move {
            let _open = permit;
            match listen::drive(conn, header_timeout, idle_timeout, &activity, &stop).await {
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
