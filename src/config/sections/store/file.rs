//! The file store's keys (docs/behaviour.md §12): `path` and `fsync`.

use std::path::PathBuf;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::config::values::{Text, raw_newtypes};

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

raw_newtypes! {
    StorePath => PathBuf,
}
