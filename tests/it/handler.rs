//! The handler tier: requests driven through `proxy::handle` in memory, with no socket,
//! for every answer the proxy makes without reaching the upstream (refusals, replays,
//! crashed owners, a full store). The socket tests beside it cover the rest.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idemgate::config::Config;
use idemgate::idempotency::{Completed, Fingerprint, OwnerToken, ScopedKey, StoredBody};
use idemgate::metrics::{Metrics, Outcome};
use idemgate::proxy::{AppState, ProxyBody, handle};
use idemgate::store::{Claim, ClaimRequest, MemoryStore, Store};

const PEER: &str = "127.0.0.1:40000";

/// Nothing listens on the discard port: a request that reached the upstream would fail,
/// and none of these does.
fn state(extra: &str) -> Arc<AppState<MemoryStore>> {
    let yaml = format!("upstream:\n  url: http://127.0.0.1:9\n{extra}");
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid");
    let store = MemoryStore::new(config.store.max_entries);
    Arc::new(AppState::with_metrics(
        Arc::new(config),
        Arc::new(store),
        Metrics::observable(),
    ))
}

fn post(path: &str, key: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
    let mut req = Request::post(path)
        .header("host", "api.test")
        .header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request")
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn problem(&self) -> String {
        let json: serde_json::Value = serde_json::from_slice(&self.body).expect("problem json");
        let kind = json["type"].as_str().expect("type").to_owned();
        kind.rsplit('/').next().unwrap_or_default().to_owned()
    }

    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

async fn send(state: &Arc<AppState<MemoryStore>>, req: Request<Full<Bytes>>) -> Answer {
    let peer: SocketAddr = PEER.parse().expect("addr");
    let response: Response<ProxyBody> = handle(Arc::clone(state), req, peer).await;
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("in-memory body").to_bytes(),
    }
}

/// The record address and fingerprint that `post(path, Some(key), body)` gets.
fn address(
    state: &AppState<MemoryStore>,
    path: &str,
    key: &str,
    body: &str,
) -> (ScopedKey, Fingerprint) {
    let req = post(path, Some(key), "");
    let policy = &state.config.idempotency;
    let key = idemgate::idempotency::key::parse_value(key.as_bytes()).expect("key");
    let scoped = ScopedKey::new(req.headers(), &policy.scope_headers, &key);
    let fp = Fingerprint::new(
        req.method(),
        path,
        req.headers(),
        &policy.fingerprint_rules(),
        body.as_bytes(),
    );
    (scoped, fp)
}

/// Claims the key as another request would, with `lease`; returns the claim's lease.
async fn marker(
    state: &AppState<MemoryStore>,
    (key, fingerprint): (ScopedKey, Fingerprint),
    lease: Duration,
) -> idemgate::store::Lease {
    let claim = ClaimRequest {
        key,
        scope: None,
        fingerprint,
        token: OwnerToken::random(),
        lease,
        ttl: Duration::from_secs(3600),
        streamed: false,
    };
    match state.store.claim(claim).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing { .. } => panic!("the key was free"),
    }
}

/// Every request is counted once, under one outcome.
fn counted(state: &AppState<MemoryStore>) -> u64 {
    Outcome::ALL
        .iter()
        .map(|o| state.metrics.requests(*o))
        .sum()
}

#[tokio::test]
async fn a_required_key_that_is_missing_is_400_and_claims_nothing() {
    let state = state("idempotency:\n  required: true\n");
    let r = send(&state, post("/charges", None, "{}")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.problem(), "missing-key");
    assert_eq!(state.metrics.requests(Outcome::MissingKey), 1);
    assert_eq!(counted(&state), 1);
    assert!(state.store.is_empty());
}

#[tokio::test]
async fn an_invalid_key_is_400() {
    let state = state("");
    let r = send(&state, post("/charges", Some("\"unterminated"), "{}")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.problem(), "invalid-key");
    assert_eq!(state.metrics.requests(Outcome::InvalidKey), 1);
    assert!(state.store.is_empty());
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_by_length_or_by_reading() {
    let state = state("idempotency:\n  max_request_body: 4\n");
    let mut req = post("/charges", Some("k"), "{\"amount\":1}");
    req.headers_mut()
        .insert("content-length", http::HeaderValue::from_static("12"));
    let r = send(&state, req).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.problem(), "body-too-large");
    // Without a Content-Length, the limit is found while reading.
    let r = send(&state, post("/charges", Some("k"), "{\"amount\":1}")).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(state.metrics.requests(Outcome::TooLarge), 2);
    assert!(state.store.is_empty());
}

