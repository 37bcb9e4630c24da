//! The demo story: a client pays once, its first attempt times out (or the backend
//! crashes half-way), and it retries with the same `Idempotency-Key`. Told twice:
//! straight to the backend, where the retry charges again, and through idemgate, where
//! it does not. Prints the charge counts from the backend's `/stats`.
//!
//! ```text
//! cargo run --example demo_client -- --proxy http://127.0.0.1:8080 --backend http://127.0.0.1:9000
//! ```
//!
//! `./scripts/demo.sh story` runs it against local processes; against the compose stack
//! the defaults (localhost:8080 and localhost:9000) already fit.

use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The idemgate demo story: a retried payment sent straight to the toy backend, then
/// through idemgate, and how many charges each made (from the backend's /stats).
///
/// Exits 0 when each story charged once through idemgate.
// No bare `about`: clap would take the crate's description, which is idemgate's.
#[derive(Debug, Parser)]
#[command(name = "demo_client")]
pub struct Args {
    /// idemgate's address.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    proxy: String,
    /// The toy backend's own address, for the run without idemgate and for /stats.
    #[arg(long, default_value = "http://127.0.0.1:9000")]
    backend: String,
}

/// How many charges one logical payment created, told both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Story {
    pub direct: u64,
    pub through_idemgate: u64,
}

/// What the client finally saw through idemgate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Final {
    pub status: StatusCode,
    pub replayed: bool,
    /// `Idempotency-Reconciled: true`: idemgate asked the backend what became of it.
    pub reconciled: bool,
    pub body: String,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One attempt; `None` when it timed out or the connection failed.
async fn attempt(
    client: &HttpClient,
    base: &str,
    path: &str,
    key: &str,
    limit: Duration,
) -> Option<Final> {
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("{base}{path}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"amount":4200,"currency":"eur"}"#,
        )))
        .ok()?;
    let response = tokio::time::timeout(limit, client.request(request))
        .await
        .ok()?
        .ok()?;
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let reconciled = response
        .headers()
        .get("idempotency-reconciled")
        .is_some_and(|v| v == "true");
    let body = tokio::time::timeout(limit, response.into_body().collect())
        .await
        .ok()?
        .ok()?
        .to_bytes();
    Some(Final {
        status,
        replayed,
        reconciled,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Charges the backend has created so far.
pub async fn charges(backend: &str) -> Result<u64, String> {
    let client: Client<HttpConnector, Full<Bytes>> = client();
    let uri: http::Uri = format!("{backend}/stats")
        .parse()
        .map_err(|e| format!("{backend}: {e}"))?;
    let response = client
        .get(uri)
        .await
        .map_err(|e| format!("GET {backend}/stats: {e}"))?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let stats: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    stats["charges_created"]
        .as_u64()
        .ok_or_else(|| format!("no charges_created in {stats}"))
}

/// A client that times out after `patience` and retries with the same key, as clients
/// do after a timeout, a dropped connection, `409 in-flight` or a 5xx, until it gets a
/// final answer: a success, or a replayed one (at most `tries` attempts).
async fn pay(base: &str, path: &str, key: &str, patience: Duration, tries: usize) -> Option<Final> {
    let client = client();
    for _ in 0..tries {
        match attempt(&client, base, path, key, patience).await {
            Some(answer) if answer.replayed => return Some(answer),
            Some(answer)
                if answer.status != StatusCode::CONFLICT && !answer.status.is_server_error() =>
            {
                return Some(answer);
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    None
}

/// Tells one story both ways. `path` picks the failure: `?delay_ms=N` (the client gives
/// up before the slow backend answers; past idemgate's upstream timeout, idemgate asks
/// the backend whether the charge exists) or `?drop=1` (the backend crashes half-way).
pub async fn story(
    proxy: &str,
    backend: &str,
    path: &str,
    key: &str,
) -> Result<(Story, Option<Final>), String> {
    let patience = Duration::from_millis(400);
    let before = charges(backend).await?;
    let direct_key = format!("{key}-direct");
    // Straight to the backend: every retry is a new charge. Two attempts, as a client
    // with one retry would make.
    let _ = attempt(&client(), backend, path, &direct_key, patience).await;
    let _ = attempt(
        &client(),
        backend,
        path,
        &direct_key,
        Duration::from_secs(5),
    )
    .await;
    let middle = charges(backend).await?;
    let last = pay(proxy, path, key, patience, 30).await;
    let after = charges(backend).await?;
    Ok((
        Story {
            direct: middle - before,
            through_idemgate: after - middle,
        },
        last,
    ))
}

#[allow(
    clippy::print_stdout,
    reason = "the demo's output is for a person to read"
)]
fn main() -> ExitCode {
    let args = Args::parse();
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    runtime.block_on(async {
        let run = uuid::Uuid::new_v4();
        let stories = [
            ("the client times out and retries", "/charges?delay_ms=1000"),
            (
                "the backend crashes half-way, the client retries",
                "/charges?drop=1",
            ),
            (
                "the backend answers after 3s (past config/demo.yaml's upstream timeout of 2s)",
                "/charges?delay_ms=3000",
            ),
        ];
        let mut ok = true;
        for (n, (title, path)) in stories.into_iter().enumerate() {
            match story(
                &args.proxy,
                &args.backend,
                path,
                &format!("demo-{run}-{n}"),
            )
            .await
            {
                Ok((counts, last)) => {
                    println!("{title}:");
                    println!("  straight to the backend: {} charges", counts.direct);
                    println!(
                        "  through idemgate:        {} charge",
                        counts.through_idemgate
                    );
                    if let Some(last) = last {
                        println!(
                            "  the retry got {} (Idempotent-Replayed: {}, Idempotency-Reconciled: {}) {}",
                            last.status, last.replayed, last.reconciled, last.body
                        );
                    }
                    ok &= counts.through_idemgate == 1;
                }
                Err(err) => {
                    println!("{title}: {err}");
                    ok = false;
                }
            }
        }
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}
