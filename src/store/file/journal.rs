//! The file store's journal (docs/behaviour.md §12): one append-only file holding every
//! change, replayed in order on open to rebuild the index, which lives wholly in memory
//! (the shape of Redis's AOF). Pure std, besides the checksum.
//!
//! ```text
//! idemgate.journal
//! +----------------------------+---------------+-----------------------+
//! | "idemgate journal\n" (17)  | FORMAT u64    | durable length slots  |  header, 49 bytes
//! +-----------+-----------+----+---------------+-------+---------------+  (header.rs)
//! | len u32 | crc u32 | head crc u32 | payload   |  frame: one append, one write
//! +---------+---------+--------------+-----------+
//! | len u32 | crc u32 | head crc u32 | payload   |
//! +---------+---------+--------------+-----------+
//!   ...
//!
//! payload = entry entry ...   (crc: crc32 of the payload; head crc: of len and crc)
//! entry   = 1 | key 32 | expires_ms u64 | record_len u32 | record     a key's new state
//!         | 2 | key 32                                               its removal
//! ```
//!
//! Integers are big-endian. A frame is all or nothing: its entries are replayed only once
//! its checksum matches and every entry in it decodes.
//!
//! A crash can leave the last frame half written; the next open cuts it off (a torn tail)
//! and keeps the frames before it. A write lands whole pages or none, so what an
//! interrupted write leaves at offset X is a head that checks out with its payload cut
//! short (its declared end past the end of the file) or not matching its checksum, or a
//! head of zero bytes (the file grew, that page never landed). Either is a torn tail
//! only when X is at or past the durable length the header records (an interrupted
//! write is one no append before it had flushed, docs/behaviour.md §25), and no good
//! frame starts anywhere after X (an interrupted write is the last one, while damage in
//! the middle of the journal leaves good frames behind it). Anything else (a journal
//! shorter than its durable length, a head that is neither zeros nor checks out, a bad
//! frame below the durable length or followed by good ones, a bad entry in a frame
//! whose checksum matches) is corruption: the open is refused naming the byte offset,
//! and the file is left exactly as it is. The head's own checksum is what tells a
//! damaged length field from a write cut short.
//!
//! A new journal, and a rewrite holding only the live records, are written under
//! `idemgate.journal.new`, synced, and renamed over the journal: a crash leaves the old
//! journal or the new one, never a mix, so a journal without a header is never ours.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::failpoint;

use dir::OpenError;
use entry::Entries;
pub(super) use entry::Entry;
use header::Marks;
pub use header::{FORMAT, FORMAT_AT, HEADER_LEN};
use open::{Opened, open_existing};
// Unused until the writer encodes its batches with it, as `dead_code` at `mod journal`.
pub(super) use entry::{encode, encode_put};

