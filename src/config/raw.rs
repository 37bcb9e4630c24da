//! The file as written: serde structs that deny unknown keys, every key optional.
//!
//! Values that can be checked on their own (units, enums, addresses, header names)
//! are parsed by the types in `values` while deserializing, so that
//! `serde_path_to_error` attaches the full path (`routes[1].ttl`) to the error without
//! any bookkeeping of ours. Defaults and checks that involve several keys live in
//! `validate`. The raw forms of the whole file, of `idempotency`, `routes[]`, `upstream`,
//! `errors` and `log` are generated next to their typed forms, in `top`, `policy` and
//! `sections`.

use std::net::SocketAddr;

use http::Uri;

use super::ConfigError;
use super::sections::RawUpstream;
use super::top::RawConfig;
use super::values::{Addr, UpstreamUrl};

/// Deserializes the interpolated document, naming the path of the first bad key.
///
/// A key written without a value is refused after the keys themselves are known good,
/// so that a misspelt empty key is reported as misspelt.
pub(super) fn deserialize(value: serde_yaml::Value) -> Result<RawConfig, ConfigError> {
    let empty = first_empty_key(&value, &mut String::new());
    let raw = serde_path_to_error::deserialize(value).map_err(|err| {
        let path = match err.path().to_string() {
            root if root == "." => "(top level)".to_owned(),
            path => path,
        };
        ConfigError::invalid(path, tidy_serde_message(&err.into_inner().to_string()))
    })?;
    match empty {
        Some(path) => Err(ConfigError::invalid(
            path,
            "has no value (an empty key, or null, is not its default); write a value, or \
             leave the key out for its default",
        )),
        None => Ok(raw),
    }
}

/// The keys whose value may be `null`, each where `null` means what it says: the admin
/// listener off; no TLS files, no sentinels, no admin token (their default, and how
/// `--check` and config/example.yaml write them); or a section left empty, all of
/// whose keys keep their defaults as under `{}`.
///
/// Anywhere else `serde` would read `null` as "absent" and quietly apply the default, so
/// `ttl:` left empty would mean 24 hours: a key that is written must have a value.
const NULLABLE: &[&str] = &[
    "admin.listen",
    "admin.token",
    "upstream.tls.ca_file",
    "upstream.tls.cert_file",
    "upstream.tls.key_file",
    // Sections.
    "upstream",
    "upstream.tls",
    "store",
    "store.sentinel",
    "idempotency",
    "admin",
    "log",
    "errors",
    "telemetry",
    "telemetry.otlp",
];

/// The path (`routes[0].ttl`, as `serde_path_to_error` writes it) of the first key whose
/// value is `null` and may not be.
fn first_empty_key(value: &serde_yaml::Value, path: &mut String) -> Option<String> {
    use serde_yaml::Value;
    match value {
        Value::Mapping(map) => map.iter().find_map(|(key, item)| {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            match key {
                Value::String(key) => path.push_str(key),
                _ => path.push('?'),
            }
            let found = if item.is_null() && !NULLABLE.contains(&path.as_str()) {
                Some(path.clone())
            } else {
                first_empty_key(item, path)
            };
            path.truncate(len);
            found
        }),
        Value::Sequence(items) => items.iter().enumerate().find_map(|(index, item)| {
            let len = path.len();
            path.push_str(&format!("[{index}]"));
            let found = first_empty_key(item, path);
            path.truncate(len);
            found
        }),
        Value::Tagged(tagged) => first_empty_key(&tagged.value, path),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => None,
    }
}

/// Rewrites serde's built-in messages to this module's style:
/// "unknown field `foo`, expected one of `a`, `b`" becomes
/// "unknown field 'foo', expected one of a, b", or, when one of the expected keys is a
/// likely misspelling of `foo`, "unknown key; did you mean 'a'?".
fn tidy_serde_message(message: &str) -> String {
    if let Some(suggestion) = closest_known_key(message) {
        return format!("unknown key; did you mean '{suggestion}'?");
    }
    let builtin = [
        "unknown field `",
        "invalid type: ",
        "invalid value: ",
        "invalid length ",
    ];
    if !builtin.iter().any(|prefix| message.starts_with(prefix)) {
        return message.to_owned();
    }
    let mut parts = message.splitn(3, '`');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(head), Some(quoted), Some(tail)) => {
            format!("{head}'{quoted}'{}", tail.replace('`', ""))
        }
        _ => message.replace('`', ""),
    }
}

/// The expected key of serde's unknown-field `message` closest to the unknown one, if
/// one is close enough to be what was meant.
fn closest_known_key(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    let (unknown, expected) = rest.split_once('`')?;
    // serde writes the expected keys between backticks: "expected one of `a`, `b`",
    // "expected `a` or `b`", "expected `a`".
    let known = expected.split('`').skip(1).step_by(2);
    let unknown = unknown.to_ascii_lowercase();
    let (distance, closest) = known
        .map(|key| (edit_distance(&unknown, &key.to_ascii_lowercase()), key))
        .min_by_key(|(distance, _)| *distance)?;
    // A third of the key's letters, at least one: `tll` finds `ttl`, `bogus` nothing.
    (distance <= (unknown.chars().count() / 3).max(1)).then_some(closest)
}

/// Edits (insert, delete, replace, or swap two neighbours) that turn `a` into `b`: the
/// optimal string alignment distance, so a swap such as `requried` counts once.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // rows[i][j]: the distance between the first i letters of a and the first j of b.
    let mut rows = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

impl RawConfig {
    /// The configuration of `idemgate --upstream URL [--listen ADDR]`.
    pub(super) fn for_upstream(url: Uri, listen: Option<SocketAddr>) -> RawConfig {
        RawConfig {
            listen: listen.map(Addr),
            upstream: Some(RawUpstream {
                url: Some(UpstreamUrl(url)),
                ..RawUpstream::default()
            }),
            ..RawConfig::default()
        }
    }
}
