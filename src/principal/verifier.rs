//! A policy's `scope_principal` at run time: reads the credential of a request and
//! verifies it (docs/behaviour.md §17), a JWT source with its key set kept fresh by
//! `refresh.rs` (docs/behaviour.md §25).

use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue, Uri};
use jsonwebtoken::DecodingKey;
use prometheus_client::metrics::counter::Counter;
use sha2::{Digest, Sha256};

use super::cache::TokenCache;
use super::jwks::KeySet;
use super::jwt::{self, Failed};
use super::refresh::{Fetch, FileFetch, KeySource, OnDemand, RefreshError};
use super::{
    BasicPrincipal, CredentialError, JwtKeys, JwtSource, Principal, PrincipalError, ScopePrincipal,
};

#[derive(Debug)]
struct JwtState {
    source: Arc<JwtSource>,
    /// The key set and its reads: a `jwks_file` or `jwks_url`.
    keys: Option<Arc<KeySource>>,
    /// `hs256_secret`, when that is the key source.
    secret: Option<SecretKey>,
    cache: Arc<TokenCache>,
}

/// A decoding key made of a secret, which `Debug` must not show.
struct SecretKey(DecodingKey);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(***)")
    }
}

/// One `scope_principal`, ready to verify requests.
#[derive(Debug)]
pub struct Verifier {
    source: ScopePrincipal,
    jwt: Option<JwtState>,
}

impl Verifier {
    /// A verifier for `source`; `url` gives the reader of a `jwks_url`, and `failures`
    /// counts the reads of a key set that failed.
    pub fn new(
        source: &ScopePrincipal,
        url: &dyn Fn(&Uri) -> Arc<dyn Fetch>,
        failures: Counter,
    ) -> Self {
        let ScopePrincipal::Jwt(jwt) = source else {
            return Self {
                source: source.clone(),
                jwt: None,
            };
        };
        let cache = Arc::new(TokenCache::default());
        let timing = (jwt.refresh, jwt.timeout);
        let shared = Arc::clone(&cache);
        let key_source = move |fetch: Arc<dyn Fetch>, set| {
            Some(Arc::new(KeySource::new(
                fetch, timing, set, shared, failures,
            )))
        };
        let (keys, secret) = match &jwt.keys {
            JwtKeys::File { path, set } => (
                key_source(Arc::new(FileFetch(path.clone())), Some(Arc::clone(set))),
                None,
            ),
            JwtKeys::Url(uri) => (key_source(url(uri), None), None),
            JwtKeys::Secret(secret) => (
                None,
                Some(SecretKey(DecodingKey::from_secret(secret.expose()))),
            ),
        };
        Self {
            source: source.clone(),
            jwt: Some(JwtState {
                source: Arc::clone(jwt),
                keys,
                secret,
                cache,
            }),
        }
    }

    pub fn source(&self) -> &ScopePrincipal {
        &self.source
    }

    /// The verified principal of a request: `None` when it carries no credential,
    /// an error when the credential it carries does not verify. A token naming a key
    /// the set lacks waits for a read of the set (the one in progress, or a new one at
    /// most every 30 s), bounded by `jwks_timeout`: still unknown after it, the token is
    /// invalid; if the read failed, the principal is unavailable (docs/behaviour.md §25).
    pub async fn principal(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<Principal>, PrincipalError> {
        let now = self.principal_now(headers);
        let (Err(CredentialError::UnknownKey), Some(keys)) = (&now, self.key_source()) else {
            return Ok(now?);
        };
        match keys.on_unknown_kid().await {
            OnDemand::Read | OnDemand::TooSoon => Ok(self.principal_now(headers)?),
            OnDemand::Failed { retry_after } => Err(PrincipalError::Unavailable { retry_after }),
        }
    }

    /// [`principal`](Self::principal) with the key set as it is: for `idemgate key`,
    /// which has no runtime to read it with.
    pub fn principal_now(&self, headers: &HeaderMap) -> Result<Option<Principal>, CredentialError> {
        let mut values = headers.get_all(self.source.header()).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(CredentialError::Repeated);
        }
        match (&self.source, &self.jwt) {
            (ScopePrincipal::TrustedHeader(_), _) => {
                Ok((!value.is_empty()).then(|| Principal::of([value.as_bytes()])))
            }
            (ScopePrincipal::Basic(made_of), _) => basic(value, *made_of).map(Some),
            (ScopePrincipal::Jwt(_), Some(jwt)) => jwt.principal(value).map(Some),
            (ScopePrincipal::Jwt(_), None) => Err(CredentialError::UnknownKey),
        }
    }

    /// Reads the key set, failing if it cannot: at start, where a `jwks_url` that
    /// cannot be read is fatal, as a `jwks_file` is when the configuration loads.
    pub async fn load(&self) -> Result<(), RefreshError> {
        match self.key_source() {
            Some(keys) => keys.load().await,
            None => Ok(()),
        }
    }

    /// Reads the key set again if `jwks_refresh` has passed since the last read, unless
    /// one is in progress; a failure keeps the last good set.
    pub async fn refresh_if_due(&self, now: Instant) {
        if let Some(keys) = self.key_source() {
            keys.refresh_if_due(tokio::time::Instant::from_std(now))
                .await;
        }
    }

