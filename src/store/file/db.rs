//! The open database, shared by the readers and the writer, and how the writer opens it
//! again after a failed write.
//!
//! redb fails every later operation once one write to its file has failed (a full disk,
//! an I/O error): the database has to be closed and opened again. What that reopening
//! finds is the last commit that completed, which is everything the store acknowledged:
//! a caller is answered only after its commit returned, and a commit that failed was
//! answered with an error. A failed commit's pages are outside the committed tree, and
//! redb's recovery on open leaves them free.
//!
//! Until a write succeeds again the store is not healthy, and `/readyz` says so; the
//! writer tries a write of its own every second, as large as the one that failed, so
//! that the store becomes ready again once there is room, even if nothing is sent to it
//! meanwhile.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redb::{Database, TableDefinition, WriteTransaction};

use super::backend::Settings;
use super::disk::{self, OpenError};
use super::unavailable;
use crate::store::StoreError;

/// Where a probe writes, as much as the write that failed; removed by the next commit,
/// so that a store at rest holds no probe. Older versions open a store with it: they
/// read only the tables they know.
const PROBE: TableDefinition<&str, &[u8]> = TableDefinition::new("probe");

/// The largest probe: room for two of the largest default records is room enough.
const PROBE_MAX: u64 = 8 << 20;

/// Adds the probe of `bytes` bytes to `txn` (replacing one a failed removal left).
pub(super) fn write_probe(txn: &WriteTransaction, bytes: u64) -> Result<(), redb::Error> {
    let len = usize::try_from(bytes.clamp(1, PROBE_MAX)).unwrap_or(1);
    let mut probe = txn.open_table(PROBE)?;
    probe.insert("probe", vec![0xA5u8; len].as_slice())?;
    Ok(())
}

/// Removes the probe, in a commit of its own.
pub(super) fn remove_probe(db: &Database) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.delete_table(PROBE)?;
    txn.commit()?;
    Ok(())
}

/// The database while it is open; nothing between a failed write and the reopening.
#[derive(Debug)]
pub(super) struct Db {
    current: ArcSwapOption<Database>,
    /// False from a failed write until a write succeeds again.
    healthy: AtomicBool,
}

impl Db {
    pub(super) fn new(db: Database) -> Self {
        Self {
            current: ArcSwapOption::from_pointee(db),
            healthy: AtomicBool::new(true),
        }
    }

    /// The database, for one read.
    pub(super) fn get(&self) -> Result<Arc<Database>, StoreError> {
        self.current.load_full().ok_or_else(|| {
            unavailable(
                "the file store is opening its database again after a failed write".to_owned(),
            )
        })
    }

    pub(super) fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub(super) fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    pub(super) fn put(&self, db: Database) {
        self.current.store(Some(Arc::new(db)));
    }

    /// Takes the database away from new readers and closes it once the last reader is
    /// done: redb lets a file be opened only once at a time, so the reopening must wait
    /// for the close.
    pub(super) fn close(&self) {
        let Some(mut db) = self.current.swap(None) else {
            return;
        };
        loop {
            match Arc::try_unwrap(db) {
                Ok(db) => {
                    // After a failed write redb reports that it could not close cleanly;
                    // the next open recovers, as after a crash.
                    if let Err(err) = db.close() {
                        tracing::debug!(error = %err, "file store: closing after a failed write");
                    }
                    return;
                }
                // A reader holds it for one read transaction: moments.
                Err(shared) => {
                    db = shared;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

/// What opening the database again needs: the open of a store that exists, with the
/// same backend settings and metrics as at start.
#[derive(Debug)]
pub(super) struct Reopen {
    pub(super) path: PathBuf,
    pub(super) file: PathBuf,
    pub(super) settings: Settings,
}

impl Reopen {
    pub(super) fn open(&self) -> Result<Database, OpenError> {
        // The flushes of redb's recovery are not a commit's: the fail and crash points
        // "during a flush" skip them, as they skip those of the first open.
        self.settings.serving.store(false, Ordering::Relaxed);
        let opened = disk::open_existing(&self.path, &self.file, self.settings.clone());
        self.settings.serving.store(true, Ordering::Relaxed);
        opened
    }
}
