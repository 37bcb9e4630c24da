//! `log`: how idemgate logs (docs/behaviour.md §6). The format is chosen at start-up; the
//! level is a filter reloaded in place.

use serde::Deserialize;

use crate::config::values::{As, Choice, LogLevel, Pick};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl Choice for LogFormat {
    const CHOICES: &'static [(&'static str, Self)] =
        &[("text", LogFormat::Text), ("json", LogFormat::Json)];
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
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
