//! `cors` (docs/behaviour.md §24): the CORS headers of idemgate's own answers and of
//! replays, computed for the request's origin; preflights of a guarded path completed
//! for an upstream that does not know the key header; the configuration's checks.

use idemgate::config::Config;

use crate::support::legacy_cors::LegacyCors;
use crate::support::{Proxy, Resp, TestClient};

const APP: &str = "http://app.test:3000";
const OTHER: &str = "https://other.test";
const EVIL: &str = "https://evil.test";

/// A proxy in front of `up` with `cors` (YAML of its keys, indented by four) and `rest`.
async fn proxy(up: &LegacyCors, cors: Option<&str>, rest: &str) -> Proxy {
    let cors = cors.map_or_else(String::new, |keys| format!("cors:\n{keys}"));
    let yaml = format!("upstream:\n  url: {}\n{cors}{rest}", up.url());
    Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("valid")).await
}

const LISTED: &str =
    "  allow_origins: [http://app.test:3000, https://other.test]\n  expose_headers: [X-Trace]\n";

fn header<'a>(resp: &'a Resp, name: &str) -> Vec<&'a str> {
    resp.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ascii"))
        .collect()
}

/// The answer carries the CORS headers of `origin` (with `Vary: Origin`), or, for
/// `None`, only `Vary: Origin`.
fn assert_cors(resp: &Resp, origin: Option<&str>) {
    let vary = header(resp, "vary").join(", ").to_ascii_lowercase();
    assert!(vary.contains("origin"), "{:?}", resp.headers);
    assert_eq!(
        header(resp, "access-control-allow-origin"),
        origin.into_iter().collect::<Vec<_>>(),
        "{:?}",
        resp.headers
    );
    match origin {
        Some(_) => assert_eq!(
            header(resp, "access-control-expose-headers"),
            ["Idempotent-Replayed, Retry-After, Idempotency-Reconciled, x-trace"]
        ),
        None => assert!(
            !resp.headers.contains_key("access-control-expose-headers"),
            "{:?}",
            resp.headers
        ),
    }
    assert!(
        !resp
            .headers
            .contains_key("access-control-allow-credentials")
    );
}

async fn post(
    client: &TestClient,
    path: &str,
    key: Option<&str>,
    origin: Option<&str>,
    body: &str,
) -> Resp {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
    }
    if let Some(origin) = origin {
        headers.push(("origin", origin));
    }
    client.send("POST", path, &headers, body).await
}

#[tokio::test]
async fn own_problems_carry_the_cors_headers_of_an_allowed_origin_only() {
    let up = LegacyCors::start().await;
    let proxy = proxy(
        &up,
        Some(LISTED),
        "max_buffered_bytes: 1KiB\nidempotency:\n  required: true\n",
    )
    .await;
    let client = proxy.client();
    for origin in [Some(APP), Some(EVIL), None] {
        let allowed = origin.filter(|o| *o != EVIL);
        // 400: no key where one is required.
        let missing = post(&client, "/orders", None, origin, "{}").await;
        assert_eq!(missing.status, 400);
        assert_cors(&missing, allowed);
        // 409, with a Retry-After the page can read.
        let key = format!("held-{origin:?}");
        let before = up.executions();
        let held = tokio::spawn({
            let client = client.clone();
            let key = key.clone();
            async move { post(&client, "/slow", Some(&key), None, "{}").await }
        });
        up.wait_for(before + 1).await;
        let busy = post(&client, "/slow", Some(&key), origin, "{}").await;
        assert_eq!(busy.problem(), "in-flight");
        assert!(busy.headers.contains_key("retry-after"));
        assert_cors(&busy, allowed);
        up.let_one_through();
        assert_eq!(held.await.expect("first").status, 201);
        // 422: the key again, with another body.
        let reused = post(&client, "/slow", Some(&key), origin, "{\"a\":1}").await;
        assert_eq!(reused.status, 422);
        assert_cors(&reused, allowed);
        // 503: more than max_buffered_bytes.
        let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(2000));
        let overloaded = post(&client, "/orders", Some("big"), origin, &big).await;
        assert_eq!(overloaded.problem(), "overloaded");
        assert_cors(&overloaded, allowed);
    }
}

#[tokio::test]
async fn without_cors_no_header_is_added() {
    let up = LegacyCors::start().await;
    let proxy = proxy(&up, None, "idempotency:\n  required: true\n").await;
    let missing = post(&proxy.client(), "/orders", None, Some(APP), "{}").await;
    assert_eq!(missing.status, 400);
    assert!(!missing.headers.contains_key("vary"));
    assert!(!missing.headers.contains_key("access-control-allow-origin"));
    // A preflight the upstream does not know stays its answer.
    let preflight = preflight(&proxy.client(), "/no-options", APP, "idempotency-key").await;
    assert_eq!(preflight.status, 404);
}

