//! The top level of the file: its sections, the keys that stand on their own, and the
//! reload class of each (docs/behaviour.md §14).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use super::policy::{Policy, Printed, WrittenPolicy, WrittenRoute};
use super::routes::{self, Route, RouteMatch};
use super::{
    AdminConfig, CorsConfig, ErrorsConfig, LogConfig, StoreConfig, TelemetryConfig, UpstreamConfig,
};
use crate::config::OnConcurrent;
use crate::config::error::ConfigError;
use crate::config::types::http::Addr;
use crate::config::types::units::{AtLeastOne, Dur, Size};
use crate::config::types::{
    As, Choice, OrDefault, Pending, Pick, Scalar, Shown, Text, forms, given,
};
use crate::idempotency::path::EscapedSlashes;

/// The configuration in force: typed, validated, defaults applied.
///
/// Serde reads it straight from the file, each key by its form; [`Config::build`] then
/// applies the rules that span keys. The order of the fields is that of `--check` and
/// of the error messages that list the keys.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping of configuration keys"
)]
pub struct Config {
    /// The proxy's address; `--listen` overrides it.
    #[serde(with = "As::<Addr>")]
    pub listen: SocketAddr,
    #[serde(with = "OrDefault::<UpstreamConfig>")]
    pub upstream: UpstreamConfig,
    #[serde(with = "OrDefault::<StoreConfig>")]
    pub store: StoreConfig,
    /// `idempotency` as written, the default policy once [`Config::build`] took it.
    #[serde(
        rename = "idempotency",
        deserialize_with = "nullable",
        skip_serializing
    )]
    pub(crate) written_idempotency: Pending<WrittenPolicy>,
    /// The top-level `idempotency` section, as the default policy.
    #[serde(skip_deserializing, serialize_with = "print_idempotency")]
    pub idempotency: Policy,
    /// `routes` as written, until [`Config::build`] puts each on top of `idempotency`.
    #[serde(rename = "routes", deserialize_with = "given_routes", skip_serializing)]
    pub(crate) written_routes: Pending<Vec<WrittenRoute>>,
    /// Routes in file order; each carries its fully merged effective policy.
    #[serde(skip_deserializing)]
    pub routes: Vec<Route>,
    #[serde(with = "OrDefault::<AdminConfig>")]
    pub admin: AdminConfig,
    #[serde(with = "OrDefault::<LogConfig>")]
    pub log: LogConfig,
    /// How long in-flight work gets after SIGTERM.
    #[serde(with = "As::<Dur>")]
    pub shutdown_timeout: Duration,
    /// How route prefixes compare with request paths (docs/behaviour.md §15).
    #[serde(with = "As::<Pick<RouteMatch>>")]
    pub route_match: RouteMatch,
    /// A connection that sends no complete request head this long is closed, before its
    /// protocol is known too; on the admin listener as well.
    #[serde(with = "As::<Dur>")]
    pub listen_header_timeout: Duration,
    /// Open client connections at most; past it new ones wait in the listen backlog.
    #[serde(with = "As::<AtLeastOne>")]
    pub max_connections: usize,
    /// How many single-threaded workers serve the listener (`auto`: one per CPU).
    #[serde(with = "As::<WorkerCount>")]
    pub workers: Workers,
    /// Request and response bodies held in memory at once, across all requests.
    #[serde(with = "As::<Size>")]
    pub max_buffered_bytes: u64,
    /// The shape of the answers idemgate makes itself (docs/behaviour.md §16).
    #[serde(with = "OrDefault::<ErrorsConfig>")]
    pub errors: ErrorsConfig,
    /// What becomes of `%2F`, `%5C` and `\` in request paths.
    #[serde(with = "As::<Pick<EscapedSlashes>>")]
    pub escaped_slashes: EscapedSlashes,
    /// The protocols a passed-through request may upgrade to, lower-cased; `h2c` is
    /// never one of them.
    #[serde(with = "As::<Upgrades>")]
    pub upgrades: Vec<String>,
    /// A client connection with no request open this long is closed (`GOAWAY` on
    /// HTTP/2).
    #[serde(with = "As::<Dur>")]
    pub listen_idle_timeout: Duration,
    /// A guarded request body that sends no byte this long is answered `408`.
    #[serde(with = "As::<Dur>")]
    pub listen_body_timeout: Duration,
    /// Where traces go (docs/behaviour.md §20): no exporter by default.
    #[serde(with = "OrDefault::<TelemetryConfig>")]
    pub telemetry: TelemetryConfig,
    /// The CORS headers of idemgate's own answers and of replays (docs/behaviour.md §24);
    /// unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cors: Option<CorsConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 8080),
            upstream: UpstreamConfig::default(),
            store: StoreConfig::default(),
            written_idempotency: Pending::default(),
            idempotency: Policy::default(),
            written_routes: Pending::default(),
            routes: Vec::new(),
            admin: AdminConfig::default(),
            log: LogConfig::default(),
            shutdown_timeout: Duration::from_secs(30),
            route_match: RouteMatch::Exact,
            listen_header_timeout: Duration::from_secs(30),
            max_connections: 10_000,
            workers: Workers::Auto,
            max_buffered_bytes: 256 << 20,
            errors: ErrorsConfig::default(),
            escaped_slashes: EscapedSlashes::Reject,
            upgrades: vec!["websocket".to_owned()],
            listen_idle_timeout: Duration::from_secs(60),
            listen_body_timeout: Duration::from_secs(30),
            telemetry: TelemetryConfig::default(),
            cors: None,
        }
    }
}

