//! The open mode (issue 26): how long the file store takes to open with N live records.
//! The store is filled through idemgate's own library (claim, then complete, with a
//! 200-byte response each, `fsync: false`), closed, and opened three times; each open
//! reads the whole store before it answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use idemgate::idempotency::record::{Completed, StoredBody};
use idemgate::idempotency::{Fingerprint, OwnerToken, ScopedKey};
use idemgate::store::{Claim, ClaimRequest, Fenced, FileOptions, FileStore, Store};

use crate::BoxError;
use crate::procs::TempDir;

/// Claims in flight at once while the store is filled.
const FILLERS: u64 = 256;

pub(crate) async fn run(records: u64) -> Result<bool, BoxError> {
    let dir = TempDir::new()?;
    let options = FileOptions {
        path: dir.path().join("store"),
        fsync: false,
        max_entries: usize::try_from(records + 1)?,
        max_entries_per_scope: None,
    };
    let started = Instant::now();
    {
        let store = Arc::new(FileStore::open(&options)?);
        let tasks: Vec<_> = (0..FILLERS)
            .map(|filler| {
                let store = Arc::clone(&store);
                tokio::spawn(async move { fill(&store, filler, records).await })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
    }
    let bytes: u64 = std::fs::read_dir(&options.path)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "open: {records} live records written in {:.1} s; the store's directory holds {:.1} MiB",
        started.elapsed().as_secs_f64(),
        bytes as f64 / (1024.0 * 1024.0)
    );
    for round in 1..=3 {
        let started = Instant::now();
        let store = FileStore::open(&options)?;
        let took = started.elapsed();
        let held = store.len() as u64;
        drop(store);
        println!(
            "open {round} of 3: {:.2} s, {held} entries",
            took.as_secs_f64()
        );
        if held != records {
            eprintln!("PROBLEM open: {held} entries after the open, {records} written");
            return Ok(false);
        }
    }
    Ok(true)
}

/// Writes every `FILLERS`-th record of `0..records`, starting at `filler`.
async fn fill(store: &FileStore, filler: u64, records: u64) -> Result<(), BoxError> {
    let mut n = filler;
    while n < records {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&n.to_le_bytes());
        key[8] = 1;
        let req = ClaimRequest {
            key: ScopedKey::from_bytes(key),
            scope: None,
            fingerprint: Fingerprint::from_bytes([1; 32]),
            token: OwnerToken::random(),
            lease: Duration::from_secs(3600),
            ttl: Duration::from_secs(24 * 3600),
            streamed: false,
        };
        let Claim::Acquired(lease) = store.claim(req).await? else {
            return Err(format!("record {n} existed before it was written").into());
        };
        let record = Arc::new(Completed::clear(
            Fingerprint::from_bytes([1; 32]),
            StatusCode::CREATED,
            Vec::new(),
            StoredBody::Stored(Bytes::from(vec![b'x'; 200])),
        ));
        if store.complete(&lease, record, req.ttl).await? != Fenced::Done {
            return Err(format!("record {n} lost its lease while it was written").into());
        }
        n += FILLERS;
    }
    Ok(())
}
