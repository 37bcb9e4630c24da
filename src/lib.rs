//! idemgate: a reverse proxy that makes retried mutating HTTP requests execute at most
//! once per `Idempotency-Key`, and replays the first response to every retry.
//!
//! # Layout
//!
//! - [`admin`]: the admin listener: `/healthz`, `/readyz`, `/metrics`.
//! - [`config`]: YAML file -> raw serde structs -> validated, typed [`config::Config`].
//! - [`error`]: the errors the proxy answers itself and their one status table.
//! - [`failpoint`]: named crash points for the fault suite (feature `failpoints`).
//! - [`idempotency`]: the pure engine: keys, fingerprints, records, the decision table.
//! - [`store`]: the [`store::Store`] trait and its backends (memory, redis).
//! - [`proxy`]: accept loop and shutdown, the request handler, the upstream client.
//! - [`metrics`]: request outcomes and counters.
//! - [`cli`]: command-line arguments, logging set-up, and the run loop of the binary.

pub mod admin;
pub mod cli;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod idempotency;
pub mod metrics;
pub mod proxy;
pub mod store;
