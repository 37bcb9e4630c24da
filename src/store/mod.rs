//! Where records live. [`Store`] (`api.rs`) is the contract every backend fulfils; the
//! proxy only ever talks to it, through the one decorator of `timed.rs`. The contract is
//! checked by one test suite run against every implementation
//! (`tests/it/store_contract.rs`).

mod api;
mod clock;
pub mod file;
mod memory;
mod postgres;
mod quota;
mod redis;
mod rules;
mod seal;
mod timed;
mod waiters;

pub use api::{
    Claim, ClaimRequest, Cursor, Fenced, Inspection, Lease, Page, Purged, Replaced, StateFilter,
    Store, StoreError, Watch, Written, wall_clock_ms,
};
pub use clock::{Clock, TokioClock};
pub use file::{Disk, FileOptions, FileStore, FileWatch};
pub use memory::{Backing, Durability, Embedded, MemoryShards, MemoryStore, MemoryWatch, Volatile};
pub use postgres::{PostgresStore, PostgresWatch, SchemaError, create_statements};
pub use redis::{RedisStore, RedisWatch, key_slot};
pub use seal::{Keyring, Opened, Undecryptable};
pub use timed::{Around, Deadline, Layered, Timed};
pub use waiters::{KeyWatch, Registry, WaiterMap};
