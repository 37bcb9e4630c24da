use std::fs;
use std::path::Path;

use super::*;
use crate::idempotency::ScopedKey;

/// The directory around the journal: lock, strays, the redb store, staging leftovers.
mod dir_rules;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Owned {
    Put([u8; 32], u64, Vec<u8>, Option<[u8; 16]>),
    Remove([u8; 32]),
}

fn own(entry: Entry<'_>) -> Owned {
    match entry {
        Entry::Put {
            key,
            expires_ms,
            record,
            scope,
        } => Owned::Put(
            *key.as_bytes(),
            expires_ms,
            record.to_vec(),
            scope.map(|s| *s.as_bytes()),
        ),
        Entry::Remove { key } => Owned::Remove(*key.as_bytes()),
    }
}

fn put(key: u8, expires_ms: u64, record: &[u8]) -> Owned {
    Owned::Put([key; 32], expires_ms, record.to_vec(), None)
}

/// A put of a record with its request's scope (`store.max_entries_per_scope`).
fn put_scoped(key: u8, expires_ms: u64, record: &[u8], scope: u8) -> Owned {
    Owned::Put([key; 32], expires_ms, record.to_vec(), Some([scope; 16]))
}

fn remove(key: u8) -> Owned {
    Owned::Remove([key; 32])
}

fn enc(entries: &[Owned]) -> Vec<u8> {
    let mut buf = Vec::new();
    for entry in entries {
        let entry = match entry {
            Owned::Put(key, expires_ms, record, scope) => Entry::Put {
                key: ScopedKey::from_bytes(*key),
                expires_ms: *expires_ms,
                record,
                scope: scope.map(crate::idempotency::ScopeId::from_bytes),
            },
            Owned::Remove(key) => Entry::Remove {
                key: ScopedKey::from_bytes(*key),
            },
        };
        encode(&entry, &mut buf);
    }
    buf
}

fn open(dir: &Path) -> Result<(Journal, Vec<Owned>), OpenError> {
    let mut seen = Vec::new();
    let journal = Journal::open(dir, true, |entry| seen.push(own(entry)))?;
    Ok((journal, seen))
}

fn open_ok(dir: &Path) -> (Journal, Vec<Owned>) {
    open(dir).expect("the journal opens")
}

fn journal_bytes(dir: &Path) -> Vec<u8> {
    fs::read(dir.join(JOURNAL_FILE)).expect("read the journal")
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = frame_head(payload).expect("a small frame").to_vec();
    out.extend_from_slice(payload);
    out
}

/// A header of `format`: this one's with both slots saying nothing but the header is
/// durable, another's as far as its format number.
fn header(format: u64) -> Vec<u8> {
    if format == FORMAT {
        return header::new(HEADER).to_vec();
    }
    let mut out = header::MAGIC.to_vec();
    out.extend_from_slice(&format.to_be_bytes());
    out
}

/// What the header says was made durable.
fn durable(dir: &Path) -> u64 {
    let file = File::open(dir.join(JOURNAL_FILE)).expect("open");
    match header::read(&file) {
        Ok(header) => header.durable,
        Err(_) => panic!("the header reads"),
    }
}

/// A journal of three frames; returns the frames' entries and the offset of each frame.
fn three_frames(dir: &Path) -> (Vec<Vec<Owned>>, Vec<u64>) {
    let frames = vec![
        vec![put(1, 10, b"one"), remove(9)],
        vec![put(2, 20, &[7u8; 300])],
        vec![put(3, 30, b""), remove(1)],
    ];
    let (mut journal, seen) = open_ok(dir);
    assert!(seen.is_empty());
    let mut offsets = Vec::new();
    for entries in &frames {
        offsets.push(journal.len());
        journal.append(&enc(entries)).expect("append");
    }
    // Without the zeros written ahead: the tests cut and damage the frames themselves.
    let end = journal.len();
    drop(journal);
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.join(JOURNAL_FILE))
        .expect("open");
    file.set_len(end).expect("cut the zeros written ahead");
    (frames, offsets)
}

