//! Fencing with the server's own compare-and-set (docs/behaviour.md §23): on Valkey 9
//! and Redis 8.4 the complete is one `SET key record IFEQ marker PX ttl` and the
//! release one `DELIFEQ key marker` (Valkey) or `DELEX key IFEQ marker` (Redis), instead
//! of an `EVALSHA`. The waiters' `PUBLISH` is a second command in the same pipeline, sent
//! only when a waiter can exist.
//!
//! The scripts compare the owner token inside the marker; a native command compares the
//! whole value, so the lease remembers the marker it wrote and each renewal's deadline
//! ([`Written`](crate::store::Written)). The key holding anything else is not proof that
//! the lease is lost: a renewal whose answer never came may have moved the deadline. So
//! when nothing was set, the value found is read back (a `GET` after the `SET`, whose
//! answer is only `OK` or nothing on the path every first execution takes; pipelined
//! behind a delete), and when it is a marker with this lease's token, the command is
//! sent again against exactly that value. Any other value fences the caller out, as the
//! scripts do.
//!
//! A server that refuses the native command (a node of a cluster still on an older
//! version, a command renamed or denied) gets the script instead, in the same call; the
//! refusal is remembered for its slot (a cluster) or for the server, until the next
//! disconnection. In a cluster whose masters differ, only the complete's `SET ... IFEQ`
//! is tried on a slot not yet known: an older node refuses it with a plain `ERR syntax
//! error`, whereas its refusal of an unknown command (`DELIFEQ`) quotes the arguments,
//! the binary marker among them, which the client cannot read as an error line. The
//! release is native on a slot once a complete there was.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, Value};

use super::version::{Delete, Fencing};
use super::{Conn, RedisStore, eval, unavailable};
use crate::idempotency::{InFlight, OwnerToken, Record};
use crate::store::{Fenced, StoreError};

/// A marker changed under us by a renewal whose answer was lost is looked at again, at
/// most this many times (each look is a round trip, and needs another lost renewal).
const RETRIES: usize = 2;

/// What a native attempt found.
pub(super) enum Native {
    Done(Fenced),
    /// The server refused the command, or it does not fit the case: use the script.
    Refused,
}

/// What a `SET ... IFEQ` did.
enum Swap {
    /// The key held the expected value, and holds the new one.
    Swapped,
    /// The key held something else, or nothing: what it holds now.
    Kept(Value),
}

/// What each slot's node (or, off a cluster, slot 0 for the server) was found to do
/// with a native command in the current epoch: nothing known, refused, or took it.
/// Each entry is `(epoch + 1) << 1 | took`, 0 meaning nothing known.
#[derive(Debug, Default)]
pub(super) struct Slots(OnceLock<Box<[AtomicU64]>>);

const SLOTS: usize = 16384;

/// A slot's node, as far as this epoch knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Nothing,
    Refused,
    Took,
}

impl Slots {
    fn known(&self, slot: u16, epoch: u64) -> Known {
        let Some(entry) = self
            .0
            .get()
            .map(|slots| slots[usize::from(slot)].load(Ordering::Relaxed))
        else {
            return Known::Nothing;
        };
        match (entry >> 1 == epoch + 1, entry & 1) {
            (false, _) => Known::Nothing,
            (true, 0) => Known::Refused,
            (true, _) => Known::Took,
        }
    }

    fn remember(&self, slot: u16, epoch: u64, took: bool) {
        let slots = self
            .0
            .get_or_init(|| (0..SLOTS).map(|_| AtomicU64::new(0)).collect());
        slots[usize::from(slot)].store((epoch + 1) << 1 | u64::from(took), Ordering::Relaxed);
    }
}

/// `CLUSTER KEYSLOT` of `key`: CRC16 (XMODEM) of its `{hash tag}` when it has a
/// non-empty one, else of the whole key, modulo 16384. Every record key is `key_prefix`
/// + 64 hex characters, so only a prefix holding `{...}` tags it.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

/// A refusal of the command itself, as opposed to a failure to run it: an older server
/// (`ERR syntax error` for `SET ... IFEQ`, `ERR unknown command` for `DELIFEQ`), or one
/// whose ACL denies it.
fn refused(err: &redis::RedisError) -> bool {
    let refusal = |code: &str, detail: Option<&str>| {
        code == "NOPERM"
            || (code == "ERR"
                && detail.is_some_and(|d| {
                    let d = d.to_ascii_lowercase();
                    d.contains("syntax error") || d.contains("unknown command")
                }))
    };
    if refusal(err.code().unwrap_or_default(), err.detail()) {
        return true;
    }
    err.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, e)| refusal(e.code(), e.details())))
}

