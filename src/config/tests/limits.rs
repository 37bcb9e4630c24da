//! The nesting count of `limits` agrees with the YAML parser, style by style and on
//! generated documents.

use proptest::prelude::*;
use serde_yaml::{Mapping, Value};

use crate::config::limits::depth;

/// How deep a parsed document is nested: a top-level mapping is 1.
fn value_depth(value: &Value) -> usize {
    match value {
        Value::Sequence(items) => 1 + items.iter().map(value_depth).max().unwrap_or(0),
        Value::Mapping(map) => {
            1 + map
                .iter()
                .map(|(k, v)| value_depth(k).max(value_depth(v)))
                .max()
                .unwrap_or(0)
        }
        Value::Tagged(tagged) => value_depth(&tagged.value),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => 0,
    }
}

/// The count of `limits` and the parser's, when the parser reads `text` as one document.
fn both_depths(text: &str) -> (usize, bool, Option<usize>) {
    let (counted, read_to_end) = depth(text);
    let parsed = serde_yaml::from_str::<Value>(text)
        .ok()
        .map(|v| value_depth(&v));
    (counted, read_to_end, parsed)
}

#[test]
fn every_way_of_nesting_counts_as_the_parser_nests() {
    let cases = [
        ("", 0),
        ("a", 0),
        ("a: 1", 1),
        ("a: [1]", 2),
        ("[a: b]", 2),
        ("[[a: b], c]", 3),
        ("[? a : b]", 2),
        ("{a: [b]}", 2),
        ("{a: b, c: {d: e}}", 2),
        ("- a: 1", 2),
        ("- - a", 2),
        ("a:\n- 1", 2),
        ("a:\n  - 1", 2),
        ("a:\n- - 1\nb: 2", 3),
        ("a:\n- b: 1\n  c:\n  - d\ne: 1", 4),
        ("a:\n  b:\n    c: 1\n", 3),
        ("a:\n  b:\n    c: 1\nd: [x]\n", 3),
        ("? a\n: b", 1),
        ("? - a\n: - b", 2),
        ("? [a]\n: {b: c}", 2),
        ("[a]: b", 2),
        ("[[[a]: b]: c]", 5),
        ("- [[a], {b: c}]: d", 4),
        ("&x a: &y [b]", 2),
        ("!t a: !u [b]", 2),
        ("a: |\n  [[[\n  - x\nb: 1", 1),
        ("a: |2\n   [[[\n    - x\nb: 1", 1),
        ("- >-\n  {{{\n\n  - - -\n- b", 1),
        ("a: \"[[\n [[\"\nb: [x]", 2),
        ("a: \"\\\"[[\"\nb: x", 1),
        ("a: 'it''s [[['", 1),
        ("a: it's [[[", 1),
        ("a: b [[[ c\n  d [[[\nb: 1", 1),
        ("# [[[\na: 1 # [[[", 1),
        ("a: x#[[[", 1),
        ("[a, # ]]]\n b]", 1),
        ("a: [\"]]\", ']]', b]", 2),
        ("a:\r\n  b:\r\n    c: [x]\r\n", 4),
        ("a:\u{2028}  b: [x]", 3),
        ("\u{feff}a:\n b: 1", 1), // a byte order mark takes a column
        ("\u{feff}a:\n  b: 1", 2),
        ("a: [b,\n  [c]]", 3),
        ("{a: b}: c", 2),
        ("a: {b: [c, {d: e}]}", 4),
    ];
    for (text, expected) in cases {
        let (counted, read_to_end, parsed) = both_depths(text);
        assert_eq!(parsed, Some(expected), "the parser, on {text:?}");
        assert!(read_to_end, "stopped early on {text:?}");
        assert_eq!(counted, expected, "{text:?}");
    }
    // Documents after the first are counted too (the parser refuses them later).
    assert_eq!(depth("a: 1\n---\n- [[x]]\n...\n").0, 3);
}

#[test]
fn where_the_parser_stops_with_an_error_so_does_the_count() {
    for text in [
        "a: \"[[[\n--- [[[[",
        "a: '[[[",
        "a: |0\n  [[[[",
        "a: |x\n  [[[[",
        "[a:[b]]",
        "a:\n\t[[[[",
        "a: @[[[[",
        "a: \u{1}[[[[",
    ] {
        let (counted, read_to_end) = depth(text);
        assert!(!read_to_end, "{text:?}");
        assert!(counted <= 2, "{text:?}: {counted}");
        assert!(serde_yaml::from_str::<Value>(text).is_err(), "{text:?}");
    }
}

