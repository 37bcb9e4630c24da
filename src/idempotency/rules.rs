//! What a fingerprint covers (docs/behaviour.md §10): a policy's `fingerprint_body`,
//! `fingerprint_query`, `fingerprint_headers` and `fingerprint_ignore`, borrowed from the
//! policy ([`FingerprintRules`]), and owned as a record keeps them ([`KeptRules`]), so that
//! a retry is compared under its record's rules rather than those in force when it
//! arrives (§24).
//!
//! Every [`Fingerprint`](super::Fingerprint) says which rules made it, so the rules
//! travel with it into the marker and the record without a field of their own to forget.
//! That needs them `Copy`: each distinct set is interned once per process, and a
//! fingerprint holds a `&'static` to it. A process meets few distinct sets (one per
//! policy and per configuration it ever loaded, and those of the records it reads, which
//! only idemgate writes), so the table is small; it is capped all the same, and a set
//! past the cap is refused as unreadable rather than kept.
//!
//! In a record the rules take one byte when they are the defaults (`raw`, the query,
//! `[content-type]`, nothing ignored), and otherwise:
//!
//! ```text
//! [0] 1   [1] flags: bit 0 = query, bit 1 = json
//! [2] header count, then per header: u8 len, name (lowercase)
//! then pointer count (u8), then per pointer: u16 len, pointer as written
//! ```

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{LazyLock, RwLock};

use bytes::{Buf, BufMut, Bytes};
use http::header::{self, HeaderName};

use super::pointer::JsonPointer;

/// How a body enters the fingerprint (`fingerprint_body`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyForm {
    /// The bytes as sent.
    Raw,
    /// The RFC 8785 canonical form when the body is I-JSON (RFC 7493: it parses, and
    /// no object in it names a member twice), else the bytes.
    Json,
}

/// What of a request its fingerprint covers: a policy's `fingerprint_*` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FingerprintRules<'a> {
    /// Request headers hashed besides method, path and body.
    pub headers: &'a [HeaderName],
    /// Whether the query string counts; `false` hashes the path alone.
    pub query: bool,
    pub body: BodyForm,
    /// Parts of a JSON body left out (`BodyForm::Json` only).
    pub ignore: &'a [JsonPointer],
}

impl<'a> FingerprintRules<'a> {
    /// The original fingerprint: query included, body bytes as sent
    /// (docs/behaviour.md §3).
    pub const fn raw(headers: &'a [HeaderName]) -> Self {
        Self {
            headers,
            query: true,
            body: BodyForm::Raw,
            ignore: &[],
        }
    }
}

/// What a record keeps of the rules that made its fingerprint.
#[derive(Debug, PartialEq, Eq)]
pub struct KeptRules {
    headers: Vec<HeaderName>,
    query: bool,
    body: BodyForm,
    ignore: Vec<JsonPointer>,
}

/// A handle on an interned [`KeptRules`]: copied with the fingerprint it describes.
pub type Rules = &'static KeptRules;

/// At most this many distinct sets are interned per process.
const MAX_INTERNED: usize = 4096;

/// Every set interned so far, by a hash of its contents.
static INTERNED: LazyLock<RwLock<HashMap<u64, Vec<Rules>>>> = LazyLock::new(Default::default);

thread_local! {
    /// The set this thread interned or found last.
    static LAST: std::cell::Cell<Option<Rules>> = const { std::cell::Cell::new(None) };
}

/// The tag of the defaults in a record, and of the explicit form.
const DEFAULTS: u8 = 0;
const EXPLICIT: u8 = 1;

