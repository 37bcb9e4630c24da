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
//!   backend that crashed half-way: the side effect happened, the client never knows);
//! - `?lose=1`: close the connection before creating anything (a request lost on the
//!   way: nothing happened, and the client cannot know that either);
//! - `?lookup=down`: the charge's lookup by key (below) answers `503`, as a backend
//!   whose lookup is down would: idemgate's `reconcile` cannot settle it.
//!
//! Each charge remembers the `Idempotency-Key` it was created with, and `GET
//! /charges/by-key/{key}` (the key percent-encoded) answers `200` with that charge or
//! `404`: the lookup idemgate's `reconcile` asks before it records an unknown outcome.
//! The lookup takes `?delay_ms=N` too (a lookup that times out), and `?fail=1` (it
//! answers `500`).
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
/// POST /charges creates a charge (?delay_ms=N answers late, ?drop=1 never answers,
/// ?lose=1 never answers nor creates it);
/// GET /charges lists them, GET /charges/by-key/KEY finds one by its Idempotency-Key,
/// GET /stats counts them.
// No bare `about`: clap would take the crate's description, which is idemgate's.
#[derive(Debug, Parser)]
#[command(name = "toy_backend")]
pub struct Args {
    /// Address to listen on; port 0 picks a free port (the real one is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
}

/// The charges created so far, each with the `Idempotency-Key` it came with. A `Vec`
/// behind a mutex: the demo makes a handful.
#[derive(Debug, Default)]
struct Charges {
    list: Mutex<Vec<(Option<String>, Value)>>,
    /// Keys whose lookup answers `503` (`?lookup=down`).
    lookup_down: Mutex<Vec<String>>,
}

impl Charges {
    /// Creates and stores charge number N (1-based), returning its JSON.
    fn create(&self, amount: i64, key: Option<String>) -> Value {
        let mut list = self.lock();
        let n = list.len() + 1;
        // `created` is the sequence number rather than a timestamp so that two
        // executions are told apart by every field, and demo output is reproducible.
        let charge = json!({ "id": format!("ch_{n}"), "amount": amount, "created": n });
        list.push((key, charge.clone()));
        charge
    }

    fn list(&self) -> Vec<Value> {
        self.lock()
            .iter()
            .map(|(_, charge)| charge.clone())
            .collect()
    }

    /// The first charge created with `key`.
    fn by_key(&self, key: &str) -> Option<Value> {
        self.lock()
            .iter()
            .find(|(k, _)| k.as_deref() == Some(key))
            .map(|(_, charge)| charge.clone())
    }

    fn take_lookup_down(&self, key: String) {
        self.lookup_down
            .lock()
            .expect("no code panics while holding the lock")
            .push(key);
    }

    fn is_lookup_down(&self, key: &str) -> bool {
        self.lookup_down
            .lock()
            .expect("no code panics while holding the lock")
            .iter()
            .any(|k| k == key)
    }

    fn count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Option<String>, Value)>> {
        self.list
            .lock()
            .expect("no code panics while holding the lock")
    }
}

/// Returned by the service to make hyper close the connection without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose (?drop=1 or ?lose=1)")
    }
}

impl std::error::Error for Dropped {}

/// The `POST /charges` options, from the query string.
#[derive(Debug, Default, PartialEq, Eq)]
struct Options {
    delay: Option<Duration>,
    drop: bool,
    lose: bool,
    fail: bool,
    lookup_down: bool,
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
                "fail" => options.fail = matches!(value, "1" | "true"),
                "lose" => options.lose = matches!(value, "1" | "true"),
                "lookup" => options.lookup_down = value == "down",
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
        (&Method::GET, _) if path.starts_with(BY_KEY) => Ok(find_charge(charges, &req).await),
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
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
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
    if let (true, Some(key)) = (options.lookup_down, &key) {
        charges.take_lookup_down(key.clone());
    }
    if options.lose {
        return Err(Dropped);
    }
    let charge = charges.create(amount(&body), key);
    if let Some(delay) = options.delay {
        tokio::time::sleep(delay).await;
    }
    if options.drop {
        return Err(Dropped);
    }
    Ok(reply(StatusCode::CREATED, &charge))
}

/// Where a charge is looked up by its key.
const BY_KEY: &str = "/charges/by-key/";

/// `GET /charges/by-key/{key}`: the charge created with that `Idempotency-Key`, or 404.
async fn find_charge(charges: &Charges, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let options = Options::parse(req.uri().query());
    if let Some(delay) = options.delay {
        tokio::time::sleep(delay).await;
    }
    if options.fail {
        return reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({ "error": "lookup failed (?fail=1)" }),
        );
    }
    let encoded = req.uri().path().trim_start_matches(BY_KEY);
    let key = percent_decode(encoded);
    if key
        .as_deref()
        .is_some_and(|key| charges.is_lookup_down(key))
    {
        return reply(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "error": "lookup down for this charge (?lookup=down)" }),
        );
    }
    match key.and_then(|key| charges.by_key(&key)) {
        Some(charge) => reply(StatusCode::OK, &charge),
        None => reply(
            StatusCode::NOT_FOUND,
            &json!({ "error": "no charge with this key" }),
        ),
    }
}

/// `%XX` escapes decoded; `None` for a broken escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
                drop: true,
                lose: false,
                fail: false,
                lookup_down: false,
            }
        );
        assert_eq!(
            Options::parse(Some("drop=0&delay_ms=x")),
            Options::default()
        );
    }

    #[test]
    fn keys_are_percent_decoded() {
        assert_eq!(percent_decode("a%2Fb%20c").as_deref(), Some("a/b c"));
        assert_eq!(percent_decode("plain-1").as_deref(), Some("plain-1"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("bad%zz"), None);
    }

    #[test]
    fn a_charge_is_found_by_its_key() {
        let charges = Charges::default();
        charges.create(5, Some("k1".to_owned()));
        charges.create(6, None);
        assert_eq!(
            charges.by_key("k1").map(|c| c["amount"].clone()),
            Some(json!(5))
        );
        assert_eq!(charges.by_key("k2"), None);
    }

    #[test]
    fn amount_defaults_to_zero() {
        assert_eq!(amount(br#"{"amount": 1200}"#), 1200);
        assert_eq!(amount(b""), 0);
        assert_eq!(amount(b"not json"), 0);
        assert_eq!(amount(br#"{"amount": "12"}"#), 0);
    }
}
