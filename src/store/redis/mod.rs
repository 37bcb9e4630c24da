//! The Redis store: shared state for any number of replicas (docs/behaviour.md §5).
//!
//! Every record is one key, `key_prefix` + 64 hex characters, so nothing crosses a
//! cluster slot. The hot path is one round trip per replay (the claim, which returns the
//! record) and two per first execution (claim, then complete). On Redis 7 the claim is
//! the native `SET NX PX GET`, with a `GETRANGE` pipelined behind it that proves the
//! write (`claim.rs`); before 7 it is a script (`version.rs`). On Valkey 9 and Redis 8.4
//! the complete, the release and the take-over are native compare-and-set commands
//! (`fence.rs`); elsewhere, and the renewal everywhere, they are owner-checked scripts,
//! run by SHA and reloaded after `NOSCRIPT`. Waiters (`on_concurrent: wait`) subscribe
//! to a per-key channel over RESP3 on the same multiplexed connection; a `PUBLISH` on it
//! (pipelined behind the native command, or the script's own) tells them of a change.

mod admin;
mod claim;
mod fence;
mod list;
mod replicas;
mod sentinel;
mod version;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{Cmd, Pipeline, ProtocolVersion, RedisFuture, Script, Value};
use tokio::sync::{Mutex as AsyncMutex, OnceCell};

use super::api::{
    Claim, ClaimRequest, Cursor, Fenced, Inspection, Lease, Page, Purged, Replaced, StateFilter,
    Store, StoreError,
};
use crate::config::StoreConfig;
use crate::idempotency::{Completed, InFlight, OwnerToken, Record, ScopedKey};
use crate::worker::PerWorker;
use claim::Found;
pub use fence::key_slot;
use version::ClaimMode;
pub use watch::RedisWatch;
use watch::Watchers;

const PRELUDE: &str = include_str!("owned.lua");

/// The scripts, hashed once.
#[derive(Debug)]
struct Scripts {
    claim: Script,
    complete: Script,
    release: Script,
    renew: Script,
    take_over: Script,
    inspect: Script,
    purge: Script,
    replace: Script,
}

impl Scripts {
    fn new() -> Self {
        let owned = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
        Self {
            claim: Script::new(include_str!("claim.lua")),
            complete: owned(include_str!("complete.lua")),
            release: owned(include_str!("release.lua")),
            renew: owned(include_str!("renew.lua")),
            take_over: owned(include_str!("take_over.lua")),
            inspect: Script::new(include_str!("inspect.lua")),
            purge: owned(include_str!("purge.lua")),
            replace: Script::new(include_str!("replace.lua")),
        }
    }
}

/// A single server or a cluster, behind one connection-like handle.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(sentinel::MasterConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

/// How the store reaches Redis: a connection per worker (`crate::worker`), made on the
/// worker's first call so that its driver task runs on that worker; or, behind
/// Sentinel, the one connection to the master it names.
enum Backend {
    Direct(PerWorker<Lane>),
    /// The master the sentinels name (`sentinel.rs`; docs/behaviour.md §14).
    Sentinel(Box<sentinel::Master>),
}

/// One worker's way to Redis.
enum Lane {
    Single(ConnectionManager),
    /// Made on first use, so that idemgate starts (and reports not ready) while the
    /// cluster is unreachable.
    Cluster(Box<LazyCluster>),
}

struct LazyCluster {
    client: ClusterClient,
    conn: OnceCell<ClusterConnection>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Lane::Single(_) => "Lane::Single",
            Lane::Cluster(_) => "Lane::Cluster",
        })
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Direct(lanes) => f.debug_tuple("Backend::Direct").field(lanes).finish(),
            Backend::Sentinel(_) => f.write_str("Backend::Sentinel"),
        }
    }
}

#[derive(Debug)]
pub struct RedisStore {
    backend: Backend,
    prefix: String,
    scripts: Scripts,
    watchers: Arc<Watchers>,
    /// Whether the servers take `SET ... NX GET` (Redis 7.0+), from their version;
    /// forgotten on a disconnection.
    claim_mode: Arc<ClaimMode>,
    /// Held while the servers are asked their version, so that one claim asks.
    asking: AsyncMutex<()>,
    /// Whether key changes are published for waiters.
    notify: bool,
    /// A cluster: refusals of the native fencing are remembered per slot.
    cluster: bool,
    /// Where the native fencing was refused, or taken in a mixed cluster (`fence.rs`).
    slots: fence::Slots,
    /// `store.min_replicas`: the `WAIT` after claims and records.
    replicas: replicas::Replicas,
}