impl KeptRules {
    /// The rules as a fingerprint reads them.
    pub fn as_rules(&self) -> FingerprintRules<'_> {
        FingerprintRules {
            headers: &self.headers,
            query: self.query,
            body: self.body,
            ignore: &self.ignore,
        }
    }

    /// The interned copy of `rules`, made on first sight; `None` past [`MAX_INTERNED`]
    /// distinct sets.
    pub fn intern(rules: &FingerprintRules<'_>) -> Option<Rules> {
        // Every request is fingerprinted, nearly always under the rules of the one before
        // on its thread: compared field by field, those need neither the hash nor the lock.
        if let Some(last) = LAST.get().filter(|last| last.as_rules() == *rules) {
            return Some(last);
        }
        let found = Self::interned(rules);
        if found.is_some() {
            LAST.set(found);
        }
        found
    }

    /// [`KeptRules::intern`] without the thread's last set.
    fn interned(rules: &FingerprintRules<'_>) -> Option<Rules> {
        let hash = digest(rules);
        let find = |sets: &Vec<Rules>| sets.iter().copied().find(|kept| kept.as_rules() == *rules);
        if let Some(found) = read().get(&hash).and_then(find) {
            return Some(found);
        }
        let mut table = INTERNED
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = table.get(&hash).and_then(find) {
            return Some(found);
        }
        if table.values().map(Vec::len).sum::<usize>() >= MAX_INTERNED {
            return None;
        }
        let kept: Rules = Box::leak(Box::new(KeptRules {
            headers: rules.headers.to_vec(),
            query: rules.query,
            body: rules.body,
            ignore: rules.ignore.to_vec(),
        }));
        table.entry(hash).or_default().push(kept);
        Some(kept)
    }

    fn is_default(&self) -> bool {
        self.query
            && self.body == BodyForm::Raw
            && self.ignore.is_empty()
            && self.headers == [header::CONTENT_TYPE]
    }

    /// The bytes [`KeptRules::decode`] reads back.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        if self.is_default() {
            out.put_u8(DEFAULTS);
            return;
        }
        out.put_u8(EXPLICIT);
        out.put_u8(u8::from(self.query) | (u8::from(self.body == BodyForm::Json) << 1));
        // The configuration caps what a policy may list far below these widths
        // (docs/behaviour.md §10); saturating keeps a bad count detectable on decode.
        out.put_u8(u8::try_from(self.headers.len()).unwrap_or(u8::MAX));
        for name in &self.headers {
            let name = name.as_str().as_bytes();
            let name = &name[..name.len().min(usize::from(u8::MAX))];
            out.put_u8(u8::try_from(name.len()).unwrap_or(u8::MAX));
            out.put_slice(name);
        }
        out.put_u8(u8::try_from(self.ignore.len()).unwrap_or(u8::MAX));
        for pointer in &self.ignore {
            let text = pointer.as_str().as_bytes();
            let text = &text[..text.len().min(usize::from(u16::MAX))];
            out.put_u16(u16::try_from(text.len()).unwrap_or(u16::MAX));
            out.put_slice(text);
        }
    }

    /// Reads rules written by [`KeptRules::encode_into`] off the front of `buf`.
    pub fn decode(buf: &mut Bytes) -> Result<Rules, RulesError> {
        let tag = byte(buf)?;
        let (headers, query, body, ignore) = match tag {
            DEFAULTS => (vec![header::CONTENT_TYPE], true, BodyForm::Raw, Vec::new()),
            EXPLICIT => {
                let flags = byte(buf)?;
                if flags > 3 {
                    return Err(RulesError::Invalid("flags"));
                }
                let body = if flags & 2 == 2 {
                    BodyForm::Json
                } else {
                    BodyForm::Raw
                };
                let count = byte(buf)?;
                let mut headers = Vec::with_capacity(usize::from(count));
                for _ in 0..count {
                    let len = usize::from(byte(buf)?);
                    let name = take(buf, len)?;
                    let name = HeaderName::from_bytes(&name)
                        .map_err(|_| RulesError::Invalid("header name"))?;
                    headers.push(name);
                }
                let count = byte(buf)?;
                let mut ignore = Vec::with_capacity(usize::from(count));
                for _ in 0..count {
                    if buf.remaining() < 2 {
                        return Err(RulesError::Truncated);
                    }
                    let len = usize::from(buf.get_u16());
                    let text = take(buf, len)?;
                    let text =
                        std::str::from_utf8(&text).map_err(|_| RulesError::Invalid("pointer"))?;
                    let pointer =
                        JsonPointer::parse(text).map_err(|_| RulesError::Invalid("pointer"))?;
                    ignore.push(pointer);
                }
                (headers, flags & 1 == 1, body, ignore)
            }
            _ => return Err(RulesError::Invalid("tag")),
        };
        let rules = FingerprintRules {
            headers: &headers,
            query,
            body,
            ignore: &ignore,
        };
        Self::intern(&rules).ok_or(RulesError::TooMany)
    }

    /// The rules as `GET /keys/{id}` shows them (docs/behaviour.md §24).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "body": match self.body {
                BodyForm::Raw => "raw",
                BodyForm::Json => "json",
            },
            "query": self.query,
            "headers": self.headers.iter().map(HeaderName::as_str).collect::<Vec<_>>(),
            "ignore": self.ignore.iter().map(JsonPointer::as_str).collect::<Vec<_>>(),
        })
    }
}

