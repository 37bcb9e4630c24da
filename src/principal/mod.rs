//! Who the caller is, for a scope that survives a token refresh (docs/behaviour.md §17):
//! the sources a policy's `scope_principal` names, the verification of each, and the
//! principal it yields. The proxy asks a [`Verifier`] for a request's principal before
//! it reads the body; `idemgate key` asks the same verifier, so both address a record
//! alike.
//!
//! - `jwks.rs`: a JWK set as read, and the keys and algorithms it allows;
//! - `jwt.rs`: one token checked against those keys (or an HMAC secret);
//! - `cache.rs`: tokens already verified, so that a retry does not pay a signature check;
//! - `refresh.rs`: a key set kept fresh, one bounded read at a time;
//! - `verifier.rs`: a policy's source at run time: the header read, the token verified,
//!   `trusted_header` and `basic` (the user name and a hash of the password).
//!
//! Nothing here logs, counts or returns a token, a claim value or a secret: errors say
//! what was wrong, never with what.

mod cache;
mod jwks;
mod jwt;
mod refresh;
mod verifier;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Uri};

pub use jsonwebtoken::jwk::JwkSet;
pub use jwks::{JwksError, parse_jwks};
pub use refresh::{Fetch, FetchFuture, RefreshError};
pub use verifier::Verifier;

/// `scope_principal`: where the verified principal of a request comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ScopePrincipal {
    /// A JWT, verified; shared by the routes that inherit it.
    Jwt(Arc<JwtSource>),
    /// A header an authenticating proxy in front sets, taken as is.
    TrustedHeader(HeaderName),
    /// HTTP Basic authentication: the user name and, unless the password is checked
    /// before a replay, a hash of the password.
    Basic(BasicPrincipal),
}

/// What the principal of HTTP Basic credentials is made of (docs/behaviour.md §25).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BasicPrincipal {
    /// The user name and a SHA-256 of the password: idemgate cannot check the password,
    /// and a replay never reaches the upstream that can, so a user name alone would let
    /// `alice:<anything>` read alice's records. A rotated password is a new scope. What
    /// `basic: true` means, unless the policy checks the password before a replay.
    UserAndPassword,
    /// The user name alone, so that a rotated password keeps the scope: only for a
    /// policy whose `replay_authorization` has the upstream check the password before
    /// any replay. Never written in `scope_principal`: the policy sets it from that key
    /// once its keys are merged.
    UserAlone,
}

impl ScopePrincipal {
    /// The header the credential is read from: left out of the scope, as
    /// `authorization` always is, since a refreshed credential must keep the scope.
    pub fn header(&self) -> &HeaderName {
        match self {
            ScopePrincipal::Jwt(jwt) => &jwt.header,
            ScopePrincipal::TrustedHeader(name) => name,
            ScopePrincipal::Basic(_) => &http::header::AUTHORIZATION,
        }
    }

    /// Whether a request without a principal still scopes by it (the anonymous scope),
    /// rather than as if `scope_principal` were unset (docs/behaviour.md §25). Only when
    /// the credential is read from `Authorization`: a request lacking it has no
    /// credential at all. Lacking a `trusted_header`, or a `jwt` read from another
    /// header, it may carry its credential in `Authorization` or the other scope
    /// headers, which must then scope it, never the remaining headers alone.
    pub fn scopes_the_anonymous(&self) -> bool {
        self.header() == http::header::AUTHORIZATION
    }

    /// Whether `self` and `other` give every request the same principal, hence the same
    /// record addresses: the keys may differ (a rotated set), the claims read may not.
    pub fn same_principals(&self, other: &ScopePrincipal) -> bool {
        match (self, other) {
            (ScopePrincipal::Jwt(a), ScopePrincipal::Jwt(b)) => {
                a.header == b.header && a.claims == b.claims
            }
            (ScopePrincipal::TrustedHeader(a), ScopePrincipal::TrustedHeader(b)) => a == b,
            (ScopePrincipal::Basic(a), ScopePrincipal::Basic(b)) => a == b,
            _ => false,
        }
    }
}

/// `scope_principal.jwt`.
#[derive(Debug, Clone, PartialEq)]
pub struct JwtSource {
    /// Where the token is read; `Bearer ` before it is taken off.
    pub header: HeaderName,
    /// The claims whose values, in order, are the principal.
    pub claims: Vec<String>,
    pub keys: JwtKeys,
    /// How often the key set is read again.
    pub refresh: Duration,
    /// The longest a read of the key set may take (`jwks_timeout`); requests waiting on
    /// an unknown `kid` are answered when it ends (docs/behaviour.md §25).
    pub timeout: Duration,
    /// When set, the token's `iss` must be this.
    pub issuer: Option<String>,
    /// When set, the token's `aud` must hold this.
    pub audience: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
}

/// Where the keys of a `jwt` source come from.
#[derive(Debug, Clone, PartialEq)]
pub enum JwtKeys {
    /// A JWKS file, read when the configuration is loaded (so `--check` and a reload
    /// read it too): `set` is what it held then.
    File { path: PathBuf, set: Arc<JwkSet> },
    /// A JWKS URL, fetched when the proxy starts, never by `--check`.
    Url(Uri),
    /// An HMAC secret: the only source under which HS256/384/512 are accepted.
    Secret(Secret),
}

/// `hs256_secret`: its bytes as written. Never printed: `Debug` and `--check` show `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Self {
        Self(bytes.into())
    }

    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A verified principal: the values that name the caller, each length-prefixed, so that
/// `["a:b", "c"]` and `["a", "b:c"]` differ. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Principal(std::sync::Arc<[u8]>);

impl Principal {
    /// The principal of these values, in order.
    pub fn of<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut bytes = Vec::new();
        for value in values {
            bytes.extend_from_slice(&(value.len() as u64).to_be_bytes());
            bytes.extend_from_slice(value);
        }
        // Shared: every request of a remembered token clones it.
        Self(bytes.into())
    }

    /// The bytes the record address hashes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Principal(..)")
    }
}

/// Why a request's principal is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    /// The credential does not verify: `401 invalid-credentials`.
    #[error(transparent)]
    Invalid(#[from] CredentialError),
    /// The token names a key the set lacks, and the read of the set it waited on failed
    /// or timed out (docs/behaviour.md §25): `503 principal-unavailable`, to be asked
    /// again after `retry_after`, when another read will be made.
    #[error("the key set that could verify the token could not be read")]
    Unavailable { retry_after: Duration },
}

/// Why a credential that was present is refused: `401 invalid-credentials`. The messages
/// say what is wrong, never with which value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("the credential header is given more than once")]
    Repeated,
    #[error("the Authorization header does not carry a Bearer token")]
    NotBearer,
    #[error("the Authorization header does not carry Basic credentials")]
    NotBasic,
    #[error("the Basic credentials are not base64 of user:password")]
    BadBasic,
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error("the token's algorithm is not accepted with these keys")]
    Algorithm,
    #[error("the key the token names cannot verify the token's algorithm")]
    KeyMismatch,
    #[error("no key of the key set matches the token")]
    UnknownKey,
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token's issuer is not the one expected")]
    Issuer,
    #[error("the token's audience does not include the one expected")]
    Audience,
    #[error("the token has no '{0}' claim")]
    MissingClaim(String),
    #[error("the token's '{0}' claim is not of its type")]
    ClaimType(&'static str),
}
