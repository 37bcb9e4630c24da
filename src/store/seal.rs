//! Encryption at rest (docs/behaviour.md §17): the keyring of `store.encryption`, which
//! seals a completed record's response before any store sees it and opens it again for
//! a replay. Sealing happens once, above the stores, so every store kind (memory, file,
//! Redis, Redis Cluster) keeps the same sealed bytes and none of them holds a key.
//!
//! AES-256-GCM from `ring` (already built for rustls), a fresh random 96-bit nonce per
//! record from the thread's CSPRNG, and the record's address as the associated data: a
//! sealed value copied under another key does not open. What stays readable is what the
//! admin API shows without a key: the fingerprint, the times, whether the body was kept,
//! and the id of the key that sealed it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rand::RngExt;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::config::EncryptionKey;
use crate::idempotency::record::{NONCE_LEN, OpenedOnce};
use crate::idempotency::{Completed, Kept, ScopedKey, Sealed, StoredResponse};

/// Every key of `store.encryption`; the first seals, all of them open.
pub struct Keyring {
    keys: Vec<(Arc<str>, LessSafeKey)>,
}

impl std::fmt::Debug for Keyring {
    /// Key ids only: the key material never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| &**id).collect();
        f.debug_struct("Keyring").field("ids", &ids).finish()
    }
}

/// Why a sealed record did not open. Either way it is never replayed (`503`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Undecryptable {
    #[error("sealed with key {0:?}, which store.encryption no longer lists")]
    UnknownKey(Arc<str>),
    #[error("sealed with key {0:?}, but it does not open with it (altered, or moved)")]
    Rejected(Arc<str>),
}

impl Undecryptable {
    /// The id of the key the record names.
    pub fn key_id(&self) -> &str {
        match self {
            Undecryptable::UnknownKey(id) | Undecryptable::Rejected(id) => id,
        }
    }
}

/// A record ready to be sent again: one kept in clear, or a sealed one whose response
/// has been opened and kept beside it.
#[derive(Debug, Clone)]
pub struct Opened(Arc<Completed>);

impl Opened {
    pub fn response(&self) -> &StoredResponse {
        match &self.0.kept {
            Kept::Clear(response) => response,
            Kept::Sealed(sealed) => sealed
                .opened
                .get()
                .expect("Opened holds a sealed record only once its response is kept"),
        }
    }
}

impl Keyring {
    /// `None` when `store.encryption` lists no key: records are kept in clear.
    pub fn new(keys: &[EncryptionKey]) -> Option<Self> {
        if keys.is_empty() {
            return None;
        }
        let keys = keys
            .iter()
            .map(|key| {
                let bound = UnboundKey::new(&AES_256_GCM, key.bytes())
                    .expect("store.encryption keys are checked to be 32 bytes when loaded");
                (Arc::<str>::from(key.id.as_str()), LessSafeKey::new(bound))
            })
            .collect();
        Some(Self { keys })
    }

