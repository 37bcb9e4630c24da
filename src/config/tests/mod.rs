//! Loading, defaults, merging and matching; errors and examples are in submodules.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};

use super::*;
use crate::idempotency::fingerprint::BodyForm;
use crate::idempotency::pointer::JsonPointer;
use crate::idempotency::source::KeySource;

mod encryption;
mod errors;
mod examples;
mod key_format;
mod keys;
mod limits;
mod principal;
mod reconcile;
mod reload;
mod telemetry;

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_yaml_str(text, &no_env)
}

fn parse_ok(text: &str) -> Config {
    parse(text).unwrap_or_else(|err| panic!("{err}\n---\n{text}"))
}

/// The error message, asserting it starts with `path: `.
fn error_at(text: &str, path: &str) -> String {
    let message = match parse(text) {
        Ok(config) => panic!("accepted:\n{text}\n---\n{config:?}"),
        Err(err) => err.to_string(),
    };
    assert!(
        message.starts_with(&format!("{path}: ")),
        "expected `{path}: ...`, got `{message}`"
    );
    message
}

const MINIMAL: &str = "upstream:\n  url: http://127.0.0.1:9000\n";

fn with_minimal(extra: &str) -> String {
    format!("{MINIMAL}{extra}")
}

/// What an operator writes over each `***` of `--check` output.
const FILLED: &str = "filled-in";

/// `--check` output with its secrets filled in.
fn fill_in(yaml: &str) -> String {
    yaml.replace(MASK, FILLED)
}

/// What [`fill_in`] of `config.to_yaml()` loads to: `config` with each secret `FILLED`.
fn with_secrets_filled(config: Config) -> Config {
    let postgres = config.store.kind == StoreKind::Postgres;
    let fill = |urls: &[String]| -> Vec<String> {
        urls.iter()
            .map(|url| {
                if postgres {
                    crate::config::sections::store::postgres::mask_pg_url(url, FILLED)
                } else {
                    mask_url(url, FILLED)
                }
            })
            .collect()
    };
    let sentinel = config
        .store
        .sentinel
        .clone()
        .map(|sentinel| SentinelConfig {
            urls: fill(&sentinel.urls),
            ..sentinel
        });
    Config {
        store: StoreConfig {
            urls: fill(&config.store.urls),
            sentinel,
            ..config.store.clone()
        },
        admin: AdminConfig {
            token: config.admin.token.as_ref().map(|_| AdminToken::new(FILLED)),
            ..config.admin.clone()
        },
        telemetry: TelemetryConfig {
            otlp: config.telemetry.otlp.clone().map(|otlp| OtlpConfig {
                headers: otlp
                    .headers
                    .iter()
                    .map(|(name, _)| {
                        let mut value = http::HeaderValue::from_static(FILLED);
                        value.set_sensitive(true);
                        (name.clone(), value)
                    })
                    .collect(),
                ..otlp
            }),
        },
        ..config
    }
}

/// A YAML document's mappings, keys in file order, for the tests that look at which
/// keys a file writes.
#[derive(Debug)]
enum Tree {
    Map(Vec<(String, Tree)>),
    Other,
}

impl Tree {
    fn parse(text: &str) -> Tree {
        serde_saphyr::from_str(text).unwrap_or_else(|err| panic!("{err}\n{text}"))
    }

    fn keys(&self) -> Vec<&str> {
        match self {
            Tree::Map(entries) => entries.iter().map(|(k, _)| k.as_str()).collect(),
            Tree::Other => Vec::new(),
        }
    }

