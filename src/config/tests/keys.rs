//! What a newcomer writes wrong: a misspelt key, a key left without a value.

use super::*;

#[test]
fn a_misspelt_key_is_refused_with_the_closest_known_one() {
    for (text, path, suggestion) in [
        (
            "routes:\n  - path: /a\n    requried: true\n",
            "routes[0].requried",
            "required",
        ),
        ("idempotency:\n  tll: 1h\n", "idempotency.tll", "ttl"),
        (
            "store:\n  kind: file\n  fsinc: false\n",
            "store.fsinc",
            "fsync",
        ),
        ("listne: 127.0.0.1:1\n", "listne", "listen"),
        ("log:\n  Level: warn\n", "log.Level", "level"),
        (
            "idempotency:\n  on-concurrent: wait\n",
            "idempotency.on-concurrent",
            "on_concurrent",
        ),
    ] {
        let message = error_at(&with_minimal(text), path);
        assert_eq!(
            message,
            format!("{path}: unknown key; did you mean '{suggestion}'?"),
            "{text}"
        );
    }
    // Nothing close: the list of the keys that exist, as before.
    let message = error_at(&with_minimal("store:\n  password: x\n"), "store.password");
    assert!(
        message.contains("unknown field 'password', expected one of kind, url"),
        "{message}"
    );
}

#[test]
fn a_key_without_a_value_is_an_error_naming_it() {
    for (text, path) in [
        ("idempotency:\n  ttl:\n", "idempotency.ttl"),
        ("idempotency:\n  ttl: ~\n", "idempotency.ttl"),
        ("routes:\n  - path: /a\n    ttl: null\n", "routes[0].ttl"),
        ("store:\n  kind: file\n  path:\n", "store.path"),
        ("log:\n  level:\n", "log.level"),
        ("shutdown_timeout:\n", "shutdown_timeout"),
        ("routes:\n", "routes"),
        ("upgrades:\n", "upgrades"),
        ("errors:\n  template:\n", "errors.template"),
    ] {
        let message = error_at(&with_minimal(text), path);
        assert!(message.contains("has no value"), "{message}");
    }
    // A misspelt key left empty is reported as misspelt.
    let message = error_at(&with_minimal("idempotency:\n  tll:\n"), "idempotency.tll");
    assert!(message.contains("did you mean 'ttl'"), "{message}");
}

/// `null` means "none" for the keys whose default is none, as the annotated example
/// and `--check` write them; `admin.listen: null` turns the admin listener off; and an
/// empty section is one with every key at its default.
#[test]
fn null_is_kept_where_it_means_none() {
    assert_eq!(parse_ok(&with_minimal("store:\nlog:\n")), parse_ok(MINIMAL));
    let config = parse_ok(
        "upstream:\n  url: http://127.0.0.1:9000\n  tls: null\nstore:\n  kind: redis\n  sentinel: null\n\
         admin:\n  listen: null\n  token: null\n",
    );
    assert_eq!(config.upstream.tls, None);
    assert_eq!(config.store.sentinel, None);
    assert_eq!(config.admin.listen, None);
    assert_eq!(config.admin.token, None);
}
