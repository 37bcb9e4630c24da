//! Which claim the Redis servers take. `SET key marker NX PX ttl GET` needs Redis 7.0
//! (before it, `NX` with `GET` is refused); older servers get an equivalent script. The
//! choice is made from the `redis_version` that `INFO server` reports, asked on first use
//! and again after every disconnection, since the server on the other end of a new
//! connection may be another one. On a cluster, `INFO` reaches every master, and the
//! native claim is chosen only when every one of them reports 7.0 or later.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::{ErrorKind, ServerErrorKind, Value};

use super::{Conn, RedisStore, unavailable};
use crate::store::StoreError;

/// How a claim is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClaimWith {
    /// One native `SET ... NX PX ... GET` (Redis 7.0+).
    Native,
    /// The claim script: any version, and what a server of unknown version gets.
    Script,
}

/// The first version that takes `SET` with both `NX` and `GET`.
const NATIVE_SINCE: Version = Version { major: 7, minor: 0 };

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Version {
    major: u32,
    minor: u32,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The `redis_version` line of an `INFO` text (Valkey reports one too), major and minor.
pub(super) fn redis_version(info: &str) -> Option<Version> {
    let value = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))?;
    let mut parts = value.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        Some(minor) => minor.parse().ok()?,
        None => 0,
    };
    Some(Version { major, minor })
}

/// The version of each server that answered `INFO server`: one for a single server, one
/// per master for a cluster (whose answer maps node to reply). `None` for a server whose
/// reply was an error or had no readable version.
pub(super) fn versions(reply: &Value) -> Vec<Option<Version>> {
    let text = |v: &Value| match v {
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Map(nodes) => nodes
            .iter()
            .map(|(_, reply)| text(reply).as_deref().and_then(redis_version))
            .collect(),
        reply => vec![text(reply).as_deref().and_then(redis_version)],
    }
}

impl ClaimWith {
    /// Native only when there is a version for every server and each is 7.0 or later.
    pub(super) fn for_versions(versions: &[Option<Version>]) -> Self {
        let all_native = !versions.is_empty()
            && versions
                .iter()
                .all(|v| v.is_some_and(|v| v >= NATIVE_SINCE));
        if all_native {
            ClaimWith::Native
        } else {
            ClaimWith::Script
        }
    }
}

/// The claim learnt so far, in one atomic word: an epoch, bumped by every disconnection,
/// and the choice made in it (none yet, native, script). A choice learnt from a server
/// that was left meanwhile is not kept.
#[derive(Debug, Default)]
pub(super) struct ClaimMode(AtomicU64);

const UNKNOWN: u64 = 0;
const NATIVE: u64 = 1;
const SCRIPT: u64 = 2;

/// The epoch a lookup happened in, to hand back to [`ClaimMode::learn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Epoch(u64);

impl ClaimMode {
    /// The choice made in the current epoch, if any.
    pub(super) fn get(&self) -> Result<ClaimWith, Epoch> {
        let word = self.0.load(Ordering::Acquire);
        match word & 3 {
            NATIVE => Ok(ClaimWith::Native),
            SCRIPT => Ok(ClaimWith::Script),
            _ => Err(Epoch(word >> 2)),
        }
    }

    /// Keeps `with` unless a disconnection happened since `epoch`, or someone else already
    /// chose in it. Returns whether it was kept.
    pub(super) fn learn(&self, epoch: Epoch, with: ClaimWith) -> bool {
        let mode = match with {
            ClaimWith::Native => NATIVE,
            ClaimWith::Script => SCRIPT,
        };
        let unknown = epoch.0 << 2 | UNKNOWN;
        self.0
            .compare_exchange(
                unknown,
                epoch.0 << 2 | mode,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Bumped by every disconnection (and Sentinel switch): a write and a later `WAIT`
    /// in one epoch went over one connection (`replicas.rs`).
    pub(super) fn epoch(&self) -> u64 {
        self.0.load(Ordering::Acquire) >> 2
    }

    /// The connection was lost: the next claim asks the server again.
    pub(super) fn forget(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                Some(((word >> 2).wrapping_add(1) << 2) | UNKNOWN)
            });
    }
}

impl RedisStore {
    /// Which claim the servers take: asked (`INFO server`) on first use and after a
    /// disconnection, one claim at a time; the others wait for its answer.
    pub(super) async fn claim_with(&self, conn: &mut Conn) -> Result<ClaimWith, StoreError> {
        if let Ok(with) = self.claim_mode.get() {
            return Ok(with);
        }
        let _asking = self.asking.lock().await;
        let epoch = match self.claim_mode.get() {
            Ok(with) => return Ok(with),
            Err(epoch) => epoch,
        };
        let reply = redis::cmd("INFO")
            .arg("server")
            .query_async::<Value>(conn)
            .await;
        let with = match reply {
            Ok(reply) => {
                let versions = versions(&reply);
                let with = ClaimWith::for_versions(&versions);
                let shown: Vec<String> = versions
                    .iter()
                    .map(|v| v.map_or_else(|| "unknown".to_owned(), |v| v.to_string()))
                    .collect();
                match with {
                    ClaimWith::Native => {
                        tracing::debug!(versions = ?shown, "Redis 7.0 or later: native claim");
                    }
                    ClaimWith::Script => tracing::warn!(
                        versions = ?shown,
                        "Redis reports a version before 7.0, or none readable: claiming with a script, as SET with NX and GET needs 7.0"
                    ),
                }
                with
            }
            Err(err) if refused(&err) => {
                tracing::warn!(
                    error = %err,
                    "Redis does not tell its version (INFO refused): claiming with a script"
                );
                ClaimWith::Script
            }
            Err(err) => return Err(unavailable(err)),
        };
        self.claim_mode.learn(epoch, with);
        Ok(with)
    }
}

