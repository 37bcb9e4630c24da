//! `store.min_replicas` (docs/behaviour.md §14): after a claim (or a take-over) and after
//! a record, `WAIT N` asks Redis how many replicas hold the write, bounded by
//! `store.timeout`.
//!
//! Redis replicates asynchronously: a write the master acknowledged may be missing on the
//! replica that a failover promotes. A claim lost that way lets a retry execute again, so
//! a claim that fewer than N replicas acknowledged is refused (`Unreplicated`, answered
//! `503 store-unavailable` and released by the proxy) and never forwarded. A record lost
//! that way leaves the claim's marker (replicated with the claim), so a retry gets
//! `409 in-flight` and then `outcome-unknown`, never a second execution; the response
//! is still sent, and the shortfall counted and logged.
//!
//! `WAIT` counts the replicas that acknowledged the *connection's* last write. The write
//! and its `WAIT` go over the same multiplexed connection, whose last write is then this
//! one or a later one. A reconnection in between (or a Sentinel switch to another master)
//! would make `WAIT` count for a connection that wrote nothing; the claim mode's epoch,
//! bumped by both, tells, and the write then counts as not acknowledged.
//!
//! Redis answers nothing else on a connection while a `WAIT` on it blocks, and every
//! request shares the one multiplexed connection. So `WAIT`s are shared, as a group commit
//! shares a flush: one is in flight at a time, and it answers for every write whose reply
//! had arrived when it was sent. A request whose write one already covers takes its answer.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use super::{Conn, RedisStore};
use crate::store::StoreError;

/// How many replicas must hold a write, and until when one is waited for.
#[derive(Debug)]
pub(super) struct Replicas {
    wanted: u32,
    /// `store.timeout`: the deadline of the whole store call the `WAIT` is part of.
    budget: Duration,
    /// `idemgate_replication_shortfall_total`, handed over by the proxy.
    shortfalls: OnceLock<Counter>,
    /// Writes whose reply has arrived, numbered in that order.
    writes: AtomicU64,
    /// Held while a `WAIT` is in flight; what the last one answered.
    last: AsyncMutex<LastWait>,
}

/// A `WAIT` that answered.
#[derive(Debug, Default)]
struct LastWait {
    /// It was sent once writes numbered below this had their replies.
    covers: u64,
    /// Replicas that acknowledged them all; `None` when it failed or timed out.
    acked: Option<u32>,
    /// The claim mode's epoch it was sent in: it says nothing of a write made on a
    /// connection (or master) of another epoch.
    epoch: u64,
}

/// What `WAIT` said of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acked {
    /// At least `min_replicas` replicas hold it (or none are asked for).
    Enough,
    /// Fewer did within the deadline; `acked` may be 0 because `WAIT` failed.
    Short { acked: u32 },
}

/// Where a write stands before its `WAIT`: when its call started, and in which epoch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written {
    started: Instant,
    epoch: u64,
}

impl Replicas {
    pub(super) fn new(wanted: u32, budget: Duration) -> Self {
        Self {
            wanted,
            budget,
            shortfalls: OnceLock::new(),
            writes: AtomicU64::new(0),
            last: AsyncMutex::new(LastWait::default()),
        }
    }

    pub(super) fn count_shortfalls_in(&self, counter: Counter) {
        // Set once, when the proxy starts on this store.
        let _ = self.shortfalls.set(counter);
    }

    /// How long `WAIT` may block: what is left of the call's budget, minus a tenth for
    /// the reply to come back, at least 1 ms (`WAIT` with 0 blocks for ever).
    fn wait_ms(&self, started: Instant) -> u64 {
        let left = self.budget.saturating_sub(started.elapsed());
        let ms = u64::try_from((left * 9 / 10).as_millis()).unwrap_or(u64::MAX);
        ms.max(1)
    }