/// Calls `f` for every entry of `buf` (concatenated encodings, as queued) that decodes.
pub(super) fn entries(buf: &[u8], mut f: impl FnMut(Entry<'_>)) {
    for (_, entry) in Entries::new(buf).flatten() {
        f(entry);
    }
}

/// The directory around the journal: its errors, lock and `--check`.
pub(super) mod dir;
mod entry;
/// The header: magic, format, and the durable length.
mod header;
/// Opening a journal that is there: its checks, its torn tail, its upgrade.
mod open;
#[cfg(test)]
mod tests;

/// The journal file inside `store.path`.
pub const JOURNAL_FILE: &str = "idemgate.journal";
/// A new journal while it is written, renamed to [`JOURNAL_FILE`] once complete.
const STAGING_FILE: &str = "idemgate.journal.new";
const HEADER: u64 = HEADER_LEN as u64;
const FRAME_HEAD: u64 = 12;
/// With `fsync`, the journal is grown by this many zero bytes, written and flushed, ahead
/// of its frames: a frame then overwrites bytes the file already has, and its flush
/// writes the data alone, not the file's new size through the filesystem's journal as
/// well (a third less time per `fdatasync` on ext4 here, BENCHMARKS.md).
const PREALLOCATE: u64 = 1 << 20;
/// The most a probe for room writes.
const PROBE_MOST: u64 = 1 << 20;
/// A rewrite's frames close at this size (a larger record gets a frame of its own), so
/// that replaying one never needs a buffer the size of the whole journal.
const REWRITE_FRAME: usize = 8 << 20;
const READ_BUFFER: usize = 1 << 20;
/// The append buffer is dropped after a frame larger than this, rather than keeping the
/// largest record's worth of memory for good.
const SCRATCH_KEEP: usize = 1 << 20;

/// How a scan of the frames ended, when it did not find corruption.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// Every frame up to the end read back.
    Clean,
    /// The frames end at `at`, followed by zero bytes only: space written ahead of the
    /// journal (see [`PREALLOCATE`]), or a tail that never landed. Not cut.
    Zeros { at: u64 },
    /// The frames end at `at`, followed by an interrupted write.
    Torn { at: u64, why: &'static str },
}

#[derive(Debug)]
enum ScanError {
    Io(io::Error),
    Bad { at: u64, reason: String },
}

impl From<io::Error> for ScanError {
    fn from(err: io::Error) -> Self {
        Self::Io(err)
    }
}

/// A frame's head: its payload's length and checksum, if the head's own checksum holds.
fn read_head(head: &[u8]) -> Option<(u32, u32)> {
    let (sums, own) = head.get(..FRAME_HEAD as usize)?.split_at(8);
    let own = u32::from_be_bytes(own.try_into().ok()?);
    if crc32fast::hash(sums) != own {
        return None;
    }
    let (len, crc) = sums.split_at(4);
    Some((
        u32::from_be_bytes(len.try_into().ok()?),
        u32::from_be_bytes(crc.try_into().ok()?),
    ))
}

/// Whether a whole, good frame starts anywhere in `rest` (the bytes after a bad one).
fn good_frame_in(rest: &[u8]) -> bool {
    (0..rest.len()).any(|i| {
        if rest.get(i) == Some(&0) {
            // A head of zeros is no frame's: ruled out without a checksum, so that
            // space written ahead (all zeros) is passed over quickly.
            if rest
                .get(i..i + FRAME_HEAD as usize)
                .is_some_and(|h| h.iter().all(|&b| b == 0))
            {
                return false;
            }
        }
        let Some((len, crc)) = rest.get(i..).and_then(read_head) else {
            return false;
        };
        let start = i + FRAME_HEAD as usize;
        len > 0
            && rest
                .get(start..start + len as usize)
                .is_some_and(|payload| crc32fast::hash(payload) == crc)
    })
}

/// Reads the frames of `file` from `start` (the header's end) to `end`, calling `replay`
/// for each entry of each good frame.
fn scan(
    file: &File,
    start: u64,
    end: u64,
    replay: &mut impl FnMut(Entry<'_>),
) -> Result<Scan, ScanError> {
    let mut handle = file;
    handle.seek(SeekFrom::Start(start))?;
    let mut reader = BufReader::with_capacity(READ_BUFFER, handle.take(end.saturating_sub(start)));
    let mut at = start;
    let mut payload = Vec::new();
    loop {
        let left = end.saturating_sub(at);
        if left == 0 {
            return Ok(Scan::Clean);
        }
        if left < FRAME_HEAD {
            return Ok(Scan::Torn {
                at,
                why: "fewer bytes are left than a frame header",
            });
        }
        let mut head = [0u8; FRAME_HEAD as usize];
        reader.read_exact(&mut head)?;
        let unwritten = head.iter().all(|&b| b == 0);
        let good = match read_head(&head) {
            Some((len, _)) if at + FRAME_HEAD + u64::from(len) > end => {
                return Ok(Scan::Torn {
                    at,
                    why: "the last frame ends past the end of the file",
                });
            }
            Some((len, crc)) if len > 0 => {
                payload.clear();
                payload.resize(len as usize, 0);
                reader.read_exact(&mut payload)?;
                crc32fast::hash(&payload) == crc
            }
            // No append writes an empty frame: a head of zeros never landed.
            Some(_) => false,
            None if unwritten => false,
            None => {
                return Err(ScanError::Bad {
                    at,
                    reason: "a frame head that does not check out".to_owned(),
                });
            }
        };
        if !good {
            let mut rest = Vec::new();
            let mut handle = file;
            handle.seek(SeekFrom::Start(at + 1))?;
            handle.take(end - at - 1).read_to_end(&mut rest)?;
            if unwritten && rest.iter().all(|&b| b == 0) {
                return Ok(Scan::Zeros { at });
            }
            if good_frame_in(&rest) {
                return Err(ScanError::Bad {
                    at,
                    reason: "a frame that does not check out, followed by good ones".to_owned(),
                });
            }
            return Ok(Scan::Torn {
                at,
                why: "no good frame follows the last one that checks out",
            });
        }
        for item in Entries::new(&payload) {
            if let Err((offset, reason)) = item {
                return Err(ScanError::Bad {
                    at: at + FRAME_HEAD + offset as u64,
                    reason: format!("{reason} (in the frame at byte {at}, checksum good)"),
                });
            }
        }
        for (_, entry) in Entries::new(&payload).flatten() {
            replay(entry);
        }
        at += FRAME_HEAD + payload.len() as u64;
    }
}

/// Writes a journal holding `live` to the staging file and syncs it, whatever `fsync`
/// says: the rename that follows must not reach the disk before the contents do.
/// Returns the file and its length; removes it again when it could not be completed.
pub(super) fn stage(dir: &Path, live: &[u8]) -> io::Result<Staged> {
    let frames = split(live)?;
    staged(dir, |file| write_journal(file, live, &frames))
}

/// Writes the staging file with `write` (which returns the length written) and syncs it;
/// removes it again when it could not be completed.
fn staged(dir: &Path, write: impl FnOnce(&File) -> io::Result<u64>) -> io::Result<Staged> {
    dir::remove_staging(dir)?;
    let path = dir.join(STAGING_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    let written = write(&file).and_then(|len| {
        file.sync_all()?;
        Ok(len)
    });
    match written {
        Ok(len) => Ok(Staged { file, len }),
        Err(err) => {
            let _ = std::fs::remove_file(&path);
            Err(err)
        }
    }
}

/// A new journal written under the staging name, not yet in place.
#[derive(Debug)]
pub(super) struct Staged {
    file: File,
    len: u64,
}

/// Where `buf` (concatenated encodings) is cut into frames: at entry boundaries, each at
/// most [`REWRITE_FRAME`] unless one entry is larger.
fn split(buf: &[u8]) -> io::Result<Vec<Range<usize>>> {
    let mut frames = Vec::new();
    let mut start = 0;
    for item in Entries::new(buf) {
        let (range, _) = item.map_err(|(offset, reason)| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the records do not decode at byte {offset}: {reason}"),
            )
        })?;
        if range.end - start > REWRITE_FRAME && range.start > start {
            frames.push(start..range.start);
            start = range.start;
        }
    }
    if start < buf.len() {
        frames.push(start..buf.len());
    }
    Ok(frames)
}

/// Writes `frames` of `buf` to `out`; returns the bytes written.
fn write_frames(out: &mut impl Write, buf: &[u8], frames: &[Range<usize>]) -> io::Result<u64> {
    let mut len = 0;
    for range in frames {
        let payload = buf.get(range.clone()).unwrap_or_default();
        out.write_all(&frame_head(payload)?)?;
        out.write_all(payload)?;
        len += FRAME_HEAD + payload.len() as u64;
    }
    Ok(len)
}

/// Writes a whole journal of `frames` of `live`; returns its length.
fn write_journal(file: &File, live: &[u8], frames: &[Range<usize>]) -> io::Result<u64> {
    let len = HEADER
        + frames
            .iter()
            .map(|range| FRAME_HEAD + range.len() as u64)
            .sum::<u64>();
    let mut out = BufWriter::with_capacity(READ_BUFFER, file);
    // The whole length is durable once the sync that follows is done, and nobody opens
    // the staging file before.
    out.write_all(&header::new(len))?;
    write_frames(&mut out, live, frames)?;
    out.flush()?;
    Ok(len)
}

fn frame_head(payload: &[u8]) -> io::Result<[u8; FRAME_HEAD as usize]> {
    let len = u32::try_from(payload.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a frame holds at most 4 GiB, not {} bytes", payload.len()),
        )
    })?;
    let mut head = [0u8; FRAME_HEAD as usize];
    let (sums, own) = head.split_at_mut(8);
    let (l, c) = sums.split_at_mut(4);
    l.copy_from_slice(&len.to_be_bytes());
    c.copy_from_slice(&crc32fast::hash(payload).to_be_bytes());
    own.copy_from_slice(&crc32fast::hash(sums).to_be_bytes());
    Ok(head)
}