/// Whether `found` is a marker of `token`'s: this lease's, whatever its deadline.
fn ours(found: &[u8], token: OwnerToken) -> bool {
    matches!(
        Record::decode(Bytes::copy_from_slice(found)),
        Ok(Record::InFlight(marker)) if marker.token == token
    )
}

impl RedisStore {
    /// Whether the native complete is to be tried on `key` now.
    pub(super) fn native_set(&self, fencing: Fencing, key: &[u8]) -> bool {
        fencing.set && self.known(key) != Known::Refused
    }

    /// Whether the native release is to be tried on `key` now: in a mixed cluster only
    /// where a native complete went through.
    pub(super) fn native_delete(&self, fencing: Fencing, key: &[u8]) -> bool {
        fencing.delete != Delete::Script
            && match self.known(key) {
                Known::Took => true,
                Known::Refused => false,
                Known::Nothing => !fencing.mixed,
            }
    }

    fn known(&self, key: &[u8]) -> Known {
        self.slots.known(self.slot_of(key), self.claim_mode.epoch())
    }

    fn slot_of(&self, key: &[u8]) -> u16 {
        if self.cluster { key_slot(key) } else { 0 }
    }

    /// A node refused: its slot (or the server) uses the scripts until a disconnection.
    fn refused_on(&self, key: &[u8]) {
        tracing::warn!(
            "the server refused a native fenced command (SET ... IFEQ, DELIFEQ or DELEX): fencing with scripts there"
        );
        if self.cluster {
            self.slots
                .remember(self.slot_of(key), self.claim_mode.epoch(), false);
        } else {
            self.claim_mode.fence_with_scripts();
        }
    }

    /// A node took a native command: in a mixed cluster, its slot's release may be too.
    fn took_on(&self, key: &[u8], fencing_mixed: bool) {
        if fencing_mixed {
            self.slots
                .remember(self.slot_of(key), self.claim_mode.epoch(), true);
        }
    }

    /// `SET key value IFEQ expected PX ttl`, then `PUBLISH` when a waiter can exist:
    /// whether it swapped, and when it did not, what the key holds (a `GET` of its own,
    /// a round trip only on that rare path: an answer of `OK` is smaller than the old
    /// value `GET` would return, for the server to send and the client to read).
    /// `None` when the server refused the command (then remembered, so that the scripts
    /// fence there).
    async fn set_if_equal(
        &self,
        conn: &mut Conn,
        (key, mixed): (&str, bool),
        (value, expected, ttl_ms): (&[u8], &[u8], u64),
        channel: &str,
    ) -> Result<Option<Swap>, StoreError> {
        let mut set = Cmd::with_capacity(8, 20 + key.len() + value.len() + expected.len());
        set.arg("SET")
            .arg(key)
            .arg(value)
            .arg("IFEQ")
            .arg(expected)
            .arg("PX")
            .arg(ttl_ms);
        match self.with_publish(conn, key, (set, None), channel).await {
            Ok((Value::Okay, _)) => {
                self.took_on(key.as_bytes(), mixed);
                Ok(Some(Swap::Swapped))
            }
            Ok((Value::Nil, _)) => {
                self.took_on(key.as_bytes(), mixed);
                let found = redis::cmd("GET")
                    .arg(key)
                    .query_async::<Value>(conn)
                    .await
                    .map_err(unavailable)?;
                Ok(Some(Swap::Kept(found)))
            }
            Ok(_) => Err(StoreError::Protocol("unexpected reply to SET ... IFEQ")),
            Err(err) if refused(&err) => {
                self.refused_on(key.as_bytes());
                Ok(None)
            }
            Err(err) => Err(unavailable(err)),
        }
    }

