//! The request path as the guard and the upstream both see it: normalised per RFC 3986
//! §6.2.2 (percent-encoded unreserved characters decoded, other escapes upper-cased,
//! dot segments removed, runs of `/` merged), after refusing the spellings that real
//! servers read in ways the guard cannot follow.
//!
//! Those spellings are what an attacker reaches for. Jetty and Flask decode `%2F` into a
//! `/` before routing, so `/charges%2F1` or `/webhooks/..%2Fcharges` runs `/charges`
//! while a proxy that keeps the escape sees another path; Tomcat-style servers read
//! `/..;/` as `/../`; a `%00` ends a path for C-string code. [`EscapedSlashes`] decides
//! what becomes of `%2F`, `%5C` and `\` (after Envoy's
//! `path_with_escaped_slashes_action`); dot segments with parameters and `%00` are
//! always refused. Pure functions: no I/O, and no allocation for a path already normal.

use std::borrow::Cow;

/// What becomes of `%2F`, `%5C` and a raw `\` in a request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// Refused, `400 invalid-path`: the guard cannot know whether the upstream decodes
    /// them.
    #[default]
    Reject,
    /// All three become `/` before normalisation, so routes and the upstream see the
    /// decoded path.
    Decode,
    /// Forwarded as sent (escapes upper-cased): safe only when the upstream does not
    /// decode them.
    Keep,
}

/// Why a request path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path climbs above the root")]
    AboveRoot,
    #[error("the path has an invalid percent-encoding")]
    BadPercent,
    #[error("the path holds an escaped slash or backslash (%2F, %5C or \\)")]
    EscapedSlash,
    #[error("the path has a dot segment with parameters (such as /..;/)")]
    DotParameter,
    #[error("the path holds %00")]
    Nul,
}

/// The path normalised, or why it is refused. A path already normal is borrowed.
pub fn normalise(sent: &str, slashes: EscapedSlashes) -> Result<Cow<'_, str>, PathError> {
    let path = sent;
    // `*` (OPTIONS) and the empty path of authority-form targets have no segments.
    if !path.starts_with('/') {
        return Ok(Cow::Borrowed(path));
    }
    if !path.contains('\\') && escapes_are_normal(path, slashes) && is_normal(path)? {
        return Ok(Cow::Borrowed(path));
    }
    if has_escape(path, 0x00) {
        return Err(PathError::Nul);
    }
    let slashed = has_escape(path, b'/') || has_escape(path, b'\\') || path.contains('\\');
    let path = match slashes {
        EscapedSlashes::Reject if slashed => return Err(PathError::EscapedSlash),
        EscapedSlashes::Decode if slashed => Cow::Owned(decode_slashes(path)),
        EscapedSlashes::Reject | EscapedSlashes::Decode | EscapedSlashes::Keep => {
            Cow::Borrowed(path)
        }
    };
    let decoded = normalise_percent(&path)?;
    let mut out: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in decoded.split('/').skip(1) {
        trailing_slash = false;
        match segment {
            // Runs of `/` merge; `.` stays where it is.
            "" | "." => trailing_slash = true,
            ".." => {
                if out.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing_slash = true;
            }
            other if is_dot_with_parameter(other) => return Err(PathError::DotParameter),
            other => out.push(other),
        }
    }
    let mut normal = String::with_capacity(decoded.len());
    for segment in &out {
        normal.push('/');
        normal.push_str(segment);
    }
    if trailing_slash || out.is_empty() {
        normal.push('/');
    }
    if normal == sent {
        // Only its escapes needed a look: the path was normal as sent.
        return Ok(Cow::Borrowed(sent));
    }
    Ok(Cow::Owned(normal))
}

/// Whether a path without `\` and with normal escapes is already normal; a dot segment
/// with parameters is refused here too.
fn is_normal(path: &str) -> Result<bool, PathError> {
    let last = path.split('/').count() - 1;
    let mut normal = true;
    for (i, segment) in path.split('/').enumerate().skip(1) {
        match segment {
            "." | ".." => normal = false,
            // Only the last segment may be empty (a trailing slash, or the root).
            "" if i != last => normal = false,
            other if is_dot_with_parameter(other) => return Err(PathError::DotParameter),
            _ => {}
        }
    }
    Ok(normal)
}

