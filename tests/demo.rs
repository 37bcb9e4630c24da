//! The demo story (README, `./scripts/demo.sh story`), told against the toy backend and
//! idemgate on the memory store: straight to the backend a retry charges twice, through
//! idemgate once; and the examples' own `--help`. The example files are included as modules
//! so the test runs exactly the code the demo runs.

#![allow(dead_code, unreachable_pub)]

mod support;

#[path = "../examples/demo_client.rs"]
mod demo_client;
#[path = "../examples/toy_backend.rs"]
mod toy_backend;

use idemgate::config::Config;
use support::Proxy;
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
    // The outcome is unknown to idemgate too; it says so, and never charges again.
    assert_eq!(last.status, 502);
    assert!(last.replayed, "the retry got the recorded outcome");
    assert!(last.body.contains("outcome-unknown"), "{}", last.body);
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
