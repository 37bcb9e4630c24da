//! `idemgate keys list --state outcome_unknown` (docs/behaviour.md §24): after an
//! incident, every record in one state, through the admin listener's `GET /keys?state=`,
//! page after page to the last. One line per record, tab-separated: its id, the state
//! asked, its status (`-` when none is readable), when it was created and when it expires.

use std::process::ExitCode;

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::resolve::{ResolveError, bearer, call};

/// `idemgate keys list --state STATE [--limit N] [--admin URL]`
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// The admin listener (its bearer token, if it has one, is read from
    /// IDEMGATE_ADMIN_TOKEN).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:9901")]
    pub admin: String,
    /// in_flight, outcome_unknown or completed.
    #[arg(long, value_name = "STATE")]
    pub state: String,
    /// Records per page asked of the admin listener (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: u32,
}

/// The most of one page's answer that is read: 1000 records' JSON.
const MAX_PAGE: usize = 8 << 20;

pub(super) fn run(args: &ListArgs) -> ExitCode {
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ResolveError::Runtime)
        .and_then(|runtime| runtime.block_on(list(args)));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
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

async fn list(args: &ListArgs) -> Result<(), ResolveError> {
    let bad = || ResolveError::AdminUrl(args.admin.clone());
    let base: Uri = args.admin.parse().map_err(|_| bad())?;
    if base.scheme_str() != Some("http") || base.authority().is_none() {
        return Err(bad());
    }
    let token = bearer()?;
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut cursor: Option<String> = None;
    loop {
        let mut uri = format!(
            "{}/keys?state={}&limit={}",
            args.admin.trim_end_matches('/'),
            escape(&args.state),
            args.limit
        );
        if let Some(cursor) = &cursor {
            uri.push_str("&cursor=");
            uri.push_str(&escape(cursor));
        }
        let page = fetch(&client, &uri, token.as_ref()).await?;
        let items = page.get("items").and_then(Value::as_array);
        for item in items.into_iter().flatten() {
            #[allow(
                clippy::print_stdout,
                reason = "idemgate keys list prints one line per record by contract"
            )]
            {
                println!("{}", line(item, &args.state));
            }
        }
        match page.get("next_cursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => return Ok(()),
        }
    }
}

async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    uri: &str,
    token: Option<&http::HeaderValue>,
) -> Result<Value, ResolveError> {
    let mut request =
        Request::get(uri).header(header::ACCEPT, "application/json, application/problem+json");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, token);
    }
    let request = request
        .body(Empty::new())
        .map_err(|_| ResolveError::AdminUrl(uri.to_owned()))?;
    let answer = call(client, request, uri, MAX_PAGE).await?;
    serde_json::from_slice(&answer).map_err(|err| ResolveError::Answer {
        uri: uri.to_owned(),
        source: Box::new(err),
    })
}

/// `id  state  status  created_at  expires_at`, `-` for what is null.
fn line(item: &Value, state: &str) -> String {
    let field = |name: &str| match item.get(name) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "-".to_owned(),
    };
    format!(
        "{}\t{state}\t{}\t{}\t{}",
        field("id"),
        field("status"),
        field("created_at"),
        field("expires_at")
    )
}

/// A query value, percent-escaped but for the characters a cursor and a state use.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_one_line_with_dashes_for_what_is_null() {
        let item = serde_json::json!({
            "id": "idemgate:ab", "state": "completed", "status": 503,
            "created_at": null, "expires_at": "2026-01-01T00:00:00.000Z",
        });
        assert_eq!(
            line(&item, "outcome_unknown"),
            "idemgate:ab\toutcome_unknown\t503\t-\t2026-01-01T00:00:00.000Z"
        );
        assert_eq!(escape("in_flight"), "in_flight");
        assert_eq!(escape("a b&c"), "a%20b%26c");
    }
}