/// `idempotency: null` is `idempotency: {}`.
fn nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Pending<WrittenPolicy>, D::Error> {
    Ok(Pending(Some(Option::deserialize(d)?.unwrap_or_default())))
}

/// `idempotency` as `--check` prints it: every key.
fn print_idempotency<S: Serializer>(policy: &Policy, s: S) -> Result<S::Ok, S::Error> {
    let printed = Printed {
        path: None,
        policy,
        base: None,
    };
    printed.serialize(s)
}

/// `routes` may be left out, not written empty.
fn given_routes<'de, D: Deserializer<'de>>(d: D) -> Result<Pending<Vec<WrittenRoute>>, D::Error> {
    given(d).map(Pending)
}

/// The whole file: a mapping of keys, or nothing at all (an empty file, or one of
/// comments only, is a configuration with every key at its default).
pub(crate) struct File(pub(crate) Config);

impl<'de> Deserialize<'de> for File {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FileVisitor;
        impl<'de> Visitor<'de> for FileVisitor {
            type Value = File;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a mapping of configuration keys")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<File, A::Error> {
                Config::deserialize(MapAccessDeserializer::new(map)).map(File)
            }
            fn visit_unit<E: de::Error>(self) -> Result<File, E> {
                Ok(File(Config::default()))
            }
            fn visit_none<E: de::Error>(self) -> Result<File, E> {
                Ok(File(Config::default()))
            }
        }
        d.deserialize_any(FileVisitor)
    }
}

impl Config {
    /// The configuration as read, with the rules that span keys applied: the store's
    /// keys merged, `idempotency` and each route on top of it checked, and each
    /// section's own checks.
    pub(crate) fn build(mut self) -> Result<Config, ConfigError> {
        let idempotency = self.written_idempotency.take().unwrap_or_default();
        idempotency.check_spelling("idempotency")?;
        self.idempotency = idempotency.policy();
        self.idempotency.check("idempotency")?;
        let written = self.written_routes.take().unwrap_or_default();
        self.routes = routes::build(written, &self.idempotency, self.escaped_slashes)?;
        self.upstream.check()?;
        self.store = self.store.build()?;
        self.errors.check()?;
        self.telemetry.check()?;
        if let Some(cors) = &self.cors {
            cors.check()?;
        }
        Ok(self)
    }

