//! `store.sentinel` and `store.min_replicas` (docs/behaviour.md §14): Redis high
//! availability.
//!
//! The two keys depend on the rest of `store` (neither goes with a cluster), so they are
//! read here and checked by [`check`] once `build_store` knows whether the store is a
//! cluster.

use super::render::{Mapping, Value};
use serde::Deserialize;

use super::values::{Null, Text, given, null};
use super::{ConfigError, StoreKind, redact_url};

null! {
    refused:;
    default: RawSentinel,
}

/// Where the sentinels are and which master they watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelConfig {
    /// The name the sentinels monitor the master under (`sentinel monitor NAME ...`).
    pub master_name: String,
    /// Interpolated sentinel URLs, `redis[s]://[user:password@]host:port[/db]`. Each
    /// reaches its sentinel with its own TLS and credentials; the master is reached with
    /// the scheme, credentials and database of the first. May hold passwords: print
    /// [`SentinelConfig::redacted_urls`].
    pub urls: Vec<String>,
}

impl SentinelConfig {
    /// The URLs with any password replaced by `***`.
    pub fn redacted_urls(&self) -> Vec<String> {
        self.urls.iter().map(|url| redact_url(url)).collect()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with master_name, urls")]
pub(super) struct RawSentinel {
    #[serde(default, deserialize_with = "given")]
    master_name: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    urls: Option<Vec<Text>>,
}

/// The typed `store.sentinel`, its URLs checked as `store.url` is (only for `kind:
/// redis`: keys that do not apply are allowed, docs/behaviour.md §8).
pub(super) fn build(
    raw: RawSentinel,
    kind: StoreKind,
    check_url: impl Fn(&str) -> Result<(), String>,
) -> Result<SentinelConfig, ConfigError> {
    let master_name = raw.master_name.map(|name| name.0).unwrap_or_default();
    let urls: Vec<String> = raw
        .urls
        .unwrap_or_default()
        .into_iter()
        .map(|url| url.0)
        .collect();
    if kind == StoreKind::Redis {
        if master_name.trim().is_empty() {
            return Err(ConfigError::invalid(
                "store.sentinel.master_name",
                "missing; the name the sentinels monitor the master under, e.g. mymaster",
            ));
        }
        if urls.is_empty() {
            return Err(ConfigError::invalid(
                "store.sentinel.urls",
                "missing; list the sentinels, e.g. [redis://127.0.0.1:26379]",
            ));
        }
        for (i, url) in urls.iter().enumerate() {
            check_url(url)
                .map_err(|msg| ConfigError::invalid(format!("store.sentinel.urls[{i}]"), msg))?;
        }
    }
    Ok(SentinelConfig { master_name, urls })
}

/// Neither key goes with a cluster: the sentinels watch one master, and `WAIT` on a
/// cluster would only count the replicas of whichever shard the connection last wrote to.
pub(super) fn check(
    kind: StoreKind,
    cluster: bool,
    sentinel: Option<&SentinelConfig>,
    min_replicas: u32,
) -> Result<(), ConfigError> {
    if kind != StoreKind::Redis || !cluster {
        return Ok(());
    }
    if sentinel.is_some() {
        return Err(ConfigError::invalid(
            "store.sentinel",
            "cannot be combined with a cluster (cluster: true, or several urls); \
             Redis Cluster fails over by itself",
        ));
    }
    if min_replicas > 0 {
        return Err(ConfigError::invalid(
            "store.min_replicas",
            "applies to a single Redis or Sentinel, not to a cluster; set it to 0",
        ));
    }
    Ok(())
}

/// `store.min_replicas`: a replica count Redis's `WAIT` takes.
pub(super) fn min_replicas(count: Option<u64>) -> Result<u32, ConfigError> {
    count.map_or(Ok(0), |n| {
        u32::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_REPLICAS)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "store.min_replicas",
                    format!("must be at most {MAX_REPLICAS}"),
                )
            })
    })
}

/// More replicas than any deployment has; a typo such as 10000 is refused.
const MAX_REPLICAS: u32 = 100;

/// `sentinel:` for `--check`: `null` when unset, passwords as `***`.
pub(super) fn render(sentinel: Option<&SentinelConfig>) -> Value {
    let Some(sentinel) = sentinel else {
        return Value::Null;
    };
    let mut map = Mapping::new();
    map.insert("master_name".into(), sentinel.master_name.as_str().into());
    map.insert("urls".into(), sentinel.redacted_urls().into());
    Value::Mapping(map)
}
