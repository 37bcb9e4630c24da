//! The file as written: serde structs that deny unknown keys, every key optional.
//!
//! Values that can be checked on their own (units, enums, addresses, header names)
//! are parsed by the types in `values` while deserializing, so that
//! `serde_path_to_error` attaches the full path (`routes[1].ttl`) to the error, and the
//! parser its line, without any bookkeeping of ours. Defaults and checks that involve several keys live in
//! `validate`. The raw forms of the whole file, of `idempotency`, `routes[]`, `upstream`,
//! `errors` and `log` are generated next to their typed forms, in `top`, `policy` and
//! `sections`.

use std::fmt;
use std::net::SocketAddr;

use http::Uri;
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::UpstreamConfig;
use super::top::RawConfig;
use super::values::Addr;

/// The whole file: a mapping of keys, or nothing at all (an empty file, or one of
/// comments only, is a configuration with every key at its default).
pub(super) struct File(pub(super) RawConfig);

impl<'de> Deserialize<'de> for File {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FileVisitor)
    }
}

struct FileVisitor;

impl<'de> Visitor<'de> for FileVisitor {
    type Value = File;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping of configuration keys")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<File, A::Error> {
        RawConfig::deserialize(MapAccessDeserializer::new(map)).map(File)
    }
    fn visit_unit<E: de::Error>(self) -> Result<File, E> {
        Ok(File(RawConfig::default()))
    }
    fn visit_none<E: de::Error>(self) -> Result<File, E> {
        Ok(File(RawConfig::default()))
    }
}

impl RawConfig {
    /// The configuration of `idemgate --upstream URL [--listen ADDR]`.
    pub(super) fn for_upstream(url: Uri, listen: Option<SocketAddr>) -> RawConfig {
        RawConfig {
            listen: listen.map(Addr),
            upstream: Some(UpstreamConfig {
                url,
                ..UpstreamConfig::default()
            }),
            ..RawConfig::default()
        }
    }
}