#[tokio::test]
async fn a_wildcard_answers_every_origin_and_with_credentials_each_with_itself() {
    let up = LegacyCors::start().await;
    let star = proxy(
        &up,
        Some("  allow_origins: \"*\"\n"),
        "idempotency:\n  required: true\n",
    )
    .await;
    for origin in [Some(EVIL), None] {
        let missing = post(&star.client(), "/orders", None, origin, "{}").await;
        assert_eq!(header(&missing, "access-control-allow-origin"), ["*"]);
        assert!(
            !missing
                .headers
                .contains_key("access-control-allow-credentials")
        );
    }
    let credentials = proxy(
        &up,
        Some("  allow_origins: \"*\"\n  allow_credentials: true\n"),
        "idempotency:\n  required: true\n",
    )
    .await;
    let missing = post(&credentials.client(), "/orders", None, Some(EVIL), "{}").await;
    assert_eq!(header(&missing, "access-control-allow-origin"), [EVIL]);
    assert_eq!(
        header(&missing, "access-control-allow-credentials"),
        ["true"]
    );
    // No origin, nothing to answer with.
    let none = post(&credentials.client(), "/orders", None, None, "{}").await;
    assert!(!none.headers.contains_key("access-control-allow-origin"));
    // Allowed, and `--check` says what it means.
    let config = &credentials.state.config;
    assert!(
        config
            .to_yaml()
            .starts_with("# warning: cors.allow_origins \"*\"")
    );
    let listed = proxy(&up, Some(LISTED), "").await;
    assert!(!listed.state.config.to_yaml().contains("warning"));
}

#[tokio::test]
async fn a_replay_carries_the_headers_of_the_retrys_origin_not_the_first_callers() {
    let up = LegacyCors::start().await;
    let proxy = proxy(&up, Some(LISTED), "").await;
    let client = proxy.client();
    // The first execution: the upstream's answer, as it made it.
    let first = post(&client, "/orders", Some("k1"), Some(APP), "{}").await;
    assert_eq!(first.status, 201);
    assert_eq!(header(&first, "access-control-allow-origin"), [APP]);
    assert_eq!(
        header(&first, "access-control-expose-headers"),
        ["X-Execution"]
    );
    assert_eq!(header(&first, "vary"), ["Accept-Encoding"]);
    // A retry from another allowed origin: its own headers, and Vary merged.
    let other = post(&client, "/orders", Some("k1"), Some(OTHER), "{}").await;
    assert!(other.replayed());
    assert_eq!(other.json()["execution"], 1);
    assert_cors(&other, Some(OTHER));
    assert_eq!(header(&other, "vary"), ["Accept-Encoding", "Origin"]);
    // From an origin that is not allowed: none of the first caller's.
    let evil = post(&client, "/orders", Some("k1"), Some(EVIL), "{}").await;
    assert!(evil.replayed());
    assert_cors(&evil, None);
    assert_eq!(up.executions(), 1);
}

async fn preflight(client: &TestClient, path: &str, origin: &str, requested: &str) -> Resp {
    let headers = [
        ("origin", origin),
        ("access-control-request-method", "POST"),
        ("access-control-request-headers", requested),
    ];
    client.send("OPTIONS", path, &headers, "").await
}

