//! `scope_principal` and `require_principal` (docs/behaviour.md §17): defaults, errors
//! naming their key, and `--check` showing every key but the secret.

use super::*;
use crate::principal::{BasicPrincipal, JwtKeys, ScopePrincipal, Secret};

/// A key set with one RSA key (its numbers need not make a real key to be read).
const JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"k1","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"}]}"#;

fn jwt_of(config: &Config) -> &crate::principal::JwtSource {
    match &config.idempotency.scope_principal {
        Some(ScopePrincipal::Jwt(jwt)) => jwt,
        other => panic!("not a jwt source: {other:?}"),
    }
}

#[test]
fn a_jwt_source_gets_its_defaults_and_the_secret_as_written() {
    let env = env_map(&[("JWT_SECRET", "c2VjcmV0")]);
    let text = with_minimal(
        "idempotency:\n  scope_principal:\n    jwt:\n      hs256_secret: ${JWT_SECRET}\n",
    );
    let config = Config::from_yaml_str(&text, &env).expect("valid");
    let jwt = jwt_of(&config);
    assert_eq!(jwt.header, header("authorization"));
    assert_eq!(jwt.claims, ["iss", "sub"]);
    assert_eq!(jwt.refresh, secs(300));
    assert_eq!(jwt.timeout, secs(5));
    assert_eq!(jwt.leeway, secs(60));
    assert_eq!((&jwt.issuer, &jwt.audience), (&None, &None));
    // The bytes as written, not base64-decoded.
    assert_eq!(jwt.keys, JwtKeys::Secret(Secret::new(b"c2VjcmV0".to_vec())));
    assert!(!config.idempotency.require_principal);
    // Inherited by a route that does not name it.
    let config = parse_ok(&with_minimal(
        "idempotency:\n  scope_principal: {basic: true}\n  require_principal: true\n\
         routes:\n  - path: /a\n  - path: /b\n    scope_principal: {trusted_header: X-User}\n",
    ));
    assert_eq!(
        policy_for(&config, "/a").scope_principal,
        Some(ScopePrincipal::Basic(BasicPrincipal::UserAndPassword))
    );
    assert!(policy_for(&config, "/a").require_principal);
    assert_eq!(
        policy_for(&config, "/b").scope_principal,
        Some(ScopePrincipal::TrustedHeader(header("x-user")))
    );
}

#[test]
fn scope_principal_errors_name_their_key() {
    let message = error_at(
        &with_minimal("idempotency:\n  scope_principal: {basic: true, trusted_header: x}\n"),
        "idempotency.scope_principal",
    );
    assert!(message.contains("exactly one"), "{message}");
    error_at(
        &with_minimal("idempotency:\n  scope_principal: {basic: false}\n"),
        "idempotency.scope_principal",
    );
    let message = error_at(
        &with_minimal("routes:\n  - path: /a\n    scope_principal:\n      jwt: {issuer: x}\n"),
        "routes[0].scope_principal.jwt",
    );
    assert!(
        message.contains("jwks_file, jwks_url or hs256_secret"),
        "{message}"
    );
    let message = error_at(
        &with_minimal(
            "idempotency:\n  scope_principal:\n    jwt: {jwks_file: /nonexistent/jwks.json}\n",
        ),
        "idempotency.scope_principal.jwt.jwks_file",
    );
    assert!(message.contains("/nonexistent/jwks.json"), "{message}");
    error_at(
        &with_minimal("idempotency:\n  scope_principal:\n    jwt: {jwks_url: ftp://idp/keys}\n"),
        "idempotency.scope_principal.jwt.jwks_url",
    );
    error_at(
        &with_minimal("idempotency:\n  scope_principal:\n    jwt: {hs256_secret: s, claims: []}\n"),
        "idempotency.scope_principal.jwt",
    );
    error_at(
        &with_minimal("idempotency:\n  scope_principal:\n    jwt: {hs256_secret: s, foo: 1}\n"),
        "idempotency.scope_principal.jwt.foo",
    );
    error_at(
        &with_minimal(
            "idempotency:\n  scope_principal:\n    jwt: {hs256_secret: s, jwks_timeout: 0s}\n",
        ),
        "idempotency.scope_principal.jwt.jwks_timeout",
    );
    error_at(
        &with_minimal("idempotency:\n  require_principal: maybe\n"),
        "idempotency.require_principal",
    );
}

