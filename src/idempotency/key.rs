//! Key syntax (docs/behaviour.md §8) and the scoped record address (docs/behaviour.md §3,
//! §9). Where a key is looked for is `source.rs`.

use http::HeaderMap;
use http::header::{AUTHORIZATION, COOKIE, HeaderName};
use sha2::{Digest, Sha256};

/// Longest key accepted, in characters (docs/behaviour.md §2).
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 visible ASCII characters, no comma.
#[derive(Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key of a request keyed by its own fingerprint (docs/behaviour.md §9
    /// `fingerprint`): the digest in hex, 64 characters.
    pub fn from_digest(digest: &[u8; 32]) -> Self {
        Self(hex(digest))
    }

    /// The key as the client meant it (structured-field quoting resolved).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The key is never printed: logs must not carry raw keys (docs/behaviour.md §3).
impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdempotencyKey(..)")
    }
}

/// Why a key header was refused; every variant becomes `400 invalid-key`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the key is empty")]
    Empty,
    #[error("the key is longer than {MAX_KEY_LEN} characters")]
    TooLong,
    #[error("the key may only hold visible ASCII characters other than ','")]
    BadCharacter,
    #[error("the key header is given more than once")]
    Repeated,
    #[error("the quoted key is not a valid structured-field string")]
    BadString,
    #[error("the key in the JSON body is neither a string nor an integer")]
    NotStringOrInteger,
    /// The key breaks the policy's `key_format` (docs/behaviour.md §18); `expected`
    /// completes "the key must ..." for the client.
    #[error("the key must {expected}")]
    Format { expected: std::sync::Arc<str> },
}

/// Reads the key from `headers`. `Ok(None)` when the header is absent.
pub fn parse_key(
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    parse_value(value.as_bytes()).map(Some)
}

/// Parses one header value: a structured-field string when it starts with `"`, the bare
/// token otherwise. Both spellings of the same key name the same record.
pub fn parse_value(raw: &[u8]) -> Result<IdempotencyKey, KeyError> {
    match raw.first() {
        Some(b'"') => checked(unquote(&raw[1..])?),
        _ => parse_plain(raw),
    }
}

/// Takes a value as it is, quotes included: query and JSON values, which have their
/// own quoting (docs/behaviour.md §9).
pub fn parse_plain(raw: &[u8]) -> Result<IdempotencyKey, KeyError> {
    checked(raw.to_vec())
}

fn checked(key: Vec<u8>) -> Result<IdempotencyKey, KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    if !key.iter().all(|&b| (0x21..=0x7e).contains(&b) && b != b',') {
        return Err(KeyError::BadCharacter);
    }
    // Every byte was checked to be ASCII above.
    let key = String::from_utf8(key).map_err(|_| KeyError::BadCharacter)?;
    Ok(IdempotencyKey(key))
}

/// Resolves an RFC 8941 sf-string body (after the opening quote). Only `\"` and `\\`
/// are escapes; the closing quote must end the value.
fn unquote(rest: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter().copied();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(KeyError::BadString),
            },
            b'"' => {
                return if bytes.next().is_none() {
                    Ok(out)
                } else {
                    Err(KeyError::BadString)
                };
            }
            _ => out.push(b),
        }
    }
    Err(KeyError::BadString)
}

/// The address of a record: sha256 over the scope values, the key's source and the key.
/// Stores put their `key_prefix` in front of its hex form; raw keys and credentials
/// never reach a store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopedKey([u8; 32]);

/// What scopes a key besides the key itself: a policy's `scope_headers` and
/// `scope_cookies` (docs/behaviour.md §3, §15), and its verified principal
/// (docs/behaviour.md §17).
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub headers: &'a [HeaderName],
    pub cookies: &'a [String],
    /// Set when the policy scopes by who the caller is.
    pub principal: Option<ByPrincipal<'a>>,
}

