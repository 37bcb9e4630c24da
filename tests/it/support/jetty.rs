//! A real embedded Jetty upstream (`tests/real/JettyLog.java`, Debian's libjetty9-java),
//! one per test: it logs the request line of every request that reaches it (method and
//! target, including requests Jetty then refuses on its own) and answers 200. The source
//! is compiled with javac into `target/tmp/jetty-log-<hash of the source>/` the first
//! time a test needs it, so an edited source is compiled again.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use super::real_process::RealProcess;

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/real/JettyLog.java");

/// What the program needs of Debian's libjetty9-java (and libservlet-api-java).
const JARS: &[&str] = &[
    "/usr/share/java/jetty9-server.jar",
    "/usr/share/java/jetty9-http.jar",
    "/usr/share/java/jetty9-io.jar",
    "/usr/share/java/jetty9-util.jar",
    "/usr/share/java/servlet-api.jar",
];

/// The prefix of a request line in the program's stdout.
const REQUEST: &str = "REQUEST ";

pub struct Jetty {
    process: RealProcess,
}

impl Jetty {
    pub async fn start() -> Jetty {
        for jar in JARS {
            assert!(
                Path::new(jar).exists(),
                "{jar} missing: scripts/test.sh installs libjetty9-java"
            );
        }
        let classes = compiled();
        let classpath = format!("{}:{}", classes.display(), JARS.join(":"));
        let process = RealProcess::start("jetty", |port| {
            let mut cmd = Command::new("java");
            // A quick start matters more here than peak speed.
            cmd.args(["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp"])
                .arg(&classpath)
                .arg("JettyLog")
                .arg(port.to_string());
            cmd
        })
        .await;
        Jetty { process }
    }

    pub fn url(&self) -> String {
        self.process.url()
    }

    pub fn addr(&self) -> SocketAddr {
        self.process.addr
    }

    /// The request lines logged so far (`"GET /x"`, `"CONNECT host:443"`), in order.
    pub fn requests(&self) -> Vec<String> {
        self.process
            .stdout()
            .lines()
            .filter_map(|l| l.strip_prefix(REQUEST))
            .map(str::to_owned)
            .collect()
    }

    /// Resolves once `line` has been logged; fails the test after a while.
    pub async fn wait_for(&self, line: &str) {
        let wanted = format!("{REQUEST}{line}");
        self.process
            .wait_stdout(&format!("request {line:?}"), |out| {
                out.lines().any(|l| l == wanted)
            })
            .await;
    }

    /// Its stdout and stderr, for failure messages.
    pub fn output(&self) -> String {
        self.process.output()
    }
}

/// The directory holding `JettyLog.class` compiled from the current source, compiling it
/// if no test has yet. Tests run as parallel processes: each compiles into a directory of
/// its own and renames it into place, so a reader never sees a half-written class.
fn compiled() -> PathBuf {
    let source = std::fs::read(SOURCE).unwrap_or_else(|e| panic!("read {SOURCE}: {e}"));
    let hash = Sha256::digest(&source);
    let short: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.join(format!("jetty-log-{short}"));
    if dir.join("JettyLog.class").exists() {
        return dir;
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let work = tmp.join(format!(
        "jetty-log-{short}.{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&work).unwrap_or_else(|e| panic!("create {}: {e}", work.display()));
    let out = Command::new("javac")
        .args(["-nowarn", "-cp", &JARS.join(":"), "-d"])
        .arg(&work)
        .arg(SOURCE)
        .output()
        .unwrap_or_else(|e| {
            panic!("run javac (scripts/test.sh installs default-jdk-headless): {e}")
        });
    assert!(
        out.status.success(),
        "javac {SOURCE}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Another test may have won the race: its classes are the same.
    if std::fs::rename(&work, &dir).is_err() {
        assert!(
            dir.join("JettyLog.class").exists(),
            "could not move {} to {}",
            work.display(),
            dir.display()
        );
        let _ = std::fs::remove_dir_all(&work);
    }
    dir
}
