//! The shipped example files, `to_yaml`, and robustness against arbitrary input.

use std::path::Path;

use proptest::prelude::*;

use super::*;

fn example_files() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            )
        })
        .collect();
    files.sort();
    files
}

/// What scripts/demo.sh sets `IDEMGATE_DEMO_PGURL` to, its port aside.
const DEMO_PGURL: &str = "postgres://postgres@127.0.0.1:54321/postgres?sslmode=disable";

fn parse_example(path: &Path) -> Config {
    let text = std::fs::read_to_string(path).unwrap();
    // demo-file.yaml's store directory, and demo-postgres.yaml's database, are the ones
    // scripts/demo.sh chooses.
    let env = env_map(&[
        ("REDIS_PASSWORD", "s3cr3t"),
        ("IDEMGATE_DEMO_STORE", "/tmp/idemgate-demo"),
        ("IDEMGATE_DEMO_PGURL", DEMO_PGURL),
    ]);
    Config::from_yaml_str(&text, &env).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

#[test]
fn every_example_config_parses() {
    let files = example_files();
    let names: Vec<_> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    for expected in [
        "cluster.yaml",
        "demo.yaml",
        "demo-file.yaml",
        "demo-postgres.yaml",
        "docker.yaml",
        "example.yaml",
        "file.yaml",
        "legacy.yaml",
        "minimal.yaml",
        "redis.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "config/{expected} is missing"
        );
    }
    for path in &files {
        parse_example(path);
    }
}

