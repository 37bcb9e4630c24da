//! The PostgreSQL store (docs/behaviour.md §22): records in one table of a database its
//! users already replicate, synchronously where they need a failover to lose nothing.
//!
//! A replay is one statement round trip (the claim returns the row that is there) and a
//! first execution two (claim, complete), each a prepared statement outside any
//! explicit transaction (`sql.rs`). The pool (`conn.rs`) drops a connection on any
//! error, and one whose call was given up on at `store.timeout`, so the next call
//! connects afresh to whichever host of the URL is the primary then. The table is checked, or made, before the first statement (`schema.rs`);
//! expired rows are absent to every statement and deleted in the background (`sweep`).

mod conn;
mod hosts;
mod metrics;
mod schema;
mod sql;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use conn::{Canceller, Lent};
use deadpool_postgres::Pool;
use tokio::sync::OnceCell;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::api::{
    Claim, ClaimRequest, Cursor, Fenced, Inspection, Lease, Page, Purged, Replaced, StateFilter,
    Store, StoreError, millis, wall_clock_ms,
};
use crate::config::StoreConfig;
use crate::idempotency::{Completed, InFlight, Record, ScopedKey};
pub use schema::{SchemaError, create_statements};
use sql::{SWEEP_BATCH, Sql};
use watch::Listener;
pub use watch::PostgresWatch;

/// How many times a claim looks again when its key's row changes under it (a racing
/// claim not yet visible, an expired row taken by another): more means a pathological
/// key.
const CLAIM_ATTEMPTS: usize = 8;

/// Sweep statements per sweep at most: 100,000 rows, then the next interval goes on.
const SWEEP_BATCHES: usize = 100;

#[derive(Debug)]
pub struct PostgresStore {
    pool: Pool,
    sql: Sql,
    /// Whether changes are announced to waiters (a route has `on_concurrent: wait`).
    notify: bool,
    listener: Listener,
    /// Set once the table was found good (or made): the first call checks it.
    ready: OnceCell<()>,
    create_table: bool,
    sweep_interval: Duration,
    timeout: Duration,
    canceller: Canceller,
    metrics: metrics::PoolMetrics,
}

/// Unix ms as PostgreSQL's `bigint`, saturating.
fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn now_ms() -> u64 {
    wall_clock_ms()
}

fn decode(value: Vec<u8>) -> Result<Record, StoreError> {
    Record::decode(Bytes::from(value)).map_err(StoreError::Corrupt)
}

fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    at: usize,
) -> Result<T, StoreError> {
    row.try_get(at).map_err(|_| {
        StoreError::Protocol("a row of the postgres store's table has an unexpected type")
    })
}

