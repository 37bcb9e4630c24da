//! A real Flask upstream (`tests/real/flask_app.py`, Debian's python3-flask), one per
//! test: it checks HTTP Basic and Bearer credentials itself (`alice:secret`,
//! `Bearer alice-token`; anything else is 401 with `WWW-Authenticate`), counts the
//! executions per `Idempotency-Key` and user, and reports what it received on
//! `GET /_seen`, which the test asks directly, not through idemgate.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::TestClient;
use super::real_process::RealProcess;

/// The system Python, which Debian's python3-flask is installed for (another `python3`
/// may come first on PATH).
pub const PYTHON: &str = "/usr/bin/python3";

/// `Authorization` for HTTP Basic `user:password`.
pub fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", STANDARD.encode(format!("{user}:{password}")))
}

pub struct Flask {
    process: RealProcess,
}

/// One request as Flask received it.
#[derive(Debug, Clone, Deserialize)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Names lower-cased, values as they arrived (an empty one stays empty).
    pub headers: Vec<(String, String)>,
}

impl Received {
    /// The values of every header named `name` (lower case).
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// What Flask has seen so far.
#[derive(Debug, Clone, Deserialize)]
pub struct Seen {
    /// Every request but `/_seen`, in arrival order.
    pub received: Vec<Received>,
    /// `"KEY USER"` -> how many times that user's request with that key executed.
    executions: HashMap<String, u64>,
}

impl Seen {
    /// How many times `user`'s request with idempotency key `key` executed.
    pub fn executions(&self, key: &str, user: &str) -> u64 {
        self.executions
            .get(&format!("{key} {user}"))
            .copied()
            .unwrap_or(0)
    }

    /// The requests that carried idempotency key `key`, authorized or not.
    pub fn with_key(&self, key: &str) -> Vec<&Received> {
        self.received
            .iter()
            .filter(|r| r.header("idempotency-key") == [key])
            .collect()
    }
}

impl Flask {
    pub async fn start() -> Flask {
        assert!(
            Path::new(PYTHON).exists(),
            "{PYTHON} missing: scripts/test.sh installs python3-flask"
        );
        let app = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/real/flask_app.py");
        let process = RealProcess::start("flask", |port| {
            let mut cmd = Command::new(PYTHON);
            cmd.arg(app).arg(port.to_string());
            // Unbuffered, so the output reads in order with what the test sees.
            cmd.env("PYTHONUNBUFFERED", "1");
            cmd
        })
        .await;
        Flask { process }
    }

    pub fn url(&self) -> String {
        self.process.url()
    }

    pub fn addr(&self) -> SocketAddr {
        self.process.addr
    }

    /// Flask's own account of what reached it.
    pub async fn seen(&self) -> Seen {
        let answer = TestClient::new(self.process.addr)
            .send("GET", "/_seen", &[], "")
            .await;
        assert_eq!(answer.status, 200, "{}", self.process.output());
        serde_json::from_slice(&answer.body).unwrap_or_else(|e| {
            panic!(
                "/_seen is not what flask_app.py writes ({e}): {}",
                answer.text()
            )
        })
    }

    /// Its stdout and stderr, for failure messages.
    pub fn output(&self) -> String {
        self.process.output()
    }
}