/// A scope by principal: the principal's bytes (`None` for a request without a
/// credential, the anonymous scope) replace `Authorization` and the header the
/// credential was read from, which a refreshed token changes.
#[derive(Clone, Copy)]
pub struct ByPrincipal<'a> {
    pub replaces: &'a HeaderName,
    pub principal: Option<&'a [u8]>,
}

/// The principal is never printed.
impl std::fmt::Debug for ByPrincipal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByPrincipal")
            .field("replaces", self.replaces)
            .field("principal", &self.principal.map(|_| ".."))
            .finish()
    }
}

impl Scope<'_> {
    /// The scope headers that enter the hash: under a principal, neither
    /// `Authorization` nor the header the principal replaces.
    fn hashed_headers(&self) -> impl Iterator<Item = &HeaderName> {
        let replaced = self.principal.map(|by| by.replaces);
        self.headers.iter().filter(move |name| {
            replaced.is_none_or(|replaced| **name != AUTHORIZATION && *name != replaced)
        })
    }
}

/// Which scope a record belongs to, for `store.max_entries_per_scope`
/// (docs/behaviour.md §17): a hash of the scope values alone, without the key, so that
/// the records of one client share it. Half a SHA-256: collisions stay negligible, and
/// the raw scope (a credential) never reaches the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScopeId([u8; 16]);

impl ScopeId {
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl std::fmt::Debug for ScopeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScopeId({})", &hex(&self.0)[..8])
    }
}

impl Scope<'_> {
    /// The scope `headers` put a request in: the scope values hashed exactly as
    /// [`ScopedKey::scoped_in_parts`] hashes them, then finished on their own.
    pub fn id(&self, headers: &HeaderMap) -> ScopeId {
        let mut hash = Sha256::new();
        hash.update(b"idemgate-scope-v1");
        self.feed(&mut hash, headers);
        hash.update(b"scope-id");
        let digest: [u8; 32] = hash.finalize().into();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        ScopeId(id)
    }

    /// Feeds the scope values of `headers` (and the principal) to `hash`.
    fn feed(&self, hash: &mut Sha256, headers: &HeaderMap) {
        for name in self.hashed_headers() {
            if *name == AUTHORIZATION {
                hash_authorization(hash, headers);
            } else {
                hash_header(hash, headers, name);
            }
        }
        if !self.cookies.is_empty() {
            // Never the first byte of a length prefix (keys are at most 255 long), so a
            // scope with cookies cannot collide with one without.
            hash.update(b"cookies");
            for name in self.cookies {
                hash_cookie(hash, headers, name);
            }
        }
        if let Some(by) = self.principal {
            // Like the cookie marker, never the first byte of a length prefix: a
            // principal cannot collide with header or cookie values. Then a count (0 for
            // the anonymous scope, 1) and the principal, as a cookie is hashed.
            hash.update(b"principal");
            match by.principal {
                Some(principal) => {
                    hash.update(1u64.to_be_bytes());
                    hash_field(hash, principal);
                }
                None => hash.update(0u64.to_be_bytes()),
            }
        }
    }

    /// Whether `headers` carry a value of the scope that can tell one client from
    /// another: a listed header or cookie, not empty. A request that carries none shares
    /// the anonymous scope with every other such request, where a `fingerprint` key
    /// source must not deduplicate: two tenants' identical requests would be one.
    pub fn identifies(&self, headers: &HeaderMap) -> bool {
        if self.principal.is_some_and(|by| by.principal.is_some()) {
            return true;
        }
        self.hashed_headers().any(|name| {
            headers
                .get_all(name)
                .iter()
                .any(|value| !value.as_bytes().is_empty())
        }) || self
            .cookies
            .iter()
            .any(|name| cookie(headers, name).is_some_and(|value| !value.is_empty()))
    }
}