/// The server refuses to say its version (`INFO` denied by an ACL, or renamed away),
/// as opposed to not answering at all.
fn refused(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::ResponseError)
            | ErrorKind::Extension
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> Option<Version> {
        Some(Version { major, minor })
    }

    fn verbatim(text: &str) -> Value {
        Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: text.to_owned(),
        }
    }

    #[test]
    fn reads_redis_version_from_info_text() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(redis_version(info), v(7, 0));
        assert_eq!(redis_version("redis_version:6.2.14\n"), v(6, 2));
        assert_eq!(redis_version("redis_version:7.2.4\r\n"), v(7, 2));
        assert_eq!(redis_version("redis_version:255.255.255"), v(255, 255));
        assert_eq!(redis_version("redis_version:8"), v(8, 0));
        // Valkey keeps a compatible redis_version next to its own.
        let valkey = "server_name:valkey\r\nredis_version:7.2.4\r\nvalkey_version:8.0.1\r\n";
        assert_eq!(redis_version(valkey), v(7, 2));
        for unreadable in [
            "",
            "# Server\r\nredis_mode:standalone\r\n",
            "redis_version:",
            "redis_version:seven",
            "redis_version:7.x",
            "redis_git_sha1:7.0.0",
        ] {
            assert_eq!(redis_version(unreadable), None, "{unreadable:?}");
        }
    }

    #[test]
    fn reads_one_version_per_server_in_both_protocols_and_on_a_cluster() {
        assert_eq!(versions(&verbatim("redis_version:7.0.11\r\n")), [v(7, 0)]);
        assert_eq!(
            versions(&Value::BulkString(b"redis_version:6.2.6\r\n".to_vec())),
            [v(6, 2)]
        );
        let node = |addr: &str| Value::BulkString(addr.as_bytes().to_vec());
        let cluster = Value::Map(vec![
            (node("127.0.0.1:7000"), verbatim("redis_version:7.0.11\r\n")),
            (node("127.0.0.1:7001"), verbatim("redis_version:6.2.6\r\n")),
            (node("127.0.0.1:7002"), Value::Nil),
        ]);
        assert_eq!(versions(&cluster), [v(7, 0), v(6, 2), None]);
        assert_eq!(versions(&Value::Int(7)), [None]);
    }

    #[test]
    fn the_native_claim_needs_every_server_at_7_0_or_later() {
        use ClaimWith::{Native, Script};
        assert_eq!(ClaimWith::for_versions(&[v(7, 0)]), Native);
        assert_eq!(ClaimWith::for_versions(&[v(8, 2)]), Native);
        assert_eq!(ClaimWith::for_versions(&[v(6, 2)]), Script);
        assert_eq!(ClaimWith::for_versions(&[v(6, 255)]), Script);
        assert_eq!(ClaimWith::for_versions(&[None]), Script);
        assert_eq!(ClaimWith::for_versions(&[]), Script);
        assert_eq!(
            ClaimWith::for_versions(&[v(7, 0), v(7, 2), v(7, 0)]),
            Native
        );
        assert_eq!(
            ClaimWith::for_versions(&[v(7, 0), v(6, 2), v(7, 0)]),
            Script
        );
        assert_eq!(ClaimWith::for_versions(&[v(7, 0), None, v(7, 0)]), Script);
    }

    #[test]
    fn a_choice_is_kept_until_a_disconnection_and_only_in_its_epoch() {
        let mode = ClaimMode::default();
        let first = mode.get().expect_err("nothing learnt yet");
        assert!(mode.learn(first, ClaimWith::Native));
        assert_eq!(mode.get(), Ok(ClaimWith::Native));
        assert!(!mode.learn(first, ClaimWith::Script), "already chosen");
        assert_eq!(mode.get(), Ok(ClaimWith::Native));

        mode.forget();
        let second = mode.get().expect_err("forgotten");
        assert_ne!(first, second);
        // A lookup that started before the disconnection asked the old server.
        assert!(!mode.learn(first, ClaimWith::Native));
        assert!(mode.get().is_err());
        assert!(mode.learn(second, ClaimWith::Script));
        assert_eq!(mode.get(), Ok(ClaimWith::Script));
    }
}
