//! `idemgate key resolve` (docs/behaviour.md §18): the runbook's command settles an
//! `outcome-unknown` record through a running proxy's admin listener, either way, with
//! the token from `IDEMGATE_ADMIN_TOKEN`; a refusal says the problem's detail.

use crate::support;

use support::bin::{Finished, admin_cli, idemgate, run};
use support::{Proxy, TestClient, Upstream};

const TOKEN: &str = "s3cret-admin";

async fn resolve(admin: &TestClient, token: Option<&str>, args: &[&str]) -> Finished {
    admin_cli(&["key", "resolve"], admin.addr(), token, args).await
}

#[tokio::test]
async fn key_resolve_settles_an_unknown_outcome_either_way() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(
        &format!("upstream:\n  url: {{upstream}}\nadmin:\n  token: {TOKEN}\n"),
        &up,
    )
    .await;
    let admin = proxy.admin().await;
    let c = proxy.client();

    // Executed: the operator gives the answer, from flags and a body file.
    assert_eq!(
        c.post("/reset", "k-yes", "{}").await.problem(),
        "outcome-unknown"
    );
    let id = proxy.record_id("/reset", "k-yes");
    let dir = tempfile::tempdir().expect("temp dir");
    let body = dir.path().join("charge.json");
    std::fs::write(&body, r#"{"id":"ch_9"}"#).expect("write");
    let body = body.display().to_string();
    let args = [
        id.as_str(),
        "--status",
        "201",
        "-H",
        "Content-Type: application/json",
        "--body-file",
        body.as_str(),
    ];
    let done = resolve(&admin, Some(TOKEN), &args).await;
    assert_eq!(done.code(), Some(0), "{done:?}");
    let shown: serde_json::Value = serde_json::from_str(&done.stdout).expect("json on stdout");
    assert_eq!(
        (shown["state"].as_str(), shown["status"].as_u64()),
        (Some("completed"), Some(201))
    );
    let retry = c.post("/reset", "k-yes", "{}").await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.text(), r#"{"id":"ch_9"}"#);

    // Resolved already: refused, the problem's detail on stderr.
    let again = resolve(&admin, Some(TOKEN), &args).await;
    assert_eq!(again.code(), Some(1), "{again:?}");
    assert!(again.stdout.is_empty());
    assert!(again.stderr.contains("idemgate: "), "{again:?}");
    // Without the token: 401, exit 1.
    let denied = resolve(&admin, None, &[id.as_str(), "--executed", "false"]).await;
    assert_eq!(denied.code(), Some(1), "{denied:?}");

    // Not executed: the record is removed (204, nothing printed), the retry executes.
    assert_eq!(
        c.post("/reset", "k-no", "{}").await.problem(),
        "outcome-unknown"
    );
    let executions = up.count();
    let id = proxy.record_id("/reset", "k-no");
    let done = resolve(&admin, Some(TOKEN), &[id.as_str(), "--executed", "false"]).await;
    assert_eq!(done.code(), Some(0), "{done:?}");
    assert!(done.stdout.is_empty(), "{done:?}");
    let retry = c.post("/reset", "k-no", "{}").await;
    assert!(!retry.replayed());
    assert_eq!(up.count(), executions + 1, "the retry executed");
    proxy.stop().await;
}

#[tokio::test]
async fn key_resolve_needs_one_verdict_and_keeps_computing_ids() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(support::BASIC, &up).await;
    let admin = proxy.admin().await;
    // Neither --executed nor --status; both; headers with --executed false.
    for args in [
        &["idemgate:ab"][..],
        &["idemgate:ab", "--executed", "false", "--status", "200"],
        &["idemgate:ab", "--executed", "false", "-H", "A: b"],
    ] {
        let refused = resolve(&admin, None, args).await;
        assert_eq!(refused.code(), Some(2), "{args:?}: {refused:?}");
    }
    // A plain key is still a key: `idemgate key` computes its id.
    let file = support::bin::TempConfig::new("upstream:\n  url: http://127.0.0.1:9\n");
    let id = run(idemgate()
        .arg("key")
        .arg("--config")
        .arg(file.path())
        .arg("k1"))
    .await;
    assert_eq!(id.code(), Some(0), "{id:?}");
    assert!(id.stdout.trim().len() > 64, "{id:?}");
    proxy.stop().await;
}
