//! `idemgate key resolve` (docs/behaviour.md §18): the runbook's way to settle a record
//! whose outcome is unknown, through the admin listener's `POST /keys/{id}/resolve`, so
//! that an operator at 3 a.m. types flags rather than JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value, json};

/// `idemgate key resolve --admin URL ID (--executed false | --status N [-H 'Name: value']...
/// [--body-file PATH])`
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("verdict").required(true).args(["executed", "status"])))]
pub struct ResolveArgs {
    /// The admin listener, e.g. http://127.0.0.1:9901 (its bearer token, if it has one,
    /// is read from IDEMGATE_ADMIN_TOKEN).
    #[arg(long, value_name = "URL")]
    pub admin: String,
    /// The record id, as `idemgate key` prints it.
    pub id: String,
    /// `false`: the upstream did not execute the request; the record is removed and the
    /// next retry executes.
    #[arg(long, value_name = "BOOL", conflicts_with_all = ["headers", "body_file"])]
    pub executed: Option<bool>,
    /// It did execute it, and answered this status: the record becomes that answer,
    /// replayed to every retry.
    #[arg(long, value_name = "N")]
    pub status: Option<u16>,
    /// A header of that answer, e.g. -H 'Content-Type: application/json' (repeatable).
    #[arg(
        short = 'H',
        long = "header",
        value_name = "NAME: VALUE",
        requires = "status"
    )]
    pub headers: Vec<String>,
    /// The body of that answer; sent as `body_base64` when it is not UTF-8.
    #[arg(long, value_name = "PATH", requires = "status")]
    pub body_file: Option<PathBuf>,
}

/// The environment variable the admin token is read from: never a flag, which `ps`
/// would show to every user of the machine.
pub(super) const TOKEN_ENV: &str = "IDEMGATE_ADMIN_TOKEN";

/// How long the admin listener gets to answer.
pub(super) const TIMEOUT: Duration = Duration::from_secs(10);

/// The most of an answer that is read: a resolution's answer is one record's JSON.
const MAX_ANSWER: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub(super) enum ResolveError {
    #[error("--admin: '{0}' is not an http:// URL (e.g. http://127.0.0.1:9901)")]
    AdminUrl(String),
    #[error("--executed true needs the --status the upstream answered")]
    NoStatus,
    #[error("-H: '{0}' is not a header; expected 'Name: value'")]
    Header(String),
    #[error("-H: '{0}' is given twice; a resolution takes one value per header")]
    HeaderTwice(String),
    #[error("--body-file {path}: {source}")]
    BodyFile {
        path: String,
        source: std::io::Error,
    },
    #[error("{TOKEN_ENV}: not a valid header value")]
    Token,
    #[error("{uri}: {source}")]
    Request {
        uri: String,
        source: hyper_util::client::legacy::Error,
    },
    #[error("{uri}: reading the answer: {source}")]
    Answer {
        uri: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{uri}: no answer within {TIMEOUT:?}")]
    Timeout { uri: String },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    /// The admin listener refused it: its problem's `detail`, or the status and body.
    #[error("{0}")]
    Refused(String),
}

/// Sends the resolution and prints the answer: its JSON on stdout (nothing for `204`),
/// exit 0; otherwise the problem's `detail` on stderr, exit 1.
pub(super) fn run(args: &ResolveArgs) -> ExitCode {
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ResolveError::Runtime)
        .and_then(|runtime| runtime.block_on(resolve(args)));
    match outcome {
        Ok(answer) => {
            if !answer.is_empty() {
                #[allow(
                    clippy::print_stdout,
                    reason = "idemgate key resolve prints the admin API's answer by contract"
                )]
                {
                    println!("{}", String::from_utf8_lossy(&answer).trim_end());
                }
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            #[allow(
                clippy::print_stderr,
                reason = "a command's error goes to stderr; no logging is set up"
            )]
            {
                eprintln!("idemgate: {err}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The JSON body of `POST /keys/{id}/resolve` (docs/behaviour.md §18).
pub(super) fn resolution(args: &ResolveArgs) -> Result<Value, ResolveError> {
    let Some(status) = args.status else {
        return match args.executed {
            Some(true) => Err(ResolveError::NoStatus),
            // clap requires one of the two; `--executed false` is the other.
            _ => Ok(json!({ "executed": false })),
        };
    };
    let mut headers = Map::new();
    for line in &args.headers {
        let Some((name, value)) = line.split_once(':') else {
            return Err(ResolveError::Header(line.clone()));
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name.is_empty() {
            return Err(ResolveError::Header(line.clone()));
        }
        if headers.insert(name, value.into()).is_some() {
            return Err(ResolveError::HeaderTwice(line.clone()));
        }
    }
    let mut body = json!({ "executed": true, "status": status, "headers": headers });
    if let Some(path) = &args.body_file {
        let bytes = std::fs::read(path).map_err(|source| ResolveError::BodyFile {
            path: path.display().to_string(),
            source,
        })?;
        match String::from_utf8(bytes) {
            Ok(text) => body["body"] = text.into(),
            Err(not_text) => body["body_base64"] = STANDARD.encode(not_text.as_bytes()).into(),
        }
    }
    Ok(body)
}

/// `URL/keys/ID/resolve`, for a plain `http://` admin URL.
fn target(admin: &str, id: &str) -> Result<Uri, ResolveError> {
    let bad = || ResolveError::AdminUrl(admin.to_owned());
    let base: Uri = admin.parse().map_err(|_| bad())?;
    if base.scheme_str() != Some("http") || base.authority().is_none() {
        return Err(bad());
    }
    format!("{}/keys/{id}/resolve", admin.trim_end_matches('/'))
        .parse()
        .map_err(|_| bad())
}

async fn resolve(args: &ResolveArgs) -> Result<Bytes, ResolveError> {
    let uri = target(&args.admin, &args.id)?;
    let body = resolution(args)?.to_string();
    let mut request = Request::post(uri.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, application/problem+json");
    if let Some(token) = bearer()? {
        request = request.header(header::AUTHORIZATION, token);
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| ResolveError::AdminUrl(args.admin.clone()))?;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    call(&client, request, &uri.to_string(), MAX_ANSWER).await
}

/// `Authorization: Bearer ...` from [`TOKEN_ENV`], when it is set.
pub(super) fn bearer() -> Result<Option<http::HeaderValue>, ResolveError> {
    match std::env::var(TOKEN_ENV) {
        Ok(token) => http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map(Some)
            .map_err(|_| ResolveError::Token),
        Err(_) => Ok(None),
    }
}

/// Sends `request` to the admin listener (`uri`, for messages) and reads at most `max`
/// bytes of its answer, all within [`TIMEOUT`]; an answer other than `2xx` is the
/// refusal it explains.
pub(super) async fn call<B>(
    client: &Client<HttpConnector, B>,
    request: Request<B>,
    uri: &str,
    max: usize,
) -> Result<Bytes, ResolveError>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|source| ResolveError::Request {
                uri: uri.to_owned(),
                source,
            })?;
        let status = response.status();
        let answer = Limited::new(response.into_body(), max)
            .collect()
            .await
            .map_err(|source| ResolveError::Answer {
                uri: uri.to_owned(),
                source,
            })?
            .to_bytes();
        Ok((status, answer))
    };
    let (status, answer) = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| ResolveError::Timeout {
            uri: uri.to_owned(),
        })??;
    if status.is_success() {
        return Ok(answer);
    }
    Err(ResolveError::Refused(refusal(status, &answer)))
}

