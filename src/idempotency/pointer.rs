//! RFC 6901 JSON Pointers: the parts of a JSON body that a key source reads
//! (docs/behaviour.md §9) and that a fingerprint leaves out (docs/behaviour.md §10).

use std::cmp::Ordering;

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

    /// Removes from `root` every member or array element that one of `pointers`
    /// addresses in `root` as given, whatever their order: `[/items/0, /items/1]`
    /// removes the first two elements, not the first and the third. A pointer that
    /// addresses nothing is skipped; `""` leaves `null`.
    ///
    /// Removing an array element shifts the ones after it, so the removals go from the
    /// last address to the first ([`removal_order`]): when an element goes, whatever
    /// was to go after it or inside it is gone already, and nothing still to go has
    /// moved.
    pub(crate) fn remove_all(pointers: &[JsonPointer], root: &mut Value) {
        match pointers {
            [] => {}
            [one] => one.remove_from(root),
            _ => {
                let mut order: Vec<&JsonPointer> = pointers.iter().collect();
                order.sort_by(|a, b| removal_order(b, a));
                // An index has one spelling, so only equal tokens address one place;
                // removed twice, an element would take its neighbour with it.
                order.dedup_by(|a, b| a.tokens == b.tokens);
                for pointer in order {
                    pointer.remove_from(root);
                }
            }
        }
    }

    /// Removes the member or array element the pointer addresses, if there is one;
    /// `""` addresses the whole body, which then counts as `null`.
    fn remove_from(&self, root: &mut Value) {
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

/// Document order of two pointers' addresses, array indices compared as numbers (`/2`
/// before `/10`) and an address before those inside it (`/a` before `/a/0`). Removed in
/// the reverse of this order, an element goes after every element that follows it and
/// after everything inside it, so each removal finds its address as the body had it.
fn removal_order(a: &JsonPointer, b: &JsonPointer) -> Ordering {
    /// Only an array's elements shift; an object's members may go in any order, so
    /// a token read as an index there orders them no worse than its name would.
    fn step(token: &str) -> (Option<usize>, &str) {
        (array_index(token), token)
    }
    a.tokens
        .iter()
        .map(|token| step(token))
        .cmp(b.tokens.iter().map(|token| step(token)))
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

    fn pointers(texts: &[&str]) -> Vec<JsonPointer> {
        texts
            .iter()
            .map(|text| JsonPointer::parse(text).expect("pointer"))
            .collect()
    }

    fn without(body: &Value, texts: &[&str]) -> Value {
        let mut body = body.clone();
        JsonPointer::remove_all(&pointers(texts), &mut body);
        body
    }

    #[test]
    fn every_pointer_addresses_the_body_as_sent() {
        let body = json!({"items": [{"a": 0}, {"a": 1}, {"a": 2}, {"a": 3}], "n": 1});
        let two_left = json!({"items": [{"a": 2}, {"a": 3}], "n": 1});
        assert_eq!(without(&body, &["/items/0", "/items/1"]), two_left);
        assert_eq!(without(&body, &["/items/1", "/items/0"]), two_left);
        assert_eq!(
            without(&body, &["/items/0", "/items/2/a", "/items/1", "/n"]),
            json!({"items": [{}, {"a": 3}]})
        );
        // Inside a removed element, or the same element twice: removed once.
        assert_eq!(
            without(&body, &["/items/0/a", "/items/0", "/items/0"]),
            json!({"items": [{"a": 1}, {"a": 2}, {"a": 3}], "n": 1})
        );
        // Indices compare as numbers; one past the end stays nothing.
        let long = json!((0..12).collect::<Vec<_>>());
        assert_eq!(
            without(&long, &["/2", "/10", "/12", "/-"]),
            json!([0, 1, 3, 4, 5, 6, 7, 8, 9, 11])
        );
        assert_eq!(without(&body, &["/items/0", ""]), Value::Null);
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

    /// Every pointer that addresses something in `value`, below `at`, `""` aside.
    fn addresses_in(value: &Value, at: &str, out: &mut Vec<String>) {
        let children: Vec<(String, &Value)> = match value {
            Value::Object(members) => members
                .iter()
                .map(|(name, child)| (name.replace('~', "~0").replace('/', "~1"), child))
                .collect(),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, child)| (i.to_string(), child))
                .collect(),
            _ => Vec::new(),
        };
        for (token, child) in children {
            let pointer = format!("{at}/{token}");
            addresses_in(child, &pointer, out);
            out.push(pointer);
        }
    }

    /// `value` built again without what `paths` address in it: the removal the
    /// pointers mean, with nothing shifting while it is made.
    fn rebuilt_without(value: &Value, paths: &[&[String]]) -> Value {
        if paths.iter().any(|path| path.is_empty()) {
            return Value::Null;
        }
        // The paths that go on inside the child named `token`, or `None` when one of
        // them ends there, removing it.
        let inside = |token: &str| -> Option<Vec<&[String]>> {
            let mut rest = Vec::new();
            for path in paths.iter().filter(|path| path[0] == token) {
                if path.len() == 1 {
                    return None;
                }
                rest.push(&path[1..]);
            }
            Some(rest)
        };
        match value {
            Value::Object(members) => Value::Object(
                members
                    .iter()
                    .filter_map(|(name, child)| {
                        inside(name).map(|rest| (name.clone(), rebuilt_without(child, &rest)))
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, child)| {
                        inside(&i.to_string()).map(|rest| rebuilt_without(child, &rest))
                    })
                    .collect(),
            ),
            leaf => leaf.clone(),
        }
    }

    proptest! {
        /// Any text is a pointer or a clear error, and a pointer prints as written.
        #[test]
        fn parsing_never_panics(text in "\\PC{0,12}|[/~01a]{0,8}") {
            if let Ok(pointer) = JsonPointer::parse(&text) {
                prop_assert_eq!(pointer.as_str(), text.as_str());
            }
        }

        /// Removing several pointers removes what each addresses in the body as it
        /// was, in any order: the same as a body rebuilt without those addresses.
        #[test]
        fn removing_many_is_removing_what_each_addresses(
            value in json(),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            rotate in any::<prop::sample::Index>(),
        ) {
            // Mostly addresses the body has, with some it has not.
            let mut addresses = vec!["/9".to_owned(), "/a/9".to_owned()];
            addresses_in(&value, "", &mut addresses);
            let texts: Vec<&str> = picks.iter().map(|pick| pick.get(&addresses).as_str()).collect();
            let list = pointers(&texts);
            let paths: Vec<&[String]> = list.iter().map(|p| &p.tokens[..]).collect();
            let expected = rebuilt_without(&value, &paths);
            let mut removed = value.clone();
            JsonPointer::remove_all(&list, &mut removed);
            prop_assert_eq!(&removed, &expected, "{:?}", texts);
            let mut reordered = list.clone();
            reordered.reverse();
            let by = rotate.index(reordered.len().max(1));
            reordered.rotate_left(by);
            let mut removed = value;
            JsonPointer::remove_all(&reordered, &mut removed);
            prop_assert_eq!(removed, expected);
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
