//! `key_format` (docs/behaviour.md §18): a name (`any`, `uuid`, `uuidv4`, `uuidv7`) or
//! `{regex: '...'}`, checked while it is deserialized so that an error names its path
//! (`routes[1].key_format`), and its printing for `--check`.
//!
//! A regex is compiled here, once, when the configuration loads: one that does not
//! compile, or that matches the empty string, is a configuration error at start, under
//! `--check` and on a reload alike.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};

use crate::config::types::{Form, Shown, Text};
use crate::idempotency::format::{KeyFormat, KeyPattern};

/// `key_format` as written.
pub(crate) struct KeyFormatForm(KeyFormat);

impl Form for KeyFormatForm {
    type Value = KeyFormat;
    fn value(self) -> KeyFormat {
        self.0
    }
    /// A name, or `{regex: '...'}`, as the file writes it.
    fn print<S: Serializer>(format: &KeyFormat, s: S) -> Result<S::Ok, S::Error> {
        if let KeyFormat::Regex(pattern) = format {
            let mut map = s.serialize_map(Some(1))?;
            map.serialize_entry("regex", &Shown::<Text>(&pattern.as_str().to_owned()))?;
            return map.end();
        }
        let name = format.name();
        s.serialize_str(name.expect("every key format but a regex has a name"))
    }
}

const EXPECTING: &str = "one of any, uuid, uuidv4, uuidv7, or {regex: '...'}";

impl<'de> Deserialize<'de> for KeyFormatForm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FormatVisitor).map(KeyFormatForm)
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
