//! Redis's keys (docs/behaviour.md §5, §14): the URLs (`url` or `urls`), `cluster`,
//! `sentinel` and `min_replicas`. They depend on each other (the URLs make a cluster,
//! and neither `sentinel` nor `min_replicas` goes with one), so they are checked
//! together once the whole store is read, and only for `kind: redis`.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use super::{StoreConfig, StoreKind};
use crate::config::error::ConfigError;
use crate::config::types::secret::SecretUrls;
use crate::config::types::secret::{redact_url, url_secret_is_masked};
use crate::config::types::units::Count;
use crate::config::types::{As, Text, forms};

pub(crate) const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";
/// A cluster seed carries no database number (Redis Cluster only has database 0).
const DEFAULT_CLUSTER_URL: &str = "redis://127.0.0.1:6379";

/// Where the sentinels are and which master they watch.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping with master_name, urls"
)]
pub struct SentinelConfig {
    /// The name the sentinels monitor the master under (`sentinel monitor NAME ...`).
    #[serde(with = "As::<Text>")]
    pub master_name: String,
    /// Interpolated sentinel URLs, `redis[s]://[user:password@]host:port[/db]`. Each
    /// reaches its sentinel with its own TLS and credentials; the master is reached with
    /// the scheme, credentials and database of the first. May hold passwords: print
    /// [`SentinelConfig::redacted_urls`]; `--check` prints them so.
    #[serde(with = "As::<SecretUrls>")]
    pub urls: Vec<String>,
}

impl SentinelConfig {
    /// The URLs with any password replaced by `***`.
    pub fn redacted_urls(&self) -> Vec<String> {
        self.urls.iter().map(|url| redact_url(url)).collect()
    }
}

/// More replicas than any deployment has; a typo such as 10000 is refused.
const MAX_REPLICAS: u32 = 100;

/// `min_replicas`: a replica count Redis's `WAIT` takes.
pub(crate) struct MinReplicas(u32);

impl<'de> Deserialize<'de> for MinReplicas {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Count(n) = Count::deserialize(d)?;
        u32::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_REPLICAS)
            .map(MinReplicas)
            .ok_or_else(|| de::Error::custom(format!("must be at most {MAX_REPLICAS}")))
    }
}

forms! {
    MinReplicas => u32, |n: &u32, s: S| s.serialize_u32(*n);
}

/// `url` merged into `urls`, `cluster` set by the count of URLs, and the Redis keys
/// checked when the store is Redis.
pub(super) fn build(store: &mut StoreConfig) -> Result<(), ConfigError> {
    // Each URL keeps the path of the key it came from, for error messages.
    let urls: Vec<(String, String)> = match store.written_url.take() {
        _ if !store.urls.is_empty() => std::mem::take(&mut store.urls)
            .into_iter()
            .enumerate()
            .map(|(i, url)| (format!("store.urls[{i}]"), url))
            .collect(),
        Some(url) => vec![("store.url".to_owned(), url)],
        None if store.cluster => vec![("store.url".to_owned(), DEFAULT_CLUSTER_URL.to_owned())],
        None => vec![("store.url".to_owned(), DEFAULT_URL.to_owned())],
    };
    store.cluster |= urls.len() > 1;
    let is_redis = store.kind == StoreKind::Redis;
    if is_redis {
        for (path, url) in &urls {
            check_redis_url(url, store.cluster).map_err(|msg| ConfigError::invalid(path, msg))?;
        }
    }
    store.urls = urls.into_iter().map(|(_, url)| url).collect();
    if let (true, Some(sentinel)) = (is_redis, &store.sentinel) {
        check_sentinel(sentinel)?;
    }
    // Neither key goes with a cluster: the sentinels watch one master, and `WAIT` on a
    // cluster would only count the replicas of whichever shard the connection last
    // wrote to.
    if is_redis && store.cluster {
        if store.sentinel.is_some() {
            return Err(ConfigError::invalid(
                "store.sentinel",
                "cannot be combined with a cluster (cluster: true, or several urls); \
                 Redis Cluster fails over by itself",
            ));
        }
        if store.min_replicas > 0 {
            return Err(ConfigError::invalid(
                "store.min_replicas",
                "applies to a single Redis or Sentinel, not to a cluster; set it to 0",
            ));
        }
    }
    Ok(())
}

/// The sentinels' URLs are checked as `store.url` is.
fn check_sentinel(sentinel: &SentinelConfig) -> Result<(), ConfigError> {
    if sentinel.master_name.trim().is_empty() {
        return Err(ConfigError::invalid(
            "store.sentinel.master_name",
            "missing; the name the sentinels monitor the master under, e.g. mymaster",
        ));
    }
    if sentinel.urls.is_empty() {
        return Err(ConfigError::invalid(
            "store.sentinel.urls",
            "missing; list the sentinels, e.g. [redis://127.0.0.1:26379]",
        ));
    }
    for (i, url) in sentinel.urls.iter().enumerate() {
        check_redis_url(url, false)
            .map_err(|msg| ConfigError::invalid(format!("store.sentinel.urls[{i}]"), msg))?;
    }
    Ok(())
}

/// Checks `redis[s]://[user[:password]@]host[:port][/db][?params]` without echoing
/// the password into the message.
fn check_redis_url(url: &str, cluster: bool) -> Result<(), String> {
    let shown = redact_url(url);
    if url_secret_is_masked(url) {
        return Err(format!(
            "'{shown}' has '***' for its password, what --check prints in place of the \
             password; write the password itself, e.g. ${{REDIS_PASSWORD}}"
        ));
    }
    let Some(rest) = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
    else {
        return Err(format!("'{shown}' is not a redis:// or rediss:// URL"));
    };
    let after_userinfo = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let (address, path) = match after_userinfo.find(['/', '?']) {
        Some(at) => after_userinfo.split_at(at),
        None => (after_userinfo, ""),
    };
    let (host, port) = split_host_port(address);
    if host.is_empty() {
        return Err(format!("'{shown}' has no host"));
    }
    if let Some(port) = port
        && !matches!(port.parse::<u16>(), Ok(1..))
    {
        return Err(format!("'{shown}' has an invalid port '{port}'"));
    }
    let db = path
        .split('?')
        .next()
        .unwrap_or_default()
        .trim_start_matches('/');
    if db.is_empty() {
        return Ok(());
    }
    if !db.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "'{shown}' has an invalid database '/{db}'; expected a number such as /0"
        ));
    }
    if cluster {
        return Err(format!(
            "'{shown}': cluster URLs carry no database number; remove '/{db}'"
        ));
    }
    Ok(())
}

/// Splits `host:port`, `[v6]:port`, `host` or `[v6]`.
fn split_host_port(address: &str) -> (&str, Option<&str>) {
    if let Some(v6) = address.strip_prefix('[') {
        return match v6.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => ("", None),
        };
    }
    match address.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (address, None),
    }
}
