//! `POST /keys/{id}/resolve` (docs/behaviour.md §18): an operator who has checked the
//! backend says whether a request recorded as `outcome-unknown` executed.
//! `{"executed": false}` removes the record, so the next retry executes;
//! `{"executed": true, "status": ..., "headers": {...}, "body": ...}` turns it into the
//! completed record of that answer, kept until the same `expires_at`, replayed from then
//! on.
//!
//! The change is one compare-and-set in the store ([`Store::replace`]): only the record
//! that was read, still unknown, is changed, so of two resolutions racing (or a
//! resolution and a purge) exactly one lands.

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::StatusCode;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use crate::config::Policy;
use crate::error::AdminError;
use crate::idempotency::{Completed, Kept, Record, ScopedKey, StoredBody, StoredResponse, Times};
use crate::proxy::{AppState, stored_headers};
use crate::store::{Inspection, Replaced, Store, StoreError};

/// A resolution as it is sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResolution {
    executed: bool,
    status: Option<u16>,
    #[serde(default)]
    headers: serde_json::Map<String, serde_json::Value>,
    body: Option<String>,
    body_base64: Option<String>,
}

/// What the operator knows.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Resolution {
    NotExecuted,
    Executed(StoredResponse),
}

/// Reads a resolution; `max_body` is the largest body a policy would have stored, and
/// `policies` are those that might have written the record: its headers are kept as
/// any of them would keep an upstream's (docs/behaviour.md §25).
pub(super) fn parse(
    body: &[u8],
    max_body: u64,
    policies: &[&Policy],
) -> Result<Resolution, AdminError> {
    let invalid = |why: String| AdminError::InvalidResolution(why);
    let raw: RawResolution =
        serde_json::from_slice(body).map_err(|err| invalid(format!("{err}")))?;
    if !raw.executed {
        if raw.status.is_some()
            || !raw.headers.is_empty()
            || raw.body.is_some()
            || raw.body_base64.is_some()
        {
            return Err(invalid(
                "\"executed\": false takes no status, headers or body: nothing is recorded"
                    .to_owned(),
            ));
        }
        return Ok(Resolution::NotExecuted);
    }
    let status = raw
        .status
        .ok_or_else(|| invalid("\"executed\": true needs the \"status\" it answered".to_owned()))?;
    // A final answer, as idemgate records: never an interim `1xx` (docs/behaviour.md §25).
    let status = StatusCode::from_u16(status)
        .ok()
        .filter(|_| (200..=599).contains(&status))
        .ok_or_else(|| {
            invalid(format!(
                "status {status} is not between 200 and 599: no final answer has it"
            ))
        })?;
    let mut given = HeaderMap::with_capacity(raw.headers.len());
    for (name, value) in raw.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("{name:?} is not a header name")))?;
        let value = value
            .as_str()
            .and_then(|text| HeaderValue::from_str(text).ok())
            .ok_or_else(|| invalid(format!("header {name:?}: not a header value (a string)")))?;
        given.append(header, value);
    }
    // What a recorded answer keeps, by the rule that records an upstream's.
    let headers = stored_headers(&given, policies);
    let body = match (raw.body, raw.body_base64) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "give \"body\" or \"body_base64\", not both".to_owned(),
            ));
        }
        (Some(text), None) => Bytes::from(text),
        (None, Some(encoded)) => STANDARD
            .decode(encoded.trim())
            .map(Bytes::from)
            .map_err(|err| invalid(format!("body_base64: {err}")))?,
        (None, None) => Bytes::new(),
    };
    if body.len() as u64 > max_body {
        return Err(invalid(format!(
            "the body is {} bytes, over max_response_body ({max_body} bytes)",
            body.len()
        )));
    }
    Ok(Resolution::Executed(StoredResponse {
        status,
        headers,
        body: StoredBody::Stored(body),
    }))
}

