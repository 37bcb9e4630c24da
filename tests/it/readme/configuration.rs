//! `docs/configuration.md` names every key of the configuration file, and no key that
//! does not exist. The keys come from the code: `idemgate --check` prints the effective
//! configuration, every key with its value, for files that between them set every
//! section (each store kind, PostgreSQL's TLS, Sentinel and a cluster, encryption,
//! upstream TLS, every key source and principal source, `key_format`, `reconcile`,
//! `errors`, telemetry, cors, routes).
//! The keys of those printouts, as dotted paths with `[]` for the items of a list
//! (`routes[].path`), are compared with the first cells of the doc's key tables
//! (`| `store.kind` | default | effect |`).
//!
//! Two rules read the printouts:
//! - a route takes any policy key, so `routes[].ttl` is documented as `idempotency.ttl`
//!   (and a key only a route sets here, as `idempotency.scope_principal.basic`);
//! - configuration keys are snake_case: a mapping whose keys are not (header names, as
//!   in `replay_error_headers: {x-should-retry: "false"}`) is one value, not keys.
//!
//! A key is documented by a row of its own or, when its value is a section, by rows for
//! the keys below it (`upstream.tls` by `upstream.tls.ca_file`, ...).

use std::collections::BTreeSet;

use serde_json::Value;

use super::read;
use crate::support::bin::{TempConfig, idemgate, run};
use crate::support::jwt::{Dir, SigningKey, jwks};
use crate::support::pki::Pki;

const DOC: &str = "docs/configuration.md";

/// 32 bytes of base64: an encryption key.
const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// The files `--check` prints, each setting sections the others leave out or set
/// otherwise (a store kind prints only its own keys; a principal source is one of
/// three). `dir` holds the JWKS file and the file store; `pki` the TLS files.
fn files(dir: &Dir, pki: &Pki) -> Vec<String> {
    let key = SigningKey::ec("k1");
    let jwks_file = dir.path("jwks.json");
    std::fs::write(&jwks_file, jwks(&[&key])).expect("write the JWKS file");
    let upstream = "upstream:\n  url: http://127.0.0.1:9\n";
    vec![
        // Every default.
        upstream.to_owned(),
        format!("{upstream}store:\n  kind: memory\n  max_entries_per_scope: 10\n"),
        format!(
            "{upstream}store:\n  kind: file\n  path: {}\n  fsync: false\n  max_entries_per_scope: 10\n",
            dir.path("store").display()
        ),
        format!(
            "{upstream}store:\n  kind: redis\n  urls: [redis://127.0.0.1:7000, redis://127.0.0.1:7001]\n"
        ),
        // `replay_authorization`'s two targets, one of two in each policy.
        format!(
            "{upstream}idempotency:\n  replay_authorization: {{path: /auth/check, headers: [authorization]}}\n\
             routes:\n  - path: /x\n    replay_authorization: {{url: 'https://auth.internal/check'}}\n"
        ),
        // PostgreSQL's keys, `tls` among them, are printed for `kind: postgres` only.
        format!(
            "{upstream}store:\n  kind: postgres\n  url: postgres://idemgate:pw@127.0.0.1:5432,127.0.0.1:5433/app?target_session_attrs=read-write&sslmode=verify-full\n  tls: {{ca_file: {ca}}}\n",
            ca = pki.path("ca.pem"),
        ),
        format!(
            r#"upstream:
  url: https://127.0.0.1:9
  tls:
    ca_file: {ca}
    cert_file: {cert}
    key_file: {key}
store:
  kind: redis
  url: redis://127.0.0.1:6379/0
  sentinel:
    master_name: mymaster
    urls: [redis://127.0.0.1:26379]
  min_replicas: 1
  encryption:
    keys:
      - {{id: k1, key: "{KEY}"}}
idempotency:
  key_from:
    - header: X-Request-Id
    - query: request_id
    - json: /payment/reference
    - fingerprint: 2m
  key_format: {{regex: '[a-z0-9-]+'}}
  reconcile: {{path: "/charges/by-key/{{key}}"}}
  scope_headers: [x-api-key]
  scope_principal: {{jwt: {{hs256_secret: s3cret}}}}
  replay_error_headers: {{x-should-retry: "false"}}
routes:
  - path: /a
    scope_principal:
      jwt: {{jwks_url: "https://127.0.0.1:9/jwks.json", issuer: i, audience: a}}
  - path: /b
    scope_principal: {{jwt: {{jwks_file: {jwks}}}}}
  - path: /c
    scope_principal: {{trusted_header: x-user}}
  - path: /d
    enabled: false
    header: X-Key
    scope_principal: {{basic: true}}
admin:
  token: t0ken
errors:
  format: template
  template: '{{"error":"{{slug}}"}}'
telemetry:
  otlp:
    endpoint: http://127.0.0.1:4318
    headers: {{x-tenant: a}}
cors:
  allow_origins: [https://app.example.com]
  expose_headers: [x-request-id]
"#,
            ca = pki.path("ca.pem"),
            cert = pki.path("client.pem"),
            key = pki.path("client.key"),
            jwks = jwks_file.display(),
        ),
    ]
}

/// A configuration key, as opposed to a header name used as a key of a value.
fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Every key path of a printed configuration.
fn walk(value: &Value, path: &str, keys: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) if !map.is_empty() && map.keys().all(|key| is_key(key)) => {
            for (key, value) in map {
                let path = match path {
                    "" => key.to_owned(),
                    _ => format!("{path}.{key}"),
                };
                walk(value, &path, keys);
                keys.insert(path);
            }
        }
        Value::Array(items) => {
            for item in items.iter().filter(|item| item.is_object()) {
                walk(item, &format!("{path}[]"), keys);
            }
        }
        _ => {}
    }
}

