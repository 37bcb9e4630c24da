//! `reconcile` (docs/behaviour.md §18): its defaults, inheritance, printing, and the
//! errors that name its path.

use std::time::Duration;

use super::*;

#[test]
fn reconcile_is_unset_by_default_and_routes_inherit_or_set_it() {
    let defaults = parse_ok(MINIMAL);
    assert_eq!(defaults.idempotency.reconcile, None);
    let config = parse_ok(&with_minimal(
        "routes:\n  - path: /a\n  - path: /charges\n    reconcile:\n      \
         path: /charges/by-key/{key}\n      copy_headers: [authorization, x-tenant]\n      \
         timeout: 500ms\n      attempts: 5\n      method: head\n",
    ));
    assert_eq!(policy_for(&config, "/a").reconcile, None);
    let r = policy_for(&config, "/charges")
        .reconcile
        .clone()
        .expect("set on the route");
    assert_eq!(r.method, Method::HEAD);
    assert_eq!(r.path, "/charges/by-key/{key}");
    assert_eq!(
        r.copy_headers,
        vec![
            http::header::AUTHORIZATION,
            HeaderName::from_static("x-tenant")
        ]
    );
    assert_eq!(r.timeout, Duration::from_millis(500));
    assert_eq!(r.attempts, 5);
    let inherited = parse_ok(&with_minimal(
        "idempotency:\n  reconcile: {path: '/k/{key}'}\nroutes:\n  - path: /a\n",
    ));
    let r = policy_for(&inherited, "/a")
        .reconcile
        .clone()
        .expect("inherited");
    assert_eq!(
        (r.method, r.copy_headers, r.timeout, r.attempts),
        (
            Method::GET,
            vec![http::header::AUTHORIZATION],
            Duration::from_secs(2),
            3
        )
    );
}

#[test]
fn check_omits_reconcile_when_unset_and_prints_it_when_set() {
    let defaults = parse_ok(MINIMAL).to_yaml();
    assert!(!defaults.contains("reconcile"), "{defaults}");
    let config = parse_ok(&with_minimal(
        "routes:\n  - path: /charges\n    reconcile: {path: '/charges/by-key/{key}'}\n",
    ));
    let yaml = config.to_yaml();
    assert!(yaml.contains("path: /charges/by-key/{key}"), "{yaml}");
    assert!(yaml.contains("attempts: 3"), "{yaml}");
    assert_eq!(parse_ok(&yaml), config);
}

#[test]
fn a_bad_reconcile_is_an_error_naming_its_path() {
    for (text, path, says) in [
        (
            "routes:\n  - path: /a\n    reconcile: {path: '/charges'}\n",
            "routes[0].reconcile",
            "has no {key}",
        ),
        (
            "idempotency:\n  reconcile: {method: GET}\n",
            "idempotency.reconcile",
            "needs the lookup's path",
        ),
        (
            "idempotency:\n  reconcile: {path: '/{key}', attempts: 0}\n",
            "idempotency.reconcile",
            "attempts must be 1 to 10",
        ),
        (
            "idempotency:\n  reconcile: {path: '/{key}', timeout: 0s}\n",
            "idempotency.reconcile.timeout",
            "greater than zero",
        ),
        (
            "idempotency:\n  reconcile: {path: '/{key}', url: x}\n",
            "idempotency.reconcile.url",
            "unknown field",
        ),
    ] {
        let message = error_at(&with_minimal(text), path);
        assert!(message.contains(says), "{message}");
    }
}
