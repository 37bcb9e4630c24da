//! What a store keeps under a scoped key: an in-flight marker or a completed response.
//!
//! The types are here; how they are laid out in bytes, and read back from bytes that
//! may be from an older version or corrupt, is `wire.rs`.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use http::header::{HeaderName, HeaderValue};

use super::Fingerprint;

#[cfg(test)]
mod tests;
mod wire;

pub const FORMAT_V1: u8 = 1;
/// Format 1 plus the record's times.
pub const FORMAT_V2: u8 = 2;
/// Format 2 plus a flags byte ending an in-flight marker: a streamed request's marker.
pub const FORMAT_V3: u8 = 3;
/// Format 2 (an in-flight marker: format 3) plus the fingerprint rules the record was
/// made under (docs/behaviour.md §24).
pub const FORMAT_V4: u8 = 4;
pub const KIND_IN_FLIGHT: u8 = 1;
pub const KIND_COMPLETED: u8 = 2;
/// A completed record whose response is encrypted (docs/behaviour.md §17), its seal
/// binding the record's address alone: written before §25, still read ([`Binds`]).
pub const KIND_SEALED_ADDRESS_ONLY: u8 = 3;
/// A completed record whose response is encrypted, its seal binding the record's address
/// and every field it keeps in clear (docs/behaviour.md §17, §25).
pub const KIND_SEALED: u8 = 4;
/// Length of an encoded in-flight marker of format 1; format 2 adds 8 bytes, format 3
/// one more.
pub const IN_FLIGHT_LEN: usize = 58;
/// Byte range of the owner token inside an encoded in-flight marker.
pub const TOKEN_RANGE: std::ops::Range<usize> = 34..50;

/// A random value naming one claim. Complete, release and renew succeed only for the
/// holder of the current token (fencing, docs/behaviour.md §4).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    pub fn random() -> Self {
        Self(*uuid::Uuid::new_v4().as_bytes())
    }

    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl std::fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OwnerToken({})", &super::key::hex(&self.0)[..8])
    }
}

/// The marker written by a successful claim, before the request is forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub fingerprint: Fingerprint,
    pub token: OwnerToken,
    /// Unix milliseconds, on the store's clock, after which the owner is presumed dead.
    pub lease_deadline_ms: u64,
    /// When the claim was made, on the store's clock; `None` in a format 1 marker.
    pub claimed_at_ms: Option<u64>,
    /// The request's body is streamed (docs/behaviour.md §19): `fingerprint` is its
    /// up-front fingerprint, and a retry is `409` whatever its body.
    pub streamed: bool,
}

/// How a completed record of a streamed request was fingerprinted
/// (docs/behaviour.md §19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streamed {
    /// What was known before the body: method, target, headers, declared length.
    pub upfront: Fingerprint,
    /// The body was hashed to its end, and the record's fingerprint is the full one: a
    /// retry reads its own body to compare. `false` when the upstream answered before
    /// the body was read whole, or the outcome is unknown: the record's fingerprint is
    /// then `upfront`, and only that is compared.
    pub whole: bool,
}

/// When a completed record's claim was made and when its response was recorded, in
/// Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    pub claimed_ms: u64,
    pub completed_ms: u64,
}

/// The body of a recorded response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredBody {
    Stored(Bytes),
    /// Over `max_response_body`: the status and headers are kept, a retry gets
    /// `409 not-replayable` instead of a second execution.
    TooLarge,
}

/// A recorded response, replayed to every retry with the same key and fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    pub fingerprint: Fingerprint,
    /// What the upstream (or the proxy) answered: in clear, or sealed with a key of
    /// `store.encryption` (docs/behaviour.md §17).
    pub kept: Kept,
    /// `None` in a format 1 record; set by the proxy before the first attempt to record
    /// it, so that a repeated attempt writes the same bytes.
    pub times: Option<Times>,
    /// The response is the proxy's `outcome-unknown`: whether the upstream executed the
    /// request is not known (docs/behaviour.md §4, §18). Readable without a key, so
    /// that `GET /keys/{id}` shows it; a sealed record is opened before it is resolved
    /// all the same, its seal binding this flag (§25).
    pub unknown: bool,
    /// Set for a streamed request (docs/behaviour.md §19).
    pub streamed: Option<Streamed>,
}

/// How a completed record holds its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    Clear(StoredResponse),
    /// Encrypted: only the keyring of `store.encryption` reads it back.
    Sealed(Sealed),
}

/// The status, headers and body that a replay sends again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: StoredBody,
}

/// A [`StoredResponse`] under AEAD (docs/behaviour.md §17). Whether its body was kept
/// stays readable, so that `GET /keys/{id}` shows it without a key; the seal binds it
/// (§25).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The `id` of the `store.encryption` key it was sealed with.
    pub key_id: Arc<str>,
    /// What the seal's associated data holds besides the ciphertext.
    pub binds: Binds,
    pub too_large: bool,
    pub nonce: [u8; NONCE_LEN],
    /// The response's encoding ([`StoredResponse::encode_into`]) and the AEAD tag.
    pub ciphertext: Bytes,
    /// The response once opened, kept beside a record that stays in this process's
    /// memory (the memory and file stores), so that its replays do not decrypt it each
    /// time. Not part of the record: never encoded, and ignored by `==`.
    pub opened: OpenedOnce,
}

