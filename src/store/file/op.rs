//! What a request asks of the file store's writer, and how the writer answers it once
//! the commit that decided it is on disk.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::unavailable;
use crate::idempotency::{Completed, OwnerToken, ScopedKey};
use crate::store::{Claim, ClaimRequest, Fenced, Lease, Purged, StoreError};

pub(super) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One queued operation, with the caller's clock reading and where to answer.
#[derive(Debug)]
pub(super) enum Op {
    Claim {
        req: ClaimRequest,
        now: u64,
        reply: Reply<Claim>,
    },
    Complete {
        key: ScopedKey,
        token: OwnerToken,
        record: Arc<Completed>,
        ttl: Duration,
        now: u64,
        reply: Reply<Fenced>,
    },
    Release {
        key: ScopedKey,
        token: OwnerToken,
        now: u64,
        reply: Reply<Fenced>,
    },
    Renew {
        key: ScopedKey,
        token: OwnerToken,
        lease_for: Duration,
        now: u64,
        reply: Reply<Fenced>,
    },
    TakeOver {
        stale: OwnerToken,
        req: ClaimRequest,
        now: u64,
        reply: Reply<Option<Lease>>,
    },
    /// The admin API's purge (docs/behaviour.md §13).
    Purge {
        key: ScopedKey,
        force: bool,
        now: u64,
        reply: Reply<Purged>,
    },
    /// Removes entries whose ttl has passed (the background expiry).
    Sweep { now: u64 },
}

impl Op {
    pub(super) fn now(&self) -> u64 {
        match self {
            Op::Claim { now, .. }
            | Op::Complete { now, .. }
            | Op::Release { now, .. }
            | Op::Renew { now, .. }
            | Op::TakeOver { now, .. }
            | Op::Purge { now, .. }
            | Op::Sweep { now } => *now,
        }
    }

    /// Answers `why` without applying the operation: the writer has no database open.
    pub(super) fn fail(self, why: &str) {
        let err = || unavailable(why.to_owned());
        match self {
            Op::Claim { reply, .. } => drop(reply.send(Err(err()))),
            Op::Complete { reply, .. } | Op::Release { reply, .. } | Op::Renew { reply, .. } => {
                drop(reply.send(Err(err())));
            }
            Op::TakeOver { reply, .. } => drop(reply.send(Err(err()))),
            Op::Purge { reply, .. } => drop(reply.send(Err(err()))),
            Op::Sweep { .. } => {}
        }
    }
}

/// An answer decided inside the transaction, sent once it is committed.
pub(super) enum Answer {
    Claim(Reply<Claim>, Result<Claim, StoreError>),
    Fenced(Reply<Fenced>, Fenced),
    TakeOver(Reply<Option<Lease>>, Option<Lease>),
    Failed(Reply<Fenced>, StoreError),
    Purged(Reply<Purged>, Purged),
    PurgeFailed(Reply<Purged>, StoreError),
    None,
}

impl Answer {
    pub(super) fn send(self) {
        // A caller that gave up (its deadline passed) no longer listens: nothing to do.
        match self {
            Answer::Claim(reply, result) => drop(reply.send(result)),
            Answer::Fenced(reply, fenced) => drop(reply.send(Ok(fenced))),
            Answer::TakeOver(reply, lease) => drop(reply.send(Ok(lease))),
            Answer::Failed(reply, err) => drop(reply.send(Err(err))),
            Answer::Purged(reply, purged) => drop(reply.send(Ok(purged))),
            Answer::PurgeFailed(reply, err) => drop(reply.send(Err(err))),
            Answer::None => {}
        }
    }

    pub(super) fn fail(self, why: &str) {
        let err = || unavailable(why.to_owned());
        match self {
            Answer::Claim(reply, _) => drop(reply.send(Err(err()))),
            Answer::Fenced(reply, _) | Answer::Failed(reply, _) => drop(reply.send(Err(err()))),
            Answer::TakeOver(reply, _) => drop(reply.send(Err(err()))),
            Answer::Purged(reply, _) | Answer::PurgeFailed(reply, _) => {
                drop(reply.send(Err(err())));
            }
            Answer::None => {}
        }
    }
}
