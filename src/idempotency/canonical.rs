//! The RFC 8785 canonical form (JSON Canonicalization Scheme) of a parsed JSON value,
//! written straight into one buffer.
//!
//! serde_jcs produced the same bytes but cost about ten times a plain `serde_json`
//! serialisation (it re-serialises every object through a sorting serializer), which
//! made a canonical fingerprint the largest cost of a `json` key source (issue 11,
//! BENCHMARKS.md). This writer walks the value once:
//!
//! - members in the order of their names' UTF-16 code units (RFC 8785 §3.2.3).
//!   `serde_json`'s map is ordered by UTF-8 bytes, which is code point order; the two
//!   orders differ only between a name with a character above U+FFFF and one with a
//!   character in U+E000..U+FFFF, so members are re-sorted only when a name is not ASCII;
//! - strings with only `"`, `\` and the control characters escaped, as ECMAScript's
//!   `JSON.stringify` does (§3.2.2.2);
//! - numbers as ECMAScript prints a double (§3.2.2.3): integers (which the caller keeps
//!   within ±2^53, where doubles hold them exactly) as their digits, other numbers
//!   through `ryu-js`, the ECMAScript number formatting serde_jcs used too.
//!
//! A property test holds it to serde_jcs's output for arbitrary values.

use std::cmp::Ordering;

use serde_json::{Map, Value};

/// Appends the canonical form of `value` to `out`.
pub(crate) fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
            } else if let Some(u) = n.as_u64() {
                out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
            } else if let Some(f) = n.as_f64() {
                // `-0` prints as `0`, as in ECMAScript; a parsed number is always finite.
                out.extend_from_slice(ryu_js::Buffer::new().format(f).as_bytes());
            }
        }
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => object(members, out),
    }
}

fn object(members: &Map<String, Value>, out: &mut Vec<u8>) {
    out.push(b'{');
    if members.keys().all(|name| name.is_ascii()) {
        // Already in code unit order: for ASCII, UTF-8 bytes and UTF-16 units agree.
        for (i, (name, value)) in members.iter().enumerate() {
            member(i, name, value, out);
        }
    } else {
        let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
        sorted.sort_by(|(a, _), (b, _)| utf16_order(a, b));
        for (i, (name, value)) in sorted.into_iter().enumerate() {
            member(i, name, value, out);
        }
    }
    out.push(b'}');
}

fn member(i: usize, name: &str, value: &Value, out: &mut Vec<u8>) {
    if i > 0 {
        out.push(b',');
    }
    string(name, out);
    out.push(b':');
    write(value, out);
}

fn utf16_order(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// A JSON string as `JSON.stringify` writes it: runs of plain bytes copied whole.
fn string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0x00..=0x1f => &[],
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain..i]);
        if escaped.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escaped);
        }
        plain = i + 1;
    }
    out.extend_from_slice(&bytes[plain..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn canonical(value: &Value) -> String {
        let mut out = Vec::new();
        write(value, &mut out);
        String::from_utf8(out).expect("UTF-8 in, UTF-8 out")
    }

    #[test]
    fn the_examples_of_rfc_8785() {
        // §3.2.2: literals, numbers, strings with escapes.
        let value: Value = serde_json::from_str(
            r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],
                "string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                "literals":[null,true,false]}"#,
        )
        .expect("JSON");
        assert_eq!(
            canonical(&value),
            "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\
             \"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"
        );
        // §3.2.3: sorted by UTF-16 code units, where U+1F600 (a surrogate pair) sorts
        // before U+FB33 although its UTF-8 is greater.
        let value: Value = serde_json::from_str(
            r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#,
        )
        .expect("JSON");
        let order: Vec<String> = canonical(&value)
            .split("\":\"")
            .skip(1)
            .map(|s| s.split('"').next().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(
            order,
            [
                "Carriage Return",
                "One",
                "Control",
                "Latin Small Letter O With Diaeresis",
                "Euro Sign",
                "Emoji: Grinning Face",
                "Hebrew Letter Dalet With Dagesh",
            ]
        );
    }

    #[test]
    fn numbers_print_as_ecmascript_does() {
        for (value, text) in [
            (json!(0), "0"),
            (json!(-0.0), "0"),
            (json!(2.0), "2"),
            (json!(-7), "-7"),
            (json!(9_007_199_254_740_992_u64), "9007199254740992"),
            (json!(1e21), "1e+21"),
            (json!(1e20), "100000000000000000000"),
            (json!(0.1), "0.1"),
            (json!(5e-324), "5e-324"),
        ] {
            assert_eq!(canonical(&value), text, "{value}");
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let number = prop_oneof![
            any::<i64>().prop_map(|i| json!(i % (1 << 53))),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            number,
            any::<String>().prop_map(Value::String),
            "[\u{0}-\u{1f}\"\\\\a-z\u{7f}-\u{10ffff}]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        any::<String>(),
                        "[a-z\u{e000}-\u{ffff}\u{10000}-\u{10ffff}]{0,3}"
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Byte for byte what serde_jcs wrote, so fingerprints stored before this writer
        /// still match their retries.
        #[test]
        fn writes_what_serde_jcs_wrote(value in json_value()) {
            let mut ours = Vec::new();
            write(&value, &mut ours);
            prop_assert_eq!(ours, serde_jcs::to_vec(&value).expect("serialisable"));
        }
    }
}
