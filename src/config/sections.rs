//! The sections of the file, one file each: its struct, which serde reads with every
//! key checked as it is read, its defaults and its checks. `store` and `admin` are
//! still read through their raw forms here.

use serde::Deserialize;

use super::sentinel::RawSentinel;
use super::values::{Count, Dur, Flag, Null, Pick, Raw, Text, given, null, section_form};
use super::{OnUnavailable, StoreKind};

mod admin;
mod errors;
mod log;
pub(super) mod telemetry;
mod upstream;

pub use admin::{AdminConfig, AdminToken};
pub use errors::{ErrorFormat, ErrorsConfig};
pub use log::{LogConfig, LogFormat};
pub use upstream::UpstreamConfig;

section_form!(
    LogConfig,
    UpstreamConfig,
    ErrorsConfig,
    AdminConfig,
    telemetry::TelemetryConfig,
);

null! {
    refused:;
    default: RawStore, LogConfig, UpstreamConfig, ErrorsConfig, AdminConfig,
        telemetry::TelemetryConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of store keys")]
pub(super) struct RawStore {
    #[serde(default, deserialize_with = "given")]
    pub(super) kind: Option<Pick<StoreKind>>,
    #[serde(default, deserialize_with = "given")]
    pub(super) url: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    pub(super) urls: Option<Vec<Text>>,
    #[serde(default, deserialize_with = "given")]
    pub(super) cluster: Option<Flag>,
    #[serde(default, deserialize_with = "given")]
    pub(super) key_prefix: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    pub(super) timeout: Option<Dur>,
    #[serde(default, deserialize_with = "given")]
    pub(super) on_unavailable: Option<Pick<OnUnavailable>>,
    #[serde(default, deserialize_with = "given")]
    pub(super) max_entries: Option<Count>,
    #[serde(default, deserialize_with = "given")]
    pub(super) path: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    pub(super) fsync: Option<Flag>,
    #[serde(default, deserialize_with = "given")]
    pub(super) sentinel: Option<RawSentinel>,
    #[serde(default, deserialize_with = "given")]
    pub(super) min_replicas: Option<Count>,
    #[serde(default, deserialize_with = "given")]
    pub(super) encryption: Option<super::encryption::RawEncryption>,
    #[serde(default, deserialize_with = "given")]
    pub(super) max_entries_per_scope: Option<Count>,
}
