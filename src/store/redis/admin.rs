//! The admin API's read, purge and resolve (docs/behaviour.md §13, §18), each one script
//! so that what is reported or changed is one state of the key.

use bytes::Bytes;
use redis::{Script, Value};

use super::{Conn, RedisStore, now_ms, unavailable};
use crate::idempotency::{Completed, Record, ScopedKey};
use crate::store::{Inspection, Purged, Replaced, StoreError};

impl RedisStore {
    pub(super) async fn inspect_key(
        &self,
        key: &ScopedKey,
    ) -> Result<Option<Inspection>, StoreError> {
        let mut conn = self.conn().await?;
        inspect_on(&mut conn, &self.scripts.inspect, self.record_key(key)).await
    }

    pub(super) async fn purge_key(
        &self,
        key: &ScopedKey,
        force: bool,
    ) -> Result<Purged, StoreError> {
        let mut conn = self.conn().await?;
        let reply: Value = self
            .scripts
            .purge
            .key(self.record_key(key))
            .arg(now_ms())
            .arg(if force { "1" } else { "0" })
            .arg(self.channel(key))
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let Value::Array(items) = reply else {
            return Err(StoreError::Protocol("unexpected reply to the purge script"));
        };
        match items.as_slice() {
            [Value::Int(0)] => Ok(Purged::Absent),
            [Value::Int(2)] => Ok(Purged::LiveLease),
            // Removed already; a value this version cannot decode is still a purge.
            [Value::Int(1), Value::BulkString(value)] => {
                Ok(decode(value).map_or(Purged::Unreadable, Purged::Removed))
            }
            _ => Err(StoreError::Protocol("unexpected reply to the purge script")),
        }
    }
}

impl RedisStore {
    /// Compares the stored bytes with `expected`'s encoding: a record reads back and
    /// encodes to the bytes it was read from.
    pub(super) async fn replace_key(
        &self,
        key: &ScopedKey,
        expected: &Record,
        new: Option<&Completed>,
    ) -> Result<Replaced, StoreError> {
        let mut conn = self.conn().await?;
        let new = new
            .map(|record| record.encode().to_vec())
            .unwrap_or_default();
        let reply: i64 = self
            .scripts
            .replace
            .key(self.record_key(key))
            .arg(expected.encode().as_ref())
            .arg(new)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        match reply {
            1 => Ok(Replaced::Done),
            0 => Ok(Replaced::Changed),
            -1 => Ok(Replaced::Absent),
            _ => Err(StoreError::Protocol(
                "unexpected reply to the replace script",
            )),
        }
    }
}

/// What the Redis key `name` holds and when it expires, read by the inspect script on
/// `conn`: the admin API's read, and the listing's (`list.rs`).
pub(super) async fn inspect_on(
    conn: &mut Conn,
    inspect: &Script,
    name: String,
) -> Result<Option<Inspection>, StoreError> {
    let now = now_ms();
    let reply: Value = inspect
        .key(name)
        .invoke_async(conn)
        .await
        .map_err(unavailable)?;
    match reply {
        Value::Array(items) if items.is_empty() => Ok(None),
        Value::Array(items) => match items.as_slice() {
            [Value::BulkString(value), Value::Int(at)] => Ok(Some(Inspection {
                record: decode(value)?,
                // Every record is written with a ttl; one without (-1) is reported
                // as expiring now rather than never.
                expires_at_ms: u64::try_from(*at).unwrap_or(now),
                now_ms: now,
            })),
            _ => Err(StoreError::Protocol(
                "unexpected reply to the inspect script",
            )),
        },
        _ => Err(StoreError::Protocol(
            "unexpected reply to the inspect script",
        )),
    }
}

fn decode(value: &[u8]) -> Result<Record, StoreError> {
    Record::decode(Bytes::copy_from_slice(value)).map_err(StoreError::Corrupt)
}
