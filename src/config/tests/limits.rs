//! The limits on the file (docs/behaviour.md §15): its size, its nesting in every style,
//! and a nesting count that agrees with the YAML parser, style by style and on generated
//! documents.

use proptest::prelude::*;
use serde_yaml::{Mapping, Value};

use super::*;
use crate::config::limits::depth;

/// `MINIMAL` padded with a comment to exactly `len` bytes.
fn padded_to(len: usize) -> String {
    let mut text = MINIMAL.to_owned();
    text.push('#');
    text.push_str(&"x".repeat(len - text.len() - 1));
    text.push('\n');
    assert_eq!(text.len(), len);
    text
}

/// A configuration above 1 MiB is refused before it is parsed, given as text or as a
/// file, then naming the file (docs/behaviour.md §15).
#[test]
fn a_configuration_above_one_mib_is_refused() {
    assert_eq!(parse_ok(&padded_to(1 << 20)), parse_ok(MINIMAL));
    let message = parse(&padded_to((1 << 20) + 1)).unwrap_err().to_string();
    assert!(
        message.starts_with("(document): larger than 1 MiB"),
        "{message}"
    );

    let dir = std::env::temp_dir().join(format!("idemgate-config-size-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.yaml");
    std::fs::write(&path, padded_to(1 << 20)).unwrap();
    assert_eq!(Config::from_file(&path).unwrap(), parse_ok(MINIMAL));
    std::fs::write(&path, padded_to(3 << 20)).unwrap();
    let message = Config::from_file(&path).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        message.starts_with(&format!("{}: larger than 1 MiB", path.display())),
        "{message}"
    );
}

/// Ways to nest a document: a name, the text nested exactly `depth` levels deep, and
/// the deepest level worth trying (indentation grows as the square of the depth).
type Nesting = (&'static str, fn(usize) -> String, usize);

const NESTING_STYLES: [Nesting; 10] = [
    (
        "flow sequences",
        |d| format!("upstream: {}{}\n", "[".repeat(d - 1), "]".repeat(d - 1)),
        100_000,
    ),
    (
        "flow mappings",
        |d| format!("upstream: {}x{}\n", "{a: ".repeat(d - 1), "}".repeat(d - 1)),
        100_000,
    ),
    (
        "a top-level flow sequence",
        |d| format!("{}{}\n", "[".repeat(d), "]".repeat(d)),
        100_000,
    ),
    (
        "single-pair mappings in flow sequences",
        |d| {
            let pairs = (d - 1) / 2;
            let inner = if (d - 1) % 2 == 1 { "[x]" } else { "x" };
            format!(
                "upstream: {}{inner}{}\n",
                "[a: ".repeat(pairs),
                "]".repeat(pairs)
            )
        },
        100_000,
    ),
    (
        "compact block sequences",
        |d| format!("{}x\n", "- ".repeat(d)),
        100_000,
    ),
    (
        "compact explicit keys",
        |d| format!("{}x\n", "? ".repeat(d)),
        100_000,
    ),
    (
        "block sequences by indentation",
        |d| {
            let lines: String = (0..d).map(|i| format!("{}-\n", "  ".repeat(i))).collect();
            format!("{lines}{}x\n", "  ".repeat(d))
        },
        1000,
    ),
    (
        "block mappings by indentation",
        |d| {
            let lines: String = (0..d).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
            format!("{lines}{}x\n", " ".repeat(d))
        },
        1000,
    ),
    (
        "indentless sequences under keys",
        |d| {
            let pairs = (d - 1) / 2;
            let lines: String = (0..pairs)
                .map(|i| format!("{}- a:\n", "  ".repeat(i)))
                .collect();
            let last = if (d - 1) % 2 == 1 { "- x" } else { " x" };
            format!("a:\n{lines}{}{last}\n", "  ".repeat(pairs))
        },
        1000,
    ),
    (
        "block and flow mixed",
        |d| format!("a:\n- {}{}\n", "[".repeat(d - 2), "]".repeat(d - 2)),
        100_000,
    ),
];

/// A document nested deeper than 64 levels is refused in every style, naming the line
/// and column where the level too many opens; 64 levels are parsed as usual
/// (docs/behaviour.md §15).
/// 100 000 levels of flow collections used to take minutes to be refused.
#[test]
fn nesting_deeper_than_64_levels_is_refused_in_every_style() {
    for (style, nested, deepest) in NESTING_STYLES {
        if let Err(err) = parse(&nested(64)) {
            let message = err.to_string();
            assert!(!message.contains("nested deeper"), "{style}: {message}");
        }
        for depth in [65, 100, 1000, 100_000]
            .into_iter()
            .filter(|d| *d <= deepest)
        {
            let message = parse(&nested(depth)).unwrap_err().to_string();
            assert!(
                message.starts_with("line ") && message.contains(": nested deeper than 64 levels"),
                "{style}, {depth} levels: {message}"
            );
        }
    }
    let message = parse(&NESTING_STYLES[0].1(65)).unwrap_err().to_string();
    assert_eq!(message, "line 1 column 74: nested deeper than 64 levels");
    let message = parse(&NESTING_STYLES[7].1(65)).unwrap_err().to_string();
    assert_eq!(message, "line 65 column 65: nested deeper than 64 levels");
}

/// Brackets, dashes and indentation inside strings, comments and block scalars are
/// not nesting.
#[test]
fn brackets_in_strings_comments_and_block_scalars_are_not_nesting() {
    let deep = "[{".repeat(100);
    for value in [
        format!("\"{deep}\""),
        format!("'{deep}'"),
        format!("a{deep}"),
        format!("\"a\\\"{deep}\""),
        format!("'it''s {deep}'"),
        format!("\"{deep}\n    {deep}\""),
        format!("|\n    {deep}\n      - - - x\n    {deep}"),
        format!(">-\n    {deep}\n\n    {deep}"),
    ] {
        let text = with_minimal(&format!(
            "# {deep}\nstore:  # {deep}\n  key_prefix: {value}\n"
        ));
        let config = parse_ok(&text);
        assert!(config.store.key_prefix.contains(&deep), "{text}");
    }
}

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
