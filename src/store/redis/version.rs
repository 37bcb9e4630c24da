//! Which claim the Redis servers take. `SET key marker NX PX ttl GET` needs Redis 7.0
//! (before it, `NX` with `GET` is refused); older servers get an equivalent script. The
//! choice is made from the `redis_version` that `INFO server` reports, asked on first use
//! and again after every disconnection, since the server on the other end of a new
//! connection may be another one. On a cluster, `INFO` reaches every master, and the
//! native claim is chosen only when every one of them reports 7.0 or later.
//!
//! The same answer tells how a lease is fenced (docs/behaviour.md §23): with a native
//! compare-and-set (`SET ... IFEQ`, Valkey 8.1 and Redis 8.4; `DELIFEQ`, Valkey 9;
//! `DELEX ... IFEQ`, Redis 8.4) or with the scripts. A cluster whose masters differ (a
//! rolling upgrade) is fenced natively where a node takes it: `fence.rs` falls back to
//! the script, and remembers it for the slot, when a node refuses the native command.

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
    version_line(info, "redis_version:")
}

/// The `valkey_version` line, which only Valkey reports (its `redis_version` stays 7.2.4).
pub(super) fn valkey_version(info: &str) -> Option<Version> {
    version_line(info, "valkey_version:")
}

fn version_line(info: &str, name: &str) -> Option<Version> {
    let value = info
        .lines()
        .find_map(|line| line.trim().strip_prefix(name))?;
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
    infos(reply)
        .iter()
        .map(|info| info.as_deref().and_then(redis_version))
        .collect()
}

/// How each server that answered `INFO server` fences a lease.
pub(super) fn fencings(reply: &Value) -> Vec<Fencing> {
    infos(reply)
        .iter()
        .map(|info| info.as_deref().map_or(Fencing::SCRIPTS, Fencing::of_server))
        .collect()
}

/// The `INFO` text of each server in the reply.
fn infos(reply: &Value) -> Vec<Option<String>> {
    let text = |v: &Value| match v {
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Map(nodes) => nodes.iter().map(|(_, reply)| text(reply)).collect(),
        reply => vec![text(reply)],
    }
}

/// How a fenced delete (the release) is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delete {
    /// The release script.
    Script,
    /// `DELIFEQ key marker` (Valkey 9.0+).
    DelIfEq,
    /// `DELEX key IFEQ marker` (Redis 8.4+).
    DelEx,
}

/// How the servers fence a lease (docs/behaviour.md §23).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fencing {
    /// The complete is `SET key record IFEQ marker PX ttl` (Valkey 8.1+, Redis 8.4+).
    pub(super) set: bool,
    pub(super) delete: Delete,
    /// The servers differ (a cluster in a rolling upgrade): a node may refuse the
    /// native commands, and its slots then use the scripts.
    pub(super) mixed: bool,
}

const VALKEY_SET_SINCE: Version = Version { major: 8, minor: 1 };
const VALKEY_DELETE_SINCE: Version = Version { major: 9, minor: 0 };
const REDIS_NATIVE_SINCE: Version = Version { major: 8, minor: 4 };

impl Fencing {
    pub(super) const SCRIPTS: Fencing = Fencing {
        set: false,
        delete: Delete::Script,
        mixed: false,
    };

    /// What one server takes, from its `INFO server` text.
    pub(super) fn of_server(info: &str) -> Self {
        let (set, delete) = match (valkey_version(info), redis_version(info)) {
            (Some(valkey), _) if valkey >= VALKEY_DELETE_SINCE => (true, Delete::DelIfEq),
            (Some(valkey), _) => (valkey >= VALKEY_SET_SINCE, Delete::Script),
            (None, Some(redis)) if redis >= REDIS_NATIVE_SINCE => (true, Delete::DelEx),
            (None, _) => (false, Delete::Script),
        };
        Fencing {
            set,
            delete,
            mixed: false,
        }
    }

    /// The fleet's: what every server takes, or, when they differ, the native complete
    /// if any of them takes it, marked mixed. A mixed fleet's release is native only when
    /// every server that takes the native complete takes the same native delete: a slot
    /// whose node took the complete then takes the release too (`fence.rs`).
    pub(super) fn for_servers(servers: &[Fencing]) -> Self {
        let Some(first) = servers.first() else {
            return Self::SCRIPTS;
        };
        if servers.iter().all(|f| f == first) {
            return *first;
        }
        let mut setters = servers.iter().filter(|f| f.set);
        let delete = match setters.next() {
            Some(one) if setters.all(|f| f.delete == one.delete) => one.delete,
            _ => Delete::Script,
        };
        Fencing {
            set: servers.iter().any(|f| f.set),
            delete,
            mixed: true,
        }
    }

