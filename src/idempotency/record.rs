//! What a store keeps under a scoped key: an in-flight marker or a completed response.
//!
//! The wire encoding is compact and versioned so that a later format can be read side by
//! side with this one. Layout (all integers big-endian):
//!
//! ```text
//! [0] format: 1 or 2   [1] kind: 1 = in-flight, 2 = completed   [2..34] fingerprint
//! in-flight:  [34..50] owner token   [50..58] lease deadline, unix ms
//!             format 2 only: [58..66] claimed at, unix ms
//! completed:  [34..36] status   [36] body: 0 = stored, 1 = too large to keep
//!             format 2 only: [37..45] claimed at, [45..53] completed at, unix ms
//!             then u16 header count, then per header: u16 name len, name, u32 value
//!             len, value; then u32 body len, body (raw bytes)
//! ```
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
pub const KIND_IN_FLIGHT: u8 = 1;
pub const KIND_COMPLETED: u8 = 2;
/// Length of an encoded in-flight marker of format 1; format 2 adds 8 bytes.
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
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: StoredBody,
    /// `None` in a format 1 record; set by the proxy before the first attempt to record
    /// it, so that a repeated attempt writes the same bytes.
    pub times: Option<Times>,
}

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
        out.put_u8(if self.claimed_at_ms.is_some() {
            FORMAT_V2
        } else {
            FORMAT_V1
        });
        out.put_u8(KIND_IN_FLIGHT);
        out.put_slice(self.fingerprint.as_bytes());
        out.put_slice(self.token.as_bytes());
        out.put_u64(self.lease_deadline_ms);
        if let Some(at) = self.claimed_at_ms {
            out.put_u64(at);
        }
    }
}

impl Completed {
    pub fn encode(&self) -> Bytes {
        let body_len = match &self.body {
            StoredBody::Stored(b) => b.len(),
            StoredBody::TooLarge => 0,
        };
        let headers_len: usize = self
            .headers
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum();
        let mut out = BytesMut::with_capacity(59 + headers_len + body_len);
        self.encode_into(&mut out);
        out.freeze()
    }

    /// The encoding of [`Completed::encode`], appended to `out`.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        let body: &[u8] = match &self.body {
            StoredBody::Stored(b) => b,
            StoredBody::TooLarge => &[],
        };
        out.put_u8(if self.times.is_some() {
            FORMAT_V2
        } else {
            FORMAT_V1
        });
        out.put_u8(KIND_COMPLETED);
        out.put_slice(self.fingerprint.as_bytes());
        out.put_u16(self.status.as_u16());
        out.put_u8(u8::from(matches!(self.body, StoredBody::TooLarge)));
        if let Some(times) = self.times {
            out.put_u64(times.claimed_ms);
            out.put_u64(times.completed_ms);
        }
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
}