/// Every connection to Redis, the sentinels' included, sends each command at once, as
/// redis-py and Jedis do: redis-rs leaves Nagle's algorithm on, which holds a small write
/// behind an unacknowledged one until its ACK arrives, up to a delayed ACK's 40 ms on a
/// real network. On loopback it changed nothing measurable (BENCHMARKS.md, issue 29).
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// How a single server is reached: RESP3 (for the waiters' pushes), no Nagle.
fn direct_info(url: &str) -> Result<redis::ConnectionInfo, StoreError> {
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(unavailable)?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Ok(info
        .set_redis_settings(settings)
        .set_tcp_settings(tcp_settings()))
}

/// How a single server (or the master Sentinel names) is reached, but for the push sender.
fn manager_config(timeout: Duration, response_timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(response_timeout))
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(500))
        .set_number_of_retries(2)
        .set_automatic_resubscription()
}

fn unavailable(err: redis::RedisError) -> StoreError {
    StoreError::Unavailable(Box::new(err))
}

/// The calling replica's wall clock, in unix ms. Lease deadlines are written and judged
/// on the replicas' clocks, so replicas must keep them in sync (NTP); a skew well below
/// `lease / 3` is harmless.
fn now_ms() -> u64 {
    super::api::wall_clock_ms()
}

/// What a native complete or release compares the key with, and whose it is, when the
/// command is `native`: the marker's bytes are taken only then (encoded again after a
/// renewal).
fn expected_marker(lease: &Lease, native: bool) -> Option<(Bytes, OwnerToken)> {
    let bytes = native.then(|| lease.written.marker_bytes()).flatten()?;
    Some((bytes, lease.token))
}

/// Milliseconds for `PX` and the scripts: at least 1, as Redis refuses an expiry of 0.
fn millis(d: Duration) -> u64 {
    super::api::millis(d).max(1)
}