/// `value` wrapped in one single-entry collection per element of `wrappers`
/// (`true`: a sequence, `false`: a mapping under the key `k`).
fn wrapped(value: Value, wrappers: &[bool]) -> Value {
    wrappers.iter().fold(value, |inner, &sequence| {
        if sequence {
            Value::Sequence(vec![inner])
        } else {
            let mut map = Mapping::new();
            map.insert("k".into(), inner);
            Value::Mapping(map)
        }
    })
}

fn tricky_string() -> impl Strategy<Value = String> {
    "[a-z \\[\\]{}:#'\"\\-?|>&!%@`,\n\t\\\\]{0,10}"
}

fn values() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        tricky_string().prop_map(Value::String),
        any::<i64>().prop_map(Value::from),
        Just(Value::Null),
    ];
    leaf.prop_recursive(6, 48, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Sequence),
            prop::collection::vec((tricky_string(), inner), 0..4).prop_map(|pairs| {
                Value::Mapping(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
            }),
        ]
    })
}

/// Lines of YAML-looking text, mostly invalid, some deeply nested.
fn yaml_soup() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "- ", "? ", ": ", ":", "[", "]", "{", "}", ", ", ",", "a", "b ", "k: ", "'", "''", "\"",
        "\\\"", " #", "#", "\n", "\n", "\n", "\n  ", "\n- ", "  ", " ", "|", "|-\n", ">2\n", "\\",
        "&x ", "!t ", "---", "...", "\t", "%", "-", "\r\n", "\u{2028}", "é", "[[", "]]", "{a: ",
        "\u{feff}", "\u{85}",
    ]);
    prop::collection::vec(piece, 0..48).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// What serde_yaml prints, in block style, and the same as JSON (flow style), is
    /// counted exactly as deep as the value it prints, around the limit of 64.
    #[test]
    fn printed_documents_count_as_deep_as_their_value(
        value in values(),
        wrappers in prop::collection::vec(any::<bool>(), 50..70),
    ) {
        let value = wrapped(value, &wrappers);
        let expected = value_depth(&value);
        let block = serde_yaml::to_string(&value).unwrap();
        let flow = serde_json::to_string(&value).unwrap();
        for text in [block, flow] {
            prop_assert_eq!(depth(&text), (expected, true), "{}", text);
        }
    }
}

/// Lines of YAML, indented at random: more of them are documents, nested by
/// indentation.
fn yaml_lines() -> impl Strategy<Value = String> {
    let prefix = prop::sample::select(vec!["", "", "- ", "? ", ": ", "- - ", "- ? ", "-\t"]);
    let content = prop::sample::select(vec![
        "k:",
        "k: v",
        "k: [a, b]",
        "k: {a: [b]}",
        "[a, [b]]: c",
        "{a: b}:",
        "'q [': x",
        "\"d\\\" {\": x",
        "k: |",
        "k: |-",
        "k: >2",
        "- |",
        "# c [",
        "v [[ w",
        "k: [",
        "]",
        "&x k:",
        "!t k:",
        "k: 'a''b",
        "c'",
        "k: \"a",
        "b\"",
        "[a:",
        "b]",
        "- [a: b]",
        "x",
        "k: \"",
        "k: a # [",
        "k: a#[",
        "--- ",
        "...",
        "k:\t[x]",
        "[a,",
        "{a: [",
        "]}",
    ]);
    prop::collection::vec((0usize..8, prefix, content), 0..14).prop_map(|lines| {
        lines
            .iter()
            .map(|(indent, prefix, content)| format!("{}{prefix}{content}\n", " ".repeat(*indent)))
            .collect()
    })
}

proptest! {
    // Most of the soup is not YAML: many cases for enough documents.
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// Whatever the parser reads as one document, the count reads to the end and finds
    /// exactly as deep. (The soup has no alias: `*a` repeats a value, not the text.)
    #[test]
    fn the_count_never_misses_what_the_parser_nests(
        text in prop_oneof![yaml_soup(), yaml_lines()],
    ) {
        let (counted, read_to_end, parsed) = both_depths(&text);
        if let Some(parsed) = parsed {
            prop_assert!(read_to_end, "stopped early: {:?}", text);
            prop_assert_eq!(counted, parsed, "{:?}", text);
        }
    }
}
