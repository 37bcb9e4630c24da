//! PostgreSQL's keys (docs/behaviour.md §22): `url` (one URL, several hosts allowed),
//! `table`, `pool_size`, `create_table`, `sweep_interval` and `tls`. Checked once the
//! whole store is read, and only for `kind: postgres`; the keys that only the other
//! kinds have a use for and that would mislead here (`min_replicas`,
//! `max_entries_per_scope`) are refused by name.

use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use super::StoreConfig;
use crate::config::error::ConfigError;
use crate::config::sections::upstream::tls::CertFile;
use crate::config::types::secret::{UrlSecret, url_secret};
use crate::config::types::units::Count;
use crate::config::types::{Text, forms, text};

pub(crate) const DEFAULT_TABLE: &str = "idemgate_records";
pub(crate) const DEFAULT_POOL_SIZE: usize = 16;
pub(crate) const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// More connections than one process could use; a typo such as 10000 is refused.
const MAX_POOL_SIZE: usize = 1000;

/// `tls`: the trust anchors for `sslmode=verify-ca|verify-full` (and `require`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping with ca_file")]
pub struct StoreTls {
    /// Trust anchors in place of the system's.
    pub ca_file: Option<CertFile>,
}

/// `table`: `name` or `schema.name`, each an unquoted SQL identifier, so that it can be
/// written into statements (a table name cannot be a bound parameter) without any
/// escaping to get wrong.
pub(crate) struct TableName(String);

impl<'de> Deserialize<'de> for TableName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Text(name) = Text::deserialize(d)?;
        check_table(&name).map_err(de::Error::custom)?;
        Ok(TableName(name))
    }
}

forms! {
    TableName => String, |name: &String, s: S| text(name, s);
}

/// `pool_size`: 1 to [`MAX_POOL_SIZE`].
pub(crate) struct PoolSize(usize);

impl<'de> Deserialize<'de> for PoolSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Count(n) = Count::deserialize(d)?;
        usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_POOL_SIZE).contains(n))
            .map(PoolSize)
            .ok_or_else(|| de::Error::custom(format!("must be from 1 to {MAX_POOL_SIZE}")))
    }
}

forms! {
    PoolSize => usize, |n: &usize, s: S| s.serialize_u64(u64::try_from(*n).unwrap_or(u64::MAX));
}

fn check_table(name: &str) -> Result<(), String> {
    let parts: Vec<&str> = name.split('.').collect();
    let fine = |part: &str| {
        let mut bytes = part.bytes();
        part.len() <= 63
            && bytes
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    if parts.len() > 2 || !parts.iter().all(|part| fine(part)) {
        return Err(format!(
            "'{name}' is not a table name idemgate accepts: a name or schema.name, each \
             lower-case letters, digits and '_', starting with a letter or '_', at most 63 \
             characters"
        ));
    }
    Ok(())
}

/// The URL taken from `url` (the only form: several hosts go in one URL, as libpq
/// writes them), and the keys of other kinds that have no meaning here refused.
pub(super) fn build(store: &mut StoreConfig) -> Result<(), ConfigError> {
    if !store.urls.is_empty() {
        return Err(ConfigError::invalid(
            "store.urls",
            "is Redis's; kind: postgres takes one `url`, with several hosts in it when \
             there are standbys (postgres://user@db1:5432,db2:5432/app?target_session_attrs=read-write)",
        ));
    }
    let Some(url) = store.written_url.take() else {
        return Err(ConfigError::invalid(
            "store.url",
            "missing; kind: postgres needs the database's URL, e.g. \
             postgres://idemgate:${PGPASSWORD}@127.0.0.1:5432/app",
        ));
    };
    check_url(&url).map_err(|msg| ConfigError::invalid("store.url", msg))?;
    if store.min_replicas > 0 {
        return Err(ConfigError::invalid(
            "store.min_replicas",
            "is Redis's; with kind: postgres the server's synchronous_commit and \
             synchronous_standby_names decide what a commit waits for",
        ));
    }
    if store.max_entries_per_scope.is_some() {
        return Err(ConfigError::invalid(
            "store.max_entries_per_scope",
            "applies to the memory and file stores only; PostgreSQL's records are bounded \
             by their ttl and the database's size",
        ));
    }
    store.urls = vec![url];
    Ok(())
}

/// What `sslmode` in the URL asks for (docs/behaviour.md §22). tokio-postgres knows
/// the first three; the two verifying modes are read here and passed to it as
/// `require`, the verification being the TLS connector's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The URL as tokio-postgres reads it, and the `sslmode` it asked for. The default is
/// libpq's, `prefer`.
pub fn split_sslmode(url: &str) -> Result<(String, SslMode), String> {
    let shown = redact_pg_url(url);
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), SslMode::Prefer));
    };
    let mut mode = SslMode::Prefer;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslmode", value)) => {
                mode = match value {
                    "disable" => SslMode::Disable,
                    "prefer" | "allow" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => {
                        return Err(format!(
                            "'{shown}' has sslmode={other}; expected disable, prefer, \
                             require, verify-ca or verify-full"
                        ));
                    }
                };
                let passed = match mode {
                    SslMode::Disable => "disable",
                    SslMode::Prefer => "prefer",
                    _ => "require",
                };
                kept.push(format!("sslmode={passed}"));
            }
            _ => kept.push(pair.to_owned()),
        }
    }
    Ok((format!("{base}?{}", kept.join("&")), mode))
}

