//! The admin API's listing by state (docs/behaviour.md §24): `SCAN` in pages, never
//! `KEYS`, on a cluster every master in turn. The keys of a batch are read together with
//! the inspect script (each one's value and expiry in one step) and kept when the record
//! is in the state asked.

use std::sync::Arc;

use redis::Value;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::admin::inspect_on;
use super::{Conn, RedisStore, unavailable};
use crate::idempotency::ScopedKey;
use crate::store::{Cursor, Inspection, Page, StateFilter, StoreError};

/// `SCAN` batches one page may take at most: a page over a keyspace with few matches
/// ends short, with a cursor, rather than running past `store.timeout`.
const MAX_BATCHES: usize = 16;

impl RedisStore {
    pub(super) async fn list_keys(
        &self,
        state: StateFilter,
        cursor: Cursor,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let mut conn = self.conn().await?;
        // A master is named by the first slot it serves: stable across pages, and a
        // route the cluster connection understands. A single server is "slot 0".
        let masters = match &mut conn {
            Conn::Cluster(_) => masters(&mut conn).await?,
            _ => vec![0],
        };
        let Some(at) = masters.iter().position(|&m| u32::from(m) >= cursor.node) else {
            return Ok(Page::default());
        };
        // When the master the cursor named serves no more, its successor from the start.
        let (scan, after) = if u32::from(masters[at]) == cursor.node {
            (cursor.scan, cursor.after)
        } else {
            (0, None)
        };
        self.list_from(&mut conn, &masters, at, scan, after, state, limit)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn list_from(
        &self,
        conn: &mut Conn,
        masters: &[u16],
        mut at: usize,
        mut scan: u64,
        mut after: Option<ScopedKey>,
        state: StateFilter,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let pattern = format!("{}*", glob_escape(&self.prefix));
        let count = limit.clamp(10, 1000);
        let mut items: Vec<(ScopedKey, Inspection)> = Vec::new();
        let script = Arc::new(self.scripts.inspect.clone());
        for _ in 0..MAX_BATCHES {
            let master = masters[at];
            let (next_scan, names) = scan_once(conn, master, scan, &pattern, count).await?;
            // Read together: the multiplexed connection pipelines them.
            let mut reads = tokio::task::JoinSet::new();
            for name in names {
                let Some(key) = name
                    .strip_prefix(self.prefix.as_str())
                    .and_then(ScopedKey::from_hex)
                else {
                    // A channel name, or another application's key under the prefix.
                    continue;
                };
                if after.is_some_and(|after| key <= after) {
                    continue;
                }
                let (mut conn, script) = (conn.clone(), Arc::clone(&script));
                reads.spawn(async move { (key, inspect_on(&mut conn, &script, name).await) });
            }
            let mut found = Vec::new();
            while let Some(read) = reads.join_next().await {
                let (key, read) =
                    read.map_err(|_| StoreError::Protocol("a listing read panicked"))?;
                match read {
                    Ok(Some(seen)) if state.matches(&seen.record) => found.push((key, seen)),
                    // Gone meanwhile, another state, or a value this version cannot
                    // decode: not listed.
                    Ok(_) | Err(StoreError::Corrupt(_)) => {}
                    Err(err) => return Err(err),
                }
            }
            found.sort_unstable_by_key(|(key, _)| *key);
            let room = limit - items.len();
            if found.len() > room {
                // The page ends inside this batch: the next one scans it again, past
                // the last key listed.
                found.truncate(room);
                let last = found.last().map(|(key, _)| *key);
                items.extend(found);
                let next = Cursor {
                    node: u32::from(master),
                    scan,
                    after: last.or(after),
                };
                return Ok(Page {
                    items,
                    next: Some(next),
                });
            }
            items.extend(found);
            after = None;
            if next_scan == 0 {
                at += 1;
                if at == masters.len() {
                    return Ok(Page { items, next: None });
                }
                scan = 0;
            } else {
                scan = next_scan;
            }
            if items.len() == limit {
                break;
            }
        }
        let next = Cursor {
            node: u32::from(masters[at]),
            scan,
            after: None,
        };
        Ok(Page {
            items,
            next: Some(next),
        })
    }
}

/// One `SCAN` step on the master serving `slot` (on a single server, the server).
async fn scan_once(
    conn: &mut Conn,
    slot: u16,
    scan: u64,
    pattern: &str,
    count: usize,
) -> Result<(u64, Vec<String>), StoreError> {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(scan)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(count);
    let reply: Value = match conn {
        Conn::Cluster(cluster) => {
            let route = Route::new(slot, SlotAddr::Master);
            cluster
                .route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
        }
        other => cmd.query_async(other).await,
    }
    .map_err(unavailable)?;
    redis::from_redis_value::<(String, Vec<String>)>(reply)
        .ok()
        .and_then(|(next, names)| Some((next.parse().ok()?, names)))
        .ok_or(StoreError::Protocol("unexpected reply to SCAN"))
}

/// The first slot each master serves, in order: from `CLUSTER SLOTS`.
async fn masters(conn: &mut Conn) -> Result<Vec<u16>, StoreError> {
    let reply: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .map_err(unavailable)?;
    let bad = || StoreError::Protocol("unexpected reply to CLUSTER SLOTS");
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let mut firsts: Vec<(Vec<u8>, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad());
        };
        let (Some(Value::Int(start)), Some(Value::Array(master))) = (parts.first(), parts.get(2))
        else {
            return Err(bad());
        };
        let start = u16::try_from(*start).map_err(|_| bad())?;
        // The master's node id, or its address when the reply has none.
        let name = match (master.get(2), master.first(), master.get(1)) {
            (Some(Value::BulkString(id)), _, _) => id.clone(),
            (_, Some(host), Some(Value::Int(port))) => format!("{host:?}:{port}").into_bytes(),
            _ => return Err(bad()),
        };
        match firsts.iter_mut().find(|(seen, _)| *seen == name) {
            Some((_, first)) => *first = (*first).min(start),
            None => firsts.push((name, start)),
        }
    }
    let mut slots: Vec<u16> = firsts.into_iter().map(|(_, first)| first).collect();
    slots.sort_unstable();
    Ok(slots)
}

/// `prefix` with the glob characters of `MATCH` escaped.
fn glob_escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