/// Why the rules in a record do not read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    #[error("its fingerprint rules are truncated")]
    Truncated,
    #[error("its fingerprint rules hold an invalid {0}")]
    Invalid(&'static str),
    #[error("it names more distinct fingerprint rules than one process keeps")]
    TooMany,
}

fn read() -> std::sync::RwLockReadGuard<'static, HashMap<u64, Vec<Rules>>> {
    INTERNED
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A hash of the rules' contents, without building them.
fn digest(rules: &FingerprintRules<'_>) -> u64 {
    let mut hash = DefaultHasher::new();
    rules.headers.hash(&mut hash);
    rules.query.hash(&mut hash);
    matches!(rules.body, BodyForm::Json).hash(&mut hash);
    for pointer in rules.ignore {
        pointer.as_str().hash(&mut hash);
    }
    hash.finish()
}

fn byte(buf: &mut Bytes) -> Result<u8, RulesError> {
    if buf.has_remaining() {
        Ok(buf.get_u8())
    } else {
        Err(RulesError::Truncated)
    }
}

fn take(buf: &mut Bytes, n: usize) -> Result<Bytes, RulesError> {
    if buf.remaining() < n {
        return Err(RulesError::Truncated);
    }
    Ok(buf.split_to(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules<'a>(
        headers: &'a [HeaderName],
        query: bool,
        body: BodyForm,
        ignore: &'a [JsonPointer],
    ) -> FingerprintRules<'a> {
        FingerprintRules {
            headers,
            query,
            body,
            ignore,
        }
    }

    fn round_trip(rules: &FingerprintRules<'_>) -> (Rules, usize) {
        let kept = KeptRules::intern(rules).expect("few sets");
        let mut out = Vec::new();
        kept.encode_into(&mut out);
        let len = out.len();
        let mut buf = Bytes::from(out);
        let back = KeptRules::decode(&mut buf).expect("reads back");
        assert!(!buf.has_remaining());
        (back, len)
    }

    #[test]
    fn the_defaults_take_one_byte_and_read_back_as_the_same_interned_set() {
        let headers = [header::CONTENT_TYPE];
        let defaults = rules(&headers, true, BodyForm::Raw, &[]);
        let (back, len) = round_trip(&defaults);
        assert_eq!(len, 1);
        assert!(std::ptr::eq(
            back,
            KeptRules::intern(&defaults).expect("few")
        ));
        assert_eq!(back.as_rules(), defaults);
    }

    #[test]
    fn explicit_rules_read_back_whole() {
        let headers = [HeaderName::from_static("x-tenant"), header::CONTENT_TYPE];
        let ignore = [
            JsonPointer::parse("/request_id").expect("pointer"),
            JsonPointer::parse("/a~1b/0").expect("pointer"),
        ];
        let given = rules(&headers, false, BodyForm::Json, &ignore);
        let (back, len) = round_trip(&given);
        assert!(len > 1);
        assert_eq!(back.as_rules(), given);
        let none = rules(&[], true, BodyForm::Raw, &[]);
        assert_eq!(round_trip(&none).0.as_rules(), none);
    }

    /// The thread's last set answers only rules equal to it: alternating sets each find
    /// their own, the one allocation per set.
    #[test]
    fn alternating_rules_each_find_their_own_set() {
        let headers = [header::CONTENT_TYPE];
        let a = rules(&headers, true, BodyForm::Raw, &[]);
        let b = rules(&headers, false, BodyForm::Raw, &[]);
        let first_a = KeptRules::intern(&a).expect("few");
        let first_b = KeptRules::intern(&b).expect("few");
        for _ in 0..3 {
            let (again_a, again_b) = (KeptRules::intern(&a), KeptRules::intern(&b));
            assert!(again_a.is_some_and(|r| std::ptr::eq(r, first_a)));
            assert!(again_b.is_some_and(|r| std::ptr::eq(r, first_b)));
        }
        assert!(!std::ptr::eq(first_a, first_b));
        assert_eq!(first_b.as_rules(), b);
    }

    #[test]
    fn bad_bytes_are_refused_never_misread() {
        for bad in [
            &b""[..],
            &[2],
            &[1],
            &[1, 4, 0, 0],
            &[1, 1, 1, 3, b'a', b'b'],
            &[1, 1, 1, 2, b'a', b' ', 0],
            &[1, 3, 0, 1, 0, 1, b'x'],
        ] {
            let mut buf = Bytes::copy_from_slice(bad);
            assert!(KeptRules::decode(&mut buf).is_err(), "{bad:?}");
        }
    }
}
