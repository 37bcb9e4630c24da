//! `key_format` (docs/behaviour.md §18): the shape an API publishes for its keys, which
//! every key a source finds must have. A key of the wrong shape is refused before it is
//! hashed, claimed or forwarded, like a key that breaks the syntax of §8.
//!
//! `any`, the default, checks nothing and costs nothing; the UUID forms are a few byte
//! comparisons; a regex is compiled once, when the configuration loads, anchored to the
//! whole key.

use std::sync::Arc;

use regex::Regex;

use super::key::{IdempotencyKey, KeyError};

/// What a policy's keys must look like.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeyFormat {
    /// Any key of valid syntax (docs/behaviour.md §8).
    #[default]
    Any,
    /// Any RFC 9562 UUID, hyphenated (8-4-4-4-12 hexadecimal digits, either case), the
    /// nil and max UUIDs included.
    Uuid,
    /// A version 4 (random) UUID, with the RFC 9562 variant.
    UuidV4,
    /// A version 7 (time-ordered) UUID, with the RFC 9562 variant.
    UuidV7,
    /// A regular expression the whole key matches.
    Regex(KeyPattern),
}

impl KeyFormat {
    /// The names written in the file for the formats that are not a regex.
    pub const NAMES: [(&'static str, KeyFormat); 4] = [
        ("any", KeyFormat::Any),
        ("uuid", KeyFormat::Uuid),
        ("uuidv4", KeyFormat::UuidV4),
        ("uuidv7", KeyFormat::UuidV7),
    ];

    /// `Ok` when `key` has this format; otherwise `invalid-key`, naming the format
    /// expected.
    pub fn check(&self, key: &IdempotencyKey) -> Result<(), KeyError> {
        let key = key.as_str();
        let fits = match self {
            KeyFormat::Any => return Ok(()),
            KeyFormat::Uuid => uuid_version(key).is_some(),
            KeyFormat::UuidV4 => uuid_version(key) == Some(4),
            KeyFormat::UuidV7 => uuid_version(key) == Some(7),
            KeyFormat::Regex(pattern) => pattern.whole.is_match(key),
        };
        if fits {
            Ok(())
        } else {
            Err(KeyError::Format {
                expected: self.expected(),
            })
        }
    }

    /// What a key must do, for the problem's `detail`: the format as the operator
    /// wrote it, and what that means to a client.
    fn expected(&self) -> Arc<str> {
        let versioned = |v: char| {
            format!(
                "be a version {v} UUID (key_format: uuidv{v}): \
                 xxxxxxxx-xxxx-{v}xxx-Nxxx-xxxxxxxxxxxx in hexadecimal digits, \
                 N one of 8, 9, a, b"
            )
        };
        match self {
            KeyFormat::Any => "be 1 to 255 visible ASCII characters other than ','".into(),
            KeyFormat::Uuid => "be a UUID (key_format: uuid): 8-4-4-4-12 hexadecimal \
                 digits, hyphenated"
                .into(),
            KeyFormat::UuidV4 => versioned('4').into(),
            KeyFormat::UuidV7 => versioned('7').into(),
            KeyFormat::Regex(pattern) => format!(
                "match the regular expression '{}' as a whole (key_format: regex)",
                pattern.as_str()
            )
            .into(),
        }
    }

    /// The file's name for this format; `None` for a regex, written `{regex: ...}`.
    pub fn name(&self) -> Option<&'static str> {
        Self::NAMES
            .iter()
            .find(|(_, format)| format == self)
            .map(|(name, _)| *name)
    }
}

/// The version nibble of a hyphenated UUID, when `key` is one (RFC 9562 §4): 36
/// characters, hyphens at 8, 13, 18 and 23, hexadecimal digits elsewhere. `Some` only
/// with the RFC 9562 variant bits (`10`, a digit 8, 9, a or b at 19) for the versions
/// that RFC defines; the nil and max UUIDs answer `Some(0)` and `Some(15)`.
fn uuid_version(key: &str) -> Option<u8> {
    let bytes = key.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let shaped = bytes.iter().enumerate().all(|(at, b)| match at {
        8 | 13 | 18 | 23 => *b == b'-',
        _ => b.is_ascii_hexdigit(),
    });
    if !shaped {
        return None;
    }
    let nibble = |at: usize| char::from(bytes[at]).to_digit(16).map(|d| d as u8);
    let (version, variant) = (nibble(14)?, nibble(19)?);
    match version {
        // Nil and max: no version, no variant.
        0 | 15 => Some(version),
        _ if variant & 0b1100 == 0b1000 => Some(version),
        // Another variant (NCS, Microsoft, reserved) is still a UUID, of no RFC 9562
        // version.
        _ => Some(0),
    }
}

/// A `{regex: ...}` format: the pattern as written, and compiled anchored to the whole
/// key. Compared by the pattern, so that a reload can tell two policies apart.
#[derive(Debug, Clone)]
pub struct KeyPattern {
    source: Arc<str>,
    whole: Regex,
}

/// Why a `{regex: ...}` format is refused when the configuration loads.
#[derive(Debug, thiserror::Error)]
pub enum PatternError {
    #[error("'{pattern}' is not a valid regular expression: {source}")]
    Invalid {
        pattern: String,
        #[source]
        source: regex::Error,
    },
    #[error(
        "'{0}' matches the empty string, so it says nothing of what a key looks like; \
         write a pattern that needs at least one character"
    )]
    MatchesEmpty(String),
}

