//! `reconcile` (docs/behaviour.md §18): how to ask the upstream whether a request whose
//! outcome is unknown executed, before `outcome-unknown` is recorded. Checked while it
//! is deserialized, so that an error names its path (`routes[0].reconcile.path`), and
//! printed for `--check`.

use std::time::Duration;

use http::{HeaderName, Method, header};
use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};

use crate::config::types::http::Header;
use crate::config::types::units::{Count, Dur};
use crate::config::types::{Form, Shown, Text, given};

/// The lookup, as a policy has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconcile {
    pub method: Method,
    /// The lookup's path and query; `{key}` stands for the request's key, percent-encoded.
    pub path: String,
    /// Request headers copied from the original request (its credentials, typically).
    pub copy_headers: Vec<HeaderName>,
    /// How long one lookup may take.
    pub timeout: Duration,
    /// Lookups tried while they fail or answer `5xx`, with back-off between them.
    pub attempts: u32,
}

/// What a lookup path must hold: the key, there and nowhere else in braces.
const KEY_PLACEHOLDER: &str = "{key}";

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
const DEFAULT_ATTEMPTS: u32 = 3;
/// A lookup is a handful of tries, not a retry storm against a struggling upstream.
const MAX_ATTEMPTS: u64 = 10;

impl Reconcile {
    /// The lookup's path and query for `key`: `{key}` replaced by the key with every
    /// byte but RFC 3986's unreserved ones percent-encoded. A path segment that the key
    /// would make `.` or `..` has the key's dots encoded too (`%2E`), so that the
    /// upstream cannot resolve it as a dot segment and look up another path
    /// (docs/behaviour.md §25). The query is no path: its dots stay.
    pub fn path_for(&self, key: &str) -> String {
        let (encoded, dots) = (percent_encoded(key, false), percent_encoded(key, true));
        let (path, query) = self
            .path
            .split_once('?')
            .map_or((self.path.as_str(), None), |(path, query)| {
                (path, Some(query))
            });
        let mut out = String::with_capacity(self.path.len() + 3 * key.len());
        for (n, segment) in path.split('/').enumerate() {
            if n > 0 {
                out.push('/');
            }
            let plain = segment.replace(KEY_PLACEHOLDER, &encoded);
            if segment.contains(KEY_PLACEHOLDER) && matches!(plain.as_str(), "." | "..") {
                out.push_str(&segment.replace(KEY_PLACEHOLDER, &dots));
            } else {
                out.push_str(&plain);
            }
        }
        if let Some(query) = query {
            out.push('?');
            out.push_str(&query.replace(KEY_PLACEHOLDER, &encoded));
        }
        out
    }
}

