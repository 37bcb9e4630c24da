//! `key_format` (docs/behaviour.md §18): a name (`any`, `uuid`, `uuidv4`, `uuidv7`) or
//! `{regex: '...'}`, checked while it is deserialized so that an error names its path
//! (`routes[1].key_format`), and its printing for `--check`.
//!
//! A regex is compiled here, once, when the configuration loads: one that does not
//! compile, or that matches the empty string, is a configuration error at start, under
//! `--check` and on a reload alike.

use std::fmt;

use crate::config::render::{Mapping, Value};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::config::values::{Raw, Text};
use crate::idempotency::format::{KeyFormat, KeyPattern};

/// `key_format` as written.
#[derive(Debug, Clone)]
pub(crate) struct RawKeyFormat(KeyFormat);

impl Raw for RawKeyFormat {
    type Typed = KeyFormat;
    fn typed(self) -> KeyFormat {
        self.0
    }
}

const EXPECTING: &str = "one of any, uuid, uuidv4, uuidv7, or {regex: '...'}";

impl<'de> Deserialize<'de> for RawKeyFormat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FormatVisitor).map(RawKeyFormat)
    }
}

struct FormatVisitor;

impl<'de> Visitor<'de> for FormatVisitor {
    type Value = KeyFormat;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTING)
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<KeyFormat, E> {
        KeyFormat::NAMES
            .iter()
            .find(|(known, _)| *known == name.trim())
            .map(|(_, format)| format.clone())
            .ok_or_else(|| E::custom(format!("unknown variant '{name}', expected {EXPECTING}")))
    }

    /// `{regex: PATTERN}` and nothing else. The pattern is compiled once the mapping is
    /// read, so that its error is reported at `key_format` itself.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeyFormat, A::Error> {
        let mut pattern = None;
        while let Some(key) = map.next_key::<String>()? {
            if key != "regex" || pattern.is_some() {
                return Err(de::Error::custom(format!(
                    "unexpected key '{key}'; expected {EXPECTING}"
                )));
            }
            pattern = Some(map.next_value::<Text>()?.0);
        }
        let Some(pattern) = pattern else {
            return Err(de::Error::custom(format!("is empty; expected {EXPECTING}")));
        };
        KeyPattern::new(&pattern)
            .map(KeyFormat::Regex)
            .map_err(de::Error::custom)
    }
}

/// `key_format` as the file writes it.
pub(crate) fn show(format: &KeyFormat) -> Value {
    if let KeyFormat::Regex(pattern) = format {
        let mut map = Mapping::new();
        map.insert("regex".into(), pattern.as_str().into());
        return Value::Mapping(map);
    }
    Value::from(
        format
            .name()
            .expect("every key format but a regex has a name"),
    )
}
