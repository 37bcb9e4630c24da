//! One view of the request (docs/behaviour.md §15), over raw sockets where an HTTP client
//! would normalise what it sends: the guard decides on the request the upstream executes.

use crate::support;

use support::{Proxy, Upstream, raw_request};

/// `/charges` guarded with a required key; `/webhooks` not guarded at all.
const GUARDED: &str = "upstream:\n  url: {upstream}\nroutes:\n  - path: /webhooks\n    enabled: false\n  - path: /charges\n    required: true\n";

fn post(path: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: api.test\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n{extra}\r\n{{}}"
    )
    .into_bytes()
}

fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

#[tokio::test]
async fn spellings_of_a_guarded_path_are_guarded_and_never_forwarded_without_a_key() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(GUARDED, &up).await;
    for path in [
        "/%63harges",
        "//charges",
        "/./charges",
        "/webhooks/../charges",
        "/charges;jsessionid=1",
        "/x/%2E%2E/charges",
    ] {
        let answer = raw_request(proxy.addr, &post(path, "")).await;
        assert_eq!(status(&answer), 400, "{path}: {answer}");
        assert!(answer.contains("missing-key"), "{path}: {answer}");
    }
    let answer = raw_request(
        proxy.addr,
        b"post /charges HTTP/1.1\r\nhost: api.test\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&answer), 400, "lower-case method: {answer}");
    assert_eq!(up.count(), 0, "nothing reached the upstream unguarded");
}

#[tokio::test]
async fn the_upstream_receives_the_normalised_path_and_the_fingerprint_covers_it() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(GUARDED, &up).await;
    let first = raw_request(
        proxy.addr,
        &post("//charges?b=%2f", "idempotency-key: k1\r\n"),
    )
    .await;
    assert_eq!(status(&first), 201, "{first}");
    let retry = raw_request(
        proxy.addr,
        &post("/%63harges?b=%2f", "idempotency-key: k1\r\n"),
    )
    .await;
    assert_eq!(status(&retry), 201, "{retry}");
    assert!(
        retry
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "another spelling of the same request replays: {retry}"
    );
    let other = raw_request(proxy.addr, &post("/charges%2fx", "idempotency-key: k2\r\n")).await;
    assert_eq!(
        status(&other),
        400,
        "an escaped slash is refused by default: {other}"
    );
    assert!(other.contains("invalid-path"), "{other}");
    // Under `escaped_slashes: keep` it is forwarded, its escape upper-cased.
    let keep = Proxy::start(&format!("escaped_slashes: keep\n{GUARDED}"), &up).await;
    let other = raw_request(keep.addr, &post("/charges%2fx", "idempotency-key: k2\r\n")).await;
    assert_eq!(status(&other), 201, "{other}");
    let seen: Vec<String> = up.seen().into_iter().map(|s| s.path_and_query).collect();
    assert_eq!(
        seen,
        ["/charges?b=%2f", "/charges%2Fx"],
        "query kept as sent"
    );
}

#[tokio::test]
async fn climbing_above_the_root_is_refused_and_never_escapes_a_base_path() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}/api\n", &up).await;
    for path in ["/../admin", "/a/../../admin", "/%2e%2e/admin"] {
        let request = format!("GET {path} HTTP/1.1\r\nhost: api.test\r\nconnection: close\r\n\r\n");
        let answer = raw_request(proxy.addr, request.as_bytes()).await;
        assert_eq!(status(&answer), 400, "{path}: {answer}");
        assert!(answer.contains("bad-request"), "{path}: {answer}");
    }
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn a_method_override_is_guarded_like_the_method_it_names() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(GUARDED, &up).await;
    let answer = raw_request(
        proxy.addr,
        b"GET /charges HTTP/1.1\r\nhost: api.test\r\nx-http-method-override: POST\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&answer), 400, "{answer}");
    assert!(answer.contains("missing-key"), "{answer}");
    let plain = raw_request(
        proxy.addr,
        b"GET /charges HTTP/1.1\r\nhost: api.test\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&plain), 201, "a plain GET passes through: {plain}");
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn two_hosts_or_an_absolute_target_naming_another_host_are_refused() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(GUARDED, &up).await;
    let two = raw_request(
        proxy.addr,
        b"GET /x HTTP/1.1\r\nhost: a.test\r\nhost: b.test\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&two), 400, "{two}");
    let absolute = raw_request(
        proxy.addr,
        b"GET http://b.test/x HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&absolute), 400, "{absolute}");
    assert!(absolute.contains("bad-request"), "{absolute}");
    let same = raw_request(
        proxy.addr,
        b"GET http://a.test/x HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&same), 201, "{same}");
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn routes_match_regardless_of_case_when_told_to() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&format!("{GUARDED}route_match: case_insensitive\n"), &up).await;
    let answer = raw_request(proxy.addr, &post("/Charges", "")).await;
    assert_eq!(status(&answer), 400, "{answer}");
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn tenants_told_apart_by_cookie_never_share_a_record() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        "upstream:\n  url: {upstream}\nidempotency:\n  scope_cookies: [session]\n",
        &up,
    )
    .await;
    let c = proxy.client();
    let as_tenant = |session: &'static str| {
        let c = c.clone();
        async move {
            c.send(
                "POST",
                "/charges",
                &[
                    ("idempotency-key", "same"),
                    ("cookie", session),
                    ("content-type", "application/json"),
                ],
                "{}",
            )
            .await
        }
    };
    let a = as_tenant("session=tenant-a").await;
    let b = as_tenant("theme=x; session=tenant-b").await;
    assert!(!b.replayed(), "tenant B never gets tenant A's response");
    assert_ne!(a.body, b.body);
    let a_again = as_tenant("session=tenant-a; theme=y").await;
    assert!(a_again.replayed());
    assert_eq!(a_again.body, a.body);
    assert_eq!(up.count(), 2);
}

#[tokio::test]
async fn the_authorization_scheme_is_one_scope_in_any_case() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("upstream:\n  url: {upstream}\n", &up).await;
    let c = proxy.client();
    let with = |auth: &'static str| {
        let c = c.clone();
        async move {
            c.send(
                "POST",
                "/charges",
                &[
                    ("idempotency-key", "k"),
                    ("authorization", auth),
                    ("content-type", "application/json"),
                ],
                "{}",
            )
            .await
        }
    };
    assert!(!with("Bearer tok").await.replayed());
    assert!(with("bearer tok").await.replayed());
    assert!(with("BEARER tok").await.replayed());
    assert_eq!(up.count(), 1);
}
