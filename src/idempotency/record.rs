//! What a store keeps under a scoped key: an in-flight marker or a completed response.
//!
//! The wire encoding is compact and versioned so that a later format can be read side by
//! side with this one. Layout (all integers big-endian):
//!
//! ```text
//! [0] format: 1, 2 or 3   [1] kind: 1 = in-flight, 2 = completed, 3 = sealed
//! [2..34] fingerprint
//! in-flight:  [34..50] owner token   [50..58] lease deadline, unix ms
//!             formats 2 and 3: [58..66] claimed at, unix ms
//!             format 3 only: [66] flags: bit 0 = streamed (docs/behaviour.md §19)
//! completed:  [34..36] status   [36] flags: bit 0 = body too large to keep, bit 1 =
//!             outcome unknown (a record written before that flag has 0 or 1), bit 2 =
//!             streamed, bit 3 = the streamed body was hashed whole
//!             format 2 only: [37..45] claimed at, [45..53] completed at, unix ms
//!             streamed only: 32 bytes, the up-front fingerprint
//!             then u16 header count, then per header: u16 name len, name, u32 value
//!             len, value; then u32 body len, body (raw bytes)
//! sealed:     [34] flags, as above   format 2: [35..51] the two times
//!             streamed only: 32 bytes, the up-front fingerprint
//!             then u8 key id len, key id, 12-byte nonce, u32 len, ciphertext: the
//!             status (u16) and the headers and body laid out as above, under AEAD
//! ```
//!
//! A streamed request's marker is format 3, and its record sets the streamed flag: a
//! version that predates them refuses both as unreadable (never replayed, never
//! forwarded) rather than comparing the wrong fingerprint. Everything else is written
//! exactly as before streaming existed.
//!
//! Format 2 adds the times the admin API reports (docs/behaviour.md §13); records of
//! format 1, written before it, still load, without them. A record is written in format 2
//! when it has its times, which every record made by this version has.
//!
//! The fixed offsets of the in-flight marker let the Redis store's Lua scripts check the
//! owner token without decoding anything else.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::StatusCode;
use http::header::{HeaderName, HeaderValue};

use super::Fingerprint;

pub const FORMAT_V1: u8 = 1;
/// Format 1 plus the record's times.
pub const FORMAT_V2: u8 = 2;
/// Format 2 plus a flags byte ending an in-flight marker: a streamed request's marker.
pub const FORMAT_V3: u8 = 3;
pub const KIND_IN_FLIGHT: u8 = 1;
pub const KIND_COMPLETED: u8 = 2;
/// A completed record whose response is encrypted (docs/behaviour.md §17).
pub const KIND_SEALED: u8 = 3;
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
    /// that an operator can resolve it.
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
/// stays readable, so that a retry of a too-large response is refused without a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The `id` of the `store.encryption` key it was sealed with.
    pub key_id: Arc<str>,
    pub too_large: bool,
    pub nonce: [u8; NONCE_LEN],
    /// The response's encoding ([`StoredResponse::encode_into`]) and the AEAD tag.
    pub ciphertext: Bytes,
    /// The response once opened, kept beside a record that stays in this process's
    /// memory (the memory and file stores), so that its replays do not decrypt it each
    /// time. Not part of the record: never encoded, and ignored by `==`.
    pub opened: OpenedOnce,
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

