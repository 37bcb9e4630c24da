//! A record in bytes (docs/behaviour.md §4, §17, §19).
//!
//! The wire encoding is compact and versioned so that a later format can be read side by
//! side with this one. Layout (all integers big-endian):
//!
//! ```text
//! [0] format: 1 to 4   [1] kind: 1 = in-flight, 2 = completed, 3 or 4 = sealed
//! [2..34] fingerprint
//! in-flight:  [34..50] owner token   [50..58] lease deadline, unix ms
//!             formats 2 to 4: [58..66] claimed at, unix ms
//!             formats 3 and 4: [66] flags: bit 0 = streamed (docs/behaviour.md §19)
//!             format 4: [67..] the fingerprint rules (`rules.rs`)
//! completed:  [34..36] status   [36] flags: bit 0 = body too large to keep, bit 1 =
//!             outcome unknown (a record written before that flag has 0 or 1), bit 2 =
//!             streamed, bit 3 = the streamed body was hashed whole
//!             formats 2 and 4: [37..45] claimed at, [45..53] completed at, unix ms
//!             streamed only: 32 bytes, the up-front fingerprint
//!             format 4: the fingerprint rules
//!             then u16 header count, then per header: u16 name len, name, u32 value
//!             len, value; then u32 body len, body (raw bytes)
//! sealed:     [34] flags, as above   formats 2 and 4: [35..51] the two times
//!             streamed only: 32 bytes, the up-front fingerprint
//!             format 4: the fingerprint rules
//!             then u8 key id len, key id (the record's "sealed head" ends here),
//!             12-byte nonce, u32 len, ciphertext: the status (u16) and the headers
//!             and body laid out as above, under AEAD
//! ```
//!
//! A sealed record of kind 4 has the sealed head, every byte it keeps in clear, in its
//! seal's associated data (docs/behaviour.md §25); one of kind 3, written before that,
//! has the record's address alone ([`Binds`]). A version that predates kind 4 refuses it
//! as unreadable, never replayed.
//!
//! A streamed request's marker is format 3, and its record sets the streamed flag: a
//! version that predates them refuses both as unreadable (never replayed, never
//! forwarded) rather than comparing the wrong fingerprint. Everything else is written
//! exactly as before streaming existed.
//!
//! Format 4 keeps the rules the record's fingerprint was made under
//! (docs/behaviour.md §24), so that a retry is compared under them; every record made by
//! this version is format 4, and records of formats 1 to 3, which predate it, are
//! compared under the rules in force. A version that predates format 4 refuses it as
//! unreadable.
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

use super::{
    Binds, Completed, DecodeError, FORMAT_V1, FORMAT_V2, FORMAT_V3, FORMAT_V4, IN_FLIGHT_LEN,
    InFlight, KIND_COMPLETED, KIND_IN_FLIGHT, KIND_SEALED, KIND_SEALED_ADDRESS_ONLY, Kept,
    MAX_KEY_ID_LEN, NONCE_LEN, OpenedOnce, OwnerToken, Record, Sealed, StoredBody, StoredResponse,
    Streamed, Times,
};
use crate::idempotency::Fingerprint;
use crate::idempotency::rules::{KeptRules, Rules};

/// Room for the rules of a typical policy in an encoding's first allocation.
const RULES_ROOM: usize = 24;

impl InFlight {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(IN_FLIGHT_LEN + 9 + RULES_ROOM);
        self.encode_into(&mut out);
        out.freeze()
    }

    /// The encoding of [`InFlight::encode`], appended to `out`.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        // A marker with rules or a streamed one always has its time: the claim that
        // writes it sets one.
        let rules = self.fingerprint.rules();
        let format = match (rules, self.streamed, self.claimed_at_ms) {
            (Some(_), _, _) => FORMAT_V4,
            (None, true, _) => FORMAT_V3,
            (None, false, Some(_)) => FORMAT_V2,
            (None, false, None) => FORMAT_V1,
        };
        out.put_u8(format);
        out.put_u8(KIND_IN_FLIGHT);
        out.put_slice(self.fingerprint.as_bytes());
        out.put_slice(self.token.as_bytes());
        out.put_u64(self.lease_deadline_ms);
        if format != FORMAT_V1 {
            out.put_u64(self.claimed_at_ms.unwrap_or(0));
        }
        if format == FORMAT_V4 {
            out.put_u8(if self.streamed { IN_FLIGHT_STREAMED } else { 0 });
        } else if self.streamed {
            out.put_u8(IN_FLIGHT_STREAMED);
        }
        if let Some(rules) = rules {
            rules.encode_into(out);
        }
    }
}

impl Completed {
    /// The flags byte: bit 0, the body was too large to keep; bit 1, the outcome is
    /// unknown; bit 2, the request was streamed; bit 3, its body was hashed whole.
    fn flags(&self) -> u8 {
        let streamed = match self.streamed {
            None => 0,
            Some(Streamed { whole, .. }) => FLAG_STREAMED | (u8::from(whole) << 3),
        };
        u8::from(!self.replayable()) | (u8::from(self.unknown) << 1) | streamed
    }

