//! One JWT checked: its header's algorithm against the keys that may verify it, then its
//! signature, `exp`, `nbf`, `iss` and `aud`, the types of the registered claims, then
//! the claims that name the caller.
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
    typed(&claims)?;
    // The library reads `exp` only as a `u64`: a negative one would never expire.
    if claims
        .get("exp")
        .and_then(Value::as_f64)
        .is_some_and(|exp| exp < 0.0)
    {
        return Err(CredentialError::Expired);
    }
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
        // Rounded as the library rounds it when it checks it.
        exp: claims
            .get("exp")
            .and_then(Value::as_f64)
            .map(|exp| exp.round() as u64),
    })
}

/// The registered claims have their types (RFC 7519 §4.1, docs/behaviour.md §25): the
/// library skips a claim it cannot read as its type, so a string `exp` would never
/// expire, and a number `sub` would name a caller.
fn typed(claims: &Map<String, Value>) -> Result<(), CredentialError> {
    for name in ["exp", "nbf", "iat", "iss", "sub", "aud"] {
        let Some(value) = claims.get(name) else {
            continue;
        };
        let has_its_type = match (name, value) {
            ("exp" | "nbf" | "iat", Value::Number(_)) => true,
            ("iss" | "sub" | "aud", Value::String(_)) => true,
            ("aud", Value::Array(items)) => items.iter().all(Value::is_string),
            _ => false,
        };
        if !has_its_type {
            return Err(CredentialError::ClaimType(name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use jsonwebtoken::jwk::JwkSet;
    use jsonwebtoken::{EncodingKey, Header};
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING as P256, EcdsaKeyPair, KeyPair};
    use serde_json::json;

    use super::*;
    use crate::principal::JwtKeys;

    /// A P-256 key: what signs, and its JWK under `kid`.
    fn p256(kid: &str) -> (EncodingKey, serde_json::Value) {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&P256, &rng).expect("generate");
        let pair = EcdsaKeyPair::from_pkcs8(&P256, pkcs8.as_ref(), &rng).expect("pair");
        let point = pair.public_key().as_ref();
        let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid,
                         "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..])});
        (EncodingKey::from_ec_der(pkcs8.as_ref()), jwk)
    }

    fn source(issuer: Option<&str>) -> JwtSource {
        JwtSource {
            header: http::header::AUTHORIZATION,
            claims: vec!["iss".into(), "sub".into()],
            keys: JwtKeys::Url("https://idp/jwks".parse().expect("uri")),
            refresh: Duration::from_secs(300),
            timeout: Duration::from_secs(5),
            issuer: issuer.map(str::to_owned),
            audience: None,
            leeway: Duration::from_secs(60),
        }
    }

    fn sign(alg: Algorithm, kid: &str, key: &EncodingKey, claims: &serde_json::Value) -> String {
        let mut header = Header::new(alg);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, key).expect("sign")
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn set(jwks: &[serde_json::Value]) -> KeySet {
        let set: JwkSet = serde_json::from_value(json!({ "keys": jwks })).expect("set");
        KeySet::new(&set)
    }

    #[test]
    fn the_principal_is_the_claims_in_order_whatever_the_token() {
        let (key, jwk) = p256("a");
        let keys = set(&[jwk]);
        let src = source(Some("https://idp"));
        let claims = |iat: u64| json!({"iss": "https://idp", "sub": "alice", "iat": iat, "exp": now() + 600});
        let one = verify(
            &src,
            &keys,
            None,
            &sign(Algorithm::ES256, "a", &key, &claims(1)),
        );
        let two = verify(
            &src,
            &keys,
            None,
            &sign(Algorithm::ES256, "a", &key, &claims(2)),
        );
        let (one, two) = (one.expect("valid"), two.expect("valid"));
        assert_eq!(one.principal, two.principal);
        assert_eq!(
            one.principal,
            Principal::of([b"https://idp".as_slice(), b"alice".as_slice()])
        );
        assert!(one.exp.is_some());
    }

    #[test]
    fn what_a_key_set_cannot_vouch_for_is_refused() {
        let (key, jwk) = p256("a");
        let keys = set(&[jwk]);
        let src = source(Some("https://idp"));
        let good = json!({"iss": "https://idp", "sub": "alice", "exp": now() + 600});
        let invalid = |token: &str| match verify(&src, &keys, None, token) {
            Err(Failed::Invalid(err)) => err,
            other => panic!("{other:?}"),
        };
        // HMAC over a key set: the key would be public.
        let hmac = sign(
            Algorithm::HS256,
            "a",
            &EncodingKey::from_secret(b"x"),
            &good,
        );
        assert_eq!(invalid(&hmac), CredentialError::Algorithm);
        let none = format!(
            "{}.{}.",
            B64.encode(br#"{"alg":"none","kid":"a"}"#),
            B64.encode(good.to_string())
        );
        assert_eq!(invalid(&none), CredentialError::Malformed);
        let expired = json!({"iss": "https://idp", "sub": "alice", "exp": now() - 3600});
        assert_eq!(
            invalid(&sign(Algorithm::ES256, "a", &key, &expired)),
            CredentialError::Expired
        );
        // Within the leeway, an expired token still verifies.
        let just = json!({"iss": "https://idp", "sub": "alice", "exp": now() - 10});
        assert!(verify(&src, &keys, None, &sign(Algorithm::ES256, "a", &key, &just)).is_ok());
        let no_iss = json!({"sub": "alice", "exp": now() + 600});
        assert_eq!(
            invalid(&sign(Algorithm::ES256, "a", &key, &no_iss)),
            CredentialError::Issuer
        );
        let (other, _) = p256("b");
        assert_eq!(
            invalid(&sign(Algorithm::ES256, "a", &other, &good)),
            CredentialError::Signature
        );
        assert!(matches!(
            verify(
                &src,
                &keys,
                None,
                &sign(Algorithm::ES256, "b", &other, &good)
            ),
            Err(Failed::UnknownKey)
        ));
    }

    #[test]
    fn a_kid_naming_a_key_of_another_type_is_refused() {
        let (_, ec) = p256("ec");
        let keys = set(&[ec]);
        let src = source(None);
        let claims = json!({"sub": "alice", "iss": "i", "exp": now() + 600});
        let (ed_key, _) = {
            let rng = ring::rand::SystemRandom::new();
            let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("generate");
            (EncodingKey::from_ed_der(pkcs8.as_ref()), ())
        };
        let token = sign(Algorithm::EdDSA, "ec", &ed_key, &claims);
        assert!(matches!(
            verify(&src, &keys, None, &token),
            Err(Failed::Invalid(CredentialError::KeyMismatch))
        ));
    }

    /// `exp`, `nbf`, `iat` numbers; `iss`, `sub` strings; `aud` a string or an array of
    /// strings (docs/behaviour.md §25): a string `exp` used to make a token that never
    /// expires, and a number where a string belongs was taken as the principal.
    #[test]
    fn registered_claims_of_another_type_are_refused() {
        let (key, jwk) = p256("a");
        let keys = set(&[jwk]);
        let src = source(None);
        let verify_claims = |claims: &serde_json::Value| {
            verify(
                &src,
                &keys,
                None,
                &sign(Algorithm::ES256, "a", &key, claims),
            )
        };
        let base = json!({"iss": "i", "sub": "alice", "iat": now(), "nbf": now() - 10,
                          "exp": now() + 600, "aud": ["payments", "ledger"]});
        assert!(verify_claims(&base).is_ok());
        for (claim, value) in [
            ("aud", json!("payments")),
            ("exp", json!(now() as f64 + 600.5)),
            ("iat", json!(-1)),
        ] {
            let mut claims = base.clone();
            claims[claim] = value;
            assert!(verify_claims(&claims).is_ok(), "{claim}: {}", claims[claim]);
        }
        for (claim, value) in [
            // Long past, as a string: never expired.
            ("exp", json!("1")),
            ("exp", json!(null)),
            ("nbf", json!("0")),
            ("iat", json!(true)),
            ("iss", json!(1)),
            ("sub", json!(["alice"])),
            ("sub", json!({"name": "alice"})),
            ("aud", json!(1)),
            ("aud", json!(["payments", 2])),
            ("aud", json!({"payments": true})),
        ] {
            let mut claims = base.clone();
            claims[claim] = value;
            // Some the library already fails to read (as malformed): 401 either way.
            match verify_claims(&claims) {
                Err(Failed::Invalid(CredentialError::ClaimType(name))) => assert_eq!(name, claim),
                Err(Failed::Invalid(CredentialError::Malformed)) => {}
                other => panic!("{claim}: {}: {other:?}", claims[claim]),
            }
        }
        // A negative `exp` is a number the library skips: long expired, not eternal.
        let mut claims = base;
        claims["exp"] = json!(-1);
        assert!(matches!(
            verify_claims(&claims),
            Err(Failed::Invalid(CredentialError::Expired))
        ));
    }

    #[test]
    fn a_secret_verifies_hmac_only() {
        let src = source(None);
        let secret = DecodingKey::from_secret(b"s3cr3t");
        let claims = json!({"iss": "i", "sub": "alice"});
        let keys = KeySet::default();
        for alg in HMAC {
            let token = sign(alg, "x", &EncodingKey::from_secret(b"s3cr3t"), &claims);
            assert!(
                verify(&src, &keys, Some(&secret), &token).is_ok(),
                "{alg:?}"
            );
        }
        let (key, _) = p256("a");
        let token = sign(Algorithm::ES256, "a", &key, &claims);
        assert!(matches!(
            verify(&src, &keys, Some(&secret), &token),
            Err(Failed::Invalid(CredentialError::Algorithm))
        ));
    }
}