#[tokio::test]
async fn a_preflight_gets_the_key_header_added_and_one_the_upstream_refuses_is_answered() {
    let up = LegacyCors::start().await;
    let proxy = proxy(
        &up,
        Some("  allow_origins: [http://app.test:3000]\n  max_age: 2m\n"),
        "routes:\n  - path: /no-options/off\n    enabled: false\n  - path: /request-id\n    \
         key_from: [{header: X-Request-Id}]\n    methods: [POST, PUT]\n",
    )
    .await;
    let client = proxy.client();
    let allowed_headers = |resp: &Resp| header(resp, "access-control-allow-headers").join(", ");
    // The upstream allows Content-Type only: the key header is added.
    let ok = preflight(&client, "/orders", APP, "content-type,idempotency-key").await;
    assert_eq!(ok.status, 200);
    assert_eq!(allowed_headers(&ok), "Content-Type, idempotency-key");
    assert_eq!(header(&ok, "access-control-allow-origin"), [APP]);
    // The route's own key header, named in any case.
    let own = preflight(&client, "/request-id", APP, "X-Request-ID").await;
    assert_eq!(allowed_headers(&own), "Content-Type, x-request-id");
    // Not the key header, an origin not allowed, a path not guarded: as the upstream said.
    for (path, origin, requested) in [
        ("/orders", APP, "content-type"),
        ("/orders", EVIL, "idempotency-key"),
        ("/request-id", APP, "idempotency-key"),
    ] {
        let unchanged = preflight(&client, path, origin, requested).await;
        assert_eq!(
            allowed_headers(&unchanged),
            "Content-Type",
            "{path} {origin} {requested}"
        );
    }
    // An upstream that does not do CORS: idemgate answers.
    for path in ["/no-options/orders", "/405/orders", "/501/orders"] {
        let own = preflight(&client, path, APP, "content-type,idempotency-key").await;
        assert_eq!(own.status, 204, "{path}");
        assert_eq!(header(&own, "access-control-allow-origin"), [APP]);
        assert_eq!(
            header(&own, "access-control-allow-methods"),
            ["POST, PUT, PATCH, DELETE"]
        );
        assert_eq!(
            header(&own, "access-control-allow-headers"),
            ["content-type,idempotency-key"]
        );
        assert_eq!(header(&own, "access-control-max-age"), ["120"]);
        assert_eq!(header(&own, "vary"), ["Origin"]);
        assert!(own.body.is_empty());
    }
    // Unless the path is not guarded, or the origin not allowed.
    let off = preflight(&client, "/no-options/off", APP, "idempotency-key").await;
    assert_eq!(off.status, 404);
    let evil = preflight(&client, "/no-options/orders", EVIL, "idempotency-key").await;
    assert_eq!(evil.status, 404);
    assert!(!evil.headers.contains_key("access-control-allow-origin"));
    assert_eq!(up.executions(), 0);
}

#[test]
fn cors_is_checked_on_load() {
    let load = |cors: &str| Config::from_yaml_str(&format!("cors:\n{cors}"), &|_| None);
    for (cors, wanted) in [
        ("  allow_origins: []\n", "cors.allow_origins: empty"),
        ("  allow_origins: [app.example.com]\n", "cors.allow_origins"),
        (
            "  allow_origins: [https://app.example.com/]\n",
            "is not an origin",
        ),
        ("  allow_origins: [\"*\"]\n", "written alone"),
        ("  allow_origins: all\n", "cors.allow_origins"),
        ("  allow_credentials: true\n", "cors.allow_origins: missing"),
        (
            "  allow_origins: \"*\"\n  expose_headers: [\"bad header\"]\n",
            "invalid HTTP header name",
        ),
        (
            "  allow_origins: \"*\"\n  allow_methods: [GET]\n",
            "allow_methods",
        ),
        ("  allow_origins: \"*\"\n  max_age: soon\n", "cors.max_age"),
    ] {
        let err = load(cors).expect_err(cors).to_string();
        assert!(err.contains(wanted), "{cors}: {err}");
    }
    let config = load("  allow_origins: [HTTPS://App.Example.com:8443]\n").expect("valid");
    let cors = config.cors.as_ref().expect("set");
    assert_eq!(
        cors.allow_origins,
        idemgate::config::AllowOrigins::Listed(vec!["https://app.example.com:8443".to_owned()])
    );
    // What --check prints loads back the same.
    let printed = config.to_yaml();
    assert_eq!(
        Config::from_yaml_str(&printed, &|_| None).expect(&printed),
        config
    );
    // Unset by default, and printed only when set.
    let plain = Config::from_yaml_str("", &|_| None).expect("empty");
    assert!(plain.cors.is_none());
    assert!(!plain.to_yaml().contains("cors"));
}

#[tokio::test]
async fn a_reload_sets_and_unsets_cors_for_new_requests() {
    use crate::support::bin::TempConfig;
    use idemgate::proxy::reload::reload;
    let up = LegacyCors::start().await;
    let base = format!(
        "upstream:\n  url: {}\nidempotency:\n  required: true\n",
        up.url()
    );
    let file = TempConfig::new(&base);
    let proxy = Proxy::with_config(Config::from_file(file.path()).expect("valid")).await;
    let client = proxy.client();
    let no_level = |_: &str| Ok(());
    let missing = post(&client, "/orders", None, Some(APP), "{}").await;
    assert!(!missing.headers.contains_key("access-control-allow-origin"));
    std::fs::write(file.path(), format!("{base}cors:\n{LISTED}")).expect("rewrite");
    reload(&proxy.state, file.path(), None, &no_level).expect("cors applies");
    let missing = post(&client, "/orders", None, Some(APP), "{}").await;
    assert_cors(&missing, Some(APP));
    std::fs::write(file.path(), &base).expect("rewrite");
    reload(&proxy.state, file.path(), None, &no_level).expect("cors applies");
    let missing = post(&client, "/orders", None, Some(APP), "{}").await;
    assert!(!missing.headers.contains_key("vary"));
}