    fn get(&self, key: &str) -> Option<&Tree> {
        match self {
            Tree::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            Tree::Other => None,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Tree {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Tree;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("YAML")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Tree::Map(entries))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Tree::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Tree, E> {
                Ok(Tree::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Tree, E> {
                Ok(Tree::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Tree, E> {
                Ok(Tree::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Tree, E> {
                Ok(Tree::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<Tree, E> {
                Ok(Tree::Other)
            }
            fn visit_unit<E>(self) -> Result<Tree, E> {
                Ok(Tree::Other)
            }
        }
        d.deserialize_any(Visitor)
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

/// The policy that applies to `path`: its route's, else `idempotency`.
fn policy_for<'a>(config: &'a Config, path: &str) -> &'a Policy {
    config
        .route_index(path)
        .map_or(&config.idempotency, |i| &config.routes[i].policy)
}

fn pointers(texts: &[&str]) -> Vec<JsonPointer> {
    texts
        .iter()
        .map(|text| JsonPointer::parse(text).unwrap())
        .collect()
}

fn env_map(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

#[test]
fn a_minimal_file_gets_every_default() {
    let config = parse_ok(MINIMAL);
    assert_eq!(config.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(
        config.upstream.url,
        "http://127.0.0.1:9000/".parse::<Uri>().unwrap()
    );
    assert_eq!(config.upstream.connect_timeout, secs(2));
    assert_eq!(config.upstream.timeout, secs(30));
    assert_eq!(
        config.store,
        StoreConfig {
            kind: StoreKind::Memory,
            written_url: None,
            urls: vec!["redis://127.0.0.1:6379/0".to_owned()],
            cluster: false,
            key_prefix: "idemgate:".to_owned(),
            timeout: secs(1),
            on_unavailable: OnUnavailable::Reject,
            max_entries: 100_000,
            path: "/var/lib/idemgate".into(),
            fsync: true,
            sentinel: None,
            min_replicas: 0,
            written_encryption: None,
            encryption: Vec::new(),
            max_entries_per_scope: None,
            table: "idemgate_records".to_owned(),
            pool_size: 16,
            create_table: true,
            sweep_interval: secs(60),
            tls: None,
        }
    );
    let policy = &config.idempotency;
    assert!(policy.enabled);
    assert_eq!(
        policy.key_from,
        [KeySource::Header(header("idempotency-key"))]
    );
    assert_eq!(
        policy.methods,
        [Method::POST, Method::PUT, Method::PATCH, Method::DELETE]
    );
    assert!(!policy.required);
    assert_eq!(policy.ttl, secs(86_400));
    assert_eq!(policy.lease, secs(10));
    assert_eq!(policy.on_concurrent, OnConcurrent::Reject);
    assert_eq!(policy.wait_timeout, secs(10));
    assert_eq!(policy.on_unknown_outcome, OnUnknownOutcome::Record);
    assert_eq!(
        policy.release_statuses,
        [
            StatusCode::UNAUTHORIZED,
            StatusCode::FORBIDDEN,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE
        ]
    );
    assert_eq!(policy.scope_headers, [header("authorization")]);
    assert_eq!(policy.fingerprint_headers, [header("content-type")]);
    assert!(policy.fingerprint_query);
    assert_eq!(policy.fingerprint_body, BodyForm::Raw);
    assert!(policy.fingerprint_ignore.is_empty());
    assert_eq!(
        policy.replay_drop_headers,
        [header("set-cookie"), header("date")]
    );
    assert_eq!(policy.max_request_body, 1 << 20);
    assert_eq!(policy.max_response_body, 4 << 20);
    assert_eq!(*policy, Policy::default());
    assert!(config.routes.is_empty());
    assert_eq!(config.admin.listen, Some("127.0.0.1:9901".parse().unwrap()));
    assert_eq!(
        config.log,
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_owned()
        }
    );
    assert_eq!(config.shutdown_timeout, secs(30));
}

const EVERYTHING: &str = r#"
listen: 0.0.0.0:18080
upstream:
  url: http://backend:9000/api/
  connect_timeout: 500ms
  timeout: 1m
store:
  kind: redis
  url: rediss://user:pw@cache.internal:6380/3
  cluster: false
  key_prefix: "app1:"
  timeout: 250ms
  on_unavailable: pass_through
  sentinel:
    master_name: payments
    urls: [rediss://sentinel-a:26379, redis://sentinel-b:26380]
  min_replicas: 2
idempotency:
  header: X-Request-Key
  methods: [post, Put]
  required: true
  key_format: uuidv4
  ttl: 7d
  lease: 30s
  on_concurrent: wait
  wait_timeout: 5s
  on_unknown_outcome: release
  release_statuses: [429, 502, 503]
  scope_headers: [Authorization, X-Tenant]
  fingerprint_headers: []
  fingerprint_query: false
  fingerprint_body: json
  fingerprint_ignore: [/timestamp, "", "/a~1b~0/0"]
  scope_cookies: [session, sid]
  replay_drop_headers: [set-cookie]
  record_exclude_headers: [x-session-token]
  replay_error_headers: {X-Should-Retry: "false", x-idempotent-error: final}
  max_request_body: 64KiB
  max_response_body: 2MB
routes:
  - path: /v1/charges/
    ttl: 48h
    fingerprint_query: true
    fingerprint_body: raw
    fingerprint_ignore: []
admin:
  listen: "[::1]:9000"
log:
  format: json
  level: DEBUG
shutdown_timeout: 1h 30m
route_match: case_insensitive
listen_header_timeout: 5s
max_connections: 512
workers: 3
max_buffered_bytes: 64MiB
errors:
  format: template
  template: '{"error":{"code":"{slug}","message":"{detail}"}}'
  content_type: application/vnd.api+json
"#;

#[test]
fn every_key_can_be_overridden() {
    let config = parse_ok(EVERYTHING);
    assert_eq!(config.listen, "0.0.0.0:18080".parse().unwrap());
    assert_eq!(
        config.upstream.url,
        "http://backend:9000/api".parse::<Uri>().unwrap()
    );
    assert_eq!(config.upstream.connect_timeout, Duration::from_millis(500));
    assert_eq!(config.upstream.timeout, secs(60));
    assert_eq!(
        config.store,
        StoreConfig {
            kind: StoreKind::Redis,
            written_url: None,
            urls: vec!["rediss://user:pw@cache.internal:6380/3".to_owned()],
            cluster: false,
            key_prefix: "app1:".to_owned(),
            timeout: Duration::from_millis(250),
            on_unavailable: OnUnavailable::PassThrough,
            max_entries: 100_000,
            path: "/var/lib/idemgate".into(),
            fsync: true,
            sentinel: Some(SentinelConfig {
                master_name: "payments".to_owned(),
                urls: vec![
                    "rediss://sentinel-a:26379".to_owned(),
                    "redis://sentinel-b:26380".to_owned(),
                ],
            }),
            min_replicas: 2,
            written_encryption: None,
            encryption: Vec::new(),
            max_entries_per_scope: None,
            table: "idemgate_records".to_owned(),
            pool_size: 16,
            create_table: true,
            sweep_interval: secs(60),
            tls: None,
        }
    );
    let expected = Policy {
        enabled: true,
        key_from: vec![KeySource::Header(header("x-request-key"))],
        methods: vec![Method::POST, Method::PUT],
        required: true,
        key_format: crate::idempotency::format::KeyFormat::UuidV4,
        ttl: secs(7 * 86_400),
        lease: secs(30),
        on_concurrent: OnConcurrent::Wait,
        wait_timeout: secs(5),
        on_unknown_outcome: OnUnknownOutcome::Release,
        reconcile: None,
        release_statuses: vec![
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::BAD_GATEWAY,
            StatusCode::SERVICE_UNAVAILABLE,
        ],
        scope_headers: vec![header("authorization"), header("x-tenant")],
        fingerprint_headers: vec![],
        fingerprint_query: false,
        fingerprint_body: BodyForm::Json,
        fingerprint_ignore: pointers(&["/timestamp", "", "/a~1b~0/0"]),
        scope_cookies: vec!["session".to_owned(), "sid".to_owned()],
        scope_principal: None,
        require_principal: false,
        replay_authorization: None,
        replay_drop_headers: vec![header("set-cookie")],
        record_exclude_headers: vec![header("x-session-token")],
        replay_error_headers: vec![
            (
                header("x-should-retry"),
                http::HeaderValue::from_static("false"),
            ),
            (
                header("x-idempotent-error"),
                http::HeaderValue::from_static("final"),
            ),
        ],
        max_request_body: 64 * 1024,
        stream_request_body: false,
        max_streamed_body: 1 << 30,
        max_response_body: 2_000_000,
    };
    assert_eq!(config.idempotency, expected);
    assert_eq!(config.routes.len(), 1);
    assert_eq!(config.routes[0].path, "/v1/charges");
    assert_eq!(
        config.routes[0].policy,
        Policy {
            ttl: secs(48 * 3600),
            fingerprint_query: true,
            fingerprint_body: BodyForm::Raw,
            fingerprint_ignore: vec![],
            ..expected
        }
    );
    assert_eq!(config.admin.listen, Some("[::1]:9000".parse().unwrap()));
    assert_eq!(
        config.log,
        LogConfig {
            format: LogFormat::Json,
            level: "debug".to_owned()
        }
    );
    assert_eq!(config.shutdown_timeout, secs(5_400));
    assert_eq!(config.route_match, RouteMatch::CaseInsensitive);
    assert_eq!(config.listen_header_timeout, secs(5));
    assert_eq!(config.max_connections, 512);
    assert_eq!(
        config.workers,
        Workers::Count(std::num::NonZeroUsize::new(3).expect("3 is not 0"))
    );
    assert_eq!(config.max_buffered_bytes, 64 << 20);
    assert_eq!(config.errors.format, ErrorFormat::Template);
    assert_eq!(
        config.errors.template,
        r#"{"error":{"code":"{slug}","message":"{detail}"}}"#
    );
    assert_eq!(config.errors.content_type, "application/vnd.api+json");
}

#[test]
fn routes_override_only_the_keys_they_name() {
    let config = parse_ok(&with_minimal(
        "idempotency:\n  ttl: 1h\n  required: false\n\
         routes:\n\
         \x20 - path: /charges\n    methods: [POST]\n    required: true\n\
         \x20 - path: /webhooks\n    enabled: false\n",
    ));
    let top = &config.idempotency;
    let charges = policy_for(&config, "/charges");
    assert_eq!(charges.methods, [Method::POST]);
    assert!(charges.required);
    assert_eq!(
        charges.ttl,
        secs(3600),
        "inherited from idempotency, not the built-in default"
    );
    assert_eq!(
        *charges,
        Policy {
            methods: vec![Method::POST],
            required: true,
            ..top.clone()
        }
    );
    let webhooks = policy_for(&config, "/webhooks/stripe");
    assert!(!webhooks.enabled);
    assert_eq!(
        *webhooks,
        Policy {
            enabled: false,
            ..top.clone()
        }
    );
    assert!(policy_for(&config, "/other").enabled);
}

/// The three `fingerprint_*` keys are read in `idempotency` and inherited by routes,
/// which may override each of them (docs/behaviour.md §10).
#[test]
fn fingerprint_keys_are_inherited_and_overridden() {
    let config = parse_ok(&with_minimal(
        "idempotency:\n  fingerprint_query: false\n  fingerprint_body: json\n  fingerprint_ignore: [/ts]\n\
         routes:\n\
         \x20 - path: /inherits\n\
         \x20 - path: /query\n    fingerprint_query: true\n\
         \x20 - path: /raw\n    fingerprint_body: raw\n    fingerprint_ignore: []\n\
         \x20 - path: /more\n    fingerprint_ignore: [/ts, /items/0/at]\n",
    ));
    let top = &config.idempotency;
    assert!(!top.fingerprint_query);
    assert_eq!(top.fingerprint_body, BodyForm::Json);
    assert_eq!(top.fingerprint_ignore, pointers(&["/ts"]));
    assert_eq!(policy_for(&config, "/inherits"), top);
    assert_eq!(
        *policy_for(&config, "/query"),
        Policy {
            fingerprint_query: true,
            ..top.clone()
        }
    );
    assert_eq!(
        *policy_for(&config, "/raw"),
        Policy {
            fingerprint_body: BodyForm::Raw,
            fingerprint_ignore: vec![],
            ..top.clone()
        }
    );
    assert_eq!(
        policy_for(&config, "/more").fingerprint_ignore,
        pointers(&["/ts", "/items/0/at"])
    );
    // A route alone may turn `json` on, with its own pointers.
    let route = parse_ok(&with_minimal(
        "routes:\n  - path: /a\n    fingerprint_body: json\n    fingerprint_ignore: [/t]\n",
    ));
    assert_eq!(route.idempotency, Policy::default());
    assert_eq!(route.routes[0].policy.fingerprint_body, BodyForm::Json);
    let rules = route.routes[0].policy.fingerprint_rules();
    assert!(rules.query && rules.body == BodyForm::Json);
    assert_eq!(rules.ignore, pointers(&["/t"]));
    assert_eq!(rules.headers, [header("content-type")]);
    // `--check` prints the keys where they are set, and loads back to the same.
    for config in [config, route] {
        assert_eq!(parse_ok(&config.to_yaml()), config);
    }
}

#[test]
fn routes_match_whole_segments_in_file_order() {
    let config = parse_ok(&with_minimal(
        "routes:\n  - path: /charges/refunds\n    ttl: 1h\n  - path: /charges\n    ttl: 2h\n",
    ));
    let ttl = |path| policy_for(&config, path).ttl;
    assert_eq!(ttl("/charges"), secs(7_200));
    assert_eq!(ttl("/charges/42"), secs(7_200));
    assert_eq!(ttl("/charges/refunds"), secs(3_600));
    assert_eq!(ttl("/charges/refunds/9"), secs(3_600));
    assert_eq!(ttl("/charges?x=1"), secs(7_200));
    assert_eq!(ttl("/chargesX"), secs(86_400));
    assert_eq!(ttl("/charges/refundsX"), secs(7_200));
    assert_eq!(ttl("/"), secs(86_400));
    assert_eq!(ttl("/other/charges"), secs(86_400));

    let root = parse_ok(&with_minimal("routes:\n  - path: /\n    ttl: 1h\n"));
    for path in ["/", "/a", "/a/b", ""] {
        assert_eq!(policy_for(&root, path).ttl, secs(3_600), "{path}");
    }
    let trailing = parse_ok(&with_minimal("routes:\n  - path: /charges/\n"));
    assert_eq!(trailing.routes[0].path, "/charges");
}

#[test]
fn a_route_path_not_in_normal_form_is_refused_with_its_normal_form() {
    for (path, normal) in [
        ("//charges", "/charges"),
        ("/%63harges", "/charges"),
        ("/a/../b", "/b"),
        ("/charges//", "/charges/"),
        ("/./charges", "/charges"),
        ("//", "/"),
    ] {
        let message = error_at(
            &with_minimal(&format!("routes:\n  - path: '{path}'\n")),
            "routes[0].path",
        );
        assert!(
            message.contains("not in normal form") && message.contains(&format!("'{normal}'")),
            "{path}: {message}"
        );
    }
    for path in ["/charges%2F1", "/a/..;/b", "/a%00", "/a\\b"] {
        let message = error_at(
            &with_minimal(&format!("routes:\n  - path: '{path}'\n")),
            "routes[0].path",
        );
        assert!(message.contains("can never match"), "{path}: {message}");
    }
    let decoded = error_at(
        &with_minimal("escaped_slashes: decode\nroutes:\n  - path: /a%2Fb\n"),
        "routes[0].path",
    );
    assert!(decoded.contains("'/a/b'"), "{decoded}");
    let kept = parse_ok(&with_minimal(
        "escaped_slashes: keep\nroutes:\n  - path: /a%2Fb\n",
    ));
    assert_eq!(kept.routes[0].path, "/a%2Fb");
}

#[test]
fn upgrades_are_protocol_names_and_never_h2c() {
    assert_eq!(parse_ok(&with_minimal("")).upgrades, vec!["websocket"]);
    assert_eq!(
        parse_ok(&with_minimal("upgrades: [WebSocket, foo/2]\n")).upgrades,
        vec!["websocket", "foo/2"]
    );
    assert!(
        parse_ok(&with_minimal("upgrades: []\n"))
            .upgrades
            .is_empty()
    );
    for (listed, kept) in [
        ("[h2c]", vec![]),
        ("[websocket, H2C]", vec!["websocket"]),
        ("['h2c/1', foo]", vec!["foo"]),
    ] {
        let config = parse_ok(&with_minimal(&format!("upgrades: {listed}\n")));
        assert_eq!(config.upgrades, kept, "h2c is never in force: {listed}");
    }
    let message = error_at(&with_minimal("upgrades: ['a b']\n"), "upgrades[0]");
    assert!(message.contains("protocol name"), "{message}");
}

#[test]
fn the_listener_timeouts_have_their_defaults() {
    let config = parse_ok(&with_minimal(""));
    assert_eq!(config.listen_idle_timeout, secs(60));
    assert_eq!(config.listen_body_timeout, secs(30));
    assert_eq!(
        config.escaped_slashes,
        crate::idempotency::path::EscapedSlashes::Reject
    );
    let set = parse_ok(&with_minimal(
        "listen_idle_timeout: 5s\nlisten_body_timeout: 2s\nescaped_slashes: decode\n",
    ));
    assert_eq!(set.listen_idle_timeout, secs(5));
    assert_eq!(set.listen_body_timeout, secs(2));
    assert_eq!(
        set.escaped_slashes,
        crate::idempotency::path::EscapedSlashes::Decode
    );
}

#[test]
fn env_vars_are_interpolated_in_every_string() {
    let env = env_map(&[
        ("PASS", "p@ss: #word"),
        ("HOST", "backend"),
        ("N", "7"),
        ("ON", "true"),
    ]);
    let text = "# ${NOT_IN_COMMENTS}\n\
                upstream:\n  url: http://${HOST}:9000\n\
                store:\n  kind: redis\n  url: redis://:${PASS}@${HOST}:6379\n  cluster: \"${ON}\"\n  urls: []\n\
                max_connections: ${N}\n\
                idempotency:\n  scope_headers: [\"x-${HOST}\"]\n  ttl: ${N}h\n\
                log:\n  level: \"$notavar\"\n";
    let err = Config::from_yaml_str(text, &env).unwrap_err().to_string();
    // `$notavar` is not a reference, so it reaches level validation untouched.
    assert!(
        err.starts_with("log.level: invalid log level '$notavar'"),
        "{err}"
    );
    let config = Config::from_yaml_str(&text.replace("\"$notavar\"", "warn"), &env).unwrap();
    assert_eq!(config.upstream.url.host(), Some("backend"));
    assert_eq!(config.store.urls, ["redis://:p@ss: #word@backend:6379"]);
    assert_eq!(config.max_connections, 7);
    assert!(config.store.cluster);
    assert_eq!(config.idempotency.scope_headers, [header("x-backend")]);
    assert_eq!(config.idempotency.ttl, secs(7 * 3600));
}

/// `$${` is a literal `${`, so that a value can hold one (and `--check` can print one);
/// any other `$` is kept as is (docs/behaviour.md §15).
#[test]
fn a_doubled_dollar_before_a_brace_is_a_literal() {
    let env = env_map(&[("X", "v"), ("LITERAL", "${X}")]);
    for (written, loaded) in [
        ("$${HOME}", "${HOME}"),
        ("a$${", "a${"),
        ("$$${X}", "$${X}"),
        ("$${${X}", "${v"),
        ("$$$${X}}", "$$${X}}"),
        ("${X}$${X}$", "v${X}$"),
        ("$$ $ {X} $", "$$ $ {X} $"),
        // A substituted value is not interpolated again.
        ("${LITERAL}", "${X}"),
    ] {
        let text = with_minimal(&format!("store:\n  key_prefix: '{written}'\n"));
        let config = Config::from_yaml_str(&text, &env).unwrap();
        assert_eq!(config.store.key_prefix, loaded, "{written}");
    }
}

#[test]
fn merge_keys_share_settings_between_routes() {
    let config = parse_ok(&with_minimal(
        "routes:\n  - &pay\n    path: /pay\n    ttl: 2h\n    required: true\n  - <<: *pay\n    path: /refund\n",
    ));
    assert_eq!(config.routes[1].path, "/refund");
    assert_eq!(config.routes[1].policy.ttl, secs(7_200));
    assert!(config.routes[1].policy.required);
}

#[test]
fn for_upstream_uses_every_default() {
    let config = Config::for_upstream("http://127.0.0.1:9000", None).unwrap();
    assert_eq!(config, parse_ok(MINIMAL));
    let listen = "0.0.0.0:80".parse().unwrap();
    assert_eq!(
        Config::for_upstream("http://b:1", Some(listen))
            .unwrap()
            .listen,
        listen
    );
    assert_eq!(
        Config::for_upstream("https://b", None)
            .unwrap()
            .upstream
            .url
            .to_string(),
        "https://b/"
    );
    let message = Config::for_upstream("ftp://b", None)
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("--upstream: "), "{message}");
}

#[test]
fn from_file_names_the_path_it_cannot_read() {
    let path = Path::new("/nonexistent/idemgate.yaml");
    let message = Config::from_file(path).unwrap_err().to_string();
    assert!(
        message.starts_with("/nonexistent/idemgate.yaml: cannot read"),
        "{message}"
    );
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/minimal.yaml");
    assert_eq!(Config::from_file(&example).unwrap(), parse_ok(MINIMAL));
}

#[test]
fn key_sources_are_read_inherited_and_replaced() {
    let config = parse_ok(&with_minimal(
        "idempotency:\n  key_from:\n    - header: Idempotency-Key\n    - header: X-Request-Id\n\
         \x20   - query: request_id\n    - json: /payment/reference\n    - fingerprint: 2m\n\
         routes:\n  - path: /a\n  - path: /b\n    header: X-B-Key\n  - path: /c\n    key_from: [{json: /id}]\n",
    ));
    let all = vec![
        KeySource::Header(header("idempotency-key")),
        KeySource::Header(header("x-request-id")),
        KeySource::Query("request_id".to_owned()),
        KeySource::Json(JsonPointer::parse("/payment/reference").unwrap()),
        KeySource::Fingerprint(Duration::from_secs(120)),
    ];
    assert_eq!(config.idempotency.key_from, all);
    assert_eq!(config.routes[0].policy.key_from, all, "inherited");
    assert_eq!(
        config.routes[1].policy.key_from,
        [KeySource::Header(header("x-b-key"))],
        "header: replaces the inherited sources"
    );
    assert_eq!(
        config.routes[2].policy.key_from,
        [KeySource::Json(JsonPointer::parse("/id").unwrap())]
    );
    // `header: X` is `key_from: [{header: X}]`, printed in the short form; longer lists
    // print as written, and the printed form loads back to the same configuration.
    let yaml = config.to_yaml();
    assert!(yaml.contains("  key_from:\n  - header: Idempotency-Key\n  - header: X-Request-Id\n  - query: request_id\n  - json: /payment/reference\n  - fingerprint: 2m\n"), "{yaml}");
    assert!(yaml.contains("- path: /b\n  header: X-B-Key\n"), "{yaml}");
    assert_eq!(parse_ok(&yaml), config, "{yaml}");
    let short = parse_ok(&with_minimal(
        "idempotency:\n  key_from: [{header: X-Key}]\n",
    ));
    assert_eq!(
        short,
        parse_ok(&with_minimal("idempotency:\n  header: X-Key\n"))
    );
    assert!(short.to_yaml().contains("  header: X-Key\n"));
}

#[test]
fn the_file_store_takes_a_path_and_fsync_and_shares_max_entries() {
    let config = parse_ok(&with_minimal(
        "store:\n  kind: file\n  path: /srv/idemgate-keys\n  fsync: false\n  max_entries: 500\n",
    ));
    assert_eq!(config.store.kind, StoreKind::File);
    assert_eq!(
        config.store.path,
        std::path::Path::new("/srv/idemgate-keys")
    );
    assert!(!config.store.fsync);
    assert_eq!(config.store.max_entries, 500);
    // fsync is on unless turned off; --check prints both keys, and they load back.
    let defaults = parse_ok(&with_minimal("store:\n  kind: file\n"));
    assert!(defaults.store.fsync);
    assert_eq!(
        defaults.store.path,
        std::path::Path::new("/var/lib/idemgate")
    );
    assert_eq!(parse_ok(&config.to_yaml()), config);
    assert!(
        error_at(
            &with_minimal("store:\n  kind: file\n  path: \"\"\n"),
            "store.path"
        )
        .contains("must not be empty")
    );
    assert!(
        error_at(&with_minimal("store:\n  fsync: sometimes\n"), "store.fsync")
            .contains("true or false")
    );
}