/// With `fsync`, zeros are written ahead of the frames: an append then overwrites them
/// without growing the file, and an open reads the frames, takes the zeros for what
/// they are (not a torn tail to cut), and appends after the last frame.
#[test]
fn zeros_written_ahead_are_kept_and_written_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut journal, _) = open_ok(dir.path());
    journal.append(&enc(&[put(1, 10, b"one")])).expect("append");
    let size = journal_bytes(dir.path()).len() as u64;
    assert_eq!(size, PREALLOCATE, "written ahead");
    assert_eq!(journal.size(), size);
    assert!(journal.len() < size);
    journal.append(&enc(&[put(2, 20, b"two")])).expect("append");
    assert_eq!(journal_bytes(dir.path()).len() as u64, size, "no growth");
    let len = journal.len();
    drop(journal);
    let (mut journal, seen) = open_ok(dir.path());
    assert_eq!(seen, vec![put(1, 10, b"one"), put(2, 20, b"two")]);
    assert_eq!(journal.len(), len, "the frames end where they did");
    assert_eq!(journal_bytes(dir.path()).len() as u64, size, "nothing cut");
    journal.append(&enc(&[remove(1)])).expect("append");
    drop(journal);
    let (_, seen) = open_ok(dir.path());
    assert_eq!(
        seen,
        vec![put(1, 10, b"one"), put(2, 20, b"two"), remove(1)]
    );
}

fn assert_corrupt(dir: &Path, needle: &str) {
    let before = journal_bytes(dir);
    match open(dir) {
        Err(err @ OpenError::Corrupt { .. }) => {
            let message = err.to_string();
            assert!(message.contains(needle), "{message:?} names {needle:?}");
        }
        other => panic!("expected Corrupt naming {needle:?}, got {other:?}"),
    }
    assert_eq!(
        journal_bytes(dir),
        before,
        "a refused journal is left as it is"
    );
}

#[test]
fn round_trip_in_order_with_empty_and_large_records() {
    let dir = tempfile::tempdir().expect("temp dir");
    let large: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let frames = [
        vec![put(1, 1, b""), remove(2)],
        vec![put(3, u64::MAX, &large)],
        vec![put(4, 4, b"four"), put(1, 5, b"again"), remove(4)],
        vec![put_scoped(6, 6, b"scoped", 7), put(6, 7, b"unscoped")],
    ];
    let (mut journal, _) = open_ok(dir.path());
    for entries in &frames {
        journal.append(&enc(entries)).expect("append");
    }
    let len = journal.len();
    let size = journal.size();
    drop(journal);
    assert_eq!(
        fs::metadata(dir.path().join(JOURNAL_FILE))
            .expect("meta")
            .len(),
        size
    );
    let (journal, seen) = open_ok(dir.path());
    assert_eq!(seen, frames.concat());
    assert_eq!(journal.len(), len);
}

#[test]
fn torn_tails_are_cut_off_and_the_next_append_lands() {
    let tails: [(&str, Vec<u8>); 5] = [
        ("fewer bytes than a frame header", vec![0xff; 7]),
        ("one byte", vec![1]),
        ("declared end past the end", {
            let mut t = frame(&enc(&[put(5, 5, b"lost")]));
            t.truncate(t.len() - 1);
            t
        }),
        ("bad checksum at the end", {
            let mut t = frame(&enc(&[put(5, 5, b"lost")]));
            let last = t.len() - 1;
            t[last] ^= 1;
            t
        }),
        ("zeros to the end", vec![0; 4096]),
    ];
    for (kind, tail) in tails {
        let dir = tempfile::tempdir().expect("temp dir");
        let (frames, _) = three_frames(dir.path());
        let good = journal_bytes(dir.path());
        let mut torn = good.clone();
        torn.extend_from_slice(&tail);
        fs::write(dir.path().join(JOURNAL_FILE), &torn).expect("write");
        let (mut journal, seen) = open_ok(dir.path());
        assert_eq!(seen, frames.concat(), "{kind}");
        // Zeros are kept: the same as space written ahead, which the next append uses.
        let kept = if kind == "zeros to the end" {
            &torn
        } else {
            &good
        };
        assert_eq!(
            &journal_bytes(dir.path()),
            kept,
            "{kind}: the tail is cut off, zeros excepted"
        );
        assert_eq!(journal.len(), good.len() as u64, "{kind}");
        let next = vec![put(6, 6, b"after the cut")];
        journal.append(&enc(&next)).expect("append after the cut");
        drop(journal);
        let (_, seen) = open_ok(dir.path());
        assert_eq!(seen, [frames.concat(), next].concat(), "{kind}");
    }
}

