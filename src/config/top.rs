//! The top-level keys of the configuration file, each declared once.
//!
//! A top-level key that stands on its own is one entry of `keys` below, as a policy key
//! is in [`policy`](super::policy):
//!
//! ```text
//! /// doc comment
//! key: TypedType = default, from RawType, via check, show render_fn, reload applies;
//! ```
//!
//! - the field of [`Config`] (with the doc comment);
//! - the field of [`RawConfig`] (`deny_unknown_fields`, every key optional): `RawType`
//!   parses the value while deserializing, so that an error names its path, and
//!   `check(raw, "key")` turns it into `TypedType` or refuses it ([`typed`] when any
//!   value `RawType` parses is good); an absent key is `default`;
//! - the printing for `--check` ([`Config::keys_to_mapping`]), where `render_fn` takes
//!   `&TypedType`;
//! - its line of [`RELOAD`]: whether a SIGHUP reload applies a change of it or refuses
//!   it as needing a restart (docs/behaviour.md §14).
//!
//! The sections (`sections` below) are built and printed by their own code, in
//! `validate` and `render`, since their keys depend on each other or on other keys
//! (`routes` on `idempotency` and `escaped_slashes`); here they declare their field, raw
//! form and reload class, either for the whole section or key by key, so that a new
//! section cannot be left out of [`RELOAD`] either.
//!
//! The order of the keys is that of `--check` and of the error messages that list the
//! keys; the checks of the keys run in this order, after those of the sections.

use std::net::SocketAddr;
use std::time::Duration;

use super::render::Mapping;
use serde::Deserialize;

use super::checks::{at_least_one, build_errors, build_upgrades, build_workers};
use super::policy::{RawPolicy, RawRoute};
use super::render::{choice, count, duration, errors, size, strings, workers};
use super::sections::telemetry::{self, TelemetryConfig};
use super::values::{Addr, Count, Dur, Pick, Raw, Size, Text, WorkerCount, given};
use super::{
    AdminConfig, ConfigError, ErrorsConfig, EscapedSlashes, LogConfig, Policy, Route, RouteMatch,
    StoreConfig, UpstreamConfig, Workers,
};

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

/// `applies` or `restart`, as the declarations below write them.
macro_rules! reload_class {
    (applies) => {
        Reload::Applies
    };
    (restart) => {
        Reload::Restart
    };
}

