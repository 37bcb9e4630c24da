//! TLS to PostgreSQL as the URL's `sslmode` asks (docs/behaviour.md §22), against a
//! real server with a certificate of a throwaway CA for IP 127.0.0.1: what each mode
//! accepts and refuses, and that the session really is encrypted.

use crate::support;

use idemgate::store::PostgresStore;
use support::pki::Pki;
use support::postgres::PgServer;
use support::{Proxy, Upstream};

/// A server listening on 127.0.0.1 and 127.0.0.2, TLS on with the PKI's server
/// certificate (whose only address is 127.0.0.1).
async fn tls_server(pki: &Pki) -> PgServer {
    let server = PgServer::builder()
        .conf("listen_addresses = '127.0.0.1,127.0.0.2'")
        .start()
        .await;
    let data = server.data_dir();
    for (from, to) in [("server.pem", "tls.crt"), ("server.key", "tls.key")] {
        let target = data.join(to);
        std::fs::copy(pki.path(from), &target).expect("copy into the data dir");
        // The server runs as the data dir's owner and refuses a key others can read.
        let owner = std::process::Command::new("stat")
            .args(["-c", "%U"])
            .arg(&data)
            .output()
            .expect("stat");
        let owner = String::from_utf8_lossy(&owner.stdout).trim().to_owned();
        let chown = std::process::Command::new("chown")
            .arg(&owner)
            .arg(&target)
            .status()
            .expect("chown");
        assert!(chown.success());
        let chmod = std::process::Command::new("chmod")
            .arg("600")
            .arg(&target)
            .status()
            .expect("chmod");
        assert!(chmod.success());
    }
    server.psql("ALTER SYSTEM SET ssl_cert_file = 'tls.crt'");
    server.psql("ALTER SYSTEM SET ssl_key_file = 'tls.key'");
    server.psql("ALTER SYSTEM SET ssl = on");
    server.psql("SELECT pg_reload_conf()");
    server.wait_for("SHOW ssl", "on").await;
    server
}

/// A proxy whose store URL is the server's at `host` with `query`, and `ca_file` when
/// given; the status of one fresh key through it, and the proxy (whose pool holds its
/// session open while the test looks at it).
async fn through(
    server: &PgServer,
    host: &str,
    query: &str,
    ca: Option<&str>,
) -> (u16, Proxy<PostgresStore>, Upstream) {
    let up = Upstream::start().await;
    let url = format!(
        "postgres://postgres@{host}:{}/postgres?{query}",
        server.port
    );
    let tls = ca.map_or(String::new(), |ca| format!("  tls: {{ca_file: {ca}}}\n"));
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: postgres\n  url: {url}\n  timeout: 2s\n{tls}"
    );
    let config =
        idemgate::config::Config::from_yaml_str(&yaml.replace("{upstream}", &up.url()), &|_| None)
            .expect("config");
    let store = std::sync::Arc::new(PostgresStore::new(&config.store).expect("store"));
    // A refused handshake is not a table error: start-up goes on, requests get 503.
    store.start().await.expect("no table error");
    let proxy = Proxy::with_store(config, store).await;
    let key = format!("{host}-{query}-{}", ca.is_some());
    let status = proxy
        .client()
        .post("/charges", &key, "{}")
        .await
        .status
        .as_u16();
    (status, proxy, up)
}

async fn status_through(server: &PgServer, host: &str, query: &str, ca: Option<&str>) -> u16 {
    through(server, host, query, ca).await.0
}

/// The sessions of application `idemgate` and whether each is encrypted.
fn encrypted_sessions(server: &PgServer) -> String {
    server.psql(
        "SELECT string_agg(DISTINCT s.ssl::text, ',') FROM pg_stat_ssl s \
         JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'idemgate'",
    )
}

#[tokio::test]
async fn each_sslmode_checks_what_libpq_checks() {
    let pki = Pki::new("postgres-tls");
    let server = tls_server(&pki).await;
    let ca = pki.path("ca.pem");

    // verify-full: the chain and the address.
    let (status, _proxy, _up) =
        through(&server, "127.0.0.1", "sslmode=verify-full", Some(&ca)).await;
    assert_eq!(status, 201);
    assert_eq!(encrypted_sessions(&server), "true");
    assert_eq!(
        status_through(&server, "127.0.0.2", "sslmode=verify-full", Some(&ca)).await,
        503,
        "the certificate is not 127.0.0.2's"
    );
    assert_eq!(
        status_through(&server, "127.0.0.1", "sslmode=verify-full", None).await,
        503,
        "the throwaway CA is not among the system's roots"
    );
    // verify-ca: the chain, whatever the address.
    assert_eq!(
        status_through(&server, "127.0.0.2", "sslmode=verify-ca", Some(&ca)).await,
        201
    );
    assert_eq!(
        status_through(&server, "127.0.0.1", "sslmode=verify-ca", None).await,
        503
    );
    // require: encrypted; the certificate unchecked without a CA file.
    assert_eq!(
        status_through(&server, "127.0.0.2", "sslmode=require", None).await,
        201
    );
}

#[tokio::test]
async fn require_refuses_a_server_without_tls_and_disable_stays_plain() {
    let server = PgServer::start().await;
    assert_eq!(
        status_through(&server, "127.0.0.1", "sslmode=require", None).await,
        503
    );
    assert_eq!(
        status_through(&server, "127.0.0.1", "sslmode=prefer", None).await,
        201,
        "prefer falls back to plain text"
    );
    let (status, _proxy, _up) = through(&server, "127.0.0.1", "sslmode=disable", None).await;
    assert_eq!(status, 201);
    assert_eq!(encrypted_sessions(&server), "false");
}
