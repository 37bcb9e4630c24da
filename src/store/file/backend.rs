//! redb's file backend with the flush made a choice: `fsync: true` flushes every commit
//! to stable storage, `fsync: false` leaves the written pages to the kernel. Either way
//! every commit's pages and header are written to the file before the commit returns,
//! so a commit survives a crash of the process; without the flush it may not survive a
//! crash of the machine.
//!
//! redb's own `Durability::None` would not do for `fsync: false`: a non-durable commit
//! keeps the new header in memory only, so a `kill -9` loses it.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use crate::failpoint;

/// What a backend is opened with, the same at start and at every reopen after a failed
/// write: whether it flushes, and where it counts what it does.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) fsync: bool,
    /// Flushes to stable storage (`fdatasync`), for the flushes-per-request figure.
    pub(super) syncs: Counter,
    /// The file's size (`idemgate_store_disk_bytes`).
    pub(super) size: Gauge,
    /// Armed once the store is open (see [`Backend`]).
    pub(super) serving: Arc<AtomicBool>,
}

#[derive(Debug)]
pub(super) struct Backend {
    file: FileBackend,
    fsync: bool,
    /// Flushes to stable storage (`fdatasync`), for the flushes-per-request figure.
    syncs: Counter,
    /// The file's size (`idemgate_store_disk_bytes`), kept as redb grows or shrinks it,
    /// so that no commit has to ask the filesystem.
    size: Gauge,
    /// Armed once the store is open, so that the crash point "during a flush" hits the
    /// first flush of a request's commit, not the creation of the file.
    serving: Arc<AtomicBool>,
}

impl Backend {
    pub(super) fn new(file: std::fs::File, settings: Settings) -> Self {
        let Settings {
            fsync,
            syncs,
            size,
            serving,
        } = settings;
        if let Ok(meta) = file.metadata() {
            size.set(bytes(meta.len()));
        }
        Self {
            file: FileBackend::new(file),
            fsync,
            syncs,
            size,
            serving,
        }
    }
}

impl StorageBackend for Backend {
    fn len(&self) -> Result<u64, BackendError> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), BackendError> {
        self.file.set_len(len)?;
        self.size.set(bytes(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), BackendError> {
        if self.serving.load(Ordering::Relaxed) {
            failpoint::hit(failpoint::DURING_FLUSH);
            // A flush that fails after the commit's pages and header were written: the
            // commit may be in the file although redb reports it failed.
            if failpoint::fails(failpoint::DURING_FLUSH) {
                return Err(BackendError::Io(std::io::Error::other(
                    "fail point: the flush failed",
                )));
            }
        }
        if !self.fsync {
            return Ok(());
        }
        self.syncs.inc();
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.file.write(offset, data)?;
        // A write past the end grows the file too.
        let end = bytes(offset.saturating_add(data.len() as u64));
        if end > self.size.get() {
            self.size.set(end);
        }
        Ok(())
    }

    fn close(&self) -> Result<(), BackendError> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

fn bytes(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
