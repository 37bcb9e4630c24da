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

use super::render::Mapping;
use http::{HeaderValue, Uri};
use serde::{Deserialize, Deserializer};

use super::render::{choice, duration, header_value, text, upstream_url};
use super::sentinel::RawSentinel;
use super::tls::{self, RawTls, UpstreamTls};
use super::values::{
    Addr, ContentType, Count, Dur, Flag, LogLevel, Null, Pick, Raw, Text, UpstreamUrl, given, null,
};
use super::{ErrorFormat, LogFormat, OnUnavailable, StoreKind};

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
            /// The defaults of the configuration file (docs/behaviour.md §6).
            fn default() -> Self {
                $name {
                    $($key: $default,)*
                }
            }
        }

        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, expecting = $expecting)]
        pub(super) struct $raw_name {
            $(
                #[serde(default, deserialize_with = "given")]
                pub(super) $key: Option<$raw>,
            )*
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
        expecting "a mapping with url, connect_timeout, timeout, tls"
    {
        /// `http://` or `https://`; scheme + authority (+ optional base path, which is
        /// prefixed to request paths).
        ///
        /// The authority is kept as written: no port means 80, or 443 for `https://`
        /// (`port_u16()` is `None`).
        /// A trailing `/` of the base path is removed, so the path is `/` or `/base`.
        /// The default is a sidecar's neighbour, http://127.0.0.1:9000
        /// (docs/behaviour.md §6).
        url: Uri = Uri::from_static("http://127.0.0.1:9000/"),
            from UpstreamUrl, show upstream_url;
        connect_timeout: Duration = Duration::from_secs(2), from Dur, show duration;
        /// The whole upstream exchange.
        timeout: Duration = Duration::from_secs(30), from Dur, show duration;
        /// Extra trust anchors and a client certificate for an `https://` URL, already
        /// read and parsed (docs/behaviour.md §11).
        tls: Option<UpstreamTls> = None, from RawTls, show tls::render;
    }

    pub struct ErrorsConfig, read as RawErrors
        expecting "a mapping with format, template, content_type"
    {
        /// `problem` (problem+json) or `template`.
        format: ErrorFormat = ErrorFormat::Problem, from Pick<ErrorFormat>, show choice;
        /// The body of every answer idemgate makes itself under `format: template`, with
        /// `{slug}`, `{type}`, `{title}`, `{status}` and `{detail}` filled in.
        template: String = String::new(), from Text, show text;
        /// The `Content-Type` of those answers under `format: template`.
        content_type: HeaderValue = HeaderValue::from_static("application/json"),
            from ContentType, show header_value;
    }

    pub struct LogConfig, read as RawLog expecting "a mapping with format, level" {
        format: LogFormat = LogFormat::Text, from Pick<LogFormat>, show choice;
        /// A level (stored lower-case) or `EnvFilter`-style directives such as
        /// `info,idemgate=debug`.
        level: String = "info".to_owned(), from LogLevel, show text;
    }
}

impl ErrorsConfig {
    /// The template with `{slug}`, `{type}`, `{title}`, `{status}` and `{detail}`
    /// replaced: strings JSON-escaped without quotes (the template writes `"{detail}"`),
    /// the status as a bare number. One pass, so a value is never filled in again.
    pub fn fill(
        &self,
        slug: &str,
        type_uri: &str,
        title: &str,
        status: u16,
        detail: &str,
    ) -> String {
        let mut out = String::with_capacity(self.template.len() + detail.len());
        let mut rest = self.template.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let tail = &rest[open..];
            let value = [
                ("{slug}", escaped(slug)),
                ("{type}", escaped(type_uri)),
                ("{title}", escaped(title)),
                ("{status}", status.to_string()),
                ("{detail}", escaped(detail)),
            ]
            .into_iter()
            .find(|(name, _)| tail.starts_with(name));
            match value {
                Some((name, value)) => {
                    out.push_str(&value);
                    rest = &tail[name.len()..];
                }
                None => {
                    out.push('{');
                    rest = &tail[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// A JSON string's contents, without the quotes.
fn escaped(value: &str) -> String {
    let quoted = serde_json::Value::from(value).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::parse_upstream_url;

    #[test]
    fn a_template_is_filled_in_once_with_escaped_strings() {
        let errors = ErrorsConfig {
            template:
                r#"{"error":{"code":"{slug}","status":{status},"message":"{detail}","x":"{nope}"}}"#
                    .to_owned(),
            ..ErrorsConfig::default()
        };
        let filled = errors.fill("in-flight", "t", "T", 409, "say \"{slug}\"\n");
        assert_eq!(
            filled,
            r#"{"error":{"code":"in-flight","status":409,"message":"say \"{slug}\"\n","x":"{nope}"}}"#
        );
        let json: serde_json::Value = serde_json::from_str(&filled).expect("valid JSON");
        assert_eq!(json["error"]["message"], "say \"{slug}\"\n");
    }

    /// `--check` prints the default URL, which must parse back to the same value.
    #[test]
    fn the_default_upstream_is_what_parsing_it_gives() {
        assert_eq!(
            parse_upstream_url("http://127.0.0.1:9000"),
            Ok(UpstreamConfig::default().url)
        );
    }
}

null! {
    refused:;
    default: RawUpstream, RawErrors, RawLog, RawStore, RawAdmin,
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
