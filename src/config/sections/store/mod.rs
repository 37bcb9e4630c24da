//! `store`: where records live (docs/behaviour.md §5). Every kind reads the keys
//! declared first; `max_entries` and `max_entries_per_scope` are the memory and file
//! stores' (the file store's own keys are in [`file`]), the URLs, `cluster`, `sentinel`
//! and `min_replicas` Redis's ([`redis`]), `url`, `table`, `pool_size`, `create_table`,
//! `sweep_interval` and `tls` PostgreSQL's ([`postgres`], §22), and `encryption` every
//! kind's ([`encryption`]).
//!
//! Keys that do not apply to the chosen kind are allowed (docs/behaviour.md §8) and not
//! in force: [`StoreConfig::build`] leaves them at their defaults, so two files that
//! differ only in them load to the same configuration (a reload does not refuse them
//! as a store change), and `--check`, which prints the keys of the chosen kind alone,
//! loads back to it.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::ser::{Serialize, SerializeMap, Serializer};

pub(crate) mod encryption;
pub(crate) mod file;
pub(crate) mod postgres;
pub(crate) mod redis;

use self::encryption::{EncryptionKey, WrittenEncryption};
use self::file::StorePath;
use self::postgres::{PoolSize, StoreTls, TableName};
use self::redis::{MinReplicas, SentinelConfig};
use crate::config::error::ConfigError;
use crate::config::types::secret::{Mask, SecretUrls, redact_url};
use crate::config::types::units::{AtLeastOne, Dur, Flag};
use crate::config::types::{As, Choice, Opt, Pick, Shown, Text, given};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    /// The durable embedded store (docs/behaviour.md §12).
    File,
    Redis,
    /// Records in a PostgreSQL table (docs/behaviour.md §22).
    Postgres,
}

impl Choice for StoreKind {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("memory", StoreKind::Memory),
        ("file", StoreKind::File),
        ("redis", StoreKind::Redis),
        ("postgres", StoreKind::Postgres),
    ];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnavailable {
    Reject,
    PassThrough,
}

impl Choice for OnUnavailable {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("reject", OnUnavailable::Reject),
        ("pass_through", OnUnavailable::PassThrough),
    ];
}

/// Completed records the memory and file stores keep before evicting the oldest.
const DEFAULT_MAX_ENTRIES: usize = 100_000;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping of store keys")]
pub struct StoreConfig {
    #[serde(with = "As::<Pick<StoreKind>>")]
    pub kind: StoreKind,
    /// `url` as written, merged into `urls` by [`StoreConfig::build`] (then `None`).
    #[serde(rename = "url", with = "Opt::<Text>")]
    pub(crate) written_url: Option<String>,
    /// Interpolated (`${VAR}`) URLs. `url` and `urls` merged: `urls` non-empty wins;
    /// default `redis://127.0.0.1:6379/0`.
    ///
    /// With `cluster` and no URL given the default seed is `redis://127.0.0.1:6379`,
    /// because cluster URLs carry no database number. They may hold passwords: log
    /// [`StoreConfig::redacted_urls`] instead.
    #[serde(with = "As::<Vec<Text>>")]
    pub urls: Vec<String>,
    /// True when `cluster: true` or more than one URL.
    #[serde(with = "As::<Flag>")]
    pub cluster: bool,
    #[serde(with = "As::<Text>")]
    pub key_prefix: String,
    #[serde(with = "As::<Dur>")]
    pub timeout: Duration,
    #[serde(with = "As::<Pick<OnUnavailable>>")]
    pub on_unavailable: OnUnavailable,
    /// Memory and file stores: completed records beyond this are evicted oldest first.
    #[serde(with = "As::<AtLeastOne>")]
    pub max_entries: usize,
    /// File store: the directory, created if missing.
    #[serde(with = "As::<StorePath>")]
    pub path: PathBuf,
    /// File store: flush every commit to stable storage.
    #[serde(with = "As::<Flag>")]
    pub fsync: bool,
    /// Redis: find the master through these sentinels instead of `urls`
    /// (docs/behaviour.md §14); `null` is none.
    pub sentinel: Option<SentinelConfig>,
    /// Redis and Sentinel: replicas that must acknowledge a claim (`WAIT`) before it is
    /// forwarded, and a record before it is counted as replicated; 0 waits for none.
    #[serde(with = "As::<MinReplicas>")]
    pub min_replicas: u32,
    /// `encryption` as written, checked into `encryption` by [`StoreConfig::build`]
    /// (then `None`), so that an error can name a key by its `id`.
    #[serde(rename = "encryption", deserialize_with = "given")]
    pub(crate) written_encryption: Option<WrittenEncryption>,
    /// `store.encryption.keys` (docs/behaviour.md §17): the first seals, all open; empty
    /// keeps records in clear.
    #[serde(skip)]
    pub encryption: Vec<EncryptionKey>,
    /// Memory and file stores: completed records one scope may hold; past it the
    /// scope's own oldest is evicted (docs/behaviour.md §17). `None`: no quota.
    #[serde(with = "Opt::<AtLeastOne>")]
    pub max_entries_per_scope: Option<usize>,
    /// PostgreSQL: the records' table, `name` or `schema.name`.
    #[serde(with = "As::<TableName>")]
    pub table: String,
    /// PostgreSQL: connections per process.
    #[serde(with = "As::<PoolSize>")]
    pub pool_size: usize,
    /// PostgreSQL: create the table when it is missing.
    #[serde(with = "As::<Flag>")]
    pub create_table: bool,
    /// PostgreSQL: how often expired rows are deleted.
    #[serde(with = "As::<Dur>")]
    pub sweep_interval: Duration,
    /// PostgreSQL: the trust anchors for the URL's `sslmode`; `null` is the system's.
    pub tls: Option<StoreTls>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Memory,
            written_url: None,
            urls: Vec::new(),
            cluster: false,
            key_prefix: "idemgate:".to_owned(),
            timeout: Duration::from_secs(1),
            on_unavailable: OnUnavailable::Reject,
            max_entries: DEFAULT_MAX_ENTRIES,
            path: file::DEFAULT_PATH.into(),
            fsync: true,
            sentinel: None,
            min_replicas: 0,
            written_encryption: None,
            encryption: Vec::new(),
            max_entries_per_scope: None,
            table: postgres::DEFAULT_TABLE.to_owned(),
            pool_size: postgres::DEFAULT_POOL_SIZE,
            create_table: true,
            sweep_interval: postgres::DEFAULT_SWEEP_INTERVAL,
            tls: None,
        }
    }
}

