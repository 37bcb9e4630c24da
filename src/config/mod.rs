//! Typed, validated configuration, by section (one file each under `sections/`: its
//! struct, defaults, checks and reload class).
//!
//! Loading reads the text once, so that every error can name the field it is about and
//! its line:
//!
//! 1. `parse` has the YAML parser read the text, within its limits
//!    (docs/behaviour.md §15), straight into the sections' structs, which deny unknown
//!    keys;
//! 2. while it reads, each key's form (`types`) checks its value, with `interp`
//!    replacing `${VAR}` in every string value (`$${` is a literal `${`), and
//!    `serde_path_to_error` recording where each one was;
//! 3. [`Config`]'s `build` applies the rules that span keys.
//!
//! `--check` prints the same structs through serde, each key by the same form.

mod error;
mod interp;
mod parse;
mod sections;
mod types;

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests;

use std::io::Read;

use crate::principal::{BasicPrincipal, JwtKeys, ScopePrincipal};
use std::net::SocketAddr;
use std::path::Path;
use types::secret::url_secret;
#[cfg(test)]
use types::secret::{MASK, mask_url, redact_url};

pub use crate::idempotency::decide::{OnConcurrent, OnUnknownOutcome};
pub use crate::idempotency::path::EscapedSlashes;
pub use error::{At, ConfigError};
pub use sections::policy::reconcile::Reconcile;
pub use sections::policy::replay_authorization::{AuthorizerTarget, ReplayAuthorization};
pub use sections::store::encryption::EncryptionKey;
pub use sections::store::postgres::{SslMode, StoreTls, redact_pg_url, split_sslmode};
pub use sections::store::redis::SentinelConfig;
pub use sections::store::{OnUnavailable, StoreConfig, StoreKind};
pub use sections::telemetry::{OtlpConfig, OtlpProtocol, TelemetryConfig};
pub use sections::upstream::tls::{
    CertFile, KeyFile, UpstreamTls, client_config as tls_client_config,
};
pub use sections::{
    AdminConfig, AdminToken, AllowOrigins, Config, CorsConfig, ErrorFormat, ErrorsConfig,
    LogConfig, LogFormat, Policy, RELOAD, Reload, ReloadKey, Route, RouteMatch, UpstreamConfig,
    Workers,
};

impl Config {
    /// Parse YAML text; `env` resolves `${VAR}` (pass `|k| std::env::var(k).ok()` in production).
    ///
    /// `env` is a parameter so that tests can supply variables without touching the
    /// process environment, which is shared by every test thread.
    pub fn from_yaml_str(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let sections::top::File(config) = parse::document(text, env)?;
        config.build().map_err(|err| parse::located(err, text))
    }

    /// Reads and parses a file, resolving `${VAR}` from the process environment.
    ///
    /// At most one byte more than the 1 MiB limit is read, so a huge file (or a device
    /// that never ends) is refused at once.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let io = |source| ConfigError::Io {
            path: path.to_owned(),
            source,
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|file| {
                file.take(parse::MAX_BYTES as u64 + 1)
                    .read_to_end(&mut bytes)
            })
            .map_err(io)?;
        parse::check_size(bytes.len(), &path.display().to_string())?;
        let text = String::from_utf8(bytes)
            .map_err(|err| io(std::io::Error::new(std::io::ErrorKind::InvalidData, err)))?;
        Config::from_yaml_str(&text, &|name| std::env::var(name).ok())
    }

    /// `idemgate --upstream URL [--listen ADDR]`: all defaults, memory store.
    ///
    /// A bad URL is reported under the path `--upstream`, the flag the operator typed.
    pub fn for_upstream(url: &str, listen: Option<SocketAddr>) -> Result<Config, ConfigError> {
        let url = types::http::parse_upstream_url(url)
            .map_err(|msg| ConfigError::invalid("--upstream", msg))?;
        Config::with_upstream(url, listen).build()
    }

    /// Effective configuration, defaults included, as YAML that `from_yaml_str` parses
    /// back to an equal `Config` once its secrets are filled in: store passwords and
    /// `admin.token` are printed as `***`, which loading refuses, and a comment at the
    /// top names them.
    /// A `${` in a value is printed `$${`, which loads back as `${` (not a variable).
    ///
    /// Durations print like `24h`, `10s`, `500ms`; sizes like `1MiB` or bare bytes.
    /// Routes print only the keys in which they differ from `idempotency`.
    pub fn to_yaml(&self) -> String {
        let yaml = serde_saphyr::to_string(self)
            .unwrap_or_else(|err| format!("# cannot print the configuration: {err}\n"));
        format!(
            "{}{}{}{}{yaml}",
            sections::cors::notice(self.cors.as_ref()),
            masked_notice(self),
            streaming_notice(self),
            basic_notice(self)
        )
    }
}