impl PostgresStore {
    /// Builds the pool without connecting: [`PostgresStore::start`] (or the first call)
    /// connects, and a database that is down at start does not stop idemgate.
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let (pool, pg) = conn::pool(config)?;
        let sql = Sql::new(&config.table);
        let (_, mode) = conn::pg_config(config)?;
        let listener = Listener::new(
            pg,
            conn::tls(config, mode)?,
            sql.channel.clone(),
            config.timeout,
        );
        Ok(Self {
            metrics: metrics::PoolMetrics::new(pool.clone()),
            pool,
            sql,
            notify: true,
            listener,
            ready: OnceCell::new(),
            create_table: config.create_table,
            sweep_interval: config.sweep_interval,
            timeout: config.timeout,
            canceller: Canceller {
                tls: conn::tls(config, mode)?,
                timeout: config.timeout,
            },
        })
    }

    /// For a deployment where no route has `on_concurrent: wait`: changes are not
    /// announced, as nobody listens.
    #[must_use]
    pub fn without_notifications(mut self) -> Self {
        self.notify = false;
        self
    }

    /// The table's name, as statements and errors write it.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// At start: checks (or makes) the table and warns when no standby is synchronous.
    /// A table that is not this version's is the error that stops idemgate; a database
    /// that cannot be reached is not (the first call checks again). Starts the sweep.
    pub async fn start(self: &Arc<Self>) -> Result<(), SchemaError> {
        let wait = (self.timeout * 5).max(Duration::from_secs(5));
        match tokio::time::timeout(wait, self.check_table()).await {
            Ok(Ok(())) => {}
            Ok(Err(Checked::Schema(err))) => return Err(err),
            Ok(Err(Checked::Store(err))) => tracing::warn!(
                table = self.table(),
                error = %err,
                "postgres unreachable at start; the table is checked on the first connection"
            ),
            Err(_) => tracing::warn!(
                table = self.table(),
                "postgres did not answer at start; the table is checked on the first connection"
            ),
        }
        tokio::spawn(sweep(Arc::downgrade(self)));
        Ok(())
    }

    async fn check_table(&self) -> Result<(), Checked> {
        self.ready
            .get_or_try_init(|| async {
                let mut client = Lent::new(
                    self.pool
                        .get()
                        .await
                        .map_err(|e| Checked::Store(conn::no_connection(e)))?,
                    &self.canceller,
                );
                if let Err(err) =
                    schema::ensure(&mut client, &self.sql.table, self.create_table).await
                {
                    client.close();
                    return Err(Checked::Schema(err));
                }
                let warning = schema::replication_warning(&client).await;
                if warning.is_ok() {
                    client.give_back();
                } else {
                    client.close();
                }
                match warning {
                    Ok(Some(warning)) => tracing::warn!(table = self.table(), "{warning}"),
                    Ok(None) => tracing::info!(
                        table = self.table(),
                        "postgres reachable; synchronous_standby_names is set"
                    ),
                    Err(err) => {
                        tracing::warn!(error = %err, "could not read synchronous_standby_names");
                    }
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// A connection of the pool, the table checked.
    async fn client(&self) -> Result<Lent<'_>, StoreError> {
        if self.ready.get().is_none() {
            self.check_table().await.map_err(|err| match err {
                Checked::Store(err) => err,
                Checked::Schema(err) => {
                    tracing::error!(error = %err, "postgres store: the table cannot be used");
                    conn::unavailable(err)
                }
            })?;
        }
        self.pool
            .get()
            .await
            .map(|client| Lent::new(client, &self.canceller))
            .map_err(conn::no_connection)
    }

    /// Runs a prepared statement on a connection of the pool (`conn::Lent`).
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.client().await?.query(sql, params).await
    }

    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        self.client().await?.execute(sql, params).await
    }

    /// The notifying form of a statement when someone may wait.
    fn pick<'a>(&self, forms: &'a [String; 2]) -> &'a str {
        &forms[usize::from(self.notify)]
    }

    /// Deletes expired rows, a batch at a time; returns how many.
    async fn sweep_once(&self) -> Result<u64, StoreError> {
        let mut removed = 0;
        for _ in 0..SWEEP_BATCHES {
            let now = ms(now_ms());
            let n = self.execute(&self.sql.sweep, &[&now]).await?;
            removed += n;
            if n < u64::try_from(SWEEP_BATCH).unwrap_or(u64::MAX) {
                break;
            }
        }
        Ok(removed)
    }
}

enum Checked {
    Schema(SchemaError),
    Store(StoreError),
}

/// The background sweep of docs/behaviour.md §22: every `sweep_interval`, with a
/// little jitter so that replicas started together do not sweep together. Ends with
/// the store.
async fn sweep(store: std::sync::Weak<PostgresStore>) {
    loop {
        let Some(interval) = store.upgrade().map(|s| s.sweep_interval) else {
            return;
        };
        let jitter = interval.mul_f64(fastrand::f64() * 0.1);
        tokio::time::sleep(interval + jitter).await;
        let Some(store) = store.upgrade() else {
            return;
        };
        match store.sweep_once().await {
            Ok(0) => {}
            Ok(n) => {
                store.metrics.swept(n);
                tracing::debug!(rows = n, "postgres store: expired rows deleted");
            }
            Err(err) => {
                tracing::debug!(error = %err, "postgres store: sweep failed; next interval tries again");
            }
        }
    }
}

