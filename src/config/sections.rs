//! The sections whose keys stand on their own, each key declared once.
//!
//! One entry per key, as in [`policy`](super::policy):
//!
//! ```text
//! /// doc comment
//! key: TypedType = default, from RawType, show render_fn;
//! ```
//!
//! generates the field of the typed section (with the doc comment) and its `Default`,
//! the field of the raw section (`deny_unknown_fields`, every key optional, the value
//! parsed by `RawType` so that an error names its path), the conversion of the raw
//! section into the typed one ([`Raw`]), and the printing for `--check`.
//!
//! A section whose keys depend on each other (`store`: `url` and `urls` merge, and
//! `cluster` changes what a URL may hold) or that tells `null` from absent (`admin`)
//! is written out by hand in `raw`, `validate` and `render` instead.

use std::time::Duration;

use http::Uri;
use serde::Deserialize;
use serde_yaml::Mapping;

use super::LogFormat;
use super::render::{choice, duration, text, upstream_url};
use super::values::{Dur, LogLevel, Pick, Raw, UpstreamUrl};

/// Generates a typed section, its `Default`, its raw form, the conversion from one to
/// the other and the printing from one declaration per key.
macro_rules! section {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident, read as $raw_name:ident expecting $expecting:literal {$(
            $(#[$doc:meta])*
            $key:ident: $ty:ty = $default:expr, from $raw:ty, show $show:path;
        )*}
    )*) => {$(
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct $name {
            $($(#[$doc])* pub $key: $ty,)*
        }

        impl Default for $name {
            /// The SPEC §6 defaults.
            fn default() -> Self {
                $name {
                    $($key: $default,)*
                }
            }
        }

        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, expecting = $expecting)]
        pub(super) struct $raw_name {
            $(pub(super) $key: Option<$raw>,)*
        }

        impl Raw for $raw_name {
            type Typed = $name;

            /// The defaults, with the keys written here replaced.
            fn typed(self) -> $name {
                let mut section = $name::default();
                $(if let Some(value) = self.$key {
                    section.$key = value.typed();
                })*
                section
            }
        }

        impl $name {
            /// Every key, defaults included.
            pub(super) fn to_mapping(&self) -> Mapping {
                let mut map = Mapping::new();
                $(map.insert(stringify!($key).into(), $show(&self.$key));)*
                map
            }
        }
    )*};
}

section! {
    pub struct UpstreamConfig, read as RawUpstream
        expecting "a mapping with url, connect_timeout, timeout"
    {
        /// http:// only; scheme + authority (+ optional base path, which is prefixed to
        /// request paths).
        ///
        /// The authority is kept as written: no port means 80 (`port_u16()` is `None`).
        /// A trailing `/` of the base path is removed, so the path is `/` or `/base`.
        /// The default is a sidecar's neighbour: SPEC §6 lists http://127.0.0.1:9000.
        url: Uri = Uri::from_static("http://127.0.0.1:9000/"),
            from UpstreamUrl, show upstream_url;
        connect_timeout: Duration = Duration::from_secs(2), from Dur, show duration;
        /// The whole upstream exchange.
        timeout: Duration = Duration::from_secs(30), from Dur, show duration;
    }

    pub struct LogConfig, read as RawLog expecting "a mapping with format, level" {
        format: LogFormat = LogFormat::Text, from Pick<LogFormat>, show choice;
        /// A level (stored lower-case) or `EnvFilter`-style directives such as
        /// `info,idemgate=debug`.
        level: String = "info".to_owned(), from LogLevel, show text;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::parse_upstream_url;

    /// `--check` prints the default URL, which must parse back to the same value.
    #[test]
    fn the_default_upstream_is_what_parsing_it_gives() {
        assert_eq!(
            parse_upstream_url("http://127.0.0.1:9000"),
            Ok(UpstreamConfig::default().url)
        );
    }
}
