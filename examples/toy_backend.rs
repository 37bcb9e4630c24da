//! A toy charges API to put behind idemgate in the demo.
//!
//! It knows nothing about idempotency on purpose: every `POST /charges` creates a new
//! charge, so the demo can show, through `GET /stats`, that retries through idemgate
//! execute once. Two query options on `POST /charges` act out the failures a retry is
//! for:
//!
//! - `?delay_ms=N`: create the charge, then wait N ms before answering (a slow
//!   upstream, or a duplicate arriving while the first is still in flight);
//! - `?drop=1`: create the charge, then close the connection without answering (a
//!   backend that crashed half-way: the side effect happened, the client never knows).
//!
//! ```text
//! cargo run --example toy_backend -- --listen 127.0.0.1:9000
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// A request body larger than this is refused: a toy still caps its buffers.
const MAX_BODY: usize = 64 * 1024;

/// How long in-flight requests get to finish after SIGINT/SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A toy charges API that executes every request it gets, retries included: the
/// backend of the idemgate demo.
///
/// POST /charges creates a charge (?delay_ms=N answers late, ?drop=1 never answers);
/// GET /charges lists them, GET /stats counts them.
// No bare `about`: clap would take the crate's description, which is idemgate's.
#[derive(Debug, Parser)]
#[command(name = "toy_backend")]
pub struct Args {
    /// Address to listen on; port 0 picks a free port (the real one is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
}

/// The charges created so far. A `Vec` behind a mutex: the demo makes a handful.
#[derive(Debug, Default)]
struct Charges {
    list: Mutex<Vec<Value>>,
}

impl Charges {
    /// Creates and stores charge number N (1-based), returning its JSON.
    fn create(&self, amount: i64) -> Value {
        let mut list = self
            .list
            .lock()
            .expect("no code panics while holding the lock");
        let n = list.len() + 1;
        // `created` is the sequence number rather than a timestamp so that two
        // executions are told apart by every field, and demo output is reproducible.
        let charge = json!({ "id": format!("ch_{n}"), "amount": amount, "created": n });
        list.push(charge.clone());
        charge
    }

    fn list(&self) -> Vec<Value> {
        self.list
            .lock()
            .expect("no code panics while holding the lock")
            .clone()
    }

    fn count(&self) -> usize {
        self.list
            .lock()
            .expect("no code panics while holding the lock")
            .len()
    }
}

/// Returned by the service to make hyper close the connection without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose (?drop=1)")
    }
}

impl std::error::Error for Dropped {}

/// The `POST /charges` options, from the query string.
#[derive(Debug, Default, PartialEq, Eq)]
struct Options {
    delay: Option<Duration>,
    drop: bool,
}

impl Options {
    /// Unknown or malformed options are ignored: the toy must never refuse a charge
    /// because of the demo knobs.
    fn parse(query: Option<&str>) -> Options {
        let mut options = Options::default();
        for pair in query.unwrap_or("").split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "delay_ms" => options.delay = value.parse().ok().map(Duration::from_millis),
                "drop" => options.drop = matches!(value, "1" | "true"),
                _ => {}
            }
        }
        options
    }
}

#[allow(
    clippy::print_stderr,
    reason = "the demo script and the operator read these lines; no logging set-up in a toy"
)]
fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("toy backend: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args.listen)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("toy backend: {err}");
            ExitCode::FAILURE
        }
    }
}

#[allow(
    clippy::print_stderr,
    reason = "the readiness line is part of the example's interface"
)]
async fn run(listen: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await.map_err(|err| {
        std::io::Error::new(err.kind(), format!("cannot listen on {listen}: {err}"))
    })?;
    eprintln!("toy backend listening on {}", listener.local_addr()?);
    serve(listener, idemgate::cli::shutdown_signal()).await;
    Ok(())
}

/// Serves the charges API on `listener` until `shutdown` resolves. Also used in-process
/// by the demo story test (tests/it/demo.rs includes this file as a module).
#[allow(
    clippy::print_stderr,
    reason = "the stop lines are part of the example's interface"
)]
pub async fn serve(listener: TcpListener, shutdown: impl std::future::Future<Output = ()>) {
    let charges = Arc::new(Charges::default());
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = idemgate::proxy::accept(&listener) => accepted,
            () = &mut shutdown => break,
        };
        let charges = Arc::clone(&charges);
        let svc = service_fn(move |req| {
            let charges = Arc::clone(&charges);
            async move { handle(&charges, req).await }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Errors here are clients going away and `?drop=1`; nothing to do about them.
            let _ = conn.await;
        });
    }
    drop(listener);
    eprintln!("toy backend stopping");
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!("toy backend: requests still running after {SHUTDOWN_GRACE:?}; exiting");
    }
}

async fn handle(
    charges: &Charges,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::POST, "/charges") => create_charge(charges, req).await,
        (&Method::GET, "/charges") => Ok(reply(StatusCode::OK, &json!(charges.list()))),
        (&Method::GET, "/stats") => Ok(reply(
            StatusCode::OK,
            &json!({ "charges_created": charges.count() }),
        )),
        (&Method::GET, "/healthz") => Ok(reply(StatusCode::OK, &json!({ "ok": true }))),
        (_, "/charges" | "/stats" | "/healthz") => Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({ "error": "method not allowed" }),
        )),
        _ => Ok(reply(
            StatusCode::NOT_FOUND,
            &json!({ "error": "not found" }),
        )),
    }
}

async fn create_charge(
    charges: &Charges,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let options = Options::parse(req.uri().query());
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        // Over the cap, or the client went away; either way no charge is created.
        Err(_) => {
            return Ok(reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                &json!({ "error": "body too large or unreadable" }),
            ));
        }
    };
    let charge = charges.create(amount(&body));
    if let Some(delay) = options.delay {
        tokio::time::sleep(delay).await;
    }
    if options.drop {
        return Err(Dropped);
    }
    Ok(reply(StatusCode::CREATED, &charge))
}

/// `amount` from a JSON body; anything else (no body, not JSON, no integer) is 0, so
/// a bare `curl -X POST` works in the demo.
fn amount(body: &[u8]) -> i64 {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("amount").and_then(Value::as_i64))
        .unwrap_or(0)
}

fn reply(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_come_from_the_query() {
        assert_eq!(Options::parse(None), Options::default());
        assert_eq!(
            Options::parse(Some("delay_ms=250&drop=1")),
            Options {
                delay: Some(Duration::from_millis(250)),
                drop: true
            }
        );
        assert_eq!(
            Options::parse(Some("drop=0&delay_ms=x")),
            Options::default()
        );
    }

    #[test]
    fn amount_defaults_to_zero() {
        assert_eq!(amount(br#"{"amount": 1200}"#), 1200);
        assert_eq!(amount(b""), 0);
        assert_eq!(amount(b"not json"), 0);
        assert_eq!(amount(br#"{"amount": "12"}"#), 0);
    }
}