/// Checks the URL as tokio-postgres will read it, without echoing the password.
fn check_url(url: &str) -> Result<(), String> {
    let shown = redact_pg_url(url);
    let masked = |p: &str| p.replace("%2A", "*").replace("%2a", "*") == "***";
    if pg_password(url).is_some_and(|cut| masked(cut.secret))
        || query_password(url).is_some_and(masked)
    {
        return Err(format!(
            "'{shown}' has '***' for its password, what --check prints in place of the \
             password; write the password itself, e.g. ${{PGPASSWORD}}"
        ));
    }
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(format!(
            "'{shown}' is not a postgres:// or postgresql:// URL"
        ));
    }
    let (passed, _) = split_sslmode(url)?;
    let config: tokio_postgres::Config = passed
        .parse()
        .map_err(|err| format!("'{shown}' is not a PostgreSQL URL idemgate can read: {err}"))?;
    if config.get_hosts().is_empty() {
        return Err(format!("'{shown}' has no host"));
    }
    Ok(())
}

/// The `password=` query parameter, which libpq's URLs allow besides the user info.
fn query_password(url: &str) -> Option<&str> {
    let (_, query) = url.split_once('?')?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("password="))
}

/// The password of the URL's user info: unlike a Redis URL's, a lone user-info part is
/// the user name, not a secret.
pub(crate) fn pg_password(url: &str) -> Option<UrlSecret<'_>> {
    url_secret(url).filter(|cut| cut.before.ends_with(':'))
}

/// Whether the URL holds a password, in its user info or its query.
pub(crate) fn has_password(url: &str) -> bool {
    pg_password(url).is_some() || query_password(url).is_some()
}

/// The URL with its password as `***`, wherever it is written: fit for logs and
/// `--check`.
pub fn redact_pg_url(url: &str) -> String {
    mask_pg_url(url, "***")
}

/// The URL with its password replaced by `mask`, wherever it is written.
pub(crate) fn mask_pg_url(url: &str, mask: &str) -> String {
    let shown = match pg_password(url) {
        Some(cut) => format!("{}{mask}{}", cut.before, cut.after),
        None => url.to_owned(),
    };
    let Some((base, query)) = shown.split_once('?') else {
        return shown;
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| {
            if pair.starts_with("password=") {
                format!("password={mask}")
            } else {
                pair.to_owned()
            }
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for fine in ["idemgate_records", "ops.idemgate", "_t1", "a.b"] {
            assert!(check_table(fine).is_ok(), "{fine}");
        }
        for bad in [
            "",
            "1t",
            "Records",
            "a.b.c",
            "t; drop table x",
            "t\"",
            "a.",
            &"x".repeat(64),
        ] {
            assert!(check_table(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn verifying_modes_are_passed_on_as_require() {
        let (url, mode) = split_sslmode("postgres://u@h/db?sslmode=verify-full&application_name=x")
            .expect("accepted");
        assert_eq!(url, "postgres://u@h/db?sslmode=require&application_name=x");
        assert_eq!(mode, SslMode::VerifyFull);
        assert_eq!(
            split_sslmode("postgres://u@h/db").expect("accepted").1,
            SslMode::Prefer
        );
        assert_eq!(
            split_sslmode("postgres://u@h/db?sslmode=verify-ca")
                .expect("accepted")
                .1,
            SslMode::VerifyCa
        );
        assert!(split_sslmode("postgres://u:pw@h/db?sslmode=bogus").is_err());
    }

    #[test]
    fn passwords_are_masked_in_user_info_and_query() {
        assert_eq!(
            redact_pg_url(
                "postgres://idemgate:s3cret@db1:5432,db2:5432/app?password=x&sslmode=require"
            ),
            "postgres://idemgate:***@db1:5432,db2:5432/app?password=***&sslmode=require"
        );
    }

    #[test]
    fn a_user_without_a_password_is_shown() {
        assert_eq!(
            redact_pg_url("postgres://idemgate@db1:5432/app"),
            "postgres://idemgate@db1:5432/app"
        );
        assert!(!has_password("postgres://idemgate@db1:5432/app"));
        assert!(has_password("postgres://idemgate@db1/app?password=x"));
        assert!(check_url("postgres://idemgate@db1:5432/app").is_ok());
    }

    #[test]
    fn urls_are_checked_without_echoing_the_password() {
        let err = check_url("mysql://u:topsecret@h/db").expect_err("refused");
        assert!(!err.contains("topsecret"), "{err}");
        assert!(
            check_url("postgres://u:pw@db1:5432,db2:5433/app?target_session_attrs=read-write")
                .is_ok()
        );
        assert!(check_url("postgres://u:***@h/db").is_err());
    }
}
