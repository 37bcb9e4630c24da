//! The file store's keys (docs/behaviour.md §12): `path` and `fsync`.

use std::path::PathBuf;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::config::types::{Text, forms, text};

/// Where the file store lives unless `store.path` says otherwise.
pub(crate) const DEFAULT_PATH: &str = "/var/lib/idemgate";

/// `path`: a directory, not empty.
pub(crate) struct StorePath(PathBuf);

impl<'de> Deserialize<'de> for StorePath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Text(path) = Text::deserialize(d)?;
        if path.is_empty() {
            return Err(de::Error::custom(
                "must not be empty; give a directory such as /var/lib/idemgate",
            ));
        }
        Ok(StorePath(path.into()))
    }
}

forms! {
    StorePath => PathBuf, |path: &PathBuf, s: S| text(&path.to_string_lossy(), s);
}