/// The comment that says what a Basic principal is made of in each policy that has one
/// (docs/behaviour.md §25): the user name and a hash of the password, or the user name
/// alone where `replay_authorization` checks the password. A route is named when its
/// `scope_principal` differs from `idempotency`'s, as it is printed then.
fn basic_notice(config: &Config) -> String {
    let base = &config.idempotency.scope_principal;
    let sections = std::iter::once(("idempotency".to_owned(), base)).chain(
        config
            .routes
            .iter()
            .enumerate()
            .map(|(i, route)| (format!("routes[{i}]"), &route.policy.scope_principal))
            .filter(|(_, own)| *own != base),
    );
    let mut notice = String::new();
    for (section, source) in sections {
        let Some(ScopePrincipal::Basic(made_of)) = source else {
            continue;
        };
        let (what, why) = match made_of {
            BasicPrincipal::UserAndPassword => (
                "the user name and a SHA-256 of the password",
                "no replay_authorization checks the password before a replay; a new \
                 password is a new scope",
            ),
            BasicPrincipal::UserAlone => (
                "the user name alone",
                "replay_authorization checks the password before any replay",
            ),
        };
        notice.push_str(&format!(
            "# {section}: scope_principal basic: the principal is {what}\n#   ({why}).\n"
        ));
    }
    notice
}
/// The comment that says which policies stream only some bodies
/// (docs/behaviour.md §19): a key source or fingerprint that reads the body's JSON sees
/// buffered bodies only, so there a body over `max_request_body` is still `413`.
fn streaming_notice(config: &Config) -> String {
    let sections = std::iter::once(("idempotency".to_owned(), &config.idempotency)).chain(
        config
            .routes
            .iter()
            .enumerate()
            .map(|(i, route)| (format!("routes[{i}]"), &route.policy)),
    );
    let mut notice = String::new();
    for (section, policy) in sections {
        if let Some(needs_body) = policy.stream_limits() {
            notice.push_str(&format!(
                "# {section}: stream_request_body does not combine with {needs_body}: they \
                 see buffered\n#   bodies only, so there a body over max_request_body is \
                 answered 413 as without streaming.\n"
            ));
        }
    }
    notice
}
/// The comment that opens the output when it holds `***` in place of a secret: such
/// a file is refused until each is filled in, and the operator should learn why and
/// where before trying to start from it.
fn masked_notice(config: &Config) -> String {
    let store = &config.store;
    let mut keys = Vec::new();
    if config.admin.token.is_some() {
        keys.push("admin.token".to_owned());
    }
    // A route prints `scope_principal` only when it differs from `idempotency`'s.
    let has_secret = |source: &Option<ScopePrincipal>| matches!(source, Some(ScopePrincipal::Jwt(jwt)) if matches!(jwt.keys, JwtKeys::Secret(_)));
    let base = &config.idempotency.scope_principal;
    if has_secret(base) {
        keys.push("idempotency.scope_principal.jwt.hs256_secret".to_owned());
    }
    for (i, route) in config.routes.iter().enumerate() {
        let own = &route.policy.scope_principal;
        if own != base && has_secret(own) {
            keys.push(format!("routes[{i}].scope_principal.jwt.hs256_secret"));
        }
    }
    // The paths of the URLs that hold a secret, as `to_yaml` printed them.
    let with_secrets = |urls: &[String], key: &str| -> Vec<String> {
        urls.iter()
            .enumerate()
            .filter(|(_, url)| url_secret(url).is_some())
            .map(|(i, _)| format!("{key}[{i}]"))
            .collect()
    };
    // Only a Redis or PostgreSQL store's URLs are printed.
    if store.kind == StoreKind::Postgres {
        if store
            .urls
            .iter()
            .any(|url| sections::store::postgres::has_password(url))
        {
            keys.push("store.url".to_owned());
        }
    } else if store.kind == StoreKind::Redis {
        match store.urls.as_slice() {
            [url] if url_secret(url).is_some() => keys.push("store.url".to_owned()),
            urls => keys.extend(with_secrets(urls, "store.urls")),
        }
        if let Some(sentinel) = &store.sentinel {
            keys.extend(with_secrets(&sentinel.urls, "store.sentinel.urls"));
        }
    }
    keys.extend(sections::store::encryption::masked(&store.encryption));
    keys.extend(sections::telemetry::masked(&config.telemetry));
    if keys.is_empty() {
        return String::new();
    }
    let mut notice = "# Secrets are printed as ***, which idemgate refuses as a secret: fill \
                      these in\n# (the value, or ${VAR}) before starting it from this file:\n"
        .to_owned();
    for key in keys {
        notice.push_str(&format!("#   {key}\n"));
    }
    notice
}
