//! One view of the request for the guard and the upstream (SPEC §15): the path as
//! RFC 3986 §6.2.2 normalises it, which is what routes match, what the fingerprint
//! covers and what the upstream receives; the method the guard considers; the `Host`
//! checks of RFC 9112 §3.2. Pure functions: no I/O, no allocation on the common path.

use std::borrow::Cow;

use http::header::HOST;
use http::{HeaderMap, HeaderName, Method, Uri};

use crate::error::TargetError;

/// The path normalised per RFC 3986 §6.2.2: percent-encoded unreserved characters
/// decoded, other percent-encodings upper-cased (never decoded), dot segments removed,
/// runs of `/` merged. A path that climbs above the root is refused.
pub(crate) fn normalise_path(path: &str) -> Result<Cow<'_, str>, TargetError> {
    // `*` (OPTIONS) and the empty path of authority-form targets have no segments.
    if !path.starts_with('/') || is_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = normalise_percent(path)?;
    let mut out: Vec<&str> = Vec::new();
    let segments = decoded.split('/').skip(1);
    let mut trailing_slash = false;
    for segment in segments {
        trailing_slash = false;
        match segment {
            // Runs of `/` merge; `.` stays where it is.
            "" | "." => trailing_slash = true,
            ".." => {
                if out.pop().is_none() {
                    return Err(TargetError::AboveRoot);
                }
                trailing_slash = true;
            }
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
    Ok(Cow::Owned(normal))
}

/// Whether `path` is already normal: the common case, checked without allocating.
fn is_normal(path: &str) -> bool {
    if path.contains('%') && !escapes_are_normal(path) {
        return false;
    }
    let last = path.split('/').count() - 1;
    path.split('/')
        .enumerate()
        .skip(1)
        .all(|(i, segment)| match segment {
            "." | ".." => false,
            // Only the last segment may be empty (a trailing slash, or the root).
            "" => i == last,
            _ => true,
        })
}

/// Whether every `%XX` is upper-case and stands for a reserved character.
fn escapes_are_normal(path: &str) -> bool {
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
        !is_unreserved(hi * 16 + lo)
    })
}

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// Decodes `%XX` of unreserved characters and upper-cases the others.
fn normalise_percent(path: &str) -> Result<Cow<'_, str>, TargetError> {
    if !path.contains('%') {
        return Ok(Cow::Borrowed(path));
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            // Request targets are ASCII (hyper refuses anything else).
            out.push(char::from(bytes[i]));
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(TargetError::BadPercent);
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

/// The path routes match: the normalised path with each segment's `;parameter` suffix
/// removed (`/charges;x=1` matches `/charges`).
pub(crate) fn match_path(normal: &str) -> Cow<'_, str> {
    if !normal.contains(';') {
        return Cow::Borrowed(normal);
    }
    let stripped: Vec<&str> = normal
        .split('/')
        .map(|segment| segment.split_once(';').map_or(segment, |(name, _)| name))
        .collect();
    Cow::Owned(stripped.join("/"))
}

/// Headers that ask a server to treat a request as another method.
static OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// Whether a request is guarded by its method: its own method or any override, compared
/// case-insensitively with `methods`.
pub(crate) fn guarded_method(method: &Method, headers: &HeaderMap, methods: &[Method]) -> bool {
    let listed = |name: &[u8]| {
        methods
            .iter()
            .any(|m| m.as_str().as_bytes().eq_ignore_ascii_case(name))
    };
    if listed(method.as_str().as_bytes()) {
        return true;
    }
    OVERRIDES
        .iter()
        .flat_map(|name| headers.get_all(name))
        .any(|value| listed(value.as_bytes().trim_ascii()))
}

