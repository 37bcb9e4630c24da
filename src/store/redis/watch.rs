//! Waking waiters when a key changes: the scripts `PUBLISH` on the key's channel, RESP3
//! pushes arrive on the shared connection, and [`PushDispatch`] wakes the local waiters.
//!
//! The connection subscribes to a channel while some local waiter watches it. A channel's
//! `SUBSCRIBE` and `UNSUBSCRIBE` are sent one at a time, in the order the waiters came and
//! went, and the last waiter's unsubscribe is skipped when a new waiter arrived before it
//! was sent: otherwise it could reach Redis after the new waiter's subscribe and leave
//! that waiter deaf until its lease ran out.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::aio::AsyncPushSender;
use redis::{PushInfo, PushKind, RedisError, Value};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Mutex as AsyncMutex, Notify};

use super::Conn;
use super::version::ClaimMode;
use crate::store::Watch;

#[derive(Debug)]
struct Entry {
    notify: Arc<Notify>,
    watchers: usize,
    /// Held while the channel's subscribe or unsubscribe is under way. Also tells this
    /// entry from a later one for the same channel.
    turn: Arc<AsyncMutex<()>>,
}

/// Local waiters by channel.
#[derive(Debug, Default)]
pub(super) struct Watchers {
    map: Mutex<HashMap<Vec<u8>, Entry>>,
}

impl Watchers {
    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Entry>> {
        // Every mutation is a single insert, update or remove.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter; its wake-up is armed before the caller subscribes and re-reads
    /// the key, so a change in between is not lost.
    pub(super) fn register(self: &Arc<Self>, channel: String, conn: Conn) -> RedisWatch {
        let (notify, turn) = {
            let mut map = self.lock();
            let entry = map
                .entry(channel.clone().into_bytes())
                .or_insert_with(|| Entry {
                    notify: Arc::new(Notify::new()),
                    watchers: 0,
                    turn: Arc::new(AsyncMutex::new(())),
                });
            entry.watchers += 1;
            (Arc::clone(&entry.notify), Arc::clone(&entry.turn))
        };
        let mut notified = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        RedisWatch {
            notified: Some(notified),
            channel,
            conn,
            turn,
            watchers: Arc::clone(self),
        }
    }

    fn wake(&self, channel: &[u8]) {
        if let Some(entry) = self.lock().get(channel) {
            entry.notify.notify_waiters();
        }
    }

    /// After a reconnect, messages may have been missed: everyone looks again.
    pub(super) fn wake_all(&self) {
        for entry in self.lock().values() {
            entry.notify.notify_waiters();
        }
    }

    /// Drops one waiter; true when it was the last one on the channel. The entry stays
    /// until the channel is unsubscribed (or a new waiter takes it over).
    fn unregister(&self, channel: &str) -> bool {
        let mut map = self.lock();
        let Some(entry) = map.get_mut(channel.as_bytes()) else {
            return false;
        };
        entry.watchers -= 1;
        entry.watchers == 0
    }

    /// Whether `turn`'s entry is still the channel's and nobody waits on it.
    fn idle(&self, channel: &str, turn: &Arc<AsyncMutex<()>>) -> bool {
        idle_in(&self.lock(), channel, turn)
    }

    /// Removes `turn`'s entry if nobody waits on it (any more).
    fn remove_if_idle(&self, channel: &str, turn: &Arc<AsyncMutex<()>>) {
        let mut map = self.lock();
        if idle_in(&map, channel, turn) {
            map.remove(channel.as_bytes());
        }
    }
}

fn idle_in(map: &HashMap<Vec<u8>, Entry>, channel: &str, turn: &Arc<AsyncMutex<()>>) -> bool {
    map.get(channel.as_bytes())
        .is_some_and(|entry| Arc::ptr_eq(&entry.turn, turn) && entry.watchers == 0)
}

/// Receives the connection's RESP3 pushes. Must not block: it only takes a short lock.
#[derive(Debug)]
pub(super) struct PushDispatch {
    pub(super) watchers: Arc<Watchers>,
    /// Forgotten on a disconnection: the next connection may reach another server.
    pub(super) claim_mode: Arc<ClaimMode>,
}

impl AsyncPushSender for PushDispatch {
    fn send(&self, info: PushInfo) -> Result<(), redis::aio::SendError> {
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(channel)) = info.data.first() {
                    self.watchers.wake(channel);
                }
            }
            PushKind::Disconnection => {
                self.claim_mode.forget();
                self.watchers.wake_all();
            }
            _ => {}
        }
        Ok(())
    }
}

/// One waiter's subscription to a key's channel.
pub struct RedisWatch {
    notified: Option<Pin<Box<OwnedNotified>>>,
    channel: String,
    conn: Conn,
    turn: Arc<AsyncMutex<()>>,
    watchers: Arc<Watchers>,
}

impl RedisWatch {
    /// Subscribes the connection to the channel, after any unsubscribe of it still under
    /// way. Subscribing to a channel the connection already has is a no-op for Redis, and
    /// returning once Redis confirmed means no publish after it is missed.
    pub(super) async fn subscribe(&self) -> Result<(), RedisError> {
        let _turn = self.turn.lock().await;
        match self.conn.clone() {
            Conn::Single(mut c) => c.subscribe(&self.channel).await,
            Conn::Cluster(mut c) => c.subscribe(&self.channel).await,
            Conn::Sentinel(mut c) => c.subscribe(&self.channel).await,
        }
    }
}

impl std::fmt::Debug for RedisWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisWatch")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Watch for RedisWatch {
    async fn changed(mut self) {
        if let Some(notified) = self.notified.take() {
            notified.await;
        }
    }
}

impl Drop for RedisWatch {
    fn drop(&mut self) {
        if !self.watchers.unregister(&self.channel) {
            return;
        }
        // The last local waiter is gone: stop receiving this channel.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.watchers.remove_if_idle(&self.channel, &self.turn);
            return;
        };
        let conn = self.conn.clone();
        let channel = std::mem::take(&mut self.channel);
        let turn = Arc::clone(&self.turn);
        let watchers = Arc::clone(&self.watchers);
        runtime.spawn(async move {
            // After any subscribe in flight; a waiter that arrives from here on
            // subscribes after this unsubscribe.
            let _turn = turn.lock().await;
            if !watchers.idle(&channel, &turn) {
                // A new waiter arrived meanwhile: the subscription is its now.
                return;
            }
            let result = match conn {
                Conn::Single(mut c) => c.unsubscribe(&channel).await,
                Conn::Cluster(mut c) => c.unsubscribe(&channel).await,
                Conn::Sentinel(mut c) => c.unsubscribe(&channel).await,
            };
            if let Err(err) = result {
                tracing::debug!(error = %err, "unsubscribe failed");
            }
            watchers.remove_if_idle(&channel, &turn);
        });
    }
}
