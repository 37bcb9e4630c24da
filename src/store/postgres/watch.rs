//! Waiters on the PostgreSQL store (`on_concurrent: wait`, docs/behaviour.md §22): one
//! connection of its own per process `LISTEN`s on the table's channel, and each
//! notification (the row id, sent by the statement that changed the row) wakes the
//! waiters of that key. A waiter also wakes every [`POLL`], so a notification lost
//! with the listening connection costs latency, never an answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::idempotency::ScopedKey;
use crate::store::{KeyWatch, Registry, WaiterMap, Watch};

/// How often a waiter looks again without a notification.
pub(super) const POLL: Duration = Duration::from_millis(250);

/// The waiters of every key, behind one lock: a waiter is rare and short.
#[derive(Debug, Clone, Default)]
pub(super) struct Waiting(Arc<Mutex<WaiterMap>>);

impl Waiting {
    fn wake_all(&self) {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.wake_all();
    }
}

impl Registry for Waiting {
    fn with_map<T>(&self, _key: &ScopedKey, f: impl FnOnce(&mut WaiterMap) -> T) -> T {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut map)
    }
}

/// A subscription to one key's next change: its notification, or [`POLL`].
#[derive(Debug)]
pub struct PostgresWatch(KeyWatch<Waiting>);

impl Watch for PostgresWatch {
    async fn changed(self) {
        let _ = tokio::time::timeout(POLL, self.0.changed()).await;
    }
}

/// The listening session: whether it still reads, and its client, which must live as
/// long as the session does.
struct Session {
    alive: Arc<AtomicBool>,
    _client: tokio_postgres::Client,
}

/// The listening connection, made on the first watch and again after it is lost.
pub(super) struct Listener {
    waiting: Waiting,
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    channel: String,
    /// Held while a session is being made, so that one watch makes it.
    session: AsyncMutex<Option<Session>>,
    timeout: Duration,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Listener {
    pub(super) fn new(
        config: tokio_postgres::Config,
        tls: MakeRustlsConnect,
        channel: String,
        timeout: Duration,
    ) -> Self {
        Self {
            waiting: Waiting::default(),
            config,
            tls,
            channel,
            session: AsyncMutex::new(None),
            timeout,
        }
    }

    /// Registers a waiter on `key`, after making sure (within `store.timeout`) that a
    /// session listens. When none can be made the waiter polls.
    pub(super) async fn watch(&self, key: ScopedKey) -> PostgresWatch {
        let watch = PostgresWatch(KeyWatch::register(&self.waiting, key));
        let mut session = self.session.lock().await;
        let listening = session
            .as_ref()
            .is_some_and(|s| s.alive.load(Ordering::Acquire));
        if !listening {
            *session = None;
            match tokio::time::timeout(self.timeout, self.listen()).await {
                Ok(Ok(made)) => *session = Some(made),
                Ok(Err(err)) => tracing::warn!(
                    error = %err,
                    "postgres store: cannot LISTEN; waiters look again every 250ms"
                ),
                Err(_) => tracing::warn!(
                    "postgres store: LISTEN did not answer in time; waiters look again every 250ms"
                ),
            }
        }
        watch
    }

    /// Connects, starts the task that reads the connection (and with it the
    /// notifications), and `LISTEN`s.
    async fn listen(&self) -> Result<Session, tokio_postgres::Error> {
        let (client, mut connection) = self.config.connect(self.tls.clone()).await?;
        let alive = Arc::new(AtomicBool::new(true));
        let waiting = self.waiting.clone();
        let reading = Arc::clone(&alive);
        tokio::spawn(async move {
            while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                match message {
                    Ok(AsyncMessage::Notification(note)) => {
                        if let Some(key) = ScopedKey::from_hex(note.payload()) {
                            waiting.with_map(&key, |map| map.wake(&key));
                        }
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::warn!(error = %err, "postgres store: the listening connection failed");
                        break;
                    }
                }
            }
            reading.store(false, Ordering::Release);
            // Whoever waited through the loss looks again now.
            waiting.wake_all();
        });
        client
            .batch_execute(&format!("LISTEN {}", self.channel))
            .await?;
        Ok(Session {
            alive,
            _client: client,
        })
    }
}
