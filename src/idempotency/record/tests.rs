use super::*;
use bytes::BytesMut;
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
            binds: Binds::Record,
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
    let mut before_every_field_was_bound = sealed(false, times);
    if let Kept::Sealed(s) = &mut before_every_field_was_bound.kept {
        s.binds = Binds::Address;
    }
    for rec in [
        sealed(false, times),
        sealed(true, times),
        sealed(false, None),
        unknown,
        before_every_field_was_bound,
    ] {
        let bytes = rec.encode();
        let Kept::Sealed(s) = &rec.kept else {
            panic!("sealed")
        };
        let kind = match s.binds {
            Binds::Record => KIND_SEALED,
            Binds::Address => KIND_SEALED_ADDRESS_ONLY,
        };
        assert_eq!(bytes[1], kind);
        // The sealed head is every byte stored ahead of the nonce and the ciphertext.
        let mut head = Vec::new();
        rec.encode_sealed_head(s, &mut head);
        assert_eq!(head.len(), bytes.len() - NONCE_LEN - 4 - s.ciphertext.len());
        assert!(bytes.starts_with(&head));
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

/// Rules other than the defaults, interned as a fingerprint holds them.
fn json_rules() -> crate::idempotency::rules::Rules {
    use crate::idempotency::fingerprint::{BodyForm, FingerprintRules};
    use crate::idempotency::pointer::JsonPointer;
    let headers = [HeaderName::from_static("x-tenant")];
    let ignore = [JsonPointer::parse("/nonce").expect("pointer")];
    crate::idempotency::rules::KeptRules::intern(&FingerprintRules {
        headers: &headers,
        query: false,
        body: BodyForm::Json,
        ignore: &ignore,
    })
    .expect("few sets")
}

fn rules_of(record: &Record) -> Option<crate::idempotency::rules::Rules> {
    match record {
        Record::InFlight(m) => m.fingerprint.rules(),
        Record::Completed(c) => c.fingerprint.rules(),
    }
}

/// Format 4 (docs/behaviour.md §24): markers, streamed or not, keep their token and
/// deadline where the Redis scripts read them, and every record reads back the rules its
/// fingerprint was made under; a streamed record's up-front fingerprint gets them too.
#[test]
fn format_4_keeps_the_rules_a_record_was_made_under() {
    let rules = json_rules();
    let fingerprint = Fingerprint::from_bytes([1; 32]).with_rules(Some(rules));
    for streamed in [false, true] {
        let marker = InFlight {
            fingerprint,
            token: OwnerToken::from_bytes([9; 16]),
            lease_deadline_ms: 1_700_000_000_123,
            claimed_at_ms: Some(1_700_000_000_000),
            streamed,
        };
        let bytes = marker.encode();
        assert_eq!(bytes[0], FORMAT_V4);
        assert!(
            bytes.len() >= 68,
            "the Redis scripts' shortest format 4 marker"
        );
        assert_eq!(&bytes[TOKEN_RANGE], &[9; 16]);
        assert_eq!(&bytes[50..58], &1_700_000_000_123u64.to_be_bytes());
        let back = Record::decode(bytes.clone()).expect("reads back");
        assert!(rules_of(&back).is_some_and(|r| std::ptr::eq(r, rules)));
        // Byte for byte: native fencing compares a marker read back and encoded again
        // with the one stored (`store/redis/fence.rs`).
        assert_eq!(back.encode(), bytes);
        assert_eq!(back, Record::InFlight(marker));
    }
    let mut clear = completed(StoredBody::Stored(Bytes::from_static(b"body")));
    clear.fingerprint = fingerprint;
    clear.streamed = Some(Streamed {
        upfront: Fingerprint::from_bytes([2; 32]).with_rules(Some(rules)),
        whole: true,
    });
    let mut sealed = sealed(false, clear.times);
    sealed.fingerprint = fingerprint;
    for record in [clear, sealed] {
        let bytes = record.encode();
        assert_eq!(bytes[0], FORMAT_V4);
        let back = Record::decode(bytes).expect("reads back");
        assert!(rules_of(&back).is_some_and(|r| std::ptr::eq(r, rules)));
        if let Record::Completed(c) = &back
            && let Some(streamed) = c.streamed
        {
            assert!(
                streamed
                    .upfront
                    .rules()
                    .is_some_and(|r| std::ptr::eq(r, rules))
            );
        }
        assert_eq!(back, Record::Completed(Arc::new(record)));
    }
}

/// Records of the formats before 4 keep no rules: they are compared under those in force.
#[test]
fn records_before_format_4_read_back_without_rules() {
    let old = completed(StoredBody::TooLarge);
    assert_eq!(old.encode()[0], FORMAT_V2);
    assert_eq!(
        rules_of(&Record::decode(old.encode()).expect("reads")),
        None
    );
    let mut bad = old.encode().to_vec();
    bad[0] = FORMAT_V4;
    assert!(
        Record::decode(bad.into()).is_err(),
        "format 4 without its rules"
    );
}

proptest! {
    #[test]
    fn decoding_mutated_format_4_records_never_panics(idx in 0usize..120, byte in any::<u8>(), kind in 0u8..3) {
        let fingerprint = Fingerprint::from_bytes([1; 32]).with_rules(Some(json_rules()));
        let record = match kind {
            0 => Record::InFlight(InFlight {
                fingerprint,
                token: OwnerToken::from_bytes([9; 16]),
                lease_deadline_ms: 5,
                claimed_at_ms: Some(1),
                streamed: false,
            }),
            1 => Record::Completed(Arc::new(Completed { fingerprint, ..completed(StoredBody::TooLarge) })),
            _ => Record::Completed(Arc::new(Completed { fingerprint, ..sealed(false, None) })),
        };
        let mut bytes = record.encode().to_vec();
        let i = idx % bytes.len();
        bytes[i] = byte;
        let _ = Record::decode(bytes.into());
    }
}