/// An open journal, and the lock that keeps its directory this process's.
#[derive(Debug)]
pub(super) struct Journal {
    dir: PathBuf,
    file: File,
    /// Held (locked) for as long as the journal is open; the lock goes with the handle.
    _lock: File,
    /// Where the last good frame ends: the next append is written here. Every byte
    /// before it is durable (flushed, with `fsync`; written, without) whenever an
    /// append starts, so it is the length each append records in the header.
    len: u64,
    /// Where the first frame starts.
    start: u64,
    /// Where the durable length is recorded; `None` for a format 3 journal that could
    /// not be copied to this format on open (until a compaction rewrites it).
    marks: Option<Marks>,
    /// The file's size: zero bytes written ahead of the frames end here.
    allocated: u64,
    fsync: bool,
    syncs: u64,
    /// A failed append could not be cut back: the file may be longer than `len`, and is
    /// cut before the next append so that no stale bytes follow its frame.
    tail_dirty: bool,
    scratch: Vec<u8>,
    /// Fails the next append after its write, as the fail point does, without the feature.
    #[cfg(test)]
    fail_next_flush: bool,
}

impl Journal {
    /// Creates `dir` if missing, takes the lock file, opens the journal (or creates a new
    /// one in an empty directory), calls `replay` for every entry in order, and cuts off a
    /// torn tail. On an error, entries already replayed are to be thrown away.
    pub(super) fn open(
        dir: &Path,
        fsync: bool,
        mut replay: impl FnMut(Entry<'_>),
    ) -> Result<Journal, OpenError> {
        let at = || dir.to_owned();
        let not_writable = |source| OpenError::NotWritable { path: at(), source };
        std::fs::create_dir_all(dir).map_err(|source| OpenError::Create { path: at(), source })?;
        if !dir::has_journal(dir)? {
            dir::refuse_redb(dir)?;
        }
        let lock = dir::lock(dir)?;
        let Opened {
            file,
            len,
            allocated,
            start,
            marks,
        } = if dir::has_journal(dir)? {
            open_existing(dir, fsync, &mut replay)?
        } else {
            dir::check_empty(dir)?;
            let Staged { file, len } = stage(dir, &[]).map_err(not_writable)?;
            std::fs::rename(dir.join(STAGING_FILE), dir.join(JOURNAL_FILE))
                .map_err(not_writable)?;
            dir::sync_dir(dir).map_err(not_writable)?;
            Opened::fresh(file, len)
        };
        dir::remove_staging(dir).map_err(not_writable)?;
        Ok(Journal {
            dir: dir.to_owned(),
            file,
            _lock: lock,
            len,
            start,
            marks,
            allocated,
            fsync,
            syncs: 0,
            tail_dirty: false,
            scratch: Vec::new(),
            #[cfg(test)]
            fail_next_flush: false,
        })
    }

    /// Appends `entries` (concatenated encodings) as one frame with one write at the
    /// good length, then syncs it when `fsync`. On an error the file is cut back to its
    /// length before (best effort) and the journal stays usable for the next append.
    pub(super) fn append(&mut self, entries: &[u8]) -> io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let head = frame_head(entries)?;
        if self.tail_dirty {
            self.cut()?;
            self.tail_dirty = false;
        }
        let end = self.len + FRAME_HEAD + entries.len() as u64;
        if self.fsync
            && end > self.allocated
            && let Err(err) = self.preallocate(end)
        {
            self.tail_dirty = self.cut().is_err();
            return Err(err);
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&head);
        self.scratch.extend_from_slice(entries);
        let written = self.write_scratch();
        if self.scratch.capacity() > SCRATCH_KEEP {
            self.scratch = Vec::new();
        }
        match written {
            Ok(()) => {
                self.len += FRAME_HEAD + entries.len() as u64;
                Ok(())
            }
            Err(err) => {
                // A frame left behind would be replayed after a restart though its
                // append was refused; `tail_dirty` retries the cut if this one fails.
                self.tail_dirty = self.cut().is_err();
                Err(err)
            }
        }
    }