/// Whether every `%XX` of `path` is already as normalisation writes it (upper case, a
/// reserved character) and none needs a look of its own (`%00`; `%2F` and `%5C` unless
/// kept): the common case, checked without allocating.
fn escapes_are_normal(path: &str, slashes: EscapedSlashes) -> bool {
    let bytes = path.as_bytes();
    bytes.iter().enumerate().all(|(i, b)| {
        if *b != b'%' {
            return true;
        }
        let upper = |at: usize| {
            bytes
                .get(at)
                .is_some_and(|d| d.is_ascii_digit() || (b'A'..=b'F').contains(d))
        };
        if !(upper(i + 1) && upper(i + 2)) {
            return false;
        }
        let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) else {
            return false;
        };
        let byte = hi * 16 + lo;
        let slash = matches!(byte, b'/' | b'\\') && slashes != EscapedSlashes::Keep;
        !is_unreserved(byte) && byte != 0 && !slash
    })
}

/// `.;x` or `..;x`: a dot segment that servers which strip parameters before resolving
/// dot segments (Tomcat, Jetty) climb with.
fn is_dot_with_parameter(segment: &str) -> bool {
    segment
        .split_once(';')
        .is_some_and(|(name, _)| name == "." || name == "..")
}

/// Whether `path` holds `%XX` standing for `byte`, in either case.
fn has_escape(path: &str, byte: u8) -> bool {
    let bytes = path.as_bytes();
    bytes.windows(3).any(|w| {
        w[0] == b'%'
            && matches!((hex(w[1]), hex(w[2])), (Some(hi), Some(lo)) if hi * 16 + lo == byte)
    })
}

