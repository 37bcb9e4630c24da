//! The HTTP side. `main` and the tests both call [`serve`] with a bound listener. This
//! file only declares the modules and what the crate may use of them.
//!
//! A request visits the files of this module in this order, and each depends only on
//! those after it (no file imports one above it):
//!
//! 1. `workers.rs`: [`serve`] once per worker thread, each on its own listener socket;
//!    `reload.rs`: a new configuration, checked and put in force;
//! 2. `listen.rs`: [`serve`], the accept loop, and the deadlines of a connection;
//! 3. `handler.rs`: policy, key, body, fingerprint; pass-through or guarded;
//!    `view.rs` gives it one view of the request (the method, the `Host` checks),
//!    `upgrade.rs` passes upgrades through, `streamed.rs` claims and compares a body
//!    too large to buffer; `record_id.rs` addresses a request as it does, for
//!    `idemgate key`;
//! 4. `claim.rs`: claim -> decide -> wait / take over, until the key is ours or answered;
//!    `authorize.rs` asks `replay_authorization` before a replay is answered;
//! 5. `exchange.rs`: forward once and record (on its own task if the client leaves,
//!    `detach.rs`); `reconcile.rs` asks the upstream about an unknown outcome first;
//! 6. `lease.rs`: renew while forwarding, complete, release; bounded background retries;
//! 7. `reply.rs`: replays, problems, and the one place an answer is counted and logged;
//!    `cors.rs` puts the CORS headers on idemgate's own answers, replays and preflights;
//! 8. `state.rs`: the shared state ([`AppState`]), the configuration in force ([`Live`]),
//!    policy ids;
//! 9. `upstream.rs`: the pooled client, `send`, header rewriting (`connector.rs`: TLS);
//!    `jwks.rs` reads a `jwks_url` with the same TLS;
//! 10. `body.rs`: body types; `upload.rs`: a streamed request body, hashed as it goes;
//!     `budget.rs`: `max_buffered_bytes`.

mod authorize;
mod body;
mod budget;
mod claim;
mod connector;
mod cors;
mod detach;
mod exchange;
mod handler;
mod jwks;
mod lease;
mod listen;
mod reconcile;
mod record_id;
pub mod reload;
mod reply;
mod state;
mod streamed;
mod upgrade;
mod upload;
mod upstream;
mod view;
mod workers;

pub use body::{ProxyBody, RequestBody};
pub(crate) use exchange::stored_headers;
pub use handler::handle;
pub(crate) use listen::{Activity, Ended, drive};
pub use listen::{Shutdown, accept, serve};
pub use record_id::{RecordIdError, record_id};
pub use state::{AppState, Live, PolicyId};
pub use upstream::UpstreamClient;
pub use workers::{WorkerError, bind_workers, serve_workers};
