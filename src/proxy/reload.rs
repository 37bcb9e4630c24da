//! Reloading the configuration on SIGHUP (SPEC §14). The file is read and checked in
//! full, then swapped in whole for new requests ([`AppState::apply`]); requests already
//! in flight keep the configuration they started with, and no connection is dropped.
//!
//! What applies: `routes`, `idempotency`, `upstream` (a new URL drains the old pool),
//! `log.level`, `admin.token` (read by the admin listener per request), `route_match`,
//! `shutdown_timeout`, `escaped_slashes`, `upgrades`, `listen_body_timeout`. What needs a restart, and is refused: the keys in
//! [`RESTART_ONLY`].

use std::net::SocketAddr;
use std::path::Path;

use super::AppState;
use crate::config::{Config, ConfigError};
use crate::store::Store;

/// Why a reload left the running configuration in force.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}: changed, and it needs a restart; the running configuration stays in force")]
    NeedsRestart(&'static str),
    #[error("log.level: {0}")]
    LogLevel(String),
}

/// Whether two configurations agree on one key.
type Same = fn(&Config, &Config) -> bool;

/// The keys a running proxy cannot change, each with how to read it: the listeners,
/// the store and the log format (SPEC §14), and what the accept loop and the answers
/// were built with at start-up.
const RESTART_ONLY: [(&str, Same); 10] = [
    ("listen", |a, b| a.listen == b.listen),
    ("admin.listen", |a, b| a.admin.listen == b.admin.listen),
    ("store", |a, b| a.store == b.store),
    ("log.format", |a, b| a.log.format == b.log.format),
    ("max_connections", |a, b| {
        a.max_connections == b.max_connections
    }),
    ("workers", |a, b| a.workers == b.workers),
    ("max_buffered_bytes", |a, b| {
        a.max_buffered_bytes == b.max_buffered_bytes
    }),
    ("listen_header_timeout", |a, b| {
        a.listen_header_timeout == b.listen_header_timeout
    }),
    ("errors", |a, b| a.errors == b.errors),
    ("listen_idle_timeout", |a, b| {
        a.listen_idle_timeout == b.listen_idle_timeout
    }),
];

/// Refuses a configuration that changes a key of [`RESTART_ONLY`].
pub fn check(running: &Config, new: &Config) -> Result<(), ReloadError> {
    match RESTART_ONLY.iter().find(|(_, same)| !same(running, new)) {
        Some((field, _)) => Err(ReloadError::NeedsRestart(field)),
        None => Ok(()),
    }
}

/// One reload: reads `path`, checks it, sets the log level, and puts it in force.
/// `listen` overrides the file's `listen` as `--listen` did at start-up.
pub fn reload<S: Store>(
    state: &AppState<S>,
    path: &Path,
    listen: Option<SocketAddr>,
    set_level: &dyn Fn(&str) -> Result<(), String>,
) -> Result<(), ReloadError> {
    let result: Result<(), ReloadError> = (|| {
        let mut config = Config::from_file(path)?;
        if let Some(listen) = listen {
            config.listen = listen;
        }
        check(&state.config, &config)?;
        set_level(&config.log.level).map_err(ReloadError::LogLevel)?;
        state.apply(config);
        Ok(())
    })();
    state.metrics.count_reload(result.is_ok());
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::from_yaml_str(text, &|_| None).expect("valid")
    }

    #[test]
    fn restart_only_keys_are_refused_and_the_rest_applies() {
        let base = "upstream:\n  url: http://127.0.0.1:9000\n";
        let running = parse(base);
        for (extra, field) in [
            ("listen: 127.0.0.1:1234\n", "listen"),
            ("admin:\n  listen: null\n", "admin.listen"),
            ("store:\n  key_prefix: other\n", "store"),
            ("log:\n  format: json\n", "log.format"),
            ("max_connections: 5\n", "max_connections"),
            ("workers: 3\n", "workers"),
            ("max_buffered_bytes: 1MiB\n", "max_buffered_bytes"),
            ("listen_header_timeout: 1s\n", "listen_header_timeout"),
            (
                "errors:\n  format: template\n  template: '{\"e\":\"{slug}\"}'\n",
                "errors",
            ),
        ] {
            let new = parse(&format!("{base}{extra}"));
            let err = check(&running, &new).expect_err(field);
            assert!(err.to_string().starts_with(&format!("{field}: ")), "{err}");
        }
        let applies = parse(
            "upstream:\n  url: https://other:8443\n  timeout: 5s\nidempotency:\n  ttl: 1h\n\
             routes:\n  - path: /a\n    enabled: false\nlog:\n  level: debug\n\
             route_match: case_insensitive\nshutdown_timeout: 5s\n\
             admin:\n  token: rotated\n",
        );
        check(&running, &applies)
            .expect("routes, idempotency, upstream, log.level and admin.token apply");
    }
}