    pub fn encode(&self) -> Bytes {
        // Format, kind, fingerprint, body flag and times, then the response's own.
        let head = 2 + 32 + 1 + 16 + RULES_ROOM + if self.streamed.is_some() { 32 } else { 0 };
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
        match &self.kept {
            Kept::Clear(response) => {
                out.put_u8(self.format());
                out.put_u8(KIND_COMPLETED);
                out.put_slice(self.fingerprint.as_bytes());
                out.put_u16(response.status.as_u16());
                out.put_u8(self.flags());
                self.encode_times(out);
                response.encode_parts(out);
            }
            Kept::Sealed(sealed) => {
                self.encode_sealed_head(sealed, out);
                out.put_slice(&sealed.nonce);
                out.put_u32(u32::try_from(sealed.ciphertext.len()).unwrap_or(u32::MAX));
                out.put_slice(&sealed.ciphertext);
            }
        }
    }

    /// What a record sealed as `sealed` keeps in clear, laid out as it is stored: format,
    /// kind, fingerprint, flags, times, up-front fingerprint and key id. Under
    /// [`Binds::Record`] these bytes are in the seal's associated data
    /// (docs/behaviour.md §25), so that the one layout decides both what is stored and
    /// what is bound, and a field added to it later is bound without a second thought.
    pub fn encode_sealed_head(&self, sealed: &Sealed, out: &mut impl BufMut) {
        out.put_u8(self.format());
        out.put_u8(match sealed.binds {
            Binds::Address => KIND_SEALED_ADDRESS_ONLY,
            Binds::Record => KIND_SEALED,
        });
        out.put_slice(self.fingerprint.as_bytes());
        out.put_u8(self.flags());
        self.encode_times(out);
        // Config checks keep ids far shorter; saturating keeps a bad one detectable on
        // decode rather than misframed.
        let id = sealed.key_id.as_bytes();
        let id = &id[..id.len().min(MAX_KEY_ID_LEN)];
        out.put_u8(u8::try_from(id.len()).unwrap_or(u8::MAX));
        out.put_slice(id);
    }

    /// Format 4 when the record has its rules, else 2 when it has its times, else 1.
    fn format(&self) -> u8 {
        match (self.fingerprint.rules(), self.times) {
            (Some(_), _) => FORMAT_V4,
            (None, Some(_)) => FORMAT_V2,
            (None, None) => FORMAT_V1,
        }
    }

    /// The times, then a streamed record's up-front fingerprint, then the rules. A
    /// record with rules has its times: the proxy stamps them before it stores one.
    fn encode_times(&self, out: &mut impl BufMut) {
        let rules = self.fingerprint.rules();
        if self.times.is_some() || rules.is_some() {
            let times = self.times.unwrap_or(Times {
                claimed_ms: 0,
                completed_ms: 0,
            });
            out.put_u64(times.claimed_ms);
            out.put_u64(times.completed_ms);
        }
        if let Some(streamed) = &self.streamed {
            out.put_slice(streamed.upfront.as_bytes());
        }
        if let Some(rules) = rules {
            rules.encode_into(out);
        }
    }
}

impl StoredResponse {
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
        if !(FORMAT_V1..=FORMAT_V4).contains(&format) {
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
                let streamed = match format {
                    FORMAT_V3 | FORMAT_V4 => {
                        need(&buf, 1)?;
                        match buf.get_u8() {
                            IN_FLIGHT_STREAMED => true,
                            0 if format == FORMAT_V4 => false,
                            _ => return Err(DecodeError::Invalid("marker flags")),
                        }
                    }
                    _ => false,
                };
                let rules = decode_rules(&mut buf, format)?;
                Record::InFlight(InFlight {
                    fingerprint: fingerprint.with_rules(rules),
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
                let rules = decode_rules(&mut buf, format)?;
                let response = StoredResponse::decode_parts(&mut buf, status, too_large)?;
                Record::Completed(Arc::new(Completed {
                    fingerprint: fingerprint.with_rules(rules),
                    streamed: with_rules(streamed, rules),
                    kept: Kept::Clear(response),
                    times,
                    unknown,
                }))
            }
            KIND_SEALED | KIND_SEALED_ADDRESS_ONLY => {
                let binds = if kind == KIND_SEALED {
                    Binds::Record
                } else {
                    Binds::Address
                };
                need(&buf, 1)?;
                let (too_large, unknown, streamed) = flags(buf.get_u8())?;
                let times = decode_times(&mut buf, timed)?;
                let streamed = decode_streamed(&mut buf, streamed)?;
                let rules = decode_rules(&mut buf, format)?;
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
                    fingerprint: fingerprint.with_rules(rules),
                    kept: Kept::Sealed(Sealed {
                        key_id,
                        binds,
                        too_large,
                        nonce,
                        ciphertext,
                        opened: OpenedOnce::default(),
                    }),
                    times,
                    unknown,
                    streamed: with_rules(streamed, rules),
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

/// The fingerprint rules of a format 4 record; `None` for an older one.
fn decode_rules(buf: &mut Bytes, format: u8) -> Result<Option<Rules>, DecodeError> {
    if format != FORMAT_V4 {
        return Ok(None);
    }
    KeptRules::decode(buf)
        .map(Some)
        .map_err(|_| DecodeError::Invalid("fingerprint rules"))
}

/// A streamed record's up-front fingerprint, made under the record's rules too.
fn with_rules(streamed: Option<Streamed>, rules: Option<Rules>) -> Option<Streamed> {
    streamed.map(|streamed| Streamed {
        upfront: streamed.upfront.with_rules(rules),
        ..streamed
    })
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
