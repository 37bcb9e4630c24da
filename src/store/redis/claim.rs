//! The claim: write the in-flight marker if the key is free, else return what is there,
//! in one round trip (docs/behaviour.md §4, §5).
//!
//! Redis 7.0+ takes `SET key marker NX PX ttl GET`, which answers what was there, and
//! nothing when it wrote. But nothing is also what redis-rs makes of replies it cannot
//! read: a negative length other than -1 (`$-5`, `*-3`) and a RESP3 null with content
//! (`_x`) all come back as `Value::Nil`, as they do from hiredis. A claim taken on
//! nothing forwards the request, so a server (or a proxy in front of it) answering such
//! bytes would have every retry execute. A claim is therefore acquired only on proof:
//! the native `SET` is pipelined, in the same round trip, with a `GETRANGE` of the key's
//! first bytes, which must be the marker just written (it holds this claim's random
//! token); the script (Redis before 7.0) answers what the key holds once it ran, which
//! is the marker when it wrote it. Any other answer is a store error.
//!
//! A full Redis (`maxmemory` with `noeviction`) refuses the write with `OOM` whatever
//! the key holds, but still answers reads: the key is then read (docs/behaviour.md §15).

use redis::{Cmd, Pipeline, Value};

use super::version::ClaimWith;
use super::{Conn, RedisStore, unavailable};
use crate::store::StoreError;

/// What a claim found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// The key was free: the marker is written.
    Ours,
    /// Another record is there (encoded); nothing was written.
    Record(Vec<u8>),
}

impl RedisStore {
    /// Writes `marker` under `key`, kept `ttl_ms`, unless the key holds something.
    pub(super) async fn write_claim(
        &self,
        conn: &mut Conn,
        with: ClaimWith,
        key: &str,
        marker: &[u8],
        ttl_ms: u64,
    ) -> Result<Found, StoreError> {
        let written = match with {
            ClaimWith::Native => {
                // Sized up front: grown argument by argument, each command reallocates
                // its buffers a few times (BENCHMARKS.md, issue 29).
                let mut set = Cmd::with_capacity(7, 16 + key.len() + marker.len() + 20);
                set.arg("SET")
                    .arg(key)
                    .arg(marker)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .arg("GET");
                let mut range = Cmd::with_capacity(4, 8 + key.len() + 21);
                range
                    .arg("GETRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(marker.len().saturating_sub(1));
                let mut pipe = Pipeline::with_capacity(2);
                pipe.add_command(set).add_command(range);
                pipe.query_async::<(Value, Value)>(conn)
                    .await
                    .map(|(before, after)| native_reply(before, after, marker))
            }
            ClaimWith::Script => self
                .scripts
                .claim
                .key(key)
                .arg(marker)
                .arg(ttl_ms)
                .invoke_async::<Value>(conn)
                .await
                .map(|after| script_reply(after, marker)),
        };
        match written {
            Ok(found) => found,
            Err(refused) if out_of_memory(&refused) => read_when_full(conn, key, refused).await,
            Err(err) => Err(unavailable(err)),
        }
    }
}

/// The native claim's answers: `before` from `SET ... NX GET` (what was there; nothing
/// when it wrote), `after` from the `GETRANGE` behind it (the key's first bytes now).
fn native_reply(before: Value, after: Value, marker: &[u8]) -> Result<Found, StoreError> {
    match before {
        Value::BulkString(record) => Ok(Found::Record(record)),
        Value::Nil => match after {
            Value::BulkString(now) if now == marker => Ok(Found::Ours),
            // Changed within the round trip (purged, or taken over by a replica whose
            // clock is a lease ahead), or a server that did not keep what it said it
            // wrote: either way this request does not own the key.
            Value::BulkString(_) => Err(StoreError::Protocol(
                "the claimed key does not hold the marker just written",
            )),
            _ => Err(StoreError::Protocol(
                "unexpected reply to the claim's check",
            )),
        },
        _ => Err(StoreError::Protocol("unexpected claim reply")),
    }
}

/// The claim script's answer: what the key holds once it ran.
fn script_reply(after: Value, marker: &[u8]) -> Result<Found, StoreError> {
    match after {
        Value::BulkString(now) if now == marker => Ok(Found::Ours),
        Value::BulkString(record) => Ok(Found::Record(record)),
        _ => Err(StoreError::Protocol("unexpected claim reply")),
    }
}

/// Redis refused a write because it is at `maxmemory` and may not evict: the error of a
/// command or a script, or of one command of a pipeline.
fn out_of_memory(err: &redis::RedisError) -> bool {
    err.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, error)| error.code() == "OOM"))
}

/// What a key holds when a full Redis refused its claim (docs/behaviour.md §15). A
/// record there is returned, so that a completed key is replayed (or refused as in flight
/// or reused) instead of following `on_unavailable`, which under `pass_through` would
/// execute it again. Nothing there: the refusal stands, and a new key follows
/// `on_unavailable`.
async fn read_when_full(
    conn: &mut Conn,
    key: &str,
    refused: redis::RedisError,
) -> Result<Found, StoreError> {
    let stored: Value = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(unavailable)?;
    match stored {
        Value::BulkString(record) => Ok(Found::Record(record)),
        _ => Err(unavailable(refused)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKER: &[u8] = b"marker with this claim's token";

    fn bulk(bytes: &[u8]) -> Value {
        Value::BulkString(bytes.to_vec())
    }

    #[test]
    fn a_native_claim_is_ours_only_when_the_key_holds_its_marker() {
        assert_eq!(
            native_reply(Value::Nil, bulk(MARKER), MARKER).ok(),
            Some(Found::Ours)
        );
        // What redis-rs makes of `$-5`, `*-3` and `_x` is `Nil`, whichever reply it is.
        for after in [
            Value::Nil,
            bulk(b""),
            bulk(b"another claim's marker"),
            Value::Int(1),
            Value::Okay,
        ] {
            assert!(
                native_reply(Value::Nil, after.clone(), MARKER).is_err(),
                "{after:?}"
            );
        }
    }

    #[test]
    fn a_native_claim_that_found_a_record_returns_it() {
        assert_eq!(
            native_reply(bulk(b"record"), bulk(b"rec"), MARKER).ok(),
            Some(Found::Record(b"record".to_vec()))
        );
        for before in [Value::Int(0), Value::Okay, Value::Array(Vec::new())] {
            assert!(
                native_reply(before.clone(), bulk(MARKER), MARKER).is_err(),
                "{before:?}"
            );
        }
    }

    #[test]
    fn only_an_oom_refusal_is_out_of_memory() {
        let server = |code: &str| redis::make_extension_error(code.to_owned(), None);
        assert!(out_of_memory(&server("OOM")));
        assert!(!out_of_memory(&server("READONLY")));
        assert!(!out_of_memory(&server("ERR")));
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!out_of_memory(&redis::RedisError::from(io)));
    }

    #[test]
    fn a_script_claim_is_ours_only_when_it_answers_its_marker() {
        assert_eq!(script_reply(bulk(MARKER), MARKER).ok(), Some(Found::Ours));
        assert_eq!(
            script_reply(bulk(b"record"), MARKER).ok(),
            Some(Found::Record(b"record".to_vec()))
        );
        for after in [Value::Nil, Value::Int(1), Value::Okay] {
            assert!(script_reply(after.clone(), MARKER).is_err(), "{after:?}");
        }
    }
}