/// What a [`Sealed`] record's seal binds: the fields it keeps in clear are read before it
/// is opened (to compare a fingerprint, to tell an unknown outcome), so the seal must fail
/// when any of them was altered at rest (docs/behaviour.md §25).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binds {
    /// The record's address alone: sealed by a version before §25
    /// ([`KIND_SEALED_ADDRESS_ONLY`]). Never written any more.
    Address,
    /// The address and every field kept in clear ([`KIND_SEALED`]).
    Record,
}

/// A [`Sealed`] record's response, opened at most once per copy of the record.
#[derive(Clone, Default)]
pub struct OpenedOnce(Arc<std::sync::OnceLock<StoredResponse>>);

impl OpenedOnce {
    pub fn get(&self) -> Option<&StoredResponse> {
        self.0.get()
    }

    /// Keeps `response`, unless another caller kept one first; returns the one kept.
    pub fn keep(&self, response: StoredResponse) -> &StoredResponse {
        self.0.get_or_init(|| response)
    }
}

/// A cache, not part of what a record is.
impl PartialEq for OpenedOnce {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for OpenedOnce {}

/// Never shows the response.
impl std::fmt::Debug for OpenedOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "OpenedOnce(..)"
        } else {
            "OpenedOnce(-)"
        })
    }
}

/// An AEAD nonce: 96 bits, fresh and random per record.
pub const NONCE_LEN: usize = 12;
/// A key id is short ASCII in practice; this is the most the encoding holds.
pub const MAX_KEY_ID_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    InFlight(InFlight),
    Completed(Arc<Completed>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record is truncated")]
    Truncated,
    #[error("record format {0} is not known to this version")]
    UnknownFormat(u8),
    #[error("record kind {0} is not known")]
    UnknownKind(u8),
    #[error("record holds an invalid {0}")]
    Invalid(&'static str),
    #[error("record has trailing bytes")]
    Trailing,
}

impl Completed {
    /// A record of `response` in clear, without its times yet.
    pub fn clear(
        fingerprint: Fingerprint,
        status: StatusCode,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: StoredBody,
    ) -> Self {
        Self {
            fingerprint,
            kept: Kept::Clear(StoredResponse {
                status,
                headers,
                body,
            }),
            times: None,
            unknown: false,
            streamed: None,
        }
    }

    /// The response, when it is kept in clear.
    pub fn clear_response(&self) -> Option<&StoredResponse> {
        match &self.kept {
            Kept::Clear(response) => Some(response),
            Kept::Sealed(_) => None,
        }
    }

    /// Whether a retry can be sent the response (its body was kept).
    pub fn replayable(&self) -> bool {
        match &self.kept {
            Kept::Clear(response) => !matches!(response.body, StoredBody::TooLarge),
            Kept::Sealed(sealed) => !sealed.too_large,
        }
    }

    /// Bytes of response held: what the memory stores count a record as.
    pub fn payload_len(&self) -> usize {
        match &self.kept {
            Kept::Clear(response) => response.payload_len(),
            Kept::Sealed(sealed) => sealed.key_id.len() + NONCE_LEN + sealed.ciphertext.len(),
        }
    }

    /// The same record in allocations of its own. hyper hands out bodies and header
    /// values as slices of its (8 KiB and larger) read buffers; a record kept in memory
    /// for hours must not keep a whole buffer alive for a 1 KiB body.
    pub fn compacted(&self) -> Completed {
        let kept = match &self.kept {
            Kept::Clear(response) => Kept::Clear(response.compacted()),
            // Sealing made the ciphertext: it is an allocation of its own already.
            Kept::Sealed(sealed) => Kept::Sealed(sealed.clone()),
        };
        Completed {
            fingerprint: self.fingerprint,
            kept,
            times: self.times,
            unknown: self.unknown,
            streamed: self.streamed,
        }
    }
}

impl StoredResponse {
    /// Header names, values and body bytes.
    pub fn payload_len(&self) -> usize {
        let body = match &self.body {
            StoredBody::Stored(b) => b.len(),
            StoredBody::TooLarge => 0,
        };
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len())
            .sum();
        body + headers
    }

    fn compacted(&self) -> StoredResponse {
        let headers = self
            .headers
            .iter()
            .map(|(name, value)| {
                // Copying valid header bytes cannot fail; keep the original if it did.
                let value =
                    HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
                (name.clone(), value)
            })
            .collect();
        let body = match &self.body {
            StoredBody::Stored(b) => StoredBody::Stored(Bytes::copy_from_slice(b)),
            StoredBody::TooLarge => StoredBody::TooLarge,
        };
        StoredResponse {
            status: self.status,
            headers,
            body,
        }
    }
}