/// What to tell the operator about a refusal: the problem's `detail`, else its title,
/// else the status and the body as it came.
pub(super) fn refusal(status: StatusCode, answer: &[u8]) -> String {
    let problem: Option<Value> = serde_json::from_slice(answer).ok();
    let said = |field: &str| {
        problem
            .as_ref()
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    said("detail").or_else(|| said("title")).unwrap_or_else(|| {
        format!(
            "the admin listener answered {status}: {}",
            String::from_utf8_lossy(answer).trim()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(executed: Option<bool>, status: Option<u16>, headers: &[&str]) -> ResolveArgs {
        ResolveArgs {
            admin: "http://127.0.0.1:9901".to_owned(),
            id: "idemgate:ab".to_owned(),
            executed,
            status,
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            body_file: None,
        }
    }

    #[test]
    fn the_flags_become_the_resolution_json() {
        assert_eq!(
            resolution(&args(Some(false), None, &[])).expect("valid"),
            json!({ "executed": false })
        );
        assert_eq!(
            resolution(&args(
                Some(true),
                Some(201),
                &["Content-Type: application/json"]
            ))
            .expect("valid"),
            json!({
                "executed": true,
                "status": 201,
                "headers": { "content-type": "application/json" },
            })
        );
        assert!(matches!(
            resolution(&args(Some(true), None, &[])),
            Err(ResolveError::NoStatus)
        ));
        assert!(matches!(
            resolution(&args(None, Some(200), &["no colon"])),
            Err(ResolveError::Header(_))
        ));
        assert!(matches!(
            resolution(&args(None, Some(200), &["A: 1", "a: 2"])),
            Err(ResolveError::HeaderTwice(_))
        ));
    }

    #[test]
    fn a_body_that_is_not_utf8_is_sent_as_base64() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (text, binary) = (dir.path().join("text"), dir.path().join("binary"));
        std::fs::write(&text, "{\"id\":\"ch_1\"}").expect("write");
        std::fs::write(&binary, [0xff, 0x00, 0x01]).expect("write");
        let mut a = args(None, Some(200), &[]);
        a.body_file = Some(text);
        assert_eq!(resolution(&a).expect("valid")["body"], "{\"id\":\"ch_1\"}");
        a.body_file = Some(binary);
        let sent = resolution(&a).expect("valid");
        assert_eq!(sent["body_base64"], "/wAB");
        assert!(sent.get("body").is_none());
    }

    #[test]
    fn only_a_plain_http_admin_url_is_taken() {
        assert_eq!(
            target("http://127.0.0.1:9901/", "idemgate:ab")
                .expect("valid")
                .to_string(),
            "http://127.0.0.1:9901/keys/idemgate:ab/resolve"
        );
        for bad in [
            "https://127.0.0.1:9901",
            "127.0.0.1:9901",
            "ftp://x",
            "http://",
        ] {
            assert!(target(bad, "x").is_err(), "{bad}");
        }
    }

    #[test]
    fn a_refusal_says_the_problems_detail() {
        let problem =
            br#"{"type":"x/not-unknown","title":"Not unknown","detail":"the outcome is known"}"#;
        assert_eq!(
            refusal(StatusCode::CONFLICT, problem),
            "the outcome is known"
        );
        assert_eq!(
            refusal(StatusCode::BAD_GATEWAY, b"oops"),
            "the admin listener answered 502 Bad Gateway: oops"
        );
    }
}
