//! The limits on the file (docs/behaviour.md §15): its size, its nesting in every style,
//! and alias expansion, each refused by the parser as it reads, in well under a second.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde::de::IgnoredAny;
use serde_json::Value;

use super::*;

/// `MINIMAL` padded with a comment to exactly `len` bytes.
fn padded_to(len: usize) -> String {
    let mut text = MINIMAL.to_owned();
    text.push('#');
    text.push_str(&"x".repeat(len - text.len() - 1));
    text.push('\n');
    assert_eq!(text.len(), len);
    text
}

/// The most any refusal below may take: a debug build on a busy machine, still far
/// below the minutes that deep nesting took the previous parser.
const QUICKLY: Duration = Duration::from_millis(500);

/// `text` read by the parser as anything at all (any nesting, any aliases), so that
/// only its own limits can refuse it, and how long that took.
fn read_as_anything(text: &str) -> (Result<IgnoredAny, ConfigError>, Duration) {
    let start = Instant::now();
    let read = parse::document::<IgnoredAny>(text, &no_env);
    (read, start.elapsed())
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

/// The parser refuses a document nested deeper than 64 levels in every style, naming
/// the line and column where the level too many opens, quickly; it reads 64 levels as
/// usual (docs/behaviour.md §15). 100 000 levels of flow collections used to take
/// minutes to be refused.
#[test]
fn the_parser_refuses_nesting_deeper_than_64_levels_in_every_style() {
    for (style, nested, deepest) in NESTING_STYLES {
        let (read, _) = read_as_anything(&nested(64));
        assert!(read.is_ok(), "{style}: {read:?}");
        for depth in [65, 100, 1000, 100_000]
            .into_iter()
            .filter(|d| *d <= deepest)
        {
            let (read, took) = read_as_anything(&nested(depth));
            let message = read.unwrap_err().to_string();
            assert!(
                message.starts_with("line ") && message.contains(": nested deeper than 64 levels"),
                "{style}, {depth} levels: {message}"
            );
            assert!(took < QUICKLY, "{style}, {depth} levels: {took:?}");
        }
    }
    let (read, _) = read_as_anything(&NESTING_STYLES[0].1(65));
    assert_eq!(
        read.unwrap_err().to_string(),
        "line 1 column 74: nested deeper than 64 levels"
    );
    let (read, _) = read_as_anything(&NESTING_STYLES[7].1(65));
    let message = read.unwrap_err().to_string();
    assert!(message.starts_with("line 65 column "), "{message}");
}

/// As a configuration, deep nesting is refused as quickly, by the parser's limit or,
/// sooner, by the first key whose value may not nest at all; either way the error says
/// where. A megabyte of `[` is refused by the parser as soon as it has read 65 of them.
#[test]
fn a_deeply_nested_configuration_is_refused_quickly_naming_where() {
    for (style, nested, deepest) in NESTING_STYLES {
        for depth in [65, 1000, 100_000].into_iter().filter(|d| *d <= deepest) {
            let start = Instant::now();
            let message = parse(&nested(depth)).unwrap_err().to_string();
            let took = start.elapsed();
            assert!(
                message.starts_with("line ") || message.contains(" (line "),
                "{style}, {depth} levels: {message}"
            );
            assert!(took < QUICKLY, "{style}, {depth} levels: {took:?}");
        }
    }
    let megabyte = format!("{MINIMAL}upgrades: {}\n", "[".repeat(1_000_000));
    let start = Instant::now();
    let message = parse(&megabyte).unwrap_err().to_string();
    assert!(start.elapsed() < QUICKLY, "{:?}", start.elapsed());
    assert_eq!(message, "line 3 column 75: nested deeper than 64 levels");
}

/// A "billion laughs": nine anchors, each a list of nine aliases of the one before,
/// `lol` 9^9 times once expanded.
fn billion_laughs(under: &str) -> String {
    let mut text = format!("{under}\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for (name, previous) in ["b", "c", "d", "e", "f", "g", "h", "i"]
        .into_iter()
        .zip(["a", "b", "c", "d", "e", "f", "g", "h"])
    {
        let aliases = vec![format!("*{previous}"); 9].join(", ");
        text.push_str(&format!("  {name}: &{name} [{aliases}]\n"));
    }
    text
}

/// Aliases are expanded only so far: a billion laughs is refused after a few thousand
/// events, quickly and without holding what it would expand to, whether the parser
/// reads it as anything or as a configuration (whose keys refuse it sooner).
#[test]
fn a_billion_laughs_is_refused_quickly() {
    let (read, took) = read_as_anything(&billion_laughs("laughs:"));
    let message = read.unwrap_err().to_string();
    assert!(
        message.starts_with("line ") && message.contains("aliases expand to more than"),
        "{message}"
    );
    assert!(took < QUICKLY, "{took:?}");

    let start = Instant::now();
    let message = parse(&with_minimal(&billion_laughs("idempotency:\n  key_from:")))
        .unwrap_err()
        .to_string();
    assert!(start.elapsed() < QUICKLY, "{:?}", start.elapsed());
    assert!(message.starts_with("idempotency.key_from"), "{message}");
    // A few aliases, as a configuration uses them, are read as usual.
    parse_ok(&with_minimal(
        "routes:\n  - path: /a\n    methods: &m [POST]\n  - path: /b\n    methods: *m\n",
    ));
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

/// How deep a value is nested: a mapping or sequence is 1 more than its deepest item.
fn value_depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(value_depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(value_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// `value` wrapped in one single-entry collection per element of `wrappers`
/// (`true`: a sequence, `false`: a mapping under the key `k`).
fn wrapped(value: Value, wrappers: &[bool]) -> Value {
    wrappers.iter().fold(value, |inner, &sequence| {
        if sequence {
            Value::Array(vec![inner])
        } else {
            Value::Object([("k".to_owned(), inner)].into_iter().collect())
        }
    })
}

fn values() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        "[a-z \\[\\]{}:#'\"\\-?|>&!%@`,\n\t\\\\]{0,10}".prop_map(Value::String),
        any::<i64>().prop_map(Value::from),
        Just(Value::Null),
    ];
    leaf.prop_recursive(6, 48, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z]{1,6}", inner), 0..4)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A document printed in block style (as `--check` prints) or flow style (JSON) is
    /// read exactly when it is at most 64 levels deep, around that limit.
    #[test]
    fn the_parser_reads_exactly_the_documents_within_the_limit(
        value in values(),
        wrappers in prop::collection::vec(any::<bool>(), 50..70),
    ) {
        let value = wrapped(value, &wrappers);
        let within = value_depth(&value) <= 64;
        let block = serde_saphyr::to_string(&value).unwrap();
        let flow = serde_json::to_string(&value).unwrap();
        for text in [block, flow] {
            match read_as_anything(&text).0 {
                Ok(_) => prop_assert!(within, "read, but deeper than 64:\n{}", text),
                Err(err) => {
                    let message = err.to_string();
                    prop_assert!(!within, "refused within the limit: {}\n{}", message, text);
                    prop_assert!(message.contains("nested deeper than 64 levels"), "{}", message);
                }
            }
        }
    }
}