impl RedisStore {
    /// Builds the client without connecting: the first request (or `/readyz`) connects,
    /// and a Redis that is down at start-up does not stop idemgate from starting.
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        Self::for_workers(config, 1)
    }

    /// As [`RedisStore::new`], with a connection of its own for each of `workers`
    /// workers (a Sentinel-named master is reached over one connection for all).
    pub fn for_workers(config: &StoreConfig, workers: usize) -> Result<Self, StoreError> {
        let watchers = Arc::new(Watchers::default());
        let claim_mode = Arc::new(ClaimMode::default());
        let sender = watch::PushDispatch {
            watchers: Arc::clone(&watchers),
            claim_mode: Arc::clone(&claim_mode),
        };
        // Redis answers slower than this only when it is in trouble; the per-call deadline
        // (store.timeout) is enforced by the caller, this only frees stuck slots.
        let response_timeout = (config.timeout * 4).max(Duration::from_secs(2));
        let backend = if config.cluster {
            let client = ClusterClient::builder(config.urls.iter().map(String::as_str))
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(sender)
                .connection_timeout(config.timeout)
                .response_timeout(response_timeout)
                .retries(2)
                .tcp_settings(tcp_settings())
                .build()
                .map_err(unavailable)?;
            Backend::Direct(PerWorker::new(workers, |_| {
                Lane::Cluster(Box::new(LazyCluster {
                    client: client.clone(),
                    conn: OnceCell::new(),
                }))
            }))
        } else if let Some(sentinels) = &config.sentinel {
            Backend::Sentinel(Box::new(sentinel::Master::new(
                sentinels,
                manager_config(config.timeout, response_timeout),
                config.timeout,
                Arc::clone(&watchers),
                Arc::clone(&claim_mode),
            )?))
        } else {
            let url = config
                .urls
                .first()
                .map_or("redis://127.0.0.1:6379/0", String::as_str);
            let info = direct_info(url)?;
            let client = redis::Client::open(info).map_err(unavailable)?;
            let manager_config =
                manager_config(config.timeout, response_timeout).set_push_sender(sender);
            Backend::Direct(PerWorker::try_new(workers, |_| {
                ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
                    .map(Lane::Single)
                    .map_err(unavailable)
            })?)
        };
        Ok(Self {
            backend,
            prefix: config.key_prefix.clone(),
            scripts: Scripts::new(),
            watchers,
            claim_mode,
            asking: AsyncMutex::new(()),
            notify: true,
            cluster: config.cluster,
            slots: fence::Slots::default(),
            replicas: replicas::Replicas::new(config.min_replicas, config.timeout),
        })
    }

    /// The calling worker's connection.
    async fn conn(&self) -> Result<Conn, StoreError> {
        self.conn_of(PerWorker::get).await
    }

    /// The one connection that carries the waiters' subscriptions: a subscription made
    /// by a waiter on one worker may be ended by the last waiter on another.
    async fn watch_conn(&self) -> Result<Conn, StoreError> {
        self.conn_of(PerWorker::first).await
    }

    async fn conn_of(&self, pick: fn(&PerWorker<Lane>) -> &Lane) -> Result<Conn, StoreError> {
        match &self.backend {
            Backend::Direct(lanes) => match pick(lanes) {
                Lane::Single(manager) => Ok(Conn::Single(manager.clone())),
                Lane::Cluster(lazy) => {
                    let conn = lazy
                        .conn
                        .get_or_try_init(|| lazy.client.get_async_connection())
                        .await
                        .map_err(unavailable)?;
                    Ok(Conn::Cluster(conn.clone()))
                }
            },
            Backend::Sentinel(master) => Ok(Conn::Sentinel(master.conn().await?)),
        }
    }

    /// The Redis key of a record: exactly `key_prefix` + 64 hex characters.
    pub fn record_key(&self, key: &ScopedKey) -> String {
        key.id(&self.prefix)
    }

    /// Where changes of a key are announced to waiters; empty when nobody can wait, so
    /// the scripts skip the `PUBLISH` (on a cluster it is broadcast to every node).
    fn channel(&self, key: &ScopedKey) -> String {
        if !self.notify {
            return String::new();
        }
        self.watch_channel(key)
    }

    fn watch_channel(&self, key: &ScopedKey) -> String {
        let mut out = self.record_key(key);
        out.push_str(":changed");
        out
    }

    /// For a deployment where no route has `on_concurrent: wait`: completions and
    /// releases are not announced, as nobody subscribes.
    #[must_use]
    pub fn without_notifications(mut self) -> Self {
        self.notify = false;
        self
    }

    /// Reads `maxmemory-policy` and says whether it may evict records early. `Ok(None)`
    /// when the policy is safe (`noeviction`).
    pub async fn eviction_warning(&self) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn().await?;
        let reply: Value = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let policy = config_value(&reply).unwrap_or_default();
        Ok(eviction_risk(&policy))
    }

    async fn owner_checked(
        &self,
        script: &Script,
        key: &ScopedKey,
        args: &[&[u8]],
    ) -> Result<Fenced, StoreError> {
        self.owner_checked_on(&mut self.conn().await?, script, key, args)
            .await
    }

    /// [`owner_checked`](Self::owner_checked) on `conn`: the connection whose `WAIT`
    /// then asks after this write.
    async fn owner_checked_on(
        &self,
        conn: &mut Conn,
        script: &Script,
        key: &ScopedKey,
        args: &[&[u8]],
    ) -> Result<Fenced, StoreError> {
        self.fenced_by_script(conn, script, &self.record_key(key), args)
            .await
    }
}

/// `EVALSHA` of `script` on one `key` with `args`, loading the script on `NOSCRIPT`, as
/// redis-rs's `ScriptInvocation` does. Written into one command sized up front: the
/// invocation first copies the key and every argument into vectors of their own, seven
/// more allocations per recorded response (BENCHMARKS.md, issue 29). The command has
/// the invocation's shape, so a cluster routes it by the same key.
async fn eval<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &Script,
    key: &[u8],
    args: &[&[u8]],
) -> redis::RedisResult<T> {
    let hash = script.get_hash();
    let bytes = "EVALSHA".len() + hash.len() + 1 + key.len();
    let mut cmd = Cmd::with_capacity(
        4 + args.len(),
        bytes + args.iter().map(|arg| arg.len()).sum::<usize>(),
    );
    cmd.arg("EVALSHA").arg(hash).arg(1).arg(key);
    for arg in args {
        cmd.arg(*arg);
    }
    match cmd.query_async(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        answer => answer,
    }
}

