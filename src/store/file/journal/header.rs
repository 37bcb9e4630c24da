//! The journal's header: whose file it is, its format, and how much of it the store has
//! made durable (docs/behaviour.md §25).
//!
//! ```text
//! format 4  | "idemgate journal\n" (17) | FORMAT u64 | slot 0 (12) | slot 1 (12) |  49 bytes
//! format 3  | "idemgate journal\n" (17) | 3 u64      |                              25 bytes
//! slot      | durable u64 | crc32 of durable u32 |
//! ```
//!
//! A slot holds a length of the journal that was durable when the slot was written:
//! each append writes, next to its frame and before its flush, the length the appends
//! before it had made durable (where its own frame starts), and a clean shutdown the
//! whole length. So a slot is true whenever it reaches the disk, and the larger of the
//! two is where the bytes that may be cut as a torn tail start. The two slots are
//! written in turn, so that a slot write a crash cut short leaves the other one whole.
//! A slot lives in the header rather than in the frames because whatever cuts the end
//! off a journal cuts off what the frames there say.
//!
//! Format 3 (before the slots) is still read: nothing recorded, any torn tail is cut as
//! before. Its open copies it to a journal of this format.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

use super::JOURNAL_FILE;

pub(super) const MAGIC: &[u8; 17] = b"idemgate journal\n";
/// The on-disk format this version writes (redb stores were formats 1 and 2).
pub const FORMAT: u64 = 4;
/// The format before the durable length: read, and copied to [`FORMAT`] on open.
pub(super) const UNMARKED: u64 = 3;
/// Where the format number is in the header: what a test changes to fake another one.
pub const FORMAT_AT: usize = MAGIC.len();
const SLOTS_AT: usize = FORMAT_AT + 8;
const SLOT_LEN: usize = 12;
/// The header's length: the first frame starts here.
pub const HEADER_LEN: usize = SLOTS_AT + 2 * SLOT_LEN;
/// A format 3 header's length.
pub(super) const UNMARKED_LEN: usize = SLOTS_AT;

/// What a good header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    /// Where the first frame starts.
    pub(super) start: u64,
    /// The journal is at least this long: bytes below it were durable. `start` for a
    /// format 3 journal, which does not say.
    pub(super) durable: u64,
    /// Where the journal records its durable length from now on; `None` in format 3.
    pub(super) marks: Option<Marks>,
}

/// Why a journal's header is not one this version reads.
pub(super) enum BadHeader {
    Corrupt(String),
    Version(u64),
    Io(io::Error),
}

/// Reads the header of `file`.
pub(super) fn read(file: &File) -> Result<Header, BadHeader> {
    let mut head = Vec::with_capacity(HEADER_LEN);
    let mut handle = file;
    handle.seek(SeekFrom::Start(0)).map_err(BadHeader::Io)?;
    handle
        .take(HEADER_LEN as u64)
        .read_to_end(&mut head)
        .map_err(BadHeader::Io)?;
    let Some((magic, rest)) = head.split_at_checked(MAGIC.len()) else {
        return Err(short(head.len()));
    };
    if magic != MAGIC {
        return Err(BadHeader::Corrupt(format!(
            "{JOURNAL_FILE} is not an idemgate journal (its first bytes are not ours)"
        )));
    }
    let (format, slots) = rest.split_at_checked(8).ok_or_else(|| short(head.len()))?;
    let format: [u8; 8] = format.try_into().map_err(|_| short(head.len()))?;
    match u64::from_be_bytes(format) {
        UNMARKED => Ok(Header {
            start: UNMARKED_LEN as u64,
            durable: UNMARKED_LEN as u64,
            marks: None,
        }),
        FORMAT => {
            let [Some(zero), Some(one)] =
                [0, 1].map(|i| slots.get(i * SLOT_LEN..(i + 1) * SLOT_LEN))
            else {
                return Err(short(head.len()));
            };
            let (durable, next) = match (read_slot(zero), read_slot(one)) {
                (Some(a), Some(b)) if a >= b => (a, 1),
                (Some(_), Some(b)) => (b, 0),
                (Some(a), None) => (a, 1),
                (None, Some(b)) => (b, 0),
                (None, None) => {
                    return Err(BadHeader::Corrupt(format!(
                        "{JOURNAL_FILE} at byte {SLOTS_AT}: neither of the header's durable \
                         lengths checks out"
                    )));
                }
            };
            Ok(Header {
                start: HEADER_LEN as u64,
                durable,
                marks: Some(Marks { next }),
            })
        }
        other => Err(BadHeader::Version(other)),
    }
}

fn short(len: usize) -> BadHeader {
    BadHeader::Corrupt(format!(
        "{JOURNAL_FILE} is shorter than a journal header ({len} bytes: empty or truncated)"
    ))
}

/// A slot's length, if its checksum holds and it is past the header.
fn read_slot(slot: &[u8]) -> Option<u64> {
    let (durable, crc) = slot.split_at_checked(8)?;
    let crc = u32::from_be_bytes(crc.try_into().ok()?);
    let durable = u64::from_be_bytes(durable.try_into().ok()?);
    (crc32fast::hash(&durable.to_be_bytes()) == crc && durable >= HEADER_LEN as u64)
        .then_some(durable)
}

fn slot(durable: u64) -> [u8; SLOT_LEN] {
    let mut out = [0u8; SLOT_LEN];
    let (len, crc) = out.split_at_mut(8);
    len.copy_from_slice(&durable.to_be_bytes());
    crc.copy_from_slice(&crc32fast::hash(&durable.to_be_bytes()).to_be_bytes());
    out
}

/// A header of this format whose slots both say `durable`: for a journal that will be
/// `durable` bytes long once it is flushed, before anyone can open it.
pub(super) fn new(durable: u64) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    let (magic, rest) = out.split_at_mut(MAGIC.len());
    magic.copy_from_slice(MAGIC);
    let (format, slots) = rest.split_at_mut(8);
    format.copy_from_slice(&FORMAT.to_be_bytes());
    for one in slots.chunks_exact_mut(SLOT_LEN) {
        one.copy_from_slice(&slot(durable));
    }
    out
}

/// The header's two slots of a journal of this format, written in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Marks {
    /// The slot written next: the one not holding the larger length.
    next: usize,
}

impl Marks {
    /// The marks of a journal just written with [`new`].
    pub(super) fn fresh() -> Self {
        Self { next: 0 }
    }

    /// Records that the first `durable` bytes of `file` are durable: one positioned
    /// write, flushed with whatever flush follows it.
    pub(super) fn record(&mut self, file: &File, durable: u64) -> io::Result<()> {
        let at = SLOTS_AT + self.next * SLOT_LEN;
        file.write_all_at(&slot(durable), at as u64)?;
        self.next ^= 1;
        Ok(())
    }
}
