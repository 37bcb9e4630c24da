//! The file as written: serde structs that deny unknown keys, every key optional.
//!
//! Values that can be checked on their own (units, enums, addresses, header names)
//! are parsed by the types in `values` while deserializing, so that
//! `serde_path_to_error` attaches the full path (`routes[1].ttl`) to the error without
//! any bookkeeping of ours. Defaults and checks that involve several keys live in
//! `validate`.

use std::net::SocketAddr;

use http::Uri;
use serde::{Deserialize, Deserializer};

use super::values::{
    Addr, Count, Dur, Flag, Header, LogLevel, Methods, Pick, Size, Status, UpstreamUrl,
};
use super::{ConfigError, LogFormat, OnConcurrent, OnUnavailable, OnUnknownOutcome, StoreKind};

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
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with url, connect_timeout, timeout"
)]
pub(super) struct RawUpstream {
    pub(super) url: Option<UpstreamUrl>,
    pub(super) connect_timeout: Option<Dur>,
    pub(super) timeout: Option<Dur>,
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
}

/// Declares a struct with every `idempotency` key plus `$extra` leading keys, so the
/// top-level section and a route cannot drift apart. (`#[serde(flatten)]` would share
/// the fields too, but it disables `deny_unknown_fields` and loses error paths.)
macro_rules! policy_struct {
    ($(#[$meta:meta])* $name:ident { $($extra:ident: $extra_ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, expecting = "a mapping of idempotency keys")]
        pub(super) struct $name {
            $(pub(super) $extra: $extra_ty,)*
            pub(super) header: Option<Header>,
            pub(super) methods: Option<Methods>,
            pub(super) required: Option<Flag>,
            pub(super) ttl: Option<Dur>,
            pub(super) lease: Option<Dur>,
            pub(super) on_concurrent: Option<Pick<OnConcurrent>>,
            pub(super) wait_timeout: Option<Dur>,
            pub(super) on_unknown_outcome: Option<Pick<OnUnknownOutcome>>,
            pub(super) release_statuses: Option<Vec<Status>>,
            pub(super) scope_headers: Option<Vec<Header>>,
            pub(super) fingerprint_headers: Option<Vec<Header>>,
            pub(super) replay_drop_headers: Option<Vec<Header>>,
            pub(super) max_request_body: Option<Size>,
            pub(super) max_response_body: Option<Size>,
        }
    };
}

policy_struct!(RawPolicy {});
policy_struct!(RawRoute {
    path: Option<String>,
    enabled: Option<Flag>,
});

impl RawRoute {
    /// Separates the route's own keys from its `idempotency` overrides.
    pub(super) fn split(self) -> (Option<String>, Option<Flag>, RawPolicy) {
        let overrides = RawPolicy {
            header: self.header,
            methods: self.methods,
            required: self.required,
            ttl: self.ttl,
            lease: self.lease,
            on_concurrent: self.on_concurrent,
            wait_timeout: self.wait_timeout,
            on_unknown_outcome: self.on_unknown_outcome,
            release_statuses: self.release_statuses,
            scope_headers: self.scope_headers,
            fingerprint_headers: self.fingerprint_headers,
            replay_drop_headers: self.replay_drop_headers,
            max_request_body: self.max_request_body,
            max_response_body: self.max_response_body,
        };
        (self.path, self.enabled, overrides)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with listen")]
pub(super) struct RawAdmin {
    /// Outer `None`: key absent (default address); `Some(None)`: `listen: null`, which
    /// disables the admin server.
    #[serde(default, deserialize_with = "present")]
    pub(super) listen: Option<Option<Addr>>,
}

/// Marks a key as present even when its value is `null`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Addr>>, D::Error> {
    Option::<Addr>::deserialize(d).map(Some)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with format, level")]
pub(super) struct RawLog {
    pub(super) format: Option<Pick<LogFormat>>,
    pub(super) level: Option<LogLevel>,
}