/// `CONFIG GET` answers a map under RESP3 and a flat list under RESP2.
fn config_value(reply: &Value) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| text(v)),
        Value::Array(items) => items.get(1).and_then(text),
        _ => None,
    }
}

/// Every record has a TTL, so any eviction policy but `noeviction` may drop a record or
/// an in-flight marker before its time, and a retry would execute again.
pub(crate) fn eviction_risk(policy: &str) -> Option<String> {
    match policy {
        "noeviction" => None,
        p if p.starts_with("allkeys-") => Some(format!(
            "Redis maxmemory-policy is '{p}': under memory pressure Redis evicts idempotency records and in-flight markers, and retries of those keys execute again; set maxmemory-policy to noeviction"
        )),
        p => Some(format!(
            "Redis maxmemory-policy is '{p}': every idempotency record has a TTL, so under memory pressure Redis may evict records before their ttl and retries would execute again; set maxmemory-policy to noeviction"
        )),
    }
}

impl Store for RedisStore {
    type Watch = RedisWatch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        // Before the connection is taken: a Sentinel switch after it is then seen, and
        // the WAIT's budget is the whole call's.
        let written = self.before_write();
        let mut conn = self.conn().await?;
        // Asked first: on first use it is a round trip, which the lease must not lose.
        let with = self.mode(&mut conn).await?.claim;
        let now = now_ms();
        let marker = req.marker(now).encode();
        let key = self.record_key(&req.key);
        let ttl = millis(req.marker_ttl());
        match self
            .write_claim(&mut conn, with, &key, &marker, ttl)
            .await?
        {
            Found::Ours => {
                self.claim_replicated(&mut conn, written).await?;
                Ok(Claim::Acquired(req.lease_encoded(now, marker)))
            }
            Found::Record(record) => {
                let record = Record::decode(Bytes::from(record)).map_err(StoreError::Corrupt)?;
                Ok(Claim::Existing {
                    record,
                    now_ms: now,
                })
            }
        }
    }

    async fn complete(
        &self,
        lease: &Lease,
        record: Arc<Completed>,
        ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        let encoded = record.encode();
        let ttl_ms = millis(ttl);
        let channel = self.channel(&lease.key);
        let key = self.record_key(&lease.key);
        let written = self.before_write();
        let mut conn = self.conn().await?;
        let fencing = self.mode(&mut conn).await?.fencing;
        let native = match expected_marker(lease, self.native_set(fencing, key.as_bytes())) {
            Some(expected) => {
                let target = (key.as_str(), fencing.mixed);
                self.complete_natively(&mut conn, target, expected, (&encoded, ttl_ms, &channel))
                    .await?
            }
            None => fence::Native::Refused,
        };
        let done = match native {
            fence::Native::Done(done) => done,
            fence::Native::Refused => {
                let mut digits = itoa::Buffer::new();
                let ttl = digits.format(ttl_ms);
                let args: [&[u8]; 4] = [
                    lease.token.as_bytes(),
                    &encoded,
                    ttl.as_bytes(),
                    channel.as_bytes(),
                ];
                self.fenced_by_script(&mut conn, &self.scripts.complete, &key, &args)
                    .await?
            }
        };
        if done == Fenced::Done {
            self.record_replicated(&mut conn, written).await;
        }
        Ok(done)
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        let channel = self.channel(&lease.key);
        let key = self.record_key(&lease.key);
        let mut conn = self.conn().await?;
        let fencing = self.mode(&mut conn).await?.fencing;
        let native = match expected_marker(lease, self.native_delete(fencing, key.as_bytes())) {
            Some(expected) => {
                self.release_natively(&mut conn, fencing.delete, &key, expected, &channel)
                    .await?
            }
            None => fence::Native::Refused,
        };
        match native {
            fence::Native::Done(done) => Ok(done),
            fence::Native::Refused => {
                let args: [&[u8]; 2] = [lease.token.as_bytes(), channel.as_bytes()];
                self.fenced_by_script(&mut conn, &self.scripts.release, &key, &args)
                    .await
            }
        }
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        let deadline_ms = now_ms() + millis(lease_for);
        let deadline = deadline_ms.to_be_bytes();
        let ms = millis(lease_for).to_string();
        let args: [&[u8]; 3] = [lease.token.as_bytes(), &deadline, ms.as_bytes()];
        let renewed = self
            .owner_checked(&self.scripts.renew, &lease.key, &args)
            .await?;
        if renewed == Fenced::Done {
            // What the script wrote: the marker with this deadline (docs/behaviour.md §23).
            lease.written.renewed(deadline_ms);
        }
        Ok(renewed)
    }

    async fn take_over(
        &self,
        stale: InFlight,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        let claimed_at = now_ms();
        let marker = req.marker(claimed_at).encode();
        let ttl_ms = millis(req.marker_ttl());
        let channel = self.channel(&req.key);
        let key = self.record_key(&req.key);
        let written = self.before_write();
        let mut conn = self.conn().await?;
        let fencing = self.mode(&mut conn).await?.fencing;
        let native = if self.native_set(fencing, key.as_bytes()) {
            let target = (key.as_str(), fencing.mixed);
            self.take_over_natively(
                &mut conn,
                target,
                &stale,
                (&marker, ttl_ms, &channel),
                claimed_at,
            )
            .await?
        } else {
            fence::Native::Refused
        };
        let done = match native {
            fence::Native::Done(done) => done,
            fence::Native::Refused => {
                let ttl = ttl_ms.to_string();
                let now = claimed_at.to_string();
                let args: [&[u8]; 5] = [
                    stale.token.as_bytes(),
                    &marker,
                    ttl.as_bytes(),
                    channel.as_bytes(),
                    now.as_bytes(),
                ];
                self.fenced_by_script(&mut conn, &self.scripts.take_over, &key, &args)
                    .await?
            }
        };
        Ok(match done {
            Fenced::Done => {
                // A take-over is a claim: the same WAIT.
                self.claim_replicated(&mut conn, written).await?;
                Some(req.lease_encoded(claimed_at, marker))
            }
            Fenced::LeaseLost => None,
        })
    }

    async fn watch(&self, key: ScopedKey) -> Result<RedisWatch, StoreError> {
        let channel = self.watch_channel(&key);
        let conn = self.watch_conn().await?;
        let watch = self.watchers.register(channel, conn);
        watch.subscribe().await.map_err(unavailable)?;
        Ok(watch)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(unavailable)
    }

    fn count_shortfalls_in(&self, counter: prometheus_client::metrics::counter::Counter) {
        self.replicas.count_shortfalls_in(counter);
    }

    async fn inspect(&self, key: ScopedKey) -> Result<Option<Inspection>, StoreError> {
        self.inspect_key(&key).await
    }

    async fn list(
        &self,
        state: StateFilter,
        cursor: Cursor,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.list_keys(state, cursor, limit).await
    }

    async fn purge(&self, key: ScopedKey, force: bool) -> Result<Purged, StoreError> {
        self.purge_key(&key, force).await
    }

    async fn replace(
        &self,
        key: ScopedKey,
        expected: &Record,
        new: Option<Arc<Completed>>,
    ) -> Result<Replaced, StoreError> {
        self.replace_key(&key, expected, new.as_deref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_is_safe() {
        assert_eq!(eviction_risk("noeviction"), None);
        for p in [
            "allkeys-lru",
            "allkeys-random",
            "volatile-lru",
            "volatile-ttl",
        ] {
            let warning = eviction_risk(p).expect("a warning");
            assert!(
                warning.contains("maxmemory-policy") && warning.contains(p),
                "{warning}"
            );
        }
    }

    #[test]
    fn a_direct_connection_speaks_resp3_without_nagle_and_keeps_the_url() {
        let info = direct_info("redis://:secret@127.0.0.1:6390/3").expect("a valid URL");
        assert!(info.tcp_settings().nodelay());
        let redis = info.redis_settings();
        assert_eq!(redis.protocol(), ProtocolVersion::RESP3);
        assert_eq!(redis.db(), 3);
        assert_eq!(redis.password(), Some("secret"));
    }

    #[test]
    fn config_get_replies_in_both_protocols() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            config_value(&Value::Array(vec![b("maxmemory-policy"), b("noeviction")])).as_deref(),
            Some("noeviction")
        );
        assert_eq!(
            config_value(&Value::Map(vec![(b("maxmemory-policy"), b("allkeys-lru"))])).as_deref(),
            Some("allkeys-lru")
        );
    }
}