#[test]
fn a_cut_at_every_length_of_the_last_frame_keeps_the_earlier_frames() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (frames, offsets) = three_frames(dir.path());
    let full = journal_bytes(dir.path());
    let last = offsets[2] as usize;
    for cut in last..=full.len() {
        fs::write(dir.path().join(JOURNAL_FILE), &full[..cut]).expect("write");
        let (journal, seen) = open_ok(dir.path());
        let expected = if cut == full.len() {
            frames.concat()
        } else {
            frames[..2].concat()
        };
        assert_eq!(seen, expected, "cut at {cut}");
        let kept = if cut == full.len() { cut } else { last };
        assert_eq!(journal.len(), kept as u64, "cut at {cut}");
        assert_eq!(journal_bytes(dir.path()).len(), kept, "cut at {cut}");
    }
}

#[test]
fn a_cut_inside_the_header_is_corrupt_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    let whole = header(FORMAT);
    for cut in 0..whole.len() {
        fs::write(dir.path().join(JOURNAL_FILE), &whole[..cut]).expect("write");
        assert_corrupt(dir.path(), "shorter than a journal header");
    }
}

#[test]
fn a_zero_length_journal_is_corrupt() {
    let dir = tempfile::tempdir().expect("temp dir");
    fs::write(dir.path().join(JOURNAL_FILE), b"").expect("write");
    assert_corrupt(dir.path(), "(0 bytes: empty or truncated)");
}

/// Damages the second of three frames with `damage` (given the bytes and the frames'
/// offsets): the open is refused as corrupt, naming that frame's offset.
fn assert_damage_to_the_second_frame_is_corrupt(damage: impl FnOnce(&mut [u8], &[u64])) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, offsets) = three_frames(dir.path());
    let mut bytes = journal_bytes(dir.path());
    damage(&mut bytes, &offsets);
    fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
    assert_corrupt(dir.path(), &format!("at byte {}", offsets[1]));
}

#[test]
fn a_flipped_byte_in_an_earlier_frame_is_corrupt_naming_its_offset() {
    // A byte of the second frame's payload (its record), not of its length.
    assert_damage_to_the_second_frame_is_corrupt(|bytes, offsets| {
        bytes[offsets[1] as usize + FRAME_HEAD as usize + 60] ^= 0x40;
    });
}

/// The head's own checksum: a length damaged to point past the end of the file is not
/// taken for an interrupted last write, which would cut the good frames after it.
#[test]
fn a_damaged_length_in_an_earlier_frame_is_corrupt_not_a_tail() {
    assert_damage_to_the_second_frame_is_corrupt(|bytes, offsets| {
        bytes[offsets[1] as usize] = 0x7F;
    });
}

#[test]
fn zeros_followed_by_a_frame_are_corrupt() {
    assert_damage_to_the_second_frame_is_corrupt(|bytes, offsets| {
        bytes[offsets[1] as usize..offsets[2] as usize].fill(0);
    });
}

#[test]
fn a_bad_entry_in_a_frame_with_a_good_checksum_is_corrupt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, _) = three_frames(dir.path());
    let mut bytes = journal_bytes(dir.path());
    let frame_at = bytes.len();
    let mut payload = enc(&[remove(4)]);
    payload.push(9);
    payload.extend_from_slice(&[0; 32]);
    bytes.extend_from_slice(&frame(&payload));
    fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
    let entry_at = frame_at + FRAME_HEAD as usize + 33;
    assert_corrupt(
        dir.path(),
        &format!("at byte {entry_at}: unknown entry tag 9"),
    );

    // A put whose record runs past its frame, the frame's checksum good.
    let mut payload = enc(&[put(4, 4, b"four")]);
    payload.truncate(payload.len() - 1);
    bytes.truncate(frame_at);
    bytes.extend_from_slice(&frame(&payload));
    fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
    assert_corrupt(dir.path(), "ends inside its record");
}