impl Store for PostgresStore {
    type Watch = PostgresWatch;

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let id = req.key.id("");
        let token: &[u8] = req.token.as_bytes();
        for _ in 0..CLAIM_ATTEMPTS {
            let now = now_ms();
            let marker = req.marker(now);
            let encoded = marker.encode();
            let value: &[u8] = &encoded;
            let expires = ms(now + millis(req.marker_ttl()));
            let lease_until = ms(marker.lease_deadline_ms);
            let rows = self
                .query(
                    &self.sql.claim,
                    &[&id, &value, &expires, &token, &lease_until],
                )
                .await?;
            // No row: a racing claim's row is not visible to this statement; look again.
            let Some(row) = rows.first() else { continue };
            let Some(found) = column::<Option<Vec<u8>>>(row, 0)? else {
                return Ok(Claim::Acquired(req.lease(now)));
            };
            let expires_at: i64 = column(row, 1)?;
            if expires_at > ms(now) {
                return Ok(Claim::Existing {
                    record: decode(found)?,
                    now_ms: now,
                });
            }
            // Expired but not yet swept: absent, so this claim takes it if it still is.
            let taken = self
                .query(
                    self.pick(&self.sql.claim_expired),
                    &[&id, &value, &expires, &token, &lease_until, &ms(now)],
                )
                .await?;
            if !taken.is_empty() {
                return Ok(Claim::Acquired(req.lease(now)));
            }
        }
        Err(StoreError::Protocol(
            "the claim found its key's row changing under it on every attempt",
        ))
    }

    async fn complete(
        &self,
        lease: &Lease,
        record: Arc<Completed>,
        ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        let id = lease.key.id("");
        let token: &[u8] = lease.token.as_bytes();
        let encoded = record.encode();
        let value: &[u8] = &encoded;
        let now = now_ms();
        let expires = ms(now + millis(ttl).max(1));
        let rows = self
            .query(
                self.pick(&self.sql.complete),
                &[&id, &token, &value, &expires, &ms(now)],
            )
            .await?;
        if !rows.is_empty() {
            return Ok(Fenced::Done);
        }
        // Repeating a completion that already landed (a retry after a timed-out call).
        let there = self.query(&self.sql.read, &[&id, &ms(now)]).await?;
        let same = match there.first() {
            Some(row) => column::<&[u8]>(row, 0)? == value,
            None => false,
        };
        Ok(if same {
            Fenced::Done
        } else {
            Fenced::LeaseLost
        })
    }

    async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        let id = lease.key.id("");
        let token: &[u8] = lease.token.as_bytes();
        let rows = self
            .query(self.pick(&self.sql.release), &[&id, &token, &ms(now_ms())])
            .await?;
        Ok(if rows.is_empty() {
            Fenced::LeaseLost
        } else {
            Fenced::Done
        })
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Fenced, StoreError> {
        let id = lease.key.id("");
        let token: &[u8] = lease.token.as_bytes();
        let now = now_ms();
        let deadline = now + millis(lease_for);
        let bytes = deadline.to_be_bytes();
        let deadline_bytes: &[u8] = &bytes;
        let n = self
            .execute(
                &self.sql.renew,
                &[&id, &token, &deadline_bytes, &ms(deadline), &ms(now)],
            )
            .await?;
        Ok(if n == 0 {
            Fenced::LeaseLost
        } else {
            Fenced::Done
        })
    }

    async fn take_over(
        &self,
        stale: InFlight,
        req: ClaimRequest,
    ) -> Result<Option<Lease>, StoreError> {
        let id = req.key.id("");
        let stale: &[u8] = stale.token.as_bytes();
        let token: &[u8] = req.token.as_bytes();
        let now = now_ms();
        let marker = req.marker(now);
        let encoded = marker.encode();
        let value: &[u8] = &encoded;
        let expires = ms(now + millis(req.marker_ttl()));
        let rows = self
            .query(
                self.pick(&self.sql.take_over),
                &[
                    &id,
                    &stale,
                    &value,
                    &expires,
                    &token,
                    &ms(marker.lease_deadline_ms),
                    &ms(now),
                ],
            )
            .await?;
        Ok((!rows.is_empty()).then(|| req.lease(now)))
    }

    async fn watch(&self, key: ScopedKey) -> Result<PostgresWatch, StoreError> {
        Ok(self.listener.watch(key).await)
    }

    /// Ready only on a primary: a standby would refuse every claim.
    async fn ping(&self) -> Result<(), StoreError> {
        let rows = self.query("SELECT pg_is_in_recovery()", &[]).await?;
        match rows.first().map(|row| column::<bool>(row, 0)).transpose()? {
            Some(false) => Ok(()),
            Some(true) => Err(conn::unavailable(std::io::Error::other(
                "the server is a standby (read-only); the URL names no primary that answers",
            ))),
            None => Err(StoreError::Protocol("SELECT answered no row")),
        }
    }

    async fn inspect(&self, key: ScopedKey) -> Result<Option<Inspection>, StoreError> {
        let id = key.id("");
        let now = now_ms();
        let rows = self.query(&self.sql.inspect, &[&id, &ms(now)]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let at: i64 = column(row, 1)?;
        Ok(Some(Inspection {
            record: decode(column(row, 0)?)?,
            expires_at_ms: u64::try_from(at).unwrap_or(now),
            now_ms: now,
        }))
    }

    async fn list(
        &self,
        state: StateFilter,
        cursor: Cursor,
        limit: usize,
    ) -> Result<Page, StoreError> {
        // Rows are read in id order, in batches, and kept when in `state`; a page over
        // a table with few matches ends short, with a cursor, within a bounded number
        // of batches (docs/behaviour.md §24).
        const MAX_BATCHES: usize = 16;
        let batch = limit.clamp(100, 1000);
        let now = now_ms();
        let mut after = cursor.after;
        let mut items = Vec::new();
        for _ in 0..MAX_BATCHES {
            let from = after.map(|key| key.id("")).unwrap_or_default();
            let rows = self
                .query(
                    &self.sql.list,
                    &[&from, &ms(now), &i64::try_from(batch).unwrap_or(i64::MAX)],
                )
                .await?;
            let full = rows.len() == batch;
            for (i, row) in rows.iter().enumerate() {
                let id: String = column(row, 0)?;
                let key = ScopedKey::from_hex(&id)
                    .ok_or(StoreError::Protocol("a postgres row id is not a record id"))?;
                after = Some(key);
                // A value this version cannot decode is not in any state: skipped.
                let Ok(record) = decode(column(row, 1)?) else {
                    continue;
                };
                if state.matches(&record) {
                    let at: i64 = column(row, 2)?;
                    let found = Inspection {
                        record,
                        expires_at_ms: u64::try_from(at).unwrap_or(now),
                        now_ms: now,
                    };
                    items.push((key, found));
                }
                if items.len() == limit {
                    let more = full || i + 1 < rows.len();
                    let next = more.then_some(Cursor {
                        after,
                        ..Cursor::default()
                    });
                    return Ok(Page { items, next });
                }
            }
            if !full {
                return Ok(Page { items, next: None });
            }
        }
        Ok(Page {
            items,
            next: Some(Cursor {
                after,
                ..Cursor::default()
            }),
        })
    }

    async fn purge(&self, key: ScopedKey, force: bool) -> Result<Purged, StoreError> {
        let id = key.id("");
        let now = ms(now_ms());
        let rows = self
            .query(self.pick(&self.sql.purge), &[&id, &now, &force])
            .await?;
        if let Some(row) = rows.first() {
            // Removed already; a value this version cannot decode is still a purge.
            return Ok(decode(column(row, 0)?).map_or(Purged::Unreadable, Purged::Removed));
        }
        let there = self.query(&self.sql.read, &[&id, &now]).await?;
        Ok(if there.is_empty() {
            Purged::Absent
        } else {
            Purged::LiveLease
        })
    }

    async fn replace(
        &self,
        key: ScopedKey,
        expected: &Record,
        new: Option<Arc<Completed>>,
    ) -> Result<Replaced, StoreError> {
        let id = key.id("");
        let now = ms(now_ms());
        let expected = expected.encode();
        let expected: &[u8] = &expected;
        let n = match new {
            Some(record) => {
                let encoded = record.encode();
                let value: &[u8] = &encoded;
                self.execute(&self.sql.replace, &[&id, &expected, &value, &now])
                    .await?
            }
            None => {
                self.execute(&self.sql.remove, &[&id, &expected, &now])
                    .await?
            }
        };
        if n > 0 {
            return Ok(Replaced::Done);
        }
        let there = self.query(&self.sql.read, &[&id, &now]).await?;
        Ok(if there.is_empty() {
            Replaced::Absent
        } else {
            Replaced::Changed
        })
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
    }
}