    /// Cuts the file at the end of its last good frame, zeros written ahead included.
    fn cut(&mut self) -> io::Result<()> {
        self.file.set_len(self.len)?;
        self.allocated = self.len;
        Ok(())
    }

    /// Writes zero bytes from the file's end to past `end`, and flushes them with the
    /// file's new size.
    fn preallocate(&mut self, end: u64) -> io::Result<()> {
        let to = end.div_ceil(PREALLOCATE).max(1) * PREALLOCATE;
        let zeros = vec![0u8; usize::try_from(to - self.allocated).unwrap_or(usize::MAX)];
        self.file.write_all_at(&zeros, self.allocated)?;
        self.allocated = to;
        self.syncs += 1;
        self.file.sync_data()
    }

    /// Writes the frames in hand at the journal's end: one positioned write (`pwrite`),
    /// not a seek and a write (BENCHMARKS.md, issue 29). Then records in the header
    /// that the journal is durable up to where they start (another `pwrite` of 12
    /// bytes), flushed with them: true once it lands, for earlier appends were flushed.
    fn write_scratch(&mut self) -> io::Result<()> {
        self.file.write_all_at(&self.scratch, self.len)?;
        if let Some(marks) = &mut self.marks {
            marks.record(&self.file, self.len)?;
        }
        failpoint::hit(failpoint::DURING_FLUSH);
        if failpoint::fails(failpoint::DURING_FLUSH) || self.injected_failure() {
            return Err(io::Error::other("fail point: the flush failed"));
        }
        if self.fsync {
            self.syncs += 1;
            self.file.sync_data()?;
        }
        Ok(())
    }