/// `key` with every byte but RFC 3986's unreserved ones percent-encoded, and its dots
/// too when `dots`.
fn percent_encoded(key: &str, dots: bool) -> String {
    let mut encoded = String::with_capacity(key.len() * 3);
    for byte in key.bytes() {
        let unreserved = byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'~');
        if unreserved || (byte == b'.' && !dots) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// `reconcile` as written.
#[derive(Debug, Clone)]
pub(crate) struct ReconcileForm(Reconcile);

impl Form for ReconcileForm {
    type Value = Option<Reconcile>;
    fn value(self) -> Option<Reconcile> {
        Some(self.0)
    }
    fn unset(reconcile: &Option<Reconcile>) -> bool {
        reconcile.is_none()
    }
    fn print<S: Serializer>(reconcile: &Option<Reconcile>, s: S) -> Result<S::Ok, S::Error> {
        let Some(r) = reconcile else {
            return s.serialize_none();
        };
        let mut map = s.serialize_map(Some(5))?;
        map.serialize_entry("method", r.method.as_str())?;
        map.serialize_entry("path", &Shown::<Text>(&r.path))?;
        map.serialize_entry("copy_headers", &Shown::<Vec<Header>>(&r.copy_headers))?;
        map.serialize_entry("timeout", &Shown::<Dur>(&r.timeout))?;
        map.serialize_entry("attempts", &r.attempts)?;
        map.end()
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with path (and method, copy_headers, timeout, attempts)"
)]
struct Fields {
    #[serde(default, deserialize_with = "given")]
    method: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    path: Option<Text>,
    #[serde(default, deserialize_with = "given")]
    copy_headers: Option<Vec<Header>>,
    #[serde(default, deserialize_with = "given")]
    timeout: Option<Dur>,
    #[serde(default, deserialize_with = "given")]
    attempts: Option<Count>,
}

impl<'de> Deserialize<'de> for ReconcileForm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = Fields::deserialize(d)?;
        let method = match f.method {
            None => Method::GET,
            Some(text) => Method::from_bytes(text.0.trim().to_ascii_uppercase().as_bytes())
                .map_err(|_| de::Error::custom(format!("invalid HTTP method '{}'", text.0)))?,
        };
        let path = f
            .path
            .ok_or_else(|| {
                de::Error::custom(
                    "needs the lookup's path, with {key} where the key goes, e.g. \
                     /charges/by-key/{key}",
                )
            })?
            .0;
        check_path(&path).map_err(de::Error::custom)?;
        let attempts = match f.attempts {
            None => DEFAULT_ATTEMPTS,
            Some(Count(n)) if (1..=MAX_ATTEMPTS).contains(&n) => {
                u32::try_from(n).map_err(|_| de::Error::custom("attempts: too large"))?
            }
            Some(Count(n)) => {
                return Err(de::Error::custom(format!(
                    "attempts must be 1 to {MAX_ATTEMPTS}, not {n}"
                )));
            }
        };
        Ok(ReconcileForm(Reconcile {
            method,
            path,
            copy_headers: f.copy_headers.map_or_else(
                || vec![header::AUTHORIZATION],
                |headers| headers.into_iter().map(Form::value).collect(),
            ),
            timeout: f.timeout.map_or(DEFAULT_TIMEOUT, |d| d.0),
            attempts,
        }))
    }
}

/// An origin-form path with `{key}` in it, and no other brace.
fn check_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!(
            "path '{path}' must start with '/': it is sent to the upstream"
        ));
    }
    if !path.contains(KEY_PLACEHOLDER) {
        return Err(format!(
            "path '{path}' has no {KEY_PLACEHOLDER}: the lookup must name the request's key"
        ));
    }
    let rest = path.replace(KEY_PLACEHOLDER, "");
    if rest.contains(['{', '}']) {
        return Err(format!(
            "path '{path}': {KEY_PLACEHOLDER} is the only placeholder"
        ));
    }
    if rest.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "path '{path}' must be visible ASCII without spaces (percent-encode the rest)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_percent_encoded_into_the_path() {
        let r = Reconcile {
            method: Method::GET,
            path: "/charges/by-key/{key}?expand=1".to_owned(),
            copy_headers: vec![],
            timeout: DEFAULT_TIMEOUT,
            attempts: 1,
        };
        assert_eq!(
            r.path_for("a b/c?d%e_f-1.2~"),
            "/charges/by-key/a%20b%2Fc%3Fd%25e_f-1.2~?expand=1"
        );
    }

    #[test]
    fn a_key_that_makes_a_dot_segment_has_its_dots_encoded() {
        let r = |path: &str| Reconcile {
            method: Method::GET,
            path: path.to_owned(),
            copy_headers: vec![],
            timeout: DEFAULT_TIMEOUT,
            attempts: 1,
        };
        let lookup = r("/charges/{key}/status?key={key}");
        for (key, path) in [
            (".", "/charges/%2E/status?key=."),
            ("..", "/charges/%2E%2E/status?key=.."),
            ("...", "/charges/.../status?key=..."),
            ("a..b", "/charges/a..b/status?key=a..b"),
            ("./", "/charges/.%2F/status?key=.%2F"),
        ] {
            assert_eq!(lookup.path_for(key), path, "{key}");
        }
        // A segment the key completes into a dot segment, not only one it is.
        assert_eq!(r("/c/.{key}").path_for("."), "/c/.%2E");
        assert_eq!(r("/c/{key}.json").path_for("."), "/c/..json");
        assert_eq!(r("/c/{key}").path_for("ok"), "/c/ok");
    }

    #[test]
    fn a_path_needs_the_key_and_no_other_placeholder() {
        assert!(check_path("/charges/{key}").is_ok());
        assert!(check_path("/charges?key={key}").is_ok());
        for bad in ["charges/{key}", "/charges", "/{key}/{id}", "/a b/{key}"] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
    }
}
