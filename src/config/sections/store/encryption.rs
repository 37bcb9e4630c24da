//! `store.encryption` (docs/behaviour.md §17): the keys that seal stored responses. The
//! first key seals every record written from then on; every listed key opens, so a key
//! is rotated by listing a new one first and dropping the old one once its records have
//! expired.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::types::secret::MASK;
use crate::config::types::{Opt, Text, given};

/// Key material: 32 bytes, for AES-256-GCM.
pub(crate) const KEY_LEN: usize = 32;

/// One key of `store.encryption.keys`. Never printed: `Debug` and `--check` show `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct EncryptionKey {
    /// Stored beside every record it seals, so that the right key opens it.
    pub id: String,
    key: [u8; KEY_LEN],
}

impl EncryptionKey {
    pub fn new(id: String, key: [u8; KEY_LEN]) -> Self {
        Self { id, key }
    }

    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.key
    }
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptionKey({:?}, ***)", self.id)
    }
}

/// `encryption` as written: key texts, checked by [`build`] so that an error can name
/// a key by its `id`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping with keys")]
pub(crate) struct WrittenEncryption {
    #[serde(deserialize_with = "given")]
    keys: Option<Vec<WrittenKey>>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping with id and key")]
struct WrittenKey {
    #[serde(with = "Opt::<Text>")]
    id: Option<String>,
    #[serde(with = "Opt::<Text>")]
    key: Option<String>,
}

/// The most characters of an id: it is stored in every sealed record.
const MAX_ID_LEN: usize = 64;

/// The typed keys, each checked and named by its `id` in any error.
pub(crate) fn build(raw: Option<WrittenEncryption>) -> Result<Vec<EncryptionKey>, ConfigError> {
    let raw_keys = raw.and_then(|r| r.keys).unwrap_or_default();
    let mut keys: Vec<EncryptionKey> = Vec::with_capacity(raw_keys.len());
    for (i, raw) in raw_keys.into_iter().enumerate() {
        let at = format!("store.encryption.keys[{i}]");
        let id = raw.id.unwrap_or_default();
        if id.is_empty() || id.len() > MAX_ID_LEN || !id.chars().all(|c| c.is_ascii_graphic()) {
            return Err(ConfigError::invalid(
                format!("{at}.id"),
                format!(
                    "must be 1 to {MAX_ID_LEN} visible ASCII characters without spaces \
                     (it is stored with every record the key seals), e.g. 2026-12"
                ),
            ));
        }
        if keys.iter().any(|k| k.id == id) {
            return Err(ConfigError::invalid(
                format!("{at}.id"),
                format!("'{id}' is listed twice; every key needs an id of its own"),
            ));
        }
        let named = format!("{at}.key (id '{id}')");
        let text = raw.key.unwrap_or_default();
        if text == MASK {
            return Err(ConfigError::invalid(
                named,
                "is '***', what --check prints in place of the key; write the key \
                 itself, e.g. ${IDEMGATE_ENCRYPTION_KEY}",
            ));
        }
        let key = STANDARD
            .decode(text.trim())
            .ok()
            .and_then(|bytes| <[u8; KEY_LEN]>::try_from(bytes).ok())
            .ok_or_else(|| {
                ConfigError::invalid(
                    named,
                    format!(
                        "must be {KEY_LEN} bytes in base64 (44 characters), e.g. from \
                         `openssl rand -base64 32`"
                    ),
                )
            })?;
        keys.push(EncryptionKey::new(id, key));
    }
    Ok(keys)
}

/// The paths `--check` masks, for the notice that opens its output.
pub(crate) fn masked(keys: &[EncryptionKey]) -> impl Iterator<Item = String> + '_ {
    (0..keys.len()).map(|i| format!("store.encryption.keys[{i}].key"))
}
