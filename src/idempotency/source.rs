//! Where a request's key comes from (docs/behaviour.md §9): an ordered list of sources,
//! the first one present giving the key.
//!
//! ```text
//! for each source, in order:
//!   absent  ──► try the next one (none left: no key)
//!   bad     ──► invalid-key; later sources are not tried
//!   present ──► the key, addressed under this source's label
//! ```
//!
//! A header or query source is read from the head alone; a `json` or `fingerprint`
//! source needs the body, so [`find`] answers [`Found::NeedsBody`] when it reaches one
//! without the body, and the caller reads the body and asks again.

use std::time::Duration;

use http::header::{CONTENT_TYPE, HeaderName};
use http::{HeaderMap, HeaderValue};
use serde_json::Value;

use super::body::Body;
use super::key::{IdempotencyKey, KeyError, parse_key, parse_plain};
use super::pointer::JsonPointer;

/// One entry of `key_from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A request header; the bare token and the sf-string name the same key.
    Header(HeaderName),
    /// A query parameter, percent-decoded.
    Query(String),
    /// A string or integer inside a JSON request body.
    Json(JsonPointer),
    /// No id at all: the request's fingerprint is its key, its record kept this long.
    Fingerprint(Duration),
}

impl KeySource {
    /// The part of the record address that names the source: `header:<lower-case
    /// name>`, `query:<name>`, `json:<pointer>` or `fingerprint`.
    pub fn label(&self) -> String {
        self.label_parts().concat()
    }

    /// [`label`](Self::label) in two pieces, so that a request's address is hashed
    /// without building the string.
    pub fn label_parts(&self) -> [&str; 2] {
        match self {
            KeySource::Header(name) => ["header:", name.as_str()],
            KeySource::Query(name) => ["query:", name],
            KeySource::Json(pointer) => ["json:", pointer.as_str()],
            KeySource::Fingerprint(_) => ["fingerprint", ""],
        }
    }

    /// Whether the source reads the body.
    pub fn needs_body(&self) -> bool {
        matches!(self, KeySource::Json(_) | KeySource::Fingerprint(_))
    }

    /// Where the source looks, for a client that sent none: "the X-Request-Id header".
    pub fn describe(&self) -> String {
        match self {
            KeySource::Header(name) => format!("the {} header", display_name(name)),
            KeySource::Query(name) => format!("the {name} query parameter"),
            KeySource::Json(pointer) => format!("{} in the JSON body", pointer.as_str()),
            KeySource::Fingerprint(_) => "the request's fingerprint".to_owned(),
        }
    }
}

