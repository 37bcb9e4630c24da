//! `errors`: the shape of the answers idemgate makes itself (docs/behaviour.md §16).

use http::HeaderValue;
use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;
use crate::config::types::http::ContentType;
use crate::config::types::{As, Choice, Pick, Text};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorFormat {
    /// RFC 9457 problem+json.
    Problem,
    /// `errors.template`, filled in.
    Template,
}

impl Choice for ErrorFormat {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("problem", ErrorFormat::Problem),
        ("template", ErrorFormat::Template),
    ];
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping with format, template, content_type"
)]
pub struct ErrorsConfig {
    /// `problem` (problem+json) or `template`.
    #[serde(with = "As::<Pick<ErrorFormat>>")]
    pub format: ErrorFormat,
    /// The body of every answer idemgate makes itself under `format: template`, with
    /// `{slug}`, `{type}`, `{title}`, `{status}` and `{detail}` filled in.
    #[serde(with = "As::<Text>")]
    pub template: String,
    /// The `Content-Type` of those answers under `format: template`.
    #[serde(with = "As::<ContentType>")]
    pub content_type: HeaderValue,
}

impl Default for ErrorsConfig {
    fn default() -> Self {
        ErrorsConfig {
            format: ErrorFormat::Problem,
            template: String::new(),
            content_type: HeaderValue::from_static("application/json"),
        }
    }
}

impl ErrorsConfig {
    /// `format: template` needs a template that is JSON once filled in.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.format != ErrorFormat::Template {
            return Ok(());
        }
        if self.template.trim().is_empty() {
            return Err(ConfigError::invalid(
                "errors.template",
                "missing; format: template needs a template such as \
                 '{\"error\":{\"code\":\"{slug}\",\"message\":\"{detail}\"}}'",
            ));
        }
        // Filled in with values that need escaping, as real details may.
        let filled = self.fill(
            "in-flight",
            "https://idemgate.dev/problems/in-flight",
            "Title \"quoted\"",
            409,
            "A detail with \"quotes\", a \\ and a\nnewline.",
        );
        match serde_json::from_str::<serde_json::Value>(&filled) {
            Ok(_) => Ok(()),
            Err(err) => Err(ConfigError::invalid(
                "errors.template",
                format!("is not valid JSON once filled in ({err}): {filled}"),
            )),
        }
    }

    /// The template with `{slug}`, `{type}`, `{title}`, `{status}` and `{detail}`
    /// replaced: strings JSON-escaped without quotes (the template writes `"{detail}"`),
    /// the status as a bare number. One pass, so a value is never filled in again.
    pub fn fill(
        &self,
        slug: &str,
        type_uri: &str,
        title: &str,
        status: u16,
        detail: &str,
    ) -> String {
        let mut out = String::with_capacity(self.template.len() + detail.len());
        let mut rest = self.template.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let tail = &rest[open..];
            let value = [
                ("{slug}", escaped(slug)),
                ("{type}", escaped(type_uri)),
                ("{title}", escaped(title)),
                ("{status}", status.to_string()),
                ("{detail}", escaped(detail)),
            ]
            .into_iter()
            .find(|(name, _)| tail.starts_with(name));
            match value {
                Some((name, value)) => {
                    out.push_str(&value);
                    rest = &tail[name.len()..];
                }
                None => {
                    out.push('{');
                    rest = &tail[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// A JSON string's contents, without the quotes.
fn escaped(value: &str) -> String {
    let quoted = serde_json::Value::from(value).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_is_filled_in_once_with_escaped_strings() {
        let errors = ErrorsConfig {
            template:
                r#"{"error":{"code":"{slug}","status":{status},"message":"{detail}","x":"{nope}"}}"#
                    .to_owned(),
            ..ErrorsConfig::default()
        };
        let filled = errors.fill("in-flight", "t", "T", 409, "say \"{slug}\"\n");
        assert_eq!(
            filled,
            r#"{"error":{"code":"in-flight","status":409,"message":"say \"{slug}\"\n","x":"{nope}"}}"#
        );
        let json: serde_json::Value = serde_json::from_str(&filled).expect("valid JSON");
        assert_eq!(json["error"]["message"], "say \"{slug}\"\n");
    }
}
