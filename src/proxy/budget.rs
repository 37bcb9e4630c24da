//! `max_buffered_bytes` (docs/behaviour.md §15): the request and response bodies held in
//! memory at once, across all requests. A guarded request body takes its share as its
//! bytes arrive (not from the declared `Content-Length`) and is refused (`503
//! overloaded`) when the share is not there, before anything is claimed; a response body being recorded always takes its share (the request was
//! forwarded, refusing it now would help nobody), so that new requests wait for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::gauge::Gauge;

#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    /// Bytes held now, by every [`Held`] share: `idemgate_buffered_bytes`.
    used: Gauge<u64, AtomicU64>,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: Gauge::default(),
        })
    }

    /// The gauge of bytes held, for `/metrics`.
    pub(crate) fn gauge(&self) -> Gauge<u64, AtomicU64> {
        self.used.clone()
    }

    #[cfg(test)]
    fn used(&self) -> u64 {
        self.used.get()
    }

    /// An empty share that may grow only within the limit (a request body).
    pub(crate) fn strict(self: &Arc<Self>) -> Held {
        Held {
            budget: Arc::clone(self),
            bytes: 0,
            filled: 0,
            strict: true,
        }
    }

    /// An empty share that always grows, past the limit too (a response body).
    pub(crate) fn counting(self: &Arc<Self>) -> Held {
        Held {
            budget: Arc::clone(self),
            bytes: 0,
            filled: 0,
            strict: false,
        }
    }
}

/// Bytes taken from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<Budget>,
    /// Taken from the budget.
    bytes: u64,
    /// Of those, filled with body bytes so far.
    filled: u64,
    strict: bool,
}

impl Held {
    /// Accounts for `n` more body bytes, taking from the budget what was not taken
    /// beforehand (a `Content-Length` reserved up front); `false` as for [`Held::grow`].
    pub(crate) fn fill(&mut self, n: u64) -> bool {
        let after = self.filled + n;
        if after > self.bytes && !self.grow(after - self.bytes) {
            return false;
        }
        self.filled = after;
        true
    }

    /// Takes `n` more bytes; `false` (and nothing taken) when a strict share would pass
    /// the limit.
    pub(crate) fn grow(&mut self, n: u64) -> bool {
        let used = self.budget.used.inner();
        if self.strict {
            let limit = self.budget.limit;
            let taken = used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                now.checked_add(n).filter(|after| *after <= limit)
            });
            if taken.is_err() {
                return false;
            }
        } else {
            used.fetch_add(n, Ordering::Relaxed);
        }
        self.bytes += n;
        true
    }
}

impl Held {
    /// Holds exactly `n` bytes: grows as [`Held::grow`] does (a counting share always
    /// can), or gives back what is no longer held. A streamed body's share follows the
    /// frame in hand this way (docs/behaviour.md §19).
    pub(crate) fn resize(&mut self, n: u64) -> bool {
        if n > self.bytes {
            return self.grow(n - self.bytes);
        }
        self.budget.used.dec_by(self.bytes - n);
        self.bytes = n;
        self.filled = self.filled.min(n);
        true
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.used.dec_by(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_shares_stay_within_the_limit_and_every_share_gives_back() {
        let budget = Budget::new(100);
        let mut a = budget.strict();
        assert!(a.grow(60));
        let mut b = budget.strict();
        assert!(!b.grow(41), "60 + 41 would pass 100");
        assert!(b.grow(40));
        assert_eq!(budget.used(), 100);
        let mut response = budget.counting();
        assert!(response.grow(50), "a response is counted past the limit");
        assert_eq!(budget.used(), 150);
        assert!(!budget.strict().grow(1), "new requests wait for it");
        drop((a, b, response));
        assert_eq!(budget.used(), 0);
        let mut reserved = budget.strict();
        assert!(reserved.grow(30), "a Content-Length, reserved up front");
        assert!(reserved.fill(10) && reserved.fill(20));
        assert_eq!(
            budget.used(),
            30,
            "filling what was reserved takes nothing more"
        );
        assert!(reserved.fill(5));
        assert_eq!(budget.used(), 35);
        let mut frame = budget.counting();
        assert!(frame.resize(20));
        assert_eq!(budget.used(), 55);
        assert!(frame.resize(4), "a smaller frame gives back the difference");
        assert_eq!(budget.used(), 39);
        drop(frame);
        assert_eq!(budget.used(), 35);
    }
}
