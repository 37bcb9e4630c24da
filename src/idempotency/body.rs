//! A guarded request's body, read whole: its bytes, and its JSON value parsed at most
//! once, on first need, whether a `json` key source (docs/behaviour.md §9) or a canonical
//! fingerprint (docs/behaviour.md §10) asks first.

use std::cell::{Cell, OnceCell};
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

#[derive(Debug)]
pub struct Body<'a> {
    bytes: &'a [u8],
    json: OnceCell<Option<Json>>,
}

/// A body that parsed as JSON.
#[derive(Debug)]
struct Json {
    value: Value,
    /// Whether some object names a member twice. Such a body is not I-JSON (RFC 7493):
    /// parsers disagree on which value counts (`value` keeps the last), so it has no
    /// one canonical form.
    repeats_a_name: bool,
}

impl<'a> Body<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            json: OnceCell::new(),
        }
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The body as JSON, or `None` when it does not parse. A member named twice in an
    /// object has its last value, as `serde_json` reads it.
    pub fn json(&self) -> Option<&Value> {
        self.json
            .get_or_init(|| parse(self.bytes))
            .as_ref()
            .map(|json| &json.value)
    }

    /// The JSON value to keep (the fingerprint removes its ignored parts from it), from
    /// the parse already made if there was one; `None` unless the body is I-JSON: it
    /// does not parse, or an object in it names a member twice.
    pub fn into_i_json(self) -> Option<Value> {
        let json = match self.json.into_inner() {
            Some(parsed) => parsed,
            None => parse(self.bytes),
        }?;
        (!json.repeats_a_name).then_some(json.value)
    }
}

fn parse(bytes: &[u8]) -> Option<Json> {
    let repeats = Cell::new(false);
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = Noting { repeats: &repeats }
        .deserialize(&mut deserializer)
        .ok()?;
    deserializer.end().ok()?;
    Some(Json {
        value,
        repeats_a_name: repeats.get(),
    })
}

/// Builds the [`Value`] that `serde_json::from_slice` builds (through the same
/// deserializer, so with its nesting limit), noting in `repeats` a member name given
/// twice in one object, which `serde_json` passes over in silence.
#[derive(Clone, Copy)]
struct Noting<'c> {
    repeats: &'c Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for Noting<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Noting<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // A parsed number is always finite.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            if members.insert(name, value).is_some() {
                self.repeats.set(true);
            }
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn parsed_once_and_kept() {
        let body = Body::new(br#"{"a":1}"#);
        let first: *const Value = body.json().expect("json");
        let again: *const Value = body.json().expect("json");
        assert_eq!(first, again, "the same parse");
        assert_eq!(body.into_i_json(), Some(json!({"a": 1})));
        assert_eq!(Body::new(b"{").json(), None);
        assert_eq!(Body::new(b"[1] x").json(), None, "trailing characters");
        assert_eq!(Body::new(b"[1]").into_i_json(), Some(json!([1])));
    }

    #[test]
    fn a_member_named_twice_is_json_but_not_i_json() {
        for text in [
            &br#"{"a":1,"a":2}"#[..],
            br#"{"a":2,"a":2}"#,
            br#"[{"x":{"b":[],"b":[]}}]"#,
            br#"{"a":1,"\u0061":2}"#,
        ] {
            let body = Body::new(text);
            assert!(body.json().is_some(), "{}", String::from_utf8_lossy(text));
            assert_eq!(body.into_i_json(), None);
            assert_eq!(Body::new(text).into_i_json(), None, "without a parse first");
        }
        // The last value, as serde_json has it, for a key source.
        assert_eq!(
            Body::new(br#"{"a":1,"a":2}"#).json(),
            Some(&json!({"a": 2}))
        );
        // One name in two objects is no repeat.
        let body = br#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#;
        assert!(Body::new(body).into_i_json().is_some());
    }

    proptest! {
        /// The value is serde_json's own, whatever the text, and nesting past its limit
        /// is refused as it refuses it.
        #[test]
        fn the_value_is_serde_jsons(
            text in r#"[\[\]{}",:0-9.eE+\- a-c\\]{0,40}"#,
            depth in 0usize..300,
        ) {
            let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            for text in [text.as_bytes(), deep.as_bytes()] {
                let theirs: Option<Value> = serde_json::from_slice(text).ok();
                let body = Body::new(text);
                prop_assert_eq!(body.json(), theirs.as_ref());
            }
        }
    }
}