#[test]
fn another_magic_is_corrupt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut bytes = b"redis journal, not ours".to_vec();
    bytes.extend_from_slice(&[0; 16]);
    fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
    assert_corrupt(dir.path(), "not an idemgate journal");
}

#[test]
fn another_format_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bytes = header(FORMAT + 1);
    fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
    match open(dir.path()) {
        Err(err @ OpenError::Version { .. }) => {
            assert!(
                err.to_string().contains(&format!("format {}", FORMAT + 1)),
                "{err}"
            );
        }
        other => panic!("expected Version, got {other:?}"),
    }
    assert_eq!(journal_bytes(dir.path()), bytes);
}

/// A compaction reads the live records while appends go on: the staged journal gets
/// what was appended meanwhile after them, and replaces the old one.
#[test]
fn an_adopted_journal_holds_the_live_records_then_what_was_appended_meanwhile() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut journal, _) = open_ok(dir.path());
    journal
        .append(&enc(&[put(1, 1, b"old"), put(2, 1, b"gone"), remove(2)]))
        .expect("append");
    let live = vec![put(1, 1, b"old")];
    let staged = stage(dir.path(), &enc(&live)).expect("stage");
    let meanwhile = vec![put(1, 2, b"new"), remove(3)];
    journal.append(&enc(&meanwhile)).expect("append");
    journal.adopt(staged, &enc(&meanwhile)).expect("adopt");
    let after = vec![put(4, 4, b"after")];
    journal.append(&enc(&after)).expect("append after");
    drop(journal);
    assert!(!dir.path().join(STAGING_FILE).exists());
    let (_, seen) = open_ok(dir.path());
    assert_eq!(seen, [live, meanwhile, after].concat());
}

#[test]
fn a_rewrite_holds_exactly_the_live_entries() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (frames, _) = three_frames(dir.path());
    assert!(!frames.is_empty());
    let (mut journal, _) = open_ok(dir.path());
    let big = vec![5u8; 3 << 20];
    let live: Vec<Owned> = (10..14)
        .map(|k| put(k, 1, &big))
        .chain([put(20, 2, b"small")])
        .collect();
    journal.rewrite(&enc(&live)).expect("rewrite");
    let after = vec![remove(10)];
    journal
        .append(&enc(&after))
        .expect("append after the rewrite");
    assert_eq!(journal.size(), journal_bytes(dir.path()).len() as u64);
    let mut replayed = Vec::new();
    journal.replay(|e| replayed.push(own(e))).expect("replay");
    drop(journal);
    let (_, seen) = open_ok(dir.path());
    assert_eq!(seen, [live, after].concat());
    assert_eq!(replayed, seen);
    assert!(!dir.path().join(STAGING_FILE).exists());
    // 12 MiB of records are split into frames of at most 8 MiB each.
    let bytes = journal_bytes(dir.path());
    let mut at = HEADER_LEN;
    let mut sizes = Vec::new();
    while at < bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        sizes.push(len);
        at += FRAME_HEAD as usize + len;
    }
    assert!(sizes.len() >= 3, "{sizes:?}");
    assert!(sizes.iter().all(|&s| s <= REWRITE_FRAME), "{sizes:?}");
}

#[test]
fn a_rewrite_of_nothing_leaves_a_header() {
    let dir = tempfile::tempdir().expect("temp dir");
    three_frames(dir.path());
    let (mut journal, _) = open_ok(dir.path());
    journal.rewrite(&[]).expect("rewrite");
    drop(journal);
    assert_eq!(journal_bytes(dir.path()), header(FORMAT));
}

#[test]
fn a_rewrite_of_bytes_that_do_not_decode_changes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    three_frames(dir.path());
    let before = journal_bytes(dir.path());
    let (mut journal, _) = open_ok(dir.path());
    assert!(journal.rewrite(&[9, 9, 9]).is_err());
    assert_eq!(journal_bytes(dir.path()), before);
    assert!(!dir.path().join(STAGING_FILE).exists());
}

