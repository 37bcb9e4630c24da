//! The statements, written once for the configured table (docs/behaviour.md §22).
//!
//! One row per key: `id` the 64-hex record id, `value` the encoded record, `expires_at`
//! unix ms, and for an in-flight marker its `owner` token and `lease_until` (unix ms),
//! both NULL once the record is complete. Every statement treats a row whose
//! `expires_at` has passed as absent, so an expired row costs nothing until the sweep
//! deletes it. Times are the calling replica's clock, as on Redis (§5).
//!
//! The table name is checked to be a plain identifier (`config::sections::store::postgres`)
//! before it is written into a statement; everything else is a bound parameter.

/// The statements of one table. The `*_notify` forms also `NOTIFY` the table's channel
/// with the row id, for waiters (`on_concurrent: wait`); the plain forms are used when
/// no route waits, so nobody pays for a notification nobody hears.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) table: String,
    pub(super) channel: String,
    /// `$1` id, `$2` marker, `$3` expires_at, `$4` owner, `$5` lease_until. Returns no
    /// row when a concurrent claim's row is not yet visible to this statement's
    /// snapshot (the caller looks again), one row `(NULL, NULL)` when it inserted, else
    /// the row that is there, expired or not.
    pub(super) claim: String,
    /// Takes an expired row: `$1` id, `$2` marker, `$3` expires_at, `$4` owner, `$5`
    /// lease_until, `$6` now. One row when it took it.
    pub(super) claim_expired: [String; 2],
    /// `$1` id, `$2` owner, `$3` record, `$4` expires_at, `$5` now.
    pub(super) complete: [String; 2],
    /// `$1` id, `$2` now: the value, for a completion repeated after it landed.
    pub(super) read: String,
    /// `$1` id, `$2` owner, `$3` now.
    pub(super) release: [String; 2],
    /// `$1` id, `$2` owner, `$3` the new lease deadline (8 bytes, big-endian), `$4` the
    /// same as a number, `$5` now. The record's expiry is kept, but never shorter than
    /// the new lease.
    pub(super) renew: String,
    /// `$1` id, `$2` stale owner, `$3` marker, `$4` expires_at, `$5` owner, `$6`
    /// lease_until, `$7` now: only a marker whose lease has ended is replaced.
    pub(super) take_over: [String; 2],
    /// `$1` id, `$2` now: value and expires_at.
    pub(super) inspect: String,
    /// `$1` the last id listed (`''` first), `$2` now, `$3` how many: the unexpired rows
    /// after it in id order, for a listing by state (docs/behaviour.md §24).
    pub(super) list: String,
    /// `$1` id, `$2` now, `$3` force: the removed value; nothing when absent or when a
    /// live marker was kept.
    pub(super) purge: [String; 2],
    /// `$1` id, `$2` expected value, `$3` new value, `$4` now: keeps the expiry.
    pub(super) replace: String,
    /// `$1` id, `$2` expected value, `$3` now.
    pub(super) remove: String,
    /// `$1` now: deletes at most [`SWEEP_BATCH`] expired rows that no other sweep holds.
    pub(super) sweep: String,
}

/// At most this many rows per sweep statement (docs/behaviour.md §22).
pub(super) const SWEEP_BATCH: i64 = 1000;

/// Bytes 51..58 (1-based) of a marker hold its lease deadline (`record.rs`).
const DEADLINE_AT: u32 = 51;

impl Sql {
    pub(super) fn new(table: &str) -> Self {
        let t = table;
        // One channel per table, named from it: replicas sharing a table hear each other.
        let channel = format!("idemgate_{}", t.replace('.', "_"));
        // Each notifying form wraps the plain one: a CTE that changes the row and
        // returns its id, and a select that notifies once per changed row.
        let both = |changed: String, returning: &str| -> [String; 2] {
            [
                format!("WITH c AS ({changed} RETURNING {returning}) SELECT {returning} FROM c"),
                format!(
                    "WITH c AS ({changed} RETURNING id, {returning}) \
                     SELECT {returning} FROM c, pg_notify('{channel}', c.id) n"
                ),
            ]
        };
        Sql {
            claim: format!(
                "WITH ins AS (INSERT INTO {t} (id, value, expires_at, owner, lease_until) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING RETURNING 1) \
                 SELECT NULL::bytea, NULL::int8 FROM ins \
                 UNION ALL \
                 SELECT value, expires_at FROM {t} WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM ins)"
            ),
            claim_expired: both(
                format!(
                    "UPDATE {t} SET value = $2, expires_at = $3, owner = $4, lease_until = $5 \
                     WHERE id = $1 AND expires_at <= $6"
                ),
                "1",
            ),
            complete: both(
                format!(
                    "UPDATE {t} SET value = $3, expires_at = $4, owner = NULL, lease_until = NULL \
                     WHERE id = $1 AND owner = $2 AND expires_at > $5"
                ),
                "1",
            ),
            read: format!("SELECT value FROM {t} WHERE id = $1 AND expires_at > $2"),
            release: both(
                format!("DELETE FROM {t} WHERE id = $1 AND owner = $2 AND expires_at > $3"),
                "1",
            ),
            renew: format!(
                "UPDATE {t} SET value = overlay(value PLACING $3 FROM {DEADLINE_AT} FOR 8), \
                 lease_until = $4, expires_at = GREATEST(expires_at, $4) \
                 WHERE id = $1 AND owner = $2 AND expires_at > $5"
            ),
            take_over: both(
                format!(
                    "UPDATE {t} SET value = $3, expires_at = $4, owner = $5, lease_until = $6 \
                     WHERE id = $1 AND owner = $2 AND lease_until <= $7 AND expires_at > $7"
                ),
                "1",
            ),
            inspect: format!("SELECT value, expires_at FROM {t} WHERE id = $1 AND expires_at > $2"),
            list: format!(
                "SELECT id, value, expires_at FROM {t} WHERE id > $1 AND expires_at > $2 \
                 ORDER BY id LIMIT $3"
            ),
            purge: both(
                format!(
                    "DELETE FROM {t} WHERE id = $1 AND expires_at > $2 \
                     AND ($3 OR lease_until IS NULL OR lease_until <= $2)"
                ),
                "value",
            ),
            replace: format!(
                "UPDATE {t} SET value = $3, owner = NULL, lease_until = NULL \
                 WHERE id = $1 AND value = $2 AND expires_at > $4"
            ),
            remove: format!("DELETE FROM {t} WHERE id = $1 AND value = $2 AND expires_at > $3"),
            sweep: format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE expires_at <= $1 \
                 LIMIT {SWEEP_BATCH} FOR UPDATE SKIP LOCKED)"
            ),
            table: table.to_owned(),
            channel,
        }
    }
}
