//! The store directory around the journal: why it cannot be opened, the lock that keeps it
//! one process's, and what may be in it when a new journal starts there. Taken over from
//! the redb store's `disk.rs`, with the same messages, so that `--check` and a refusal
//! read the same whichever engine is built.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use super::header::UNMARKED;
use super::{FORMAT, JOURNAL_FILE, STAGING_FILE};

/// The lock file inside `store.path`, held while the store is open.
pub const LOCK_FILE: &str = "idemgate.lock";
/// The file of the earlier, redb, store (on-disk formats 1 and 2).
pub(crate) const REDB_FILE: &str = "idemgate.redb";

/// Why a store directory could not be opened. Each names the path, and none has
/// changed what was there.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("store.path {}: cannot be created: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store.path {}: cannot be written: {source}", path.display())]
    NotWritable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store.path {}: in use by another idemgate process (it holds {LOCK_FILE})", path.display())]
    InUse { path: PathBuf },
    #[error("store.path {}: cannot be read: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store.path {}: not an idemgate store or corrupt, left as it is: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "store.path {}: on-disk format {found} is not the format {FORMAT} (or {UNMARKED}) this \
         idemgate reads; left as it is (use the idemgate version that wrote it, or another path)",
        path.display()
    )]
    Version { path: PathBuf, found: String },
    #[error(
        "store.path {}: holds {REDB_FILE}, a store of the earlier redb format (on-disk format \
         1 or 2) this idemgate does not read; left as it is (drain it with the idemgate \
         version that wrote it, or use another path)",
        path.display()
    )]
    Redb { path: PathBuf },
}

/// Checks, without creating anything that stays, that `path` is (or can become) a
/// directory this process can write in: what `--check` reports.
pub fn check_path(path: &Path) -> Result<(), OpenError> {
    let create = |source| OpenError::Create {
        path: path.to_owned(),
        source,
    };
    if path.as_os_str().is_empty() {
        return Err(create(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty path",
        )));
    }
    // The nearest part of the path that exists must be a directory we can write in.
    let mut existing = path;
    while !existing.exists() {
        match existing.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => existing = parent,
            _ => {
                existing = Path::new(".");
                break;
            }
        }
    }
    if !existing.is_dir() {
        return Err(create(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", existing.display()),
        )));
    }
    let probe = existing.join(format!(".idemgate-check-{}", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map(drop);
    let _ = std::fs::remove_file(&probe);
    written.map_err(|source| {
        if existing == path {
            OpenError::NotWritable {
                path: path.to_owned(),
                source,
            }
        } else {
            create(source)
        }
    })
}

/// Takes `idemgate.lock` in `dir`; the lock lasts as long as the returned handle.
pub(super) fn lock(dir: &Path) -> Result<File, OpenError> {
    let at = || dir.to_owned();
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOCK_FILE))
        .map_err(|source| OpenError::NotWritable { path: at(), source })?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(OpenError::InUse { path: at() }),
        Err(std::fs::TryLockError::Error(source)) => {
            Err(OpenError::NotWritable { path: at(), source })
        }
    }
}

/// Whether `dir` holds a journal: a regular file under [`JOURNAL_FILE`]. Anything else
/// under that name is refused rather than replaced.
pub(super) fn has_journal(dir: &Path) -> Result<bool, OpenError> {
    let at = || dir.to_owned();
    let file = dir.join(JOURNAL_FILE);
    match std::fs::metadata(&file) {
        Ok(meta) if meta.is_file() => Ok(true),
        Ok(_) => Err(OpenError::Unreadable {
            path: at(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", file.display()),
            ),
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(OpenError::Unreadable { path: at(), source }),
    }
}

/// A store of the redb format is refused before anything is created next to it, even
/// the lock file.
pub(super) fn refuse_redb(dir: &Path) -> Result<(), OpenError> {
    match std::fs::symlink_metadata(dir.join(REDB_FILE)) {
        Ok(_) => Err(OpenError::Redb {
            path: dir.to_owned(),
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(OpenError::Unreadable {
            path: dir.to_owned(),
            source,
        }),
    }
}

/// What may be in a directory that gets a new journal: the lock (taken before this
/// check), a creation or rewrite that did not finish, and the `lost+found` of a fresh
/// filesystem. A directory with other files in it but no journal may be a store whose
/// journal was lost or moved; starting afresh there would forget its keys without a word.
pub(super) fn check_empty(dir: &Path) -> Result<(), OpenError> {
    let at = || dir.to_owned();
    let entries =
        std::fs::read_dir(dir).map_err(|source| OpenError::Unreadable { path: at(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| OpenError::Unreadable { path: at(), source })?;
        let name = entry.file_name();
        if [LOCK_FILE, STAGING_FILE, "lost+found"]
            .iter()
            .any(|ours| name == *ours)
        {
            continue;
        }
        if name == REDB_FILE {
            return Err(OpenError::Redb { path: at() });
        }
        return Err(OpenError::Corrupt {
            path: at(),
            reason: format!(
                "{JOURNAL_FILE} is missing but the directory is not empty (it holds {}): \
                 a new store starts only in an empty directory",
                name.to_string_lossy()
            ),
        });
    }
    Ok(())
}

/// Removes a staging file left by a creation or rewrite that did not finish: it never
/// held a key the journal did not.
pub(in crate::store::file) fn remove_staging(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(STAGING_FILE)) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// Makes a rename or a creation in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir).and_then(|dir| dir.sync_all())
}