/// Generates [`Config`], [`RawConfig`], the building of the keys, their printing and
/// [`RELOAD`] from one declaration per top-level key (or section).
macro_rules! top_level {
    (
        sections {$(
            $(#[$section_doc:meta])*
            $section:ident: $section_ty:ty, from $section_raw:ty, reload
                $($whole:ident)? $({$($sub:ident: $sub_reload:ident),* $(,)?})?;
        )*}
        keys {$(
            $(#[$doc:meta])*
            $key:ident: $ty:ty = $default:expr, from $raw:ty, via $check:path,
                show $show:path, reload $reload:ident;
        )*}
    ) => {
        /// The configuration in force: typed, validated, defaults applied.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config {
            $($(#[$section_doc])* pub $section: $section_ty,)*
            $($(#[$doc])* pub $key: $ty,)*
        }

        /// The file as written.
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, expecting = "a mapping of configuration keys")]
        pub(super) struct RawConfig {
            $(
                #[serde(default, deserialize_with = "given")]
                pub(super) $section: Option<$section_raw>,
            )*
            $(
                #[serde(default, deserialize_with = "given")]
                pub(super) $key: Option<$raw>,
            )*
        }

        /// The sections as written, for the caller of [`RawConfig::build`] to build.
        pub(super) struct RawSections {
            $(pub(super) $section: Option<$section_raw>,)*
        }

        /// The sections, built.
        pub(super) struct Sections {
            $(pub(super) $section: $section_ty,)*
        }

        /// The keys, built: what the sections may depend on.
        pub(super) struct Keys {
            $(pub(super) $key: $ty,)*
        }

        impl RawConfig {
            /// The configuration: the keys checked in order, and the sections built by
            /// `sections`, which sees the keys.
            ///
            /// The first error of a section is reported before that of a key, as an
            /// operator reads the file: a refused key is at its default until the
            /// sections are built, and its error is returned after theirs.
            pub(super) fn build(
                self,
                sections: impl FnOnce(RawSections, &Keys) -> Result<Sections, ConfigError>,
            ) -> Result<Config, ConfigError> {
                let mut refused = None;
                let keys = Keys {
                    $($key: match self.$key {
                        None => $default,
                        Some(raw) => $check(raw, stringify!($key)).unwrap_or_else(|err| {
                            refused.get_or_insert(err);
                            $default
                        }),
                    },)*
                };
                let raw = RawSections { $($section: self.$section,)* };
                let Sections { $($section,)* } = sections(raw, &keys)?;
                if let Some(err) = refused {
                    return Err(err);
                }
                let Keys { $($key,)* } = keys;
                Ok(Config { $($section,)* $($key,)* })
            }
        }

        impl Config {
            /// The keys (not the sections), defaults included, in order.
            pub(super) fn keys_to_mapping(&self) -> Mapping {
                let mut map = Mapping::new();
                $(map.insert(stringify!($key).into(), $show(&self.$key));)*
                map
            }
        }

        /// Every top-level key and section, and the keys of a section whose keys
        /// differ, with what a reload does with a change of it (docs/behaviour.md §14).
        pub const RELOAD: &[ReloadKey] = &[
            $(
                $(ReloadKey {
                    name: stringify!($section),
                    reload: reload_class!($whole),
                    same: |a, b| a.$section == b.$section,
                },)?
                $($(ReloadKey {
                    name: concat!(stringify!($section), ".", stringify!($sub)),
                    reload: reload_class!($sub_reload),
                    same: |a, b| a.$section.$sub == b.$section.$sub,
                },)*)?
            )*
            $(ReloadKey {
                name: stringify!($key),
                reload: reload_class!($reload),
                same: |a, b| a.$key == b.$key,
            },)*
        ];
    };
}

top_level! {
    sections {
        /// The proxy's address; `--listen` overrides it.
        listen: SocketAddr, from Addr, reload restart;
        upstream: UpstreamConfig, from UpstreamConfig, reload applies;
        store: StoreConfig, from StoreConfig, reload restart;
        /// The top-level `idempotency` section, as the default policy.
        idempotency: Policy, from RawPolicy, reload applies;
        /// Routes in file order; each carries its fully merged effective policy.
        routes: Vec<Route>, from Vec<RawRoute>, reload applies;
        /// The admin listener is bound at start-up; the token is read per request.
        admin: AdminConfig, from AdminConfig, reload { listen: restart, token: applies };
        /// The log format is chosen at start-up; the level is a filter reloaded in place.
        log: LogConfig, from LogConfig, reload { format: restart, level: applies };
    }
    keys {
        /// How long in-flight work gets after SIGTERM.
        shutdown_timeout: Duration = Duration::from_secs(30), from Dur, via typed,
            show duration, reload applies;
        /// How route prefixes compare with request paths (docs/behaviour.md §15).
        route_match: RouteMatch = RouteMatch::Exact, from Pick<RouteMatch>, via typed,
            show choice, reload applies;
        /// A connection that sends no complete request head this long is closed, before
        /// its protocol is known too; on the admin listener as well.
        listen_header_timeout: Duration = Duration::from_secs(30), from Dur, via typed,
            show duration, reload restart;
        /// Open client connections at most; past it new ones wait in the listen backlog.
        max_connections: usize = 10_000, from Count, via at_least_one,
            show count, reload restart;
        /// How many single-threaded workers serve the listener (`auto`: one per CPU).
        workers: Workers = Workers::Auto, from WorkerCount, via build_workers,
            show workers, reload restart;
        /// Request and response bodies held in memory at once, across all requests.
        max_buffered_bytes: u64 = 256 << 20, from Size, via typed,
            show size, reload restart;
        /// The shape of the answers idemgate makes itself (docs/behaviour.md §16).
        errors: ErrorsConfig = ErrorsConfig::default(), from ErrorsConfig, via build_errors,
            show errors, reload restart;
        /// What becomes of `%2F`, `%5C` and `\` in request paths.
        escaped_slashes: EscapedSlashes = EscapedSlashes::Reject,
            from Pick<EscapedSlashes>, via typed, show choice, reload applies;
        /// The protocols a passed-through request may upgrade to, lower-cased; `h2c` is
        /// never one of them.
        upgrades: Vec<String> = vec!["websocket".to_owned()],
            from Vec<Text>, via build_upgrades, show strings, reload applies;
        /// A client connection with no request open this long is closed (`GOAWAY` on
        /// HTTP/2).
        listen_idle_timeout: Duration = Duration::from_secs(60), from Dur, via typed,
            show duration, reload restart;
        /// A guarded request body that sends no byte this long is answered `408`.
        listen_body_timeout: Duration = Duration::from_secs(30), from Dur, via typed,
            show duration, reload applies;
        /// Where traces go (docs/behaviour.md §20): no exporter by default.
        telemetry: TelemetryConfig = TelemetryConfig::default(), from TelemetryConfig,
            via checked_telemetry, show telemetry::render, reload applies;
    }
}

/// The check of a key any value of whose raw type is good.
fn typed<R: Raw>(raw: R, _key: &str) -> Result<R::Typed, ConfigError> {
    Ok(raw.typed())
}

fn checked_telemetry(
    telemetry: TelemetryConfig,
    _key: &str,
) -> Result<TelemetryConfig, ConfigError> {
    telemetry.check()?;
    Ok(telemetry)
}