/// The keys the code has: those `--check` prints for [`files`].
async fn printed_keys() -> BTreeSet<String> {
    let dir = Dir::new("config-reference");
    let pki = Pki::new("config-reference");
    let mut keys = BTreeSet::new();
    for yaml in files(&dir, &pki) {
        let file = TempConfig::new(&yaml);
        let out = run(idemgate().arg("--config").arg(file.path()).arg("--check")).await;
        assert_eq!(out.code(), Some(0), "{}\n{yaml}", out.stderr);
        let printed: Value = serde_saphyr::from_str(&out.stdout).expect("--check prints YAML");
        walk(&printed, "", &mut keys);
    }
    keys
}

/// The keys the doc's tables document: the first cell of each row of a table headed
/// `| key | default | effect |`, when that cell is one code span.
fn documented_keys() -> Vec<String> {
    let doc = read(DOC);
    let mut keys = Vec::new();
    let mut in_table = false;
    for line in doc.lines() {
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.get(1) == Some(&"key") {
            in_table = true;
            continue;
        }
        let first = cells.get(1).copied().unwrap_or("");
        let key = first.strip_prefix('`').and_then(|k| k.strip_suffix('`'));
        if let Some(key) = key.filter(|key| in_table && !key.contains('`')) {
            keys.push(key.to_owned());
        }
    }
    keys
}

/// A route's policy key is the policy's: `routes[].ttl` is `idempotency.ttl`.
fn as_policy_keys(printed: &BTreeSet<String>) -> BTreeSet<String> {
    printed
        .iter()
        .map(|path| {
            let policy = path.strip_prefix("routes[].").and_then(|rest| {
                let first = rest.split(['.', '[']).next().unwrap_or(rest);
                printed
                    .contains(&format!("idempotency.{first}"))
                    .then(|| format!("idempotency.{rest}"))
            });
            policy.unwrap_or_else(|| path.clone())
        })
        .collect()
}

#[tokio::test]
async fn the_configuration_reference_names_every_key_and_no_other() {
    let code = as_policy_keys(&printed_keys().await);
    let documented = documented_keys();
    assert!(code.len() > 50, "--check printed only {code:?}");
    let doc: BTreeSet<&str> = documented.iter().map(String::as_str).collect();
    let covered = |path: &str| {
        doc.contains(path)
            || doc.iter().any(|key| {
                key.starts_with(&format!("{path}.")) || key.starts_with(&format!("{path}[]"))
            })
    };
    let mut wrong = BTreeSet::new();
    for path in code.iter().filter(|path| !covered(path)) {
        wrong.insert(format!("{DOC} does not document `{path}`"));
    }
    for key in &documented {
        if !code.contains(key) {
            wrong.insert(format!(
                "{DOC} documents `{key}`, which --check never prints"
            ));
        }
        if documented.iter().filter(|other| *other == key).count() > 1 {
            wrong.insert(format!("{DOC} documents `{key}` twice"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}
