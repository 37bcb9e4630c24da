//! A scope by who the caller is (docs/behaviour.md §17): a retry sent under a refreshed
//! token replays, another subject gets its own scope, and a credential that does not
//! verify is `401 invalid-credentials` with nothing claimed or forwarded. Real keys (RSA,
//! P-256, Ed25519, made by `openssl`), real tokens, and a JWKS served over HTTPS and
//! rotated while idemgate runs.

use crate::support;

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use http::StatusCode;
use idemgate::metrics::Outcome;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use support::bin::{Running, TempConfig, free_port, idemgate, run};
use support::jwt::{Dir, HangingIdp, IdpUpstream, SigningKey, claims, epoch, jwks};
use support::pki::Pki;
use support::{Proxy, Resp, TestClient, Upstream};

const ISS: &str = "https://idp.test";

/// A POST to `/charges` with `key` and `credential` as its `Authorization`.
async fn post(client: &TestClient, key: &str, authorization: &str) -> Resp {
    client
        .send(
            "POST",
            "/charges",
            &[
                ("idempotency-key", key),
                ("authorization", authorization),
                ("content-type", "application/json"),
            ],
            r#"{"amount":100}"#,
        )
        .await
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Three keys published in a JWKS file, and a proxy verifying against it (issuer and
/// audience required) with `extra` policy lines.
struct Setup {
    dir: Dir,
    rsa: SigningKey,
    ec: SigningKey,
    ed: SigningKey,
    up: Upstream,
    proxy: Proxy,
}

async fn setup(extra: &str) -> Setup {
    let dir = Dir::new("file");
    let (rsa, ec, ed) = (
        SigningKey::rsa(&dir, "rsa-1"),
        SigningKey::ec("ec-1"),
        SigningKey::ed25519("ed-1"),
    );
    let path = dir.path("jwks.json");
    std::fs::write(&path, jwks(&[&rsa, &ec, &ed])).expect("write jwks");
    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nidempotency:\n  scope_principal:\n    jwt:\n      \
         jwks_file: '{}'\n      issuer: {ISS}\n      audience: payments\n{extra}",
        path.display()
    );
    let proxy = Proxy::start(&yaml, &up).await;
    Setup {
        dir,
        rsa,
        ec,
        ed,
        up,
        proxy,
    }
}

#[tokio::test]
async fn a_retry_under_a_refreshed_token_replays_and_another_subject_has_its_own_scope() {
    let s = setup("").await;
    let client = s.proxy.client();
    let a = s.rsa.sign(&claims(ISS, "alice", epoch(-60)));
    let first = post(&client, "order-1", &bearer(&a)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    // The client's token was refreshed before its retry: another token, same iss/sub.
    let b = s.rsa.sign(&claims(ISS, "alice", epoch(0)));
    assert_ne!(a, b);
    let retry = post(&client, "order-1", &bearer(&b)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the refreshed token keeps the scope");
    assert_eq!(retry.body, first.body);
    assert_eq!(s.up.count(), 1, "one execution");
    // Signed by another of the set's keys, of another type: the same caller.
    for key in [&s.ec, &s.ed] {
        let again = post(
            &client,
            "order-1",
            &bearer(&key.sign(&claims(ISS, "alice", 1))),
        )
        .await;
        assert!(again.replayed(), "{:?}: {}", key.alg, again.text());
    }
    // Another subject, same key: its own scope, executed.
    let bob = s.rsa.sign(&claims(ISS, "bob", epoch(0)));
    let other = post(&client, "order-1", &bearer(&bob)).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert!(!other.replayed());
    assert_eq!(s.up.count(), 2);
    // No credential at all: the anonymous scope, which is neither of theirs.
    let anonymous = client
        .post("/charges", "order-1", r#"{"amount":100}"#)
        .await;
    assert!(!anonymous.replayed());
    assert_eq!(s.up.count(), 3);
}

/// A token whose header is `{"alg":"none"}` and has no signature.
fn unsigned(claims: &serde_json::Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    format!("{header}.{payload}.")
}

#[tokio::test]
async fn credentials_that_do_not_verify_are_401_and_reach_nothing() {
    let s = setup("").await;
    let client = s.proxy.client();
    let good = claims(ISS, "alice", epoch(0));
    let stranger = SigningKey::rsa(&s.dir, "rsa-stranger");
    // The RSA key's public PEM used as an HMAC secret: algorithm confusion.
    let mut hs256 = Header::new(Algorithm::HS256);
    hs256.kid = Some("rsa-1".to_owned());
    let confused =
        jsonwebtoken::encode(&hs256, &good, &EncodingKey::from_secret(&s.rsa.public_pem))
            .expect("sign");
    let expired = json!({"iss": ISS, "sub": "alice", "aud": "payments", "exp": epoch(-3600)});
    let early = json!({"iss": ISS, "sub": "alice", "aud": "payments", "nbf": epoch(3600)});
    let no_sub = json!({"iss": ISS, "aud": "payments", "exp": epoch(600)});
    let cases = [
        ("expired", bearer(&s.rsa.sign(&expired))),
        ("not valid yet", bearer(&s.rsa.sign(&early))),
        ("bad signature", bearer(&stranger.sign_as("rsa-1", &good))),
        (
            "wrong issuer",
            bearer(&s.rsa.sign(&claims("https://evil", "alice", 0))),
        ),
        (
            "wrong audience",
            bearer(
                &s.rsa
                    .sign(&json!({"iss": ISS, "sub": "alice", "aud": "other", "exp": epoch(600)})),
            ),
        ),
        ("alg none", bearer(&unsigned(&good))),
        ("HS256 with the RSA public key", bearer(&confused)),
        // An RSA signature under the EC key's kid: a key of another type.
        (
            "kid of another key type",
            bearer(&s.rsa.sign_as("ec-1", &good)),
        ),
        ("missing claim", bearer(&s.rsa.sign(&no_sub))),
        ("not a JWT", bearer("abc.def")),
        ("not bearer", "Basic YWxpY2U6cHc=".to_owned()),
    ];
    for (i, (what, authorization)) in cases.iter().enumerate() {
        let r = post(&client, &format!("k-{i}"), authorization).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{what}: {}", r.text());
        assert_eq!(r.problem(), "invalid-credentials", "{what}");
        assert!(!r.text().contains("alice"), "{what}: {}", r.text());
    }
    assert_eq!(s.up.count(), 0, "nothing was forwarded");
    let outcome = idemgate::metrics::Outcome::InvalidCredentials;
    assert_eq!(s.proxy.state.metrics.requests(outcome), cases.len() as u64);
    // Nothing was claimed either: the same key then executes under a good token.
    let r = post(&client, "k-0", &bearer(&s.rsa.sign(&good))).await;
    assert_eq!((r.status, r.replayed()), (StatusCode::CREATED, false));
}

#[tokio::test]
async fn require_principal_refuses_a_request_without_credentials() {
    let s = setup("  require_principal: true\n").await;
    let r = s.proxy.client().post("/charges", "k", "{}").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.problem(), "missing-credentials");
    assert_eq!(s.up.count(), 0);
    // A request without a key is not guarded, and passes as before.
    let r = s.proxy.client().send("POST", "/charges", &[], "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
}

#[tokio::test]
async fn hs256_tokens_verify_with_the_secret_as_written() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  scope_principal:\n    jwt:\n      \
                hs256_secret: c2VjcmV0\n      claims: [sub]\n";
    let proxy = Proxy::start(yaml, &up).await;
    let client = proxy.client();
    let sign = |secret: &[u8], sub: &str| {
        let claims = json!({"sub": sub, "exp": epoch(600), "iat": epoch(0)});
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS384),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .expect("sign")
    };
    // The secret's bytes as written, not base64-decoded ("secret").
    let r = post(&client, "k", &bearer(&sign(b"c2VjcmV0", "alice"))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = post(&client, "k2", &bearer(&sign(b"secret", "alice"))).await;
    assert_eq!(r.problem(), "invalid-credentials");
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_trusted_header_and_a_basic_user_scope_by_the_caller() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  scope_principal: {trusted_header: X-Auth-Request-User}\n\
                routes:\n  - path: /basic\n    scope_principal: {basic: true}\n";
    let proxy = Proxy::start(yaml, &up).await;
    let client = proxy.client();
    // Each route its own key: a principal is a principal whatever its source, so alice
    // under /charges and alice under /basic share a key space, as scope headers do.
    let send = |path: &'static str, headers: Vec<(&'static str, String)>| {
        let client = client.clone();
        async move {
            let mut all = vec![("idempotency-key", format!("k{path}"))];
            all.extend(headers);
            let all: Vec<(&str, &str)> = all.iter().map(|(n, v)| (*n, v.as_str())).collect();
            client.send("POST", path, &all, "{}").await
        }
    };
    // The Authorization the proxy in front forwards changes; the user it vouches for not.
    let first = send(
        "/charges",
        vec![
            ("x-auth-request-user", "alice".into()),
            ("authorization", "Bearer t1".into()),
        ],
    )
    .await;
    let again = send(
        "/charges",
        vec![
            ("x-auth-request-user", "alice".into()),
            ("authorization", "Bearer t2".into()),
        ],
    )
    .await;
    assert!(!first.replayed() && again.replayed());
    let bob = send("/charges", vec![("x-auth-request-user", "bob".into())]).await;
    assert!(!bob.replayed());
    assert_eq!(up.count(), 2);
    // Basic (docs/behaviour.md §25): idemgate cannot check the password, so it is part of
    // the principal: the same user and password replay, a wrong (or rotated) password
    // reads nothing of alice's, and another user does not share her scope.
    let basic = |user_pass: &str| format!("Basic {}", STANDARD.encode(user_pass));
    let old = send("/basic", vec![("authorization", basic("alice:old"))]).await;
    assert!(!old.replayed(), "{:?} {}", old.status, old.text());
    let again = send("/basic", vec![("authorization", basic("alice:old"))]).await;
    assert!(again.replayed(), "{:?} {}", again.status, again.text());
    assert_eq!(again.body, old.body);
    let wrong = send("/basic", vec![("authorization", basic("alice:guessed"))]).await;
    assert!(
        !wrong.replayed(),
        "a wrong password replayed alice's answer"
    );
    assert_ne!(wrong.body, old.body);
    let carol = send("/basic", vec![("authorization", basic("carol:old"))]).await;
    assert!(!carol.replayed());
    let bad = send("/basic", vec![("authorization", "Basic !!".into())]).await;
    assert_eq!(bad.problem(), "invalid-credentials");
    assert_eq!(up.count(), 5);
}

/// A request that lacks the header a `trusted_header` or a `jwt` from another header
/// reads is scoped as if `scope_principal` were unset (docs/behaviour.md §25): its raw
/// `Authorization` is in its scope, so two tenants that send the same key without that
/// header never read each other's answer; under `require_principal` it is refused.
#[tokio::test]
async fn a_missing_principal_keeps_the_credential_in_the_scope() {
    let up = Upstream::start().await;
    let yaml = "upstream:\n  url: {upstream}\nidempotency:\n  scope_principal: {trusted_header: X-Auth-Request-User}\n\
                routes:\n  - path: /jwt\n    scope_principal:\n      jwt: {hs256_secret: s3cr3t, header: x-jwt}\n\
                \x20 - path: /required\n    require_principal: true\n";
    let proxy = Proxy::start(yaml, &up).await;
    let client = proxy.client();
    for path in ["/charges", "/jwt"] {
        // Each route its own key: without a principal, both scope by the same headers.
        let send = |authorization: &'static str| {
            let headers = [("idempotency-key", path), ("authorization", authorization)];
            let client = client.clone();
            async move { client.send("POST", path, &headers, "{}").await }
        };
        let before = up.count();
        let tenant_a = send("Bearer tenant-a").await;
        let tenant_b = send("Bearer tenant-b").await;
        assert_eq!(
            tenant_a.status,
            StatusCode::CREATED,
            "{path}: {}",
            tenant_a.text()
        );
        assert!(
            !tenant_b.replayed(),
            "{path}: tenant b was replayed tenant a's answer"
        );
        assert_ne!(tenant_a.body, tenant_b.body, "{path}");
        // A retry of the same tenant still replays: it is scoped, not unguarded.
        let retry = send("Bearer tenant-a").await;
        assert!(retry.replayed(), "{path}: {}", retry.text());
        assert_eq!(retry.body, tenant_a.body, "{path}");
        assert_eq!(up.count(), before + 2, "{path}");
    }
    let refused = client
        .send(
            "POST",
            "/required",
            &[
                ("idempotency-key", "k"),
                ("authorization", "Bearer tenant-a"),
            ],
            "{}",
        )
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.problem(), "missing-credentials");
}

