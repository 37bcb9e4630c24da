//! The connector of the upstream client: TCP through hyper-util's `HttpConnector`
//! (which resolves the host name each time a connection is opened), then, for an
//! `https://` URL, a TLS handshake through tokio-rustls (docs/behaviour.md §11).
//!
//! Ours rather than hyper-rustls: tokio-rustls and rustls-native-certs are already built
//! for redis, and this is the one small service hyper-rustls would add.
//!
//! Whatever fails here (resolution, TCP, handshake, certificate) is reported by the
//! client as a connect error (`is_connect()`): the request was never written.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tower_service::Service;

use crate::error::BoxError;

/// Opens TCP connections, and TLS over them for `https://`.
#[derive(Clone)]
pub struct UpstreamConnector {
    http: HttpConnector,
    /// `Err` only if the validated TLS material could not be put together again, which
    /// validation rules out; then every `https://` connect fails with the reason.
    tls: Result<TlsConnector, Arc<str>>,
    handshake_timeout: Duration,
}

impl std::fmt::Debug for UpstreamConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConnector")
            .field("tls", &self.tls.is_ok())
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl UpstreamConnector {
    pub(crate) fn new(
        http: HttpConnector,
        tls: Result<rustls::ClientConfig, String>,
        handshake_timeout: Duration,
    ) -> Self {
        Self {
            http,
            tls: tls
                .map(|c| TlsConnector::from(Arc::new(c)))
                .map_err(Arc::from),
            handshake_timeout,
        }
    }
}

/// A plain or TLS connection to the upstream.
#[derive(Debug)]
pub enum UpstreamStream {
    Plain(TokioIo<TcpStream>),
    /// Boxed: the TLS state is a kilobyte, the plain stream a few words.
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Service<Uri> for UpstreamConnector {
    type Response = UpstreamStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let https = uri.scheme_str() == Some("https");
        let tls = self.tls.clone();
        let timeout = self.handshake_timeout;
        let server_name = server_name(&uri);
        let connecting = self.http.call(uri);
        Box::pin(async move {
            let tcp = connecting.await?;
            if !https {
                return Ok(UpstreamStream::Plain(tcp));
            }
            let tls = tls.map_err(|reason| format!("TLS to the upstream: {reason}"))?;
            let name = server_name?;
            let handshake = tls.connect(name, tcp.into_inner());
            let stream = tokio::time::timeout(timeout, handshake)
                .await
                .map_err(|_| format!("TLS handshake with the upstream took over {timeout:?}"))?
                .map_err(|err| format!("TLS handshake with the upstream failed: {err}"))?;
            Ok(UpstreamStream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// The URL's host, for SNI and certificate verification: a DNS name or an IP address
/// (without the brackets of an IPv6 literal).
fn server_name(uri: &Uri) -> Result<ServerName<'static>, BoxError> {
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .map_err(|err| format!("'{host}' is not a TLS server name: {err}").into())
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        match self {
            UpstreamStream::Plain(tcp) => tcp.connected(),
            UpstreamStream::Tls(tls) => tls.inner().get_ref().0.connected(),
        }
    }
}

impl Read for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Plain(s) => s.is_write_vectored(),
            UpstreamStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
}
