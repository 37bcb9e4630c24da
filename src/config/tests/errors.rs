//! Every class of error names its field.

use super::*;

#[test]
fn overlapping_routes_are_allowed_and_the_first_match_wins() {
    let yaml = with_minimal(
        "routes:\n  - path: /charges\n    ttl: 1h\n  - path: /charges/refunds\n    ttl: 2h\n",
    );
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("overlap is valid");
    assert_eq!(config.route_index("/charges/refunds/1"), Some(0));
    assert_eq!(
        policy_for(&config, "/charges/refunds").ttl,
        std::time::Duration::from_secs(3600)
    );
}

#[test]
fn route_paths_are_checked() {
    error_at(&with_minimal("routes:\n  - ttl: 1h\n"), "routes[0].path");
    error_at(
        &with_minimal("routes:\n  - path: charges\n"),
        "routes[0].path",
    );
    error_at(
        &with_minimal("routes:\n  - path: /a?b=1\n"),
        "routes[0].path",
    );
}

/// Requests match routes with each segment's `;parameters` removed, so a route `path`
/// holding a `;` could never match one (docs/behaviour.md §25): refused, naming the
/// route.
#[test]
fn a_route_path_with_a_semicolon_is_refused() {
    for path in ["/charges;v=1", "/a;/b", "/charges/;", "/;"] {
        let yaml = with_minimal(&format!(
            "routes:\n  - path: /refunds\n  - path: '{path}'\n"
        ));
        let message = error_at(&yaml, "routes[1].path");
        assert!(
            message.contains(&format!("'{path}'")) && message.contains("';'"),
            "{message}"
        );
    }
}

#[test]
fn unknown_keys_are_errors_naming_their_path() {
    let message = error_at(&with_minimal("bogus: 1\n"), "bogus");
    assert!(
        message.starts_with("bogus: unknown field 'bogus', expected one of listen,"),
        "{message}"
    );
    let message = error_at(&with_minimal("idempotency:\n  foo: 1\n"), "idempotency.foo");
    assert!(message.contains("unknown field 'foo'"), "{message}");
    assert!(message.contains("header, key_from, methods"), "{message}");
    error_at(&with_minimal("upstream_url: x\n"), "upstream_url");
    error_at(
        "upstream:\n  url: http://a\n  retries: 3\n",
        "upstream.retries",
    );
    error_at(&with_minimal("store:\n  password: x\n"), "store.password");
    error_at(&with_minimal("admin:\n  port: 1\n"), "admin.port");
    let message = error_at(
        &with_minimal("routes:\n  - path: /a\n  - path: /b\n    bogus: true\n"),
        "routes[1].bogus",
    );
    assert!(message.contains("path, enabled, header"), "{message}");
    // `enabled` belongs to routes only.
    error_at(
        &with_minimal("idempotency:\n  enabled: false\n"),
        "idempotency.enabled",
    );
}

#[test]
fn bad_durations_name_their_field() {
    let message = error_at(
        &with_minimal("idempotency:\n  ttl: 10q\n"),
        "idempotency.ttl",
    );
    assert!(message.contains("'10q'"), "{message}");
    let message = error_at(
        &with_minimal("idempotency:\n  lease: 10\n"),
        "idempotency.lease",
    );
    assert!(message.contains("no unit"), "{message}");
    let message = error_at(
        &with_minimal("shutdown_timeout: \"10\"\n"),
        "shutdown_timeout",
    );
    assert!(message.contains("no unit"), "{message}");
    error_at(&with_minimal("store:\n  timeout: 1.5\n"), "store.timeout");
    error_at(
        &with_minimal("routes:\n  - path: /a\n  - path: /b\n    wait_timeout: soon\n"),
        "routes[1].wait_timeout",
    );
    error_at(
        "upstream:\n  url: http://a\n  timeout: [1s]\n",
        "upstream.timeout",
    );
    for key in ["ttl", "lease", "wait_timeout"] {
        let message = error_at(
            &with_minimal(&format!("idempotency:\n  {key}: 0s\n")),
            &format!("idempotency.{key}"),
        );
        assert!(message.contains("greater than zero"), "{message}");
    }
    error_at(
        "upstream:\n  url: http://a\n  connect_timeout: 0ms\n",
        "upstream.connect_timeout",
    );
}

/// Every duration key, as a file with `V` for its value, and the path an error names.
const DURATION_KEYS: [(&str, &str); 10] = [
    ("shutdown_timeout: V\n", "shutdown_timeout"),
    (
        "upstream:\n  connect_timeout: V\n",
        "upstream.connect_timeout",
    ),
    ("upstream:\n  timeout: V\n", "upstream.timeout"),
    ("store:\n  timeout: V\n", "store.timeout"),
    ("idempotency:\n  ttl: V\n", "idempotency.ttl"),
    ("idempotency:\n  lease: V\n", "idempotency.lease"),
    (
        "idempotency:\n  wait_timeout: V\n",
        "idempotency.wait_timeout",
    ),
    ("routes:\n  - path: /a\n    ttl: V\n", "routes[0].ttl"),
    ("routes:\n  - path: /a\n    lease: V\n", "routes[0].lease"),
    (
        "routes:\n  - path: /a\n    wait_timeout: V\n",
        "routes[0].wait_timeout",
    ),
];

