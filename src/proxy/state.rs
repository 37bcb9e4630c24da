//! The shared state of a running proxy: what every connection and request reads
//! ([`AppState`]), the configuration a reload swaps in whole ([`Live`]), and which policy
//! a request runs under ([`PolicyId`]). Every file of the request path reads it; it
//! reads nothing of theirs but the upstream client and the body budget it holds.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use prometheus_client::metrics::counter::Counter;

use super::budget::Budget;
use super::jwks::url_fetcher;
use super::upstream::{self, UpstreamClient};
use crate::config::{AuthorizerTarget, Config, Policy};
use crate::idempotency::{Completed, ScopedKey};
use crate::metrics::{Metrics, SpanDrops};
use crate::principal::Verifier;
use crate::store::{Deadline, Keyring, Opened, Store, Timed, Undecryptable};
use crate::telemetry::Telemetry;
use crate::worker::PerWorker;

/// How many background retries (`lease.rs`) may run at once, across all keys. Past it
/// a retry is given up at once: during a long store outage the proxy's memory stays
/// bounded, and the keys concerned follow the lease rules (a marker ends with its lease).
pub(crate) const MAX_BACKGROUND_RETRIES: usize = 1024;

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
    /// The clients of `replay_authorization`'s `url`s (docs/behaviour.md §24), when a
    /// policy has one.
    authorizers: Option<PerWorker<UpstreamClient>>,
    /// The verifier of each policy's `scope_principal` (docs/behaviour.md §17): first
    /// `idempotency`'s, then each route's. Policies with the same source share one.
    principals: Vec<Option<Arc<Verifier>>>,
    /// `telemetry.otlp`'s exporter (docs/behaviour.md §20); `None`: requests are not
    /// traced, and do no span work at all.
    telemetry: Option<Arc<Telemetry>>,
}

impl Live {
    /// `failures` counts failed reads of a key set; the verifiers of `previous` whose
    /// source is unchanged are kept, with their key sets and verified tokens, and so is
    /// its exporter when `telemetry` is unchanged; spans a new one drops count in `drops`.
    pub fn new(
        config: Arc<Config>,
        (failures, drops): (&Counter, &SpanDrops),
        previous: Option<&Live>,
    ) -> Self {
        let clients = upstream::clients(&config.upstream, config.workers.resolve());
        let authorizers = authorizers(&config, None);
        let principals = verifiers(&config, failures, previous);
        let telemetry = telemetry(&config, drops, previous);
        Self {
            config,
            clients,
            authorizers,
            principals,
            telemetry,
        }
    }

