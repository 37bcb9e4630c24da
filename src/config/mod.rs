//! Typed, validated configuration.
//!
//! Loading runs in three steps, each in its own file, so that every error can name the
//! field it is about and its line:
//!
//! 1. `parse` has the YAML parser read the text, within its limits
//!    (docs/behaviour.md §15), straight into `raw`'s structs, which deny unknown keys;
//! 2. while it reads, `values` parses units, enums and addresses, with `interp`
//!    replacing `${VAR}` in every string value (`$${` is a literal `${`), and
//!    `serde_path_to_error` recording where each one was (`policy` declares the keys
//!    that `idempotency` and `routes[]` share, `sections` those of `upstream`, `errors`
//!    and `log`, and `top` the top-level keys and the reload class of every key, once
//!    each);
//! 3. `validate` applies defaults and the checks that span several keys.
//!
//! `render` goes the other way for `--check`.

mod interp;
mod parse;
mod render;
mod sections;
mod tls;
mod units;
mod values;

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests;

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use crate::idempotency::path::EscapedSlashes;
pub use sections::policy::reconcile::Reconcile;
pub use sections::store::encryption::EncryptionKey;
pub use sections::store::redis::SentinelConfig;
pub use sections::store::{OnUnavailable, StoreConfig, StoreKind};
pub use sections::telemetry::{OtlpConfig, OtlpProtocol, TelemetryConfig};
pub use sections::{
    AdminConfig, AdminToken, Config, ErrorFormat, ErrorsConfig, LogConfig, LogFormat, Policy,
    RELOAD, Reload, ReloadKey, Route, RouteMatch, UpstreamConfig, Workers,
};
pub use tls::{CertFile, KeyFile, UpstreamTls, client_config as tls_client_config};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConcurrent {
    Reject,
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnknownOutcome {
    Record,
    Release,
}

/// Why a configuration was refused.
///
/// The message starts with the full path of the offending field (`routes[1].ttl: ...`)
/// and ends with where it is written (` (line 7 column 10)`), or, for a key that is
/// not, where its section is. Only a YAML syntax error or a nesting too deep, which
/// precede any field, start with their line and column instead, and an I/O error or a
/// file too large with the file's path.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key that is unknown, missing, of the wrong type or holding a bad value.
    #[error("{path}: {message}{at}")]
    Invalid {
        path: String,
        message: String,
        at: At,
    },
    /// `${VAR}` named a variable that is not set; unset is not the same as empty.
    #[error("{path}: environment variable {var} is not set (referenced as ${{{var}}}){at}")]
    MissingEnv { path: String, var: String, at: At },
    /// The text is not YAML at all.
    #[error("{location}: invalid YAML: {message}")]
    Syntax { location: String, message: String },
    #[error("{}: cannot read configuration file: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Larger than 1 MiB, nested deeper than 64 levels, or aliases that expand too far
    /// (docs/behaviour.md §15): refused as soon as the parser meets it.
    #[error("{location}: {message}")]
    Limit { location: String, message: String },
}

/// Where in the file an error is: its line and column, from 1, when known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct At(pub Option<(u64, u64)>);

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some((line, column)) => write!(f, " (line {line} column {column})"),
            None => Ok(()),
        }
    }
}

impl ConfigError {
    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.into(),
            message: message.into(),
            at: At::default(),
        }
    }

    /// The error with the place in `text` it is about, if it names a path and no line.
    fn located(mut self, text: &str) -> Self {
        if let ConfigError::Invalid { path, at, .. } | ConfigError::MissingEnv { path, at, .. } =
            &mut self
            && at.0.is_none()
        {
            *at = At(parse::locate(text, path));
        }
        self
    }
}

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
        config.build().map_err(|err| err.located(text))
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
        let url = values::parse_upstream_url(url)
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
        render::to_yaml(self)
    }
}

/// What `--check` prints in place of a secret. Loading refuses it as the value of a
/// secret, so that printed output never starts a server that takes the mask for the
/// secret (a token of `***` would let anyone who guesses it purge keys).
const MASK: &str = "***";

/// A `scheme://user:pass@host` URL cut around its secret: the password, or a lone
/// user-info part, which some clients read as a password.
struct UrlSecret<'a> {
    /// Up to and including the `:` after the user name, or the `://` of a lone secret.
    before: &'a str,
    secret: &'a str,
    /// From the `@` that ends the user-info on.
    after: &'a str,
}

fn url_secret(url: &str) -> Option<UrlSecret<'_>> {
    let (scheme, rest) = url.split_once("://")?;
    // The last `@` ends the user-info: a password may contain an unescaped `@`, a host
    // or a database path never does.
    let (userinfo, _host) = rest.rsplit_once('@')?;
    let start = scheme.len() + "://".len();
    let start = start + userinfo.find(':').map_or(0, |colon| colon + 1);
    let end = scheme.len() + "://".len() + userinfo.len();
    Some(UrlSecret {
        before: &url[..start],
        secret: &url[start..end],
        after: &url[end..],
    })
}

/// The URL with its secret, if it has one, replaced by `mask`.
fn mask_url(url: &str, mask: &str) -> String {
    match url_secret(url) {
        Some(cut) => format!("{}{mask}{}", cut.before, cut.after),
        None => url.to_owned(),
    }
}

/// Replaces the password (or a lone user-info part) of a URL with `***`.
fn redact_url(url: &str) -> String {
    mask_url(url, MASK)
}

/// Whether the URL's password is the mask, as written or percent-encoded (Redis clients
/// decode it before sending it).
fn url_secret_is_masked(url: &str) -> bool {
    url_secret(url).is_some_and(|cut| cut.secret.replace("%2A", "*").replace("%2a", "*") == MASK)
}