impl StoreConfig {
    /// The store as written, its keys merged and checked, and those of other kinds at
    /// their defaults.
    pub(crate) fn build(mut self) -> Result<StoreConfig, ConfigError> {
        if self.kind == StoreKind::Postgres {
            postgres::build(&mut self)?;
        } else {
            redis::build(&mut self)?;
        }
        self.encryption = encryption::build(self.written_encryption.take())?;
        let defaults = StoreConfig::default();
        if !matches!(self.kind, StoreKind::Redis | StoreKind::Postgres) {
            self.urls = vec![redis::DEFAULT_URL.to_owned()];
            self.cluster = false;
            self.sentinel = None;
            self.min_replicas = 0;
        }
        if self.kind != StoreKind::File {
            self.path = defaults.path;
            self.fsync = defaults.fsync;
        }
        if matches!(self.kind, StoreKind::Redis | StoreKind::Postgres) {
            self.max_entries = defaults.max_entries;
            self.max_entries_per_scope = None;
        }
        if self.kind == StoreKind::Postgres {
            self.cluster = false;
            self.sentinel = None;
            self.key_prefix = defaults.key_prefix;
        } else {
            self.table = defaults.table;
            self.pool_size = defaults.pool_size;
            self.create_table = defaults.create_table;
            self.sweep_interval = defaults.sweep_interval;
            self.tls = None;
        }
        Ok(self)
    }

    /// The store URLs with any password replaced by `***`, fit for logs and `--check`.
    pub fn redacted_urls(&self) -> Vec<String> {
        self.urls
            .iter()
            .map(|url| postgres::redact_pg_url(url))
            .collect()
    }
}

/// `--check` prints the keys every kind reads, and those of the chosen kind only:
/// loading leaves the keys of other kinds at their defaults, so leaving them out loses
/// nothing, and a file store's configuration does not show Redis URLs it never connects
/// to. Passwords in URLs are printed `***`.
impl Serialize for StoreConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("kind", &Shown::<Pick<StoreKind>>(&self.kind))?;
        let redis = self.kind == StoreKind::Redis;
        let postgres = self.kind == StoreKind::Postgres;
        if postgres && let [url] = self.urls.as_slice() {
            map.serialize_entry("url", &Shown::<Text>(&postgres::redact_pg_url(url)))?;
            map.serialize_entry("table", &Shown::<TableName>(&self.table))?;
            map.serialize_entry("pool_size", &Shown::<PoolSize>(&self.pool_size))?;
            map.serialize_entry("create_table", &self.create_table)?;
            map.serialize_entry("sweep_interval", &Shown::<Dur>(&self.sweep_interval))?;
            map.serialize_entry("tls", &self.tls)?;
        }
        if redis {
            match self.urls.as_slice() {
                [url] => map.serialize_entry("url", &Shown::<Text>(&redact_url(url)))?,
                _ => map.serialize_entry("urls", &Shown::<SecretUrls>(&self.urls))?,
            }
            map.serialize_entry("cluster", &self.cluster)?;
        }
        if !postgres {
            map.serialize_entry("key_prefix", &Shown::<Text>(&self.key_prefix))?;
        }
        map.serialize_entry("timeout", &Shown::<Dur>(&self.timeout))?;
        map.serialize_entry(
            "on_unavailable",
            &Shown::<Pick<OnUnavailable>>(&self.on_unavailable),
        )?;
        if !redis && !postgres {
            map.serialize_entry("max_entries", &self.max_entries)?;
            if let Some(n) = self.max_entries_per_scope {
                map.serialize_entry("max_entries_per_scope", &n)?;
            }
        }
        if self.kind == StoreKind::File {
            map.serialize_entry("path", &Shown::<file::StorePath>(&self.path))?;
            map.serialize_entry("fsync", &self.fsync)?;
        }
        if redis {
            map.serialize_entry("sentinel", &self.sentinel)?;
            map.serialize_entry("min_replicas", &self.min_replicas)?;
        }
        if !self.encryption.is_empty() {
            map.serialize_entry("encryption", &Keys(&self.encryption))?;
        }
        map.end()
    }
}

/// `encryption` as `--check` prints it: ids, and `***` for every key.
struct Keys<'a>(&'a [EncryptionKey]);

impl Serialize for Keys<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let keys: Vec<_> = self.0.iter().map(|key| Key(&key.id)).collect();
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry("keys", &keys)?;
        map.end()
    }
}

struct Key<'a>(&'a String);

impl Serialize for Key<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("id", &Shown::<Text>(self.0))?;
        map.serialize_entry("key", &Mask)?;
        map.end()
    }
}
