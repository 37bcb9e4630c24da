//! Reaching PostgreSQL (docs/behaviour.md §22): the URL as tokio-postgres reads it, TLS
//! by rustls as `sslmode` asks, and the pool that hands out connections and forgets
//! the ones that broke, found a read-only server, or were given up on midway.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::StoreConfig;
use crate::config::{SslMode, split_sslmode};
use crate::store::StoreError;

pub(super) fn unavailable(err: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(err))
}

/// A PostgreSQL error as an operator needs to read it: the server's own message and
/// SQLSTATE when it sent one (tokio-postgres's own text is only "db error"), else the
/// client's account (which names the cause: refused, timed out, TLS).
#[derive(Debug)]
pub struct PgError(tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(
                f,
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            ),
            None => self.0.fmt(f),
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(err: tokio_postgres::Error) -> Self {
        Self(err)
    }
}

/// A statement's error: the store is unavailable, and why in the server's words.
pub(super) fn failed(err: tokio_postgres::Error) -> StoreError {
    unavailable(PgError(err))
}

/// A pool's error, the database's own when it is one.
pub(super) fn no_connection(err: deadpool_postgres::PoolError) -> StoreError {
    match err {
        deadpool_postgres::PoolError::Backend(err) => failed(err),
        other => unavailable(other),
    }
}

/// The URL as tokio-postgres reads it (`sslmode` mapped), and the mode asked for.
fn url(config: &StoreConfig) -> Result<(String, SslMode), StoreError> {
    let url = config
        .urls
        .first()
        .ok_or(StoreError::Protocol("kind: postgres without a url"))?;
    split_sslmode(url).map_err(|msg| unavailable(std::io::Error::other(msg)))
}

/// The connect timeout, keepalives and user timeout a proxy needs: a primary that
/// vanished without a word is found out within seconds, not at the kernel's two hours
/// (idle) or fifteen minutes (unacknowledged data).
fn settings(pg: &mut tokio_postgres::Config, connect: Duration) {
    pg.connect_timeout(connect.max(Duration::from_millis(50)))
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(Duration::from_secs(10));
    if pg.get_application_name().is_none() {
        pg.application_name("idemgate");
    }
}

/// The URL's settings with [`settings`], every host in it, and the `sslmode` asked for.
pub(super) fn pg_config(
    config: &StoreConfig,
) -> Result<(tokio_postgres::Config, SslMode), StoreError> {
    let (url, mode) = url(config)?;
    let mut pg: tokio_postgres::Config = url.parse().map_err(failed)?;
    settings(&mut pg, config.timeout);
    Ok((pg, mode))
}

/// The TLS connector for `mode`: libpq's meaning of each (docs/behaviour.md §22).
pub(super) fn tls(config: &StoreConfig, mode: SslMode) -> Result<MakeRustlsConnect, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ca = config.tls.as_ref().and_then(|tls| tls.ca_file.as_ref());
    let mut roots = RootCertStore::empty();
    match ca {
        Some(ca) => {
            for cert in &ca.certs {
                roots.add(cert.clone()).map_err(unavailable)?;
            }
        }
        None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system store with one unreadable certificate still trusts the rest.
                let _ = roots.add(cert);
            }
        }
        None => {}
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(unavailable)?;
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, ca) {
        (SslMode::VerifyFull, _) => {
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(unavailable)?
        }
        (SslMode::VerifyCa, _) | (SslMode::Require | SslMode::Prefer, Some(_)) => {
            Arc::new(ChainOnly(
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(unavailable)?,
            ))
        }
        (SslMode::Require | SslMode::Prefer, None) | (SslMode::Disable, _) => {
            Arc::new(EncryptOnly(provider))
        }
    };
    let client = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(client))
}

