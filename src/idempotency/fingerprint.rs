//! The request fingerprint: what makes a retry "the same request" (SPEC §3).

use http::header::HeaderName;
use http::{HeaderMap, Method};
use sha2::{Digest, Sha256};

use super::key::{hash_field, hash_header, hex};

/// sha256 over method, path and query, the `fingerprint_headers` and the body.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn new(
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        fingerprint_headers: &[HeaderName],
        body: &[u8],
    ) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"idemgate-fingerprint-v1");
        hash_field(&mut hash, method.as_str().as_bytes());
        hash_field(&mut hash, path_and_query.as_bytes());
        for name in fingerprint_headers {
            hash_header(&mut hash, headers, name);
        }
        hash_field(&mut hash, body);
        Self(hash.finalize().into())
    }

    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({})", &hex(&self.0)[..12])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn fp(method: &str, pq: &str, ct: Option<&str>, body: &[u8]) -> Fingerprint {
        let mut headers = HeaderMap::new();
        if let Some(ct) = ct {
            headers.insert("content-type", HeaderValue::from_str(ct).expect("value"));
        }
        headers.insert("x-request-id", HeaderValue::from_static("varies-per-retry"));
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        Fingerprint::new(
            &method,
            pq,
            &headers,
            &[HeaderName::from_static("content-type")],
            body,
        )
    }

    #[test]
    fn each_input_changes_it() {
        let base = fp("POST", "/charges?a=1", Some("application/json"), b"{}");
        assert_eq!(
            base,
            fp("POST", "/charges?a=1", Some("application/json"), b"{}")
        );
        assert_ne!(
            base,
            fp("PUT", "/charges?a=1", Some("application/json"), b"{}")
        );
        assert_ne!(
            base,
            fp("POST", "/charges?a=2", Some("application/json"), b"{}")
        );
        assert_ne!(
            base,
            fp("POST", "/charges/?a=1", Some("application/json"), b"{}")
        );
        assert_ne!(base, fp("POST", "/charges?a=1", Some("text/plain"), b"{}"));
        assert_ne!(base, fp("POST", "/charges?a=1", None, b"{}"));
        assert_ne!(
            base,
            fp("POST", "/charges?a=1", Some("application/json"), b"{ }")
        );
    }

    #[test]
    fn headers_outside_the_list_do_not_count() {
        let mut headers = HeaderMap::new();
        let names = [HeaderName::from_static("content-type")];
        let a = Fingerprint::new(&Method::POST, "/", &headers, &names, b"x");
        headers.insert("x-trace", HeaderValue::from_static("1"));
        let b = Fingerprint::new(&Method::POST, "/", &headers, &names, b"x");
        assert_eq!(a, b);
    }

    #[test]
    fn path_and_body_cannot_shift_into_each_other() {
        assert_ne!(fp("POST", "/ab", None, b"c"), fp("POST", "/a", None, b"bc"));
    }
}
