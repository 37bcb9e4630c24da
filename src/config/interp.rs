//! `${VAR}` interpolation, applied to each string value as the parser hands it over
//! rather than to the text, so that comments and keys are never touched and a
//! substituted value can never change the document's structure (a password containing
//! `: ` or `#` stays one string).
//!
//! `$${` is a literal `${` (docs/behaviour.md §15): a value can hold one, and `--check`,
//! which prints every `${` of a value as `$${`, prints a file that loads back to the same
//! configuration. Substituted values are not interpolated again.

use std::cell::RefCell;
use std::collections::HashMap;

/// The variables asked of the environment so far, and what it said (`None`: not set).
pub(super) type Vars = HashMap<String, Option<String>>;

/// What one read of the file knows of the environment, and what it asked besides.
#[derive(Default)]
struct Reading {
    vars: Vars,
    /// Names the file uses that `vars` does not hold yet.
    asked: Vec<String>,
    /// The variable of the last error, which was not set.
    missing: Option<String>,
}

thread_local! {
    /// Set by [`reading`] while the parser reads the file on this thread, for the values
    /// that [`expand`] themselves: a `Deserialize` impl is given no context of its own.
    static READING: RefCell<Option<Reading>> = const { RefCell::new(None) };
}

/// Runs `read` with `vars` known, returning what it returned and the names it asked for
/// that `vars` did not hold (each once).
pub(super) fn reading<R>(vars: Vars, read: impl FnOnce() -> R) -> (R, Vec<String>) {
    let outer = READING.replace(Some(Reading {
        vars,
        ..Reading::default()
    }));
    let result = read();
    let asked = READING
        .replace(outer)
        .map(|reading| reading.asked)
        .unwrap_or_default();
    (result, asked)
}

/// The variable that was not set, if the last value refused was refused for that.
pub(super) fn missing() -> Option<String> {
    READING.with_borrow(|reading| reading.as_ref().and_then(|r| r.missing.clone()))
}

/// `text` with `${NAME}` replaced by the variable and `$${` by `${` (a string scalar of
/// the file, never a key), or why not.
///
/// A name not asked yet reads as empty, to be asked before the file is read again; one
/// that is not set is an error, not an empty string: a silently empty password or host
/// is worse than refusing to start. Any other `$` is kept as is.
pub(super) fn expand(text: String) -> Result<String, String> {
    if !text.contains("${") {
        return Ok(text);
    }
    READING.with_borrow_mut(|reading| {
        let Some(reading) = reading else {
            return Ok(text);
        };
        let lookup = |name: &str| match reading.vars.get(name) {
            Some(value) => Lookup::Known(value.clone()),
            None => Lookup::Unknown,
        };
        match substitute(&text, &lookup) {
            Ok((out, unknown)) => {
                for name in unknown {
                    if !reading.asked.contains(&name) {
                        reading.asked.push(name);
                    }
                }
                Ok(out)
            }
            Err(Refused::Missing(var)) => {
                let message = format!("environment variable {var} is not set");
                reading.missing = Some(var);
                Err(message)
            }
            Err(Refused::Syntax(message)) => Err(message),
        }
    })
}

enum Lookup {
    Known(Option<String>),
    Unknown,
}

enum Refused {
    Missing(String),
    Syntax(String),
}

/// `text` interpolated, and the names `lookup` did not know (read as empty).
fn substitute(
    text: &str,
    lookup: &dyn Fn(&str) -> Lookup,
) -> Result<(String, Vec<String>), Refused> {
    let mut out = String::with_capacity(text.len());
    let mut unknown = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        // Read from the left, a `$` right before `${` can only be the escape's: no
        // earlier `$${` or `${NAME}` can end on it.
        if let Some(before) = rest[..start].strip_suffix('$') {
            out.push_str(before);
            out.push_str("${");
            rest = &rest[start + 2..];
            continue;
        }
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(Refused::Syntax(
                "unterminated '${' (expected ${NAME})".to_owned(),
            ));
        };
        let name = &after[..end];
        if !is_variable_name(name) {
            return Err(Refused::Syntax(format!(
                "invalid variable reference '${{{name}}}'; expected ${{NAME}} with letters, digits and _"
            )));
        }
        match lookup(name) {
            Lookup::Known(Some(value)) => out.push_str(&value),
            Lookup::Known(None) => return Err(Refused::Missing(name.to_owned())),
            Lookup::Unknown => unknown.push(name.to_owned()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok((out, unknown))
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The text that interpolation reads back as `text`: each `${` written `$${`.
pub(super) fn escape(text: &str) -> String {
    text.replace("${", "$${")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// No variable is set: an escaped text refers to none, and reads back as is.
        #[test]
        fn escaped_text_reads_back_as_itself(
            text in prop::collection::vec(
                prop::sample::select(vec!["$", "{", "}", "${", "$${", "a", "_1"]),
                0..12,
            ).prop_map(|pieces| pieces.concat())
        ) {
            let read = substitute(&escape(&text), &|_| Lookup::Known(None));
            prop_assert!(matches!(read, Ok((read, _)) if read == text));
        }
    }
}
