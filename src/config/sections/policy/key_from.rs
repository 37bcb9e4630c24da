//! `key_from` (docs/behaviour.md §9): where a request's key comes from, in order.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde::ser::{SerializeMap, Serializer};

use crate::config::types::http::{Header, Pointer};
use crate::config::types::units::{Dur, duration};
use crate::config::types::{Form, Scalar, Shown, Text, forms};
use crate::idempotency::source::KeySource;

/// `key_from` (docs/behaviour.md §9): a non-empty list of sources, `fingerprint` only as
/// the last.
pub(crate) struct KeyFrom(Vec<KeySource>);

impl<'de> Deserialize<'de> for KeyFrom {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let sources: Vec<KeySource> = Vec::<Source>::deserialize(d)?
            .into_iter()
            .map(|source| source.0)
            .collect();
        if sources.is_empty() {
            return Err(de::Error::custom(
                "must not be empty; list where the key comes from, \
                 e.g. [{header: Idempotency-Key}]",
            ));
        }
        let last = sources.len() - 1;
        if let Some(at) = sources
            .iter()
            .position(|source| matches!(source, KeySource::Fingerprint(_)))
            .filter(|at| *at < last)
        {
            return Err(de::Error::custom(format!(
                "fingerprint (entry {at}) must be the last source: it is always present, \
                 so no source after it would ever be tried"
            )));
        }
        Ok(KeyFrom(sources))
    }
}

/// One `key_from` entry: a mapping with exactly one of its four keys.
struct Source(KeySource);

const SOURCE_KINDS: &[&str] = &["header", "query", "json", "fingerprint"];

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(SourceVisitor)
    }
}

struct SourceVisitor;

impl<'de> Visitor<'de> for SourceVisitor {
    type Value = Source;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a mapping with one of header, query, json, fingerprint, \
             such as {header: X-Request-Id}",
        )
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Source, A::Error> {
        let Some(kind) = map.next_key::<String>()? else {
            return Err(de::Error::custom(
                "is empty; each entry has exactly one of header, query, json, fingerprint",
            ));
        };
        let source = match kind.as_str() {
            "header" => KeySource::Header(map.next_value::<Header>()?.value()),
            "query" => KeySource::Query(map.next_value::<QueryName>()?.0),
            "json" => KeySource::Json(map.next_value::<Pointer>()?.value()),
            "fingerprint" => KeySource::Fingerprint(map.next_value::<Dur>()?.value()),
            other => return Err(de::Error::unknown_field(other, SOURCE_KINDS)),
        };
        if let Some(extra) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!(
                "has both {kind} and {extra}; each entry has exactly one of header, query, \
                 json, fingerprint"
            )));
        }
        Ok(Source(source))
    }
}

/// A query parameter name, compared with each parameter's decoded name.
struct QueryName(String);

impl<'de> Deserialize<'de> for QueryName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a query parameter name such as request_id";
        let name = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        if name.is_empty() {
            return Err(de::Error::custom(
                "must not be empty; expected a query parameter name such as request_id",
            ));
        }
        Ok(QueryName(name))
    }
}

/// `key_from` entries, each a one-key mapping as written.
fn print<S: Serializer>(sources: &[KeySource], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(sources.iter().map(Entry))
}

struct Entry<'a>(&'a KeySource);

impl serde::Serialize for Entry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        match self.0 {
            KeySource::Header(name) => map.serialize_entry("header", &Shown::<Header>(name))?,
            KeySource::Query(name) => map.serialize_entry("query", &Shown::<Text>(name))?,
            KeySource::Json(pointer) => map.serialize_entry("json", &Shown::<Pointer>(pointer))?,
            KeySource::Fingerprint(window) => {
                map.serialize_entry("fingerprint", &Window(window))?;
            }
        }
        map.end()
    }
}

struct Window<'a>(&'a std::time::Duration);

impl serde::Serialize for Window<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        duration(self.0, s)
    }
}

forms! {
    KeyFrom => Vec<KeySource>, print;
}
