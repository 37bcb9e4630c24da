//! The label values of `/metrics`: how a request ended, which store call, what a
//! reconcile lookup found, and the label sets they are exported under.

use prometheus_client::encoding::EncodeLabelSet;

/// How a request ended, one label value of `idemgate_requests_total{outcome=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Claimed, forwarded and recorded.
    Forwarded,
    /// Answered from a stored record.
    Replayed,
    InFlight,
    KeyReused,
    MissingKey,
    InvalidKey,
    TooLarge,
    /// Not guarded: method, disabled route, or no key where none is required.
    Passthrough,
    StoreUnavailable,
    /// The store was down and `on_unavailable: pass_through` forwarded it unguarded.
    StoreBypassed,
    OutcomeUnknown,
    /// Forwarded, but the claim was lost before recording: the response was not stored.
    LeaseLost,
    NotReplayable,
    /// Forwarded, and the claim released (`release_statuses`).
    Released,
    UpstreamUnreachable,
    BadRequest,
    /// `max_buffered_bytes` would have been passed: refused before anything was claimed.
    Overloaded,
    /// Passed through (not guarded), and the upstream failed.
    PassthroughError,
    /// Keyed by its fingerprint alone, but carrying no scope value that tells its client
    /// apart: forwarded unguarded rather than deduplicated with other clients' requests.
    Unscoped,
    /// A credential was sent and did not verify: refused before anything was claimed.
    InvalidCredentials,
    /// No credential where `require_principal` asks for one.
    MissingCredentials,
    /// The read of the key set an unknown `kid` waited on failed or timed out.
    PrincipalUnavailable,
    /// A replay that `replay_authorization` refused (`401`/`403` passed on).
    ReplayDenied,
    /// A replay that `replay_authorization` could not decide: `503`.
    AuthorizationUnavailable,
}

impl Outcome {
    pub const ALL: [Outcome; 24] = [
        Outcome::Forwarded,
        Outcome::Replayed,
        Outcome::InFlight,
        Outcome::KeyReused,
        Outcome::MissingKey,
        Outcome::InvalidKey,
        Outcome::TooLarge,
        Outcome::Passthrough,
        Outcome::StoreUnavailable,
        Outcome::StoreBypassed,
        Outcome::OutcomeUnknown,
        Outcome::LeaseLost,
        Outcome::NotReplayable,
        Outcome::Released,
        Outcome::UpstreamUnreachable,
        Outcome::BadRequest,
        Outcome::Overloaded,
        Outcome::PassthroughError,
        Outcome::Unscoped,
        Outcome::InvalidCredentials,
        Outcome::MissingCredentials,
        Outcome::PrincipalUnavailable,
        Outcome::ReplayDenied,
        Outcome::AuthorizationUnavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::KeyReused => "key_reused",
            Outcome::MissingKey => "missing_key",
            Outcome::InvalidKey => "invalid_key",
            Outcome::TooLarge => "too_large",
            Outcome::Passthrough => "passthrough",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::StoreBypassed => "store_bypassed",
            Outcome::OutcomeUnknown => "outcome_unknown",
            Outcome::LeaseLost => "lease_lost",
            Outcome::NotReplayable => "not_replayable",
            Outcome::Released => "released",
            Outcome::UpstreamUnreachable => "upstream_unreachable",
            Outcome::BadRequest => "bad_request",
            Outcome::Overloaded => "overloaded",
            Outcome::PassthroughError => "passthrough_error",
            Outcome::Unscoped => "unscoped",
            Outcome::InvalidCredentials => "invalid_credentials",
            Outcome::MissingCredentials => "missing_credentials",
            Outcome::PrincipalUnavailable => "principal_unavailable",
            Outcome::ReplayDenied => "replay_denied",
            Outcome::AuthorizationUnavailable => "authorization_unavailable",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// A store operation, one label value of `idemgate_store_duration_seconds{op=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Claim,
    Complete,
    Release,
    Renew,
    TakeOver,
    Watch,
    Ping,
    Inspect,
    Purge,
    /// [`crate::store::Store::replace`], by which an unknown outcome is resolved.
    Resolve,
}

impl StoreOp {
    pub const ALL: [StoreOp; 10] = [
        StoreOp::Claim,
        StoreOp::Complete,
        StoreOp::Release,
        StoreOp::Renew,
        StoreOp::TakeOver,
        StoreOp::Watch,
        StoreOp::Ping,
        StoreOp::Inspect,
        StoreOp::Purge,
        StoreOp::Resolve,
    ];

    /// The name of its span in a trace (docs/behaviour.md §20).
    pub fn span_name(self) -> &'static str {
        match self {
            StoreOp::Claim => "store.claim",
            StoreOp::Complete => "store.complete",
            StoreOp::Release => "store.release",
            StoreOp::Renew => "store.renew",
            StoreOp::TakeOver => "store.take_over",
            StoreOp::Watch => "store.watch",
            StoreOp::Ping => "store.ping",
            StoreOp::Inspect => "store.inspect",
            StoreOp::Purge => "store.purge",
            StoreOp::Resolve => "store.resolve",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Complete => "complete",
            StoreOp::Release => "release",
            StoreOp::Renew => "renew",
            StoreOp::TakeOver => "take_over",
            StoreOp::Watch => "watch",
            StoreOp::Ping => "ping",
            StoreOp::Inspect => "inspect",
            StoreOp::Purge => "purge",
            StoreOp::Resolve => "resolve",
        }
    }
}

/// What a `reconcile` lookup said about a request whose outcome was unknown
/// (docs/behaviour.md §18): the `result` of `idemgate_reconciliations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// `2xx`: it executed; the lookup's answer is its recorded outcome.
    Executed,
    /// `404`: it did not; the key was released.
    NotExecuted,
    /// Any other answer, or no answer: `outcome-unknown` was recorded.
    Unknown,
}

impl Reconciled {
    pub const ALL: [Reconciled; 3] = [
        Reconciled::Executed,
        Reconciled::NotExecuted,
        Reconciled::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reconciled::Executed => "executed",
            Reconciled::NotExecuted => "not_executed",
            Reconciled::Unknown => "unknown",
        }
    }
}

/// What `replay_authorization` said before a replay (docs/behaviour.md §24): the
/// `result` of `idemgate_replay_authorizations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authorized {
    /// `2xx`: replayed.
    Allowed,
    /// `401` or `403`: passed to the client.
    Denied,
    /// Anything else, or no answer: `503 authorization-unavailable`.
    Error,
}

impl Authorized {
    pub const ALL: [Authorized; 3] = [Authorized::Allowed, Authorized::Denied, Authorized::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Authorized::Allowed => "allowed",
            Authorized::Denied => "denied",
            Authorized::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabel {
    pub(super) result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ExecutedLabel {
    pub(super) executed: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OpLabel {
    pub(super) op: &'static str,
}
