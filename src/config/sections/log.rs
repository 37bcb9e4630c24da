//! `log`: how idemgate logs (docs/behaviour.md §6). The format is chosen at start-up; the
//! level is a filter reloaded in place.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use crate::config::types::{As, Choice, Pick, Scalar, forms, text};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl Choice for LogFormat {
    const CHOICES: &'static [(&'static str, Self)] =
        &[("text", LogFormat::Text), ("json", LogFormat::Json)];
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping with format, level"
)]
pub struct LogConfig {
    #[serde(with = "As::<Pick<LogFormat>>")]
    pub format: LogFormat,
    /// A level (stored lower-case) or `EnvFilter`-style directives such as
    /// `info,idemgate=debug`.
    #[serde(with = "As::<LogLevel>")]
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

/// A `log.level`: a level, or an `EnvFilter`-style list of `target=level` directives.
struct LogLevel(String);

const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a log level such as info";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        parse_log_level(&text)
            .map(LogLevel)
            .map_err(de::Error::custom)
    }
}

/// Accepts `info` (any case, stored lower-case) or `EnvFilter`-style directives such
/// as `info,idemgate=debug,hyper=warn`, where every bare word is a level and every
/// `target=` names one; span filters (`[...]`) are not accepted.
fn parse_log_level(text: &str) -> Result<String, String> {
    let text = text.trim();
    let lower = text.to_ascii_lowercase();
    if LEVELS.contains(&lower.as_str()) {
        return Ok(lower);
    }
    let is_level = |s: &str| LEVELS.contains(&s.to_ascii_lowercase().as_str());
    let is_target = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-'))
    };
    let valid = !text.is_empty()
        && text
            .split(',')
            .all(|directive| match directive.trim().split_once('=') {
                Some((target, level)) => is_target(target.trim()) && is_level(level.trim()),
                // A bare word must be a level: EnvFilter would read `verbose` as a target
                // at trace level, but here it is far more likely a misspelt level.
                None => is_level(directive.trim()),
            });
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "invalid log level '{text}'; expected one of trace, debug, info, warn, error \
             or directives such as info,idemgate=debug"
        ))
    }
}

forms! {
    LogLevel => String, |level: &String, s: S| text(level, s);
}
