//! The sections of the file, one file each: its struct, which serde reads with every
//! key checked as it is read, its defaults and its checks. `store` and `admin` are
//! still read through their raw forms here.

use serde::{Deserialize, Deserializer};

use super::sentinel::RawSentinel;
use super::values::{Addr, Count, Dur, Flag, Null, Pick, Raw, Text, given, null, section_form};
use super::{OnUnavailable, StoreKind};

mod errors;
mod log;
mod upstream;

pub use errors::{ErrorFormat, ErrorsConfig};
pub use log::{LogConfig, LogFormat};
pub use upstream::UpstreamConfig;

section_form!(LogConfig, UpstreamConfig, ErrorsConfig);

null! {
    refused:;
    default: RawStore, RawAdmin, LogConfig, UpstreamConfig, ErrorsConfig,
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with listen and token")]
pub(super) struct RawAdmin {
    /// Outer `None`: key absent (default address); `Some(None)`: `listen: null`, which
    /// disables the admin server.
    #[serde(default, deserialize_with = "present")]
    pub(super) listen: Option<Option<Addr>>,
    /// `null` is no token, its default.
    pub(super) token: Option<Text>,
}

/// Marks a key as present even when its value is `null`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Addr>>, D::Error> {
    Option::<Addr>::deserialize(d).map(Some)
}