/// The label of the original source, the `Idempotency-Key` header
/// (docs/behaviour.md §3). Its records keep the address they had before key sources
/// existed, so that an upgrade in the middle of a key's life does not execute its retry
/// again; every other source enters the hash.
pub const DEFAULT_SOURCE: &str = "header:idempotency-key";

impl ScopedKey {
    /// A key from the `Idempotency-Key` header scoped by request headers only:
    /// [`ScopedKey::scoped`] with no cookies.
    pub fn new(headers: &HeaderMap, scope_headers: &[HeaderName], key: &IdempotencyKey) -> Self {
        let scope = Scope {
            headers: scope_headers,
            cookies: &[],
            principal: None,
        };
        Self::scoped(headers, scope, DEFAULT_SOURCE, key)
    }

    /// Computes the key from the scope values of a request. Each header or cookie
    /// contributes a count of values and each value with its length, so that no two
    /// different inputs (`a:b`+`c` versus `a`+`b:c`, absent versus empty) hash alike.
    /// The scheme of an `Authorization` value is compared case-insensitively. Cookies
    /// enter the hash only when the policy names some, so that adding `scope_cookies`
    /// to a policy moves no other policy's records; so does the principal, for policies
    /// that scope by one. `source` is the label of the key's
    /// source (`KeySource::label`), so that the same string from two sources names two
    /// keys.
    pub fn scoped(
        headers: &HeaderMap,
        scope: Scope<'_>,
        source: &str,
        key: &IdempotencyKey,
    ) -> Self {
        Self::scoped_in_parts(headers, scope, [source, ""], key)
    }

    /// [`scoped`](Self::scoped) with the source label given as two pieces (as
    /// `KeySource::label_parts` has it), hashed as their concatenation.
    pub fn scoped_in_parts(
        headers: &HeaderMap,
        scope: Scope<'_>,
        source: [&str; 2],
        key: &IdempotencyKey,
    ) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"idemgate-scope-v1");
        scope.feed(&mut hash, headers);
        let [kind, name] = source;
        let default = DEFAULT_SOURCE
            .strip_prefix(kind)
            .is_some_and(|rest| rest == name);
        if !default {
            // Like the cookie marker, never the first byte of a length prefix; the same
            // bytes as `hash_field` of the whole label.
            hash.update(b"source");
            hash.update(((kind.len() + name.len()) as u64).to_be_bytes());
            hash.update(kind.as_bytes());
            hash.update(name.as_bytes());
        }
        hash_field(&mut hash, key.0.as_bytes());
        Self(hash.finalize().into())
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex_after("", &self.0)
    }

    /// The record's id, as `idemgate key` prints it, the admin API and traces show it
    /// and the Redis store names its key: `prefix` (`key_prefix`) + [`to_hex`](Self::to_hex).
    pub fn id(&self, prefix: &str) -> String {
        hex_after(prefix, &self.0)
    }

    /// The key printed by [`to_hex`](Self::to_hex), either case; `None` for anything
    /// that is not exactly 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.as_bytes();
        if text.len() != 64 {
            return None;
        }
        let digit = |c: u8| {
            char::from(c)
                .to_digit(16)
                .and_then(|d| u8::try_from(d).ok())
        };
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(Self(bytes))
    }
}

impl std::fmt::Debug for ScopedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScopedKey({})", &self.to_hex()[..12])
    }
}