#[test]
fn an_unparseable_jwks_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, "not json").expect("write");
    let text = with_minimal(&format!(
        "idempotency:\n  scope_principal:\n    jwt: {{jwks_file: '{}'}}\n",
        path.display()
    ));
    let message = error_at(&text, "idempotency.scope_principal.jwt.jwks_file");
    assert!(message.contains(&path.display().to_string()), "{message}");
    std::fs::write(&path, JWKS).expect("write");
    let config = parse_ok(&text);
    let JwtKeys::File { set, .. } = &jwt_of(&config).keys else {
        panic!("a file source");
    };
    assert_eq!(set.keys.len(), 1);
}

#[test]
fn check_prints_every_key_and_masks_the_secret() {
    let env = env_map(&[("JWT_SECRET", "s3cr3t-value")]);
    let text = with_minimal(
        "idempotency:\n  scope_principal:\n    jwt:\n      hs256_secret: ${JWT_SECRET}\n      \
         issuer: https://idp\n      audience: api\n      claims: [sub]\n      \
         jwks_timeout: 250ms\n",
    );
    let config = Config::from_yaml_str(&text, &env).expect("valid");
    let yaml = config.to_yaml();
    assert!(!yaml.contains("s3cr3t-value"), "{yaml}");
    assert!(yaml.contains("hs256_secret: '***'"), "{yaml}");
    assert!(
        yaml.contains("\n#   idempotency.scope_principal.jwt.hs256_secret\n"),
        "{yaml}"
    );
    for key in [
        "issuer: https://idp",
        "audience: api",
        "jwks_refresh: 5m",
        "jwks_timeout: 250ms",
        "leeway: 1m",
    ] {
        assert!(yaml.contains(key), "{key} in {yaml}");
    }
    let message = error_at(&yaml, "idempotency.scope_principal.jwt.hs256_secret");
    assert!(message.contains("'***'"), "{message}");
    let back = parse_ok(&yaml.replace("***", "s3cr3t-value"));
    assert_eq!(back, config);
    assert!(!format!("{config:?}").contains("s3cr3t-value"));
    // Unset prints nothing, and loads back unset.
    let plain = parse_ok(MINIMAL);
    assert!(!plain.to_yaml().contains("scope_principal"));
    assert_eq!(parse_ok(&plain.to_yaml()), plain);
}

/// `--check` says what a Basic principal is made of, per policy (docs/behaviour.md §25):
/// the user name and a hash of the password, or, where `replay_authorization` checks the
/// password, the user name alone.
#[test]
fn check_says_what_a_basic_principal_is_made_of() {
    let text = with_minimal(
        "idempotency:\n  scope_principal: {basic: true}\nroutes:\n  - path: /inherits\n  \
         - path: /trusted\n    scope_principal: {trusted_header: x-user}\n  - path: /checked\n    \
         replay_authorization: {path: /auth}\n",
    );
    let config = parse_ok(&text);
    assert_eq!(
        config.routes[2].policy.scope_principal,
        Some(ScopePrincipal::Basic(BasicPrincipal::UserAlone)),
        "set by replay_authorization"
    );
    let yaml = config.to_yaml();
    assert!(
        yaml.starts_with(
            "# idempotency: scope_principal basic: the principal is the user name and a \
             SHA-256 of the password\n#   (no replay_authorization"
        ),
        "{yaml}"
    );
    assert!(
        !yaml.contains("# routes[0]") && !yaml.contains("# routes[1]"),
        "inherited, said once:\n{yaml}"
    );
    assert_eq!(parse_ok(&yaml), config, "the comment loads back as nothing");
    assert!(
        yaml.contains(
            "\n# routes[2]: scope_principal basic: the principal is the user name alone\n#   \
             (replay_authorization checks the password before any replay).\n"
        ),
        "{yaml}"
    );
    assert!(
        !yaml.contains("# routes[0]") && !yaml.contains("# routes[1]"),
        "{yaml}"
    );
}