    fn key_source(&self) -> Option<&Arc<KeySource>> {
        self.jwt.as_ref()?.keys.as_ref()
    }
}

impl JwtState {
    fn principal(&self, value: &HeaderValue) -> Result<Principal, CredentialError> {
        let token = bearer(value, self.source.header == AUTHORIZATION)?;
        let now = Instant::now();
        if let Some(principal) = self.cache.get(token, now) {
            return Ok(principal);
        }
        let secret = self.secret.as_ref().map(|s| &s.0);
        let keys = self.keys.as_ref().map(|keys| keys.current());
        let empty = KeySet::default();
        match jwt::verify(
            &self.source,
            keys.as_deref().unwrap_or(&empty),
            secret,
            token,
        ) {
            Ok(verified) => {
                self.cache.put(
                    token,
                    verified.principal.clone(),
                    verified.exp,
                    self.source.leeway,
                    now,
                );
                Ok(verified.principal)
            }
            Err(Failed::UnknownKey) => Err(CredentialError::UnknownKey),
            Err(Failed::Invalid(err)) => Err(err),
        }
    }
}

/// The token of a `Bearer` credential; under another header than `Authorization` the
/// `Bearer ` prefix is optional (a proxy may forward the bare token).
fn bearer(value: &HeaderValue, authorization: bool) -> Result<&str, CredentialError> {
    let text = value.to_str().map_err(|_| CredentialError::Malformed)?;
    let token = match text.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
        _ if authorization => return Err(CredentialError::NotBearer),
        _ => text.trim(),
    };
    if token.is_empty() {
        return Err(CredentialError::Malformed);
    }
    Ok(token)
}

/// The principal of `Basic base64(user:password)` (RFC 7617): the user name and, unless
/// the password is checked before a replay, its SHA-256 (docs/behaviour.md §25). Neither
/// the password nor its hash leaves the [`Principal`], which is never printed.
fn basic(value: &HeaderValue, made_of: BasicPrincipal) -> Result<Principal, CredentialError> {
    let text = value.to_str().map_err(|_| CredentialError::BadBasic)?;
    let encoded = match text.split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("basic") => rest.trim(),
        _ => return Err(CredentialError::NotBasic),
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| CredentialError::BadBasic)?;
    let colon = decoded
        .iter()
        .position(|b| *b == b':')
        .ok_or(CredentialError::BadBasic)?;
    let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
    Ok(match made_of {
        BasicPrincipal::UserAndPassword => {
            let hash: [u8; 32] = Sha256::digest(password).into();
            Principal::of([user, hash.as_slice()])
        }
        BasicPrincipal::UserAlone => Principal::of([user]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &'static str) -> HeaderValue {
        HeaderValue::from_static(text)
    }

    #[test]
    fn basic_is_the_user_and_the_password_unless_the_password_is_checked() {
        let both = BasicPrincipal::UserAndPassword;
        // alice:old, alice:old (scheme in another case), alice:new, bob:old
        let old = basic(&value("Basic YWxpY2U6b2xk"), both).expect("valid");
        assert_eq!(
            old,
            basic(&value("basic YWxpY2U6b2xk"), both).expect("valid")
        );
        let new = basic(&value("Basic YWxpY2U6bmV3"), both).expect("valid");
        assert_ne!(old, new, "a wrong or rotated password is another caller");
        let bob = basic(&value("Basic Ym9iOm9sZA=="), both).expect("valid");
        assert_ne!(old, bob);
        // Where replay_authorization checks the password: the user name alone.
        let alone = BasicPrincipal::UserAlone;
        let old = basic(&value("Basic YWxpY2U6b2xk"), alone).expect("valid");
        assert_eq!(
            old,
            basic(&value("Basic YWxpY2U6bmV3"), alone).expect("valid")
        );
        assert_ne!(
            old,
            basic(&value("Basic Ym9iOm9sZA=="), alone).expect("valid")
        );
        assert_eq!(
            basic(&value("Bearer x"), both),
            Err(CredentialError::NotBasic)
        );
        assert_eq!(
            basic(&value("Basic !!!"), both),
            Err(CredentialError::BadBasic)
        );
        // "alice" with no colon
        assert_eq!(
            basic(&value("Basic YWxpY2U="), alone),
            Err(CredentialError::BadBasic)
        );
    }

    #[test]
    fn a_bearer_token_is_read_by_its_scheme_in_any_case() {
        assert_eq!(bearer(&value("Bearer a.b.c"), true), Ok("a.b.c"));
        assert_eq!(bearer(&value("bearer a.b.c"), true), Ok("a.b.c"));
        assert_eq!(
            bearer(&value("Basic a.b.c"), true),
            Err(CredentialError::NotBearer)
        );
        assert_eq!(bearer(&value("a.b.c"), false), Ok("a.b.c"));
        assert_eq!(
            bearer(&value("Bearer "), true),
            Err(CredentialError::Malformed)
        );
    }
}