    /// The complete: `SET key record IFEQ marker PX ttl`, then `PUBLISH` when a waiter
    /// can exist.
    pub(super) async fn complete_natively(
        &self,
        conn: &mut Conn,
        (key, mixed): (&str, bool),
        (mut expected, token): (Bytes, OwnerToken),
        (record, ttl_ms, channel): (&[u8], u64, &str),
    ) -> Result<Native, StoreError> {
        for _ in 0..=RETRIES {
            let set = (record, &expected[..], ttl_ms);
            let found = match self.set_if_equal(conn, (key, mixed), set, channel).await? {
                None => return Ok(Native::Refused),
                Some(Swap::Swapped) => return Ok(Native::Done(Fenced::Done)),
                Some(Swap::Kept(found)) => found,
            };
            match found {
                // A retry after a completion whose answer was lost: it landed.
                Value::BulkString(found) if found == record => {
                    return Ok(Native::Done(Fenced::Done));
                }
                Value::BulkString(found) if ours(&found, token) => {
                    expected = Bytes::from(found);
                }
                Value::BulkString(_) | Value::Nil => return Ok(Native::Done(Fenced::LeaseLost)),
                _ => return Err(StoreError::Protocol("unexpected reply to SET ... IFEQ")),
            }
        }
        Ok(Native::Done(Fenced::LeaseLost))
    }

    /// The take-over: `SET key new IFEQ stale PX ttl`, then `PUBLISH` when a waiter
    /// can exist. `stale` is the marker the caller read and judged: its lease ended by
    /// `now_ms`. A marker of the same owner whose bytes differ (re-encoded otherwise, or
    /// renewed meanwhile) is taken over only if its lease ended too, as the script does.
    pub(super) async fn take_over_natively(
        &self,
        conn: &mut Conn,
        (key, mixed): (&str, bool),
        stale: &InFlight,
        (marker, ttl_ms, channel): (&[u8], u64, &str),
        now_ms: u64,
    ) -> Result<Native, StoreError> {
        if stale.lease_deadline_ms > now_ms {
            // Not the caller's judgement (the proxy takes over only an ended lease): the
            // script judges the marker that is there.
            return Ok(Native::Refused);
        }
        let mut expected = stale.encode();
        for _ in 0..=RETRIES {
            let set = (marker, &expected[..], ttl_ms);
            let found = match self.set_if_equal(conn, (key, mixed), set, channel).await? {
                None => return Ok(Native::Refused),
                Some(Swap::Swapped) => return Ok(Native::Done(Fenced::Done)),
                Some(Swap::Kept(found)) => found,
            };
            let found = match found {
                Value::BulkString(found) => found,
                Value::Nil => return Ok(Native::Done(Fenced::LeaseLost)),
                _ => return Err(StoreError::Protocol("unexpected reply to SET ... IFEQ")),
            };
            match Record::decode(Bytes::copy_from_slice(&found)) {
                Ok(Record::InFlight(now))
                    if now.token == stale.token && now.lease_deadline_ms <= now_ms =>
                {
                    expected = Bytes::from(found);
                }
                _ => return Ok(Native::Done(Fenced::LeaseLost)),
            }
        }
        Ok(Native::Done(Fenced::LeaseLost))
    }

    /// The release: `DELIFEQ key marker` or `DELEX key IFEQ marker`, with a `GET` behind
    /// it (what is there when nothing was deleted), then `PUBLISH` when a waiter can
    /// exist.
    pub(super) async fn release_natively(
        &self,
        conn: &mut Conn,
        delete: Delete,
        key: &str,
        (mut expected, token): (Bytes, OwnerToken),
        channel: &str,
    ) -> Result<Native, StoreError> {
        for _ in 0..=RETRIES {
            let mut del = Cmd::with_capacity(4, 16 + key.len() + expected.len());
            match delete {
                Delete::DelIfEq => del.arg("DELIFEQ").arg(key).arg(&expected[..]),
                Delete::DelEx => del.arg("DELEX").arg(key).arg("IFEQ").arg(&expected[..]),
                Delete::Script => return Ok(Native::Refused),
            };
            let mut get = Cmd::with_capacity(2, 4 + key.len());
            get.arg("GET").arg(key);
            let replies = self.with_publish(conn, key, (del, Some(get)), channel);
            let (deleted, found) = match replies.await {
                Ok(replies) => replies,
                Err(err) if refused(&err) => {
                    self.refused_on(key.as_bytes());
                    return Ok(Native::Refused);
                }
                Err(err) => return Err(unavailable(err)),
            };
            match (deleted, found) {
                (Value::Int(1), _) => return Ok(Native::Done(Fenced::Done)),
                (Value::Int(0), Value::BulkString(found)) if ours(&found, token) => {
                    expected = Bytes::from(found);
                }
                (Value::Int(0), _) => return Ok(Native::Done(Fenced::LeaseLost)),
                _ => return Err(StoreError::Protocol("unexpected reply to a fenced delete")),
            }
        }
        Ok(Native::Done(Fenced::LeaseLost))
    }

