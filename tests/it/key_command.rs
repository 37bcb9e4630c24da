//! `idemgate key` (docs/behaviour.md §13): the id it prints is the one the proxy stored
//! the record under, read back from a real Redis, for every kind of key source and scope.

use crate::support;

use support::bin::{Finished, TempConfig, idemgate, run};
use support::redis::RedisServer;
use support::{Proxy, Upstream};

/// `/orders` takes its key from the body, `/refunds` from a header of its own, and the
/// rest from `Idempotency-Key` scoped by `Authorization` and a session cookie.
fn yaml(redis: &RedisServer) -> String {
    format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: redis\n  url: {}\n  key_prefix: 'kc:'\n\
         idempotency:\n  scope_cookies: [session]\n\
         routes:\n  - path: /orders\n    key_from: [{{json: /id}}, {{header: Idempotency-Key}}]\n\
         \x20 - path: /refunds\n    header: X-Refund-Key\n\
         \x20 - path: /webhooks\n    enabled: false\n",
        redis.url()
    )
}

async fn key(file: &TempConfig, args: &[&str]) -> Finished {
    run(idemgate()
        .arg("key")
        .arg("--config")
        .arg(file.path())
        .args(args))
    .await
}

/// Sends one request and returns the one key it added to Redis.
async fn stored_by(
    redis: &RedisServer,
    proxy: &Proxy<idemgate::store::RedisStore>,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    let before = redis.cli(&["--scan", "--pattern", "kc:*"]);
    let answer = proxy.client().send("POST", path, headers, body).await;
    assert_eq!(answer.status, 201, "{}", answer.text());
    let after = redis.cli(&["--scan", "--pattern", "kc:*"]);
    let new: Vec<&str> = after
        .split_whitespace()
        .filter(|k| !before.split_whitespace().any(|b| b == *k))
        .collect();
    assert_eq!(new.len(), 1, "before {before:?}, after {after:?}");
    new[0].to_owned()
}

#[tokio::test]
async fn the_printed_id_is_the_stored_one() {
    let redis = RedisServer::start().await;
    let up = Upstream::start().await;
    let text = yaml(&redis);
    let proxy = Proxy::redis(&text, &up).await;
    let file = TempConfig::new(&text.replace("{upstream}", &up.url()));
    let json = ("content-type", "application/json");

    // The default source, scoped by Authorization (its scheme in any case) and a cookie.
    let stored = stored_by(
        &redis,
        &proxy,
        "/charges",
        &[
            ("idempotency-key", "pay-1"),
            ("authorization", "Bearer sk_1"),
            ("cookie", "theme=dark; session=s1"),
            json,
        ],
        "{}",
    )
    .await;
    let out = key(
        &file,
        &[
            "--path",
            "/charges",
            "-H",
            "authorization: bearer sk_1",
            "-H",
            "Cookie: session=s1",
            "pay-1",
        ],
    )
    .await;
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, format!("{stored}\n"));
    assert!(stored.starts_with("kc:") && stored.len() == 3 + 64);
    // Another scope is another id; the quoted spelling of a header key is the same.
    let other = key(
        &file,
        &[
            "--path",
            "/charges",
            "-H",
            "Authorization: Bearer sk_2",
            "-H",
            "Cookie: session=s1",
            "pay-1",
        ],
    )
    .await;
    assert_ne!(other.stdout, out.stdout);
    let quoted = key(
        &file,
        &[
            "--path",
            "/charges/x",
            "-H",
            "Authorization: Bearer sk_1",
            "-H",
            "Cookie: session=s1",
            "\"pay-1\"",
        ],
    )
    .await;
    assert_eq!(
        quoted.stdout, out.stdout,
        "the route, not the exact path, decides"
    );

    // A route whose first source is the body: the id of the JSON value.
    let stored = stored_by(&redis, &proxy, "/orders", &[json], r#"{"id":"ord-7"}"#).await;
    let out = key(&file, &["--path", "/orders", "ord-7"]).await;
    assert_eq!(out.stdout, format!("{stored}\n"), "{}", out.stderr);
    // A route with a header of its own.
    let stored = stored_by(
        &redis,
        &proxy,
        "/refunds",
        &[("x-refund-key", "r-1"), json],
        "{}",
    )
    .await;
    let out = key(&file, &["--path", "/refunds", "r-1"]).await;
    assert_eq!(out.stdout, format!("{stored}\n"), "{}", out.stderr);
    proxy.stop().await;
}

