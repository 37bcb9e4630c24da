//! The checks of single top-level keys that the declarations of `top.rs` name
//! (`via check`): each turns a parsed value into the typed one, or refuses it naming the
//! key. Kept apart from `validate.rs`, which builds the sections and calls `top.rs`, so
//! that the two do not import each other.

use super::values::{Count, Text, WorkerCount};
use super::{ConfigError, ErrorsConfig, Workers};

/// `max_connections`, `store.max_entries`: a count of at least 1.
pub(super) fn at_least_one(count: Count, key: &str) -> Result<usize, ConfigError> {
    usize::try_from(count.0)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| ConfigError::invalid(key, "must be at least 1"))
}

pub(super) fn build_workers(raw: WorkerCount, key: &str) -> Result<Workers, ConfigError> {
    let n = match raw {
        WorkerCount::Auto => return Ok(Workers::Auto),
        WorkerCount::Shared => return Ok(Workers::Shared),
        WorkerCount::Count(n) => n,
    };
    usize::try_from(n)
        .ok()
        .filter(|n| *n <= Workers::MAX)
        .and_then(std::num::NonZeroUsize::new)
        .map(Workers::Count)
        .ok_or_else(|| {
            ConfigError::invalid(
                key,
                format!("must be auto, shared, or between 1 and {}", Workers::MAX),
            )
        })
}

/// `errors`, checked as a whole.
pub(super) fn build_errors(errors: ErrorsConfig, _key: &str) -> Result<ErrorsConfig, ConfigError> {
    errors.check()?;
    Ok(errors)
}

/// `upgrades`: protocol names (RFC 9110 tokens), lower-cased; `h2c` is dropped from the
/// list in force (never one of the protocols: RFC 9113 deprecates it, and a joined h2c
/// connection would carry every later request past the guard).
pub(super) fn build_upgrades(raw: Vec<Text>, key: &str) -> Result<Vec<String>, ConfigError> {
    let mut upgrades = Vec::with_capacity(raw.len());
    for (index, Text(name)) in raw.into_iter().enumerate() {
        let field = format!("{key}[{index}]");
        let name = name.trim().to_ascii_lowercase();
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~/".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            return Err(ConfigError::invalid(
                field,
                format!("'{name}' is not a protocol name such as websocket"),
            ));
        }
        // h2c is never one of them (RFC 9113 deprecates it, and a joined h2c connection
        // would carry every later request past the guard): listed or not, it is not in
        // force, so it is not kept either, and `--check` prints what is.
        let is_h2c = name == "h2c" || name.starts_with("h2c/");
        if !is_h2c && !upgrades.contains(&name) {
            upgrades.push(name);
        }
    }
    Ok(upgrades)
}