    /// The configuration of `idemgate --upstream URL [--listen ADDR]`.
    pub(crate) fn with_upstream(url: http::Uri, listen: Option<SocketAddr>) -> Config {
        let defaults = Config::default();
        Config {
            listen: listen.unwrap_or(defaults.listen),
            upstream: UpstreamConfig {
                url,
                ..UpstreamConfig::default()
            },
            ..defaults
        }
    }

    /// Every policy: `idempotency`, then each route's.
    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        std::iter::once(&self.idempotency).chain(self.routes.iter().map(|r| &r.policy))
    }

    /// Whether any route (or the default policy) lets duplicates wait for the owner.
    pub fn uses_wait(&self) -> bool {
        std::iter::once(&self.idempotency)
            .chain(self.routes.iter().map(|r| &r.policy))
            .any(|p| p.on_concurrent == OnConcurrent::Wait)
    }

    /// The largest `max_response_body` of any policy: the most an operator's resolution
    /// of an unknown outcome may record (docs/behaviour.md §18), since a record id does
    /// not say which policy wrote it.
    pub fn largest_response_body(&self) -> u64 {
        self.routes
            .iter()
            .map(|route| route.policy.max_response_body)
            .fold(self.idempotency.max_response_body, u64::max)
    }

    /// Index of the first route (file order) whose prefix matches `path` segment-wise;
    /// `None` means the top-level `idempotency` policy applies.
    ///
    /// `/charges` matches `/charges` and `/charges/42` but never `/chargesX`; `/`
    /// matches every path. A query string, if one is passed, is ignored. Overlapping
    /// routes are allowed; a route listed after one that covers it never applies,
    /// exactly as "first match wins" says.
    pub fn route_index(&self, path: &str) -> Option<usize> {
        let path = path.split_once('?').map_or(path, |(path, _query)| path);
        self.routes
            .iter()
            .position(|route| routes::prefix_matches(&route.path, path, self.route_match))
    }
}

/// `workers`: each worker is one thread with its own runtime, listener socket
/// (`SO_REUSEPORT`), upstream connections and Redis connection, so a request is served
/// start to end on one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One per CPU the process may use (its affinity and cgroup quota included).
    Auto,
    Count(std::num::NonZeroUsize),
    /// One multi-threaded runtime (a thread per CPU) whose threads take each other's
    /// work, on one listener, one upstream pool and one Redis connection.
    Shared,
}

impl Workers {
    /// The most workers a configuration may ask for.
    pub const MAX: usize = 1024;

    /// How many workers own connections: 1 when `shared`, as one runtime owns them all.
    /// `auto` is counted once per process, so that the listeners, the upstream pools
    /// (made again by a reload) and the Redis connections always agree.
    pub fn resolve(self) -> usize {
        static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        match self {
            Workers::Auto => {
                *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
            }
            Workers::Count(n) => n.get(),
            Workers::Shared => 1,
        }
    }
}

/// `workers` as written: `auto`, `shared`, or a count from 1 to [`Workers::MAX`].
struct WorkerCount(Workers);

impl<'de> Deserialize<'de> for WorkerCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "auto, shared or a number of workers";
        let workers = match Scalar::read(d, EXPECTING)? {
            Scalar::Str(text) if text.trim() == "auto" => Some(Workers::Auto),
            Scalar::Str(text) if text.trim() == "shared" => Some(Workers::Shared),
            other => usize::try_from(other.into_u64::<D::Error>(EXPECTING)?)
                .ok()
                .filter(|n| *n <= Workers::MAX)
                .and_then(std::num::NonZeroUsize::new)
                .map(Workers::Count),
        };
        workers.map(WorkerCount).ok_or_else(|| {
            de::Error::custom(format!(
                "must be auto, shared, or between 1 and {}",
                Workers::MAX
            ))
        })
    }
}