#[tokio::test]
async fn requests_without_a_record_and_bad_keys_are_errors() {
    let file = TempConfig::new(
        "upstream:\n  url: http://127.0.0.1:9\nroutes:\n  - path: /webhooks\n    enabled: false\n",
    );
    for (args, says) in [
        (vec!["--path", "/webhooks", "k"], "passed through"),
        (vec!["--method", "GET", "k"], "GET / is passed through"),
        (vec!["a b"], "KEY:"),
        (vec![""], "KEY:"),
        (vec!["-H", "no-colon", "k"], "-H: 'no-colon'"),
        (vec!["--method", "B@D", "k"], "--method"),
        (vec!["--path", "/../x", "k"], "--path"),
    ] {
        let out = key(&file, &args).await;
        assert_eq!(out.code(), Some(1), "{args:?}: {}", out.stdout);
        assert!(out.stdout.is_empty());
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    // Defaults: POST and `/`, lower-case methods as requests are read.
    let a = key(&file, &["k"]).await;
    let b = key(&file, &["--method", "post", "--path", "/", "k"]).await;
    assert_eq!(a.code(), Some(0), "{}", a.stderr);
    assert_eq!(a.stdout, b.stdout);
    assert!(a.stdout.starts_with("idemgate:"));
}

/// Without a configuration `idemgate key` names what it accepts, the proxy's own file:
/// the id depends on its key prefix and scope settings. `--upstream`, which it refuses,
/// is not offered.
#[tokio::test]
async fn without_a_configuration_it_asks_for_the_proxys_file() {
    let out = run(idemgate().args(["key", "pay-1"])).await;
    assert_eq!(out.code(), Some(1), "stdout: {}", out.stdout);
    assert!(
        out.stderr
            .starts_with("idemgate: idemgate key needs the configuration"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("--config PATH"), "{}", out.stderr);
    assert!(!out.stderr.contains("--upstream"), "{}", out.stderr);
}

/// A key of another format than the route's `key_format` (docs/behaviour.md §18) has no
/// record: the proxy refuses it before addressing it, and so does `idemgate key`, naming
/// the format expected.
#[tokio::test]
async fn a_key_of_another_format_is_refused() {
    let file = TempConfig::new(
        "upstream:\n  url: http://127.0.0.1:9\nidempotency:\n  key_format: uuidv4\n\
         routes:\n  - path: /orders\n    key_format: {regex: 'ord-[0-9]+'}\n",
    );
    for (args, says) in [
        (
            vec!["pay-1"],
            "KEY: the key must be a version 4 UUID (key_format: uuidv4)",
        ),
        (
            vec!["01890a5d-ac96-774b-bcce-b302099a8057"],
            "key_format: uuidv4",
        ),
        (
            vec!["--path", "/orders", "ord-7x"],
            "KEY: the key must match the regular expression 'ord-[0-9]+'",
        ),
    ] {
        let out = key(&file, &args).await;
        assert_eq!(out.code(), Some(1), "{args:?}: {}", out.stdout);
        assert!(out.stdout.is_empty());
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    for args in [
        vec!["6f1c2b9e-3d4a-4b8c-9f2e-1a2b3c4d5e6f"],
        vec!["--path", "/orders", "ord-7"],
    ] {
        let out = key(&file, &args).await;
        assert_eq!(out.code(), Some(0), "{args:?}: {}", out.stderr);
    }
}