/// `idempotency-key` as `Idempotency-Key`, the way clients write it.
pub fn display_name(name: &HeaderName) -> String {
    name.as_str()
        .split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |c| {
                c.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// What of a request the sources may read: its head always, its body once read.
#[derive(Debug, Clone, Copy)]
pub struct Offered<'a> {
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
    pub body: Option<&'a Body<'a>>,
}

/// What the sources found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found<'s> {
    /// A key, and the source that gave it.
    Key(&'s KeySource, IdempotencyKey),
    /// The `fingerprint` source: the request's fingerprint is the key.
    Fingerprint(&'s KeySource),
    /// A source that reads the body was reached before the body was read.
    NeedsBody,
    /// No source is present.
    Absent,
}

/// The first source present among `sources`, in order.
pub fn find<'s>(sources: &'s [KeySource], request: Offered<'_>) -> Result<Found<'s>, KeyError> {
    for source in sources {
        let key = match source {
            KeySource::Header(name) => parse_key(request.headers, name)?,
            KeySource::Query(name) => query_value(request.query, name)?,
            KeySource::Json(pointer) => {
                let Some(body) = request.body else {
                    return Ok(Found::NeedsBody);
                };
                match json_body(request.headers, body).and_then(|json| pointer.resolve(json)) {
                    Some(value) => Some(json_value(value)?),
                    None => None,
                }
            }
            KeySource::Fingerprint(_) => {
                return Ok(if request.body.is_some() {
                    Found::Fingerprint(source)
                } else {
                    Found::NeedsBody
                });
            }
        };
        if let Some(key) = key {
            return Ok(Found::Key(source, key));
        }
    }
    Ok(Found::Absent)
}

/// The parameter `name` of a query, form-decoded; given twice is bad.
fn query_value(query: Option<&str>, name: &str) -> Result<Option<IdempotencyKey>, KeyError> {
    let Some(query) = query else {
        return Ok(None);
    };
    let mut values = form_urlencoded::parse(query.as_bytes())
        .filter(|(param, _)| param == name)
        .map(|(_, value)| value);
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    parse_plain(value.as_bytes()).map(Some)
}

/// The body as JSON, when its `Content-Type` says JSON and it parses.
fn json_body<'b>(headers: &HeaderMap, body: &'b Body<'_>) -> Option<&'b Value> {
    let mut types = headers.get_all(CONTENT_TYPE).iter();
    let content_type = types.next()?;
    if types.next().is_some() || !is_json(content_type) {
        return None;
    }
    body.json()
}

/// `application/json` or any `*/*+json`, parameters aside.
fn is_json(content_type: &HeaderValue) -> bool {
    let Ok(text) = content_type.to_str() else {
        return false;
    };
    let essence = text.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let subtype = subtype.to_ascii_lowercase();
    !kind.is_empty()
        && !kind.contains(char::is_whitespace)
        && (subtype.ends_with("+json")
            || (subtype == "json" && kind.eq_ignore_ascii_case("application")))
}

/// A string as written, an integer in decimal; any other value is bad.
fn json_value(value: &Value) -> Result<IdempotencyKey, KeyError> {
    match value {
        Value::String(text) => parse_plain(text.as_bytes()),
        Value::Number(n) if n.is_i64() || n.is_u64() => parse_plain(n.to_string().as_bytes()),
        _ => Err(KeyError::NotStringOrInteger),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(list: &[KeySource]) -> Vec<KeySource> {
        list.to_vec()
    }

    fn header(name: &'static str) -> KeySource {
        KeySource::Header(HeaderName::from_static(name))
    }

    fn json(pointer: &str) -> KeySource {
        KeySource::Json(JsonPointer::parse(pointer).expect("pointer"))
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    /// The key found, as (label, key), or what was found instead.
    fn found(
        list: &[KeySource],
        hs: &HeaderMap,
        query: Option<&str>,
        body: Option<&[u8]>,
    ) -> Result<Option<(String, String)>, String> {
        let body = body.map(Body::new);
        let offered = Offered {
            headers: hs,
            query,
            body: body.as_ref(),
        };
        match find(list, offered) {
            Ok(Found::Key(source, key)) => Ok(Some((source.label(), key.as_str().to_owned()))),
            Ok(Found::Fingerprint(source)) => Ok(Some((source.label(), String::new()))),
            Ok(Found::NeedsBody) => Err("needs body".to_owned()),
            Ok(Found::Absent) => Ok(None),
            Err(err) => Err(format!("{err:?}")),
        }
    }

    fn some(label: &str, key: &str) -> Result<Option<(String, String)>, String> {
        Ok(Some((label.to_owned(), key.to_owned())))
    }

    #[test]
    fn the_first_present_source_wins() {
        let list = sources(&[
            header("idempotency-key"),
            header("x-request-id"),
            KeySource::Query("request_id".to_owned()),
        ]);
        let both = headers(&[("x-request-id", "r1"), ("idempotency-key", "k1")]);
        assert_eq!(
            found(&list, &both, None, None),
            some("header:idempotency-key", "k1")
        );
        let second = headers(&[("x-request-id", "r1")]);
        assert_eq!(
            found(&list, &second, Some("request_id=q1"), None),
            some("header:x-request-id", "r1")
        );
        assert_eq!(
            found(
                &list,
                &HeaderMap::new(),
                Some("a=1&request_id=q%2D1&b"),
                None
            ),
            some("query:request_id", "q-1")
        );
        assert_eq!(
            found(&list, &HeaderMap::new(), Some("other=1"), None),
            Ok(None)
        );
        assert_eq!(found(&list, &HeaderMap::new(), None, None), Ok(None));
    }

    #[test]
    fn a_bad_present_source_stops_the_search() {
        let list = sources(&[
            header("idempotency-key"),
            KeySource::Query("request_id".to_owned()),
        ]);
        let twice = headers(&[("idempotency-key", "a"), ("idempotency-key", "b")]);
        assert_eq!(
            found(&list, &twice, Some("request_id=fine"), None),
            Err("Repeated".to_owned())
        );
        let none = HeaderMap::new();
        for (query, err) in [
            ("request_id=a&request_id=a", "Repeated"),
            ("request_id=", "Empty"),
            ("request_id", "Empty"),
            ("request_id=a+b", "BadCharacter"),
            ("request_id=a%2Cb", "BadCharacter"),
            ("request_id=caf%C3%A9", "BadCharacter"),
            ("request_id=%FF", "BadCharacter"),
        ] {
            assert_eq!(
                found(&list, &none, Some(query), None),
                Err(err.to_owned()),
                "{query}"
            );
        }
        // The sf-string form is for headers: a quoted query value keeps its quotes.
        assert_eq!(
            found(&list, &none, Some("request_id=%22q%22"), None),
            some("query:request_id", "\"q\"")
        );
    }

    #[test]
    fn json_sources_read_json_bodies_only() {
        let list = sources(&[header("idempotency-key"), json("/payment/reference")]);
        let ct = headers(&[("content-type", "application/json; charset=utf-8")]);
        let body = br#"{"payment":{"reference":"ord-7"}}"#;
        assert_eq!(found(&list, &ct, None, None), Err("needs body".to_owned()));
        assert_eq!(
            found(&list, &ct, None, Some(body)),
            some("json:/payment/reference", "ord-7")
        );
        // A header before it needs no body.
        let keyed = headers(&[("idempotency-key", "k")]);
        assert_eq!(
            found(&list, &keyed, None, None),
            some("header:idempotency-key", "k")
        );
        for content_type in [
            "application/vnd.api+json",
            "Application/JSON",
            "text/x+json",
        ] {
            let hs = headers(&[("content-type", content_type)]);
            assert_eq!(
                found(&list, &hs, None, Some(body)),
                some("json:/payment/reference", "ord-7"),
                "{content_type}"
            );
        }
        for content_type in ["text/plain", "text/json", "application/jsonx", "json"] {
            let hs = headers(&[("content-type", content_type)]);
            assert_eq!(
                found(&list, &hs, None, Some(body)),
                Ok(None),
                "{content_type}"
            );
        }
        assert_eq!(found(&list, &HeaderMap::new(), None, Some(body)), Ok(None));
        assert_eq!(found(&list, &ct, None, Some(b"{not json")), Ok(None));
        assert_eq!(
            found(&list, &ct, None, Some(br#"{"payment":{}}"#)),
            Ok(None)
        );
    }

    #[test]
    fn json_values_are_strings_or_integers() {
        let list = sources(&[json("/id")]);
        let ct = headers(&[("content-type", "application/json")]);
        let at = |body: &str| found(&list, &ct, None, Some(body.as_bytes()));
        assert_eq!(at(r#"{"id":"abc"}"#), some("json:/id", "abc"));
        assert_eq!(at(r#"{"id":42}"#), some("json:/id", "42"));
        assert_eq!(at(r#"{"id":-7}"#), some("json:/id", "-7"));
        assert_eq!(
            at(r#"{"id":18446744073709551615}"#),
            some("json:/id", "18446744073709551615")
        );
        // Quotes inside a JSON string are the key's own characters.
        assert_eq!(at(r#"{"id":"\"q\""}"#), some("json:/id", "\"q\""));
        for bad in [
            r#"{"id":1.5}"#,
            r#"{"id":1.0}"#,
            r#"{"id":1e3}"#,
            r#"{"id":true}"#,
            r#"{"id":null}"#,
            r#"{"id":{}}"#,
            r#"{"id":["a"]}"#,
        ] {
            assert_eq!(at(bad), Err("NotStringOrInteger".to_owned()), "{bad}");
        }
        assert_eq!(at(r#"{"id":""}"#), Err("Empty".to_owned()));
        assert_eq!(at(r#"{"id":"a b"}"#), Err("BadCharacter".to_owned()));
        assert_eq!(
            at(&format!(r#"{{"id":"{}"}}"#, "x".repeat(256))),
            Err("TooLong".to_owned())
        );
    }

    #[test]
    fn the_fingerprint_source_is_always_present() {
        let list = sources(&[
            header("x-request-id"),
            KeySource::Fingerprint(Duration::from_secs(120)),
        ]);
        let none = HeaderMap::new();
        assert_eq!(
            found(&list, &none, None, None),
            Err("needs body".to_owned())
        );
        assert_eq!(
            found(&list, &none, None, Some(b"")),
            some("fingerprint", "")
        );
        let keyed = headers(&[("x-request-id", "r")]);
        assert_eq!(
            found(&list, &keyed, None, None),
            some("header:x-request-id", "r")
        );
    }

    #[test]
    fn an_address_hashed_from_the_label_in_parts_is_the_whole_labels() {
        use crate::idempotency::key::{Scope, ScopedKey};
        let headers = HeaderMap::new();
        let scope = Scope {
            headers: &[],
            cookies: &[],
            principal: None,
        };
        let key = crate::idempotency::key::parse_plain(b"k-1").expect("a key");
        for source in [
            header("idempotency-key"),
            header("x-request-id"),
            KeySource::Query("ref".to_owned()),
            json("/a~1b"),
            KeySource::Fingerprint(Duration::from_secs(1)),
        ] {
            assert_eq!(
                ScopedKey::scoped_in_parts(&headers, scope, source.label_parts(), &key),
                ScopedKey::scoped(&headers, scope, &source.label(), &key),
                "{}",
                source.label()
            );
        }
        // The split is not a second separator: "query:" + "ab" is "query:a" + "b".
        assert_eq!(
            ScopedKey::scoped_in_parts(&headers, scope, ["query:", "ab"], &key),
            ScopedKey::scoped_in_parts(&headers, scope, ["query:a", "b"], &key)
        );
    }

    #[test]
    fn labels_name_the_source() {
        assert_eq!(header("x-request-id").label(), "header:x-request-id");
        assert_eq!(KeySource::Query("Ref".to_owned()).label(), "query:Ref");
        assert_eq!(json("/a~1b").label(), "json:/a~1b");
        assert_eq!(
            KeySource::Fingerprint(Duration::from_secs(1)).label(),
            "fingerprint"
        );
        assert_eq!(header("x-request-id").describe(), "the X-Request-Id header");
    }

    proptest::proptest! {
        /// Whatever the head and body, the sources find a key, none, or a clear error;
        /// a key found always has the key syntax.
        #[test]
        fn finding_never_panics(
            raw_header in proptest::collection::vec(0u8..=255, 0..20),
            query in "[a-z_=&%0-9A-F+]{0,24}",
            body in proptest::collection::vec(0u8..=255, 0..40),
            json_text in "\\{\"id\": ?(\"[ -~]{0,8}\"|-?[0-9]{1,22}(\\.[0-9])?|true|null|\\[\\]|\\{\\})\\}",
        ) {
            let list = sources(&[
                header("x-request-id"),
                KeySource::Query("id".to_owned()),
                json("/id"),
                KeySource::Fingerprint(Duration::from_secs(1)),
            ]);
            let mut hs = headers(&[("content-type", "application/json")]);
            if let Ok(value) = HeaderValue::from_bytes(&raw_header) {
                hs.insert("x-request-id", value);
            }
            for body in [&body[..], json_text.as_bytes()] {
                let body = Body::new(body);
                let offered = Offered { headers: &hs, query: Some(&query), body: Some(&body) };
                if let Ok(Found::Key(_, key)) = find(&list, offered) {
                    let k = key.as_str();
                    proptest::prop_assert!(!k.is_empty() && k.len() <= 255);
                    proptest::prop_assert!(k.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b','));
                }
            }
        }
    }
}