/// `idemgate_jwks_refresh_failures_total` as the admin listener at `admin` exports it.
async fn refresh_failures(admin: &TestClient) -> u64 {
    let metrics = admin.send("GET", "/metrics", &[], "").await.text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("idemgate_jwks_refresh_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the counter is exported")
}

/// Polls `done` until it holds, failing after ten seconds.
async fn eventually<F: std::future::Future<Output = bool>>(what: &str, done: impl Fn() -> F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_jwks_url_is_read_over_https_rotated_and_kept_through_a_failed_refresh() {
    let pki = Pki::new("jwks");
    let dir = Dir::new("url");
    let (k1, k2) = (SigningKey::rsa(&dir, "k1"), SigningKey::ec("k2"));
    let idp = IdpUpstream::start(
        &pki.path("server.pem"),
        &pki.path("server.key"),
        jwks(&[&k1]),
    )
    .await;
    let admin_port = free_port();
    let config = TempConfig::new(&format!(
        "upstream:\n  url: {url}\n  tls:\n    ca_file: {ca}\nadmin:\n  listen: 127.0.0.1:{admin_port}\n\
         log:\n  level: trace\nidempotency:\n  scope_principal:\n    jwt:\n      \
         jwks_url: {url}/jwks.json\n      jwks_refresh: 1s\n",
        url = idp.url(),
        ca = pki.path("ca.pem"),
    ));
    let path = config.path.to_string_lossy().into_owned();
    let mut proxy = Running::start(&["--config", &path]).await;
    let client = TestClient::new(proxy.addr);
    let admin = TestClient::new(([127, 0, 0, 1], admin_port).into());
    let (t1, t2) = (
        k1.sign(&claims(ISS, "alice-7731", 1)),
        k1.sign(&claims(ISS, "alice-7731", 2)),
    );
    let r = post(&client, "k", &bearer(&t1)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert!(idp.reads() >= 1, "read at start");
    // The identity provider rotates: a token under the new kid is verified after a
    // read the unknown kid asked for, and is still alice.
    idp.publish(Some(jwks(&[&k1, &k2])));
    let t3 = k2.sign(&claims(ISS, "alice-7731", 3));
    let r = post(&client, "k", &bearer(&t3)).await;
    assert!(r.replayed(), "{}", r.text());
    // The provider fails: refreshes fail and are counted, the last good set stays.
    idp.publish(None);
    eventually("a failed refresh is counted", || async {
        refresh_failures(&admin).await >= 1
    })
    .await;
    let r = post(&client, "k", &bearer(&t2)).await;
    assert!(r.replayed(), "{}", r.text());
    let r = post(
        &client,
        "k",
        &bearer(&k2.sign(&claims(ISS, "alice-7731", 4))),
    )
    .await;
    assert!(r.replayed(), "{}", r.text());
    assert_eq!(idp.executed(), 1);
    proxy.terminate().await;
    assert!(proxy.wait_exit().await.success());
    // Not a token, nor a claim value, in any line, at trace.
    let log = proxy.stderr();
    assert!(log.contains("reading the JWKS failed"), "{log}");
    for secret in [&t1, &t2, &t3, "alice-7731"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
    for part in t1.split('.') {
        assert!(!log.contains(part), "a part of a token in the log:\n{log}");
    }
}

/// A JWKS refresh is single-flight and bounded by `jwks_timeout`
/// (docs/behaviour.md §25): against an identity provider that hangs, the requests whose `kid` is unknown
/// all wait on one read, and are answered `503 principal-unavailable` with `Retry-After`
/// when it times out (they used to queue behind a read bounded by `upstream.timeout`,
/// 30 s, and then one read each); a known `kid` never waits; and until another read is
/// allowed, an unknown `kid` is `401` at once.
#[tokio::test]
async fn an_unknown_kid_waits_for_one_bounded_refresh_and_a_known_kid_never_waits() {
    const JWKS_TIMEOUT: Duration = Duration::from_millis(800);
    let known = SigningKey::ec("known");
    let idp = HangingIdp::start(jwks(&[&known])).await;
    let up = Upstream::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nidempotency:\n  scope_principal:\n    jwt:\n      \
         jwks_url: {}\n      jwks_timeout: {}ms\n",
        idp.url(),
        JWKS_TIMEOUT.as_millis()
    );
    let proxy = Proxy::start(&yaml, &up).await;
    // The read at start, as `idemgate` makes it before it serves: answered.
    for verifier in proxy.state.live().verifiers() {
        verifier.load().await.expect("the key set at start");
    }
    assert_eq!(idp.requests(), 1);
    let client = proxy.client();

    let started = Instant::now();
    let unknown: Vec<_> = (0..5)
        .map(|i| {
            let key = SigningKey::ec(&format!("rotated-{i}"));
            let token = bearer(&key.sign(&claims(ISS, "alice", i)));
            let client = client.clone();
            tokio::spawn(async move {
                let r = post(&client, &format!("unknown-{i}"), &token).await;
                (r, started.elapsed())
            })
        })
        .collect();
    // The refresh they asked for is held by the identity provider.
    idp.held.notified().await;

    let asked = Instant::now();
    let r = post(
        &client,
        "known",
        &bearer(&known.sign(&claims(ISS, "alice", 0))),
    )
    .await;
    let took = asked.elapsed();
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert!(took < JWKS_TIMEOUT, "a known kid waited {took:?}");
    assert!(
        unknown.iter().all(|task| !task.is_finished()),
        "answered before the refresh ended"
    );

    for task in unknown {
        let (r, took) = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("answered well within the old 30 s")
            .expect("task");
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
        assert_eq!(r.problem(), "principal-unavailable");
        // When another read will be made for an unknown kid: within 30 s.
        let retry_after: u64 = r.headers["retry-after"]
            .to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .expect("Retry-After in seconds");
        assert!((1..=30).contains(&retry_after), "{retry_after}");
        assert!(
            took >= JWKS_TIMEOUT && took < JWKS_TIMEOUT + Duration::from_secs(5),
            "answered after {took:?}"
        );
    }
    assert_eq!(
        (idp.connections(), idp.requests()),
        (2, 2),
        "one read at start, one refresh for all five"
    );

    // Too soon for another read, and the last one failed: the kid may exist, so it is
    // answered at once with when the next read may be made, and nothing is read.
    let other = SigningKey::ec("rotated-later");
    let r = post(
        &client,
        "later",
        &bearer(&other.sign(&claims(ISS, "alice", 9))),
    )
    .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.problem(), "principal-unavailable");
    let retry_after: u64 = r.headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("whole seconds");
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(idp.requests(), 2);
    assert_eq!(up.count(), 1, "only the known kid was forwarded");
    let metrics = &proxy.state.metrics;
    assert_eq!(metrics.requests(Outcome::PrincipalUnavailable), 6);
    assert!(
        metrics
            .render()
            .lines()
            .any(|l| l == "idemgate_jwks_refresh_failures_total 1"),
        "the timed-out read is counted once"
    );
}

#[tokio::test]
async fn a_key_set_that_cannot_be_read_at_start_is_exit_1_naming_it() {
    let missing = "/nonexistent/idemgate-jwks.json";
    let config = TempConfig::new(&format!(
        "upstream:\n  url: http://127.0.0.1:9\nidempotency:\n  scope_principal:\n    jwt:\n      \
         jwks_file: {missing}\n"
    ));
    let path = config.path.to_string_lossy().into_owned();
    for args in [vec!["--config", &path], vec!["--config", &path, "--check"]] {
        let done = run(idemgate().args(&args)).await;
        assert_eq!(done.code(), Some(1), "{args:?}: {}", done.stderr);
        assert!(
            done.stderr
                .contains("idempotency.scope_principal.jwt.jwks_file")
                && done.stderr.contains(missing),
            "{}",
            done.stderr
        );
    }
    // A URL nothing answers at: exit 1 at start, naming it; `--check` does not read it.
    let port = free_port();
    let config = TempConfig::new(&format!(
        "upstream:\n  url: http://127.0.0.1:9\nidempotency:\n  scope_principal:\n    jwt:\n      \
         jwks_url: http://127.0.0.1:{port}/jwks.json\n"
    ));
    let path = config.path.to_string_lossy().into_owned();
    let listen = format!("127.0.0.1:{}", free_port());
    let done = run(idemgate().args(["--config", &path, "--listen", &listen])).await;
    assert_eq!(done.code(), Some(1), "{}", done.stderr);
    assert!(
        done.stderr
            .contains(&format!("http://127.0.0.1:{port}/jwks.json")),
        "{}",
        done.stderr
    );
    let done = run(idemgate().args(["--config", &path, "--check"])).await;
    assert_eq!(done.code(), Some(0), "{}", done.stderr);
}

#[tokio::test]
async fn idemgate_key_prints_one_id_for_every_token_of_a_caller() {
    let config = TempConfig::new(
        "upstream:\n  url: http://127.0.0.1:9\nidempotency:\n  scope_principal:\n    jwt:\n      \
         hs256_secret: s3cr3t\n",
    );
    let path = config.path.to_string_lossy().into_owned();
    let token = |sub: &str, iat: i64, secret: &[u8]| {
        let claims = json!({"iss": ISS, "sub": sub, "iat": iat, "exp": epoch(600)});
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .expect("sign")
    };
    let id = |token: String| {
        let path = path.clone();
        async move {
            let header = format!("Authorization: Bearer {token}");
            run(idemgate().args(["key", "--config", &path, "-H", &header, "order-1"])).await
        }
    };
    let (a, b) = (
        id(token("alice", 1, b"s3cr3t")).await,
        id(token("alice", 2, b"s3cr3t")).await,
    );
    assert_eq!(
        (a.code(), b.code()),
        (Some(0), Some(0)),
        "{}{}",
        a.stderr,
        b.stderr
    );
    assert_eq!(
        a.stdout, b.stdout,
        "a refreshed token names the same record"
    );
    let bob = id(token("bob", 1, b"s3cr3t")).await;
    assert_ne!(bob.stdout, a.stdout);
    let forged = id(token("alice", 1, b"guess")).await;
    assert_eq!(forged.code(), Some(1));
    assert!(
        forged.stderr.contains("invalid credentials"),
        "{}",
        forged.stderr
    );
}

#[tokio::test]
async fn a_reload_reads_the_jwks_file_again() {
    let s = setup("").await;
    let config = TempConfig::new(&format!(
        "upstream:\n  url: {}\nidempotency:\n  scope_principal:\n    jwt:\n      jwks_file: '{}'\n",
        s.up.url(),
        s.dir.path("jwks.json").display()
    ));
    let reload = |state| idemgate::proxy::reload::reload(state, &config.path, None, &|_| Ok(()));
    reload(&s.proxy.state).expect("a readable set reloads");
    // Read again: a broken file refuses the reload, naming it, and the running set stays.
    std::fs::write(s.dir.path("jwks.json"), "{}").expect("break");
    let err = reload(&s.proxy.state).expect_err("an unparseable set");
    assert!(
        err.to_string()
            .starts_with("idempotency.scope_principal.jwt.jwks_file: "),
        "{err}"
    );
    let token = s.rsa.sign(&claims(ISS, "alice", 1));
    let r = post(&s.proxy.client(), "k", &bearer(&token)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
}

/// The README's "Scoping by who the caller is" configuration, as written, is one
/// idemgate loads: `jwt` from a `jwks_url` with `issuer` and `audience`, and
/// `require_principal`. (Loading does not read the URL; starting does.)
#[test]
fn the_readme_configuration_loads_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let section = readme
        .split("\n## Scoping by who the caller is\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README has the section");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a yaml block");
    let config = idemgate::config::Config::from_yaml_str(
        &format!("upstream:\n  url: http://127.0.0.1:9\n{yaml}"),
        &|_| None,
    )
    .unwrap_or_else(|err| panic!("{err}\n{yaml}"));
    assert!(config.idempotency.require_principal);
    let shown = config.to_yaml();
    for key in ["scope_principal", "jwks_url", "issuer", "audience"] {
        assert!(shown.contains(key), "{key} is in force:\n{shown}");
    }
}