/// A duration under 1ms would be counted as 0 ms by the store and the timers, and a
/// lease under 100ms ends before a renewal can land: both are errors naming the key.
/// `lease: 1ns` and `ttl: 500us` used to load.
#[test]
fn durations_too_small_to_work_are_refused() {
    for (template, path) in DURATION_KEYS {
        for value in ["500us", "999us", "999999ns", "1ns", "1us"] {
            let message = error_at(&template.replace('V', value), path);
            assert!(message.contains("less than 1ms"), "{message}");
        }
        if !path.ends_with(".lease") {
            parse_ok(&template.replace('V', "1ms"));
        }
    }
    for path in ["idempotency", "routes[0]"] {
        let template = if path == "idempotency" {
            "idempotency:\n  lease: V\n"
        } else {
            "routes:\n  - path: /a\n    lease: V\n"
        };
        for value in ["1ms", "50ms", "99ms", "99999us"] {
            let message = error_at(
                &with_minimal(&template.replace('V', value)),
                &format!("{path}.lease"),
            );
            assert!(message.contains("shorter than 100ms"), "{message}");
        }
        let config = parse_ok(&with_minimal(&template.replace('V', "100ms")));
        assert_eq!(policy_for(&config, "/a").lease, Duration::from_millis(100));
    }
    let message = error_at(
        &with_minimal("idempotency:\n  key_from: [{fingerprint: 500us}]\n"),
        "idempotency.key_from[0].fingerprint",
    );
    assert!(message.contains("less than 1ms"), "{message}");
}

/// Every size key, as [`DURATION_KEYS`].
const SIZE_KEYS: [(&str, &str); 4] = [
    (
        "idempotency:\n  max_request_body: V\n",
        "idempotency.max_request_body",
    ),
    (
        "idempotency:\n  max_response_body: V\n",
        "idempotency.max_response_body",
    ),
    (
        "routes:\n  - path: /a\n    max_request_body: V\n",
        "routes[0].max_request_body",
    ),
    (
        "routes:\n  - path: /a\n    max_response_body: V\n",
        "routes[0].max_response_body",
    ),
];

/// A duration above 10 years or a size above 1 TiB is an error naming its key
/// (docs/behaviour.md §15). A huge lease or timeout used to be accepted and to panic
/// request tasks when added to `Instant::now()`.
#[test]
fn durations_above_ten_years_and_sizes_above_one_tib_are_refused() {
    for (template, path) in DURATION_KEYS {
        for value in ["18446744073709551615s", "10y 1s", "87661h", "3653d"] {
            let message = error_at(&template.replace('V', value), path);
            assert!(message.contains("more than 10 years"), "{message}");
        }
        for (value, secs) in [
            ("10y", 315_576_000),
            ("87660h", 315_576_000),
            ("3652d", 315_532_800),
        ] {
            let config = parse_ok(&template.replace('V', value));
            let yaml = config.to_yaml();
            assert!(
                yaml.contains(&format!(": {}h\n", secs / 3600)),
                "{value}: {yaml}"
            );
        }
    }
    for (template, path) in SIZE_KEYS {
        for value in [
            "1025GiB",
            "1099511627777",
            "\"1099511627777\"",
            "1100GB",
            "18446744073709551615",
        ] {
            let message = error_at(&template.replace('V', value), path);
            assert!(message.contains("more than 1 TiB"), "{message}");
        }
        for value in ["1024GiB", "1099511627776", "1099GB"] {
            parse_ok(&template.replace('V', value));
        }
    }
}

#[test]
fn bad_sizes_name_their_field() {
    let message = error_at(
        &with_minimal("idempotency:\n  max_request_body: 1XB\n"),
        "idempotency.max_request_body",
    );
    assert!(message.contains("'1XB'"), "{message}");
    error_at(
        &with_minimal("idempotency:\n  max_response_body: 1.5MiB\n"),
        "idempotency.max_response_body",
    );
    error_at(
        &with_minimal("idempotency:\n  max_response_body: -1\n"),
        "idempotency.max_response_body",
    );
    error_at(
        &with_minimal("idempotency:\n  max_response_body: 2.5\n"),
        "idempotency.max_response_body",
    );
    let config = parse_ok(&with_minimal(
        "idempotency:\n  max_request_body: 2048\n  max_response_body: \"1GiB\"\n",
    ));
    assert_eq!(config.idempotency.max_request_body, 2048);
    assert_eq!(config.idempotency.max_response_body, 1 << 30);
}