#[test]
fn replay_reads_what_open_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (frames, _) = three_frames(dir.path());
    let (mut journal, seen) = open_ok(dir.path());
    assert_eq!(seen, frames.concat());
    let more = vec![put(8, 8, b"eight"), remove(2)];
    journal.append(&enc(&more)).expect("append");
    let mut replayed = Vec::new();
    journal.replay(|e| replayed.push(own(e))).expect("replay");
    drop(journal);
    let (_, reopened) = open_ok(dir.path());
    assert_eq!(replayed, reopened);
    assert_eq!(replayed, [frames.concat(), more].concat());
}

#[test]
fn a_flush_that_fails_after_the_write_is_cut_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (frames, _) = three_frames(dir.path());
    let (mut journal, _) = open_ok(dir.path());
    let before = journal.len();
    journal.fail_next_flush = true;
    let err = journal
        .append(&enc(&[put(7, 7, b"refused")]))
        .expect_err("fails");
    assert!(err.to_string().contains("fail point"), "{err}");
    assert_eq!(journal.len(), before);
    assert_eq!(journal_bytes(dir.path()).len() as u64, before);
    let next = vec![put(8, 8, b"accepted")];
    journal.append(&enc(&next)).expect("the next append works");
    drop(journal);
    let (_, seen) = open_ok(dir.path());
    assert_eq!(seen, [frames.concat(), next].concat());
}

#[test]
fn a_write_that_fails_leaves_the_file_and_the_next_append_works() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (frames, _) = three_frames(dir.path());
    let (mut journal, _) = open_ok(dir.path());
    let before = journal.len();
    let read_only = File::open(dir.path().join(JOURNAL_FILE)).expect("open");
    let writable = std::mem::replace(&mut journal.file, read_only);
    assert!(journal.append(&enc(&[put(7, 7, b"refused")])).is_err());
    assert_eq!(journal.len(), before);
    assert_eq!(journal_bytes(dir.path()).len() as u64, before);
    // The cut back failed too on the read-only handle: retried before the next append.
    assert!(journal.tail_dirty);
    journal.file = writable;
    let next = vec![put(8, 8, b"accepted")];
    journal.append(&enc(&next)).expect("the next append works");
    assert!(!journal.tail_dirty);
    drop(journal);
    let (_, seen) = open_ok(dir.path());
    assert_eq!(seen, [frames.concat(), next].concat());
}

#[test]
fn syncs_are_counted_only_when_fsync_is_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut journal = Journal::open(dir.path(), false, |_| {}).expect("open");
    journal.append(&enc(&[remove(1)])).expect("append");
    assert_eq!(journal.syncs(), 0);
    journal.append(&[]).expect("nothing to append");
    assert_eq!(journal.len(), HEADER + FRAME_HEAD + 33);
    drop(journal);
    let (mut journal, _) = open_ok(dir.path());
    journal.append(&enc(&[remove(1)])).expect("append");
    journal.append(&enc(&[remove(2)])).expect("append");
    // One for each append, and one for the zeros written ahead of the first.
    assert_eq!(journal.syncs(), 3);
}

#[test]
fn random_bytes_after_a_good_header_never_panic() {
    let mut rng = fastrand::Rng::with_seed(12);
    let dir = tempfile::tempdir().expect("temp dir");
    for round in 0..400 {
        let mut bytes = header(FORMAT);
        let n = rng.usize(0..200);
        if round % 2 == 0 {
            bytes.extend((0..n).map(|_| rng.u8(..)));
        } else {
            // A frame whose checksum is good around random entries.
            let payload: Vec<u8> = (0..n)
                .map(|i| if i == 0 { rng.u8(0..4) } else { rng.u8(..) })
                .collect();
            bytes.extend_from_slice(&frame(&payload));
        }
        fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
        let _ = open(dir.path());
    }
}

