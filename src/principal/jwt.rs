//! One JWT checked: its header's algorithm against the keys that may verify it, then its
//! signature, `exp`, `nbf`, `iss` and `aud`, then the claims that name the caller.
//!
//! The algorithm is taken from the token only to be refused when no key allows it:
//! `none` never parses, HMAC needs `hs256_secret` (a public key used as an HMAC secret
//! would let anyone sign), and a `kid` naming a key of another type is refused, not
//! tried with another key.

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::jwks::KeySet;
use super::{CredentialError, JwtSource, Principal};

const HMAC: [Algorithm; 3] = [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];

/// What a token verified to: the caller, and when the token expires (seconds since the
/// epoch), if it says.
#[derive(Debug)]
pub(super) struct Verified {
    pub(super) principal: Principal,
    pub(super) exp: Option<u64>,
}

/// Why a token was not verified.
#[derive(Debug)]
pub(super) enum Failed {
    /// Its `kid` is not in the set (or no key of the set takes its algorithm): reading
    /// the set again may find it.
    UnknownKey,
    Invalid(CredentialError),
}

impl From<CredentialError> for Failed {
    fn from(err: CredentialError) -> Self {
        Failed::Invalid(err)
    }
}

/// Verifies `token` under `source` with `keys` (a JWK set) or `secret` (HMAC).
pub(super) fn verify(
    source: &JwtSource,
    keys: &KeySet,
    secret: Option<&DecodingKey>,
    token: &str,
) -> Result<Verified, Failed> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| CredentialError::Malformed)?;
    let alg = header.alg;
    if let Some(secret) = secret {
        if !HMAC.contains(&alg) {
            return Err(CredentialError::Algorithm.into());
        }
        return Ok(check(source, secret, alg, token)?);
    }
    if HMAC.contains(&alg) {
        return Err(CredentialError::Algorithm.into());
    }
    if let Some(kid) = &header.kid {
        let key = keys.find(kid).ok_or(Failed::UnknownKey)?;
        if !key.algorithms.contains(&alg) {
            return Err(CredentialError::KeyMismatch.into());
        }
        return Ok(check(source, &key.key, alg, token)?);
    }
    // No `kid`: every key that takes the algorithm is tried; the first error that is not
    // about the signature (an expired token) is the answer.
    let mut tried = false;
    for key in keys.keys.iter().filter(|key| key.algorithms.contains(&alg)) {
        tried = true;
        match check(source, &key.key, alg, token) {
            Err(CredentialError::Signature) => continue,
            other => return Ok(other?),
        }
    }
    if tried {
        Err(CredentialError::Signature.into())
    } else {
        Err(Failed::UnknownKey)
    }
}

fn check(
    source: &JwtSource,
    key: &DecodingKey,
    alg: Algorithm,
    token: &str,
) -> Result<Verified, CredentialError> {
    let mut validation = Validation::new(alg);
    validation.leeway = source.leeway.as_secs();
    validation.validate_nbf = true;
    // `exp` is checked when present; `iss` and `aud` are required when configured (the
    // library would let a token without them through).
    let mut required = Vec::new();
    if let Some(issuer) = &source.issuer {
        validation.set_issuer(&[issuer]);
        required.push("iss");
    }
    match &source.audience {
        Some(audience) => {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        None => validation.validate_aud = false,
    }
    validation.set_required_spec_claims(&required);
    let data = jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation).map_err(
        |err| match err.kind() {
            ErrorKind::InvalidSignature => CredentialError::Signature,
            ErrorKind::ExpiredSignature => CredentialError::Expired,
            ErrorKind::ImmatureSignature => CredentialError::NotYetValid,
            ErrorKind::InvalidIssuer => CredentialError::Issuer,
            ErrorKind::InvalidAudience => CredentialError::Audience,
            ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => CredentialError::Issuer,
            ErrorKind::MissingRequiredClaim(_) => CredentialError::Audience,
            ErrorKind::InvalidAlgorithm => CredentialError::Algorithm,
            _ => CredentialError::Malformed,
        },
    )?;
    let claims = data.claims;
    let mut values = Vec::with_capacity(source.claims.len());
    for name in &source.claims {
        let value = claims
            .get(name)
            .ok_or_else(|| CredentialError::MissingClaim(name.clone()))?;
        values.push(match value {
            // A string as its text, so that `"42"` and `42` differ only by quoting.
            Value::String(text) => text.clone().into_bytes(),
            other => other.to_string().into_bytes(),
        });
    }
    Ok(Verified {
        principal: Principal::of(values.iter().map(Vec::as_slice)),
        exp: claims.get("exp").and_then(Value::as_u64),
    })
}