/// `%2F`, `%5C` (either case) and `\` written as `/`.
fn decode_slashes(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes[i] == b'%'
            && matches!(
                (bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)),
                (Some(hi), Some(lo)) if matches!(hi * 16 + lo, b'/' | b'\\')
            );
        if escaped {
            out.push('/');
            i += 3;
        } else if bytes[i] == b'\\' {
            out.push('/');
            i += 1;
        } else {
            // Request targets are ASCII (hyper refuses anything else).
            out.push(char::from(bytes[i]));
            i += 1;
        }
    }
    out
}

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// Decodes `%XX` of unreserved characters and upper-cases the others.
fn normalise_percent(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.contains('%') {
        return Ok(Cow::Borrowed(path));
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            out.push(char::from(bytes[i]));
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(PathError::BadPercent);
        };
        let byte = hi * 16 + lo;
        if is_unreserved(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(hi)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(lo)]));
        }
        i += 3;
    }
    Ok(Cow::Owned(out))
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(path: &str) -> Result<String, PathError> {
        normalise(path, EscapedSlashes::Reject).map(Cow::into_owned)
    }

    fn with(path: &str, slashes: EscapedSlashes) -> Result<String, PathError> {
        normalise(path, slashes).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed_as_they_are() {
        for path in [
            "/",
            "/charges",
            "/charges/",
            "/a/b.c/d",
            "/a;x=1/b",
            "/..a/.b;c",
        ] {
            assert!(
                matches!(normalise(path, EscapedSlashes::Reject), Ok(Cow::Borrowed(p)) if p == path),
                "{path}"
            );
        }
    }

    #[test]
    fn spellings_of_one_path_normalise_alike() {
        for path in [
            "/%63harges",
            "//charges",
            "/charges/.",
            "/./charges",
            "/webhooks/../charges",
            "/x/y/../../charges",
            "/%2e/charges",
            "///charges",
        ] {
            let expected = if path.ends_with('.') {
                "/charges/"
            } else {
                "/charges"
            };
            assert_eq!(norm(path).as_deref(), Ok(expected), "{path}");
        }
        assert_eq!(norm("/a/./b/../c").as_deref(), Ok("/a/c"));
        assert_eq!(norm("/%7euser/%41").as_deref(), Ok("/~user/A"));
        assert_eq!(norm("/a%20b").as_deref(), Ok("/a%20b"));
        assert_eq!(norm("/a%3bb").as_deref(), Ok("/a%3Bb"));
        assert_eq!(norm("/a/..").as_deref(), Ok("/"));
    }

    #[test]
    fn climbing_above_the_root_or_a_broken_escape_is_refused() {
        assert_eq!(norm("/../x"), Err(PathError::AboveRoot));
        assert_eq!(norm("/a/../../x"), Err(PathError::AboveRoot));
        assert_eq!(norm("/%2e%2e/x"), Err(PathError::AboveRoot));
        assert_eq!(norm("/a%2"), Err(PathError::BadPercent));
        assert_eq!(norm("/a%zz"), Err(PathError::BadPercent));
    }

    #[test]
    fn escaped_slashes_are_refused_by_default() {
        for path in [
            "/charges%2F1",
            "/charges%2f1",
            "/webhooks/..%2Fcharges",
            "/a%5Cb",
            "/a%5cb",
            "/a\\b",
            "/webhooks/..\\charges",
        ] {
            assert_eq!(norm(path), Err(PathError::EscapedSlash), "{path}");
        }
        // An escaped `%` before `2F` is not a slash.
        assert_eq!(norm("/a%252F").as_deref(), Ok("/a%252F"));
    }

    #[test]
    fn decode_turns_every_escaped_slash_into_a_slash_before_normalising() {
        let decode = EscapedSlashes::Decode;
        assert_eq!(with("/charges%2F1", decode).as_deref(), Ok("/charges/1"));
        assert_eq!(
            with("/webhooks/..%2Fcharges", decode).as_deref(),
            Ok("/charges")
        );
        assert_eq!(
            with("/webhooks/..%5ccharges", decode).as_deref(),
            Ok("/charges")
        );
        assert_eq!(
            with("/webhooks\\..\\charges", decode).as_deref(),
            Ok("/charges")
        );
        assert_eq!(with("/a%252F", decode).as_deref(), Ok("/a%252F"));
        assert_eq!(with("/..%2Fx", decode), Err(PathError::AboveRoot));
    }

    #[test]
    fn keep_forwards_escaped_slashes_upper_cased() {
        let keep = EscapedSlashes::Keep;
        assert_eq!(with("/charges%2f1", keep).as_deref(), Ok("/charges%2F1"));
        assert_eq!(with("/a%5Cb", keep).as_deref(), Ok("/a%5Cb"));
        assert_eq!(with("/a\\b", keep).as_deref(), Ok("/a\\b"));
    }

    #[test]
    fn dot_segments_with_parameters_and_nul_are_refused_in_every_mode() {
        for slashes in [
            EscapedSlashes::Reject,
            EscapedSlashes::Decode,
            EscapedSlashes::Keep,
        ] {
            for path in [
                "/webhooks/..;/charges",
                "/.;x/charges",
                "/a/..;",
                "/%2e%2e;x/b",
            ] {
                assert_eq!(with(path, slashes), Err(PathError::DotParameter), "{path}");
            }
            for path in ["/charges%00", "/a%00/b", "/%00"] {
                assert_eq!(with(path, slashes), Err(PathError::Nul), "{path}");
            }
        }
        assert_eq!(
            with("/webhooks/..%3B/charges", EscapedSlashes::Keep).as_deref(),
            Ok("/webhooks/..%3B/charges"),
            "an escaped ; is no parameter to the upstream either"
        );
    }

    proptest! {
        /// Normalising twice changes nothing, and a normal path has no `//`, no dot
        /// segment and no lower-case escape.
        #[test]
        fn normalising_is_idempotent(segments in proptest::collection::vec(
            "(\\.|\\.\\.|[a-z]{0,3}|%2[eEfF]|%5[cC]|%6[13]|;p|\\\\)", 0..8),
            slashes in prop_oneof![
                Just(EscapedSlashes::Reject),
                Just(EscapedSlashes::Decode),
                Just(EscapedSlashes::Keep),
            ]) {
            let path = format!("/{}", segments.join("/"));
            if let Ok(once) = with(&path, slashes) {
                prop_assert_eq!(with(&once, slashes), Ok(once.clone()));
                prop_assert!(!once.contains("//"), "{}", once);
                prop_assert!(!once.split('/').any(|s| s == "." || s == ".."), "{}", once);
                prop_assert!(!once.contains("%2e") && !once.contains("%2f"), "{}", once);
                prop_assert!(matches!(normalise(&once, slashes), Ok(Cow::Borrowed(_))));
                if slashes != EscapedSlashes::Keep {
                    prop_assert!(!once.contains("%2F") && !once.contains('\\'), "{}", once);
                }
            }
        }
    }
}