    #[cfg(test)]
    fn injected_failure(&mut self) -> bool {
        std::mem::take(&mut self.fail_next_flush)
    }

    #[cfg(not(test))]
    fn injected_failure(&mut self) -> bool {
        false
    }

    /// Replaces the whole journal by one holding `live` (concatenated encodings of the
    /// live records), atomically: a crash at any point leaves the old journal or the new.
    /// Once the rename is done appends go to the new file, even if the directory's sync
    /// then fails (that error is still returned: the rename may not be durable yet, but
    /// either journal holds the live records). For the tests: the writer stages on a
    /// thread of its own and adopts.
    #[cfg(test)]
    pub(super) fn rewrite(&mut self, live: &[u8]) -> io::Result<()> {
        let staged = stage(&self.dir, live)?;
        self.adopt(staged, &[])
    }

    /// Puts `staged` in place of the journal, after appending `tail` to it: the entries
    /// appended to this journal since the live records in `staged` were read (each one a
    /// key's whole state, so replaying them after those records ends in the same state).
    /// The staged file is flushed before the rename, whatever `fsync` says. On an error
    /// before the rename, this journal stays as it was and the staged file is removed.
    pub(super) fn adopt(&mut self, staged: Staged, tail: &[u8]) -> io::Result<()> {
        let Staged { mut file, len } = staged;
        let mut marks = Marks::fresh();
        let appended = split(tail).and_then(|frames| {
            file.seek(SeekFrom::Start(len))?;
            let mut out = BufWriter::with_capacity(READ_BUFFER, &file);
            let written = write_frames(&mut out, tail, &frames)?;
            out.flush()?;
            drop(out);
            // Durable once the sync below is done, before the rename makes it the journal.
            marks.record(&file, len + written)?;
            file.sync_all()?;
            std::fs::rename(self.dir.join(STAGING_FILE), self.dir.join(JOURNAL_FILE))?;
            Ok(len + written)
        });
        let len = match appended {
            Ok(len) => len,
            Err(err) => {
                let _ = dir::remove_staging(&self.dir);
                return Err(err);
            }
        };
        self.syncs += 1;
        self.file = file;
        self.len = len;
        self.start = HEADER;
        self.marks = Some(marks);
        self.allocated = len;
        self.tail_dirty = false;
        dir::sync_dir(&self.dir)
    }