#[test]
fn upstream_url_defaults_to_port_9000_and_must_be_plain_http() {
    for empty in [
        "",
        "# nothing\n",
        "{}",
        "upstream: {}\n",
        "upstream:\n",
        "listen: 127.0.0.1:8080\n",
    ] {
        let config = Config::from_yaml_str(empty, &|_| None).expect("every key has a default");
        assert_eq!(
            config.upstream.url.to_string(),
            "http://127.0.0.1:9000/",
            "{empty:?}"
        );
    }
    let config =
        Config::from_yaml_str("upstream:\n  url: https://api.example.com/v1/\n", &|_| None)
            .expect("https upstreams are accepted (docs/behaviour.md §11)");
    assert_eq!(
        config.upstream.url.to_string(),
        "https://api.example.com/v1"
    );
    assert_eq!(
        config.upstream.url.port_u16(),
        None,
        "443 is the connector's default"
    );
    for bad in [
        "not a url",
        "ftp://host",
        "/relative",
        "http://",
        "http://host:0",
        "http://u:p@host",
        "http://h/?q=1",
        "127.0.0.1:9000",
        "9000",
    ] {
        error_at(&format!("upstream:\n  url: \"{bad}\"\n"), "upstream.url");
    }
    let config = parse_ok("upstream:\n  url: http://backend\n");
    assert_eq!(config.upstream.url.host(), Some("backend"));
    assert_eq!(
        config.upstream.url.port_u16(),
        None,
        "the default port 80 is left implicit"
    );
    assert_eq!(config.upstream.url.path(), "/");
}

#[test]
fn addresses_are_socket_addresses() {
    error_at(&with_minimal("listen: localhost:8080\n"), "listen");
    error_at(&with_minimal("listen: 8080\n"), "listen");
    error_at(
        &with_minimal("admin:\n  listen: 127.0.0.1\n"),
        "admin.listen",
    );
    let disabled = parse_ok(&with_minimal("admin:\n  listen: null\n"));
    assert_eq!(disabled.admin.listen, None);
    let disabled = parse_ok(&with_minimal("admin:\n  listen:\n"));
    assert_eq!(disabled.admin.listen, None);
    assert_eq!(
        parse_ok(&with_minimal("admin: {}\n")).admin.listen,
        Some("127.0.0.1:9901".parse().unwrap())
    );
}

/// `admin.token` is a string, `${VAR}` works, and it is never printed
/// (docs/behaviour.md §13).
#[test]
fn the_admin_token_is_a_visible_string_and_never_printed() {
    assert_eq!(parse_ok(&with_minimal("admin: {}\n")).admin.token, None);
    let env = |name: &str| (name == "ADMIN_TOKEN").then(|| "tok-3f9a".to_owned());
    let config = Config::from_yaml_str(&with_minimal("admin:\n  token: ${ADMIN_TOKEN}\n"), &env)
        .expect("valid");
    assert_eq!(config.admin.token, Some(AdminToken::new("tok-3f9a")));
    let shown = format!("{config:?}\n{}", config.to_yaml());
    assert!(!shown.contains("tok-3f9a"), "{shown}");
    assert!(
        config.to_yaml().contains("token: '***'"),
        "{}",
        config.to_yaml()
    );
    for bad in ["''", "'  '", "'two words'", "\"tab\\there\""] {
        let message = error_at(
            &with_minimal(&format!("admin:\n  token: {bad}\n")),
            "admin.token",
        );
        assert!(message.contains("must"), "{message}");
    }
    error_at(&with_minimal("admin:\n  token: [a]\n"), "admin.token");
}

/// `***`, which `--check` prints in place of a secret, is refused as one, naming the key:
/// a server started from `--check` output used to accept `Bearer ***`.
#[test]
fn a_masked_secret_is_an_error_naming_its_key() {
    let message = error_at(&with_minimal("admin:\n  token: '***'\n"), "admin.token");
    assert!(message.contains("'***'"), "{message}");
    let redis = |store: &str| with_minimal(&format!("store:\n  kind: redis\n{store}"));
    for (store, path) in [
        ("  url: redis://:***@h:1/0\n", "store.url"),
        ("  url: rediss://admin:***@h:1/0\n", "store.url"),
        ("  url: redis://***@h:1/0\n", "store.url"),
        ("  url: redis://u:%2A%2a*@h:1/0\n", "store.url"),
        (
            "  urls: [redis://a:1, \"redis://:***@b:2\"]\n",
            "store.urls[1]",
        ),
        (
            "  sentinel:\n    master_name: m\n    urls: [\"redis://:***@s:26379\"]\n",
            "store.sentinel.urls[0]",
        ),
    ] {
        let message = error_at(&redis(store), path);
        assert!(message.contains("'***' for its password"), "{message}");
    }
    // A password that merely contains the mask is a password; a URL that no store
    // reads is not checked (keys that do not apply are allowed).
    parse_ok(&redis("  url: redis://:a***@h:1/0\n"));
    parse_ok(&with_minimal("store:\n  url: redis://:***@h:1/0\n"));
    parse_ok(&with_minimal("admin:\n  token: '****'\n"));
}

