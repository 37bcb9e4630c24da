//! A policy's `scope_principal` at run time: reads the credential of a request and
//! verifies it, keeping a JWT source's key set fresh (docs/behaviour.md §17).
//!
//! The key set is read again every `jwks_refresh`, and at once when a token names a key
//! the set does not hold (a rotation), but then at most every [`ON_DEMAND_EVERY`], so
//! that tokens with made-up `kid`s cannot make idemgate hammer the identity provider. A
//! read that fails keeps the last good set, is logged at `warn` (naming the file or URL,
//! never a key) and counted.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use base64::Engine;
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue, Uri};
use jsonwebtoken::DecodingKey;
use prometheus_client::metrics::counter::Counter;
use sha2::{Digest, Sha256};

use super::cache::TokenCache;
use super::jwks::{JwksError, KeySet, parse_jwks};
use super::jwt::{self, Failed};
use super::{
    BasicPrincipal, CredentialError, JwkSet, JwtKeys, JwtSource, Principal, ScopePrincipal,
};

/// The shortest time between two reads of a key set for unknown `kid`s.
const ON_DEMAND_EVERY: Duration = Duration::from_secs(30);

/// A key set as read: the body of a file or URL.
pub type FetchFuture<'a> = Pin<
    Box<dyn Future<Output = Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>>> + Send + 'a>,
>;

/// Reads a key set from where it is published; the proxy gives one for `jwks_url`
/// (its own HTTPS client), this module has the one for `jwks_file`.
pub trait Fetch: Send + Sync + std::fmt::Debug {
    fn fetch(&self) -> FetchFuture<'_>;
    /// The file or URL, for a log line.
    fn describe(&self) -> String;
}

#[derive(Debug)]
struct FileFetch(PathBuf);

impl Fetch for FileFetch {
    fn fetch(&self) -> FetchFuture<'_> {
        Box::pin(async move { Ok(std::fs::read(&self.0)?) })
    }

    fn describe(&self) -> String {
        self.0.display().to_string()
    }
}

/// Why a key set was not read.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("cannot read {0}: {1}")]
    Fetch(String, #[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("{0}: {1}")]
    Parse(String, #[source] JwksError),
}

/// When the key set was last read.
#[derive(Debug, Default)]
struct Refreshed {
    /// Any read, periodic or on demand; `None` before the first.
    last: Option<Instant>,
    /// The last read for an unknown `kid`.
    on_demand: Option<Instant>,
    /// What the last good read held, to tell whether the keys changed.
    set: Option<Arc<JwkSet>>,
}

#[derive(Debug)]
struct JwtState {
    source: Arc<JwtSource>,
    keys: ArcSwap<KeySet>,
    /// `hs256_secret`, when that is the key source.
    secret: Option<SecretKey>,
    cache: TokenCache,
    fetch: Option<Arc<dyn Fetch>>,
    refreshed: tokio::sync::Mutex<Refreshed>,
    failures: Counter,
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
        let mut refreshed = Refreshed::default();
        let (keys, secret, fetch) = match &jwt.keys {
            JwtKeys::File { path, set } => {
                refreshed.last = Some(Instant::now());
                refreshed.set = Some(Arc::clone(set));
                let fetch: Arc<dyn Fetch> = Arc::new(FileFetch(path.clone()));
                (KeySet::new(set), None, Some(fetch))
            }
            JwtKeys::Url(uri) => (KeySet::default(), None, Some(url(uri))),
            JwtKeys::Secret(secret) => (
                KeySet::default(),
                Some(SecretKey(DecodingKey::from_secret(secret.expose()))),
                None,
            ),
        };
        Self {
            source: source.clone(),
            jwt: Some(JwtState {
                source: Arc::clone(jwt),
                keys: ArcSwap::from_pointee(keys),
                secret,
                cache: TokenCache::default(),
                fetch,
                refreshed: tokio::sync::Mutex::new(refreshed),
                failures,
            }),
        }
    }

    pub fn source(&self) -> &ScopePrincipal {
        &self.source
    }

    /// The verified principal of a request: `None` when it carries no credential,
    /// an error when the credential it carries does not verify. A token naming a key
    /// the set lacks makes the set be read again (at most every [`ON_DEMAND_EVERY`]).
    pub async fn principal(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<Principal>, CredentialError> {
        match (self.principal_now(headers), &self.jwt) {
            (Err(CredentialError::UnknownKey), Some(jwt)) if jwt.fetch.is_some() => {
                jwt.refresh_on_demand().await;
                self.principal_now(headers)
            }
            (other, _) => other,
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
        let Some(jwt) = &self.jwt else {
            return Ok(());
        };
        let mut refreshed = jwt.refreshed.lock().await;
        jwt.read(&mut refreshed).await
    }

    /// Reads the key set again if `jwks_refresh` has passed since the last read; a
    /// failure keeps the last good set.
    pub async fn refresh_if_due(&self, now: Instant) {
        let Some(jwt) = &self.jwt else {
            return;
        };
        let mut refreshed = jwt.refreshed.lock().await;
        if refreshed
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < jwt.source.refresh)
        {
            return;
        }
        let _ = jwt.refresh(&mut refreshed).await;
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
        match jwt::verify(&self.source, &self.keys.load(), secret, token) {
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

    /// A read for a `kid` the set lacks, unless one was made less than
    /// [`ON_DEMAND_EVERY`] ago; callers that queued behind a read find its keys.
    async fn refresh_on_demand(&self) {
        let mut refreshed = self.refreshed.lock().await;
        let now = Instant::now();
        if refreshed
            .on_demand
            .is_some_and(|last| now.saturating_duration_since(last) < ON_DEMAND_EVERY)
        {
            return;
        }
        refreshed.on_demand = Some(now);
        let _ = self.refresh(&mut refreshed).await;
    }

    /// [`read`](Self::read), with a failure logged and counted.
    async fn refresh(&self, refreshed: &mut Refreshed) -> Result<(), ()> {
        self.read(refreshed).await.map_err(|err| {
            self.failures.inc();
            tracing::warn!(
                error = %err,
                "reading the JWKS failed; the last good key set stays in use"
            );
        })
    }

    async fn read(&self, refreshed: &mut Refreshed) -> Result<(), RefreshError> {
        let Some(fetch) = &self.fetch else {
            return Ok(());
        };
        refreshed.last = Some(Instant::now());
        let bytes = fetch
            .fetch()
            .await
            .map_err(|err| RefreshError::Fetch(fetch.describe(), err))?;
        let set = parse_jwks(&bytes).map_err(|err| RefreshError::Parse(fetch.describe(), err))?;
        if refreshed.set.as_deref() != Some(&set) {
            self.keys.store(Arc::new(KeySet::new(&set)));
            // A token verified with a key that is gone must not stay trusted.
            self.cache.clear();
            refreshed.set = Some(Arc::new(set));
        }
        Ok(())
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
