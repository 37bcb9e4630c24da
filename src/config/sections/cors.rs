//! `cors`: the CORS headers idemgate puts on the answers it makes itself and on replays,
//! for browsers that call a guarded API from another origin (docs/behaviour.md §24).
//! Unset (the default), idemgate adds no CORS header. Reloaded by SIGHUP.
//!
//! ```yaml
//! cors:
//!   allow_origins: [https://app.example.com]   # or "*"
//!   allow_credentials: false
//!   expose_headers: []                # added to the three idemgate always exposes
//!   max_age: 10m                      # of idemgate's own preflight answers
//! ```

use std::time::Duration;

use http::HeaderName;
use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;
use crate::config::types::http::Headers;
use crate::config::types::units::{Dur, Flag};
use crate::config::types::{As, Text, forms, text};

/// The origins whose requests get CORS headers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AllowOrigins {
    /// `"*"`: every origin.
    Any,
    /// `scheme://host[:port]` each, lower-case, as a browser sends them; empty only
    /// when left out, which [`CorsConfig::check`] refuses.
    #[default]
    Missing,
    Listed(Vec<String>),
}

/// `cors`, checked.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping with allow_origins, allow_credentials, expose_headers, max_age"
)]
pub struct CorsConfig {
    #[serde(with = "As::<Origins>")]
    pub allow_origins: AllowOrigins,
    /// `Access-Control-Allow-Credentials: true`; with `"*"`, each origin is answered
    /// with itself (a wildcard may not carry credentials).
    #[serde(with = "As::<Flag>")]
    pub allow_credentials: bool,
    /// Exposed besides `Idempotent-Replayed`, `Retry-After`, `Idempotency-Reconciled`.
    #[serde(with = "As::<Headers>")]
    pub expose_headers: Vec<HeaderName>,
    /// `Access-Control-Max-Age` of the preflight answers idemgate makes itself.
    #[serde(with = "As::<Dur>")]
    pub max_age: Duration,
}

impl Default for CorsConfig {
    fn default() -> Self {
        CorsConfig {
            allow_origins: AllowOrigins::Missing,
            allow_credentials: false,
            expose_headers: Vec::new(),
            max_age: Duration::from_secs(600),
        }
    }
}

impl CorsConfig {
    /// `allow_origins` has no default: which sites may read the answers is the
    /// operator's to say.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        match self.allow_origins {
            AllowOrigins::Missing => Err(ConfigError::invalid(
                "cors.allow_origins",
                "missing; a list of origins such as [https://app.example.com], or \"*\"",
            )),
            AllowOrigins::Any | AllowOrigins::Listed(_) => Ok(()),
        }
    }

    /// Whether every site may read credentialed answers, which `--check` warns of.
    pub fn any_with_credentials(&self) -> bool {
        self.allow_origins == AllowOrigins::Any && self.allow_credentials
    }
}

/// The comment `--check` opens with when `cors` lets every site read credentialed
/// answers (docs/behaviour.md §24).
pub(crate) fn notice(cors: Option<&CorsConfig>) -> &'static str {
    if cors.is_some_and(CorsConfig::any_with_credentials) {
        "# warning: cors.allow_origins \"*\" with allow_credentials: true answers every \
         origin with itself:\n#   every site can read the answers to its users' credentialed \
         requests.\n"
    } else {
        ""
    }
}

/// `allow_origins` as written: `"*"`, or a non-empty list of origins.
struct Origins(AllowOrigins);

impl<'de> Deserialize<'de> for Origins {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            One(Text),
            List(Vec<Text>),
        }
        let written = Written::deserialize(d).map_err(|_| {
            de::Error::custom(
                "expected \"*\" or a list of origins such as [https://app.example.com]",
            )
        })?;
        match written {
            Written::One(Text(star)) if star.trim() == "*" => Ok(Origins(AllowOrigins::Any)),
            Written::One(Text(other)) => Err(de::Error::custom(format!(
                "'{other}': expected \"*\" or a list of origins such as [{other}]"
            ))),
            Written::List(list) if list.is_empty() => Err(de::Error::custom(
                "empty: no origin would be allowed; list at least one, or leave cors out",
            )),
            Written::List(list) => list
                .into_iter()
                .map(|Text(origin)| parse_origin(&origin).map_err(de::Error::custom))
                .collect::<Result<Vec<_>, _>>()
                .map(|origins| Origins(AllowOrigins::Listed(origins))),
        }
    }
}

/// An origin as a browser serialises it: `scheme://host[:port]`, lower-cased, with no
/// path, user info, query or fragment.
pub(crate) fn parse_origin(text: &str) -> Result<String, String> {
    let origin = text.trim().to_ascii_lowercase();
    let refuse = || {
        format!(
            "'{text}' is not an origin; expected scheme://host[:port] such as \
             https://app.example.com (no path, not even /)"
        )
    };
    if origin == "*" {
        return Err("\"*\" is written alone (allow_origins: \"*\"), not in a list".to_owned());
    }
    let (scheme, rest) = origin.split_once("://").ok_or_else(refuse)?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let (host, port) = match rest.rsplit_once(':') {
        // `[::1]` alone has a colon inside its brackets.
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (rest, None),
    };
    let host_ok = !host.is_empty()
        && (host.starts_with('[') && host.ends_with(']')
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')));
    let port_ok = port.is_none_or(|port| {
        !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()) && port.parse::<u16>().is_ok()
    });
    if scheme_ok && host_ok && port_ok {
        Ok(origin)
    } else {
        Err(refuse())
    }
}

fn print_origins<S: Serializer>(origins: &AllowOrigins, s: S) -> Result<S::Ok, S::Error> {
    match origins {
        AllowOrigins::Any => text("*", s),
        AllowOrigins::Missing => s.collect_seq(std::iter::empty::<&str>()),
        AllowOrigins::Listed(list) => s.collect_seq(list),
    }
}

forms! {
    Origins => AllowOrigins, print_origins;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_scheme_host_and_port() {
        for good in [
            "https://app.example.com",
            "http://127.0.0.1:8080",
            "HTTPS://App.Example.com",
            "http://[::1]:3000",
            "chrome-extension://abcdef",
        ] {
            parse_origin(good).expect(good);
        }
        assert_eq!(
            parse_origin("HTTPS://App.Example.com").expect("valid"),
            "https://app.example.com"
        );
        for bad in [
            "app.example.com",
            "https://app.example.com/",
            "https://app.example.com/path",
            "https://user@app.example.com",
            "https://app.example.com:99999",
            "https://app.example.com:",
            "https://",
            "null",
            "*",
            "https://a b",
        ] {
            parse_origin(bad).expect_err(bad);
        }
    }
}
