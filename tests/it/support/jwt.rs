//! Real signing keys and tokens for the `scope_principal` tests (RSA 2048 made with the
//! `openssl` command, P-256 and Ed25519 with ring), and an HTTPS server that is both an identity
//! provider (its JWKS at `/jwks.json`, which a test can rotate or break) and a counting
//! upstream, with a throwaway CA: `upstream.tls.ca_file` trusts it for both.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

/// A temp dir for keys and certificates, removed on drop.
pub struct Dir(PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "idemgate-jwt-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        Dir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `openssl ARGS`, failing the test with its stderr if it fails; returns stdout.
fn openssl(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A key pair: what signs tokens, and its public JWK.
pub struct SigningKey {
    pub kid: String,
    pub alg: Algorithm,
    encoding: EncodingKey,
    pub jwk: Value,
    /// The public key's bytes (PEM for RSA), for the algorithm-confusion test.
    pub public_pem: Vec<u8>,
}

impl SigningKey {
    pub fn rsa(dir: &Dir, kid: &str) -> SigningKey {
        let (pem, der) = (
            dir.arg(&format!("{kid}.pem")),
            dir.arg(&format!("{kid}.der")),
        );
        openssl(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            &pem,
        ]);
        // PKCS#1, as ring signs with.
        openssl(&[
            "rsa",
            "-in",
            &pem,
            "-traditional",
            "-outform",
            "DER",
            "-out",
            &der,
        ]);
        let modulus =
            String::from_utf8(openssl(&["rsa", "-in", &pem, "-noout", "-modulus"])).expect("text");
        let hex = modulus.trim().trim_start_matches("Modulus=");
        let n: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        SigningKey {
            kid: kid.to_owned(),
            alg: Algorithm::RS256,
            encoding: EncodingKey::from_rsa_der(&std::fs::read(&der).expect("der")),
            jwk: json!({"kty": "RSA", "kid": kid, "use": "sig", "n": b64(&n), "e": "AQAB"}),
            public_pem: openssl(&["pkey", "-in", &pem, "-pubout"]),
        }
    }

    pub fn ec(kid: &str) -> SigningKey {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING as P256, EcdsaKeyPair, KeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&P256, &rng).expect("generate");
        let pair = EcdsaKeyPair::from_pkcs8(&P256, pkcs8.as_ref(), &rng).expect("pair");
        // The uncompressed point: 0x04, x, y.
        let point = pair.public_key().as_ref();
        SigningKey {
            kid: kid.to_owned(),
            alg: Algorithm::ES256,
            encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({"kty": "EC", "kid": kid, "crv": "P-256",
                        "x": b64(&point[1..33]), "y": b64(&point[33..])}),
            public_pem: point.to_vec(),
        }
    }

    pub fn ed25519(kid: &str) -> SigningKey {
        use ring::signature::{Ed25519KeyPair, KeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("generate");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("pair");
        let public = pair.public_key().as_ref();
        SigningKey {
            kid: kid.to_owned(),
            alg: Algorithm::EdDSA,
            encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(public)}),
            public_pem: public.to_vec(),
        }
    }

    /// A token over `claims`, its header naming this key.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }

    /// A token signed by this key whose header names `kid` (another key's, to lie).
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign")
    }
}

