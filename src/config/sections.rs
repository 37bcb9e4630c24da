//! The sections of the file, one file each: its struct, which serde reads with every
//! key checked as it is read, its defaults and its checks.

use super::types::section_forms;

mod admin;
pub(super) mod cors;
mod errors;
mod log;
pub(super) mod policy;
pub(super) mod routes;
pub(super) mod store;
pub(super) mod telemetry;
pub(super) mod top;
pub(super) mod upstream;

pub use admin::{AdminConfig, AdminToken};
pub use cors::{AllowOrigins, CorsConfig};
pub use errors::{ErrorFormat, ErrorsConfig};
pub use log::{LogConfig, LogFormat};
pub use policy::Policy;
pub use routes::{Route, RouteMatch};
use store::StoreConfig;
use telemetry::TelemetryConfig;
pub use top::{Config, RELOAD, Reload, ReloadKey, Workers};
pub use upstream::UpstreamConfig;

section_forms!(
    store::StoreConfig,
    LogConfig,
    UpstreamConfig,
    ErrorsConfig,
    AdminConfig,
    telemetry::TelemetryConfig,
);