impl Completed {
    /// The same record in allocations of its own. hyper hands out bodies and header
    /// values as slices of its (8 KiB and larger) read buffers; a record kept in memory
    /// for hours must not keep a whole buffer alive for a 1 KiB body.
    pub fn compacted(&self) -> Completed {
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
        Completed {
            fingerprint: self.fingerprint,
            status: self.status,
            headers,
            body,
            times: self.times,
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
        if format != FORMAT_V1 && format != FORMAT_V2 {
            return Err(DecodeError::UnknownFormat(format));
        }
        let timed = format == FORMAT_V2;
        let kind = buf.get_u8();
        need(&buf, 32)?;
        let mut fp = [0u8; 32];
        buf.copy_to_slice(&mut fp);
        let fingerprint = Fingerprint::from_bytes(fp);
        let record = match kind {
            KIND_IN_FLIGHT => {
                need(&buf, if timed { 32 } else { 24 })?;
                let mut token = [0u8; 16];
                buf.copy_to_slice(&mut token);
                Record::InFlight(InFlight {
                    fingerprint,
                    token: OwnerToken::from_bytes(token),
                    lease_deadline_ms: buf.get_u64(),
                    claimed_at_ms: timed.then(|| buf.get_u64()),
                })
            }
            KIND_COMPLETED => {
                need(&buf, 3)?;
                let status = StatusCode::from_u16(buf.get_u16())
                    .map_err(|_| DecodeError::Invalid("status"))?;
                let too_large = match buf.get_u8() {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Invalid("body flag")),
                };
                let times = if timed {
                    need(&buf, 16)?;
                    Some(Times {
                        claimed_ms: buf.get_u64(),
                        completed_ms: buf.get_u64(),
                    })
                } else {
                    None
                };
                need(&buf, 2)?;
                let count = buf.get_u16();
                let mut headers = Vec::with_capacity(usize::from(count).min(256));
                for _ in 0..count {
                    need(&buf, 2)?;
                    let len = usize::from(buf.get_u16());
                    let name = take(&mut buf, len)?;
                    let name = HeaderName::from_bytes(&name)
                        .map_err(|_| DecodeError::Invalid("header name"))?;
                    need(&buf, 4)?;
                    let len = buf.get_u32() as usize;
                    let value = take(&mut buf, len)?;
                    let value = HeaderValue::from_maybe_shared(value)
                        .map_err(|_| DecodeError::Invalid("header value"))?;
                    headers.push((name, value));
                }
                need(&buf, 4)?;
                let len = buf.get_u32() as usize;
                let body = take(&mut buf, len)?;
                let body = if too_large {
                    StoredBody::TooLarge
                } else {
                    StoredBody::Stored(body)
                };
                Record::Completed(Arc::new(Completed {
                    fingerprint,
                    status,
                    headers,
                    body,
                    times,
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
        Completed {
            fingerprint: Fingerprint::from_bytes([7; 32]),
            status: StatusCode::CREATED,
            headers: vec![
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
            times: Some(Times {
                claimed_ms: 1_700_000_000_000,
                completed_ms: 1_700_000_000_250,
            }),
        }
    }

    #[test]
    fn in_flight_round_trips_with_fixed_token_offset() {
        let marker = InFlight {
            fingerprint: Fingerprint::from_bytes([1; 32]),
            token: OwnerToken::from_bytes([9; 16]),
            lease_deadline_ms: 1_700_000_000_123,
            claimed_at_ms: Some(1_700_000_000_000),
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
        assert_eq!(old.status, StatusCode::CREATED);
        assert_eq!(old.times, None);
        assert_eq!(old.body, StoredBody::Stored(Bytes::from_static(b"ok")));
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
        let rec = Completed {
            fingerprint: Fingerprint::from_bytes([7; 32]),
            status: StatusCode::OK,
            headers: vec![(
                HeaderName::from_static("content-type"),
                HeaderValue::from_maybe_shared(buffer.slice(0..4)).expect("visible"),
            )],
            body: StoredBody::Stored(buffer.slice(100..1124)),
            times: None,
        };
        let compact = rec.compacted();
        assert_eq!(compact, rec);
        let StoredBody::Stored(body) = &compact.body else {
            panic!("stored")
        };
        let within = |p: *const u8| buffer.as_ptr_range().contains(&p);
        assert!(
            !within(body.as_ptr()),
            "the body no longer points into the 8 KiB buffer"
        );
        assert!(
            !within(compact.headers[0].1.as_bytes().as_ptr()),
            "nor does the header value"
        );
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Record::decode(raw.into());
        }

        #[test]
        fn decoding_mutated_records_never_panics(idx in 0usize..80, byte in any::<u8>()) {
            let mut bytes = completed(StoredBody::Stored(Bytes::from_static(b"body"))).encode().to_vec();
            let i = idx % bytes.len();
            bytes[i] = byte;
            let _ = Record::decode(bytes.into());
        }

        #[test]
        fn any_completed_round_trips(status in 100u16..600, body in proptest::collection::vec(any::<u8>(), 0..100),
                                     values in proptest::collection::vec("[ -~]{0,20}", 0..5),
                                     times in proptest::option::of((any::<u64>(), any::<u64>()))) {
            let rec = Completed {
                fingerprint: Fingerprint::from_bytes([3; 32]),
                status: StatusCode::from_u16(status).expect("status in range"),
                headers: values.iter().map(|v| (HeaderName::from_static("x-v"), HeaderValue::from_str(v).expect("visible"))).collect(),
                body: StoredBody::Stored(body.into()),
                times: times.map(|(claimed_ms, completed_ms)| Times { claimed_ms, completed_ms }),
            };
            prop_assert_eq!(Record::decode(rec.encode()), Ok(Record::Completed(Arc::new(rec))));
        }
    }
}