/// `--check` output opens with a comment naming the secrets it masked, and loads back
/// only once they are filled in: as it is, it is an error naming the first of them.
#[test]
fn check_output_with_secrets_is_refused_until_they_are_filled_in() {
    let env = env_map(&[("TOKEN", "tok-3f9a"), ("PASSWORD", "hunter2")]);
    let load = |text: &str| Config::from_yaml_str(&with_minimal(text), &env).unwrap();
    let token = load("admin:\n  token: ${TOKEN}\n");
    let yaml = token.to_yaml();
    assert!(yaml.starts_with("# Secrets are printed as ***"), "{yaml}");
    assert!(yaml.contains("\n#   admin.token\n"), "{yaml}");
    let message = error_at(&yaml, "admin.token");
    assert!(message.contains("'***'"), "{message}");
    assert_eq!(
        parse_ok(&yaml.replace("***", "tok-3f9a")).admin.token,
        token.admin.token
    );

    let url = load("store:\n  kind: redis\n  url: redis://:${PASSWORD}@cache:6379/0\n");
    let yaml = url.to_yaml();
    assert!(yaml.contains("\n#   store.url\n"), "{yaml}");
    assert!(
        !yaml.contains("admin.token") && !yaml.contains("hunter2"),
        "{yaml}"
    );
    error_at(&yaml, "store.url");
    assert_eq!(parse_ok(&yaml.replace("***", "hunter2")), url);

    let several =
        load("store:\n  kind: redis\n  urls: [redis://a:1, \"redis://:${PASSWORD}@b:2\"]\n");
    let yaml = several.to_yaml();
    assert!(yaml.contains("\n#   store.urls[1]\n"), "{yaml}");
    let sentinels = load(
        "store:\n  kind: redis\n  sentinel:\n    master_name: m\n    \
         urls: [redis://s:1, \"redis://u:${PASSWORD}@t:2\"]\n",
    );
    let yaml = sentinels.to_yaml();
    assert!(yaml.contains("\n#   store.sentinel.urls[1]\n"), "{yaml}");
    // A memory store's URLs are not in force, so neither printed nor named.
    let memory = load(
        "store:\n  kind: memory\n  urls: [redis://a:1, \"redis://:${PASSWORD}@b:2\"]\n  \
         sentinel:\n    master_name: m\n    urls: [redis://s:1, \"redis://u:${PASSWORD}@t:2\"]\n",
    );
    let yaml = memory.to_yaml();
    assert!(
        !yaml.starts_with('#') && !yaml.contains("hunter2"),
        "{yaml}"
    );

    // Nothing masked, no comment: the output is the configuration alone.
    assert!(!parse_ok(MINIMAL).to_yaml().starts_with('#'));
}

#[test]
fn method_lists_must_not_be_empty() {
    let message = error_at(
        &with_minimal("idempotency:\n  methods: []\n"),
        "idempotency.methods",
    );
    assert!(
        message.starts_with("idempotency.methods: must not be empty"),
        "{message}"
    );
    error_at(
        &with_minimal("routes:\n  - path: /a\n    methods: []\n"),
        "routes[0].methods",
    );
    error_at(
        &with_minimal("idempotency:\n  methods: [POST, \"P O\"]\n"),
        "idempotency.methods[1]",
    );
    error_at(
        &with_minimal("idempotency:\n  methods: POST\n"),
        "idempotency.methods",
    );
}

#[test]
fn header_names_and_statuses_are_checked() {
    error_at(
        &with_minimal("idempotency:\n  header: \"Idempotency Key\"\n"),
        "idempotency.header",
    );
    error_at(
        &with_minimal("idempotency:\n  scope_headers: [authorization, \"x:y\"]\n"),
        "idempotency.scope_headers[1]",
    );
    error_at(
        &with_minimal("idempotency:\n  release_statuses: [429, 600]\n"),
        "idempotency.release_statuses[1]",
    );
    error_at(
        &with_minimal("idempotency:\n  release_statuses: [99]\n"),
        "idempotency.release_statuses[0]",
    );
    error_at(
        &with_minimal("idempotency:\n  release_statuses: [\"abc\"]\n"),
        "idempotency.release_statuses[0]",
    );
    let config = parse_ok(&with_minimal(
        "idempotency:\n  release_statuses: []\n  scope_headers: []\n",
    ));
    assert!(config.idempotency.release_statuses.is_empty());
    assert!(config.idempotency.scope_headers.is_empty());
}

/// Pointers are checked at load, and `fingerprint_ignore` needs `json`
/// (docs/behaviour.md §10).
#[test]
fn fingerprint_keys_are_checked() {
    let message = error_at(
        &with_minimal("idempotency:\n  fingerprint_body: canonical\n"),
        "idempotency.fingerprint_body",
    );
    assert!(message.contains("expected one of raw, json"), "{message}");
    error_at(
        &with_minimal("idempotency:\n  fingerprint_query: maybe\n"),
        "idempotency.fingerprint_query",
    );
    let message = error_at(
        &with_minimal(
            "routes:\n  - path: /a\n    fingerprint_body: json\n    fingerprint_ignore: [/ok, ts]\n",
        ),
        "routes[0].fingerprint_ignore[1]",
    );
    assert!(
        message.contains("must be \"\" or start with '/'"),
        "{message}"
    );
    let message = error_at(
        &with_minimal("idempotency:\n  fingerprint_body: json\n  fingerprint_ignore: [\"/a~2\"]\n"),
        "idempotency.fingerprint_ignore[0]",
    );
    assert!(message.contains("~0 for '~'"), "{message}");
    error_at(
        &with_minimal("idempotency:\n  fingerprint_ignore: /ts\n"),
        "idempotency.fingerprint_ignore",
    );
    // Pointers with `raw`: written so, or a route turning `raw` back on under an
    // inherited list, or a route listing pointers under an inherited `raw`.
    let message = error_at(
        &with_minimal("idempotency:\n  fingerprint_ignore: [/ts]\n"),
        "idempotency.fingerprint_ignore",
    );
    assert!(
        message.contains("needs fingerprint_body: json"),
        "{message}"
    );
    error_at(
        &with_minimal(
            "idempotency:\n  fingerprint_body: json\n  fingerprint_ignore: [/ts]\n\
             routes:\n  - path: /a\n  - path: /b\n    fingerprint_body: raw\n",
        ),
        "routes[1].fingerprint_ignore",
    );
    error_at(
        &with_minimal("routes:\n  - path: /a\n    fingerprint_ignore: [/ts]\n"),
        "routes[0].fingerprint_ignore",
    );
}

