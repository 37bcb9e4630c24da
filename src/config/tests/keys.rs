//! What a newcomer writes wrong: a misspelt key, a key left without a value; and which
//! store keys `--check` prints.

use super::*;

#[test]
fn a_misspelt_key_is_refused_with_the_closest_known_one() {
    for (text, path, suggestion, at) in [
        (
            "routes:\n  - path: /a\n    requried: true\n",
            "routes[0].requried",
            "required",
            "line 5 column 5",
        ),
        (
            "idempotency:\n  tll: 1h\n",
            "idempotency.tll",
            "ttl",
            "line 4 column 3",
        ),
        (
            "store:\n  kind: file\n  fsinc: false\n",
            "store.fsinc",
            "fsync",
            "line 5 column 3",
        ),
        (
            "listne: 127.0.0.1:1\n",
            "listne",
            "listen",
            "line 3 column 1",
        ),
        (
            "log:\n  Level: warn\n",
            "log.Level",
            "level",
            "line 4 column 3",
        ),
        (
            "idempotency:\n  on-concurrent: wait\n",
            "idempotency.on-concurrent",
            "on_concurrent",
            "line 4 column 3",
        ),
    ] {
        let message = error_at(&with_minimal(text), path);
        assert_eq!(
            message,
            format!("{path}: unknown key; did you mean '{suggestion}'? ({at})"),
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

/// The `store` keys `--check` prints for `text`, in order.
fn printed_store_keys(text: &str) -> Vec<String> {
    let config = parse_ok(&with_minimal(text));
    let yaml = config.to_yaml();
    let printed = Tree::parse(&yaml);
    let keys = printed.get("store").unwrap().keys();
    let keys = keys.into_iter().map(str::to_owned).collect();
    // And it still loads back to the same configuration.
    assert_eq!(parse_ok(&yaml), config, "{yaml}");
    keys
}

#[test]
fn check_prints_only_the_store_keys_of_the_chosen_kind() {
    let common = ["kind", "key_prefix", "timeout", "on_unavailable"];
    let with = |extra: &[&str]| -> Vec<String> {
        common
            .iter()
            .chain(extra)
            .map(|k| (*k).to_owned())
            .collect()
    };
    assert_eq!(
        printed_store_keys(
            "store:\n  kind: memory\n  url: redis://elsewhere:1/0\n  fsync: false\n"
        ),
        with(&["max_entries"])
    );
    assert_eq!(
        printed_store_keys(
            "store:\n  kind: file\n  path: /srv/keys\n  url: redis://elsewhere:1/0\n  min_replicas: 2\n"
        ),
        with(&["max_entries", "path", "fsync"])
    );
    let mut redis = printed_store_keys("store:\n  kind: redis\n  path: /srv/keys\n");
    redis.sort();
    let mut expected = with(&["url", "cluster", "sentinel", "min_replicas"]);
    expected.sort();
    assert_eq!(redis, expected);
}

/// Keys that do not apply to the chosen kind are allowed and not checked; they are not
/// in force either, so two files that differ only in them are the same configuration.
#[test]
fn keys_of_another_store_kind_leave_the_configuration_as_it_was() {
    let plain = parse_ok(&with_minimal("store:\n  kind: file\n  path: /srv/keys\n"));
    let noisy = parse_ok(&with_minimal(
        "store:\n  kind: file\n  path: /srv/keys\n  urls: [redis://a:1, redis://b:2]\n  min_replicas: 0\n",
    ));
    assert_eq!(plain, noisy);
}
