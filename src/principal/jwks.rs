//! A JWK set (RFC 7517) and what each of its keys may verify.
//!
//! A key that names its algorithm (`alg`) verifies that algorithm only; one that does not
//! verifies what its type can: RSA keys RS256/384/512 and PS256, P-256 keys ES256, P-384
//! keys ES384, Ed25519 keys EdDSA. Symmetric (`oct`) keys are never used: a secret
//! published in a key set is no secret, and HMAC is accepted only with `hs256_secret`.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};

/// Why a key set could not be read.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("not a JWK set (a JSON object with a \"keys\" array): {0}")]
    NotASet(#[source] serde_json::Error),
    #[error("holds no key idemgate can verify with (RSA, EC P-256/P-384 or Ed25519)")]
    NoUsableKey,
}

/// The keys of `bytes` that idemgate can verify with. A key it cannot read (another
/// type, a bad parameter) is skipped rather than failing the set, as identity providers
/// publish keys for other uses beside their signing keys; a set without one usable key
/// is an error.
pub fn parse_jwks(bytes: &[u8]) -> Result<JwkSet, JwksError> {
    #[derive(serde::Deserialize)]
    struct Loose {
        keys: Vec<serde_json::Value>,
    }
    let loose: Loose = serde_json::from_slice(bytes).map_err(JwksError::NotASet)?;
    let keys: Vec<Jwk> = loose
        .keys
        .into_iter()
        .filter_map(|key| serde_json::from_value::<Jwk>(key).ok())
        .filter(|jwk| !algorithms(jwk).is_empty() && DecodingKey::from_jwk(jwk).is_ok())
        .collect();
    if keys.is_empty() {
        return Err(JwksError::NoUsableKey);
    }
    Ok(JwkSet { keys })
}

/// One key ready to verify with.
pub(super) struct Key {
    pub(super) kid: Option<String>,
    pub(super) algorithms: &'static [Algorithm],
    pub(super) key: DecodingKey,
}

/// A key set with its decoding keys built once.
#[derive(Default)]
pub(super) struct KeySet {
    pub(super) keys: Vec<Key>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl KeySet {
    pub(super) fn new(set: &JwkSet) -> Self {
        let keys = set
            .keys
            .iter()
            .filter_map(|jwk| {
                Some(Key {
                    kid: jwk.common.key_id.clone(),
                    algorithms: algorithms(jwk),
                    key: DecodingKey::from_jwk(jwk).ok()?,
                })
            })
            .filter(|key| !key.algorithms.is_empty())
            .collect();
        Self { keys }
    }

    pub(super) fn find(&self, kid: &str) -> Option<&Key> {
        self.keys.iter().find(|key| key.kid.as_deref() == Some(kid))
    }
}

const RSA: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
];

/// What `jwk` may verify: empty for a key idemgate does not use.
pub(super) fn algorithms(jwk: &Jwk) -> &'static [Algorithm] {
    let by_type: &'static [Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => RSA,
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => &[Algorithm::ES256],
            EllipticCurve::P384 => &[Algorithm::ES384],
            _ => &[],
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => &[Algorithm::EdDSA],
            _ => &[],
        },
        AlgorithmParameters::OctetKey(_) => &[],
    };
    let Some(named) = jwk.common.key_algorithm else {
        return by_type;
    };
    let one: &'static [Algorithm] = match named {
        KeyAlgorithm::RS256 => &[Algorithm::RS256],
        KeyAlgorithm::RS384 => &[Algorithm::RS384],
        KeyAlgorithm::RS512 => &[Algorithm::RS512],
        KeyAlgorithm::PS256 => &[Algorithm::PS256],
        KeyAlgorithm::ES256 => &[Algorithm::ES256],
        KeyAlgorithm::ES384 => &[Algorithm::ES384],
        KeyAlgorithm::EdDSA => &[Algorithm::EdDSA],
        // HMAC, the PS variants outside the accepted list, and encryption algorithms.
        KeyAlgorithm::HS256
        | KeyAlgorithm::HS384
        | KeyAlgorithm::HS512
        | KeyAlgorithm::PS384
        | KeyAlgorithm::PS512
        | KeyAlgorithm::RSA1_5
        | KeyAlgorithm::RSA_OAEP
        | KeyAlgorithm::RSA_OAEP_256 => &[],
    };
    // An `alg` its type cannot do makes the key unusable rather than trusted for it.
    if one.iter().all(|alg| by_type.contains(alg)) {
        one
    } else {
        &[]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwk(json: &str) -> Jwk {
        serde_json::from_str(json).expect("jwk")
    }

    const RSA_N: &str = "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw";

    #[test]
    fn a_key_verifies_what_its_alg_names_or_else_what_its_type_can() {
        let untyped = jwk(&format!(r#"{{"kty":"RSA","n":"{RSA_N}","e":"AQAB"}}"#));
        assert_eq!(algorithms(&untyped), RSA);
        let named = jwk(&format!(
            r#"{{"kty":"RSA","alg":"PS256","n":"{RSA_N}","e":"AQAB"}}"#
        ));
        assert_eq!(algorithms(&named), [Algorithm::PS256]);
        // An RSA key that claims an EC algorithm is not trusted for anything.
        let lying = jwk(&format!(
            r#"{{"kty":"RSA","alg":"ES256","n":"{RSA_N}","e":"AQAB"}}"#
        ));
        assert!(algorithms(&lying).is_empty());
        let hmac = jwk(r#"{"kty":"oct","k":"c2VjcmV0","alg":"HS256"}"#);
        assert!(
            algorithms(&hmac).is_empty(),
            "a published secret is no secret"
        );
    }

    #[test]
    fn a_set_keeps_its_usable_keys_and_refuses_none() {
        let set = parse_jwks(
            format!(
                r#"{{"keys":[{{"kty":"oct","k":"c2VjcmV0"}},{{"kty":"XYZ"}},
                {{"kty":"RSA","kid":"r","n":"{RSA_N}","e":"AQAB"}}]}}"#
            )
            .as_bytes(),
        )
        .expect("one usable key");
        assert_eq!(set.keys.len(), 1);
        assert!(KeySet::new(&set).find("r").is_some());
        assert!(matches!(
            parse_jwks(br#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#),
            Err(JwksError::NoUsableKey)
        ));
        assert!(matches!(parse_jwks(b"[]"), Err(JwksError::NotASet(_))));
    }
}
