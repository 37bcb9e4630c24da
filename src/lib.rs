//! idemgate: a reverse proxy that makes retried mutating HTTP requests execute at most
//! once per `Idempotency-Key`, and replays the first response to every retry.
//!
//! # Layout
//!
//! - [`admin`]: the admin listener: `/healthz`, `/readyz`, `/metrics`.
//! - [`config`]: YAML file -> one serde pass into each section's struct -> validated, typed
//!   [`config::Config`]; `--check` prints the same structs.
//! - `alloc_stats` (private, feature `alloc-stats`): every allocation counted, for the
//!   benchmark's account of a request.
//! - `error` (private): the errors the proxy answers itself, their one status table and
//!   their outcome labels.
//! - `failpoint` (private): named crash points for the fault suite (feature `failpoints`).
//! - [`idempotency`]: the pure engine: key sources, keys and record addresses,
//!   fingerprints, records, the decision table.
//! - [`principal`]: who the caller is (`scope_principal`): JWTs and their key sets, a
//!   trusted header, Basic credentials; verified before anything is claimed.
//! - [`store`]: the [`store::Store`] trait, its backends (memory, file, redis) and the timing
//!   decorator every call goes through.
//! - [`proxy`]: accept loop and shutdown, then the request path in the order a request
//!   visits it: handler, claim, exchange, lease, reply, upstream.
//! - [`metrics`]: request outcomes and counters.
//! - [`logs`]: log lines to stderr, batched on the worker threads.
//! - [`telemetry`]: traces: the server, store and upstream spans, W3C trace context in
//!   and out, and the OTLP exporter's thread.
//! - [`worker`]: which worker thread a call runs on, and what each worker owns.
//! - [`cli`]: command-line arguments, logging set-up, and the run loop of the binary.
//!
//! What these modules must do is written in `docs/behaviour.md`, the behaviour contract,
//! in numbered sections; comments cite them as `(docs/behaviour.md §4)`.

pub mod admin;
#[cfg(feature = "alloc-stats")]
mod alloc_stats;
pub mod cli;
pub mod config;
mod error;
mod failpoint;
pub mod idempotency;
pub mod logs;
pub mod metrics;
pub mod principal;
pub mod proxy;
pub mod store;
pub mod telemetry;
pub mod worker;