/// A put encoded straight from a record is byte for byte the put of its encoding, for
/// a marker and a completed record, so that replay reads it back as that record.
#[test]
fn a_put_encoded_from_a_record_is_the_put_of_its_encoding() {
    use crate::idempotency::{Completed, Fingerprint, OwnerToken, Record, StoredBody};
    let marker = Record::InFlight(crate::idempotency::InFlight {
        fingerprint: Fingerprint::from_bytes([3; 32]),
        token: OwnerToken::random(),
        lease_deadline_ms: 42,
        claimed_at_ms: Some(7),
        streamed: true,
    });
    let completed = Record::Completed(std::sync::Arc::new(Completed::clear(
        Fingerprint::from_bytes([4; 32]),
        http::StatusCode::CREATED,
        vec![(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        )],
        StoredBody::Stored(bytes::Bytes::from_static(b"{\"id\":1}")),
    )));
    let scope = crate::idempotency::ScopeId::from_bytes([5; 16]);
    for (record, scope) in [marker, completed]
        .into_iter()
        .flat_map(|r| [(r.clone(), None), (r, Some(scope))])
    {
        let key = ScopedKey::from_bytes([9; 32]);
        let mut direct = vec![0xAB];
        encode_put(&key, 1234, &record, scope.as_ref(), &mut direct);
        let mut via = vec![0xAB];
        let bytes = record.encode();
        encode(
            &Entry::Put {
                key,
                expires_ms: 1234,
                record: &bytes,
                scope,
            },
            &mut via,
        );
        assert_eq!(direct, via, "{record:?}");
    }
}

/// Each append records where its own frame starts (everything before it was flushed):
/// after a crash that ends three appends, the first two frames are durable, and a cut
/// anywhere below the third is corrupt, naming where the file ends, never a torn tail;
/// a cut inside the third (the write a crash interrupts) is cut off as before.
#[test]
fn every_cut_below_the_durable_length_is_corrupt_and_every_cut_past_it_opens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (frames, offsets) = three_frames(dir.path());
    assert_eq!(
        durable(dir.path()),
        offsets[2],
        "the third append recorded the first two"
    );
    let full = journal_bytes(dir.path());
    for cut in HEADER_LEN..full.len() {
        fs::write(dir.path().join(JOURNAL_FILE), &full[..cut]).expect("write");
        if (cut as u64) < offsets[2] {
            assert_corrupt(dir.path(), &format!("at byte {cut}: the file ends there"));
        } else {
            let (journal, seen) = open_ok(dir.path());
            assert_eq!(seen, frames[..2].concat(), "cut at {cut}");
            assert_eq!(journal.len(), offsets[2], "cut at {cut}");
        }
    }
}

/// The case of the report (docs/behaviour.md §25): a journal of answered records cut to
/// half its length, after a crash and after a clean shutdown.
#[test]
fn a_journal_cut_to_half_its_length_is_corrupt_naming_the_offset() {
    for clean in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut journal, _) = open_ok(dir.path());
        for k in 0..40 {
            journal
                .append(&enc(&[put(k, 1, b"an answered record")]))
                .expect("append");
        }
        if clean {
            journal.close().expect("close");
        }
        let len = journal.len() as usize;
        drop(journal);
        let half = len / 2;
        let whole = journal_bytes(dir.path());
        fs::write(dir.path().join(JOURNAL_FILE), &whole[..half]).expect("write");
        assert_corrupt(dir.path(), &format!("at byte {half}"));
    }
}

/// A clean shutdown records the whole length and cuts the zeros written ahead: the
/// file is exactly that long, one byte less is corrupt, and so is a damaged byte in its
/// last frame, which a crash could not have left half written.
#[test]
fn after_a_clean_close_one_byte_short_or_a_damaged_last_frame_is_corrupt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (frames, _) = three_frames(dir.path());
    let (mut journal, _) = open_ok(dir.path());
    let last = journal.len();
    journal.append(&enc(&[remove(8)])).expect("append");
    let len = journal.len();
    assert!(journal.size() > len, "zeros written ahead");
    journal.close().expect("close");
    drop(journal);
    let whole = journal_bytes(dir.path());
    assert_eq!(whole.len() as u64, len, "the zeros are cut off");
    assert_eq!(durable(dir.path()), len);

    fs::write(dir.path().join(JOURNAL_FILE), &whole[..whole.len() - 1]).expect("write");
    assert_corrupt(dir.path(), &format!("at byte {}", len - 1));

    // A byte of the last frame's payload, then of its head.
    for at in [whole.len() - 3, last as usize + 1] {
        let mut damaged = whole.clone();
        damaged[at] ^= 0x10;
        fs::write(dir.path().join(JOURNAL_FILE), &damaged).expect("write");
        assert_corrupt(dir.path(), &format!("at byte {last}"));
    }

    fs::write(dir.path().join(JOURNAL_FILE), &whole).expect("write");
    let (_, seen) = open_ok(dir.path());
    assert_eq!(seen, [frames.concat(), vec![remove(8)]].concat());
}