#[test]
fn enums_list_their_variants() {
    let message = error_at(&with_minimal("store:\n  kind: mysql\n"), "store.kind");
    assert_eq!(
        message,
        "store.kind: unknown variant 'mysql', expected one of memory, file, redis, postgres \
         (line 4 column 9)"
    );
    let message = error_at(
        &with_minimal("store:\n  on_unavailable: ignore\n"),
        "store.on_unavailable",
    );
    assert_eq!(
        message,
        "store.on_unavailable: unknown variant 'ignore', expected one of reject, pass_through \
         (line 4 column 19)"
    );
    let message = error_at(
        &with_minimal("idempotency:\n  on_concurrent: queue\n"),
        "idempotency.on_concurrent",
    );
    assert!(
        message.ends_with("expected one of reject, wait (line 4 column 18)"),
        "{message}"
    );
    let message = error_at(
        &with_minimal("routes:\n  - path: /a\n    on_unknown_outcome: retry\n"),
        "routes[0].on_unknown_outcome",
    );
    assert!(
        message.ends_with("expected one of record, release (line 5 column 25)"),
        "{message}"
    );
    let message = error_at(&with_minimal("log:\n  format: xml\n"), "log.format");
    assert!(
        message.ends_with("expected one of text, json (line 4 column 11)"),
        "{message}"
    );
    error_at(&with_minimal("store:\n  kind: 1\n"), "store.kind");
}

#[test]
fn log_levels_are_validated() {
    for (given, kept) in [
        ("warn", "warn"),
        ("ERROR", "error"),
        (
            "info,idemgate=debug,hyper=warn",
            "info,idemgate=debug,hyper=warn",
        ),
    ] {
        assert_eq!(
            parse_ok(&with_minimal(&format!("log:\n  level: \"{given}\"\n")))
                .log
                .level,
            kept
        );
    }
    for bad in ["verbose", "", "idemgate=loud", "a b", "idemgate", "info,"] {
        error_at(
            &with_minimal(&format!("log:\n  level: \"{bad}\"\n")),
            "log.level",
        );
    }
}

#[test]
fn store_urls_are_checked_only_for_redis() {
    // Accepted, and not in force: a memory store connects to no URL.
    let memory = parse_ok(&with_minimal("store:\n  kind: memory\n  url: not-a-url\n"));
    assert_eq!(memory.store.urls, ["redis://127.0.0.1:6379/0"]);
    let message = error_at(
        &with_minimal("store:\n  kind: redis\n  url: http://cache:6379\n"),
        "store.url",
    );
    assert!(message.contains("redis://"), "{message}");
    error_at(
        &with_minimal("store:\n  kind: redis\n  url: redis://:6379\n"),
        "store.url",
    );
    error_at(
        &with_minimal("store:\n  kind: redis\n  url: redis://cache:notaport\n"),
        "store.url",
    );
    error_at(
        &with_minimal("store:\n  kind: redis\n  url: redis://cache/db\n"),
        "store.url",
    );
    error_at(
        &with_minimal("store:\n  max_entries: 0\n"),
        "store.max_entries",
    );
    error_at(
        &with_minimal("store:\n  max_entries: -5\n"),
        "store.max_entries",
    );
    let ok = parse_ok(&with_minimal(
        "store:\n  kind: redis\n  url: redis://[::1]:6379/2?protocol=resp3\n",
    ));
    assert!(!ok.store.cluster);
}

#[test]
fn cluster_follows_the_flag_or_the_url_count_and_refuses_databases() {
    let seeds = parse_ok(&with_minimal(
        "store:\n  kind: redis\n  url: redis://ignored:1/0\n  urls: [redis://a:7000, redis://b:7000]\n",
    ));
    assert!(seeds.store.cluster);
    assert_eq!(seeds.store.urls, ["redis://a:7000", "redis://b:7000"]);
    let flagged = parse_ok(&with_minimal("store:\n  kind: redis\n  cluster: true\n"));
    assert!(flagged.store.cluster);
    assert_eq!(flagged.store.urls, ["redis://127.0.0.1:6379"]);
    let message = error_at(
        &with_minimal("store:\n  kind: redis\n  urls: [redis://a:7000, redis://b:7000/1]\n"),
        "store.urls[1]",
    );
    assert!(message.contains("no database number"), "{message}");
    error_at(
        &with_minimal("store:\n  kind: redis\n  cluster: true\n  url: redis://a:7000/0\n"),
        "store.url",
    );
    let empty_list = parse_ok(&with_minimal(
        "store:\n  kind: redis\n  urls: []\n  url: redis://x:1/0\n",
    ));
    assert_eq!(empty_list.store.urls, ["redis://x:1/0"]);
}

