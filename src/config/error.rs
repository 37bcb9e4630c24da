//! Why a configuration was refused: every error names the field and where it is.

use std::path::PathBuf;

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
}