    /// A clean shutdown: cuts off the zeros written ahead and records the whole journal
    /// as durable, so that an open finds it exactly as long as it says. Without `fsync`
    /// the frames are flushed first, so that the record never lands before them.
    pub(super) fn close(&mut self) -> io::Result<()> {
        if self.allocated > self.len || self.tail_dirty {
            self.cut()?;
            self.tail_dirty = false;
        }
        if let Some(marks) = &mut self.marks {
            if !self.fsync {
                self.file.sync_data()?;
            }
            marks.record(&self.file, self.len)?;
        }
        self.syncs += 1;
        self.file.sync_all()
    }

    /// The directory the journal is in.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the journal again from its start, calling `replay` per entry: how the index
    /// is rebuilt from what is on disk after a failed append.
    pub(super) fn replay(&self, mut replay: impl FnMut(Entry<'_>)) -> io::Result<()> {
        match scan(&self.file, self.start, self.len, &mut replay) {
            Ok(Scan::Clean | Scan::Zeros { .. }) => Ok(()),
            Ok(Scan::Torn { at, why }) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{JOURNAL_FILE} changed under the store: at byte {at}, {why}"),
            )),
            Err(ScanError::Bad { at, reason }) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{JOURNAL_FILE} changed under the store: at byte {at}, {reason}"),
            )),
            Err(ScanError::Io(err)) => Err(err),
        }
    }

    /// Writes `bytes` zero bytes past the end, syncs them, and cuts them off again: after
    /// a failed append, whether there is room for it now. The bytes never count: they
    /// are past the journal's length, and cut before anything else is written.
    pub(super) fn probe(&mut self, bytes: u64) -> io::Result<()> {
        // At most 1 MiB: a failed batch of many large records may never fit whole, and
        // the store must still find out that there is room for the next one.
        let zeros = vec![0u8; usize::try_from(bytes.clamp(1, PROBE_MOST)).unwrap_or(1)];
        self.tail_dirty = true;
        let written = self
            .file
            .write_all_at(&zeros, self.len)
            .and_then(|()| self.file.sync_data());
        self.file.set_len(self.len)?;
        self.tail_dirty = false;
        written
    }

    /// The journal file.
    pub(super) fn path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    /// Bytes the file takes, zeros written ahead of the frames included.
    pub(super) fn size(&self) -> u64 {
        self.allocated.max(self.len)
    }

    /// Bytes of the journal's frames (and header): what a compaction is measured by.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Syncs of the journal made so far, by appends (when `fsync`) and rewrites.
    pub(super) fn syncs(&self) -> u64 {
        self.syncs
    }
}
