//! What the file store keeps on disk, and how a directory becomes an open database or a
//! refusal that names the path.
//!
//! One redb file, `idemgate.redb`, with two tables:
//!
//! ```text
//! log   id u64 -> key (32 bytes) | expires_ms u64 | Record::encode()
//! meta  "format" -> u64   FORMAT, checked on every open
//! ```
//!
//! The log holds each key's current version under an id that only grows: a write
//! appends a row and deletes the key's previous one, expiry deletes the oldest rows.
//! A commit then dirties the log's newest and oldest pages only, not a page per key
//! (as a table keyed by the random key hashes would), which is what a flush costs. The
//! index from keys to ids lives in memory (`index.rs`), rebuilt by one scan on open.
//! Integers are big-endian. Next to the database `idemgate.lock` is held (`flock`) by
//! the one process that has the store open.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::backend::{Backend, Settings};
use crate::idempotency::record::DecodeError;
use crate::idempotency::{Record, ScopedKey};

pub(super) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The on-disk format this version writes. Format 2 may hold records of format 2 (with
/// the times the admin API reports, docs/behaviour.md §13), which versions that wrote
/// format 1 cannot read: they refuse a format 2 store when it opens, instead of failing
/// on its records one by one. A store of any other format is refused, never read or
/// rewritten.
pub const FORMAT: u64 = 2;
/// The earlier format this version still opens: the same tables with format 1 records
/// only. Opening it for writing marks it format 2 (the meta entry alone is rewritten).
const UPGRADES_FROM: u64 = 1;
/// The database file inside `store.path`.
pub const DB_FILE: &str = "idemgate.redb";
/// The lock file inside `store.path`, held while the store is open.
pub const LOCK_FILE: &str = "idemgate.lock";
/// A new database while it is made, renamed to [`DB_FILE`] once complete.
const STAGING_FILE: &str = "idemgate.redb.new";

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
        "store.path {}: on-disk format {found} is not the format {FORMAT} this idemgate reads; \
         left as it is (use the idemgate version that wrote it, or another path)",
        path.display()
    )]
    Version { path: PathBuf, found: String },
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

/// An open store directory: the database and the lock that keeps it ours.
#[derive(Debug)]
pub(super) struct Opened {
    pub(super) db: Database,
    /// Held (locked) for as long as the store is open; the lock goes with the handle.
    pub(super) lock: File,
    pub(super) file: PathBuf,
}

/// Creates the directory if needed, takes the lock, and opens or creates the database.
pub(super) fn open(path: &Path, settings: Settings) -> Result<Opened, OpenError> {
    let at = || path.to_owned();
    std::fs::create_dir_all(path).map_err(|source| OpenError::Create { path: at(), source })?;
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path.join(LOCK_FILE))
        .map_err(|source| OpenError::NotWritable { path: at(), source })?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Err(OpenError::InUse { path: at() }),
        Err(std::fs::TryLockError::Error(source)) => {
            return Err(OpenError::NotWritable { path: at(), source });
        }
    }
    let file = path.join(DB_FILE);
    let existed = match std::fs::metadata(&file) {
        Ok(meta) if meta.is_file() => true,
        Ok(_) => {
            return Err(OpenError::Unreadable {
                path: at(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} is not a regular file", file.display()),
                ),
            });
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => false,
        Err(source) => return Err(OpenError::Unreadable { path: at(), source }),
    };
    let db = if existed {
        open_existing(path, &file, settings)?
    } else {
        create(path, &file, settings)?
    };
    Ok(Opened { db, lock, file })
}

/// Opens the database file of a store that exists, refusing one this version cannot
/// read. Also how the writer opens it again after a failed write.
pub(super) fn open_existing(
    path: &Path,
    file: &Path,
    settings: Settings,
) -> Result<Database, OpenError> {
    let at = || path.to_owned();
    check_header(file).map_err(|reason| OpenError::Corrupt { path: at(), reason })?;
    check_read_only(path, file)?;
    let handle = OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .map_err(|source| OpenError::Unreadable { path: at(), source })?;
    let backend = Backend::new(handle, settings);
    let db = redb::Builder::new()
        .create_with_backend(backend)
        .map_err(|err| database_error(path, err))?;
    let format = check_format(&db).map_err(|found| match found {
        Found::Other(found) => OpenError::Version { path: at(), found },
        Found::Broken(reason) => OpenError::Corrupt { path: at(), reason },
    })?;
    if format == UPGRADES_FROM {
        mark_format(&db).map_err(|reason| OpenError::NotWritable {
            path: at(),
            source: std::io::Error::other(reason),
        })?;
    }
    Ok(db)
}

