//! The request fingerprint: what makes a retry "the same request" (docs/behaviour.md §3,
//! §10).

use http::{HeaderMap, Method};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::body::Body;
use super::key::{hash_field, hash_header, hex};
use super::pointer::JsonPointer;
pub use super::rules::{BodyForm, FingerprintRules};
use super::rules::{KeptRules, Rules};

/// sha256 over method, path (and query), the `fingerprint_headers` and the body, and
/// the rules that chose what it covers (docs/behaviour.md §24).
///
/// Two fingerprints are equal when their digests are: the rules say how a digest was
/// made, so that a retry can be fingerprinted again under its record's rules before the
/// two are compared (`proxy/claim.rs`), not what it is.
#[derive(Clone, Copy)]
pub struct Fingerprint {
    digest: [u8; 32],
    /// `None` in a record written before records kept their rules: compared under the
    /// rules in force.
    rules: Option<Rules>,
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Eq for Fingerprint {}

impl std::hash::Hash for Fingerprint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

impl Fingerprint {
    /// Under [`FingerprintRules::raw`] this hashes exactly what idemgate always hashed,
    /// so records stored before `fingerprint_*` existed keep matching their retries.
    pub fn new(
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        rules: &FingerprintRules<'_>,
        body: &[u8],
    ) -> Self {
        Self::of(method, path_and_query, headers, rules, Body::new(body))
    }

    /// [`Fingerprint::new`] of a body whose JSON a key source may have parsed already.
    pub fn of(
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        rules: &FingerprintRules<'_>,
        body: Body<'_>,
    ) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"idemgate-fingerprint-v1");
        hash_target(&mut hash, method, path_and_query, headers, rules);
        // Canonical JSON is itself JSON and a body that falls back to raw is not, so
        // the two kinds of body bytes cannot be mistaken for each other.
        let bytes = body.bytes();
        match rules.body {
            BodyForm::Json => match canonical_json(body.into_i_json(), rules.ignore) {
                Some(canonical) => hash_field(&mut hash, &canonical),
                None => hash_field(&mut hash, bytes),
            },
            BodyForm::Raw => hash_field(&mut hash, bytes),
        }
        Self::made(hash.finalize().into(), rules)
    }

    /// What a streamed request's fingerprint covers before its body is read
    /// (docs/behaviour.md §19): method, path (and query), the `fingerprint_headers` and
    /// the declared length (`None`: chunked). Hashed under a label of its own, so that it
    /// never equals the fingerprint of a buffered request, whatever the bodies.
    pub fn upfront(
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        rules: &FingerprintRules<'_>,
        declared: Option<u64>,
    ) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"idemgate-fingerprint-streamed-v1");
        hash_target(&mut hash, method, path_and_query, headers, rules);
        match declared {
            Some(len) => {
                hash.update([1]);
                hash.update(len.to_be_bytes());
            }
            None => hash.update([0]),
        }
        Self::made(hash.finalize().into(), rules)
    }

    /// A digest made under `rules`, which it keeps (interned).
    fn made(digest: [u8; 32], rules: &FingerprintRules<'_>) -> Self {
        Self {
            digest,
            rules: KeptRules::intern(rules),
        }
    }

    /// A digest whose rules are not known: read from a record that predates them.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self {
            digest: bytes,
            rules: None,
        }
    }

    /// The same digest, made under `rules`.
    pub const fn with_rules(self, rules: Option<Rules>) -> Self {
        Self {
            digest: self.digest,
            rules,
        }
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The rules this fingerprint was made under; `None` when a record predates them.
    pub fn rules(&self) -> Option<Rules> {
        self.rules
    }
}

/// Method, target (without the query under `fingerprint_query: false`) and the
/// `fingerprint_headers`: the head of every fingerprint.
fn hash_target(
    hash: &mut Sha256,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    rules: &FingerprintRules<'_>,
) {
    hash_field(hash, method.as_str().as_bytes());
    let target = if rules.query {
        path_and_query
    } else {
        path_and_query
            .split_once('?')
            .map_or(path_and_query, |(path, _query)| path)
    };
    hash_field(hash, target.as_bytes());
    for name in rules.headers {
        hash_header(hash, headers, name);
    }
}

/// The full fingerprint of a streamed request, computed as its body goes by
/// (docs/behaviour.md §19): its up-front fingerprint, then every body byte, then the
/// number of bytes. Nothing of the body is kept.
#[derive(Clone)]
pub struct StreamedHash {
    hash: Sha256,
    len: u64,
    /// The up-front fingerprint's rules, which the full one is made under too.
    rules: Option<Rules>,
}