/// RFC 9112 §3.2: one `Host` at most, and an absolute-form target names the same
/// authority (compared case-insensitively).
pub(crate) fn check_host(uri: &Uri, headers: &HeaderMap) -> Result<(), TargetError> {
    let mut hosts = headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(TargetError::DuplicateHost);
    }
    if let (Some(authority), Some(host)) = (uri.authority(), host)
        && !authority
            .as_str()
            .as_bytes()
            .eq_ignore_ascii_case(host.as_bytes())
    {
        return Err(TargetError::HostMismatch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(path: &str) -> Result<String, TargetError> {
        normalise_path(path).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed_as_they_are() {
        for path in ["/", "/charges", "/charges/", "/a/b.c/d", "/a;x=1/b"] {
            assert!(matches!(normalise_path(path), Ok(Cow::Borrowed(p)) if p == path));
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
        assert_eq!(norm("/charges%2f1").as_deref(), Ok("/charges%2F1"));
        assert_eq!(norm("/%7euser/%41").as_deref(), Ok("/~user/A"));
        assert_eq!(norm("/a%20b").as_deref(), Ok("/a%20b"));
        assert_eq!(norm("/a/..").as_deref(), Ok("/"));
    }

    #[test]
    fn climbing_above_the_root_or_a_broken_escape_is_refused() {
        assert_eq!(norm("/../x"), Err(TargetError::AboveRoot));
        assert_eq!(norm("/a/../../x"), Err(TargetError::AboveRoot));
        assert_eq!(norm("/%2e%2e/x"), Err(TargetError::AboveRoot));
        assert_eq!(norm("/a%2"), Err(TargetError::BadPercent));
        assert_eq!(norm("/a%zz"), Err(TargetError::BadPercent));
    }

    #[test]
    fn segment_parameters_are_ignored_for_matching() {
        assert_eq!(match_path("/charges;x=1"), "/charges");
        assert_eq!(match_path("/a;p/b;q=2/c"), "/a/b/c");
        assert_eq!(match_path("/charges"), "/charges");
    }

    #[test]
    fn methods_and_overrides_are_compared_case_insensitively() {
        let methods = [Method::POST, Method::PUT];
        let none = HeaderMap::new();
        let lower = Method::from_bytes(b"post").expect("method");
        assert!(guarded_method(&lower, &none, &methods));
        assert!(!guarded_method(&Method::GET, &none, &methods));
        let mut over = HeaderMap::new();
        over.insert("x-http-method-override", "put".parse().expect("value"));
        assert!(guarded_method(&Method::GET, &over, &methods));
        let mut other = HeaderMap::new();
        other.insert("x-method-override", "DELETE".parse().expect("value"));
        assert!(!guarded_method(&Method::GET, &other, &methods));
    }

    #[test]
    fn two_hosts_or_a_target_naming_another_authority_are_refused() {
        let mut headers = HeaderMap::new();
        headers.append(HOST, "a.example".parse().expect("value"));
        let origin: Uri = "/charges".parse().expect("uri");
        assert_eq!(check_host(&origin, &headers), Ok(()));
        let same: Uri = "http://A.example/charges".parse().expect("uri");
        assert_eq!(check_host(&same, &headers), Ok(()));
        let other: Uri = "http://b.example/charges".parse().expect("uri");
        assert_eq!(check_host(&other, &headers), Err(TargetError::HostMismatch));
        headers.append(HOST, "b.example".parse().expect("value"));
        assert_eq!(
            check_host(&origin, &headers),
            Err(TargetError::DuplicateHost)
        );
    }

    proptest! {
        /// Normalising twice changes nothing, and a normal path has no `//`, no dot
        /// segment and no lower-case escape.
        #[test]
        fn normalising_is_idempotent(segments in proptest::collection::vec(
            "(\\.|\\.\\.|[a-z]{0,3}|%2[eEfF]|%6[13]|;p)", 0..8)) {
            let path = format!("/{}", segments.join("/"));
            if let Ok(once) = norm(&path) {
                prop_assert_eq!(norm(&once), Ok(once.clone()));
                prop_assert!(!once.contains("//"), "{}", once);
                prop_assert!(!once.split('/').any(|s| s == "." || s == ".."), "{}", once);
                prop_assert!(!once.contains("%2e") && !once.contains("%2f"), "{}", once);
                prop_assert!(matches!(normalise_path(&once), Ok(Cow::Borrowed(_))));
            }
        }
    }
}