/// A new store, made under a staging name and renamed into place once its format is
/// written and flushed: a crash while it is made leaves no database file, never an
/// empty or half-written one, which the next open would have to refuse as corrupt.
///
/// Only an empty directory gets a new store. A directory with other files in it but no
/// database may be a store whose file was lost or moved; starting afresh there would
/// forget its keys without a word.
fn create(path: &Path, file: &Path, settings: Settings) -> Result<Database, OpenError> {
    let at = || path.to_owned();
    check_empty(path)?;
    let staging = path.join(STAGING_FILE);
    let not_writable = |source| OpenError::NotWritable { path: at(), source };
    // Left by a creation that did not finish: it never held a key.
    match std::fs::remove_file(&staging) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(not_writable(source)),
    }
    let handle = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&staging)
        .map_err(not_writable)?;
    let flush = handle.try_clone().map_err(not_writable)?;
    let backend = Backend::new(handle, settings);
    let db = redb::Builder::new()
        .create_with_backend(backend)
        .map_err(|err| database_error(path, err))?;
    init(&db).map_err(|reason| not_writable(std::io::Error::other(reason)))?;
    // The rename must not reach the disk before the file's contents do, whatever
    // `fsync` says.
    flush.sync_all().map_err(not_writable)?;
    std::fs::rename(&staging, file).map_err(not_writable)?;
    File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(not_writable)?;
    Ok(db)
}

/// What may be in a directory that gets a new store: the lock (taken before this
/// check), a creation that did not finish, and the `lost+found` of a fresh filesystem.
fn check_empty(path: &Path) -> Result<(), OpenError> {
    let at = || path.to_owned();
    let entries =
        std::fs::read_dir(path).map_err(|source| OpenError::Unreadable { path: at(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| OpenError::Unreadable { path: at(), source })?;
        let name = entry.file_name();
        if [LOCK_FILE, STAGING_FILE, "lost+found"]
            .iter()
            .any(|ours| name == *ours)
        {
            continue;
        }
        return Err(OpenError::Corrupt {
            path: at(),
            reason: format!(
                "{DB_FILE} is missing but the directory is not empty (it holds {}): \
                 a new store starts only in an empty directory",
                name.to_string_lossy()
            ),
        });
    }
    Ok(())
}

/// redb's magic number: a file that does not start with it is not a redb database, and
/// is refused before redb could take it for one to repair.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

fn check_header(file: &Path) -> Result<(), String> {
    let mut head = [0u8; REDB_MAGIC.len()];
    let read =
        std::fs::File::open(file).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head));
    match read {
        Ok(()) if head == REDB_MAGIC => Ok(()),
        Ok(()) => Err(format!("{} is not a redb database", file.display())),
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => Err(format!(
            "{} is shorter than a database header (empty or truncated)",
            file.display()
        )),
        Err(err) => Err(format!("{}: {err}", file.display())),
    }
}

fn database_error(path: &Path, err: redb::DatabaseError) -> OpenError {
    let at = path.to_owned();
    match err {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            OpenError::InUse { path: at }
        }
        redb::DatabaseError::UpgradeRequired(version) => OpenError::Version {
            path: at,
            found: format!("redb file format {version}"),
        },
        // A file that ends before redb's structures do was cut short: corrupt, not a
        // failing disk.
        redb::DatabaseError::Storage(redb::StorageError::Io(source))
            if source.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            OpenError::Corrupt {
                path: at,
                reason: format!("the file ends early (truncated?): {source}"),
            }
        }
        redb::DatabaseError::Storage(redb::StorageError::Io(source)) => {
            OpenError::Unreadable { path: at, source }
        }
        other => OpenError::Corrupt {
            path: at,
            reason: other.to_string(),
        },
    }
}

