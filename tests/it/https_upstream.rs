//! HTTPS upstreams (docs/behaviour.md §11): the server certificate is verified against
//! the system store plus `upstream.tls.ca_file`, a client certificate is presented for
//! mutual TLS, and a failed handshake is `502 upstream-unreachable` with the claim
//! released.

use crate::support;

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use idemgate::config::Config;
use support::Proxy;
use support::pki::Pki;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .expect("read certs")
        .collect::<Result<_, _>>()
        .expect("certs")
}

/// A TLS upstream on 127.0.0.1:0 answering every request `201` with its number;
/// stopped on drop.
struct TlsUpstream {
    port: u16,
    count: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TlsUpstream {
    async fn start(pki: &Pki, require_client_cert: bool) -> TlsUpstream {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("versions");
        let builder = if require_client_cert {
            let mut roots = RootCertStore::empty();
            for cert in certs(&pki.dir.join("ca.pem")) {
                roots.add(cert).expect("ca");
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::from_pem_file(pki.dir.join("server.key")).expect("server key");
        let config = builder
            .with_single_cert(certs(&pki.dir.join("server.pem")), key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let count = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&count);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, count) = (acceptor.clone(), Arc::clone(&counted));
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |_req| {
                        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                        async move {
                            let mut response = http::Response::new(Full::new(Bytes::from(
                                format!("{{\"n\":{n}}}"),
                            )));
                            *response.status_mut() = http::StatusCode::CREATED;
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        TlsUpstream { port, count, task }
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection.
        self.task.abort();
    }
}

fn config(yaml: &str) -> Result<Config, String> {
    Config::from_yaml_str(yaml, &|_| None).map_err(|err| err.to_string())
}

#[tokio::test]
async fn a_guarded_post_over_https_with_ca_file_is_executed_once_and_replayed() {
    let pki = Pki::new("ca");
    let up = TlsUpstream::start(&pki, false).await;
    for host in ["127.0.0.1", "localhost"] {
        let yaml = format!(
            "upstream:\n  url: https://{host}:{}\n  tls:\n    ca_file: {}\n",
            up.port,
            pki.path("ca.pem")
        );
        let proxy = Proxy::with_config(config(&yaml).expect("valid")).await;
        let c = proxy.client();
        let key = format!("k-{host}");
        let first = c.post("/charges", &key, "{}").await;
        assert_eq!(first.status, 201, "{}", first.text());
        let retry = c.post("/charges", &key, "{}").await;
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert!(retry.replayed());
        assert_eq!(retry.body, first.body);
        proxy.stop().await;
    }
    assert_eq!(up.count(), 2, "one execution per host");
}

#[tokio::test]
async fn an_unknown_issuer_is_upstream_unreachable_and_nothing_is_stored() {
    let pki = Pki::new("unknown");
    let up = TlsUpstream::start(&pki, false).await;
    let yaml = format!("upstream:\n  url: https://127.0.0.1:{}\n", up.port);
    let proxy = Proxy::with_config(config(&yaml).expect("valid")).await;
    let c = proxy.client();
    for _ in 0..2 {
        // The claim was released: the retry is not in flight, nor replayed.
        let r = c.post("/charges", "k", "{}").await;
        assert_eq!(r.status, 502, "{}", r.text());
        assert_eq!(r.problem(), "upstream-unreachable");
        assert!(!r.replayed());
    }
    assert_eq!(up.count(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn mutual_tls_presents_the_client_certificate() {
    let pki = Pki::new("mtls");
    let up = TlsUpstream::start(&pki, true).await;
    let with_cert = format!(
        "upstream:\n  url: https://127.0.0.1:{}\n  tls:\n    ca_file: {}\n    cert_file: {}\n    key_file: {}\n",
        up.port,
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let proxy = Proxy::with_config(config(&with_cert).expect("valid")).await;
    let r = proxy.client().post("/charges", "m1", "{}").await;
    assert_eq!(r.status, 201, "{}", r.text());
    proxy.stop().await;
    assert_eq!(up.count(), 1);

    let without = format!(
        "upstream:\n  url: https://127.0.0.1:{}\n  tls:\n    ca_file: {}\n",
        up.port,
        pki.path("ca.pem"),
    );
    let proxy = Proxy::with_config(config(&without).expect("valid")).await;
    // Under TLS 1.3 the refusal arrives as an alert after the request was written into
    // the connection; it never reached the server's application, so the claim is
    // released and the retry is refused the same way.
    for _ in 0..2 {
        let r = proxy.client().post("/charges", "m2", "{}").await;
        assert_eq!(r.status, 502, "{}", r.text());
        assert_eq!(r.problem(), "upstream-unreachable");
    }
    proxy.stop().await;
    assert_eq!(up.count(), 1);
}

#[test]
fn tls_config_errors_name_their_field() {
    let pki = Pki::new("config");
    let ca = pki.path("ca.pem");
    let cases = [
        (
            format!("upstream:\n  url: http://127.0.0.1:9000\n  tls:\n    ca_file: {ca}\n"),
            "upstream.tls: ",
        ),
        (
            "upstream:\n  url: https://127.0.0.1\n  tls:\n    ca_file: /nonexistent/ca.pem\n"
                .to_owned(),
            "upstream.tls.ca_file: ",
        ),
        (
            format!(
                "upstream:\n  url: https://127.0.0.1\n  tls:\n    ca_file: {}\n",
                pki.path("server.ext")
            ),
            "upstream.tls.ca_file: ",
        ),
        (
            format!(
                "upstream:\n  url: https://127.0.0.1\n  tls:\n    cert_file: {}\n",
                pki.path("client.pem")
            ),
            "upstream.tls.key_file: ",
        ),
        (
            format!(
                "upstream:\n  url: https://127.0.0.1\n  tls:\n    key_file: {}\n",
                pki.path("client.key")
            ),
            "upstream.tls.cert_file: ",
        ),
        (
            format!(
                "upstream:\n  url: https://127.0.0.1\n  tls:\n    cert_file: {}\n    key_file: {}\n",
                pki.path("client.pem"),
                pki.path("ca.pem")
            ),
            "upstream.tls.key_file: ",
        ),
    ];
    for (yaml, field) in cases {
        let message = config(&yaml).expect_err(&yaml);
        assert!(message.starts_with(field), "{yaml}\n=> {message}");
    }
}

/// `--check` prints the three paths, and what it prints loads back to the same
/// configuration.
#[test]
fn check_prints_the_tls_paths_and_round_trips() {
    let pki = Pki::new("check");
    let yaml = format!(
        "upstream:\n  url: https://localhost\n  tls:\n    ca_file: {}\n    cert_file: {}\n    key_file: {}\n",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let loaded = config(&yaml).expect("valid");
    let printed = loaded.to_yaml();
    for name in ["ca.pem", "client.pem", "client.key", "https://localhost"] {
        assert!(printed.contains(name), "{name} missing from\n{printed}");
    }
    assert_eq!(config(&printed).expect("printed config loads"), loaded);
}

/// An upgrade passes through over `https://` as over `http://` (docs/behaviour.md §11):
/// after `101` the client connection is joined to the TLS connection byte for byte.
#[tokio::test]
async fn an_upgrade_is_joined_over_https() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn read_head<R: tokio::io::AsyncRead + Unpin>(stream: &mut R) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut byte))
                .await
            {
                Ok(Ok(1)) => head.push(byte[0]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    let pki = Pki::new("upgrade");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = PrivateKeyDer::from_pem_file(pki.dir.join("server.key")).expect("server key");
    let server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs(&pki.dir.join("server.pem")), key)
        .expect("server config");
    let acceptor = TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let echo = tokio::spawn(async move {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let Ok(mut tls) = acceptor.accept(tcp).await else {
            return;
        };
        let head = read_head(&mut tls).await.to_ascii_lowercase();
        assert!(head.contains("upgrade: websocket"), "{head}");
        // idemgate does not terminate TLS: the client spoke http to it.
        assert!(head.contains("x-forwarded-proto: http\r\n"), "{head}");
        let _ = tls
            .write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
            .await;
        let (mut read, mut write) = tokio::io::split(tls);
        let _ = tokio::io::copy(&mut read, &mut write).await;
    });

    let yaml = format!(
        "upstream:\n  url: https://localhost:{port}\n  tls:\n    ca_file: {}\n",
        pki.path("ca.pem")
    );
    let proxy = Proxy::with_config(config(&yaml).expect("valid")).await;
    let mut client = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    client
        .write_all(
            b"GET /ws HTTP/1.1\r\nhost: t\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n",
        )
        .await
        .expect("write");
    let answer = read_head(&mut client).await.to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 101"), "{answer}");
    client.write_all(b"ping \x00\xff").await.expect("write");
    let mut echoed = [0u8; 7];
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.read_exact(&mut echoed),
    )
    .await
    .expect("echoed in time")
    .expect("read");
    assert_eq!(&echoed, b"ping \x00\xff");
    drop(client);
    proxy.stop().await;
    echo.abort();
}
