//! RFC 6901 JSON Pointers: the parts of a JSON body that a key source reads (SPEC §9)
//! and that a fingerprint leaves out (SPEC §10).

use serde_json::Value;

/// An RFC 6901 JSON Pointer (`/amount`, `/items/0/id`, `/a~1b` for the member `a/b`),
/// checked when the configuration loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer {
    text: String,
    /// The reference tokens, `~1` and `~0` decoded; none for `""`, the whole body.
    tokens: Vec<String>,
}

/// Why a string is not a JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointerError {
    #[error("'{0}' is not a JSON Pointer: it must be \"\" or start with '/'")]
    NoLeadingSlash(String),
    #[error("'{0}' is not a JSON Pointer: '~' must be followed by 0 or 1 (write ~0 for '~')")]
    BadEscape(String),
}

impl JsonPointer {
    pub fn parse(text: &str) -> Result<Self, PointerError> {
        if text.is_empty() {
            return Ok(Self {
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(PointerError::NoLeadingSlash(text.to_owned()));
        };
        let tokens = rest
            .split('/')
            .map(|token| {
                decode_token(token).ok_or_else(|| PointerError::BadEscape(text.to_owned()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            text: text.to_owned(),
            tokens,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value the pointer addresses in `root`, if there is one.
    pub fn resolve<'v>(&self, root: &'v Value) -> Option<&'v Value> {
        self.tokens
            .iter()
            .try_fold(root, |value, token| match value {
                Value::Object(members) => members.get(token),
                Value::Array(items) => array_index(token).and_then(|i| items.get(i)),
                _ => None,
            })
    }

    /// Removes the member or array element the pointer addresses, if there is one;
    /// `""` addresses the whole body, which then counts as `null`.
    pub(crate) fn remove_from(&self, root: &mut Value) {
        let Some((last, parents)) = self.tokens.split_last() else {
            *root = Value::Null;
            return;
        };
        let mut parent = root;
        for token in parents {
            let child = match parent {
                Value::Object(members) => members.get_mut(token),
                Value::Array(items) => array_index(token).and_then(|i| items.get_mut(i)),
                _ => None,
            };
            let Some(child) = child else { return };
            parent = child;
        }
        match parent {
            Value::Object(members) => {
                members.remove(last);
            }
            Value::Array(items) => {
                if let Some(i) = array_index(last).filter(|i| *i < items.len()) {
                    items.remove(i);
                }
            }
            _ => {}
        }
    }
}

/// `~1` is `/` and `~0` is `~`; any other `~` is an error.
fn decode_token(token: &str) -> Option<String> {
    let mut decoded = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        match c {
            '~' => match chars.next() {
                Some('0') => decoded.push('~'),
                Some('1') => decoded.push('/'),
                _ => return None,
            },
            c => decoded.push(c),
        }
    }
    Some(decoded)
}

/// RFC 6901 array indices: `0`, or digits without a leading zero (`-`, one past the
/// end, addresses nothing that exists).
fn array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn pointers_are_checked() {
        for good in ["", "/", "/a", "/a/0", "/a~0b~1c", "//", "/ä"] {
            assert_eq!(JsonPointer::parse(good).expect(good).as_str(), good);
        }
        assert_eq!(
            JsonPointer::parse("/a~0~1b").expect("pointer").tokens,
            ["a~/b"]
        );
        for bad in ["a", "#/a", " /a"] {
            assert_eq!(
                JsonPointer::parse(bad),
                Err(PointerError::NoLeadingSlash(bad.to_owned()))
            );
        }
        for bad in ["/~", "/a~2", "/~a", "/x/~"] {
            assert_eq!(
                JsonPointer::parse(bad),
                Err(PointerError::BadEscape(bad.to_owned()))
            );
        }
    }

    #[test]
    fn resolves_members_and_elements() {
        let body =
            json!({"payment": {"reference": "r-1", "items": [10, {"id": 7}]}, "a/b": 1, "m~n": 2});
        let at = |text: &str| {
            JsonPointer::parse(text)
                .expect("pointer")
                .resolve(&body)
                .cloned()
        };
        assert_eq!(at("/payment/reference"), Some(json!("r-1")));
        assert_eq!(at("/payment/items/1/id"), Some(json!(7)));
        assert_eq!(at("/a~1b"), Some(json!(1)));
        assert_eq!(at("/m~0n"), Some(json!(2)));
        assert_eq!(at(""), Some(body.clone()));
        for nothing in [
            "/missing",
            "/payment/items/2",
            "/payment/items/01",
            "/payment/items/-",
            "/payment/reference/x",
        ] {
            assert_eq!(at(nothing), None, "{nothing}");
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-c~/0-9]{0,3}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 48, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c~/0-9]{0,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Any text is a pointer or a clear error, and a pointer prints as written.
        #[test]
        fn parsing_never_panics(text in "\\PC{0,12}|[/~01a]{0,8}") {
            if let Ok(pointer) = JsonPointer::parse(&text) {
                prop_assert_eq!(pointer.as_str(), text.as_str());
            }
        }

        /// Resolving and removing never panic; after a removal the pointer resolves to
        /// nothing (or, for "", to null), and nothing else of the body moved.
        #[test]
        fn resolve_and_remove_agree(value in json(), text in "(/[a-c~/0-9]{0,2}){0,3}") {
            let Ok(pointer) = JsonPointer::parse(&text) else {
                return Ok(());
            };
            let found = pointer.resolve(&value).cloned();
            let mut removed = value.clone();
            pointer.remove_from(&mut removed);
            match (&found, pointer.tokens.is_empty()) {
                (_, true) => prop_assert_eq!(removed, Value::Null),
                (None, false) => prop_assert_eq!(removed, value),
                // An array element shifts the ones after it, so only a member is gone
                // for sure; either way the body changed.
                (Some(_), false) => prop_assert_ne!(removed, value),
            }
        }
    }
}