/// After a crash the last durable frame is the one before the write the crash
/// interrupted: with that write gone altogether, a damaged byte in the frame before it
/// is corrupt, not a torn tail to cut with the records in it.
#[test]
fn a_damaged_byte_in_the_last_durable_frame_is_corrupt_not_a_tail() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, offsets) = three_frames(dir.path());
    let mut bytes = journal_bytes(dir.path());
    bytes.truncate(offsets[2] as usize);
    bytes[offsets[1] as usize + FRAME_HEAD as usize + 60] ^= 0x40;
    fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
    assert_corrupt(dir.path(), &format!("at byte {}", offsets[1]));
}

/// A slot write a crash cut short leaves the other slot: the open takes it (an
/// append's worth less said durable). Both slots damaged is a corrupt header.
#[test]
fn a_damaged_slot_leaves_the_other_and_two_are_corrupt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, offsets) = three_frames(dir.path());
    // The third append wrote slot 0 (where it starts), the second slot 1.
    let slots = FORMAT_AT + 8;
    let mut bytes = journal_bytes(dir.path());
    bytes[slots + 3] ^= 1;
    fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
    assert_eq!(durable(dir.path()), offsets[1]);
    open_ok(dir.path());
    // Slot 0 still damaged: the open wrote nothing.
    let mut bytes = journal_bytes(dir.path());
    bytes[slots + 12 + 3] ^= 1;
    fs::write(dir.path().join(JOURNAL_FILE), &bytes).expect("write");
    assert_corrupt(dir.path(), &format!("at byte {slots}: neither"));
}

/// A journal of format 3 (before the durable length) opens as it did: its torn tail is
/// cut, whatever the length. It is then copied to this format, frame for frame, and
/// from there on has the guarantee.
#[test]
fn a_journal_of_format_3_opens_as_before_and_is_copied_to_this_format() {
    let dir = tempfile::tempdir().expect("temp dir");
    let frames = [
        vec![put(1, 1, b"one"), remove(2)],
        vec![put(3, 3, b"three")],
    ];
    let mut old = header(header::UNMARKED);
    assert_eq!(old.len(), header::UNMARKED_LEN);
    for entries in &frames {
        old.extend_from_slice(&frame(&enc(entries)));
    }
    let whole = old.len();
    let mut torn = frame(&enc(&[put(4, 4, b"four")]));
    torn.truncate(torn.len() / 2);
    old.extend_from_slice(&torn);
    fs::write(dir.path().join(JOURNAL_FILE), &old).expect("write");

    let (mut journal, seen) = open_ok(dir.path());
    assert_eq!(seen, frames.concat());
    let frames_len = whole - header::UNMARKED_LEN;
    assert_eq!(journal.len(), (HEADER_LEN + frames_len) as u64);
    let new = journal_bytes(dir.path());
    assert_eq!(new[..HEADER_LEN], header::new(journal.len()));
    assert_eq!(new[HEADER_LEN..], old[header::UNMARKED_LEN..whole]);
    assert!(!dir.path().join(STAGING_FILE).exists());
    let next = vec![put(5, 5, b"five")];
    journal.append(&enc(&next)).expect("append");
    journal.close().expect("close");
    drop(journal);
    let (_, seen) = open_ok(dir.path());
    assert_eq!(seen, [frames.concat(), next].concat());
    let now = journal_bytes(dir.path());
    fs::write(dir.path().join(JOURNAL_FILE), &now[..now.len() / 2]).expect("write");
    assert_corrupt(dir.path(), &format!("at byte {}", now.len() / 2));
}