/// The sentinels watch one master, and `WAIT` counts one master's replicas; neither
/// goes with a cluster (docs/behaviour.md §14).
#[test]
fn sentinel_and_min_replicas_refuse_a_cluster() {
    let sentinel = "  sentinel:\n    master_name: mymaster\n    urls: [redis://s1:26379]\n";
    let ok = parse_ok(&with_minimal(&format!(
        "store:\n  kind: redis\n{sentinel}  min_replicas: 1\n"
    )));
    assert_eq!(ok.store.min_replicas, 1);
    assert_eq!(
        ok.store.sentinel.as_ref().map(|s| s.master_name.as_str()),
        Some("mymaster")
    );
    let message = error_at(
        &with_minimal(&format!(
            "store:\n  kind: redis\n  cluster: true\n{sentinel}"
        )),
        "store.sentinel",
    );
    assert!(message.contains("cluster"), "{message}");
    // Several URLs make a cluster too.
    error_at(
        &with_minimal(&format!(
            "store:\n  kind: redis\n  urls: [redis://a:1, redis://b:1]\n{sentinel}"
        )),
        "store.sentinel",
    );
    let message = error_at(
        &with_minimal("store:\n  kind: redis\n  cluster: true\n  min_replicas: 1\n"),
        "store.min_replicas",
    );
    assert!(message.contains("cluster"), "{message}");
    // 0 is the default, and what a cluster takes.
    parse_ok(&with_minimal(
        "store:\n  kind: redis\n  cluster: true\n  min_replicas: 0\n",
    ));
    // Keys that do not apply to the kind are allowed (docs/behaviour.md §8).
    parse_ok(&with_minimal(
        "store:\n  kind: memory\n  cluster: true\n  min_replicas: 2\n",
    ));
}

#[test]
fn sentinel_needs_a_name_and_good_urls() {
    let store = |body: &str| with_minimal(&format!("store:\n  kind: redis\n  sentinel:\n{body}"));
    error_at(
        &store("    urls: [redis://s1:26379]\n"),
        "store.sentinel.master_name",
    );
    error_at(&store("    master_name: m\n"), "store.sentinel.urls");
    error_at(
        &store("    master_name: m\n    urls: []\n"),
        "store.sentinel.urls",
    );
    let message = error_at(
        &store("    master_name: m\n    urls: [redis://s1:26379, http://s2:26379]\n"),
        "store.sentinel.urls[1]",
    );
    assert!(message.contains("redis://"), "{message}");
    error_at(
        &store("    master_name: m\n    url: redis://s1:26379\n"),
        "store.sentinel.url",
    );
    error_at(
        &with_minimal("store:\n  kind: redis\n  min_replicas: many\n"),
        "store.min_replicas",
    );
    error_at(
        &with_minimal("store:\n  kind: redis\n  min_replicas: 1000\n"),
        "store.min_replicas",
    );
    // A password in a sentinel URL is never printed by --check.
    let secret = parse_ok(&store(
        "    master_name: m\n    urls: [\"redis://:hunter2@s1:26379/2\"]\n",
    ));
    let yaml = secret.to_yaml();
    assert!(!yaml.contains("hunter2"), "{yaml}");
    assert!(yaml.contains("redis://:***@s1:26379/2"), "{yaml}");
}

#[test]
fn a_missing_env_var_names_the_field_and_the_variable() {
    let text =
        with_minimal("store:\n  kind: redis\n  url: redis://:${REDIS_PASSWORD}@cache:6379/0\n");
    let err = parse(&text).unwrap_err();
    assert!(
        matches!(&err, ConfigError::MissingEnv { path, var, .. } if path == "store.url" && var == "REDIS_PASSWORD")
    );
    assert_eq!(
        err.to_string(),
        "store.url: environment variable REDIS_PASSWORD is not set (referenced as \
         ${REDIS_PASSWORD}) (line 5 column 8)"
    );
    error_at(
        &with_minimal("routes:\n  - path: /a\n    scope_headers: [a, \"${X}\"]\n"),
        "routes[0].scope_headers[1]",
    );
    error_at(
        &with_minimal("log:\n  level: \"${UNCLOSED\"\n"),
        "log.level",
    );
    error_at(&with_minimal("log:\n  level: \"${1BAD}\"\n"), "log.level");
}