impl StreamedHash {
    pub fn new(upfront: &Fingerprint) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"idemgate-fingerprint-streamed-body-v1");
        hash.update(upfront.as_bytes());
        Self {
            hash,
            len: 0,
            rules: upfront.rules,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.hash.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Body bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn finish(mut self) -> Fingerprint {
        self.hash.update(self.len.to_be_bytes());
        Fingerprint {
            digest: self.hash.finalize().into(),
            rules: self.rules,
        }
    }
}

impl std::fmt::Debug for StreamedHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamedHash({} bytes)", self.len)
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({})", &hex(&self.digest)[..12])
    }
}

/// 2^53: integers up to it in magnitude are exactly the ones a double holds one by
/// one. A double of this size may itself be a rounded literal (`9007199254740993.0`),
/// so only integers, which serde_json keeps exact, may reach it.
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;

/// The RFC 8785 form of a body's JSON `value` with the `ignore` pointers removed, or
/// `None` when the body is not I-JSON (it does not parse, or names a member twice: no
/// one canonical form then) or holds a number that canonical form would round.
///
/// JCS writes every number as an IEEE double, so the IDs `9007199254740993` and
/// `9007199254740992` would become one request; a body with a number beyond ±2^53
/// (where doubles stop holding every integer, and where a parsed literal may already
/// have been rounded) is hashed raw instead: never the same request by mistake.
fn canonical_json(value: Option<Value>, ignore: &[JsonPointer]) -> Option<Vec<u8>> {
    let mut value = value?;
    JsonPointer::remove_all(ignore, &mut value);
    if !numbers_are_exact(&value) {
        return None;
    }
    // Room for a typical API body's canonical form in one allocation; it grows for more.
    let mut out = Vec::with_capacity(256);
    super::canonical::write(&value, &mut out);
    Some(out)
}

