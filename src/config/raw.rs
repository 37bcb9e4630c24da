//! The file as written: serde structs that deny unknown keys, every key optional.
//!
//! Values that can be checked on their own (units, enums, addresses, header names)
//! are parsed by the types in `values` while deserializing, so that
//! `serde_path_to_error` attaches the full path (`routes[1].ttl`) to the error without
//! any bookkeeping of ours. Defaults and checks that involve several keys live in
//! `validate`. The raw forms of `idempotency`, `routes[]`, `upstream` and `log` are
//! generated next to their typed forms, in `policy` and `sections`.

use std::net::SocketAddr;

use http::Uri;
use serde::{Deserialize, Deserializer};

use super::policy::{RawPolicy, RawRoute};
use super::sections::{RawErrors, RawLog, RawUpstream};
use super::sentinel::RawSentinel;
use super::values::{Addr, Count, Dur, Flag, Pick, Size, UpstreamUrl, WorkerCount};
use super::{ConfigError, EscapedSlashes, OnUnavailable, RouteMatch, StoreKind};

/// Deserializes the interpolated document, naming the path of the first bad key.
pub(super) fn deserialize(value: serde_yaml::Value) -> Result<RawConfig, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = match err.path().to_string() {
            root if root == "." => "(top level)".to_owned(),
            path => path,
        };
        ConfigError::invalid(path, tidy_serde_message(&err.into_inner().to_string()))
    })
}

/// Rewrites serde's built-in messages to this module's style:
/// "unknown field `foo`, expected one of `a`, `b`" becomes
/// "unknown field 'foo', expected one of a, b".
fn tidy_serde_message(message: &str) -> String {
    let builtin = [
        "unknown field `",
        "invalid type: ",
        "invalid value: ",
        "invalid length ",
    ];
    if !builtin.iter().any(|prefix| message.starts_with(prefix)) {
        return message.to_owned();
    }
    let mut parts = message.splitn(3, '`');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(head), Some(quoted), Some(tail)) => {
            format!("{head}'{quoted}'{}", tail.replace('`', ""))
        }
        _ => message.replace('`', ""),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of configuration keys")]
pub(super) struct RawConfig {
    pub(super) listen: Option<Addr>,
    pub(super) upstream: Option<RawUpstream>,
    pub(super) store: Option<RawStore>,
    pub(super) idempotency: Option<RawPolicy>,
    pub(super) routes: Option<Vec<RawRoute>>,
    pub(super) admin: Option<RawAdmin>,
    pub(super) log: Option<RawLog>,
    pub(super) shutdown_timeout: Option<Dur>,
    pub(super) route_match: Option<Pick<RouteMatch>>,
    pub(super) listen_header_timeout: Option<Dur>,
    pub(super) max_connections: Option<Count>,
    pub(super) workers: Option<WorkerCount>,
    pub(super) max_buffered_bytes: Option<Size>,
    pub(super) errors: Option<RawErrors>,
    pub(super) escaped_slashes: Option<Pick<EscapedSlashes>>,
    pub(super) upgrades: Option<Vec<String>>,
    pub(super) listen_idle_timeout: Option<Dur>,
    pub(super) listen_body_timeout: Option<Dur>,
}

impl RawConfig {
    /// The configuration of `idemgate --upstream URL [--listen ADDR]`.
    pub(super) fn for_upstream(url: Uri, listen: Option<SocketAddr>) -> RawConfig {
        RawConfig {
            listen: listen.map(Addr),
            upstream: Some(RawUpstream {
                url: Some(UpstreamUrl(url)),
                ..RawUpstream::default()
            }),
            ..RawConfig::default()
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of store keys")]
pub(super) struct RawStore {
    pub(super) kind: Option<Pick<StoreKind>>,
    pub(super) url: Option<String>,
    pub(super) urls: Option<Vec<String>>,
    pub(super) cluster: Option<Flag>,
    pub(super) key_prefix: Option<String>,
    pub(super) timeout: Option<Dur>,
    pub(super) on_unavailable: Option<Pick<OnUnavailable>>,
    pub(super) max_entries: Option<Count>,
    pub(super) path: Option<String>,
    pub(super) fsync: Option<Flag>,
    pub(super) sentinel: Option<RawSentinel>,
    pub(super) min_replicas: Option<Count>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with listen and token")]
pub(super) struct RawAdmin {
    /// Outer `None`: key absent (default address); `Some(None)`: `listen: null`, which
    /// disables the admin server.
    #[serde(default, deserialize_with = "present")]
    pub(super) listen: Option<Option<Addr>>,
    pub(super) token: Option<String>,
}

/// Marks a key as present even when its value is `null`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Addr>>, D::Error> {
    Option::<Addr>::deserialize(d).map(Some)
}