#[test]
fn yaml_syntax_errors_give_a_position() {
    let message = parse("upstream:\n  url: 'unclosed\n")
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("line 2 column 8: invalid YAML"),
        "{message}"
    );
    // The parser reads as it goes: an unclosed `[` where a URL belongs is refused as
    // soon as it opens, as the wrong type, before the end of the file shows it unclosed.
    let message = parse("upstream:\n  url: [\n").unwrap_err().to_string();
    assert!(
        message.starts_with("upstream.url: invalid type: sequence") && message.contains("(line 2 "),
        "{message}"
    );
    // Under a key the configuration has, so that the parser reads as far as the value.
    let message = parse("store:\n  key_prefix: idemgate:\n    x: y")
        .unwrap_err()
        .to_string();
    assert!(message.contains("invalid YAML"), "{message}");
    let message = parse("- just\n- a list\n").unwrap_err().to_string();
    assert!(
        message.starts_with("(top level): invalid type: sequence"),
        "{message}"
    );
    // Keys the configuration has, which the parser reads as far as the second one.
    let message = parse("listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n")
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("listen: duplicate key") && message.ends_with("(line 2 column 1)"),
        "{message}"
    );
    let message = error_at(
        &with_minimal("routes:\n  - path: /a\n    ttl: 1h\n    ttl: 2h\n"),
        "routes[0].ttl",
    );
    assert!(message.contains("duplicate"), "{message}");
}

#[test]
fn the_keys_of_one_view_and_of_answers_have_their_defaults_and_their_errors() {
    let config = parse_ok(MINIMAL);
    assert_eq!(config.route_match, RouteMatch::Exact);
    assert_eq!(config.listen_header_timeout, secs(30));
    assert_eq!(config.max_connections, 10_000);
    assert_eq!(config.max_buffered_bytes, 256 << 20);
    assert_eq!(config.errors.format, ErrorFormat::Problem);
    assert_eq!(config.errors.content_type, "application/json");
    assert!(config.idempotency.scope_cookies.is_empty());
    assert_eq!(
        config.idempotency.replay_error_headers,
        vec![(
            header("x-should-retry"),
            http::HeaderValue::from_static("false")
        )]
    );
    let off = parse_ok(&with_minimal("idempotency:\n  replay_error_headers: {}\n"));
    assert!(off.idempotency.replay_error_headers.is_empty());

    error_at(&with_minimal("route_match: fuzzy\n"), "route_match");
    error_at(&with_minimal("max_connections: 0\n"), "max_connections");
    assert_eq!(config.workers, Workers::Auto);
    assert!(config.workers.resolve() >= 1);
    assert_eq!(
        parse_ok(&with_minimal("workers: auto\n")).workers,
        Workers::Auto
    );
    assert_eq!(parse_ok(&with_minimal("workers: 2\n")).workers.resolve(), 2);
    let shared = parse_ok(&with_minimal("workers: shared\n")).workers;
    assert_eq!((shared, shared.resolve()), (Workers::Shared, 1));
    for workers in ["shared", "auto", "7"] {
        let config = parse_ok(&with_minimal(&format!("workers: {workers}\n")));
        assert_eq!(
            parse_ok(&config.to_yaml()).workers,
            config.workers,
            "--check prints workers: {workers} back"
        );
    }
    for bad in ["0", "-1", "1025", "lots", "1.5", "true"] {
        error_at(&with_minimal(&format!("workers: {bad}\n")), "workers");
    }
    error_at(
        &with_minimal("max_buffered_bytes: lots\n"),
        "max_buffered_bytes",
    );
    error_at(
        &with_minimal("listen_header_timeout: 0s\n"),
        "listen_header_timeout",
    );
    error_at(
        &with_minimal("routes:\n  - path: /a\n    scope_cookies: [\"a b\"]\n"),
        "routes[0].scope_cookies[0]",
    );
    error_at(
        &with_minimal("idempotency:\n  replay_error_headers: {\"bad header\": x}\n"),
        "idempotency.replay_error_headers.bad header",
    );
    error_at(
        &with_minimal("idempotency:\n  replay_error_headers: [x-should-retry]\n"),
        "idempotency.replay_error_headers",
    );
    error_at(
        &with_minimal("errors:\n  format: template\n"),
        "errors.template",
    );
    let message = error_at(
        &with_minimal("errors:\n  format: template\n  template: '{\"error\": {detail}}'\n"),
        "errors.template",
    );
    assert!(message.contains("not valid JSON"), "{message}");
    error_at(
        &with_minimal("errors:\n  content_type: json\n"),
        "errors.content_type",
    );
    error_at(&with_minimal("errors:\n  format: xml\n"), "errors.format");
}

#[test]
fn case_insensitive_routes_match_regardless_of_ascii_case() {
    let yaml = with_minimal("routes:\n  - path: /charges\n    ttl: 1h\n");
    let exact = parse_ok(&yaml);
    assert_eq!(exact.route_index("/Charges/1"), None);
    let loose = parse_ok(&format!("{yaml}route_match: case_insensitive\n"));
    assert_eq!(loose.route_index("/Charges/1"), Some(0));
    assert_eq!(loose.route_index("/CHARGES"), Some(0));
    assert_eq!(loose.route_index("/ChargesX"), None);
}