/// Length-prefixed field, so concatenations cannot collide.
pub(crate) fn hash_field(hash: &mut Sha256, bytes: &[u8]) {
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

/// All values of one header, counted, in order.
pub(crate) fn hash_header(hash: &mut Sha256, headers: &HeaderMap, name: &HeaderName) {
    let values = headers.get_all(name);
    hash.update((values.iter().count() as u64).to_be_bytes());
    for value in values {
        hash_field(hash, value.as_bytes());
    }
}

/// `Authorization` values with their scheme in one case (`bearer x` and `BEARER x` are
/// `Bearer x`): the form most clients send, so their existing records keep their
/// address.
fn hash_authorization(hash: &mut Sha256, headers: &HeaderMap) {
    let values = headers.get_all(AUTHORIZATION);
    hash.update((values.iter().count() as u64).to_be_bytes());
    for value in values {
        let bytes = value.as_bytes();
        let scheme_end = bytes.iter().position(|b| *b == b' ').unwrap_or(0);
        let mut canonical = bytes.to_vec();
        for (i, b) in canonical[..scheme_end].iter_mut().enumerate() {
            *b = if i == 0 {
                b.to_ascii_uppercase()
            } else {
                b.to_ascii_lowercase()
            };
        }
        hash_field(hash, &canonical);
    }
}

/// The cookie `name` as servers read it: hashed as a count (0 or 1) and its value, the
/// bytes a cookie sent once always had.
fn hash_cookie(hash: &mut Sha256, headers: &HeaderMap, name: &str) {
    match cookie(headers, name) {
        Some(value) => {
            hash.update(1u64.to_be_bytes());
            hash_field(hash, value);
        }
        None => hash.update(0u64.to_be_bytes()),
    }
}

/// The value of the cookie `name` as servers parse `Cookie` headers: pairs split at `;`
/// (and at `, `, see [`pairs`]), each at its first `=`, name and value trimmed of spaces
/// and tabs (`session =A` is `session`, `A`), a pair without `=` or with an empty name
/// ignored, and a cookie named twice, in one header or across several, taking its first
/// value. Reading it otherwise than the upstream does would put a request in another
/// tenant's scope, or in none.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|line| pairs(line.as_bytes()))
        .find_map(|pair| {
            let eq = pair.iter().position(|b| *b == b'=')?;
            let (found, value) = (trim(&pair[..eq]), trim(&pair[eq + 1..]));
            (!found.is_empty() && found == name.as_bytes()).then_some(value)
        })
}

/// The pairs of one `Cookie` line: split at each `;`, and at each `,` followed by a
/// space or a tab (docs/behaviour.md §25). An intermediary that folds two `Cookie`
/// lines into one joins them with `, `, and servers that read RFC 2965 cookies split
/// there too: read as one pair, `theme=dark, session=A` would hide `session`. A comma
/// with no space after it stays in the value, as RFC 6265 servers keep it.
fn pairs(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(line);
    std::iter::from_fn(move || {
        let left = rest?;
        let end = (0..left.len()).find(|&at| match left[at] {
            b';' => true,
            b',' => matches!(left.get(at + 1), Some(b' ' | b'\t')),
            _ => false,
        });
        match end {
            Some(at) => {
                rest = Some(&left[at + 1..]);
                Some(&left[..at])
            }
            None => {
                rest = None;
                Some(left)
            }
        }
    })
}

/// Trims the spaces and tabs around a cookie's name or value.
fn trim(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    hex_after("", bytes)
}