    /// `record` with its response sealed under the first key, for `key`'s address. A
    /// record already sealed is returned as it is.
    pub fn seal(&self, key: &ScopedKey, record: Completed) -> Completed {
        let Kept::Clear(response) = &record.kept else {
            return record;
        };
        let (id, sealing) = &self.keys[0];
        let mut buf = BytesMut::with_capacity(response.encoded_len() + AES_256_GCM.tag_len());
        response.encode_into(&mut buf);
        let nonce: [u8; NONCE_LEN] = rand::rng().random();
        sealing
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(key)),
                &mut buf,
            )
            .expect("AES-GCM seals any record shorter than 64 GiB");
        let too_large = !record.replayable();
        Completed {
            fingerprint: record.fingerprint,
            kept: Kept::Sealed(Sealed {
                key_id: Arc::clone(id),
                too_large,
                nonce,
                ciphertext: buf.freeze(),
                opened: OpenedOnce::default(),
            }),
            times: record.times,
            unknown: record.unknown,
            streamed: record.streamed,
        }
    }

    /// The response of a record found under `key`. A clear record opens without a
    /// keyring, so records written before encryption was turned on still replay.
    ///
    /// A sealed record's response is kept beside it once opened: the memory and file
    /// stores hand out the same record to every replay, which then decrypts it once.
    /// That copy is in this process's memory only, where the keyring is too; Redis and
    /// the file store's journal hold only the sealed bytes.
    pub fn open(
        keyring: Option<&Self>,
        key: &ScopedKey,
        record: Arc<Completed>,
    ) -> Result<Opened, Undecryptable> {
        let sealed = match &record.kept {
            Kept::Clear(_) => return Ok(Opened(record)),
            Kept::Sealed(sealed) => sealed,
        };
        let opening = keyring
            .and_then(|ring| ring.keys.iter().find(|(id, _)| *id == sealed.key_id))
            .map(|(_, k)| k)
            .ok_or_else(|| Undecryptable::UnknownKey(Arc::clone(&sealed.key_id)))?;
        // Its key still listed, a record opened before opens as it did.
        if sealed.opened.get().is_some() {
            return Ok(Opened(record));
        }
        let rejected = || Undecryptable::Rejected(Arc::clone(&sealed.key_id));
        let mut buf = sealed.ciphertext.to_vec();
        let plain = opening
            .open_in_place(
                Nonce::assume_unique_for_key(sealed.nonce),
                Aad::from(aad(key)),
                &mut buf,
            )
            .map_err(|_| rejected())?;
        let len = plain.len();
        buf.truncate(len);
        let response =
            StoredResponse::decode(Bytes::from(buf), sealed.too_large).map_err(|_| rejected())?;
        sealed.opened.keep(response);
        Ok(Opened(record))
    }
}