/// Reads the format without writing a byte: redb's read-only open modifies nothing, and
/// refuses a file that needs recovery (after a crash), which the writable open then
/// recovers before its own check of the format.
fn check_read_only(path: &Path, file: &Path) -> Result<(), OpenError> {
    let at = || path.to_owned();
    let handle = File::open(file).map_err(|source| OpenError::Unreadable { path: at(), source })?;
    match redb::Builder::new().open_read_only_with_backend(redb::backends::FileBackend::new(handle))
    {
        Ok(db) => check_format(&db).map(drop).map_err(|found| match found {
            Found::Other(found) => OpenError::Version { path: at(), found },
            Found::Broken(reason) => OpenError::Corrupt { path: at(), reason },
        }),
        Err(redb::DatabaseError::RepairAborted) => Ok(()),
        Err(err) => Err(database_error(path, err)),
    }
}

enum Found {
    Other(String),
    Broken(String),
}

/// The store's format, if this version opens it.
fn check_format(db: &impl ReadableDatabase) -> Result<u64, Found> {
    let txn = db.begin_read().map_err(|e| Found::Broken(e.to_string()))?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            return Err(Found::Other(
                "none (no idemgate format recorded)".to_owned(),
            ));
        }
        Err(err) => return Err(Found::Broken(err.to_string())),
    };
    let format = match meta
        .get("format")
        .map_err(|e| Found::Broken(e.to_string()))?
    {
        Some(v) if v.value() == FORMAT || v.value() == UPGRADES_FROM => v.value(),
        Some(v) => return Err(Found::Other(v.value().to_string())),
        None => {
            return Err(Found::Other(
                "none (no idemgate format recorded)".to_owned(),
            ));
        }
    };
    txn.open_table(LOG)
        .map_err(|e| Found::Broken(e.to_string()))?;
    Ok(format)
}

/// A new store: the tables and the format, in one durable commit.
fn init(db: &Database) -> Result<(), String> {
    mark_format(db)
}

/// Records [`FORMAT`] as the store's format (creating the tables if missing), in one
/// durable commit: a new store, or one of [`UPGRADES_FROM`] that this version opened.
fn mark_format(db: &Database) -> Result<(), String> {
    let txn = db.begin_write().map_err(|e| e.to_string())?;
    {
        txn.open_table(LOG).map_err(|e| e.to_string())?;
        let mut meta = txn.open_table(META).map_err(|e| e.to_string())?;
        meta.insert("format", FORMAT).map_err(|e| e.to_string())?;
    }
    txn.commit().map_err(|e| e.to_string())
}

/// The head of a log row: whose version it is, and when it expires.
#[derive(Debug, Clone, Copy)]
pub(super) struct Head {
    pub(super) key: ScopedKey,
    pub(super) expires_ms: u64,
}

const HEAD_LEN: usize = 40;

pub(super) fn encode(head: Head, record: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD_LEN + record.len());
    out.extend_from_slice(head.key.as_bytes());
    out.extend_from_slice(&head.expires_ms.to_be_bytes());
    out.extend_from_slice(record);
    out
}

pub(super) fn head(value: &[u8]) -> Result<Head, DecodeError> {
    let key: [u8; 32] = value
        .get(..32)
        .and_then(|k| k.try_into().ok())
        .ok_or(DecodeError::Truncated)?;
    let expires: [u8; 8] = value
        .get(32..HEAD_LEN)
        .and_then(|e| e.try_into().ok())
        .ok_or(DecodeError::Truncated)?;
    Ok(Head {
        key: ScopedKey::from_bytes(key),
        expires_ms: u64::from_be_bytes(expires),
    })
}

/// The encoded record of a row (empty for a row too short to have one).
pub(super) fn record_bytes(value: &[u8]) -> &[u8] {
    value.get(HEAD_LEN..).unwrap_or_default()
}

pub(super) fn record(value: &[u8]) -> Result<Record, DecodeError> {
    Record::decode(Bytes::copy_from_slice(record_bytes(value)))
}
