//! The record id a request would use (docs/behaviour.md §13), for `idemgate key`: the
//! same policy, key reading, credential check and address as the handler's, without a
//! request or a store.

use crate::config::Config;
use crate::idempotency::key::{parse_plain, parse_value};
use crate::idempotency::path;
use crate::idempotency::source::KeySource;
use crate::principal::{CredentialError, Verifier};

use super::view;

/// Why `idemgate key` cannot name a record.
#[derive(Debug, thiserror::Error)]
pub enum RecordIdError {
    #[error("--path: {0}")]
    Path(String),
    #[error("{method} {path} is passed through, unguarded: it has no record")]
    NotGuarded { method: String, path: String },
    #[error("KEY: {0}")]
    Key(#[source] crate::idempotency::KeyError),
    #[error("-H: invalid credentials: {0}")]
    Credentials(#[source] CredentialError),
    #[error("the route requires credentials (require_principal): give them with -H")]
    MissingCredentials,
}

/// The record id (`key_prefix` + 64 hex) a request with this method, path, headers and
/// key would use (docs/behaviour.md §13): the path picks the policy as for a request, the
/// key is read as its first source reads it, the credential among `headers` is verified
/// as the proxy verifies it, and the address is `Policy::address`, as in the handler.
pub fn record_id(
    config: &Config,
    method: &http::Method,
    path: &str,
    headers: &http::HeaderMap,
    key: &str,
) -> Result<String, RecordIdError> {
    let normal = path::normalise(path, config.escaped_slashes)
        .map_err(|err| RecordIdError::Path(err.to_string()))?;
    let policy = config
        .route_index(&view::match_path(&normal))
        .and_then(|i| config.routes.get(i))
        .map_or(&config.idempotency, |route| &route.policy);
    if !policy.enabled || !view::guarded_method(method, headers, &policy.methods) {
        return Err(RecordIdError::NotGuarded {
            method: method.to_string(),
            path: path.to_owned(),
        });
    }
    let source = policy
        .key_from
        .first()
        .expect("key_from is never empty: checked when the configuration loads");
    let key = match source {
        // The sf-string spelling is a header's (docs/behaviour.md §9).
        KeySource::Header(_) => parse_value(key.as_bytes()),
        _ => parse_plain(key.as_bytes()),
    }
    .map_err(RecordIdError::Key)?;
    // The proxy refuses a key of another format before it is addressed: it has no record.
    if !matches!(source, KeySource::Fingerprint(_)) {
        policy.key_format.check(&key).map_err(RecordIdError::Key)?;
    }
    let principal = match &policy.scope_principal {
        None => None,
        Some(scope) => {
            let fetcher = super::jwks::url_fetcher(&config.upstream);
            let verifier = Verifier::new(scope, &fetcher, Default::default());
            // A `jwks_url` is not read here: its tokens are refused as matching no key.
            let principal = verifier
                .principal_now(headers)
                .map_err(RecordIdError::Credentials)?;
            if principal.is_none() && policy.require_principal {
                return Err(RecordIdError::MissingCredentials);
            }
            principal
        }
    };
    let scoped = policy.address(headers, principal.as_ref(), source, &key);
    Ok(scoped.id(&config.store.key_prefix))
}
