//! `upstream.tls` (docs/behaviour.md §11): extra trust anchors and an optional client
//! certificate, read and parsed while the file is deserialized, so that an unreadable or
//! invalid PEM file is an error naming its key (`upstream.tls.ca_file: ...`) and
//! `--check` reports it too. The proxy never reads these files again.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::config::types::{Text, text};

/// The PEM files of `upstream.tls`, each with what it held; `null` is none.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    default,
    expecting = "a mapping with ca_file, cert_file, key_file"
)]
pub struct UpstreamTls {
    /// Extra trust anchors, besides the system store.
    pub ca_file: Option<CertFile>,
    /// The client certificate chain for mutual TLS; set together with `key_file`.
    pub cert_file: Option<CertFile>,
    /// The private key of `cert_file`.
    pub key_file: Option<KeyFile>,
}

/// A PEM file of one or more certificates.
#[derive(Debug, Clone, PartialEq)]
pub struct CertFile {
    pub path: PathBuf,
    pub certs: Vec<CertificateDer<'static>>,
}

/// A PEM file holding a private key (PKCS#8, PKCS#1 or SEC1).
#[derive(Clone)]
pub struct KeyFile {
    pub path: PathBuf,
    pub key: Arc<PrivateKeyDer<'static>>,
}

impl KeyFile {
    pub fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }
}

impl fmt::Debug for KeyFile {
    /// The path only: the key stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl PartialEq for KeyFile {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.key.secret_der() == other.key.secret_der()
    }
}

/// A path, as a non-empty string.
fn read_path<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    let text = Text::deserialize(d)?.0;
    let text = text.trim();
    if text.is_empty() {
        return Err(de::Error::custom(
            "expected the path of a PEM file, found ''",
        ));
    }
    Ok(PathBuf::from(text))
}

impl<'de> Deserialize<'de> for CertFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let path = read_path(d)?;
        let shown = path.display();
        let bytes = std::fs::read(&path)
            .map_err(|err| de::Error::custom(format!("cannot read '{shown}': {err}")))?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| {
                de::Error::custom(format!("'{shown}' is not valid PEM certificates: {err}"))
            })?;
        if certs.is_empty() {
            return Err(de::Error::custom(format!(
                "'{shown}' holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            )));
        }
        Ok(CertFile { path, certs })
    }
}

impl<'de> Deserialize<'de> for KeyFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let path = read_path(d)?;
        let shown = path.display();
        let bytes = std::fs::read(&path)
            .map_err(|err| de::Error::custom(format!("cannot read '{shown}': {err}")))?;
        let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|err| {
            de::Error::custom(format!(
                "'{shown}' holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {err}"
            ))
        })?;
        Ok(KeyFile {
            path,
            key: Arc::new(key),
        })
    }
}

/// `--check` prints the path of each file, `null` for one not given.
impl Serialize for CertFile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        text(&self.path.to_string_lossy(), s)
    }
}

impl Serialize for KeyFile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        text(&self.path.to_string_lossy(), s)
    }
}

/// The rustls client configuration for `tls` (none: the system store alone) with
/// `roots` as the system store: the trust anchors of `ca_file` are added to it, and
/// the client certificate is set when given. Errors name the key they are about.
pub fn client_config(
    tls: Option<&UpstreamTls>,
    mut roots: rustls::RootCertStore,
) -> Result<rustls::ClientConfig, (&'static str, String)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    if let Some(ca) = tls.and_then(|t| t.ca_file.as_ref()) {
        for cert in &ca.certs {
            roots.add(cert.clone()).map_err(|err| {
                (
                    "upstream.tls.ca_file",
                    format!(
                        "'{}' holds a certificate rustls refuses: {err}",
                        ca.path.display()
                    ),
                )
            })?;
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| ("upstream.tls", err.to_string()))?
        .with_root_certificates(roots);
    let (cert, key) = match tls {
        Some(t) => (t.cert_file.as_ref(), t.key_file.as_ref()),
        None => (None, None),
    };
    let mut config = match (cert, key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => {
            return Err((
                "upstream.tls.key_file",
                "missing; cert_file needs the key_file of its private key".to_owned(),
            ));
        }
        (None, Some(_)) => {
            return Err((
                "upstream.tls.cert_file",
                "missing; key_file needs the cert_file of its certificate".to_owned(),
            ));
        }
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(cert.certs.clone(), key.key())
            .map_err(|err| {
                (
                    "upstream.tls.key_file",
                    format!(
                        "'{}' is not the key of '{}': {err}",
                        key.path.display(),
                        cert.path.display()
                    ),
                )
            })?,
    };
    // HTTP/1.1 only, as over http:// (docs/behaviour.md §11).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