#[test]
fn key_sources_are_checked() {
    let at = |yaml: &str, path: &str| error_at(&with_minimal(yaml), path);
    // Both spellings in one section, at the top or in a route.
    let message = at(
        "idempotency:\n  header: X-Key\n  key_from: [{header: X-Request-Id}]\n",
        "idempotency.key_from",
    );
    assert!(message.contains("idempotency.header"), "{message}");
    at(
        "routes:\n  - path: /a\n    header: X-Key\n    key_from: [{query: id}]\n",
        "routes[0].key_from",
    );
    let message = at("idempotency:\n  key_from: []\n", "idempotency.key_from");
    assert!(message.contains("must not be empty"), "{message}");
    // Each entry has exactly one of the four keys.
    let message = at(
        "idempotency:\n  key_from:\n    - header: X-Request-Id\n      query: id\n",
        "idempotency.key_from[0]",
    );
    assert!(
        message.contains("exactly one of header, query, json, fingerprint"),
        "{message}"
    );
    let message = at(
        "idempotency:\n  key_from: [{}]\n",
        "idempotency.key_from[0]",
    );
    assert!(message.contains("exactly one of"), "{message}");
    let message = at(
        "idempotency:\n  key_from: [{cookie: sid}]\n",
        "idempotency.key_from[0]",
    );
    assert!(
        message
            .contains("unknown field 'cookie', expected one of header, query, json, fingerprint"),
        "{message}"
    );
    at(
        "idempotency:\n  key_from: [X-Request-Id]\n",
        "idempotency.key_from[0]",
    );
    at(
        "idempotency:\n  key_from: {header: X}\n",
        "idempotency.key_from",
    );
    // Each value is checked as its kind.
    at(
        "idempotency:\n  key_from: [{header: \"bad header\"}]\n",
        "idempotency.key_from[0].header",
    );
    at(
        "idempotency:\n  key_from: [{query: \"\"}]\n",
        "idempotency.key_from[0].query",
    );
    let message = at(
        "idempotency:\n  key_from: [{header: A}, {json: payment/ref}]\n",
        "idempotency.key_from[1].json",
    );
    assert!(
        message.contains("must be \"\" or start with '/'"),
        "{message}"
    );
    at(
        "idempotency:\n  key_from: [{json: \"/a~2\"}]\n",
        "idempotency.key_from[0].json",
    );
    at(
        "idempotency:\n  key_from: [{fingerprint: 0s}]\n",
        "idempotency.key_from[0].fingerprint",
    );
    at(
        "idempotency:\n  key_from: [{fingerprint: 120}]\n",
        "idempotency.key_from[0].fingerprint",
    );
    // `fingerprint` is always present, so it is the last source.
    let message = at(
        "idempotency:\n  key_from: [{fingerprint: 2m}, {header: X-Request-Id}]\n",
        "idempotency.key_from",
    );
    assert!(message.contains("must be the last source"), "{message}");
    // The window is no longer than ttl, on the merged policy.
    let message = at(
        "idempotency:\n  ttl: 1m\n  key_from: [{header: A}, {fingerprint: 2m}]\n",
        "idempotency.key_from[1].fingerprint",
    );
    assert!(
        message.contains("window 2m is longer than ttl 1m"),
        "{message}"
    );
    at(
        "idempotency:\n  key_from: [{fingerprint: 2m}]\nroutes:\n  - path: /a\n    ttl: 30s\n",
        "routes[0].key_from[0].fingerprint",
    );
    // Equal is fine, and a route that replaces the sources drops the window.
    parse_ok(&with_minimal(
        "idempotency:\n  ttl: 2m\n  key_from: [{fingerprint: 2m}]\n\
         routes:\n  - path: /a\n    ttl: 1m\n    header: X-Key\n",
    ));
}

/// docs/behaviour.md §22: the keys that mislead with PostgreSQL are refused by name, and
/// the URL and table are checked without echoing the password.
#[test]
fn postgres_refuses_what_it_cannot_honour() {
    let pg = "store:\n  kind: postgres\n  url: postgres://app:s3cret@db:5432/app\n";
    for (extra, at) in [
        ("  min_replicas: 1\n", "store.min_replicas"),
        (
            "  max_entries_per_scope: 10\n",
            "store.max_entries_per_scope",
        ),
        ("  table: \"x; drop table y\"\n", "store.table"),
        ("  pool_size: 0\n", "store.pool_size"),
        (
            "  tls: {ca_file: /nonexistent/ca.pem}\n",
            "store.tls.ca_file",
        ),
    ] {
        let message = error_at(&with_minimal(&format!("{pg}{extra}")), at);
        assert!(!message.contains("s3cret"), "{message}");
    }
    let message = error_at(&with_minimal("store:\n  kind: postgres\n"), "store.url");
    assert!(message.contains("missing"), "{message}");
    let message = error_at(
        &with_minimal("store:\n  kind: postgres\n  url: redis://:s3cret@h:6379/0\n"),
        "store.url",
    );
    assert!(!message.contains("s3cret"), "{message}");
    error_at(
        &with_minimal("store:\n  kind: postgres\n  urls: [postgres://a/b, postgres://c/d]\n"),
        "store.urls",
    );
    error_at(
        &with_minimal(
            "store:\n  kind: postgres\n  url: postgres://u@h/app?sslmode=verify-nothing\n",
        ),
        "store.url",
    );
}