    /// When this side stops waiting for `WAIT`'s reply: Redis checks blocked clients'
    /// timeouts on its event loop, which may sleep up to `1/hz` (100 ms) past one. The
    /// answer must come before the call's own deadline, or nothing would be counted.
    fn give_up_at(&self, started: Instant) -> Instant {
        started + self.budget * 19 / 20
    }
}

impl RedisStore {
    /// To be taken before a write whose replication is checked.
    pub(super) fn before_write(&self) -> Written {
        Written {
            started: Instant::now(),
            epoch: self.claim_mode.epoch(),
        }
    }

    /// `WAIT min_replicas` for the write made since `written`, on `conn` (the connection
    /// that wrote). `Enough` at once when no replica is asked for.
    pub(super) async fn replicated(&self, conn: &mut Conn, written: Written) -> Acked {
        let replicas = &self.replicas;
        let wanted = replicas.wanted;
        if wanted == 0 {
            return Acked::Enough;
        }
        // The write's reply has arrived: any WAIT sent from now on covers it.
        let write = replicas.writes.fetch_add(1, Ordering::AcqRel);
        let give_up = replicas.give_up_at(written.started);
        let acked = match tokio::time::timeout_at(give_up, replicas.last.lock()).await {
            Err(_) => None,
            Ok(last) if last.covers > write && last.epoch == written.epoch => last.acked,
            Ok(mut last) => {
                let covers = replicas.writes.load(Ordering::Acquire);
                let mut wait = redis::cmd("WAIT");
                wait.arg(wanted).arg(replicas.wait_ms(written.started));
                let wait = wait.query_async::<u32>(conn);
                let acked = match tokio::time::timeout_at(give_up, wait).await {
                    Ok(Ok(acked)) => Some(acked),
                    Ok(Err(err)) => {
                        tracing::debug!(error = %err, "WAIT failed");
                        None
                    }
                    Err(_) => None,
                };
                *last = LastWait {
                    covers,
                    acked,
                    epoch: written.epoch,
                };
                acked
            }
        };
        if self.claim_mode.epoch() != written.epoch {
            // Another connection (or master) answered the WAIT: it says nothing of ours.
            return Acked::Short { acked: 0 };
        }
        match acked {
            Some(acked) if acked >= wanted => Acked::Enough,
            Some(acked) => Acked::Short { acked },
            None => Acked::Short { acked: 0 },
        }
    }

    /// A claim (or take-over) that is not replicated enough is refused: the proxy
    /// releases it and answers 503, and never forwards it.
    pub(super) async fn claim_replicated(
        &self,
        conn: &mut Conn,
        written: Written,
    ) -> Result<(), StoreError> {
        match self.replicated(conn, written).await {
            Acked::Enough => Ok(()),
            Acked::Short { acked } => Err(StoreError::Unreplicated {
                acked,
                wanted: self.replicas.wanted,
            }),
        }
    }

    /// A record that is not replicated enough still stands (the upstream executed): it
    /// is counted and logged.
    pub(super) async fn record_replicated(&self, conn: &mut Conn, written: Written) {
        if let Acked::Short { acked } = self.replicated(conn, written).await {
            if let Some(counter) = self.replicas.shortfalls.get() {
                counter.inc();
            }
            tracing::warn!(
                acked,
                min_replicas = self.replicas.wanted,
                "a record reached fewer replicas than store.min_replicas within store.timeout; \
                 a failover now may lose it, and a retry would get outcome-unknown"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wait_gets_what_is_left_of_the_budget_less_a_tenth_and_never_0() {
        let replicas = Replicas::new(1, Duration::from_millis(1000));
        let started = Instant::now();
        assert_eq!(replicas.wait_ms(started), 900);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(replicas.wait_ms(started), 450);
        assert_eq!(
            replicas.give_up_at(started),
            started + Duration::from_millis(950)
        );
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(replicas.wait_ms(started), 1, "WAIT 0 would block for ever");
    }
}