/// The pool of `store.pool_size` connections. Waiting for a connection, making one and
/// checking one are each bounded by `store.timeout`, so that a database that does not
/// answer is `store-unavailable`, not a hang.
pub(super) fn pool(config: &StoreConfig) -> Result<(Pool, tokio_postgres::Config), StoreError> {
    let (pg, mode) = pg_config(config)?;
    let (url, _) = url(config)?;
    let create = config.timeout.max(Duration::from_millis(100));
    let per_host = create / u32::try_from(pg.get_hosts().len().max(1)).unwrap_or(1);
    let hosts = super::hosts::HostByHost::new(
        &url,
        |one| settings(one, per_host),
        tls(config, mode)?,
        create,
    )
    .map_err(failed)?;
    let manager = Manager::from_connect(
        pg.clone(),
        hosts,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(config.pool_size)
        .wait_timeout(Some(config.timeout))
        .create_timeout(Some(create))
        .recycle_timeout(Some(config.timeout))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(unavailable)?;
    Ok((pool, pg))
}

/// What closing a connection that was given up on midway needs: the TLS connector for
/// the cancel request, and how long that request may take.
#[derive(Clone)]
pub(super) struct Canceller {
    pub(super) tls: MakeRustlsConnect,
    pub(super) timeout: Duration,
}

impl std::fmt::Debug for Canceller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Canceller")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A pooled connection lent to one piece of work, given back to the pool only once that
/// work got its answer ([`Lent::give_back`]) and closed otherwise, so that the next call
/// connects afresh to whichever host is the primary then (docs/behaviour.md §22
/// "Failover"). One that failed ([`Lent::close`]) may be broken or found a standby.
/// One dropped midway (a call `store.timeout` gave up on) may be open to a primary whose
/// host went silent, where every call would wait out the timeout again and the pool,
/// full, would never connect to the new primary; its statement is cancelled as it is
/// closed, since the server may still be running it: a commit waiting for a synchronous
/// standby that is gone waits until the standby is back, and without the cancel every
/// timeout would leave one more server process, and connection slot, behind.
pub(super) struct Lent<'a> {
    client: Option<Object>,
    canceller: &'a Canceller,
}

impl<'a> Lent<'a> {
    pub(super) fn new(client: Object, canceller: &'a Canceller) -> Self {
        Self {
            client: Some(client),
            canceller,
        }
    }

    /// Runs a prepared statement, then gives the connection back, or closes it if the
    /// statement failed.
    pub(super) async fn query(
        self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let answer = match self.prepare_cached(sql).await {
            Ok(statement) => self.deref().query(&statement, params).await,
            Err(err) => Err(err),
        };
        self.settle(answer)
    }

    /// [`Lent::query`] for a statement whose row count is its answer.
    pub(super) async fn execute(
        self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let answer = match self.prepare_cached(sql).await {
            Ok(statement) => self.deref().execute(&statement, params).await,
            Err(err) => Err(err),
        };
        self.settle(answer)
    }

    fn settle<T>(self, answer: Result<T, tokio_postgres::Error>) -> Result<T, StoreError> {
        match answer {
            Ok(v) => {
                self.give_back();
                Ok(v)
            }
            Err(err) => {
                self.close();
                Err(failed(err))
            }
        }
    }

    /// Back to the pool: the work got its answer.
    pub(super) fn give_back(mut self) {
        drop(self.client.take());
    }

    /// Out of the pool (which may make another in its place), and closed.
    pub(super) fn close(mut self) {
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
    }
}

impl std::ops::Deref for Lent<'_> {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.client
            .as_ref()
            .expect("a lent connection is held until given back or closed")
    }
}

impl std::ops::DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut Object {
        self.client
            .as_mut()
            .expect("a lent connection is held until given back or closed")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let cancel = client.cancel_token();
        drop(Object::take(client));
        // Dropped outside a runtime (process teardown): the server ends the statement
        // when it finds the connection gone.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let Canceller { tls, timeout } = self.canceller.clone();
            runtime.spawn(async move {
                let _ = tokio::time::timeout(timeout, cancel.cancel_query(tls)).await;
            });
        }
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not compared.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain first and the name last, so a name mismatch is the
        // only error that comes after a chain found good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` and `prefer` without `tls.ca_file`: encrypted, the certificate not checked,
/// as libpq does; the handshake's signatures are still verified.
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