/// Settles `found`, the record under `key` (`shown`: its id as printed), as `resolution`
/// says, for `caller`. Returns the record it became, or `None` when it was removed.
pub(super) async fn resolve<S: Store>(
    state: &AppState<S>,
    (key, shown): (ScopedKey, &str),
    found: Inspection,
    resolution: Resolution,
    caller: SocketAddr,
) -> Result<Option<Inspection>, AdminError> {
    let unknown = match &found.record {
        Record::Completed(record) => Arc::clone(record),
        Record::InFlight(_) => return Err(AdminError::NotUnknown("an in-flight marker")),
    };
    // Opened first: the flag that says the outcome is unknown is bound by the record's
    // seal, and one altered at rest is never resolved (docs/behaviour.md §25).
    state
        .open(&key, Arc::clone(&unknown))
        .map_err(|err| AdminError::StoreUnavailable(StoreError::Undecryptable(err)))?;
    if !unknown.unknown {
        return Err(AdminError::NotUnknown("a completed record"));
    }
    let executed = matches!(resolution, Resolution::Executed(_));
    let new = match resolution {
        Resolution::NotExecuted => None,
        Resolution::Executed(response) => {
            let completed_ms = state.store.clock_ms();
            let record = Completed {
                fingerprint: unknown.fingerprint,
                kept: Kept::Clear(response),
                times: Some(Times {
                    claimed_ms: unknown.times.map_or(completed_ms, |t| t.claimed_ms),
                    completed_ms,
                }),
                unknown: false,
                // The request is the one the unknown outcome was recorded for.
                streamed: unknown.streamed,
            };
            Some(Arc::new(state.seal(&key, record)))
        }
    };
    let replaced = state
        .store
        .replace(key, &found.record, new.clone())
        .await
        .map_err(AdminError::StoreUnavailable)?;
    match replaced {
        Replaced::Done => {}
        // Resolved or purged meanwhile: the other one won.
        Replaced::Changed => return Err(AdminError::NotUnknown("a record changed meanwhile")),
        Replaced::Absent => return Err(AdminError::KeyNotFound),
    }
    tracing::warn!(
        id = %shown,
        executed,
        caller = %caller,
        "admin resolve: an unknown outcome is settled{}",
        if executed {
            "; retries now replay the given answer"
        } else {
            "; the next request with its key executes"
        }
    );
    state.metrics.count_resolution(executed);
    Ok(new.map(|record| Inspection {
        record: Record::Completed(record),
        expires_at_ms: found.expires_at_ms,
        now_ms: state.store.clock_ms(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Resolution, String> {
        let config = crate::config::Config::from_yaml_str(
            "upstream:\n  url: http://127.0.0.1:9\nidempotency:\n  record_exclude_headers: [x-session]\n",
            &|_| None,
        )
        .expect("config");
        parse(text.as_bytes(), 16, &[&config.idempotency]).map_err(|err| err.to_string())
    }

    #[test]
    fn both_forms_are_read() {
        assert_eq!(
            parsed(r#"{"executed": false}"#),
            Ok(Resolution::NotExecuted)
        );
        let Ok(Resolution::Executed(response)) = parsed(
            r#"{"executed": true, "status": 201, "headers": {"content-type": "application/json", "Date": "x", "Connection": "x-hop", "X-Hop": "1", "Upgrade": "h2c", "traceparent": "x", "X-Session": "s"}, "body": "{\"id\":1}"}"#,
        ) else {
            panic!("executed")
        };
        assert_eq!(response.status, StatusCode::CREATED);
        assert_eq!(
            response.headers,
            vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json")
            )],
            "Date is made anew on replay; hop-by-hop, trace and excluded headers are never kept"
        );
        assert_eq!(
            response.body,
            StoredBody::Stored(Bytes::from_static(b"{\"id\":1}"))
        );
        let Ok(Resolution::Executed(binary)) =
            parsed(r#"{"executed": true, "status": 200, "body_base64": "AAEC"}"#)
        else {
            panic!("executed")
        };
        assert_eq!(
            binary.body,
            StoredBody::Stored(Bytes::from_static(&[0, 1, 2]))
        );
    }

    #[test]
    fn what_is_not_a_resolution_is_refused_saying_why() {
        for (text, why) in [
            ("not json", "expected"),
            (r#"{"status": 200}"#, "executed"),
            (r#"{"executed": true}"#, "status"),
            (r#"{"executed": true, "status": 600}"#, "600"),
            (r#"{"executed": true, "status": 99}"#, "99"),
            (r#"{"executed": true, "status": 100}"#, "100"),
            (r#"{"executed": true, "status": 199}"#, "199"),
            (
                r#"{"executed": false, "status": 200}"#,
                "nothing is recorded",
            ),
            (
                r#"{"executed": true, "status": 200, "body": "x", "body_base64": "eA=="}"#,
                "not both",
            ),
            (
                r#"{"executed": true, "status": 200, "body_base64": "!!"}"#,
                "body_base64",
            ),
            (
                r#"{"executed": true, "status": 200, "body": "seventeen bytes!!"}"#,
                "max_response_body",
            ),
            (
                r#"{"executed": true, "status": 200, "headers": {"bad name": "x"}}"#,
                "header name",
            ),
            (
                r#"{"executed": true, "status": 200, "headers": {"x": 1}}"#,
                "header value",
            ),
            (
                r#"{"executed": true, "status": 200, "extra": 1}"#,
                "unknown field",
            ),
        ] {
            let err = parsed(text).expect_err(text);
            assert!(err.contains(why), "{text}: {err}");
        }
    }
}