impl InFlight {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(IN_FLIGHT_LEN + 8);
        self.encode_into(&mut out);
        out.freeze()
    }

    /// The encoding of [`InFlight::encode`], appended to `out`.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        // A streamed marker always has its time: the claim that writes it sets one.
        let format = match (self.streamed, self.claimed_at_ms) {
            (true, _) => FORMAT_V3,
            (false, Some(_)) => FORMAT_V2,
            (false, None) => FORMAT_V1,
        };
        out.put_u8(format);
        out.put_u8(KIND_IN_FLIGHT);
        out.put_slice(self.fingerprint.as_bytes());
        out.put_slice(self.token.as_bytes());
        out.put_u64(self.lease_deadline_ms);
        if format != FORMAT_V1 {
            out.put_u64(self.claimed_at_ms.unwrap_or(0));
        }
        if self.streamed {
            out.put_u8(IN_FLIGHT_STREAMED);
        }
    }
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

    /// The flags byte: bit 0, the body was too large to keep; bit 1, the outcome is
    /// unknown; bit 2, the request was streamed; bit 3, its body was hashed whole.
    fn flags(&self) -> u8 {
        let streamed = match self.streamed {
            None => 0,
            Some(Streamed { whole, .. }) => FLAG_STREAMED | (u8::from(whole) << 3),
        };
        u8::from(!self.replayable()) | (u8::from(self.unknown) << 1) | streamed
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

    pub fn encode(&self) -> Bytes {
        // Format, kind, fingerprint, body flag and times, then the response's own.
        let head = 2 + 32 + 1 + 16 + if self.streamed.is_some() { 32 } else { 0 };
        let len = match &self.kept {
            Kept::Clear(response) => head + response.encoded_len(),
            Kept::Sealed(sealed) => {
                head + 1 + sealed.key_id.len() + NONCE_LEN + 4 + sealed.ciphertext.len()
            }
        };
        let mut out = BytesMut::with_capacity(len);
        self.encode_into(&mut out);
        out.freeze()
    }

    /// The encoding of [`Completed::encode`], appended to `out`.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        out.put_u8(if self.times.is_some() {
            FORMAT_V2
        } else {
            FORMAT_V1
        });
        match &self.kept {
            Kept::Clear(response) => {
                out.put_u8(KIND_COMPLETED);
                out.put_slice(self.fingerprint.as_bytes());
                out.put_u16(response.status.as_u16());
                out.put_u8(self.flags());
                self.encode_times(out);
                response.encode_parts(out);
            }
            Kept::Sealed(sealed) => {
                out.put_u8(KIND_SEALED);
                out.put_slice(self.fingerprint.as_bytes());
                out.put_u8(self.flags());
                self.encode_times(out);
                // Config checks keep ids far shorter; saturating keeps a bad one
                // detectable on decode rather than misframed.
                let id = sealed.key_id.as_bytes();
                let id = &id[..id.len().min(MAX_KEY_ID_LEN)];
                out.put_u8(u8::try_from(id.len()).unwrap_or(u8::MAX));
                out.put_slice(id);
                out.put_slice(&sealed.nonce);
                out.put_u32(u32::try_from(sealed.ciphertext.len()).unwrap_or(u32::MAX));
                out.put_slice(&sealed.ciphertext);
            }
        }
    }

    /// The times, then a streamed record's up-front fingerprint.
    fn encode_times(&self, out: &mut impl BufMut) {
        if let Some(times) = self.times {
            out.put_u64(times.claimed_ms);
            out.put_u64(times.completed_ms);
        }
        if let Some(streamed) = &self.streamed {
            out.put_slice(streamed.upfront.as_bytes());
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

    /// The length of [`StoredResponse::encode_into`]'s output.
    pub fn encoded_len(&self) -> usize {
        2 + 2 + 6 * self.headers.len() + 4 + self.payload_len()
    }

    /// What a sealed record encrypts: the status, then the headers and body as a clear
    /// record lays them out.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        out.put_u16(self.status.as_u16());
        self.encode_parts(out);
    }

    /// Reads back [`StoredResponse::encode_into`]; `too_large` comes from the record.
    pub fn decode(mut buf: Bytes, too_large: bool) -> Result<Self, DecodeError> {
        need(&buf, 2)?;
        let status = status(buf.get_u16())?;
        let response = Self::decode_parts(&mut buf, status, too_large)?;
        if buf.has_remaining() {
            return Err(DecodeError::Trailing);
        }
        Ok(response)
    }

    fn encode_parts(&self, out: &mut impl BufMut) {
        let body: &[u8] = match &self.body {
            StoredBody::Stored(b) => b,
            StoredBody::TooLarge => &[],
        };
        // Counts and lengths are bounded by hyper's header limits and max_response_body,
        // far below these widths; saturating keeps a corrupt length detectable on decode.
        out.put_u16(u16::try_from(self.headers.len()).unwrap_or(u16::MAX));
        for (name, value) in &self.headers {
            out.put_u16(u16::try_from(name.as_str().len()).unwrap_or(u16::MAX));
            out.put_slice(name.as_str().as_bytes());
            out.put_u32(u32::try_from(value.len()).unwrap_or(u32::MAX));
            out.put_slice(value.as_bytes());
        }
        out.put_u32(u32::try_from(body.len()).unwrap_or(u32::MAX));
        out.put_slice(body);
    }

    fn decode_parts(
        buf: &mut Bytes,
        status: StatusCode,
        too_large: bool,
    ) -> Result<Self, DecodeError> {
        need(buf, 2)?;
        let count = buf.get_u16();
        let mut headers = Vec::with_capacity(usize::from(count).min(256));
        for _ in 0..count {
            need(buf, 2)?;
            let len = usize::from(buf.get_u16());
            let name = take(buf, len)?;
            let name =
                HeaderName::from_bytes(&name).map_err(|_| DecodeError::Invalid("header name"))?;
            need(buf, 4)?;
            let len = buf.get_u32() as usize;
            let value = take(buf, len)?;
            let value = HeaderValue::from_maybe_shared(value)
                .map_err(|_| DecodeError::Invalid("header value"))?;
            headers.push((name, value));
        }
        need(buf, 4)?;
        let len = buf.get_u32() as usize;
        let body = take(buf, len)?;
        let body = if too_large {
            StoredBody::TooLarge
        } else {
            StoredBody::Stored(body)
        };
        Ok(Self {
            status,
            headers,
            body,
        })
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

impl Record {
    pub fn encode(&self) -> Bytes {
        match self {
            Record::InFlight(m) => m.encode(),
            Record::Completed(c) => c.encode(),
        }
    }

    /// The encoding of [`Record::encode`], appended to `out` (the file store's journal
    /// entries, without a copy of their own first).
    pub fn encode_into(&self, out: &mut impl BufMut) {
        match self {
            Record::InFlight(m) => m.encode_into(out),
            Record::Completed(c) => c.encode_into(out),
        }
    }

    /// Decodes a stored value. `Bytes` in, so bodies are sliced, not copied.
    pub fn decode(mut buf: Bytes) -> Result<Record, DecodeError> {
        need(&buf, 2)?;
        let format = buf.get_u8();
        if !(FORMAT_V1..=FORMAT_V3).contains(&format) {
            return Err(DecodeError::UnknownFormat(format));
        }
        let timed = format != FORMAT_V1;
        let kind = buf.get_u8();
        // Format 3 is a streamed request's marker, and nothing else.
        if format == FORMAT_V3 && kind != KIND_IN_FLIGHT {
            return Err(DecodeError::UnknownFormat(format));
        }
        need(&buf, 32)?;
        let mut fp = [0u8; 32];
        buf.copy_to_slice(&mut fp);
        let fingerprint = Fingerprint::from_bytes(fp);
        let record = match kind {
            KIND_IN_FLIGHT => {
                need(&buf, if timed { 32 } else { 24 })?;
                let mut token = [0u8; 16];
                buf.copy_to_slice(&mut token);
                let lease_deadline_ms = buf.get_u64();
                let claimed_at_ms = timed.then(|| buf.get_u64());
                let streamed = format == FORMAT_V3;
                if streamed {
                    need(&buf, 1)?;
                    if buf.get_u8() != IN_FLIGHT_STREAMED {
                        return Err(DecodeError::Invalid("marker flags"));
                    }
                }
                Record::InFlight(InFlight {
                    fingerprint,
                    token: OwnerToken::from_bytes(token),
                    lease_deadline_ms,
                    claimed_at_ms,
                    streamed,
                })
            }
            KIND_COMPLETED => {
                need(&buf, 3)?;
                let status = status(buf.get_u16())?;
                let (too_large, unknown, streamed) = flags(buf.get_u8())?;
                let times = decode_times(&mut buf, timed)?;
                let streamed = decode_streamed(&mut buf, streamed)?;
                let response = StoredResponse::decode_parts(&mut buf, status, too_large)?;
                Record::Completed(Arc::new(Completed {
                    fingerprint,
                    kept: Kept::Clear(response),
                    times,
                    unknown,
                    streamed,
                }))
            }
            KIND_SEALED => {
                need(&buf, 1)?;
                let (too_large, unknown, streamed) = flags(buf.get_u8())?;
                let times = decode_times(&mut buf, timed)?;
                let streamed = decode_streamed(&mut buf, streamed)?;
                need(&buf, 1)?;
                let len = usize::from(buf.get_u8());
                let id = take(&mut buf, len)?;
                let key_id = std::str::from_utf8(&id)
                    .map_err(|_| DecodeError::Invalid("key id"))?
                    .into();
                need(&buf, NONCE_LEN + 4)?;
                let mut nonce = [0u8; NONCE_LEN];
                buf.copy_to_slice(&mut nonce);
                let len = buf.get_u32() as usize;
                let ciphertext = take(&mut buf, len)?;
                Record::Completed(Arc::new(Completed {
                    fingerprint,
                    kept: Kept::Sealed(Sealed {
                        key_id,
                        too_large,
                        nonce,
                        ciphertext,
                        opened: OpenedOnce::default(),
                    }),
                    times,
                    unknown,
                    streamed,
                }))
            }
            other => return Err(DecodeError::UnknownKind(other)),
        };
        if buf.has_remaining() {
            return Err(DecodeError::Trailing);
        }
        Ok(record)
    }
}

fn status(code: u16) -> Result<StatusCode, DecodeError> {
    StatusCode::from_u16(code).map_err(|_| DecodeError::Invalid("status"))
}

/// The last byte of a streamed request's marker (format 3).
const IN_FLIGHT_STREAMED: u8 = 1;
/// A completed record's flag: the request was streamed.
const FLAG_STREAMED: u8 = 4;
/// A completed record's flag, with [`FLAG_STREAMED`] only: its body was hashed whole.
const FLAG_WHOLE: u8 = 8;

/// `(too large, outcome unknown, streamed flags)` from a flags byte; records written
/// before the second flag hold 0 or 1, before streaming 0 to 3.
fn flags(byte: u8) -> Result<(bool, bool, Option<bool>), DecodeError> {
    if byte > 15 || (byte & FLAG_WHOLE != 0 && byte & FLAG_STREAMED == 0) {
        return Err(DecodeError::Invalid("flags"));
    }
    let streamed = (byte & FLAG_STREAMED != 0).then_some(byte & FLAG_WHOLE != 0);
    Ok((byte & 1 == 1, byte & 2 == 2, streamed))
}

/// A streamed record's up-front fingerprint, when `whole` says it is one.
fn decode_streamed(buf: &mut Bytes, whole: Option<bool>) -> Result<Option<Streamed>, DecodeError> {
    let Some(whole) = whole else {
        return Ok(None);
    };
    need(buf, 32)?;
    let mut upfront = [0u8; 32];
    buf.copy_to_slice(&mut upfront);
    Ok(Some(Streamed {
        upfront: Fingerprint::from_bytes(upfront),
        whole,
    }))
}

fn decode_times(buf: &mut Bytes, timed: bool) -> Result<Option<Times>, DecodeError> {
    if !timed {
        return Ok(None);
    }
    need(buf, 16)?;
    Ok(Some(Times {
        claimed_ms: buf.get_u64(),
        completed_ms: buf.get_u64(),
    }))
}

fn need(buf: &Bytes, n: usize) -> Result<(), DecodeError> {
    if buf.remaining() < n {
        Err(DecodeError::Truncated)
    } else {
        Ok(())
    }
}

fn take(buf: &mut Bytes, n: usize) -> Result<Bytes, DecodeError> {
    need(buf, n)?;
    Ok(buf.split_to(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn completed(body: StoredBody) -> Completed {
        let mut rec = Completed::clear(
            Fingerprint::from_bytes([7; 32]),
            StatusCode::CREATED,
            vec![
                (
                    HeaderName::from_static("content-type"),
                    HeaderValue::from_static("application/json"),
                ),
                (
                    HeaderName::from_static("x-multi"),
                    HeaderValue::from_static("1"),
                ),
                (
                    HeaderName::from_static("x-multi"),
                    HeaderValue::from_static("2"),
                ),
            ],
            body,
        );
        rec.times = Some(Times {
            claimed_ms: 1_700_000_000_000,
            completed_ms: 1_700_000_000_250,
        });
        rec
    }

    #[test]
    fn in_flight_round_trips_with_fixed_token_offset() {
        let marker = InFlight {
            fingerprint: Fingerprint::from_bytes([1; 32]),
            token: OwnerToken::from_bytes([9; 16]),
            lease_deadline_ms: 1_700_000_000_123,
            claimed_at_ms: Some(1_700_000_000_000),
            streamed: false,
        };
        let bytes = marker.encode();
        assert_eq!(bytes.len(), 66);
        assert_eq!(bytes[0], FORMAT_V2);
        assert_eq!(&bytes[TOKEN_RANGE], &[9; 16]);
        assert_eq!(&bytes[50..58], &1_700_000_000_123u64.to_be_bytes());
        assert_eq!(Record::decode(bytes), Ok(Record::InFlight(marker)));
    }

    /// Records written before format 2 still load, without their times.
    #[test]
    fn format_1_records_still_load() {
        let mut v1 = vec![FORMAT_V1, KIND_IN_FLIGHT];
        v1.extend([1; 32]);
        v1.extend([9; 16]);
        v1.extend(1_700_000_000_123u64.to_be_bytes());
        assert_eq!(
            Record::decode(v1.into()),
            Ok(Record::InFlight(InFlight {
                fingerprint: Fingerprint::from_bytes([1; 32]),
                token: OwnerToken::from_bytes([9; 16]),
                lease_deadline_ms: 1_700_000_000_123,
                claimed_at_ms: None,
                streamed: false,
            }))
        );
        // The completed layout of format 1, byte by byte: no times after the body flag.
        let mut v1 = vec![FORMAT_V1, KIND_COMPLETED];
        v1.extend([7; 32]);
        v1.extend(201u16.to_be_bytes());
        v1.push(0);
        v1.extend(1u16.to_be_bytes());
        v1.extend(1u16.to_be_bytes());
        v1.push(b'x');
        v1.extend(1u32.to_be_bytes());
        v1.push(b'1');
        v1.extend(2u32.to_be_bytes());
        v1.extend(b"ok");
        let Ok(Record::Completed(old)) = Record::decode(v1.clone().into()) else {
            panic!("a format 1 record decodes")
        };
        let response = old.clear_response().expect("in clear");
        assert_eq!(response.status, StatusCode::CREATED);
        assert_eq!(old.times, None);
        assert_eq!(response.body, StoredBody::Stored(Bytes::from_static(b"ok")));
        assert_eq!(
            old.encode(),
            Bytes::from(v1),
            "and is written back as it was"
        );
    }

    #[test]
    fn completed_round_trips_headers_in_order_and_raw_body() {
        let rec = completed(StoredBody::Stored(Bytes::from_static(b"{\"id\":1}")));
        let bytes = rec.encode();
        assert_eq!(bytes[0], FORMAT_V2);
        assert!(bytes.ends_with(b"{\"id\":1}"), "body is stored raw");
        assert_eq!(Record::decode(bytes), Ok(Record::Completed(Arc::new(rec))));
        let large = completed(StoredBody::TooLarge);
        assert_eq!(
            Record::decode(large.encode()),
            Ok(Record::Completed(Arc::new(large)))
        );
    }

    #[test]
    fn corrupt_input_is_an_error() {
        let good = completed(StoredBody::Stored(Bytes::from_static(b"abc"))).encode();
        assert_eq!(
            Record::decode(good.slice(..good.len() - 1)),
            Err(DecodeError::Truncated)
        );
        let mut trailing = good.to_vec();
        trailing.push(0);
        assert_eq!(Record::decode(trailing.into()), Err(DecodeError::Trailing));
        let mut future = good.to_vec();
        future[0] = 3;
        assert_eq!(
            Record::decode(future.into()),
            Err(DecodeError::UnknownFormat(3))
        );
        assert_eq!(Record::decode(Bytes::new()), Err(DecodeError::Truncated));
    }

    #[test]
    fn a_compacted_record_is_equal_but_owns_its_bytes() {
        let buffer = Bytes::from(vec![b'x'; 8192]);
        let rec = Completed::clear(
            Fingerprint::from_bytes([7; 32]),
            StatusCode::OK,
            vec![(
                HeaderName::from_static("content-type"),
                HeaderValue::from_maybe_shared(buffer.slice(0..4)).expect("visible"),
            )],
            StoredBody::Stored(buffer.slice(100..1124)),
        );
        let compact = rec.compacted();
        assert_eq!(compact, rec);
        let response = compact.clear_response().expect("in clear");
        let StoredBody::Stored(body) = &response.body else {
            panic!("stored")
        };
        let within = |p: *const u8| buffer.as_ptr_range().contains(&p);
        assert!(
            !within(body.as_ptr()),
            "the body no longer points into the 8 KiB buffer"
        );
        assert!(
            !within(response.headers[0].1.as_bytes().as_ptr()),
            "nor does the header value"
        );
    }

    fn sealed(too_large: bool, times: Option<Times>) -> Completed {
        Completed {
            fingerprint: Fingerprint::from_bytes([5; 32]),
            kept: Kept::Sealed(Sealed {
                key_id: "2026-12".into(),
                too_large,
                nonce: [4; NONCE_LEN],
                ciphertext: Bytes::from_static(b"\x01\x02ciphertext and tag"),
                opened: OpenedOnce::default(),
            }),
            times,
            unknown: false,
            streamed: None,
        }
    }

    /// A sealed record keeps its fingerprint, times and body flag readable, and its
    /// response opaque, in either format.
    #[test]
    fn sealed_records_round_trip_with_their_key_id_and_nonce() {
        let times = Some(Times {
            claimed_ms: 1_700_000_000_000,
            completed_ms: 1_700_000_000_250,
        });
        let unknown = Completed {
            unknown: true,
            ..sealed(false, times)
        };
        for rec in [
            sealed(false, times),
            sealed(true, times),
            sealed(false, None),
            unknown,
        ] {
            let bytes = rec.encode();
            assert_eq!(bytes[1], KIND_SEALED);
            assert_eq!(
                &bytes[2..34],
                &[5; 32],
                "the fingerprint is where a clear record has it"
            );
            assert_eq!(
                rec.replayable(),
                !matches!(&rec.kept, Kept::Sealed(s) if s.too_large)
            );
            assert_eq!(Record::decode(bytes), Ok(Record::Completed(Arc::new(rec))));
        }
        let good = sealed(false, times).encode();
        assert_eq!(
            Record::decode(good.slice(..good.len() - 1)),
            Err(DecodeError::Truncated)
        );
    }

    /// Whether the outcome is unknown is kept beside the body flag, readable without a
    /// key; records written before it (flags 0 and 1) still load, as known outcomes.
    #[test]
    fn the_unknown_flag_round_trips_beside_the_body_flag() {
        for (too_large, unknown) in [(false, false), (true, false), (false, true), (true, true)] {
            let body = if too_large {
                StoredBody::TooLarge
            } else {
                StoredBody::Stored(Bytes::from_static(b"{}"))
            };
            let rec = Completed {
                unknown,
                ..completed(body)
            };
            let bytes = rec.encode();
            assert_eq!(bytes[36], u8::from(too_large) | (u8::from(unknown) << 1));
            assert_eq!(Record::decode(bytes), Ok(Record::Completed(Arc::new(rec))));
        }
        let mut bad = completed(StoredBody::TooLarge).encode().to_vec();
        bad[36] = 8;
        assert_eq!(
            Record::decode(bad.into()),
            Err(DecodeError::Invalid("flags"))
        );
    }

    /// What a sealed record encrypts reads back as the response it was.
    #[test]
    fn a_response_encoding_round_trips_for_sealing() {
        let rec = completed(StoredBody::Stored(Bytes::from_static(b"{}")));
        let response = rec.clear_response().expect("in clear");
        let mut out = BytesMut::new();
        response.encode_into(&mut out);
        assert_eq!(
            StoredResponse::decode(out.freeze(), false).as_ref(),
            Ok(response)
        );
    }

    /// A streamed request's marker is format 3, one flags byte longer, with the owner
    /// token and lease deadline where every marker has them (the Redis scripts read them
    /// there).
    #[test]
    fn a_streamed_marker_round_trips_as_format_3() {
        let marker = InFlight {
            fingerprint: Fingerprint::from_bytes([1; 32]),
            token: OwnerToken::from_bytes([9; 16]),
            lease_deadline_ms: 1_700_000_000_123,
            claimed_at_ms: Some(1_700_000_000_000),
            streamed: true,
        };
        let bytes = marker.encode();
        assert_eq!(bytes.len(), 67);
        assert_eq!(bytes[0], FORMAT_V3);
        assert_eq!(&bytes[TOKEN_RANGE], &[9; 16]);
        assert_eq!(&bytes[50..58], &1_700_000_000_123u64.to_be_bytes());
        assert_eq!(Record::decode(bytes.clone()), Ok(Record::InFlight(marker)));
        let mut bad = bytes.to_vec();
        bad[66] = 2;
        assert_eq!(
            Record::decode(bad.into()),
            Err(DecodeError::Invalid("marker flags"))
        );
        // Format 3 is a marker's only.
        let mut completed_v3 = completed(StoredBody::TooLarge).encode().to_vec();
        completed_v3[0] = FORMAT_V3;
        assert_eq!(
            Record::decode(completed_v3.into()),
            Err(DecodeError::UnknownFormat(FORMAT_V3))
        );
    }

    /// A streamed record keeps its up-front fingerprint and whether its body was hashed
    /// whole, in clear and sealed alike.
    #[test]
    fn a_streamed_record_round_trips_with_its_upfront_fingerprint() {
        for whole in [true, false] {
            let streamed = Some(Streamed {
                upfront: Fingerprint::from_bytes([6; 32]),
                whole,
            });
            let clear = Completed {
                streamed,
                ..completed(StoredBody::Stored(Bytes::from_static(b"{}")))
            };
            let bytes = clear.encode();
            assert_eq!(bytes[36] & 12, 4 | (u8::from(whole) << 3));
            assert_eq!(
                Record::decode(bytes),
                Ok(Record::Completed(Arc::new(clear)))
            );
            let sealed = Completed {
                streamed,
                ..sealed(false, None)
            };
            assert_eq!(
                Record::decode(sealed.encode()),
                Ok(Record::Completed(Arc::new(sealed)))
            );
        }
    }

    /// Records of format 2 written before streaming existed, byte by byte: they load as
    /// buffered requests' records.
    #[test]
    fn format_2_records_from_before_streaming_still_load() {
        let mut marker = vec![FORMAT_V2, KIND_IN_FLIGHT];
        marker.extend([1; 32]);
        marker.extend([9; 16]);
        marker.extend(1_700_000_000_123u64.to_be_bytes());
        marker.extend(1_700_000_000_000u64.to_be_bytes());
        assert_eq!(
            Record::decode(marker.into()),
            Ok(Record::InFlight(InFlight {
                fingerprint: Fingerprint::from_bytes([1; 32]),
                token: OwnerToken::from_bytes([9; 16]),
                lease_deadline_ms: 1_700_000_000_123,
                claimed_at_ms: Some(1_700_000_000_000),
                streamed: false,
            }))
        );
        let mut done = vec![FORMAT_V2, KIND_COMPLETED];
        done.extend([7; 32]);
        done.extend(201u16.to_be_bytes());
        done.push(2);
        done.extend(1_700_000_000_000u64.to_be_bytes());
        done.extend(1_700_000_000_250u64.to_be_bytes());
        done.extend(0u16.to_be_bytes());
        done.extend(2u32.to_be_bytes());
        done.extend(b"ok");
        let Ok(Record::Completed(old)) = Record::decode(done.into()) else {
            panic!("a format 2 record decodes")
        };
        assert_eq!(old.streamed, None);
        assert!(old.unknown);
        assert_eq!(old.fingerprint, Fingerprint::from_bytes([7; 32]));
        let response = old.clear_response().expect("in clear");
        assert_eq!(response.body, StoredBody::Stored(Bytes::from_static(b"ok")));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Record::decode(raw.into());
        }

        #[test]
        fn decoding_mutated_records_never_panics(idx in 0usize..80, byte in any::<u8>(), seal in any::<bool>()) {
            let rec = if seal { sealed(false, None) } else { completed(StoredBody::Stored(Bytes::from_static(b"body"))) };
            let mut bytes = rec.encode().to_vec();
            let i = idx % bytes.len();
            bytes[i] = byte;
            let _ = Record::decode(bytes.into());
        }

        #[test]
        fn any_completed_round_trips(status in 100u16..600, body in proptest::collection::vec(any::<u8>(), 0..100),
                                     values in proptest::collection::vec("[ -~]{0,20}", 0..5),
                                     times in proptest::option::of((any::<u64>(), any::<u64>()))) {
            let mut rec = Completed::clear(
                Fingerprint::from_bytes([3; 32]),
                StatusCode::from_u16(status).expect("status in range"),
                values.iter().map(|v| (HeaderName::from_static("x-v"), HeaderValue::from_str(v).expect("visible"))).collect(),
                StoredBody::Stored(body.into()),
            );
            rec.times = times.map(|(claimed_ms, completed_ms)| Times { claimed_ms, completed_ms });
            prop_assert_eq!(Record::decode(rec.encode()), Ok(Record::Completed(Arc::new(rec))));
        }
    }
}
