//! Named crash points for the fault suite. Built only with the `failpoints` feature;
//! without it [`hit`] is an empty inline function. With the feature, setting
//! `IDEMGATE_CRASH_AT=<name>` makes the process abort at that point, which to the rest of
//! the system looks like a SIGKILL at an exact moment; `<name>@<n>` aborts on its n-th
//! hit instead of the first (e.g. `during-flush@2`: a request's second flush, its
//! record's).
//!
//! `IDEMGATE_FAIL_AT=<name>@<n>[,<n>...]` makes [`fails`] answer true on those hits
//! only: the point then fails (an I/O error) instead of aborting, and the process goes
//! on.

/// After the claim was acquired, before the request is forwarded.
pub(crate) const AFTER_CLAIM: &str = "after-claim";
/// After the upstream answered, before the outcome is recorded.
pub(crate) const AFTER_FORWARD: &str = "after-forward";
/// After the outcome was recorded, before the response is sent.
pub(crate) const AFTER_RECORD: &str = "after-record";
/// The file store: while a commit is being flushed, its pages written, the flush not
/// yet returned.
pub(crate) const DURING_FLUSH: &str = "during-flush";

#[cfg(feature = "failpoints")]
pub(crate) fn hit(name: &'static str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CRASH_AT: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let armed = CRASH_AT.get_or_init(|| {
        let spec = std::env::var("IDEMGATE_CRASH_AT").ok()?;
        Some(match spec.split_once('@') {
            Some((point, nth)) => (point.to_owned(), nth.parse().unwrap_or(1)),
            None => (spec, 1),
        })
    });
    if let Some((point, nth)) = armed
        && point == name
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 >= *nth
    {
        tracing::error!(failpoint = name, "crash point reached: aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn hit(_name: &'static str) {}

/// Whether the point `name` fails this time (`IDEMGATE_FAIL_AT`).
#[cfg(feature = "failpoints")]
pub(crate) fn fails(name: &'static str) -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static FAIL_AT: std::sync::OnceLock<Option<(String, Vec<u64>)>> = std::sync::OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let armed = FAIL_AT.get_or_init(|| {
        let spec = std::env::var("IDEMGATE_FAIL_AT").ok()?;
        Some(match spec.split_once('@') {
            Some((point, hits)) => (
                point.to_owned(),
                hits.split(',').filter_map(|n| n.parse().ok()).collect(),
            ),
            None => (spec, vec![1]),
        })
    });
    match armed {
        Some((point, hits)) if point == name => {
            let failing = hits.contains(&(HITS.fetch_add(1, Ordering::SeqCst) + 1));
            if failing {
                tracing::error!(failpoint = name, "fail point reached: failing");
            }
            failing
        }
        _ => false,
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn fails(_name: &'static str) -> bool {
    false
}