/// `prefix`, then `bytes` in lower-case hex, in one allocation.
fn hex_after(prefix: &str, bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(prefix.len() + bytes.len() * 2);
    out.push_str(prefix);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn key(s: &str) -> IdempotencyKey {
        parse_value(s.as_bytes()).expect("valid key")
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn a_scope_id_is_shared_by_a_clients_keys_and_not_by_other_clients() {
        let scope_headers = [AUTHORIZATION];
        let scope = Scope {
            headers: &scope_headers,
            cookies: &[],
            principal: None,
        };
        let mut a = HeaderMap::new();
        a.insert(AUTHORIZATION, HeaderValue::from_static("Bearer a"));
        let mut a_again = HeaderMap::new();
        a_again.insert(AUTHORIZATION, HeaderValue::from_static("bearer a"));
        let mut b = HeaderMap::new();
        b.insert(AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        assert_eq!(scope.id(&a), scope.id(&a_again), "the scheme's case aside");
        assert_ne!(scope.id(&a), scope.id(&b));
        assert_ne!(scope.id(&a), scope.id(&HeaderMap::new()));
        assert!(
            !scope.id(&a).as_bytes().iter().all(|b| *b == 0),
            "a hash, not the value"
        );
        // Under a principal, two tokens of one caller are one scope.
        let by = |principal: &'static [u8]| Scope {
            principal: Some(ByPrincipal {
                replaces: &AUTHORIZATION,
                principal: Some(principal),
            }),
            ..scope
        };
        assert_eq!(by(b"alice").id(&a), by(b"alice").id(&b));
        assert_ne!(by(b"alice").id(&a), by(b"bob").id(&a));
    }

    #[test]
    fn cookies_named_in_the_scope_separate_tenants() {
        let names = ["session".to_owned()];
        let scope = Scope {
            headers: &[AUTHORIZATION],
            cookies: &names,
            principal: None,
        };
        let k = key("k1");
        let a = ScopedKey::scoped(
            &headers(&[("cookie", "theme=dark; session=A")]),
            scope,
            DEFAULT_SOURCE,
            &k,
        );
        let b = ScopedKey::scoped(
            &headers(&[("cookie", "session=B; theme=dark")]),
            scope,
            DEFAULT_SOURCE,
            &k,
        );
        let a_again = ScopedKey::scoped(
            &headers(&[("cookie", "x=1"), ("cookie", "session=A")]),
            scope,
            DEFAULT_SOURCE,
            &k,
        );
        let none = ScopedKey::scoped(
            &headers(&[("cookie", "sessionX=A")]),
            scope,
            DEFAULT_SOURCE,
            &k,
        );
        assert_ne!(a, b, "tenant B never sees tenant A's record");
        assert_eq!(a, a_again, "other cookies and header splits do not matter");
        assert_ne!(a, none);
        // Without scope_cookies a policy's records keep the address they always had.
        let plain = headers(&[("authorization", "Bearer t"), ("cookie", "session=A")]);
        let no_cookies = Scope {
            headers: &[AUTHORIZATION],
            cookies: &[],
            principal: None,
        };
        assert_eq!(
            ScopedKey::scoped(&plain, no_cookies, DEFAULT_SOURCE, &k),
            ScopedKey::new(&plain, &[AUTHORIZATION], &k)
        );
    }

    /// `session =A` is the cookie `session` with the value `A` to the servers behind
    /// the proxy, so it is to the scope too: read any other way, a request lands in
    /// another scope than its tenant's, or in the anonymous one.
    #[test]
    fn cookies_are_read_as_servers_read_them() {
        let names = ["session".to_owned()];
        let scope = Scope {
            headers: &[AUTHORIZATION],
            cookies: &names,
            principal: None,
        };
        let k = key("k1");
        let at = |pairs: &[(&'static str, &'static str)]| {
            ScopedKey::scoped(&headers(pairs), scope, DEFAULT_SOURCE, &k)
        };
        let a = at(&[("cookie", "session=A")]);
        for same in [
            "session =A",
            "session= A",
            " \tsession\t=\tA\t ",
            "theme=dark;session=A",
            // The first value counts, as servers take it.
            "session=A; session=B",
            // Pairs without `=` or without a name are skipped.
            "junk; session=A",
            "=B; session=A",
            "  ; session=A;;",
        ] {
            assert_eq!(at(&[("cookie", same)]), a, "{same}");
        }
        assert_eq!(at(&[("cookie", "x"), ("cookie", "session=A")]), a);
        assert_eq!(at(&[("cookie", "session=A"), ("cookie", "session=B")]), a);
        assert_ne!(at(&[("cookie", "session=B; session=A")]), a);
        assert_ne!(
            at(&[("cookie", "session=\"A\"")]),
            a,
            "quotes are the value's"
        );
        // Absent, malformed and empty differ from any value.
        let none = at(&[]);
        assert_eq!(at(&[("cookie", "session; =A; sessions=A")]), none);
        assert_ne!(at(&[("cookie", "session=")]), none);
        assert_ne!(at(&[("cookie", "session=")]), a);
        // A cookie sent once keeps the address it always had: its count, then its value.
        let mut hash = Sha256::new();
        hash.update(b"idemgate-scope-v1");
        hash.update(0u64.to_be_bytes());
        hash.update(b"cookies");
        hash.update(1u64.to_be_bytes());
        hash_field(&mut hash, b"A");
        hash_field(&mut hash, b"k1");
        assert_eq!(a, ScopedKey(hash.finalize().into()));
    }

    /// An intermediary that folds two `Cookie` lines into one joins them with `, `: the
    /// pairs on either side are two cookies, as if joined with `; `
    /// (docs/behaviour.md §25). A comma with no space after it is the value's.
    #[test]
    fn cookies_joined_by_a_comma_and_a_space_are_two_cookies() {
        let names = ["session".to_owned()];
        let scope = Scope {
            headers: &[AUTHORIZATION],
            cookies: &names,
            principal: None,
        };
        let k = key("k1");
        let at = |line: &'static str| {
            ScopedKey::scoped(&headers(&[("cookie", line)]), scope, DEFAULT_SOURCE, &k)
        };
        let a = at("session=A");
        for same in [
            "theme=dark, session=A",
            "theme=dark,\tsession=A",
            "theme=dark,  session=A ",
            "session=A, theme=dark",
            "session=A, session=B",
            "junk, session=A",
            "x=1; theme=dark, session=A; y=2",
        ] {
            assert_eq!(at(same), a, "{same}");
        }
        assert_ne!(at("theme=dark, session=B"), a);
        assert_ne!(at("session=A,B"), a, "no space: the comma is the value's");
        let none = ScopedKey::scoped(&headers(&[]), scope, DEFAULT_SOURCE, &k);
        assert_eq!(at("theme=dark,session=A"), none, "one cookie, `theme`");
        assert_eq!(at("session, theme=dark"), none);
    }

    #[test]
    fn a_scope_identifies_a_request_by_any_value_it_carries() {
        let names = ["session".to_owned()];
        let tenant = [HeaderName::from_static("x-api-key")];
        let scope = Scope {
            headers: &tenant,
            cookies: &names,
            principal: None,
        };
        let identifies = |pairs: &[(&'static str, &'static str)]| scope.identifies(&headers(pairs));
        assert!(identifies(&[("x-api-key", "a")]));
        assert!(identifies(&[("cookie", "session=s")]));
        assert!(identifies(&[("cookie", "session = s")]));
        // A malformed pair beside another scope value does not make the request anonymous.
        assert!(identifies(&[("cookie", "session"), ("x-api-key", "a")]));
        assert!(identifies(&[("cookie", "=x; session=s")]));
        for anonymous in [
            &[][..],
            &[("authorization", "Bearer t"), ("cookie", "other=1")],
            &[("cookie", "session; =s; sessionx=s")],
            &[("x-api-key", "")],
            &[("cookie", "session=")],
            &[("cookie", "session= \t")],
        ] {
            assert!(!identifies(anonymous), "{anonymous:?}");
        }
        let nothing = Scope {
            headers: &[],
            cookies: &[],
            principal: None,
        };
        assert!(!nothing.identifies(&headers(&[("authorization", "Bearer t")])));
    }

    #[test]
    fn the_authorization_scheme_is_case_insensitive_and_bearer_keeps_its_address() {
        let k = key("k1");
        let scope = [AUTHORIZATION];
        let of = |v: &'static str| ScopedKey::new(&headers(&[("authorization", v)]), &scope, &k);
        assert_eq!(of("bearer tok"), of("Bearer tok"));
        assert_eq!(of("BEARER tok"), of("Bearer tok"));
        assert_ne!(
            of("Bearer tok"),
            of("Bearer TOK"),
            "credentials stay case-sensitive"
        );
        // The address "Bearer tok" always had: the raw value hashed as it is.
        let mut hash = Sha256::new();
        hash.update(b"idemgate-scope-v1");
        hash.update(1u64.to_be_bytes());
        hash_field(&mut hash, b"Bearer tok");
        hash_field(&mut hash, b"k1");
        assert_eq!(of("Bearer tok"), ScopedKey(hash.finalize().into()));
    }

    #[test]
    fn the_source_is_part_of_the_address() {
        let k = key("ord-7");
        let hs = headers(&[("authorization", "Bearer t")]);
        let scope = Scope {
            headers: &[AUTHORIZATION],
            cookies: &[],
            principal: None,
        };
        let at = |source: &str| ScopedKey::scoped(&hs, scope, source, &k);
        let labels = [
            DEFAULT_SOURCE,
            "header:x-request-id",
            "query:request_id",
            "json:/payment/reference",
            "fingerprint",
        ];
        for (i, a) in labels.iter().enumerate() {
            for b in &labels[i + 1..] {
                assert_ne!(at(a), at(b), "{a} and {b}");
            }
        }
        // The default source keeps the address records had before sources
        // (docs/behaviour.md §3).
        assert_eq!(
            at(DEFAULT_SOURCE),
            ScopedKey::new(&hs, &[AUTHORIZATION], &k)
        );
        // Source and key cannot shift into each other.
        assert_ne!(
            ScopedKey::scoped(&hs, scope, "query:a", &key("bc")),
            ScopedKey::scoped(&hs, scope, "query:ab", &key("c"))
        );
    }

    #[test]
    fn plain_values_keep_their_quotes() {
        assert_eq!(
            parse_plain(b"\"q\"").map(|k| k.as_str().to_owned()),
            Ok("\"q\"".to_owned())
        );
        assert_eq!(parse_plain(b""), Err(KeyError::Empty));
        assert_eq!(parse_plain(b"a,b"), Err(KeyError::BadCharacter));
    }

    #[test]
    fn bare_and_quoted_name_the_same_key() {
        assert_eq!(key("7c9e-1"), key("\"7c9e-1\""));
        assert_eq!(key(r#""a\"b\\c""#).as_str(), r#"a"b\c"#);
    }

    #[test]
    fn length_bounds() {
        assert_eq!(parse_value(b""), Err(KeyError::Empty));
        assert_eq!(parse_value(b"\"\""), Err(KeyError::Empty));
        assert!(parse_value("a".repeat(255).as_bytes()).is_ok());
        assert_eq!(
            parse_value("a".repeat(256).as_bytes()),
            Err(KeyError::TooLong)
        );
        let quoted = format!("\"{}\"", "b".repeat(255));
        assert!(parse_value(quoted.as_bytes()).is_ok());
    }

    #[test]
    fn bad_characters() {
        for bad in [&b"a b"[..], b"a,b", b"caf\xc3\xa9", b"tab\there", b"\x7f"] {
            assert_eq!(parse_value(bad), Err(KeyError::BadCharacter), "{bad:?}");
        }
        assert_eq!(parse_value(b"\"a b\""), Err(KeyError::BadCharacter));
    }

    #[test]
    fn bad_strings() {
        for bad in [
            &b"\"abc"[..],
            b"\"a\\nb\"",
            b"\"ab\"cd",
            b"\"ab\\\"",
            b"\"",
            b"\"a\"\"",
        ] {
            assert_eq!(
                parse_value(bad),
                Err(KeyError::BadString),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_bare_value_with_a_late_quote_is_taken_as_is() {
        assert_eq!(key("ab\"c").as_str(), "ab\"c");
    }

    #[test]
    fn header_absent_single_and_repeated() {
        let name = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        assert_eq!(parse_key(&headers, &name), Ok(None));
        headers.insert(&name, HeaderValue::from_static("k1"));
        assert_eq!(parse_key(&headers, &name), Ok(Some(key("k1"))));
        headers.append(&name, HeaderValue::from_static("k1"));
        assert_eq!(parse_key(&headers, &name), Err(KeyError::Repeated));
    }

    #[test]
    fn debug_never_shows_the_key() {
        assert!(!format!("{:?}", key("secret-key")).contains("secret"));
    }

    fn scoped(pairs: &[(&str, &str)], k: &str) -> ScopedKey {
        let mut headers = HeaderMap::new();
        for (n, v) in pairs {
            headers.append(
                HeaderName::from_bytes(n.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        let scope = [
            HeaderName::from_static("authorization"),
            HeaderName::from_static("x-tenant"),
        ];
        ScopedKey::new(&headers, &scope, &key(k))
    }

    #[test]
    fn scope_separates_credentials() {
        assert_ne!(
            scoped(&[("authorization", "Bearer a")], "k"),
            scoped(&[("authorization", "Bearer b")], "k")
        );
        assert_eq!(
            scoped(&[("authorization", "Bearer a")], "k"),
            scoped(&[("authorization", "Bearer a")], "k")
        );
        assert_ne!(scoped(&[], "k"), scoped(&[("authorization", "")], "k"));
        assert_eq!(scoped(&[("x-other", "1")], "k"), scoped(&[], "k"));
    }

    #[test]
    fn scope_values_cannot_shift_into_each_other() {
        let a = scoped(&[("authorization", "a:b"), ("x-tenant", "c")], "k");
        let b = scoped(&[("authorization", "a"), ("x-tenant", "b:c")], "k");
        assert_ne!(a, b);
        let c = scoped(&[("x-tenant", "k")], "xy");
        let d = scoped(&[("x-tenant", "kx")], "y");
        assert_ne!(c, d);
    }

    #[test]
    fn hex_is_64_lowercase_chars() {
        let h = scoped(&[], "k").to_hex();
        assert_eq!(h.len(), 64);
        assert!(
            h.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    #[test]
    fn an_id_is_the_prefix_then_the_hex() {
        let key = scoped(&[], "k");
        assert_eq!(key.id("idem:"), format!("idem:{}", key.to_hex()));
        assert_eq!(key.id(""), key.to_hex());
    }

    #[test]
    fn a_record_id_reads_back_in_either_case_and_nothing_else_does() {
        let key = ScopedKey::from_bytes(*b"\x00\x01\xab\xcd\xef0123456789abcdefghijklmnopq");
        assert_eq!(ScopedKey::from_hex(&key.to_hex()), Some(key));
        assert_eq!(ScopedKey::from_hex(&key.to_hex().to_uppercase()), Some(key));
        for bad in [
            "",
            "00",
            &"0".repeat(63),
            &"0".repeat(65),
            &format!("{}g", "0".repeat(63)),
            &format!("{}+1", "0".repeat(62)),
        ] {
            assert_eq!(ScopedKey::from_hex(bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_value(&raw);
        }

        #[test]
        fn hex_ids_never_panic_and_round_trip(text in "\\PC{0,70}", bytes in any::<[u8; 32]>()) {
            let _ = ScopedKey::from_hex(&text);
            let key = ScopedKey::from_bytes(bytes);
            prop_assert_eq!(ScopedKey::from_hex(&key.to_hex()), Some(key));
        }

        #[test]
        fn every_valid_token_round_trips_through_quoting(k in "[!#-+--~]{1,255}") {
            let bare = key(&k);
            let quoted = format!("\"{}\"", k.replace('\\', "\\\\").replace('"', "\\\""));
            prop_assert_eq!(parse_value(quoted.as_bytes()), Ok(bare.clone()));
            prop_assert_eq!(bare.as_str(), k.as_str());
        }
    }
}
