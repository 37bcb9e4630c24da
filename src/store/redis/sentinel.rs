//! Redis Sentinel (docs/behaviour.md §14): the master is found through the sentinels, and
//! found again after a failover.
//!
//! redis-rs looks the master up (it asks the sentinels in turn and checks the address
//! with `ROLE`), but a [`ConnectionManager`] reconnects to one fixed address. So this
//! module keeps one manager per master found, and looks again when the connection gives
//! a sign that the master moved:
//!
//! - a command failed in a way a lost or demoted master fails: an I/O error, a refused
//!   or dropped connection, `READONLY` (the old master came back as a replica),
//!   `MASTERDOWN`, `LOADING`;
//! - a command did not finish: the store's deadline dropped it, which is what a frozen
//!   master (or a partition) looks like.
//!
//! The next store call then asks the sentinels (one call at a time; the others wait for
//! what it finds, and at most one lookup per [`LOOK_AT_MOST_EVERY`]). Until they name a
//! master, calls fail rather than go to the old address: the manager reconnects to it by
//! itself, and an old master restarted empty there answers as a master. A
//! new address gets a new manager; the claim mode is forgotten (the new master may run
//! another version) and every waiter is woken, since its subscription was on the old
//! master, so that it reads the key again and subscribes on the new one. While the
//! sentinels name no master that answers, calls fail with the lookup's error, and
//! requests follow `on_unavailable`.
//!
//! The master is reached with the TLS, credentials and database of the first sentinel
//! URL; each sentinel with its own URL's.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    Cmd, ConnectionAddr, IntoConnectionInfo, Pipeline, ProtocolVersion, RedisError, RedisFuture,
    TlsMode, Value,
};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use super::unavailable;
use super::version::ClaimMode;
use super::watch::{PushDispatch, Watchers};
use crate::config::SentinelConfig;
use crate::store::StoreError;

/// Lookups are cheap (a sentinel query and a `ROLE`), but a failing master makes every
/// call fail: one lookup per this long is enough to notice a promotion quickly.
const LOOK_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// The master the sentinels name, and the connection to it.
pub(super) struct Master {
    name: String,
    node: SentinelNodeConnectionInfo,
    /// Without its push sender, which each manager gets afresh.
    manager_config: ConnectionManagerConfig,
    lookup_timeout: Duration,
    lookup: AsyncMutex<Lookup>,
    current: Mutex<Option<Current>>,
    /// Set by a connection that saw a sign of a moved master.
    stale: Arc<AtomicBool>,
    watchers: Arc<Watchers>,
    claim_mode: Arc<ClaimMode>,
}

struct Lookup {
    sentinel: Sentinel,
    last: Option<Instant>,
}

#[derive(Clone)]
struct Current {
    /// `host:port`, as the sentinels name it.
    addr: String,
    manager: ConnectionManager,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Master {
    /// Nothing is connected yet: the first store call looks the master up.
    pub(super) fn new(
        config: &SentinelConfig,
        manager_config: ConnectionManagerConfig,
        lookup_timeout: Duration,
        watchers: Arc<Watchers>,
        claim_mode: Arc<ClaimMode>,
    ) -> Result<Self, StoreError> {
        let sentinels = config
            .urls
            .iter()
            .map(|url| {
                let info = url.as_str().into_connection_info()?;
                // Sentinels have no databases: the number is the master's.
                let settings = info.redis_settings().clone().set_db(0);
                Ok(info
                    .set_redis_settings(settings)
                    .set_tcp_settings(super::tcp_settings()))
            })
            .collect::<Result<Vec<_>, RedisError>>()
            .map_err(unavailable)?;
        let first = sentinels
            .first()
            .ok_or(StoreError::Protocol("no sentinel URL"))?;
        let master_settings = config.urls[0]
            .as_str()
            .into_connection_info()
            .map_err(unavailable)?
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(master_settings)
            .set_tcp_settings(super::tcp_settings());
        if let ConnectionAddr::TcpTls { insecure, .. } = first.addr() {
            node = node.set_tls_mode(if *insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            });
        }
        let sentinel = Sentinel::build(sentinels).map_err(unavailable)?;
        Ok(Self {
            name: config.master_name.clone(),
            node,
            manager_config,
            lookup_timeout,
            lookup: AsyncMutex::new(Lookup {
                sentinel,
                last: None,
            }),
            current: Mutex::new(None),
            stale: Arc::new(AtomicBool::new(false)),
            watchers,
            claim_mode,
        })
    }

    fn current(&self) -> Option<Current> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn wrap(&self, current: Current) -> MasterConn {
        MasterConn {
            manager: current.manager,
            stale: Arc::clone(&self.stale),
        }
    }

