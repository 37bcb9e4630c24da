//! `upstream`: where guarded and passed-through requests go (docs/behaviour.md §6, §11).

use std::time::Duration;

use http::Uri;
use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;
pub(crate) mod tls;

use self::tls::UpstreamTls;
use crate::config::types::As;
use crate::config::types::http::UpstreamUrl;
use crate::config::types::units::Dur;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping with url, connect_timeout, timeout, tls"
)]
pub struct UpstreamConfig {
    /// `http://` or `https://`; scheme + authority (+ optional base path, which is
    /// prefixed to request paths).
    ///
    /// The authority is kept as written: no port means 80, or 443 for `https://`
    /// (`port_u16()` is `None`).
    /// A trailing `/` of the base path is removed, so the path is `/` or `/base`.
    /// The default is a sidecar's neighbour, http://127.0.0.1:9000
    /// (docs/behaviour.md §6).
    #[serde(with = "As::<UpstreamUrl>")]
    pub url: Uri,
    #[serde(with = "As::<Dur>")]
    pub connect_timeout: Duration,
    /// The whole upstream exchange.
    #[serde(with = "As::<Dur>")]
    pub timeout: Duration,
    /// Extra trust anchors and a client certificate for an `https://` URL, already
    /// read and parsed (docs/behaviour.md §11); `null` is none.
    pub tls: Option<UpstreamTls>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            url: Uri::from_static("http://127.0.0.1:9000/"),
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(30),
            tls: None,
        }
    }
}

impl UpstreamConfig {
    /// `upstream.tls` goes with an `https://` URL; its files were read while
    /// deserializing, and here they are put together once as the proxy will (without
    /// the system store), so that a key that does not fit its certificate is refused
    /// now.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if let Some(tls) = &self.tls {
            if self.url.scheme_str() != Some("https") {
                return Err(ConfigError::invalid(
                    "upstream.tls",
                    "applies to an https:// upstream.url only; remove it or use https://",
                ));
            }
            tls::client_config(Some(tls), rustls::RootCertStore::empty())
                .map_err(|(path, msg)| ConfigError::invalid(path, msg))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::types::http::parse_upstream_url;

    /// `--check` prints the default URL, which must parse back to the same value.
    #[test]
    fn the_default_upstream_is_what_parsing_it_gives() {
        assert_eq!(
            parse_upstream_url("http://127.0.0.1:9000"),
            Ok(UpstreamConfig::default().url)
        );
    }
}