/// The associated data: the record's address, with a label of its own so that it cannot
/// be mistaken for another use of the same bytes.
fn aad(key: &ScopedKey) -> [u8; 48] {
    let mut aad = [0u8; 48];
    aad[..16].copy_from_slice(b"idemgate-rec-v1\0");
    aad[16..].copy_from_slice(key.as_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::{Fingerprint, StoredBody, Times};
    use http::StatusCode;
    use http::header::{HeaderName, HeaderValue};

    fn key(id: &str, byte: u8) -> EncryptionKey {
        EncryptionKey::new(id.to_owned(), [byte; 32])
    }

    fn record() -> Completed {
        let mut rec = Completed::clear(
            Fingerprint::from_bytes([1; 32]),
            StatusCode::CREATED,
            vec![(
                HeaderName::from_static("x-card"),
                HeaderValue::from_static("4242"),
            )],
            StoredBody::Stored(Bytes::from_static(b"{\"secret\":\"MARKER-42\"}")),
        );
        rec.times = Some(Times {
            claimed_ms: 1,
            completed_ms: 2,
        });
        rec
    }

    fn address(byte: u8) -> ScopedKey {
        ScopedKey::from_bytes([byte; 32])
    }

    #[test]
    fn a_sealed_record_opens_to_its_response_and_hides_it_when_stored() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        let sealed = ring.seal(&address(3), record());
        let bytes = sealed.encode();
        assert!(
            !bytes.windows(9).any(|w| w == b"MARKER-42"),
            "the body is not in the stored bytes"
        );
        assert!(
            !bytes.windows(4).any(|w| w == b"4242"),
            "nor a header value"
        );
        assert_eq!(sealed.times, record().times);
        assert_eq!(sealed.fingerprint, record().fingerprint);
        let opened = Keyring::open(Some(&ring), &address(3), Arc::new(sealed)).expect("opens");
        assert_eq!(Some(opened.response()), record().clear_response());
    }

    /// A record that stays in memory is decrypted once: its replays after the first
    /// read the response kept beside it, which is neither encoded nor compared.
    #[test]
    fn a_record_is_opened_once_and_the_opened_copy_is_not_part_of_it() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        let sealed = Arc::new(ring.seal(&address(3), record()));
        let before = sealed.encode();
        let pristine = (*sealed).clone().compacted();
        let Kept::Sealed(s) = &sealed.kept else {
            panic!("sealed")
        };
        assert!(s.opened.get().is_none());
        Keyring::open(Some(&ring), &address(3), Arc::clone(&sealed)).expect("opens");
        assert_eq!(
            s.opened.get(),
            record().clear_response(),
            "kept once opened"
        );
        let again = Keyring::open(Some(&ring), &address(3), Arc::clone(&sealed)).expect("kept");
        assert_eq!(Some(again.response()), record().clear_response());
        assert_eq!(sealed.encode(), before, "never encoded");
        assert_eq!(*sealed, pristine, "nor compared");
        assert!(!format!("{sealed:?}").contains("MARKER"), "nor shown");
    }

    #[test]
    fn two_seals_of_one_record_differ_by_their_nonce() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        assert_ne!(
            ring.seal(&address(3), record()),
            ring.seal(&address(3), record())
        );
    }

    #[test]
    fn a_rotated_keyring_still_opens_records_of_the_old_key() {
        let old = Keyring::new(&[key("old", 1)]).expect("a key");
        let sealed = Arc::new(old.seal(&address(3), record()));
        let rotated = Keyring::new(&[key("new", 2), key("old", 1)]).expect("keys");
        assert!(Keyring::open(Some(&rotated), &address(3), Arc::clone(&sealed)).is_ok());
        let Kept::Sealed(s) = rotated.seal(&address(3), record()).kept else {
            panic!("sealed")
        };
        assert_eq!(&*s.key_id, "new", "the first key seals");
        let dropped = Keyring::new(&[key("new", 2)]).expect("a key");
        assert_eq!(
            Keyring::open(Some(&dropped), &address(3), Arc::clone(&sealed)).err(),
            Some(Undecryptable::UnknownKey("old".into()))
        );
        assert_eq!(
            Keyring::open(None, &address(3), sealed).err(),
            Some(Undecryptable::UnknownKey("old".into())),
            "nor without encryption"
        );
    }

    #[test]
    fn a_record_moved_to_another_address_or_altered_does_not_open() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        let sealed = ring.seal(&address(3), record());
        assert_eq!(
            Keyring::open(Some(&ring), &address(4), Arc::new(sealed.clone())).err(),
            Some(Undecryptable::Rejected("k1".into()))
        );
        let Kept::Sealed(mut s) = sealed.kept.clone() else {
            panic!("sealed")
        };
        let mut bytes = s.ciphertext.to_vec();
        bytes[0] ^= 1;
        s.ciphertext = bytes.into();
        let altered = Completed {
            kept: Kept::Sealed(s),
            ..sealed
        };
        assert!(Keyring::open(Some(&ring), &address(3), Arc::new(altered)).is_err());
        let same_id_other_bytes = Keyring::new(&[key("k1", 8)]).expect("a key");
        let fresh = ring.seal(&address(3), record());
        assert!(Keyring::open(Some(&same_id_other_bytes), &address(3), Arc::new(fresh)).is_err());
    }

    #[test]
    fn clear_records_open_with_or_without_a_keyring() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        for keyring in [Some(&ring), None] {
            let opened = Keyring::open(keyring, &address(3), Arc::new(record())).expect("in clear");
            assert_eq!(Some(opened.response()), record().clear_response());
        }
    }

    #[test]
    fn a_too_large_record_stays_unreplayable_when_sealed() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        let mut rec = record();
        if let Kept::Clear(response) = &mut rec.kept {
            response.body = StoredBody::TooLarge;
        }
        assert!(!ring.seal(&address(3), rec).replayable());
    }

    #[test]
    fn the_keyring_never_shows_its_keys() {
        let ring = Keyring::new(&[key("k1", 0x41)]).expect("a key");
        let shown = format!("{ring:?}");
        assert!(shown.contains("k1"));
        assert!(!shown.contains("AAAA") && !shown.contains("65"), "{shown}");
    }
}