    /// Four bits, for [`ClaimMode`]'s word.
    fn bits(self) -> u64 {
        let delete = match self.delete {
            Delete::Script => 0,
            Delete::DelIfEq => 1,
            Delete::DelEx => 2,
        };
        u64::from(self.set) | delete << 1 | u64::from(self.mixed) << 3
    }

    fn from_bits(bits: u64) -> Self {
        Fencing {
            set: bits & 1 != 0,
            delete: match (bits >> 1) & 3 {
                1 => Delete::DelIfEq,
                2 => Delete::DelEx,
                _ => Delete::Script,
            },
            mixed: bits & 8 != 0,
        }
    }
}

/// What the servers were found to take: the claim, and the fencing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mode {
    pub(super) claim: ClaimWith,
    pub(super) fencing: Fencing,
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

/// The claim and fencing learnt so far, in one atomic word: an epoch, bumped by every
/// disconnection, and the choices made in it (claim: none yet, native, script; the
/// fencing's four bits). A choice learnt from a server that was left meanwhile is not
/// kept.
#[derive(Debug, Default)]
pub(super) struct ClaimMode(AtomicU64);

const UNKNOWN: u64 = 0;
const NATIVE: u64 = 1;
const SCRIPT: u64 = 2;
/// Below the epoch: the claim's two bits, the fencing's four.
const EPOCH_SHIFT: u32 = 8;

/// The epoch a lookup happened in, to hand back to [`ClaimMode::learn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Epoch(u64);

impl ClaimMode {
    /// The choices made in the current epoch, if any.
    pub(super) fn get(&self) -> Result<Mode, Epoch> {
        let word = self.0.load(Ordering::Acquire);
        let fencing = Fencing::from_bits((word >> 2) & 15);
        match word & 3 {
            NATIVE => Ok(Mode {
                claim: ClaimWith::Native,
                fencing,
            }),
            SCRIPT => Ok(Mode {
                claim: ClaimWith::Script,
                fencing,
            }),
            _ => Err(Epoch(word >> EPOCH_SHIFT)),
        }
    }

    /// Keeps `mode` unless a disconnection happened since `epoch`, or someone else already
    /// chose in it. Returns whether it was kept.
    pub(super) fn learn(&self, epoch: Epoch, mode: Mode) -> bool {
        let claim = match mode.claim {
            ClaimWith::Native => NATIVE,
            ClaimWith::Script => SCRIPT,
        };
        let unknown = epoch.0 << EPOCH_SHIFT | UNKNOWN;
        self.0
            .compare_exchange(
                unknown,
                epoch.0 << EPOCH_SHIFT | mode.fencing.bits() << 2 | claim,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// A server refused a native fenced command (renamed, denied, or not what its
    /// version said): the scripts from now on, in this epoch.
    pub(super) fn fence_with_scripts(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                (word & 3 != UNKNOWN).then_some(word & !(15 << 2))
            });
    }

    /// Bumped by every disconnection (and Sentinel switch): a write and a later `WAIT`
    /// in one epoch went over one connection (`replicas.rs`).
    pub(super) fn epoch(&self) -> u64 {
        self.0.load(Ordering::Acquire) >> EPOCH_SHIFT
    }

    /// The connection was lost: the next claim asks the server again.
    pub(super) fn forget(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                Some(((word >> EPOCH_SHIFT).wrapping_add(1) << EPOCH_SHIFT) | UNKNOWN)
            });
    }
}

