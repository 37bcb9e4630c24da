//! Reading a `jwks_url` (docs/behaviour.md §17): idemgate's own HTTPS client, with the
//! upstream's TLS settings (`upstream.tls`: its CA file and client certificate, and the
//! system trust store), so an identity provider inside the same PKI as the upstream needs
//! no more configuration. One small client per verifier: key sets are read every few
//! minutes, not per request. A read is bounded by `jwks_timeout` where it is made
//! (`principal/refresh.rs`), not by the upstream's `timeout`.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::connector::UpstreamConnector;
use super::upstream::system_roots;
use crate::config::{UpstreamConfig, tls_client_config};
use crate::error::BoxError;
use crate::principal::{Fetch, FetchFuture};

/// The largest key set read: real ones are a few kilobytes.
const MAX_JWKS: usize = 1 << 20;

/// Reads one `jwks_url`.
struct UrlFetch {
    uri: Uri,
    client: Client<UpstreamConnector, Empty<Bytes>>,
}

impl std::fmt::Debug for UrlFetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlFetch").field("uri", &self.uri).finish()
    }
}

/// What makes the reader of each `jwks_url`, with the TLS settings of `upstream` and its
/// `connect_timeout`.
pub(crate) fn url_fetcher(upstream: &UpstreamConfig) -> impl Fn(&Uri) -> Arc<dyn Fetch> + use<> {
    let upstream = upstream.clone();
    move |uri: &Uri| {
        let tls = tls_client_config(upstream.tls.as_ref(), system_roots())
            .map_err(|(path, msg)| format!("{path}: {msg}"));
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(upstream.connect_timeout));
        http.enforce_http(false);
        let connector = UpstreamConnector::new(http, tls, upstream.connect_timeout);
        let fetch: Arc<dyn Fetch> = Arc::new(UrlFetch {
            uri: uri.clone(),
            client: Client::builder(TokioExecutor::new()).build(connector),
        });
        fetch
    }
}

impl Fetch for UrlFetch {
    fn fetch(&self) -> FetchFuture<'_> {
        Box::pin(async move {
            let request = Request::get(self.uri.clone()).body(Empty::new())?;
            let response = self.client.request(request).await?;
            if response.status() != StatusCode::OK {
                return Err(format!("answered {}", response.status()).into());
            }
            let body = Limited::new(response.into_body(), MAX_JWKS)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, BoxError>(body.to_vec())
        })
    }

    fn describe(&self) -> String {
        self.uri.to_string()
    }
}
