//! `--seal` (issue 41 item 4): what encryption at rest costs one record, timed in this
//! process without any load: `Keyring::seal` and `Keyring::open` (src/store/seal.rs) on
//! a `Completed` record whose response body is 1 KiB of JSON, in nanoseconds per call,
//! the median of several rounds. Single-threaded; a loaded machine slows it, so the
//! report says how busy the machine was. For a count that load does not change, run
//! the same mode under `valgrind --tool=callgrind` (BENCHMARKS.md, "Encryption").

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use http::StatusCode;
use http::header::{self, HeaderValue};
use idemgate::config::EncryptionKey;
use idemgate::idempotency::record::OpenedOnce;
use idemgate::idempotency::{Completed, Fingerprint, Kept, ScopedKey, StoredBody, Times};
use idemgate::store::Keyring;

use crate::{BoxError, cpu, servers};

/// The response body of the sealed record.
pub(crate) const BODY_LEN: usize = 1024;

/// What `--seal` runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Rounds, each timing `ops` seals then `ops` opens.
    pub(crate) rounds: usize,
    pub(crate) ops: usize,
}

/// The record the proxy would keep for a 1 KiB JSON answer: `201`, its content type,
/// the times set, in clear.
fn record() -> Completed {
    let mut record = Completed::clear(
        Fingerprint::from_bytes([7; 32]),
        StatusCode::CREATED,
        vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        StoredBody::Stored(servers::padded_body(BODY_LEN)),
    );
    record.times = Some(Times {
        claimed_ms: 1_700_000_000_000,
        completed_ms: 1_700_000_000_020,
    });
    record
}

/// A copy of a sealed record that has not been opened: the memory store keeps the
/// opened response beside a record, so each timed open needs one of its own, as a
/// record just read from Redis or the file store's journal is.
fn unopened(sealed: &Completed) -> Arc<Completed> {
    let mut copy = sealed.clone();
    if let Kept::Sealed(s) = &mut copy.kept {
        s.opened = OpenedOnce::default();
    }
    Arc::new(copy)
}

/// The median of `values` (sorted in place); NaN for none.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Times `plan.rounds` rounds of seals and opens and prints ns per call, each output
/// dropped at once. `Ok(false)` if
/// an opened record is not the response sealed.
pub(crate) fn run(plan: Plan) -> Result<bool, BoxError> {
    let ring = Keyring::new(&[EncryptionKey::new("bench".to_owned(), [0x42; 32])])
        .ok_or("a keyring of one key")?;
    let key = ScopedKey::from_bytes([3; 32]);
    let clear = record();
    let sealed = ring.seal(&key, clear.clone());
    let Kept::Sealed(s) = &sealed.kept else {
        return Err("Keyring::seal returned a record in clear".into());
    };
    let opened = Keyring::open(Some(&ring), &key, unopened(&sealed))
        .map_err(|err| format!("a sealed record does not open: {err}"))?;
    let ok = Some(opened.response()) == clear.clear_response();
    if !ok {
        eprintln!("PROBLEM: the opened record is not the response sealed");
    }
    println!(
        "seal: Keyring::seal and Keyring::open (AES-256-GCM, ring), one thread, a 201 with a {BODY_LEN} B JSON body and its content type ({} B sealed with the tag); {} rounds of {} seals then {} opens",
        s.ciphertext.len(),
        plan.rounds,
        plan.ops,
        plan.ops,
    );
    let (mut seal_ns, mut open_ns) = (Vec::new(), Vec::new());
    let watched = [cpu::Watched {
        pid: std::process::id(),
        tree: false,
    }];
    let from = cpu::snapshot(&watched);
    for round in 0..plan.rounds {
        // The inputs are made before each timed loop. Each output is dropped as soon as
        // it is made, as the proxy drops a record once written or replayed: kept, 20000
        // outputs of a KiB would time the kernel's first touch of fresh heap pages.
        let inputs: Vec<Completed> = (0..plan.ops).map(|_| clear.clone()).collect();
        let start = Instant::now();
        for record in inputs {
            drop(black_box(ring.seal(black_box(&key), black_box(record))));
        }
        let seal = start.elapsed().as_nanos() as f64 / plan.ops as f64;
        let inputs: Vec<Arc<Completed>> = (0..plan.ops).map(|_| unopened(&sealed)).collect();
        let mut failed = 0usize;
        let start = Instant::now();
        for record in inputs {
            let opened = Keyring::open(Some(&ring), black_box(&key), black_box(record));
            failed += usize::from(black_box(opened).is_err());
        }
        let open = start.elapsed().as_nanos() as f64 / plan.ops as f64;
        if failed > 0 {
            return Err(format!("{failed} sealed records did not open in the timed loop").into());
        }
        println!(
            "  round {}: seal {seal:.0} ns, open {open:.0} ns",
            round + 1
        );
        seal_ns.push(seal);
        open_ns.push(open);
    }
    let usage = cpu::Usage::between(&from, &cpu::snapshot(&watched));
    let range = |values: &[f64]| {
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{lo:.0} to {hi:.0}")
    };
    let (seal_range, open_range) = (range(&seal_ns), range(&open_ns));
    println!(
        "seal: median {:.0} ns per seal [{seal_range}], {:.0} ns per open [{open_range}], of {} rounds; other load meanwhile {:.2} CPUs",
        median(&mut seal_ns),
        median(&mut open_ns),
        plan.rounds,
        usage.other_cpus,
    );
    Ok(ok)
}
