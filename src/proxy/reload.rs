//! Reloading the configuration on SIGHUP (docs/behaviour.md §14). The file is read and
//! checked in full, then swapped in whole for new requests ([`AppState::apply`]);
//! requests already in flight keep the configuration they started with, and no connection
//! is dropped.
//!
//! What applies and what needs a restart, and is refused, is declared with each key in
//! [`config::RELOAD`] (a new `upstream` URL drains the old pool). A reload that changes
//! where records are addressed ([`moved_addresses`]) is applied too, but logged at `warn`
//! and counted, since retries of requests completed before it no longer find their
//! records.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;

use super::state::AppState;
use crate::config::{self, Config, ConfigError, Policy, Reload};
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

/// Refuses a configuration that changes a key that needs a restart
/// ([`Reload::Restart`]), naming the first such key in file order.
pub fn check(running: &Config, new: &Config) -> Result<(), ReloadError> {
    let changed = |key: &&config::ReloadKey| key.changed(running, new);
    match config::RELOAD
        .iter()
        .filter(|key| key.reload == Reload::Restart)
        .find(changed)
    {
        Some(key) => Err(ReloadError::NeedsRestart(key.name)),
        None => Ok(()),
    }
}

/// The policies of `new` (`idempotency`, `routes[1] (/charges)`) under which some
/// request gets another record address than under `running`: its records become
/// invisible to it, so retries of requests completed before the reload execute again.
///
/// Which policy a path gets can only change at a route prefix of either file, so the
/// prefixes of both, and `idempotency` itself, are the only paths worth comparing.
pub fn moved_addresses(running: &Config, new: &Config) -> Vec<String> {
    let mut moved = BTreeSet::new();
    if !running.idempotency.same_addresses(&new.idempotency) {
        moved.insert(None);
    }
    for path in running.routes.iter().chain(&new.routes).map(|r| &r.path) {
        let (before, after) = (running.route_index(path), new.route_index(path));
        if !policy_at(running, before).same_addresses(policy_at(new, after)) {
            moved.insert(after);
        }
    }
    moved
        .into_iter()
        .map(|index| match index {
            None => "idempotency".to_owned(),
            Some(i) => format!("routes[{i}] ({})", new.routes[i].path),
        })
        .collect()
}

/// The policy of route `index`, or `idempotency` for `None`.
fn policy_at(config: &Config, index: Option<usize>) -> &Policy {
    index.map_or(&config.idempotency, |i| &config.routes[i].policy)
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
        let moved = moved_addresses(&state.live().config, &config);
        state.apply(config);
        if !moved.is_empty() {
            tracing::warn!(
                policies = %moved.join(", "),
                "the reload changes how record addresses are computed (key_from, \
                 scope_headers, scope_cookies or scope_principal): retries of requests completed before it \
                 execute again"
            );
            state.metrics.count_address_change();
        }
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

    /// The policies a reload moves the addresses of, from a running file whose route
    /// `/charges` scopes by a cookie, to `new` (both after `upstream`).
    fn moved(new: &str) -> Vec<String> {
        let base = "upstream:\n  url: http://127.0.0.1:9000\n";
        let running = parse(&format!(
            "{base}routes:\n  - path: /charges\n    scope_cookies: [sid]\n  - path: /other\n    ttl: 1h\n"
        ));
        moved_addresses(&running, &parse(&format!("{base}{new}")))
    }

    #[test]
    fn a_reload_names_the_policies_whose_addresses_move() {
        let same = "routes:\n  - path: /charges\n    scope_cookies: [sid]\n  - path: /other\n";
        assert!(moved(same).is_empty());
        // Neither how long records are kept nor the spelling of a source moves them.
        assert!(
            moved(&format!(
                "idempotency:\n  ttl: 1h\n  lease: 1s\n  key_from: [{{header: Idempotency-Key}}]\n{same}"
            ))
            .is_empty()
        );
        assert_eq!(
            moved("routes:\n  - path: /charges\n    scope_cookies: [session]\n  - path: /other\n"),
            ["routes[0] (/charges)"]
        );
        // Inherited by the routes that do not override it.
        assert_eq!(
            moved(&format!(
                "idempotency:\n  scope_headers: [x-api-key]\n{same}"
            )),
            ["idempotency", "routes[0] (/charges)", "routes[1] (/other)"]
        );
        assert_eq!(
            moved(
                "idempotency:\n  header: X-Request-Id\nroutes:\n  - path: /charges\n    \
                 header: Idempotency-Key\n    scope_cookies: [sid]\n  - path: /other\n"
            ),
            ["idempotency", "routes[1] (/other)"]
        );
        // A route added, or removed, moves the paths it covers.
        assert_eq!(
            moved(&format!(
                "{same}  - path: /new\n    key_from: [{{query: id}}]\n"
            )),
            ["routes[2] (/new)"]
        );
        assert_eq!(
            moved("routes:\n  - path: /other\n"),
            ["idempotency"],
            "/charges falls back to idempotency, without the cookie"
        );
        // A fingerprint source is addressed by its label, whatever its window.
        let fingerprint = |window: &str| {
            format!("{same}  - path: /f\n    key_from: [{{fingerprint: {window}}}]\n")
        };
        let running = parse(&format!(
            "upstream:\n  url: http://a\n{}",
            fingerprint("10s")
        ));
        let new = parse(&format!(
            "upstream:\n  url: http://a\n{}",
            fingerprint("20s")
        ));
        assert!(moved_addresses(&running, &new).is_empty());
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
            ("listen_idle_timeout: 1s\n", "listen_idle_timeout"),
        ] {
            let new = parse(&format!("{base}{extra}"));
            let err = check(&running, &new).expect_err(field);
            assert!(err.to_string().starts_with(&format!("{field}: ")), "{err}");
        }
        let applies = parse(
            "upstream:\n  url: https://other:8443\n  timeout: 5s\nidempotency:\n  ttl: 1h\n\
             routes:\n  - path: /a\n    enabled: false\nlog:\n  level: debug\n\
             route_match: case_insensitive\nshutdown_timeout: 5s\n\
             admin:\n  token: rotated\ncors:\n  allow_origins: \"*\"\n",
        );
        check(&running, &applies)
            .expect("routes, idempotency, upstream, log.level, admin.token and cors apply");
    }
}