#[test]
fn the_annotated_example_is_exactly_the_defaults_plus_its_routes() {
    let example = parse_example(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.yaml"));
    let defaults = parse_ok(MINIMAL);
    assert_eq!(
        Config {
            routes: vec![],
            ..example.clone()
        },
        defaults
    );
    assert_eq!(policy_for(&example, "/charges/1").methods, [Method::POST]);
    assert!(!policy_for(&example, "/webhooks").enabled);
}

#[test]
fn the_example_configs_say_what_they_promise() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let demo = parse_example(&dir.join("demo.yaml"));
    assert_eq!(demo.store.kind, StoreKind::Memory);
    assert_eq!(demo.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(demo.admin.listen, Some("127.0.0.1:9901".parse().unwrap()));
    let charges = policy_for(&demo, "/charges");
    assert!(charges.required && charges.methods == [Method::POST]);
    assert!(!policy_for(&demo, "/webhooks").enabled);

    let postgres = parse_example(&dir.join("demo-postgres.yaml"));
    assert_eq!(postgres.store.kind, StoreKind::Postgres);
    assert_eq!(postgres.store.urls, [DEMO_PGURL]);
    assert_eq!(postgres.listen, demo.listen);
    assert_eq!(postgres.admin.listen, demo.admin.listen);
    assert!(policy_for(&postgres, "/charges").required);

    let docker = parse_example(&dir.join("docker.yaml"));
    assert_eq!(docker.store.kind, StoreKind::Redis);
    assert_eq!(docker.store.urls, ["redis://redis:6379/0"]);
    assert_eq!(docker.upstream.url.host(), Some("backend"));
    assert_eq!(docker.admin.listen, Some("0.0.0.0:9901".parse().unwrap()));

    let cluster = parse_example(&dir.join("cluster.yaml"));
    assert!(cluster.store.cluster);
    assert_eq!(cluster.store.urls.len(), 3);

    let legacy = parse_example(&dir.join("legacy.yaml"));
    assert_eq!(legacy.upstream.url.scheme_str(), Some("https"));
    assert_eq!(legacy.idempotency.key_from.len(), 2);
    let label = |path: &str| -> Vec<String> {
        policy_for(&legacy, path)
            .key_from
            .iter()
            .map(|source| source.label())
            .collect()
    };
    assert_eq!(label("/v1/payments"), ["json:/payment/reference"]);
    assert_eq!(label("/v1/legacy/charge"), ["query:request_id"]);
    assert_eq!(label("/v1/newsletter/subscribe"), ["fingerprint"]);
    assert!(!policy_for(&legacy, "/ws").enabled);

    let file = parse_example(&dir.join("file.yaml"));
    assert_eq!(file.store.kind, StoreKind::File);
    assert_eq!(file.store.path, Path::new("/var/lib/idemgate"));
    assert!(file.store.fsync);

    let redis = parse_example(&dir.join("redis.yaml"));
    assert_eq!(redis.store.urls, ["redis://:s3cr3t@127.0.0.1:6379/0"]);
}

/// Secrets are printed `***` and must be filled in before the output loads back.
#[test]
fn to_yaml_round_trips_every_example_once_its_secrets_are_filled_in() {
    for path in example_files() {
        let config = parse_example(&path);
        let yaml = fill_in(&config.to_yaml());
        let reparsed =
            parse(&yaml).unwrap_or_else(|err| panic!("{}: {err}\n{yaml}", path.display()));
        assert_eq!(
            reparsed,
            with_secrets_filled(config),
            "{}\n{yaml}",
            path.display()
        );
    }
}

#[test]
fn to_yaml_round_trips_unusual_values() {
    for text in [
        EVERYTHING.to_owned(),
        with_minimal(
            "admin:\n  listen: null\nidempotency:\n  max_request_body: 1000\n  max_response_body: 0\n  ttl: 1500ms\n",
        ),
    ] {
        let config = parse_ok(&text);
        let yaml = fill_in(&config.to_yaml());
        assert_eq!(parse_ok(&yaml), with_secrets_filled(config), "{yaml}");
    }
}

/// A `${` in a value, from a variable or from `$${`, is printed `$${`, so that `--check`
/// output loads back to the same configuration (docs/behaviour.md §15).
#[test]
fn to_yaml_round_trips_dollar_braces_in_values() {
    let env = env_map(&[("PREFIX", "app${TENANT}:"), ("USER", "u${x}")]);
    let text = with_minimal(
        "store:\n  kind: redis\n  key_prefix: ${PREFIX}\n  url: redis://${USER}:${USER}@h:1/0\n\
         routes:\n  - path: /a$${b}$\n",
    );
    let config = Config::from_yaml_str(&text, &env).unwrap();
    assert_eq!(config.store.key_prefix, "app${TENANT}:");
    assert_eq!(config.routes[0].path, "/a${b}$");
    let yaml = config.to_yaml();
    assert!(yaml.contains("key_prefix: 'app$${TENANT}:'"), "{yaml}");
    assert!(yaml.contains("redis://u$${x}:***@h:1/0"), "{yaml}");
    assert_eq!(
        parse(&fill_in(&yaml)).unwrap(),
        with_secrets_filled(config),
        "{yaml}"
    );
}

#[test]
fn to_yaml_prints_defaults_in_the_documented_units() {
    let yaml = parse_ok(MINIMAL).to_yaml();
    for line in [
        "listen: 127.0.0.1:8080",
        "  url: http://127.0.0.1:9000\n",
        "  ttl: 24h",
        "  lease: 10s",
        "  timeout: 1s",
        "  max_request_body: 1MiB",
        "  max_response_body: 4MiB",
        "  kind: memory",
        "  header: Idempotency-Key",
        "routes: []",
        "  listen: 127.0.0.1:9901",
        "shutdown_timeout: 30s",
    ] {
        assert!(yaml.contains(line), "missing {line:?} in\n{yaml}");
    }
    let routes = parse_ok(&with_minimal(
        "routes:\n  - path: /a\n    ttl: 1h\n  - path: /b\n    enabled: false\n",
    ))
    .to_yaml();
    assert!(
        routes.contains("- path: /a\n  ttl: 1h\n- path: /b\n  enabled: false\n"),
        "{routes}"
    );
}

#[test]
fn to_yaml_never_prints_store_passwords() {
    let env = env_map(&[("REDIS_PASSWORD", "hunter2")]);
    let text = with_minimal(
        "store:\n  kind: redis\n  urls: [\"redis://:${REDIS_PASSWORD}@a:1\", \"rediss://admin:${REDIS_PASSWORD}@b:2\", \"redis://${REDIS_PASSWORD}@c:3\"]\n",
    );
    let config = Config::from_yaml_str(&text, &env).unwrap();
    let yaml = config.to_yaml();
    assert!(!yaml.contains("hunter2"), "{yaml}");
    assert!(yaml.contains("redis://:***@a:1"), "{yaml}");
    assert!(yaml.contains("rediss://admin:***@b:2"), "{yaml}");
    assert!(yaml.contains("redis://***@c:3"), "{yaml}");
    assert_eq!(redact_url("redis://:p@ss@h:1/0"), "redis://:***@h:1/0");
    assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
    let err = parse(&with_minimal(
        "store:\n  kind: redis\n  url: redis://:hunter2@h:bad\n",
    ))
    .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

/// Text rich in what interpolation and YAML quoting look at.
fn dollar_text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "$", "${", "$${", "}", "{", "a", "B_1", " ", ":", "#", "'", "\"", "\\", "-", "é",
        ]),
        0..max,
    )
    .prop_map(|pieces| pieces.concat())
}