fn numbers_are_exact(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.unsigned_abs() <= 1 << 53
            } else if let Some(u) = n.as_u64() {
                u <= 1 << 53
            } else {
                n.as_f64().is_some_and(|x| x.abs() < EXACT_INTEGERS)
            }
        }
        Value::Array(items) => items.iter().all(numbers_are_exact),
        Value::Object(members) => members.values().all(numbers_are_exact),
        Value::Null | Value::Bool(_) | Value::String(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use http::header::HeaderName;
    use proptest::prelude::*;

    const CONTENT_TYPE: [HeaderName; 1] = [http::header::CONTENT_TYPE];

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
            &FingerprintRules::raw(&CONTENT_TYPE),
            body,
        )
    }

    fn pointers(texts: &[&str]) -> Vec<JsonPointer> {
        texts
            .iter()
            .map(|text| JsonPointer::parse(text).expect("pointer"))
            .collect()
    }

    /// `POST /charges` with `body` under `fingerprint_body: json` and `ignore`.
    fn json_fp(body: &[u8], ignore: &[JsonPointer]) -> Fingerprint {
        let rules = FingerprintRules {
            body: BodyForm::Json,
            ignore,
            ..FingerprintRules::raw(&[])
        };
        Fingerprint::new(&Method::POST, "/charges", &HeaderMap::new(), &rules, body)
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

    /// The hash input under the defaults, spelt out as before `fingerprint_query`,
    /// `fingerprint_body` and `fingerprint_ignore` existed: stored records must keep
    /// matching their retries after an upgrade.
    #[test]
    fn the_defaults_hash_what_was_always_hashed() {
        let body = br#"{ "b": 1, "a": 2 }"#;
        let mut old = Sha256::new();
        old.update(b"idemgate-fingerprint-v1");
        for field in [&b"POST"[..], b"/charges?x=1"] {
            old.update((field.len() as u64).to_be_bytes());
            old.update(field);
        }
        old.update(1u64.to_be_bytes());
        old.update(16u64.to_be_bytes());
        old.update(b"application/json");
        old.update((body.len() as u64).to_be_bytes());
        old.update(body);
        let old = Fingerprint::from_bytes(old.finalize().into());
        assert_eq!(
            old,
            fp("POST", "/charges?x=1", Some("application/json"), body)
        );
    }

    /// A streamed request's fingerprints never meet a buffered one's, the declared
    /// length counts up front, and the full one covers every byte, however it arrived.
    #[test]
    fn streamed_fingerprints_are_apart_and_cover_every_byte() {
        let rules = FingerprintRules::raw(&CONTENT_TYPE);
        let headers = HeaderMap::new();
        let up = |len| Fingerprint::upfront(&Method::POST, "/docs", &headers, &rules, len);
        let buffered = Fingerprint::new(&Method::POST, "/docs", &headers, &rules, b"");
        assert_ne!(up(None), buffered);
        assert_ne!(up(Some(0)), up(None));
        assert_ne!(up(Some(3)), up(Some(4)));
        let full = |upfront: Fingerprint, pieces: &[&[u8]]| {
            let mut hash = StreamedHash::new(&upfront);
            for piece in pieces {
                hash.update(piece);
            }
            hash.finish()
        };
        let whole = full(up(Some(6)), &[b"abcdef"]);
        assert_eq!(whole, full(up(Some(6)), &[b"ab", b"", b"cdef"]));
        assert_ne!(whole, full(up(Some(6)), &[b"abcdeg"]));
        assert_ne!(whole, full(up(None), &[b"abcdef"]));
        assert_ne!(whole, up(Some(6)));
    }

    #[test]
    fn headers_outside_the_list_do_not_count() {
        let mut headers = HeaderMap::new();
        let rules = FingerprintRules::raw(&CONTENT_TYPE);
        let a = Fingerprint::new(&Method::POST, "/", &headers, &rules, b"x");
        headers.insert("x-trace", HeaderValue::from_static("1"));
        let b = Fingerprint::new(&Method::POST, "/", &headers, &rules, b"x");
        assert_eq!(a, b);
    }

    #[test]
    fn path_and_body_cannot_shift_into_each_other() {
        assert_ne!(fp("POST", "/ab", None, b"c"), fp("POST", "/a", None, b"bc"));
    }

    #[test]
    fn without_the_query_only_method_and_path_count() {
        let rules = FingerprintRules {
            query: false,
            ..FingerprintRules::raw(&[])
        };
        let at = |pq| Fingerprint::new(&Method::POST, pq, &HeaderMap::new(), &rules, b"{}");
        assert_eq!(at("/charges?x=1"), at("/charges?x=2"));
        assert_eq!(at("/charges?x=1"), at("/charges"));
        assert_eq!(at("/charges?"), at("/charges"));
        assert_ne!(at("/charges?x=1"), at("/refunds?x=1"));
        // Without a query the hash is the one the defaults give.
        let plain = FingerprintRules::raw(&[]);
        let without = Fingerprint::new(&Method::POST, "/charges", &HeaderMap::new(), &plain, b"{}");
        assert_eq!(at("/charges?x=1"), without);
    }

    #[test]
    fn json_bodies_are_compared_in_canonical_form() {
        assert_eq!(
            json_fp(br#"{"a":1,"b":[1,2]}"#, &[]),
            json_fp(br#"{ "b": [1, 2], "a": 1.0 }"#, &[])
        );
        assert_eq!(
            json_fp(br#"{"s":"\u00e9\/","n":1e3}"#, &[]),
            json_fp("{\"n\":1000,\"s\":\"é/\"}".as_bytes(), &[])
        );
        assert_ne!(
            json_fp(br#"{"a":1,"b":[1,2]}"#, &[]),
            json_fp(br#"{"a":1,"b":[2,1]}"#, &[])
        );
        assert_ne!(json_fp(br#"{"a":1}"#, &[]), json_fp(br#"{"a":"1"}"#, &[]));
    }

    #[test]
    fn a_body_that_is_not_json_is_hashed_raw() {
        let raw = |body: &[u8]| {
            let rules = FingerprintRules::raw(&[]);
            Fingerprint::new(&Method::POST, "/charges", &HeaderMap::new(), &rules, body)
        };
        for body in [
            &b"amount=10&currency=eur"[..],
            b"{\"a\":1",
            b"",
            b"\xff\xfe",
        ] {
            assert_eq!(json_fp(body, &pointers(&["/a"])), raw(body));
        }
        assert_ne!(json_fp(b"{\"a\":1", &[]), json_fp(b"{\"a\": 1", &[]));
    }

    #[test]
    fn integers_a_double_would_round_keep_the_body_raw() {
        let (a, b) = (br#"{"id":9007199254740993}"#, br#"{"id":9007199254740992}"#);
        assert_ne!(json_fp(a, &[]), json_fp(b, &[]));
        assert_ne!(
            json_fp(a, &[]),
            json_fp(br#"{ "id":9007199254740993}"#, &[])
        );
        let huge = br#"{"id":123456789012345678901234567890}"#;
        assert_ne!(
            json_fp(huge, &[]),
            json_fp(br#"{"id":123456789012345678901234567891}"#, &[])
        );
        // Up to 2^53 every integer is exact, and canonical.
        assert_eq!(
            json_fp(br#"{"id":9007199254740992,"n":-9007199254740991}"#, &[]),
            json_fp(br#"{"n":-9007199254740991.0,"id":9007199254740992}"#, &[])
        );
        // An ignored big number does not stop the rest from being canonical.
        let ignore = pointers(&["/id"]);
        assert_eq!(
            json_fp(br#"{"id":9007199254740993,"a":1}"#, &ignore),
            json_fp(br#"{"a":1.0}"#, &ignore)
        );
    }

    #[test]
    fn ignored_members_and_elements_do_not_count() {
        let ignore = pointers(&["/timestamp", "/items/0/trace", "/a~1b", "/t~0"]);
        assert_eq!(
            json_fp(
                br#"{"amount":10,"timestamp":1,"items":[{"id":1,"trace":"x"}],"a/b":1,"t~":1}"#,
                &ignore
            ),
            json_fp(
                br#"{"items":[{"trace":"y","id":1}],"amount":10,"timestamp":"now"}"#,
                &ignore
            )
        );
        assert_ne!(
            json_fp(br#"{"amount":10,"timestamp":1}"#, &ignore),
            json_fp(br#"{"amount":11,"timestamp":1}"#, &ignore)
        );
        // An element: the rest shifts up, as the pointer says "the first element".
        let first = pointers(&["/1"]);
        assert_eq!(json_fp(b"[1,2,3]", &first), json_fp(b"[1,9,3]", &first));
        assert_ne!(json_fp(b"[1,2,3]", &first), json_fp(b"[1,2,4]", &first));
        // Pointers that address nothing are skipped.
        let nothing = pointers(&["/x/y", "/5", "/-", "/01", "/items/9", "/amount/z"]);
        assert_eq!(
            json_fp(br#"{"amount":10,"items":[1]}"#, &nothing),
            json_fp(br#"{"amount":10,"items":[1]}"#, &[])
        );
        assert_eq!(json_fp(b"[0,1]", &nothing), json_fp(b"[0,1]", &[]));
        // `""` is the whole body.
        let all = pointers(&[""]);
        assert_eq!(json_fp(b"[1]", &all), json_fp(br#"{"a":2}"#, &all));
    }

    /// `[/items/0, /items/1]` leaves out the first two elements as the client sent
    /// them, whatever the order of the list: a body that differs in the third is
    /// another request (removed one after another, the third went instead, and an
    /// amount of 999 was answered with the record of an amount of 100).
    #[test]
    fn ignored_pointers_address_the_body_as_sent() {
        let first = br#"{"items":[{"ts":1},{"trace":"a"},{"amount":100}]}"#;
        let retry = br#"{"items":[{"ts":2},{"trace":"b"},{"amount":100}]}"#;
        let other = br#"{"items":[{"ts":1},{"trace":"a"},{"amount":999}]}"#;
        for ignore in [
            pointers(&["/items/0", "/items/1"]),
            pointers(&["/items/1", "/items/0"]),
            pointers(&["/items/1", "/items/0/ts", "/items/0"]),
        ] {
            assert_ne!(
                json_fp(first, &ignore),
                json_fp(other, &ignore),
                "{ignore:?}"
            );
            assert_eq!(
                json_fp(first, &ignore),
                json_fp(retry, &ignore),
                "{ignore:?}"
            );
            assert_eq!(
                json_fp(first, &ignore),
                json_fp(br#"{"items":[{"amount":100}]}"#, &[]),
                "{ignore:?}"
            );
        }
    }

    /// Parsers disagree on which value of a member named twice counts, so such a body
    /// has no canonical form: it is hashed as its bytes.
    #[test]
    fn a_member_named_twice_keeps_the_body_raw() {
        let twice = br#"{"a":1,"a":2}"#;
        assert_ne!(json_fp(twice, &[]), json_fp(br#"{"a":2}"#, &[]));
        assert_ne!(json_fp(twice, &[]), json_fp(br#"{"a":1}"#, &[]));
        assert_ne!(json_fp(twice, &[]), json_fp(br#"{"a":2,"a":1}"#, &[]));
        let raw = FingerprintRules::raw(&[]);
        let as_bytes = Fingerprint::new(&Method::POST, "/charges", &HeaderMap::new(), &raw, twice);
        assert_eq!(json_fp(twice, &[]), as_bytes);
        // Ignoring the repeated member does not make the body canonical either.
        let ignore = pointers(&["/a"]);
        assert_eq!(json_fp(twice, &ignore), as_bytes);
        let nested = br#"{"x":[{"b":1,"b":1}]}"#;
        assert_ne!(json_fp(nested, &[]), json_fp(br#"{"x":[{"b":1}]}"#, &[]));
    }

    /// JSON values without numbers beyond 2^53, whose canonical form is defined.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-1_000_000i64..1_000_000).prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-z\\u{e9}\\u{1F600}\"\\\\\n]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-e]{1,2}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes `value` with its members in the order `flip` picks and `space` between
    /// every token.
    fn write_shuffled(value: &Value, flip: &mut impl FnMut() -> bool, space: &str) -> String {
        match value {
            Value::Array(items) => {
                let items: Vec<_> = items
                    .iter()
                    .map(|item| write_shuffled(item, flip, space))
                    .collect();
                format!(
                    "[{space}{}{space}]",
                    items.join(&format!("{space},{space}"))
                )
            }
            Value::Object(members) => {
                let mut members: Vec<_> = members
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{}{space}:{space}{}",
                            Value::from(k.as_str()),
                            write_shuffled(v, flip, space)
                        )
                    })
                    .collect();
                if flip() {
                    members.reverse();
                }
                if members.len() > 2 && flip() {
                    members.rotate_left(1);
                }
                format!(
                    "{{{space}{}{space}}}",
                    members.join(&format!("{space},{space}"))
                )
            }
            other => other.to_string(),
        }
    }

    proptest! {
        #[test]
        fn reordering_and_whitespace_do_not_count(
            value in json_value(),
            flips in prop::collection::vec(any::<bool>(), 64),
            space in "[ \t\r\n]{0,3}",
        ) {
            let mut flips = flips.into_iter().cycle();
            let compact = serde_json::to_vec(&value).expect("json");
            let other = write_shuffled(&value, &mut || flips.next().unwrap_or(false), &space);
            prop_assert_eq!(json_fp(&compact, &[]), json_fp(other.as_bytes(), &[]));
        }

        /// The order of `fingerprint_ignore` never matters.
        #[test]
        fn the_order_of_ignored_pointers_does_not_count(
            value in json_value(),
            texts in prop::collection::vec("(/(0|1|2|a|b)){1,3}", 1..5),
            rotate in any::<prop::sample::Index>(),
        ) {
            let body = serde_json::to_vec(&value).expect("json");
            let ignore = pointers(&texts.iter().map(String::as_str).collect::<Vec<_>>());
            let mut reordered = ignore.clone();
            reordered.reverse();
            let by = rotate.index(reordered.len());
            reordered.rotate_left(by);
            prop_assert_eq!(json_fp(&body, &ignore), json_fp(&body, &reordered));
        }

        #[test]
        fn changing_a_value_counts_unless_it_is_ignored(
            members in prop::collection::btree_map("[a-e]{1,3}", json_value(), 1..6),
            pick in any::<prop::sample::Index>(),
            replacement in json_value(),
        ) {
            let name = pick.get(&members.keys().cloned().collect::<Vec<_>>()).clone();
            let before = Value::Object(members.clone().into_iter().collect());
            let mut changed = members;
            let original = changed.insert(name.clone(), replacement.clone());
            let after = Value::Object(changed.into_iter().collect());
            let (before, after) = (
                serde_json::to_vec(&before).expect("json"),
                serde_json::to_vec(&after).expect("json"),
            );
            // Equal values (`1` and `1.0`) have one canonical form; anything else differs.
            let same = serde_jcs::to_vec(&original).ok() == serde_jcs::to_vec(&Some(replacement)).ok();
            prop_assert_eq!(json_fp(&before, &[]) == json_fp(&after, &[]), same);
            let ignore = [JsonPointer::parse(&format!("/{name}")).expect("pointer")];
            prop_assert_eq!(json_fp(&before, &ignore), json_fp(&after, &ignore));
        }
    }
}
