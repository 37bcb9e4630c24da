//! Opening a journal that is there (docs/behaviour.md §12, §25): the header read before
//! anything is written, the frames replayed, a torn tail past the durable length cut
//! off, anything else refused naming the byte offset; a format 3 journal copied to this
//! format.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::dir::OpenError;
use super::header::{self, BadHeader, Marks};
use super::{
    Entry, FORMAT, HEADER, JOURNAL_FILE, READ_BUFFER, STAGING_FILE, Scan, ScanError, Staged, dir,
    scan, staged,
};

/// What an open found: the file and where its frames end, where the zeros written ahead
/// end, where its frames start and where it records its durable length.
pub(super) struct Opened {
    pub(super) file: File,
    pub(super) len: u64,
    pub(super) allocated: u64,
    pub(super) start: u64,
    pub(super) marks: Option<Marks>,
}

impl Opened {
    /// A journal of this format just written, `len` bytes, all durable.
    pub(super) fn fresh(file: File, len: u64) -> Self {
        Self {
            file,
            len,
            allocated: len,
            start: HEADER,
            marks: Some(Marks::fresh()),
        }
    }
}

/// Opens the journal of `dir`, replays it and cuts off a torn tail past its durable
/// length; copies a format 3 journal to this format. The header is read before the file
/// is opened for writing, so that a read-only journal of another format is reported as
/// that.
pub(super) fn open_existing(
    dir: &Path,
    fsync: bool,
    replay: &mut impl FnMut(Entry<'_>),
) -> Result<Opened, OpenError> {
    let at = || dir.to_owned();
    let path = dir.join(JOURNAL_FILE);
    let read = File::open(&path).map_err(|source| OpenError::Unreadable { path: at(), source })?;
    let header = header::read(&read).map_err(|bad| match bad {
        BadHeader::Corrupt(reason) => OpenError::Corrupt { path: at(), reason },
        BadHeader::Version(found) => OpenError::Version {
            path: at(),
            found: found.to_string(),
        },
        BadHeader::Io(source) => OpenError::Unreadable { path: at(), source },
    })?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| OpenError::NotWritable { path: at(), source })?;
    let end = file
        .metadata()
        .map_err(|source| OpenError::Unreadable { path: at(), source })?
        .len();
    let durable = header.durable;
    let corrupt = |offset: u64, reason: &str| OpenError::Corrupt {
        path: at(),
        reason: format!("{JOURNAL_FILE} at byte {offset}: {reason}"),
    };
    if end < durable {
        return Err(corrupt(
            end,
            &format!(
                "the file ends there, {} bytes short of the {durable} its header says were \
                 made durable (truncated)",
                durable - end
            ),
        ));
    }
    let below = |what: &str| {
        format!(
            "{what}, below the {durable} bytes its header says were made durable: not a torn tail"
        )
    };
    let (len, allocated) = match scan(&file, header.start, end, replay) {
        Ok(Scan::Clean) => (end, end),
        Ok(Scan::Zeros { at: len }) if len < durable => {
            return Err(corrupt(len, &below("zeros")));
        }
        Ok(Scan::Zeros { at: len }) => (len, end),
        Ok(Scan::Torn { at: good, why }) if good < durable => {
            return Err(corrupt(
                good,
                &below(&format!("a frame that does not check out ({why})")),
            ));
        }
        Ok(Scan::Torn { at: good, why }) => {
            file.set_len(good)
                .and_then(|()| file.sync_all())
                .map_err(|source| OpenError::NotWritable { path: at(), source })?;
            tracing::warn!(
                path = %path.display(),
                at = good,
                cut = end - good,
                why,
                "journal: the last write was interrupted, its frame cut off"
            );
            (good, good)
        }
        Err(ScanError::Bad { at: offset, reason }) => return Err(corrupt(offset, &reason)),
        Err(ScanError::Io(source)) => return Err(OpenError::Unreadable { path: at(), source }),
    };
    if header.marks.is_none() {
        match upgrade(dir, &file, len) {
            Ok(Staged { file, len }) => return Ok(Opened::fresh(file, len)),
            Err(err) => tracing::warn!(
                error = %err,
                path = %path.display(),
                "journal: cannot copy it to format {FORMAT}; it goes on in format {}, \
                 without a durable length, until it is compacted",
                header::UNMARKED
            ),
        }
    }
    // The frames read may be a crashed process's writes that were never flushed: they
    // are, before an append records them as durable.
    if fsync {
        file.sync_data()
            .map_err(|source| OpenError::NotWritable { path: at(), source })?;
    }
    Ok(Opened {
        file,
        len,
        allocated,
        start: header.start,
        marks: header.marks,
    })
}

/// Puts a journal of this format in place of a format 3 one, the first `len` bytes of
/// `old`: the same frames, copied byte for byte after a header that records their length
/// as durable. On an error before the rename, `old` stays the journal.
fn upgrade(dir: &Path, old: &File, len: u64) -> io::Result<Staged> {
    let frames = len.saturating_sub(header::UNMARKED_LEN as u64);
    let staged = staged(dir, |file| {
        let mut out = BufWriter::with_capacity(READ_BUFFER, file);
        out.write_all(&header::new(HEADER + frames))?;
        let mut from = old;
        from.seek(SeekFrom::Start(header::UNMARKED_LEN as u64))?;
        let copied = io::copy(&mut from.take(frames), &mut out)?;
        if copied != frames {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{JOURNAL_FILE} ended after {copied} of its {frames} bytes of frames"),
            ));
        }
        out.flush()?;
        Ok(HEADER + frames)
    })?;
    if let Err(err) = std::fs::rename(dir.join(STAGING_FILE), dir.join(JOURNAL_FILE)) {
        let _ = dir::remove_staging(dir);
        return Err(err);
    }
    if let Err(err) = dir::sync_dir(dir) {
        // Renamed: either name holds the same frames, so the new file is the journal.
        tracing::warn!(error = %err, path = %dir.display(), "journal: the directory's sync after the upgrade failed");
    }
    Ok(staged)
}
