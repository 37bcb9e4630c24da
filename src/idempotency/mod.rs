//! The idempotency engine, free of I/O: it parses keys, computes fingerprints, encodes
//! records and decides what to do with an existing record. Everything here is
//! deterministic given its inputs (time is passed in), so it is tested without sockets.

pub mod body;
mod canonical;
pub mod decide;
pub mod fingerprint;
pub mod format;
pub mod key;
pub mod path;
pub mod pointer;
pub mod record;
pub mod rules;
pub mod source;

pub use decide::{
    AfterTakeOver, Decision, OnConcurrent, OnUnknownOutcome, Rejection, compared, decide,
    retry_after,
};
pub use fingerprint::{Fingerprint, StreamedHash};
pub use key::{IdempotencyKey, KeyError, Scope, ScopeId, ScopedKey};
pub use record::{
    Completed, InFlight, Kept, OwnerToken, Record, Sealed, StoredBody, StoredResponse, Streamed,
    Times,
};
pub use source::{Found, KeySource, Offered};