impl RedisStore {
    /// Which claim and fencing the servers take: asked (`INFO server`) on first use and
    /// after a disconnection, one call at a time; the others wait for its answer.
    pub(super) async fn mode(&self, conn: &mut Conn) -> Result<Mode, StoreError> {
        if let Ok(mode) = self.claim_mode.get() {
            return Ok(mode);
        }
        let _asking = self.asking.lock().await;
        let epoch = match self.claim_mode.get() {
            Ok(mode) => return Ok(mode),
            Err(epoch) => epoch,
        };
        let reply = redis::cmd("INFO")
            .arg("server")
            .query_async::<Value>(conn)
            .await;
        let mode = match reply {
            Ok(reply) => {
                let fencing = Fencing::for_servers(&fencings(&reply));
                tracing::debug!(?fencing, "how leases are fenced");
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
                Mode {
                    claim: with,
                    fencing,
                }
            }
            Err(err) if refused(&err) => {
                tracing::warn!(
                    error = %err,
                    "Redis does not tell its version (INFO refused): claiming and fencing with scripts"
                );
                Mode {
                    claim: ClaimWith::Script,
                    fencing: Fencing::SCRIPTS,
                }
            }
            Err(err) => return Err(unavailable(err)),
        };
        self.claim_mode.learn(epoch, mode);
        Ok(mode)
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

    fn claimed(claim: ClaimWith) -> Mode {
        Mode {
            claim,
            fencing: Fencing::SCRIPTS,
        }
    }

    #[test]
    fn a_choice_is_kept_until_a_disconnection_and_only_in_its_epoch() {
        let mode = ClaimMode::default();
        let first = mode.get().expect_err("nothing learnt yet");
        assert!(mode.learn(first, claimed(ClaimWith::Native)));
        assert_eq!(mode.get(), Ok(claimed(ClaimWith::Native)));
        assert!(
            !mode.learn(first, claimed(ClaimWith::Script)),
            "already chosen"
        );
        assert_eq!(mode.get(), Ok(claimed(ClaimWith::Native)));

        mode.forget();
        let second = mode.get().expect_err("forgotten");
        assert_ne!(first, second);
        // A lookup that started before the disconnection asked the old server.
        assert!(!mode.learn(first, claimed(ClaimWith::Native)));
        assert!(mode.get().is_err());
        assert!(mode.learn(second, claimed(ClaimWith::Script)));
        assert_eq!(mode.get(), Ok(claimed(ClaimWith::Script)));
    }

    const VALKEY_9: Fencing = Fencing {
        set: true,
        delete: Delete::DelIfEq,
        mixed: false,
    };

    #[test]
    fn valkey_9_and_redis_8_4_fence_natively_older_servers_with_scripts() {
        let valkey = |v: &str| {
            format!("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:{v}\r\n")
        };
        assert_eq!(Fencing::of_server(&valkey("9.1.2")), VALKEY_9);
        assert_eq!(Fencing::of_server(&valkey("9.0.0")), VALKEY_9);
        let set_only = Fencing {
            set: true,
            delete: Delete::Script,
            mixed: false,
        };
        assert_eq!(Fencing::of_server(&valkey("8.1.1")), set_only);
        assert_eq!(Fencing::of_server(&valkey("8.0.2")), Fencing::SCRIPTS);
        let redis = |v: &str| format!("redis_version:{v}\r\nredis_mode:cluster\r\n");
        let redis_native = Fencing {
            set: true,
            delete: Delete::DelEx,
            mixed: false,
        };
        assert_eq!(Fencing::of_server(&redis("8.4.0")), redis_native);
        assert_eq!(Fencing::of_server(&redis("8.2.1")), Fencing::SCRIPTS);
        assert_eq!(Fencing::of_server(&redis("7.0.15")), Fencing::SCRIPTS);
        assert_eq!(Fencing::of_server(""), Fencing::SCRIPTS);
    }

    #[test]
    fn a_fleet_that_differs_is_mixed_and_fenced_natively_where_it_can() {
        assert_eq!(Fencing::for_servers(&[VALKEY_9, VALKEY_9]), VALKEY_9);
        assert_eq!(Fencing::for_servers(&[]), Fencing::SCRIPTS);
        assert_eq!(
            Fencing::for_servers(&[Fencing::SCRIPTS, Fencing::SCRIPTS]),
            Fencing::SCRIPTS
        );
        assert_eq!(
            Fencing::for_servers(&[Fencing::SCRIPTS, VALKEY_9, Fencing::SCRIPTS]),
            Fencing {
                mixed: true,
                ..VALKEY_9
            }
        );
        // Valkey 9 next to Redis 8.4 or Valkey 8.1: the complete is native, the release
        // (which of DELIFEQ and DELEX?) a script.
        let redis_8_4 = Fencing {
            delete: Delete::DelEx,
            ..VALKEY_9
        };
        let valkey_8_1 = Fencing {
            delete: Delete::Script,
            ..VALKEY_9
        };
        for other in [redis_8_4, valkey_8_1] {
            assert_eq!(
                Fencing::for_servers(&[VALKEY_9, other, Fencing::SCRIPTS]),
                Fencing {
                    set: true,
                    delete: Delete::Script,
                    mixed: true
                }
            );
        }
    }

    #[test]
    fn the_fencing_is_kept_with_the_claim_and_dropped_to_scripts_on_a_refusal() {
        let mode = ClaimMode::default();
        let epoch = mode.get().expect_err("nothing learnt yet");
        let mixed = Fencing {
            set: true,
            delete: Delete::DelEx,
            mixed: true,
        };
        let learnt = Mode {
            claim: ClaimWith::Native,
            fencing: mixed,
        };
        assert!(mode.learn(epoch, learnt));
        assert_eq!(mode.get(), Ok(learnt));
        mode.fence_with_scripts();
        assert_eq!(mode.get(), Ok(claimed(ClaimWith::Native)));
        assert_eq!(mode.epoch(), epoch.0);
    }
}
