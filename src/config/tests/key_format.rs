//! `key_format` (docs/behaviour.md §18): its spellings, inheritance, printing, and the
//! errors that name the route.

use super::*;
use crate::idempotency::format::KeyFormat;

#[test]
fn key_format_defaults_to_any_and_routes_inherit_or_override_it() {
    assert_eq!(parse_ok(MINIMAL).idempotency.key_format, KeyFormat::Any);
    let config = parse_ok(&with_minimal(
        "idempotency:\n  key_format: uuidv4\nroutes:\n  - path: /a\n  - path: /b\n    \
         key_format: uuidv7\n  - path: /c\n    key_format: {regex: 'ord-[0-9]+'}\n  \
         - path: /d\n    key_format: any\n",
    ));
    assert_eq!(config.idempotency.key_format, KeyFormat::UuidV4);
    assert_eq!(policy_for(&config, "/a").key_format, KeyFormat::UuidV4);
    assert_eq!(policy_for(&config, "/b").key_format, KeyFormat::UuidV7);
    assert!(matches!(
        &policy_for(&config, "/c").key_format,
        KeyFormat::Regex(pattern) if pattern.as_str() == "ord-[0-9]+"
    ));
    assert_eq!(policy_for(&config, "/d").key_format, KeyFormat::Any);
    assert_eq!(
        parse_ok(&with_minimal("idempotency:\n  key_format: uuid\n"))
            .idempotency
            .key_format,
        KeyFormat::Uuid
    );
}

#[test]
fn check_prints_key_format_and_loads_back_the_same() {
    let defaults = parse_ok(MINIMAL).to_yaml();
    assert!(defaults.contains("key_format: any"), "{defaults}");
    let config = parse_ok(&with_minimal(
        "idempotency:\n  key_format: uuidv7\nroutes:\n  - path: /a\n    \
         key_format: {regex: '[A-Z]{3}-[0-9]+$'}\n  - path: /b\n",
    ));
    let yaml = config.to_yaml();
    assert!(yaml.contains("key_format: uuidv7"), "{yaml}");
    assert!(yaml.contains("regex: "), "{yaml}");
    assert_eq!(parse_ok(&yaml), config);
}

#[test]
fn a_bad_key_format_is_an_error_naming_the_route() {
    for (text, path, says) in [
        (
            "routes:\n  - path: /a\n  - path: /b\n    key_format: {regex: 'ord-('}\n",
            "routes[1].key_format",
            "not a valid regular expression",
        ),
        (
            "routes:\n  - path: /a\n  - path: /b\n    key_format: {regex: '[0-9]*'}\n",
            "routes[1].key_format",
            "matches the empty string",
        ),
        (
            "routes:\n  - path: /a\n    key_format: {regex: 'a)|(b'}\n",
            "routes[0].key_format",
            "not a valid regular expression",
        ),
        (
            "idempotency:\n  key_format: uuidv5\n",
            "idempotency.key_format",
            "unknown variant 'uuidv5', expected one of any, uuid, uuidv4, uuidv7",
        ),
        (
            "idempotency:\n  key_format: {pattern: x}\n",
            "idempotency.key_format",
            "unexpected key 'pattern'",
        ),
        (
            "idempotency:\n  key_format: {}\n",
            "idempotency.key_format",
            "is empty",
        ),
        (
            "idempotency:\n  key_format: 4\n",
            "idempotency.key_format",
            "expected one of any",
        ),
    ] {
        let message = error_at(&with_minimal(text), path);
        assert!(message.contains(says), "{text}: {message}");
    }
}