    /// The exporter in force, when requests are traced.
    pub fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.telemetry.as_ref()
    }

    /// The verifier of `id`'s policy, if it scopes by principal.
    pub fn verifier(&self, id: PolicyId) -> Option<&Arc<Verifier>> {
        let index = id.0.map_or(0, |i| i + 1);
        self.principals.get(index)?.as_ref()
    }

    /// Every verifier in force, once each: for their key sets' refreshes.
    pub fn verifiers(&self) -> Vec<Arc<Verifier>> {
        let mut all: Vec<Arc<Verifier>> = Vec::new();
        for verifier in self.principals.iter().flatten() {
            if !all.iter().any(|v| Arc::ptr_eq(v, verifier)) {
                all.push(Arc::clone(verifier));
            }
        }
        all
    }

    /// The calling worker's upstream client.
    pub fn client(&self) -> &UpstreamClient {
        self.clients.get()
    }

    /// The calling worker's client for `replay_authorization`'s `url`s; `None` when no
    /// policy has one.
    pub(crate) fn authorizer_client(&self) -> Option<&UpstreamClient> {
        self.authorizers.as_ref().map(PerWorker::get)
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

/// The clients of `replay_authorization`'s `url`s when a policy of `config` has one:
/// `previous`'s, with their pooled connections, when it had them (its `upstream` is
/// `config`'s).
fn authorizers(config: &Config, previous: Option<&Live>) -> Option<PerWorker<UpstreamClient>> {
    let wanted = config.policies().any(|policy| {
        policy
            .replay_authorization
            .as_ref()
            .is_some_and(|check| matches!(check.target, AuthorizerTarget::Url { .. }))
    });
    if !wanted {
        return None;
    }
    previous
        .and_then(|previous| previous.authorizers.clone())
        .or_else(|| {
            Some(upstream::authorizer_clients(
                &config.upstream,
                config.workers.resolve(),
            ))
        })
}

/// The verifiers of `config`'s policies, in [`Live::principals`] order: one per distinct
/// source, taken from `previous` when it had one for that source (keeping its key set
/// and the tokens it verified).
fn verifiers(
    config: &Config,
    failures: &Counter,
    previous: Option<&Live>,
) -> Vec<Option<Arc<Verifier>>> {
    // A `jwks_url` is read with the upstream's TLS settings: when they change, every
    // verifier is made again.
    let mut known: Vec<Arc<Verifier>> = previous
        .filter(|previous| previous.config.upstream == config.upstream)
        .map(Live::verifiers)
        .unwrap_or_default();
    let fetcher = url_fetcher(&config.upstream);
    std::iter::once(&config.idempotency)
        .chain(config.routes.iter().map(|route| &route.policy))
        .map(|policy| {
            let source = policy.scope_principal.as_ref()?;
            if let Some(found) = known.iter().find(|v| v.source() == source) {
                return Some(Arc::clone(found));
            }
            let verifier = Arc::new(Verifier::new(source, &fetcher, failures.clone()));
            known.push(Arc::clone(&verifier));
            Some(verifier)
        })
        .collect()
}

/// The exporter of `config`: `previous`'s when its `telemetry` is the same, else a new
/// one. One that cannot start (its configuration was checked) is logged, and requests go
/// untraced rather than unserved.
fn telemetry(
    config: &Config,
    drops: &SpanDrops,
    previous: Option<&Live>,
) -> Option<Arc<Telemetry>> {
    let otlp = config.telemetry.otlp.as_ref()?;
    if let Some(kept) = previous
        .and_then(|previous| previous.telemetry.as_ref())
        .filter(|kept| kept.config() == otlp)
    {
        return Some(Arc::clone(kept));
    }
    match Telemetry::start(otlp, drops.clone()) {
        Ok(telemetry) => Some(Arc::new(telemetry)),
        Err(err) => {
            tracing::error!(error = %err, "traces are not exported");
            None
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
    /// `store.encryption`: seals every record before the store sees it, opens it for a
    /// replay (docs/behaviour.md §17). `None`: records are kept in clear.
    pub keyring: Option<Keyring>,
    pub metrics: Metrics,
    /// Forward-and-record tasks, which outlive a disconnected client, and background
    /// retries; shutdown waits for them.
    pub(super) tasks: TaskTracker,
    /// Bounds how many background retries run at once (`lease.rs`).
    pub(super) retries: Arc<Semaphore>,
    /// `max_connections`: places for open client connections, shared by the workers.
    pub(super) connections: Arc<Semaphore>,
    /// `max_buffered_bytes`: the bodies held in memory at once (`budget.rs`).
    pub(super) budget: Arc<Budget>,
    /// Upgraded connections joined to the upstream (`upgrade.rs`), and what closes them
    /// at shutdown.
    pub(super) tunnels: TaskTracker,
    pub(super) closing: CancellationToken,
}

impl<S: Store> AppState<S> {
    /// Serves from `store`, which others may share (the start-up check of Redis, a test
    /// that looks into the store).
    pub fn new(config: Arc<Config>, store: Arc<S>) -> Self {
        Self::with_metrics(config, store, Metrics::new())
    }

    /// With metrics of the caller's making, e.g. [`Metrics::observable`] in tests.
    pub fn with_metrics(config: Arc<Config>, store: Arc<S>, mut metrics: Metrics) -> Self {
        let live = ArcSwap::from_pointee(Live::new(
            Arc::clone(&config),
            (&metrics.jwks_refresh_failures(), &metrics.span_drops()),
            None,
        ));
        store.register_metrics(metrics.registry_mut());
        store.count_shortfalls_in(metrics.replication_shortfall());
        let deadline = Deadline::new(config.store.timeout, metrics.store_timings());
        let store = Timed::new(store, deadline);
        let budget = Budget::new(config.max_buffered_bytes);
        metrics.registry_mut().register_with_unit(
            "idemgate_buffered",
            "Request and response bodies held in memory (bounded by max_buffered_bytes)",
            prometheus_client::registry::Unit::Bytes,
            budget.gauge(),
        );
        Self {
            keyring: Keyring::new(&config.store.encryption),
            budget,
            connections: Arc::new(Semaphore::new(config.max_connections)),
            config,
            live,
            store,
            metrics,
            tasks: TaskTracker::new(),
            retries: Arc::new(Semaphore::new(MAX_BACKGROUND_RETRIES)),
            tunnels: TaskTracker::new(),
            closing: CancellationToken::new(),
        }
    }

    /// `record`, for `key`, as the store is to keep it: sealed when `store.encryption`
    /// lists a key.
    pub(crate) fn seal(&self, key: &ScopedKey, record: Completed) -> Completed {
        match &self.keyring {
            Some(keyring) => keyring.seal(key, record),
            None => record,
        }
    }

    /// The response of `record`, found under `key`, to send again (or to settle, §18):
    /// opened when it is sealed (docs/behaviour.md §17). One that does not open (its key
    /// was removed, or it was altered at rest, §25) is logged at `error` with the record
    /// and key ids and counted; the caller answers `503` and never acts on it.
    pub(crate) fn open(
        &self,
        key: &ScopedKey,
        record: Arc<Completed>,
    ) -> Result<Opened, Undecryptable> {
        Keyring::open(self.keyring.as_ref(), key, record).inspect_err(|err| {
            tracing::error!(
                record = %key.id(&self.config.store.key_prefix),
                key_id = err.key_id(),
                error = %err,
                "a stored record does not decrypt; it is not replayed (DELETE /keys/{{id}} removes it)"
            );
            self.metrics.undecryptable();
        })
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
        let failures = self.metrics.jwks_refresh_failures();
        let drops = self.metrics.span_drops();
        let live = if config.upstream == current.config.upstream {
            let principals = verifiers(&config, &failures, Some(&current));
            let telemetry = telemetry(&config, &drops, Some(&current));
            let authorizers = authorizers(&config, Some(&current));
            Live {
                config: Arc::new(config),
                clients: current.clients.clone(),
                authorizers,
                principals,
                telemetry,
            }
        } else {
            Live::new(Arc::new(config), (&failures, &drops), Some(&current))
        };
        self.live.store(Arc::new(live));
    }
}