proptest! {
    /// `--check` output loads back to the same configuration whatever its string values
    /// hold (docs/behaviour.md §15); store passwords aside, which it prints as `***` and
    /// which are filled in here.
    #[test]
    fn to_yaml_round_trips_any_string_values(
        key_prefix in dollar_text(8),
        user in dollar_text(4).prop_map(|t| t.replace([':', '@', '/', '?', '#'], "")),
        password in dollar_text(4).prop_map(|t| t.replace(['@', '/', '?', '#'], "")),
        file_path in dollar_text(6).prop_map(|t| format!("/{t}")),
        route in "(/[a-z${}]{1,4}){1,2}",
        base_path in "(/[a-z$]{1,4})?",
        level in prop::sample::select(vec!["info", "warn,idemgate=debug", "off"]),
        redis in any::<bool>(),
    ) {
        let base = parse_ok(MINIMAL);
        // Each kind prints its own keys only: a string in a Redis URL, or in a file
        // store's path.
        let store = if redis {
            StoreConfig {
                kind: StoreKind::Redis,
                urls: vec![format!("redis://{user}:{password}@h:6379/0")],
                ..base.store.clone()
            }
        } else {
            StoreConfig { kind: StoreKind::File, path: file_path.into(), ..base.store.clone() }
        };
        let upstream = types::http::parse_upstream_url(&format!("http://b:1{base_path}")).unwrap();
        let config = Config {
            upstream: UpstreamConfig { url: upstream, ..base.upstream.clone() },
            store: StoreConfig { key_prefix, ..store },
            routes: vec![Route {
                path: route,
                policy: base.idempotency.clone(),
                base: base.idempotency.clone(),
            }],
            log: LogConfig { level: level.to_owned(), ..base.log.clone() },
            ..base
        };
        let yaml = fill_in(&config.to_yaml());
        let expected = with_secrets_filled(config);
        prop_assert_eq!(parse(&yaml).map_err(|e| e.to_string()), Ok(expected), "{}", yaml);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,200}") {
        let _ = parse(&text);
    }

    #[test]
    fn yaml_ish_text_never_panics(
        lines in prop::collection::vec(
            (0usize..3, prop::sample::select(vec![
                "listen", "upstream", "url", "store", "kind", "urls", "idempotency", "methods",
                "routes", "- path", "ttl", "max_request_body", "admin", "log", "cluster", "enabled",
                "release_statuses", "bogus", "- ", "<<", "&a", "*a",
            ]), prop::sample::select(vec![
                "", " http://a:1", " 10s", " 10", " 0s", " 1MiB", " 1XB", " [POST]", " []", " null",
                " redis", " true", " ${X}", " ${", " \"", " {}", " [", " - x", " 99999999999999999999",
                " /a", " https://x", " redis://:p@h:1/0", " *a", " &a x", " !tag x",
            ])),
            0..12,
        )
    ) {
        let text: String = lines
            .iter()
            .map(|(indent, key, value)| format!("{}{key}:{value}\n", "  ".repeat(*indent)))
            .collect();
        let env = env_map(&[("X", "1")]);
        if let Ok(config) = Config::from_yaml_str(&text, &env) {
            // Whatever parses must print and parse back, its secrets filled in.
            let yaml = fill_in(&config.to_yaml());
            let reparsed = parse(&yaml);
            prop_assert!(reparsed.is_ok(), "{text}\n---\n{yaml}\n{reparsed:?}");
        }
    }
}

/// Every key path of a mapping (`store.timeout`), leaving out `routes`.
fn key_paths(value: &Tree, prefix: &str, out: &mut Vec<String>) {
    if let Tree::Map(map) = value {
        for (key, child) in map {
            if prefix.is_empty() && key == "routes" {
                continue;
            }
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            key_paths(child, &path, out);
            out.push(path);
        }
    }
}

/// The annotated example documents every key `--check` prints, so a key added to the
/// configuration without its line in config/example.yaml fails here.
#[test]
fn the_annotated_example_names_every_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let written = Tree::parse(&text);
    let (mut in_example, mut every) = (Vec::new(), Vec::new());
    key_paths(&written, "", &mut in_example);
    // `--check` prints the store keys of the chosen kind only: ask each kind.
    for kind in [
        "memory",
        "file",
        "redis",
        "postgres\n  url: postgres://u@h/db",
    ] {
        let config = parse_ok(&with_minimal(&format!("store:\n  kind: {kind}\n")));
        let printed = Tree::parse(&config.to_yaml());
        key_paths(&printed, "", &mut every);
    }
    // `url` and `urls` are one key printed either way.
    let missing: Vec<&String> = every
        .iter()
        .filter(|k| !in_example.contains(k) && k.as_str() != "store.urls")
        .collect();
    assert!(missing.is_empty(), "config/example.yaml lacks {missing:?}");
}
