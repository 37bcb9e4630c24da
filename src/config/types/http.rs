//! Addresses, URLs, header names and values, methods, statuses, cookie names and JSON
//! Pointers, as the file writes them.

use std::fmt;
use std::net::SocketAddr;

use http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde::ser::{SerializeMap, Serializer};

use super::{Form, Scalar, Shown, Text, forms, shown, text};
use crate::idempotency::pointer::JsonPointer;
use crate::idempotency::source::display_name;

pub(crate) struct Addr(pub(crate) SocketAddr);

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an address such as 127.0.0.1:8080";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        text.trim().parse().map(Addr).map_err(|_| {
            de::Error::custom(format!(
                "invalid address '{text}'; expected IP:PORT such as 127.0.0.1:8080 or [::]:8080 \
                 (host names are not resolved)"
            ))
        })
    }
}

pub(crate) struct Header(pub(crate) HeaderName);

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an HTTP header name";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        HeaderName::from_bytes(text.trim().as_bytes())
            .map(Header)
            .map_err(|_| de::Error::custom(format!("invalid HTTP header name '{text}'")))
    }
}

/// A header name as a key of a mapping, which is never interpolated.
pub(crate) struct HeaderKey(pub(crate) HeaderName);

impl<'de> Deserialize<'de> for HeaderKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an HTTP header name";
        let text = Scalar::read_key(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        HeaderName::from_bytes(text.trim().as_bytes())
            .map(HeaderKey)
            .map_err(|_| de::Error::custom(format!("invalid HTTP header name '{text}'")))
    }
}

/// A non-empty method list: an empty one would guard nothing, which `enabled: false`
/// already says explicitly.
pub(crate) struct Methods(pub(crate) Vec<Method>);

impl<'de> Deserialize<'de> for Methods {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let methods = Vec::<MethodName>::deserialize(d)?;
        if methods.is_empty() {
            return Err(de::Error::custom(
                "must not be empty (use enabled: false on a route to turn guarding off)",
            ));
        }
        Ok(Methods(methods.into_iter().map(|m| m.0).collect()))
    }
}

struct MethodName(Method);

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an HTTP method name";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        Method::from_bytes(text.trim().to_ascii_uppercase().as_bytes())
            .map(MethodName)
            .map_err(|_| de::Error::custom(format!("invalid HTTP method '{text}'")))
    }
}

pub(crate) struct Status(pub(crate) StatusCode);

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "an HTTP status code from 100 to 599";
        let code = Scalar::read(d, EXPECTING)?.into_u64::<D::Error>(EXPECTING)?;
        u16::try_from(code)
            .ok()
            .filter(|code| (100..=599).contains(code))
            .and_then(|code| StatusCode::from_u16(code).ok())
            .map(Status)
            .ok_or_else(|| de::Error::custom(format!("expected {EXPECTING}, found {code}")))
    }
}

pub(crate) struct UpstreamUrl(pub(crate) Uri);

impl<'de> Deserialize<'de> for UpstreamUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a URL such as http://127.0.0.1:9000";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        parse_upstream_url(&text)
            .map(UpstreamUrl)
            .map_err(de::Error::custom)
    }
}

/// Parses `http[s]://host[:port][/base]`, refusing what the proxy cannot honour.
pub(crate) fn parse_upstream_url(text: &str) -> Result<Uri, String> {
    let text = text.trim();
    let uri: Uri = text
        .parse()
        .map_err(|err| format!("invalid URL '{text}': {err}; expected http://host:port"))?;
    let scheme = match uri.scheme_str() {
        Some(scheme) if scheme.eq_ignore_ascii_case("http") => "http",
        Some(scheme) if scheme.eq_ignore_ascii_case("https") => "https",
        Some(scheme) => {
            return Err(format!(
                "unsupported scheme '{scheme}' in '{text}'; expected http://host:port"
            ));
        }
        None => {
            return Err(format!(
                "'{text}' is not an absolute URL; expected http://host:port"
            ));
        }
    };
    let Some(authority) = uri.authority() else {
        return Err(format!("'{text}' has no host; expected http://host:port"));
    };
    if authority.as_str().contains('@') {
        return Err("credentials in the upstream URL are not supported".to_owned());
    }
    if authority.host().is_empty() {
        return Err(format!("'{text}' has no host; expected http://host:port"));
    }
    if authority.port().is_some() && !matches!(authority.port_u16(), Some(1..)) {
        return Err(format!("'{text}' has an invalid port; expected 1 to 65535"));
    }
    if uri.query().is_some() {
        return Err(format!(
            "'{text}' has a query string; the upstream URL takes none"
        ));
    }
    let base = uri.path().trim_end_matches('/');
    let path = if base.is_empty() { "/" } else { base };
    Uri::builder()
        .scheme(scheme)
        .authority(authority.as_str())
        .path_and_query(path)
        .build()
        .map_err(|err| format!("invalid URL '{text}': {err}"))
}

