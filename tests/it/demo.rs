//! The demo story (README, `./scripts/demo.sh story`), told against the toy backend and
//! idemgate on the memory store: straight to the backend a retry charges twice, through
//! idemgate once; the file-store demo (`./scripts/demo.sh file`) keeping its keys across
//! a restart; and the examples' own `--help`. The example files are included as modules
//! so the test runs exactly the code the demo runs.

#![allow(dead_code, unreachable_pub)]

use crate::support;

#[path = "../../examples/demo_client.rs"]
mod demo_client;
use crate::support::toy_backend;

use idemgate::config::{Config, StoreKind};
use support::{Proxy, TestClient};
use tokio::net::TcpListener;

async fn stage() -> (String, Proxy, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind backend");
    let backend = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(toy_backend::serve(listener, std::future::pending()));
    let demo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo.yaml"))
        .expect("demo.yaml");
    let mut config = Config::from_yaml_str(&demo, &|_| None).expect("demo.yaml parses");
    config.upstream.url = backend.parse().expect("uri");
    (backend, Proxy::with_config(config).await, task)
}

/// Tells the story for `path` and checks the counts: two charges straight to the
/// backend, one through idemgate. Returns what the client finally got through idemgate.
async fn tell(path: &str, key: &str) -> demo_client::Final {
    let (backend, proxy, task) = stage().await;
    let (story, last) = demo_client::story(&format!("http://{}", proxy.addr), &backend, path, key)
        .await
        .expect("story");
    task.abort();
    assert_eq!(
        story,
        demo_client::Story {
            direct: 2,
            through_idemgate: 1
        }
    );
    last.expect("the retry got an answer")
}

#[tokio::test]
async fn a_timed_out_retry_charges_twice_directly_and_once_through_idemgate() {
    let last = tell("/charges?delay_ms=1000", "t1").await;
    assert_eq!(last.status, 201);
    assert!(last.replayed, "the retry got the first attempt's response");
}

#[tokio::test]
async fn a_backend_crash_half_way_charges_twice_directly_and_once_through_idemgate() {
    let last = tell("/charges?drop=1", "d1").await;
    // The outcome is unknown to idemgate too, but demo.yaml's `reconcile` asks the
    // backend, which has the charge: that charge is the answer, and never charged again.
    assert_eq!(last.status, 200, "{}", last.body);
    assert!(last.reconciled, "the answer came from the lookup");
    assert!(last.body.contains("\"amount\":4200"), "{}", last.body);
}

#[tokio::test]
async fn a_backend_slower_than_the_upstream_timeout_is_reconciled_and_charged_once() {
    let last = tell("/charges?delay_ms=3000", "late1").await;
    assert_eq!(last.status, 200, "{}", last.body);
    assert!(last.reconciled, "the lookup's answer, replayed");
    assert!(last.body.contains("\"amount\":4200"), "{}", last.body);
}

/// `./scripts/demo.sh file` starts idemgate on config/demo-file.yaml: the file store in
/// the directory the script chose and printed (`IDEMGATE_DEMO_STORE`, the user's, not
/// `/var/lib`), on loopback addresses only. A key recorded before a restart is replayed
/// after it, and the backend charges once.
#[tokio::test]
async fn the_file_demo_keeps_its_keys_in_the_users_directory_across_a_restart() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("file-store");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/demo-file.yaml"
    ))
    .expect("demo-file.yaml");
    let env = |name: &str| (name == "IDEMGATE_DEMO_STORE").then(|| dir.display().to_string());
    let mut config = Config::from_yaml_str(&text, &env).expect("demo-file.yaml parses");
    assert_eq!(config.store.kind, StoreKind::File);
    assert_eq!(config.store.path, dir);
    assert!(config.listen.ip().is_loopback(), "{}", config.listen);
    assert!(
        config
            .admin
            .listen
            .is_none_or(|addr| addr.ip().is_loopback()),
        "{:?}",
        config.admin.listen
    );

    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind backend");
    let backend = listener.local_addr().expect("addr");
    let task = tokio::spawn(toy_backend::serve(listener, std::future::pending()));
    config.upstream.url = format!("http://{backend}").parse().expect("uri");

    let proxy = Proxy::file(config.clone()).await;
    let first = proxy
        .client()
        .post("/charges", "order-42", r#"{"amount": 1200}"#)
        .await;
    assert_eq!(first.status, 201, "{}", first.text());
    proxy.stop().await;

    let proxy = Proxy::file(config).await;
    let again = proxy
        .client()
        .post("/charges", "order-42", r#"{"amount": 1200}"#)
        .await;
    assert_eq!(again.status, 201, "{}", again.text());
    assert!(again.replayed(), "the record outlived the restart");
    assert_eq!(again.text(), first.text());
    let stats = TestClient::new(backend)
        .send("GET", "/stats", &[], "")
        .await;
    assert_eq!(stats.json()["charges_created"], 1, "{}", stats.text());
    proxy.stop().await;
    task.abort();
}

/// Each example's `--help` says what that program is, not what idemgate is (clap's bare
/// `about` takes the crate's description).
#[test]
fn each_example_describes_itself_in_its_help() {
    use clap::CommandFactory;
    let proxy = env!("CARGO_PKG_DESCRIPTION");
    for (help, own) in [
        (
            toy_backend::Args::command().render_help().to_string(),
            "charges API",
        ),
        (
            demo_client::Args::command().render_help().to_string(),
            "retried payment",
        ),
    ] {
        assert!(help.contains(own), "{help}");
        assert!(!help.contains(proxy), "{help}");
    }
}
