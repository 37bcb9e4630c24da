//! `${VAR}` interpolation, applied to the parsed YAML value rather than the text so
//! that comments are never touched and a substituted value can never change the
//! document's structure (a password containing `: ` or `#` stays one string).
//!
//! `$${` is a literal `${` (docs/behaviour.md §15): a value can hold one, and `--check`,
//! which prints every `${` of a value as `$${`, prints a file that loads back to the same
//! configuration. Substituted values are not interpolated again.

use serde_yaml::Value;

use super::ConfigError;

/// Replaces `${NAME}` in every string scalar (not in keys) with `env(NAME)`, and `$${`
/// with `${`.
///
/// An unset variable is an error, not an empty string: a silently empty password or
/// host is worse than refusing to start. Any other `$` is kept as is.
pub(super) fn interpolate(
    value: &mut Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    walk(value, &mut String::new(), env)
}

fn walk(
    value: &mut Value,
    path: &mut String,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match value {
        Value::String(text) => {
            if text.contains("${") {
                *text = substitute(text, path, env)?;
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{index}]"));
                walk(item, path, env)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                match key {
                    Value::String(key) => path.push_str(key),
                    _ => path.push('?'),
                }
                walk(item, path, env)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Tagged(tagged) => walk(&mut tagged.value, path, env),
        Value::Null | Value::Bool(_) | Value::Number(_) => Ok(()),
    }
}

fn substitute(
    text: &str,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let field = || {
        if path.is_empty() {
            "(top level)".to_owned()
        } else {
            path.to_owned()
        }
    };
    let mut out = String::with_capacity(text.len());
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
            return Err(ConfigError::invalid(
                field(),
                "unterminated '${' (expected ${NAME})",
            ));
        };
        let name = &after[..end];
        if !is_variable_name(name) {
            return Err(ConfigError::invalid(
                field(),
                format!(
                    "invalid variable reference '${{{name}}}'; expected ${{NAME}} with letters, digits and _"
                ),
            ));
        }
        let Some(replacement) = env(name) else {
            return Err(ConfigError::MissingEnv {
                path: field(),
                var: name.to_owned(),
            });
        };
        out.push_str(&replacement);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
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
            let read = substitute(&escape(&text), "key", &|_| None);
            prop_assert_eq!(read.unwrap(), text);
        }
    }
}
