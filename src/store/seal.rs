//! Encryption at rest (docs/behaviour.md §17): the keyring of `store.encryption`, which
//! seals a completed record's response before any store sees it and opens it again for
//! a replay. Sealing happens once, above the stores, so every store kind (memory, file,
//! Redis, Redis Cluster) keeps the same sealed bytes and none of them holds a key.
//!
//! AES-256-GCM from `ring` (already built for rustls), a fresh random 96-bit nonce per
//! record from the thread's CSPRNG. What stays readable is what the admin API shows
//! without a key: the fingerprint, the times, the flags (body kept, outcome unknown,
//! streamed) and the id of the key that sealed it. The associated data is the record's
//! address and all of that, as stored (docs/behaviour.md §25): a sealed value copied
//! under another key does not open, and neither does one whose clear fields were altered
//! at rest, so that it is never replayed to another body nor resolved as unknown.
//!
//! Records sealed before §25 bound the address alone, and may still be in a durable
//! store (the file store's journal, Redis) after an upgrade. They are kept apart by
//! their kind byte ([`Binds`]) and opened under that old rule until they expire, rather
//! than refused: refusing would answer every retry of such a key `503` for up to a `ttl`
//! after an upgrade, and what the old rule leaves open (a writer of the store changing
//! their clear fields) is no more than that writer can do already, since a record in
//! clear is accepted as written (§17). Nothing is sealed under the old rule any more, and
//! a record cannot be moved from one rule to the other: the kind byte selects the label
//! and the bytes of the associated data, so a new record relabelled as an old one (or
//! the reverse) is opened against associated data it was not sealed with, and its tag
//! fails.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rand::RngExt;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::config::EncryptionKey;
use crate::idempotency::record::{Binds, NONCE_LEN, OpenedOnce};
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

    /// `record` with its response sealed under the first key, for `key`'s address and
    /// everything the record keeps in clear. A record already sealed is returned as it
    /// is.
    pub fn seal(&self, key: &ScopedKey, record: Completed) -> Completed {
        let Kept::Clear(response) = &record.kept else {
            return record;
        };
        let (id, sealing) = &self.keys[0];
        let mut buf = BytesMut::with_capacity(response.encoded_len() + AES_256_GCM.tag_len());
        response.encode_into(&mut buf);
        let nonce: [u8; NONCE_LEN] = rand::rng().random();
        let mut sealed = Sealed {
            key_id: Arc::clone(id),
            binds: Binds::Record,
            too_large: !record.replayable(),
            nonce,
            // Filled in below: the clear fields are bound before the response is sealed.
            ciphertext: Bytes::new(),
            opened: OpenedOnce::default(),
        };
        let head = Completed {
            kept: Kept::Sealed(sealed.clone()),
            ..record
        };
        sealing
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated_data(key, &head, &sealed)),
                &mut buf,
            )
            .expect("AES-GCM seals any record shorter than 64 GiB");
        sealed.ciphertext = buf.freeze();
        Completed {
            kept: Kept::Sealed(sealed),
            ..head
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
                Aad::from(associated_data(key, &record, sealed)),
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

/// The associated data of `record`'s seal, `sealed`: a label of its own (so that it
/// cannot be mistaken for another use of the same bytes), the record's address, and
/// under [`Binds::Record`] the record's sealed head, every byte it keeps in clear
/// (docs/behaviour.md §25). The label differs between the two rules, and the head holds
/// the kind byte that names the rule.
fn associated_data(key: &ScopedKey, record: &Completed, sealed: &Sealed) -> Vec<u8> {
    let mut aad = Vec::with_capacity(LABEL_LEN + 32 + 96);
    match sealed.binds {
        Binds::Address => {
            aad.extend_from_slice(b"idemgate-rec-v1\0");
            aad.extend_from_slice(key.as_bytes());
        }
        Binds::Record => {
            aad.extend_from_slice(b"idemgate-rec-v2\0");
            aad.extend_from_slice(key.as_bytes());
            record.encode_sealed_head(sealed, &mut aad);
        }
    }
    aad
}

/// The length of an associated data's label.
const LABEL_LEN: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::{Fingerprint, StoredBody, Streamed, Times};
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

    /// Through the bytes a store holds, as a replay after a restart or from Redis reads it.
    fn stored(record: &Completed) -> Arc<Completed> {
        match crate::idempotency::Record::decode(record.encode()).expect("decodes") {
            crate::idempotency::Record::Completed(completed) => completed,
            crate::idempotency::Record::InFlight(_) => panic!("a completed record"),
        }
    }

    /// A change made at rest to one field a sealed record keeps in clear.
    type Alteration = fn(&mut Completed);

    #[test]
    fn a_record_altered_in_any_field_kept_in_clear_does_not_open() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        let mut streamed = record();
        streamed.streamed = Some(Streamed {
            upfront: Fingerprint::from_bytes([5; 32]),
            whole: false,
        });
        let alterations: [(&str, Alteration); 10] = [
            ("fingerprint", |r| {
                r.fingerprint = Fingerprint::from_bytes([2; 32]);
            }),
            ("outcome unknown", |r| r.unknown = !r.unknown),
            ("too large", |r| {
                if let Kept::Sealed(s) = &mut r.kept {
                    s.too_large = !s.too_large;
                }
            }),
            ("claimed at", |r| {
                r.times = r.times.map(|t| Times {
                    claimed_ms: t.claimed_ms + 1,
                    ..t
                });
            }),
            ("completed at", |r| {
                r.times = r.times.map(|t| Times {
                    completed_ms: t.completed_ms + 1,
                    ..t
                });
            }),
            ("times", |r| r.times = None),
            ("streamed", |r| {
                r.streamed = match r.streamed {
                    Some(_) => None,
                    None => Some(Streamed {
                        upfront: r.fingerprint,
                        whole: true,
                    }),
                };
            }),
            ("hashed whole", |r| {
                r.streamed = r.streamed.map(|s| Streamed {
                    whole: !s.whole,
                    ..s
                });
            }),
            ("up-front fingerprint", |r| {
                r.streamed = r.streamed.map(|s| Streamed {
                    upfront: Fingerprint::from_bytes([6; 32]),
                    ..s
                });
            }),
            ("seal rule", |r| {
                if let Kept::Sealed(s) = &mut r.kept {
                    s.binds = Binds::Address;
                }
            }),
        ];
        for original in [record(), streamed] {
            let sealed = ring.seal(&address(3), original);
            assert!(Keyring::open(Some(&ring), &address(3), stored(&sealed)).is_ok());
            for (field, alter) in alterations {
                let mut altered = sealed.clone();
                alter(&mut altered);
                if altered == sealed {
                    // Not a field of this record (the streamed ones of one not streamed).
                    continue;
                }
                assert_eq!(
                    Keyring::open(Some(&ring), &address(3), stored(&altered)).err(),
                    Some(Undecryptable::Rejected("k1".into())),
                    "{field}"
                );
            }
        }
    }

    /// The fingerprint rules a record keeps in clear (docs/behaviour.md §24) are bound
    /// like its other clear fields: rules changed at rest, or dropped, do not open.
    /// (`==` on records compares fingerprints by digest, so the table above cannot
    /// tell this alteration apart.)
    #[test]
    fn a_record_whose_fingerprint_rules_were_altered_does_not_open() {
        use crate::idempotency::fingerprint::{BodyForm, FingerprintRules};
        use crate::idempotency::rules::KeptRules;
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        let rules = |query: bool| {
            KeptRules::intern(&FingerprintRules {
                headers: &[],
                query,
                body: BodyForm::Raw,
                ignore: &[],
            })
        };
        let mut original = record();
        original.fingerprint = original.fingerprint.with_rules(rules(true));
        let sealed = ring.seal(&address(3), original);
        assert!(Keyring::open(Some(&ring), &address(3), stored(&sealed)).is_ok());
        for other in [rules(false), None] {
            let mut altered = sealed.clone();
            altered.fingerprint = altered.fingerprint.with_rules(other);
            assert_eq!(
                Keyring::open(Some(&ring), &address(3), stored(&altered)).err(),
                Some(Undecryptable::Rejected("k1".into())),
                "{other:?}"
            );
        }
    }

    /// A record sealed by a version before every clear field was bound: its address
    /// alone, laid out as that version stored it (kind 3). Sealed here with `ring`
    /// directly, as an oracle of the old rule.
    fn sealed_by_the_old_rule(byte: u8, address: &ScopedKey) -> Completed {
        let response = record().clear_response().cloned().expect("in clear");
        let mut buf = Vec::new();
        response.encode_into(&mut buf);
        let nonce = [9u8; NONCE_LEN];
        let mut aad = b"idemgate-rec-v1\0".to_vec();
        aad.extend_from_slice(address.as_bytes());
        let old = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[byte; 32]).expect("key"));
        old.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut buf,
        )
        .expect("seals");
        Completed {
            kept: Kept::Sealed(Sealed {
                key_id: "k1".into(),
                binds: Binds::Address,
                too_large: false,
                nonce,
                ciphertext: buf.into(),
                opened: OpenedOnce::default(),
            }),
            ..record()
        }
    }

    #[test]
    fn a_record_sealed_before_every_field_was_bound_opens_until_it_expires() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        let old = sealed_by_the_old_rule(7, &address(3));
        let bytes = old.encode();
        assert_eq!(
            bytes[1],
            crate::idempotency::record::KIND_SEALED_ADDRESS_ONLY
        );
        let opened = Keyring::open(Some(&ring), &address(3), stored(&old)).expect("opens");
        assert_eq!(Some(opened.response()), record().clear_response());
        // Its address is still bound.
        assert!(Keyring::open(Some(&ring), &address(4), stored(&old)).is_err());
        // Nothing new is sealed by that rule.
        let new = ring.seal(&address(3), record());
        assert_eq!(new.encode()[1], crate::idempotency::record::KIND_SEALED);
    }

    /// Neither rule's record opens as the other's: a new record relabelled as an old
    /// one (to escape the binding of its clear fields) fails its tag, and so does an old
    /// one relabelled as new.
    #[test]
    fn a_record_cannot_be_moved_from_one_seal_rule_to_the_other() {
        let ring = Keyring::new(&[key("k1", 7)]).expect("a key");
        let relabelled = |record: &Completed, binds: Binds| {
            let mut bytes = record.encode().to_vec();
            bytes[1] = match binds {
                Binds::Address => crate::idempotency::record::KIND_SEALED_ADDRESS_ONLY,
                Binds::Record => crate::idempotency::record::KIND_SEALED,
            };
            match crate::idempotency::Record::decode(bytes.into()).expect("decodes") {
                crate::idempotency::Record::Completed(completed) => completed,
                crate::idempotency::Record::InFlight(_) => panic!("a completed record"),
            }
        };
        let new = ring.seal(&address(3), record());
        let downgraded = relabelled(&new, Binds::Address);
        assert!(matches!(&downgraded.kept, Kept::Sealed(s) if s.binds == Binds::Address));
        assert_eq!(
            Keyring::open(Some(&ring), &address(3), downgraded).err(),
            Some(Undecryptable::Rejected("k1".into()))
        );
        let old = sealed_by_the_old_rule(7, &address(3));
        assert_eq!(
            Keyring::open(Some(&ring), &address(3), relabelled(&old, Binds::Record)).err(),
            Some(Undecryptable::Rejected("k1".into()))
        );
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
