//! `admin`: the admin listener (docs/behaviour.md §6, §13). It is bound at start-up;
//! the token is read per request.

use std::net::{Ipv4Addr, SocketAddr};

use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::config::types::http::Addr;
use crate::config::types::secret::MASK;
use crate::config::types::secret::masked;
use crate::config::types::{Form, Text, shown};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping with listen and token"
)]
pub struct AdminConfig {
    /// `/healthz`, `/readyz`, `/metrics` and `/keys`; `null` turns the listener off.
    #[serde(deserialize_with = "listen", serialize_with = "print_listen")]
    pub listen: Option<SocketAddr>,
    /// The bearer token `/keys` requires (docs/behaviour.md §13); without one, `/keys`
    /// answers only on a loopback `listen`.
    pub token: Option<AdminToken>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 9901)),
            token: None,
        }
    }
}

/// An address, or `null` for none: unlike any other key, `null` is not its default.
fn listen<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    Ok(Option::<Addr>::deserialize(d)?.map(Form::value))
}

/// `null` disables the admin server; leaving the key out would re-enable the default.
fn print_listen<S: Serializer>(listen: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
    match listen {
        Some(addr) => shown(addr, s),
        None => s.serialize_none(),
    }
}

/// `admin.token`: a credential, so never printed (`Debug` and `--check` show `***`).
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

impl Serialize for AdminToken {
    /// A credential: shown as set, never printed.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        masked(self, s)
    }
}

impl<'de> Deserialize<'de> for AdminToken {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Text(token) = Text::deserialize(d)?;
        let refused = if token.trim().is_empty() {
            "must not be empty (leave it out to allow /keys on a loopback listen only)"
        } else if token == MASK {
            "is '***', what --check prints in place of the token; write the token itself, \
             e.g. ${IDEMGATE_ADMIN_TOKEN}"
        } else if token.chars().any(|c| !c.is_ascii_graphic()) {
            "must be visible ASCII without spaces (it is sent as a bearer token)"
        } else {
            return Ok(AdminToken(token));
        };
        Err(de::Error::custom(refused))
    }
}