#[tokio::test]
async fn a_completed_key_replays_its_record_and_another_body_is_422() {
    let state = state("");
    let at = address(&state, "/charges", "paid", "{}");
    let lease = marker(&state, at, Duration::from_secs(10)).await;
    let record = Completed::clear(
        at.1,
        StatusCode::CREATED,
        vec![(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        )],
        StoredBody::Stored(Bytes::from_static(b"{\"charge\":1}")),
    );
    let done = state
        .store
        .complete(&lease, Arc::new(record), Duration::from_secs(3600))
        .await
        .expect("complete");
    assert_eq!(done, idemgate::store::Fenced::Done);

    let r = send(&state, post("/charges", Some("paid"), "{}")).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(r.replayed());
    assert_eq!(r.body, "{\"charge\":1}");
    assert_eq!(r.headers["content-type"], "application/json");

    let r = send(&state, post("/charges", Some("paid"), "{\"other\":2}")).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.problem(), "key-reused");
    assert_eq!(state.metrics.requests(Outcome::Replayed), 1);
    assert_eq!(state.metrics.requests(Outcome::KeyReused), 1);
    assert_eq!(counted(&state), 2);
}

/// `Retry-After` is the smaller of the time left on the holder's lease and the time it
/// has already run, rounded up to whole seconds, at least 1 (docs/behaviour.md §25):
/// exact here, on tokio's paused clock, which the memory store's clock follows. The
/// holder's run counts from its claim, whatever renewals moved its lease on.
#[tokio::test(start_paused = true)]
async fn a_key_in_flight_is_409_with_retry_after_growing_with_the_holders_run() {
    let state = state("");
    let at = address(&state, "/charges", "busy", "{}");
    let owner = marker(&state, at, Duration::from_secs(10)).await;
    let mut seen = Vec::new();
    // Run 0, 0.2, 3.5, 6 and 9 s of a 10 s lease: 10, 9.8, 6.5, 4 and 1 s left. Then
    // renewed at 9.5 s for 10 s more: run 9.5 s, 10 s left; run 12 s, 7.5 s left.
    for (advance, renew) in [
        (0, false),
        (200, false),
        (3_300, false),
        (2_500, false),
        (3_000, false),
        (500, true),
        (2_500, false),
    ] {
        tokio::time::advance(Duration::from_millis(advance)).await;
        if renew {
            let renewed = state.store.renew(&owner, Duration::from_secs(10)).await;
            assert_eq!(renewed.expect("renew"), idemgate::store::Fenced::Done);
        }
        let r = send(&state, post("/charges", Some("busy"), "{}")).await;
        assert_eq!(r.status, StatusCode::CONFLICT);
        assert_eq!(r.problem(), "in-flight");
        seen.push(r.headers["retry-after"].to_str().expect("ascii").to_owned());
    }
    assert_eq!(seen, ["1", "1", "4", "4", "1", "10", "8"]);
    assert_eq!(state.metrics.requests(Outcome::InFlight), 7);
}

#[tokio::test]
async fn a_crashed_owner_becomes_a_recorded_outcome_unknown() {
    let state = state("");
    let at = address(&state, "/charges", "crashed", "{}");
    let _gone = marker(&state, at, Duration::ZERO).await;
    let first = send(&state, post("/charges", Some("crashed"), "{}")).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    assert_eq!(first.problem(), "outcome-unknown");
    assert!(
        first.replayed(),
        "it answers from the (now recorded) outcome"
    );
    let again = send(&state, post("/charges", Some("crashed"), "{}")).await;
    assert_eq!(again.status, StatusCode::BAD_GATEWAY);
    assert_eq!(again.body, first.body);
    assert_eq!(state.metrics.requests(Outcome::OutcomeUnknown), 1);
    assert_eq!(state.metrics.requests(Outcome::Replayed), 1);
}

#[tokio::test]
async fn a_store_full_of_markers_is_503_even_under_pass_through() {
    let state = state("store:\n  max_entries: 1\n  on_unavailable: pass_through\n");
    let _owner = marker(
        &state,
        address(&state, "/charges", "first", "{}"),
        Duration::from_secs(10),
    )
    .await;
    let r = send(&state, post("/charges", Some("second"), "{}")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem(), "store-unavailable");
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(state.metrics.requests(Outcome::StoreUnavailable), 1);
    assert_eq!(state.metrics.requests(Outcome::StoreBypassed), 0);
}