fn workers<S: Serializer>(workers: &Workers, s: S) -> Result<S::Ok, S::Error> {
    match workers {
        Workers::Auto => s.serialize_str("auto"),
        Workers::Count(n) => s.serialize_u64(n.get() as u64),
        Workers::Shared => s.serialize_str("shared"),
    }
}

/// `upgrades`: protocol names (RFC 9110 tokens), lower-cased; `h2c` is dropped from the
/// list in force (never one of the protocols: RFC 9113 deprecates it, and a joined h2c
/// connection would carry every later request past the guard), and so is a name listed
/// twice, so that `--check` prints what is in force.
struct Upgrades(Vec<String>);

impl<'de> Deserialize<'de> for Upgrades {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut upgrades = Vec::new();
        for Upgrade(name) in Vec::<Upgrade>::deserialize(d)? {
            let is_h2c = name == "h2c" || name.starts_with("h2c/");
            if !is_h2c && !upgrades.contains(&name) {
                upgrades.push(name);
            }
        }
        Ok(Upgrades(upgrades))
    }
}

struct Upgrade(String);

impl<'de> Deserialize<'de> for Upgrade {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Text(name) = Text::deserialize(d)?;
        let name = name.trim().to_ascii_lowercase();
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~/".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            return Err(de::Error::custom(format!(
                "'{name}' is not a protocol name such as websocket"
            )));
        }
        Ok(Upgrade(name))
    }
}

forms! {
    WorkerCount => Workers, workers;
    Upgrades => Vec<String>, |names: &Vec<String>, s: S| s.collect_seq(names.iter().map(Shown::<Text>));
}

impl Choice for EscapedSlashes {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("reject", EscapedSlashes::Reject),
        ("decode", EscapedSlashes::Decode),
        ("keep", EscapedSlashes::Keep),
    ];
}

/// What a SIGHUP reload does with a changed key (docs/behaviour.md §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// Requests that start after the reload get the new value.
    Applies,
    /// The running proxy was built with it (listeners, store, accept loop): a file that
    /// changes it is refused, and the running configuration stays in force.
    Restart,
}

/// One line of [`RELOAD`]: a top-level key, or a key of a section whose keys differ.
#[derive(Debug, Clone, Copy)]
pub struct ReloadKey {
    /// As an operator writes it: `max_connections`, `admin.listen`.
    pub name: &'static str,
    pub reload: Reload,
    same: fn(&Config, &Config) -> bool,
}

impl ReloadKey {
    /// Whether `new` holds another value of this key than `running`.
    pub fn changed(&self, running: &Config, new: &Config) -> bool {
        !(self.same)(running, new)
    }
}

/// A line of [`RELOAD`] per key: `class: key.sub` compares `config.key.sub`.
macro_rules! reload {
    ($($class:ident: $key:ident $(. $sub:ident)?;)*) => {
        &[$(ReloadKey {
            name: concat!(stringify!($key) $(, ".", stringify!($sub))?),
            reload: Reload::$class,
            same: |a, b| a.$key $(.$sub)? == b.$key $(.$sub)?,
        },)*]
    };
}

/// Every top-level key and section, and the keys of a section whose keys differ, with
/// what a reload does with a change of it, in the order of the file.
pub const RELOAD: &[ReloadKey] = reload! {
    Restart: listen;
    Applies: upstream;
    Restart: store;
    Applies: idempotency;
    Applies: routes;
    // The admin listener is bound at start-up; the token is read per request.
    Restart: admin.listen;
    Applies: admin.token;
    // The log format is chosen at start-up; the level is a filter reloaded in place.
    Restart: log.format;
    Applies: log.level;
    Applies: shutdown_timeout;
    Applies: route_match;
    Restart: listen_header_timeout;
    Restart: max_connections;
    Restart: workers;
    Restart: max_buffered_bytes;
    Restart: errors;
    Applies: escaped_slashes;
    Applies: upgrades;
    Restart: listen_idle_timeout;
    Applies: listen_body_timeout;
    Applies: telemetry;
    Applies: cors;
};