    /// `first` (and `then`) in one pipeline, with `PUBLISH channel 1` last when
    /// `channel` is not empty. Returns the replies of `first` and `then` (`Nil` without
    /// it). On a cluster the pipeline goes to the master of `key`'s slot: redis-rs would
    /// route the `PUBLISH` by its channel, another slot, and a node takes a `PUBLISH`
    /// whatever the channel (the cluster bus carries it to the others), as the scripts'.
    async fn with_publish(
        &self,
        conn: &mut Conn,
        key: &str,
        (first, then): (Cmd, Option<Cmd>),
        channel: &str,
    ) -> redis::RedisResult<(Value, Value)> {
        if then.is_none() && channel.is_empty() {
            // One command alone, as a first execution's complete is where nobody waits:
            // not a pipeline (its command list, its list of replies). A cluster routes
            // it by its key.
            let reply = first.query_async::<Value>(conn).await?;
            return Ok((reply.extract_error()?, Value::Nil));
        }
        let mut pipe = Pipeline::with_capacity(3);
        pipe.add_command(first);
        let then_sent = then.is_some();
        if let Some(then) = then {
            pipe.add_command(then);
        }
        if !channel.is_empty() {
            let mut publish = Cmd::with_capacity(3, 8 + channel.len() + 1);
            publish.arg("PUBLISH").arg(channel).arg(1);
            pipe.add_command(publish);
        }
        let count = pipe.len();
        let replies = match conn {
            Conn::Cluster(cluster) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(
                    key_slot(key.as_bytes()),
                    SlotAddr::Master,
                ));
                cluster.route_pipeline(pipe, 0, count, route).await?
            }
            conn => pipe.query_async::<Vec<Value>>(conn).await?,
        };
        let mut replies = replies.into_iter().map(Value::extract_error);
        let first = replies.next().transpose()?.unwrap_or(Value::Nil);
        let second = if then_sent {
            replies.next().transpose()?.unwrap_or(Value::Nil)
        } else {
            Value::Nil
        };
        // The PUBLISH's answer (how many heard it) is not needed, but its error is.
        for reply in replies {
            reply?;
        }
        Ok((first, second))
    }

    /// The owner-checked script, as on a server without native fencing.
    pub(super) async fn fenced_by_script(
        &self,
        conn: &mut Conn,
        script: &redis::Script,
        key: &str,
        args: &[&[u8]],
    ) -> Result<Fenced, StoreError> {
        let done: i64 = eval(conn, script, key.as_bytes(), args)
            .await
            .map_err(unavailable)?;
        Ok(if done == 1 {
            Fenced::Done
        } else {
            Fenced::LeaseLost
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_cluster_keyslots() {
        // Each answered by a redis-server 7.0 in cluster mode, `CLUSTER KEYSLOT`.
        for (key, slot) in [
            (&b"foo"[..], 12182),
            (b"bar", 5061),
            (b"{user1000}.following", 3443),
            (b"foo{}{bar}", 8363),
            (b"foo{{bar}}zap", 4015),
            (b"foo{bar}{zap}", 5061),
            (b"", 0),
        ] {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn only_a_refusal_of_the_command_falls_back_to_the_script() {
        let server = |code: &str, detail: &str| {
            redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
        };
        assert!(refused(&server("ERR", "syntax error")));
        assert!(refused(&server(
            "ERR",
            "unknown command 'DELIFEQ', with args beginning with: 'k'"
        )));
        assert!(refused(&server("NOPERM", "this user has no permissions")));
        assert!(!refused(&server("OOM", "command not allowed")));
        assert!(!refused(&server(
            "READONLY",
            "You can't write against a replica"
        )));
        assert!(!refused(&server("ERR", "value is not an integer")));
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!refused(&redis::RedisError::from(io)));
    }

    #[test]
    fn what_a_slot_did_holds_for_that_slot_and_epoch_only() {
        let slots = Slots::default();
        assert_eq!(slots.known(7, 0), Known::Nothing);
        slots.remember(7, 3, false);
        assert_eq!(slots.known(7, 3), Known::Refused);
        assert_eq!(slots.known(8, 3), Known::Nothing);
        assert_eq!(
            slots.known(7, 4),
            Known::Nothing,
            "forgotten by a disconnection"
        );
        slots.remember(9, 4, true);
        assert_eq!(slots.known(9, 4), Known::Took);
        assert_eq!(slots.known(9, 5), Known::Nothing);
    }
}