    /// The connection to the master, looked up first when there is none yet or the
    /// current one showed a sign of a failover.
    pub(super) async fn conn(&self) -> Result<MasterConn, StoreError> {
        let current = self.current();
        if let Some(current) = &current
            && !self.stale.load(Ordering::Acquire)
        {
            return Ok(self.wrap(current.clone()));
        }
        // Someone may be looking: wait for what they find. The current connection showed
        // a sign of a failover, and it reconnects by itself to its address, where the old
        // master may be back empty: it is not used until the sentinels name a master.
        let mut lookup = match self.lookup.try_lock() {
            Ok(lookup) => lookup,
            Err(_) => self.lookup.lock().await,
        };
        if let Some(current) = self.current() {
            if !self.stale.load(Ordering::Acquire) {
                return Ok(self.wrap(current));
            }
            let recent = lookup
                .last
                .is_some_and(|at| at.elapsed() < LOOK_AT_MOST_EVERY);
            if recent {
                return Err(StoreError::Unavailable(
                    "the Redis master showed a sign of a failover and the sentinels named none yet"
                        .into(),
                ));
            }
        }
        lookup.last = Some(Instant::now());
        self.stale.store(false, Ordering::Release);
        let found = tokio::time::timeout(
            self.lookup_timeout,
            lookup
                .sentinel
                .async_master_for(&self.name, Some(&self.node)),
        )
        .await;
        drop(lookup);
        let client = match found {
            Ok(Ok(client)) => client,
            failed => {
                // Look again on the next call (after the pause); this one fails, rather
                // than go to the old address (see above).
                self.stale.store(true, Ordering::Release);
                let err = match failed {
                    Ok(Err(err)) => unavailable(err),
                    _ => StoreError::Timeout(self.lookup_timeout),
                };
                tracing::warn!(master = %self.name, error = %err, "no master from the sentinels");
                return Err(err);
            }
        };
        let addr = client.get_connection_info().addr().to_string();
        if let Some(current) = self.current()
            && current.addr == addr
        {
            return Ok(self.wrap(current));
        }
        let sender = PushDispatch {
            watchers: Arc::clone(&self.watchers),
            claim_mode: Arc::clone(&self.claim_mode),
        };
        let config = self.manager_config.clone().set_push_sender(sender);
        let manager =
            ConnectionManager::new_lazy_with_config(client, config).map_err(unavailable)?;
        let current = Current { addr, manager };
        let previous = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(current.clone());
        if let Some(previous) = previous {
            tracing::warn!(
                master = %self.name,
                from = %previous.addr,
                to = %current.addr,
                "Redis master moved (Sentinel failover): switching"
            );
            // Another server: its version is asked again, a WAIT in flight counts for
            // nothing, and waiters subscribed on the old one look again.
            self.claim_mode.forget();
            self.watchers.wake_all();
        } else {
            tracing::info!(master = %self.name, addr = %current.addr, "Redis master found through Sentinel");
        }
        Ok(self.wrap(current))
    }
}

/// The connection to the master the sentinels named, which flags signs of a failover.
#[derive(Clone)]
pub(super) struct MasterConn {
    manager: ConnectionManager,
    stale: Arc<AtomicBool>,
}

impl MasterConn {
    pub(super) async fn subscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        let result = self.manager.subscribe(channel).await;
        self.observe(&result);
        result
    }

    pub(super) async fn unsubscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        self.manager.unsubscribe(channel).await
    }

    fn observe<T>(&self, result: &Result<T, RedisError>) {
        if let Err(err) = result
            && master_lost(err)
        {
            self.stale.store(true, Ordering::Release);
        }
    }

    /// Runs `call`, flagging the master stale when it fails as a lost master fails or
    /// is dropped before it finished (the store's deadline passed).
    fn watched<'a, T: Send + 'a>(
        stale: &'a Arc<AtomicBool>,
        call: impl Future<Output = Result<T, RedisError>> + Send + 'a,
    ) -> RedisFuture<'a, T> {
        Box::pin(async move {
            let unfinished = Unfinished(Some(stale));
            let result = call.await;
            unfinished.finish();
            if let Err(err) = &result
                && master_lost(err)
            {
                stale.store(true, Ordering::Release);
            }
            result
        })
    }
}

/// Flags the master stale if dropped before [`Unfinished::finish`].
struct Unfinished<'a>(Option<&'a Arc<AtomicBool>>);

impl Unfinished<'_> {
    fn finish(mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(stale) = self.0 {
            stale.store(true, Ordering::Release);
        }
    }
}

impl ConnectionLike for MasterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let MasterConn { manager, stale } = self;
        Self::watched(stale, manager.req_packed_command(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let MasterConn { manager, stale } = self;
        Self::watched(stale, manager.req_packed_commands(pipeline, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}

/// Whether an error is how a master that died, froze or was demoted answers.
fn master_lost(err: &RedisError) -> bool {
    if err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
    {
        return true;
    }
    // Also inside a pipeline's or a script's error.
    let text = err.to_string();
    ["READONLY", "MASTERDOWN", "LOADING"]
        .iter()
        .any(|code| text.contains(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_of_a_moved_master_are_told_from_others() {
        let server = |code: &str| redis::make_extension_error(code.to_owned(), None);
        for code in ["READONLY", "MASTERDOWN", "LOADING"] {
            assert!(master_lost(&server(code)), "{code}");
        }
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
        ] {
            assert!(master_lost(&RedisError::from(std::io::Error::from(kind))));
        }
        for code in ["OOM", "NOSCRIPT", "ERR", "WRONGTYPE"] {
            assert!(!master_lost(&server(code)), "{code}");
        }
    }

    #[tokio::test]
    async fn a_call_dropped_before_it_finished_flags_the_master() {
        let stale = Arc::new(AtomicBool::new(false));
        let done = MasterConn::watched(&stale, async { Ok::<_, RedisError>(1) });
        assert_eq!(done.await.ok(), Some(1));
        assert!(!stale.load(Ordering::Acquire));
        let mut hanging = MasterConn::watched(&stale, std::future::pending::<Result<(), _>>());
        assert!(futures_poll_once(&mut hanging).is_pending());
        drop(hanging);
        assert!(
            stale.load(Ordering::Acquire),
            "a dropped call flags the master"
        );
    }

    fn futures_poll_once<F: Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        std::pin::Pin::new(f).poll(&mut cx)
    }
}