/// A JWK set of these keys.
pub fn jwks(keys: &[&SigningKey]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

/// Seconds since the epoch, `offset` from now.
pub fn epoch(offset: i64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    i64::try_from(now).expect("time") + offset
}

/// Claims of a token for `sub` from `iss`, valid for an hour; `iat` makes each one new,
/// as a refresh does.
pub fn claims(iss: &str, sub: &str, iat: i64) -> Value {
    json!({"iss": iss, "sub": sub, "aud": "payments", "iat": iat, "exp": epoch(3600)})
}

/// What the server answers at `/jwks.json`.
struct Published {
    /// `None`: `500`, as an identity provider in trouble.
    body: Option<String>,
    reads: usize,
}

/// An HTTPS identity provider and upstream on 127.0.0.1:0: `GET /jwks.json` answers the
/// published key set; every other request is executed, counted, and answered `201`
/// with its number. Stopped on drop.
pub struct IdpUpstream {
    pub port: u16,
    executed: Arc<AtomicUsize>,
    published: Arc<Mutex<Published>>,
    task: JoinHandle<()>,
}

impl IdpUpstream {
    /// Serves with the certificate and key at `cert` and `key` (PEM files, e.g. of
    /// `support::pki::Pki`).
    pub async fn start(cert: &str, key: &str, jwks: String) -> IdpUpstream {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("certs")
            .collect::<Result<_, _>>()
            .expect("certs");
        let key = PrivateKeyDer::from_pem_file(key).expect("key");
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let executed = Arc::new(AtomicUsize::new(0));
        let published = Arc::new(Mutex::new(Published {
            body: Some(jwks),
            reads: 0,
        }));
        let (count, keys) = (Arc::clone(&executed), Arc::clone(&published));
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, count, keys) =
                    (acceptor.clone(), Arc::clone(&count), Arc::clone(&keys));
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let answer = if req.uri().path() == "/jwks.json" {
                            let mut keys = keys.lock().expect("lock");
                            keys.reads += 1;
                            match &keys.body {
                                Some(body) => (http::StatusCode::OK, body.clone()),
                                None => (http::StatusCode::INTERNAL_SERVER_ERROR, String::new()),
                            }
                        } else {
                            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                            (http::StatusCode::CREATED, format!("{{\"n\":{n}}}"))
                        };
                        async move {
                            let mut response =
                                http::Response::new(Full::new(Bytes::from(answer.1)));
                            *response.status_mut() = answer.0;
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        IdpUpstream {
            port,
            executed,
            published,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn executed(&self) -> usize {
        self.executed.load(Ordering::SeqCst)
    }

    /// How many times the key set was read.
    pub fn reads(&self) -> usize {
        self.published.lock().expect("lock").reads
    }

    /// Publishes another key set, or (`None`) answers `500` from now on.
    pub fn publish(&self, jwks: Option<String>) {
        self.published.lock().expect("lock").body = jwks;
    }
}

impl Drop for IdpUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A plain-HTTP identity provider on 127.0.0.1:0 that answers its first read of the key
/// set (idemgate's read at start), then accepts every later request, reads it, and never
/// answers: an identity provider that hangs. Counts connections and requests; stopped
/// (every held connection closed) on drop.
pub struct HangingIdp {
    pub port: u16,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    /// Told each time a request is read and held.
    pub held: Arc<tokio::sync::Notify>,
    task: JoinHandle<()>,
}

impl HangingIdp {
    pub async fn start(jwks: String) -> HangingIdp {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(tokio::sync::Notify::new());
        let (conns, reqs, told) = (
            Arc::clone(&connections),
            Arc::clone(&requests),
            Arc::clone(&held),
        );
        let task = tokio::spawn(async move {
            let mut open = tokio::task::JoinSet::new();
            while let Ok((mut tcp, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::SeqCst);
                let (reqs, told, jwks) = (Arc::clone(&reqs), Arc::clone(&told), jwks.clone());
                open.spawn(async move {
                    // The request head, whole (a GET has no body).
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tcp.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    if reqs.fetch_add(1, Ordering::SeqCst) == 0 {
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\nconnection: close\r\n\r\n{jwks}",
                            jwks.len()
                        );
                        let _ = tcp.write_all(answer.as_bytes()).await;
                        return;
                    }
                    told.notify_one();
                    // Held open, unanswered, until the client gives up or the test ends.
                    while let Ok(1..) = tcp.read(&mut buf).await {}
                });
            }
        });
        HangingIdp {
            port,
            connections,
            requests,
            held,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/jwks.json", self.port)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for HangingIdp {
    fn drop(&mut self) {
        self.task.abort();
    }
}
