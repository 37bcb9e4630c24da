//! `GET /keys?state=in_flight|outcome_unknown|completed&limit=N&cursor=C`
//! (docs/behaviour.md §24): after an incident, the records in one state, a page at a
//! time, each with the inspection JSON of `GET /keys/{id}`, and the cursor of the next
//! page (absent on the last). Same access as `/keys/{id}`, checked by the caller.
//!
//! The cursor is opaque to the operator; it spells a [`Cursor`] as
//! `{node}-{scan}-{id hex or empty}`, each store using the parts it needs.

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;

use super::keys::{Caller, authorize, describe, json, problem, unescape};
use crate::error::AdminError;
use crate::idempotency::ScopedKey;
use crate::proxy::AppState;
use crate::store::{Cursor, StateFilter, Store};

/// A page holds this many records unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 100;
/// And never more than this.
const MAX_LIMIT: usize = 1000;

/// What a listing asks for.
#[derive(Debug, PartialEq, Eq)]
struct Query {
    state: StateFilter,
    limit: usize,
    cursor: Cursor,
}

/// Answers `/keys` (with its query): the access rules of `/keys/{id}` first.
pub(super) async fn answer<S: Store>(
    state: &AppState<S>,
    req: Request<Incoming>,
    caller: Caller,
) -> Response<Full<Bytes>> {
    let listed = async {
        // The token in force now: a reload may have set or changed it.
        let live = state.live();
        authorize(
            live.config.admin.token.as_ref(),
            caller.local,
            req.headers(),
        )?;
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return Err(AdminError::MethodNotAllowed);
        }
        list(state, req.uri().query(), &state.config.store.key_prefix).await
    };
    match listed.await {
        Ok(response) => response,
        Err(err) => problem(&err, &state.config.errors),
    }
}

async fn list<S: Store>(
    state: &AppState<S>,
    query: Option<&str>,
    prefix: &str,
) -> Result<Response<Full<Bytes>>, AdminError> {
    let query = parse(query.unwrap_or(""))?;
    let page = state
        .store
        .list(query.state, query.cursor, query.limit)
        .await
        .map_err(AdminError::StoreUnavailable)?;
    let items: Vec<serde_json::Value> = page
        .items
        .iter()
        .map(|(key, found)| describe(&key.id(prefix), found))
        .collect();
    let mut body = serde_json::json!({ "items": items });
    if let Some(next) = page.next {
        body["next_cursor"] = serde_json::Value::String(spell(&next));
    }
    Ok(json(&body))
}

fn parse(query: &str) -> Result<Query, AdminError> {
    let bad = |why: String| AdminError::InvalidListing(why);
    let (mut state, mut limit, mut cursor) = (None, None, None);
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = unescape(value).ok_or_else(|| bad(format!("{name} is not escaped well")))?;
        let slot = match name {
            "state" => &mut state,
            "limit" => &mut limit,
            "cursor" => &mut cursor,
            _ => {
                return Err(bad(format!(
                    "unknown parameter {name:?}: it takes state, limit and cursor"
                )));
            }
        };
        if slot.replace(value).is_some() {
            return Err(bad(format!("{name} is given twice")));
        }
    }
    let state = match state.as_deref() {
        Some("in_flight") => StateFilter::InFlight,
        Some("outcome_unknown") => StateFilter::OutcomeUnknown,
        Some("completed") => StateFilter::Completed,
        _ => {
            return Err(bad(
                "state must be in_flight, outcome_unknown or completed".to_owned()
            ));
        }
    };
    let limit = match limit {
        None => DEFAULT_LIMIT,
        Some(limit) => limit
            .parse()
            .ok()
            .filter(|limit| (1..=MAX_LIMIT).contains(limit))
            .ok_or_else(|| bad(format!("limit must be a number from 1 to {MAX_LIMIT}")))?,
    };
    let cursor = match cursor {
        None => Cursor::default(),
        Some(cursor) => read(&cursor).ok_or_else(|| {
            bad("cursor is not one a listing gave (take next_cursor as it came)".to_owned())
        })?,
    };
    Ok(Query {
        state,
        limit,
        cursor,
    })
}

fn spell(cursor: &Cursor) -> String {
    let after = cursor.after.map(|key| key.to_hex()).unwrap_or_default();
    format!("{}-{}-{after}", cursor.node, cursor.scan)
}

fn read(text: &str) -> Option<Cursor> {
    let mut parts = text.splitn(3, '-');
    let node = parts.next()?.parse().ok()?;
    let scan = parts.next()?.parse().ok()?;
    let after = match parts.next()? {
        "" => None,
        hex => Some(ScopedKey::from_hex(hex)?),
    };
    Some(Cursor { node, scan, after })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_it_was_spelled() {
        for cursor in [
            Cursor::default(),
            Cursor {
                node: 5461,
                scan: 1 << 40,
                after: Some(ScopedKey::from_bytes([0xcd; 32])),
            },
        ] {
            assert_eq!(read(&spell(&cursor)), Some(cursor));
        }
        for bad in ["", "0", "0-0", "x-0-", "0-0-abc", "-1-0-", "0-0-0-"] {
            assert_eq!(read(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_listing_takes_a_state_a_limit_and_a_cursor() {
        let query = parse("state=outcome_unknown").expect("valid");
        assert_eq!(query.state, StateFilter::OutcomeUnknown);
        assert_eq!(query.limit, DEFAULT_LIMIT);
        assert_eq!(query.cursor, Cursor::default());
        let query = parse("limit=1000&state=in_flight&cursor=3-7-").expect("valid");
        assert_eq!(query.limit, 1000);
        assert_eq!(query.cursor.scan, 7);
        for bad in [
            "",
            "state=done",
            "state=completed&limit=0",
            "state=completed&limit=1001",
            "state=completed&limit=ten",
            "state=completed&cursor=nope",
            "state=completed&state=completed",
            "state=completed&limt=5",
        ] {
            assert!(
                matches!(parse(bad), Err(AdminError::InvalidListing(_))),
                "{bad}"
            );
        }
    }
}