impl KeyPattern {
    /// Compiles `pattern`, matched against the whole key. It is compiled on its own
    /// first, so that a pattern such as `a)|(b` cannot escape the anchoring group.
    pub fn new(pattern: &str) -> Result<Self, PatternError> {
        let invalid = |source| PatternError::Invalid {
            pattern: pattern.to_owned(),
            source,
        };
        Regex::new(pattern).map_err(invalid)?;
        let whole = Regex::new(&format!(r"\A(?:{pattern})\z")).map_err(invalid)?;
        if whole.is_match("") {
            return Err(PatternError::MatchesEmpty(pattern.to_owned()));
        }
        Ok(Self {
            source: pattern.into(),
            whole,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl PartialEq for KeyPattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for KeyPattern {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::key::parse_plain;

    fn fits(format: &KeyFormat, key: &str) -> bool {
        format
            .check(&parse_plain(key.as_bytes()).expect("valid key syntax"))
            .is_ok()
    }

    const V4: &str = "6f1c2b9e-3d4a-4b8c-9f2e-1a2b3c4d5e6f";
    const V7: &str = "01890a5d-ac96-774b-bcce-b302099a8057";

    #[test]
    fn uuids_are_hyphenated_hex_in_either_case_with_version_and_variant() {
        let upper = V4.to_ascii_uppercase();
        for key in [
            V4,
            V7,
            upper.as_str(),
            "00000000-0000-0000-0000-000000000000",
        ] {
            assert!(fits(&KeyFormat::Uuid, key), "{key}");
        }
        assert!(fits(&KeyFormat::UuidV4, V4) && fits(&KeyFormat::UuidV4, &upper));
        assert!(fits(&KeyFormat::UuidV7, V7));
        assert!(!fits(&KeyFormat::UuidV4, V7) && !fits(&KeyFormat::UuidV7, V4));
        // Variant bits other than 10 (here 0, NCS; c, Microsoft): a UUID, not a v4.
        for variant in ['0', '7', 'c', 'f'] {
            let mut key = V4.to_owned();
            key.replace_range(19..20, &variant.to_string());
            assert!(fits(&KeyFormat::Uuid, &key), "{key}");
            assert!(!fits(&KeyFormat::UuidV4, &key), "{key}");
        }
        for bad in [
            "6f1c2b9e3d4a4b8c9f2e1a2b3c4d5e6f",        // not hyphenated
            "{6f1c2b9e-3d4a-4b8c-9f2e-1a2b3c4d5e6f}",  // braced
            "6f1c2b9e-3d4a-4b8c-9f2e-1a2b3c4d5e6",     // short
            "6f1c2b9e-3d4a-4b8c-9f2e-1a2b3c4d5e6f0",   // long
            "6f1c2b9e-3d4a-4b8c-9f2e-1a2b3c4d5e6g",    // not hex
            "6f1c2b9e-3d4a4-b8c-9f2e-1a2b3c4d5e6f",    // hyphen moved
            "urn:uuid:6f1c2b9e-3d4a-4b8c-9f2e-1a2b3c", // a URN
        ] {
            assert!(!fits(&KeyFormat::Uuid, bad), "{bad}");
            assert!(!fits(&KeyFormat::UuidV4, bad), "{bad}");
        }
        assert!(fits(&KeyFormat::Any, "not-a-uuid"));
    }

    #[test]
    fn a_regex_matches_the_whole_key() {
        let format = KeyFormat::Regex(KeyPattern::new("ord-[0-9]+").expect("pattern"));
        assert!(fits(&format, "ord-42"));
        for bad in ["ord-", "xord-42", "ord-42x", "ORD-42"] {
            assert!(!fits(&format, bad), "{bad}");
        }
        // An alternation stays inside the anchors.
        let either = KeyFormat::Regex(KeyPattern::new("a|b").expect("pattern"));
        assert!(fits(&either, "a") && !fits(&either, "ab") && !fits(&either, "xb"));
    }

    #[test]
    fn a_regex_that_does_not_compile_or_matches_nothing_is_refused() {
        for bad in ["a)|(b", "(", "[z-a]"] {
            assert!(
                matches!(KeyPattern::new(bad), Err(PatternError::Invalid { .. })),
                "{bad}"
            );
        }
        for empty in [".*", "[0-9]*", "a|", "(?:x)?"] {
            assert!(
                matches!(KeyPattern::new(empty), Err(PatternError::MatchesEmpty(_))),
                "{empty}"
            );
        }
    }

    #[test]
    fn a_refusal_names_the_expected_format() {
        let key = parse_plain(b"nope").expect("key");
        let detail = |format: &KeyFormat| format.check(&key).expect_err("refused").to_string();
        assert!(detail(&KeyFormat::UuidV4).contains("uuidv4"));
        assert!(detail(&KeyFormat::UuidV7).contains("version 7 UUID"));
        assert!(detail(&KeyFormat::Uuid).contains("8-4-4-4-12"));
        let pattern = KeyFormat::Regex(KeyPattern::new("ord-[0-9]+").expect("pattern"));
        assert!(detail(&pattern).contains("'ord-[0-9]+'"));
        assert_eq!(KeyFormat::UuidV7.name(), Some("uuidv7"));
        assert_eq!(pattern.name(), None);
    }
}
