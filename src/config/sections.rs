//! The sections of the file, one file each: its struct, which serde reads with every
//! key checked as it is read, its defaults and its checks.

use super::values::{Null, null, section_form};

mod admin;
mod errors;
mod log;
pub(super) mod store;
pub(super) mod telemetry;
mod upstream;

pub use admin::{AdminConfig, AdminToken};
pub use errors::{ErrorFormat, ErrorsConfig};
pub use log::{LogConfig, LogFormat};
pub use upstream::UpstreamConfig;

section_form!(
    store::StoreConfig,
    LogConfig,
    UpstreamConfig,
    ErrorsConfig,
    AdminConfig,
    telemetry::TelemetryConfig,
);

null! {
    refused:;
    default: store::StoreConfig, LogConfig, UpstreamConfig, ErrorsConfig, AdminConfig,
        telemetry::TelemetryConfig,
}
