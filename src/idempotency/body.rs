//! A guarded request's body, read whole: its bytes, and its JSON value parsed at most
//! once, on first need, whether a `json` key source (SPEC §9) or a canonical
//! fingerprint (SPEC §10) asks first.

use std::cell::OnceCell;

use serde_json::Value;

#[derive(Debug)]
pub struct Body<'a> {
    bytes: &'a [u8],
    json: OnceCell<Option<Value>>,
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

    /// The body as JSON, or `None` when it does not parse.
    pub fn json(&self) -> Option<&Value> {
        self.json
            .get_or_init(|| serde_json::from_slice(self.bytes).ok())
            .as_ref()
    }

    /// The JSON value to keep (the fingerprint removes its ignored parts from it), from
    /// the parse already made if there was one.
    pub fn into_json(self) -> Option<Value> {
        match self.json.into_inner() {
            Some(parsed) => parsed,
            None => serde_json::from_slice(self.bytes).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsed_once_and_kept() {
        let body = Body::new(br#"{"a":1}"#);
        let first: *const Value = body.json().expect("json");
        let again: *const Value = body.json().expect("json");
        assert_eq!(first, again, "the same parse");
        assert_eq!(body.into_json(), Some(serde_json::json!({"a": 1})));
        assert_eq!(Body::new(b"{").json(), None);
        assert_eq!(Body::new(b"[1]").into_json(), Some(serde_json::json!([1])));
    }
}