/// A cookie name (an RFC 6265 token), for `scope_cookies`.
pub(crate) struct CookieName(pub(crate) String);

impl<'de> Deserialize<'de> for CookieName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a cookie name";
        let name = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        // An RFC 9110 token: visible ASCII but separators.
        let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(de::Error::custom(format!(
                "'{name}' is not a cookie name (letters, digits and !#$%&'*+-.^_`|~)"
            )));
        }
        Ok(CookieName(name))
    }
}

/// A map of header name to value (`replay_error_headers`, `telemetry.otlp.headers`), in
/// file order, each value read as `V` (a [`Text`], or a secret that refuses the mask).
pub(crate) struct HeaderPairs<V = Text>(
    pub(super) Vec<(HeaderName, HeaderValue)>,
    std::marker::PhantomData<V>,
);

impl<'de, V: Deserialize<'de> + Into<String>> Deserialize<'de> for HeaderPairs<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairsVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de> + Into<String>> Visitor<'de> for PairsVisitor<V> {
            type Value = HeaderPairs<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of header name to value")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some((name, value)) = map.next_entry::<HeaderKey, V>()? {
                    let value: String = value.into();
                    let value = HeaderValue::from_str(&value).map_err(|_| {
                        de::Error::custom(format!(
                            "'{value}' is not a valid value for header {}",
                            name.0.as_str()
                        ))
                    })?;
                    pairs.push((name.0, value));
                }
                Ok(HeaderPairs(pairs, std::marker::PhantomData))
            }
        }
        d.deserialize_map(PairsVisitor(std::marker::PhantomData))
    }
}

impl<V> Form for HeaderPairs<V> {
    type Value = Vec<(HeaderName, HeaderValue)>;
    fn value(self) -> Self::Value {
        self.0
    }
    fn print<S: Serializer>(pairs: &Self::Value, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(pairs.len()))?;
        for (name, value) in pairs {
            map.serialize_entry(name.as_str(), &Shown::<Text>(&header_text(value)))?;
        }
        map.end()
    }
}

/// A JSON Pointer of `fingerprint_ignore`: `""` or `/...` with valid `~0`/`~1`.
pub(crate) struct Pointer(pub(crate) JsonPointer);

impl<'de> Deserialize<'de> for Pointer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a JSON Pointer such as /timestamp";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        JsonPointer::parse(&text)
            .map(Pointer)
            .map_err(de::Error::custom)
    }
}

/// A `Content-Type` value.
pub(crate) struct ContentType(pub(crate) HeaderValue);

impl<'de> Deserialize<'de> for ContentType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTING: &str = "a media type such as application/json";
        let text = Scalar::read(d, EXPECTING)?.into_str::<D::Error>(EXPECTING)?;
        match HeaderValue::from_str(&text) {
            Ok(value) if text.contains('/') => Ok(ContentType(value)),
            _ => Err(de::Error::custom(format!(
                "'{text}' is not a media type; expected e.g. application/json"
            ))),
        }
    }
}

/// A list of header names (`scope_headers`, `replay_drop_headers`), printed as
/// `HTTP/2` writes them, lower-case.
pub(crate) struct Headers(Vec<HeaderName>);

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Headers(Vec::<Header>::deserialize(d)?.value()))
    }
}

/// A header value, as text.
pub(crate) fn header_text(value: &HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// `http[s]://host:port` without the `/` that `Uri` adds for an empty path, as written.
fn upstream_url<S: Serializer>(url: &Uri, s: S) -> Result<S::Ok, S::Error> {
    let scheme = url.scheme_str().unwrap_or("http");
    let authority = url.authority().map_or("", |a| a.as_str());
    let path = url.path().trim_end_matches('/');
    text(&format!("{scheme}://{authority}{path}"), s)
}

forms! {
    Addr => SocketAddr, shown;
    // `idempotency-key` is printed `Idempotency-Key`: header names are case-insensitive,
    // and this is how docs/behaviour.md and the IETF draft spell the request header.
    Header => HeaderName, |name: &HeaderName, s: S| text(&display_name(name), s);
    Headers => Vec<HeaderName>, |names: &Vec<HeaderName>, s: S| {
        let names: Vec<String> = names.iter().map(|name| name.as_str().to_owned()).collect();
        s.collect_seq(names.iter().map(Shown::<Text>))
    };
    Methods => Vec<Method>, |methods: &Vec<Method>, s: S| {
        s.collect_seq(methods.iter().map(Method::as_str))
    };
    Status => StatusCode, |status: &StatusCode, s: S| s.serialize_u16(status.as_u16());
    UpstreamUrl => Uri, upstream_url;
    ContentType => HeaderValue, |value: &HeaderValue, s: S| text(&header_text(value), s);
    CookieName => String, |name: &String, s: S| text(name, s);
    Pointer => JsonPointer, |pointer: &JsonPointer, s: S| text(pointer.as_str(), s);
}
