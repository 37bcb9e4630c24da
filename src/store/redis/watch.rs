//! Waking waiters when a key changes: the scripts `PUBLISH` on the key's channel, RESP3
//! pushes arrive on the shared connection, and [`PushDispatch`] wakes the local waiters.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::aio::AsyncPushSender;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::Conn;
use crate::store::Watch;

#[derive(Debug)]
struct Entry {
    notify: Arc<Notify>,
    watchers: usize,
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
        let notify = {
            let mut map = self.lock();
            let entry = map
                .entry(channel.clone().into_bytes())
                .or_insert_with(|| Entry {
                    notify: Arc::new(Notify::new()),
                    watchers: 0,
                });
            entry.watchers += 1;
            Arc::clone(&entry.notify)
        };
        let mut notified = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        RedisWatch {
            notified: Some(notified),
            channel,
            conn: Some(conn),
            watchers: Arc::clone(self),
        }
    }

    fn wake(&self, channel: &[u8]) {
        if let Some(entry) = self.lock().get(channel) {
            entry.notify.notify_waiters();
        }
    }

    /// After a reconnect, messages may have been missed: everyone looks again.
    fn wake_all(&self) {
        for entry in self.lock().values() {
            entry.notify.notify_waiters();
        }
    }

    /// Drops one waiter; true when it was the last one on the channel.
    fn unregister(&self, channel: &str) -> bool {
        let mut map = self.lock();
        let Some(entry) = map.get_mut(channel.as_bytes()) else {
            return false;
        };
        entry.watchers -= 1;
        if entry.watchers == 0 {
            map.remove(channel.as_bytes());
            return true;
        }
        false
    }
}

/// Receives the connection's RESP3 pushes. Must not block: it only takes a short lock.
#[derive(Debug)]
pub(super) struct PushDispatch(pub(super) Arc<Watchers>);

impl AsyncPushSender for PushDispatch {
    fn send(&self, info: PushInfo) -> Result<(), redis::aio::SendError> {
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(channel)) = info.data.first() {
                    self.0.wake(channel);
                }
            }
            PushKind::Disconnection => self.0.wake_all(),
            _ => {}
        }
        Ok(())
    }
}

/// One waiter's subscription to a key's channel.
pub struct RedisWatch {
    notified: Option<Pin<Box<OwnedNotified>>>,
    channel: String,
    conn: Option<Conn>,
    watchers: Arc<Watchers>,
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
        let (Some(conn), Ok(runtime)) = (self.conn.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            let result = match conn {
                Conn::Single(mut c) => c.unsubscribe(&channel).await,
                Conn::Cluster(mut c) => c.unsubscribe(&channel).await,
            };
            if let Err(err) = result {
                tracing::debug!(error = %err, "unsubscribe failed");
            }
        });
    }
}
