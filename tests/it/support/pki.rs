//! A throwaway PKI for the tests that need TLS (HTTPS upstreams, `rediss://`, a JWKS
//! over HTTPS): made with the `openssl` command, as a private PKI would be.

use std::path::PathBuf;

/// A throwaway PKI in a temp dir, removed on drop: a CA, a server certificate for
/// 127.0.0.1 and localhost, and a client certificate, all signed by the CA.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("idemgate-pki-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write ext");
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("write ext");
        let d = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let mut commands: Vec<Vec<String>> = vec![
            [
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=idemgate-test-ca",
                "-keyout",
                &d("ca.key"),
                "-out",
                &d("ca.pem"),
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for (who, cn) in [("server", "127.0.0.1"), ("client", "idemgate-client")] {
            commands.push(
                [
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-subj",
                    &format!("/CN={cn}"),
                    "-keyout",
                    &d(&format!("{who}.key")),
                    "-out",
                    &d(&format!("{who}.csr")),
                ]
                .map(str::to_owned)
                .to_vec(),
            );
            commands.push(
                [
                    "x509",
                    "-req",
                    "-in",
                    &d(&format!("{who}.csr")),
                    "-CA",
                    &d("ca.pem"),
                    "-CAkey",
                    &d("ca.key"),
                    "-CAcreateserial",
                    "-days",
                    "1",
                    "-out",
                    &d(&format!("{who}.pem")),
                    "-extfile",
                    &d(&format!("{who}.ext")),
                ]
                .map(str::to_owned)
                .to_vec(),
            );
        }
        for args in commands {
            let made = std::process::Command::new("openssl")
                .args(&args)
                .output()
                .expect("openssl is installed");
            assert!(
                made.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&made.stderr)
            );
        }
        Pki { dir }
    }

    /// `ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key` (and the
    /// `.ext` files they were made with), as paths.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
