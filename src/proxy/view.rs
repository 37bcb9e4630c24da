//! One view of the request for the guard and the upstream: the targets never forwarded,
//! the path routes match (the path itself is normalised by
//! [`crate::idempotency::path`]), the method the guard considers, and the `Host` checks
//! of RFC 9112 §3.2. Pure functions: no I/O, no allocation on the common path.

use std::borrow::Cow;

use http::header::HOST;
use http::{HeaderMap, HeaderName, Method, Uri, Version};

use crate::error::TargetError;

/// Targets that are never forwarded (docs/behaviour.md §25). `CONNECT` asks the proxy
/// for a tunnel, which would carry bytes no guard sees, and which an upstream that
/// honours it would open to wherever the client named. The asterisk form (`OPTIONS *`,
/// RFC 9112 §3.2.4) names the server itself, no resource: joined to a base path in
/// `upstream.url`, or read by a server as a path, it would be some other request.
pub(crate) fn check_target(method: &Method, uri: &Uri) -> Result<(), TargetError> {
    if *method == Method::CONNECT {
        return Err(TargetError::Connect);
    }
    if uri.path() == "*" {
        return Err(TargetError::Asterisk);
    }
    Ok(())
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

/// RFC 9112 §3.2: an HTTP/1.1 request has exactly one `Host`, holding one authority
/// that is not empty; an absolute-form target names the same authority as `Host`
/// (compared case-insensitively, a missing port being the scheme's default). Servers
/// and proxies that pick the first or the last of two authorities would otherwise
/// route a request the guard saw under another name.
pub(crate) fn check_host(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), TargetError> {
    let mut hosts = headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(TargetError::DuplicateHost);
    }
    let Some(host) = host else {
        // HTTP/2 and HTTP/3 carry the authority in the target; HTTP/1.0 may omit it.
        return if version == Version::HTTP_11 {
            Err(TargetError::MissingHost)
        } else {
            Ok(())
        };
    };
    let value = host.as_bytes().trim_ascii();
    if value.is_empty() {
        return Err(TargetError::EmptyHost);
    }
    if value.contains(&b',') {
        return Err(TargetError::HostList);
    }
    if let Some(authority) = uri.authority()
        && !same_authority(uri.scheme_str(), authority.as_str().as_bytes(), value)
    {
        return Err(TargetError::HostMismatch);
    }
    Ok(())
}

/// Whether two authorities name the same host and port, a missing port standing for
/// the scheme's default (`http://a:80/` and `Host: a` are one authority).
fn same_authority(scheme: Option<&str>, target: &[u8], host: &[u8]) -> bool {
    let default = match scheme {
        Some(s) if s.eq_ignore_ascii_case("https") => &b"443"[..],
        _ => &b"80"[..],
    };
    let split = |authority: &'_ [u8]| -> (Vec<u8>, Vec<u8>) {
        // A bracketed IPv6 literal holds colons of its own.
        let port_at = match authority.iter().rposition(|b| *b == b':') {
            Some(at) if !authority[at..].contains(&b']') => Some(at),
            _ => None,
        };
        let (name, port) = match port_at {
            Some(at) => (&authority[..at], &authority[at + 1..]),
            None => (authority, &b""[..]),
        };
        let port = if port.is_empty() { default } else { port };
        (name.to_ascii_lowercase(), port.to_vec())
    };
    split(target) == split(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_and_the_asterisk_form_are_refused() {
        let uri = |s: &str| s.parse::<Uri>().expect("uri");
        assert_eq!(
            check_target(&Method::CONNECT, &uri("api.test:443")),
            Err(TargetError::Connect)
        );
        assert_eq!(
            check_target(&Method::CONNECT, &uri("/charges")),
            Err(TargetError::Connect)
        );
        for method in [Method::OPTIONS, Method::POST, Method::GET] {
            assert_eq!(
                check_target(&method, &uri("*")),
                Err(TargetError::Asterisk),
                "{method}"
            );
        }
        for target in ["/", "/*", "/charges/*", "http://a/*"] {
            assert_eq!(
                check_target(&Method::OPTIONS, &uri(target)),
                Ok(()),
                "{target}"
            );
        }
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
        let v11 = Version::HTTP_11;
        let mut headers = HeaderMap::new();
        headers.append(HOST, "a.example".parse().expect("value"));
        let origin: Uri = "/charges".parse().expect("uri");
        assert_eq!(check_host(v11, &origin, &headers), Ok(()));
        let same: Uri = "http://A.example/charges".parse().expect("uri");
        assert_eq!(check_host(v11, &same, &headers), Ok(()));
        let other: Uri = "http://b.example/charges".parse().expect("uri");
        assert_eq!(
            check_host(v11, &other, &headers),
            Err(TargetError::HostMismatch)
        );
        headers.append(HOST, "b.example".parse().expect("value"));
        assert_eq!(
            check_host(v11, &origin, &headers),
            Err(TargetError::DuplicateHost)
        );
    }

    #[test]
    fn an_http11_request_needs_one_host_that_names_one_authority() {
        let origin: Uri = "/charges".parse().expect("uri");
        let none = HeaderMap::new();
        assert_eq!(
            check_host(Version::HTTP_11, &origin, &none),
            Err(TargetError::MissingHost)
        );
        assert_eq!(check_host(Version::HTTP_10, &origin, &none), Ok(()));
        assert_eq!(check_host(Version::HTTP_2, &origin, &none), Ok(()));
        let host = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(HOST, value.parse().expect("value"));
            headers
        };
        for bad in ["", "  "] {
            assert_eq!(
                check_host(Version::HTTP_11, &origin, &host(bad)),
                Err(TargetError::EmptyHost)
            );
        }
        for list in ["a, b", "a,b", "a.example,"] {
            assert_eq!(
                check_host(Version::HTTP_2, &origin, &host(list)),
                Err(TargetError::HostList),
                "{list}"
            );
        }
    }

    #[test]
    fn a_default_port_names_the_same_authority() {
        let host = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(HOST, value.parse().expect("value"));
            headers
        };
        let check = |target: &str, value: &str| {
            check_host(
                Version::HTTP_11,
                &target.parse::<Uri>().expect("uri"),
                &host(value),
            )
        };
        assert_eq!(check("http://a:80/x", "a"), Ok(()));
        assert_eq!(check("http://a/x", "A:80"), Ok(()));
        assert_eq!(check("https://a:443/x", "a"), Ok(()));
        assert_eq!(check("http://[::1]:80/x", "[::1]"), Ok(()));
        assert_eq!(
            check("http://a:8080/x", "a"),
            Err(TargetError::HostMismatch)
        );
        assert_eq!(check("https://a/x", "a:80"), Err(TargetError::HostMismatch));
        assert_eq!(
            check("http://[::1]/x", "[::2]"),
            Err(TargetError::HostMismatch)
        );
    }
}
