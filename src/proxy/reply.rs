//! What a request is answered with: replays, problems, and [`finish`], the one place
//! where a request's outcome is counted and its failure logged. The handler calls it for
//! every answer it makes; the exchange calls it from its own task, which may outlive the
//! client, so that an outcome is counted whether or not anyone hears it.

use http::Response;
use http::header::{HeaderName, HeaderValue};

use super::body::ProxyBody;
use super::state::AppState;
use crate::config::{ErrorsConfig, Policy};
use crate::error::{Problem, ProxyError, UnknownCause};
use crate::idempotency::{Completed, Fingerprint, Kept, StoredBody, StoredResponse, Streamed};
use crate::metrics::Outcome;

pub(crate) static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// An answer and how it came about, not yet counted.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) outcome: Outcome,
    pub(crate) response: Response<ProxyBody>,
}

impl Reply {
    pub(crate) fn new(outcome: Outcome, response: Response<ProxyBody>) -> Self {
        Self { outcome, response }
    }
}

/// An answer that has been counted. Only [`finish`] makes one, so no answer is counted
/// twice or not at all.
#[derive(Debug)]
pub(crate) struct Counted(Reply);

impl Counted {
    pub(crate) fn outcome(&self) -> Outcome {
        self.0.outcome
    }

    pub(crate) fn status(&self) -> http::StatusCode {
        self.0.response.status()
    }

    /// Whether the answer is a replay, as the client is told.
    pub(crate) fn replayed(&self) -> bool {
        self.0
            .response
            .headers()
            .get(&IDEMPOTENT_REPLAYED)
            .is_some_and(|value| value == "true")
    }

    /// For the headers every answer gets once it is made (`cors.rs`); its outcome stays.
    pub(crate) fn response_mut(&mut self) -> &mut Response<ProxyBody> {
        &mut self.0.response
    }

    pub(crate) fn into_response(self) -> Response<ProxyBody> {
        self.0.response
    }
}

/// Counts the outcome, logs an infrastructure failure once, and turns an error into its
/// problem answer.
pub(crate) fn finish<S>(state: &AppState<S>, result: Result<Reply, ProxyError>) -> Counted {
    let reply = match result {
        Ok(reply) => reply,
        Err(err) => {
            if err.is_infrastructure() {
                tracing::warn!(
                    error = %err,
                    source = ?std::error::Error::source(&err).map(ToString::to_string),
                    "request failed"
                );
            }
            let response = problem_response(&err.problem(), &state.config.errors);
            Reply::new(err.outcome(), response)
        }
    };
    state.metrics.count(reply.outcome);
    Counted(reply)
}

/// A stored response, sent again. `Date` and `Content-Length` are made anew by hyper.
/// A recorded status of 500 or more cannot change either: it carries the policy's
/// `replay_error_headers`, so that SDKs stop retrying it (docs/behaviour.md §16).
pub(crate) fn replay_response(stored: &StoredResponse, policy: &Policy) -> Response<ProxyBody> {
    let body = match &stored.body {
        StoredBody::Stored(body) => ProxyBody::full(body.clone()),
        StoredBody::TooLarge => ProxyBody::empty(),
    };
    let mut response = Response::new(body);
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    for (name, value) in &stored.headers {
        headers.append(name, value.clone());
    }
    headers.insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    if stored.status.is_server_error() {
        for (name, value) in &policy.replay_error_headers {
            headers.insert(name, value.clone());
        }
    }
    response
}

/// An answer the proxy makes itself, in the configured shape.
pub(crate) fn problem_response(problem: &Problem, errors: &ErrorsConfig) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(problem.body(errors)));
    *response.status_mut() = problem.status;
    let headers = response.headers_mut();
    for (name, value) in problem.headers(errors) {
        headers.append(name, value);
    }
    response
}

/// An `outcome-unknown` problem as the record of its key, so that retries get the same
/// answer until someone who knows resolves it (docs/behaviour.md §4, §18).
pub(crate) fn unknown_record(
    problem: &Problem,
    errors: &ErrorsConfig,
    fingerprint: Fingerprint,
    streamed: Option<Streamed>,
) -> Completed {
    Completed {
        fingerprint,
        kept: Kept::Clear(problem_stored(problem, errors)),
        times: None,
        unknown: true,
        streamed,
    }
}

fn problem_stored(problem: &Problem, errors: &ErrorsConfig) -> StoredResponse {
    StoredResponse {
        status: problem.status,
        headers: problem.headers(errors),
        body: StoredBody::Stored(problem.body(errors)),
    }
}

/// The record of a key whose owner crashed before recording (docs/behaviour.md §4).
pub(crate) fn abandoned_record(
    errors: &ErrorsConfig,
    fingerprint: Fingerprint,
    streamed: Option<Streamed>,
) -> Completed {
    Completed {
        fingerprint,
        kept: Kept::Clear(abandoned_response(errors)),
        times: None,
        unknown: true,
        streamed,
    }
}

/// What a key whose owner crashed before recording answers (docs/behaviour.md §4).
pub(crate) fn abandoned_response(errors: &ErrorsConfig) -> StoredResponse {
    let problem = ProxyError::OutcomeUnknown {
        cause: UnknownCause::LeaseExpired,
        source: None,
    }
    .problem();
    problem_stored(&problem, errors)
}
