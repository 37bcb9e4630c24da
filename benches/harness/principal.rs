//! The bearer JWTs of the `memory-jwt-*` targets (docs/behaviour.md §17): a key pair made
//! at start, its public JWK in a JWK set file in the harness's temp dir (the target's
//! `jwks_file`), and tokens it signed. The keys and tokens come from the integration
//! tests' helpers (`tests/it/support/jwt.rs`), so both sign the same way.

use std::path::Path;

use serde_json::{Value, json};

use crate::jwt::{self, SigningKey};
use crate::{BoxError, procs};

/// The `iss` of every token; the principal is `[iss, sub]` (the default claims).
const ISSUER: &str = "https://idp.bench.invalid";
/// The `sub` of the tokens the load sends.
const SUBJECT: &str = "cus_9s6XKzkNRiz8i3";

/// The signature algorithm of a target's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alg {
    /// RSA 2048, made with the `openssl` command.
    Rs256,
    /// P-256, made with ring.
    Es256,
}

impl Alg {
    /// The JWK set's file name in the harness's temp dir.
    pub(crate) fn jwks_file(self) -> &'static str {
        match self {
            Alg::Rs256 => "jwks-rs256.json",
            Alg::Es256 => "jwks-es256.json",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Es256 => "ES256",
        }
    }
}

/// `Authorization` values for one target, made once per run and kept for its length
/// (`'static`, so that a [`crate::targets::Target`] stays `Copy`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tokens {
    /// What the load sends: `Bearer` and a token for [`SUBJECT`], valid for an hour.
    pub(crate) authorization: &'static str,
    /// Another token for the same `iss` and `sub` (another `iat`), as after a refresh: a
    /// key executed with [`Tokens::authorization`] must replay with it.
    pub(crate) refreshed: &'static str,
    /// A token for another `sub`: another scope, where the same key executes anew.
    pub(crate) other: &'static str,
    /// [`Tokens::authorization`] with its signature altered: `401 invalid-credentials`.
    pub(crate) forged: &'static str,
}

/// Makes a key pair for `alg`, writes its public JWK (with `kid` and `alg`) as a JWK set
/// to `dir`/[`Alg::jwks_file`], and signs the tokens.
pub(crate) fn make(dir: &Path, alg: Alg) -> Result<Tokens, BoxError> {
    let kid = format!("bench-{}", alg.name().to_ascii_lowercase());
    let mut key = match alg {
        Alg::Rs256 => {
            // The helper panics when a command fails: say first what is missing.
            if procs::on_path("openssl").is_none() {
                return Err("the RS256 target needs the openssl command on PATH".into());
            }
            // Its scratch files (the private key in PEM and DER) go when it is dropped.
            let scratch = jwt::Dir::new("bench");
            SigningKey::rsa(&scratch, &kid)
        }
        Alg::Es256 => SigningKey::ec(&kid),
    };
    // A key that names its algorithm verifies that one only (docs/behaviour.md §17).
    if let Value::Object(jwk) = &mut key.jwk {
        jwk.insert("alg".to_owned(), json!(alg.name()));
    }
    std::fs::write(dir.join(alg.jwks_file()), jwt::jwks(&[&key]))?;
    let now = jwt::epoch(0);
    let token = |sub: &str, iat: i64| {
        key.sign(&json!({"iss": ISSUER, "sub": sub, "iat": iat, "exp": jwt::epoch(3600)}))
    };
    let authorization = token(SUBJECT, now);
    let forged = forge(&authorization)?;
    let bearer = |token: &str| -> &'static str { format!("Bearer {token}").leak() };
    Ok(Tokens {
        authorization: bearer(&authorization),
        refreshed: bearer(&token(SUBJECT, now - 60)),
        other: bearer(&token("cus_someone_else", now)),
        forged: bearer(&forged),
    })
}

/// `token` with one character of its signature changed, inside it: the last character
/// of a base64url text may carry only padding bits, which decode the same.
fn forge(token: &str) -> Result<String, BoxError> {
    let dot = token.rfind('.').ok_or("a JWT has three parts")?;
    let at = dot + 8;
    let old = token
        .get(at..=at)
        .ok_or("an RS256 or ES256 signature is longer than 8 characters")?;
    let new = if old == "A" { "B" } else { "A" };
    Ok(format!("{}{new}{}", &token[..at], &token[at + 1..]))
}
