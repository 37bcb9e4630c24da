//! The `idemgate` binary as a child process, for black-box tests of the command line.
//!
//! Every child is killed when its handle is dropped (and `kill_on_drop` backs that up),
//! so a failing assertion never leaves a proxy running. Config files go under the temp
//! dir with names unique to this process and are removed on drop.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// The binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

/// Upper bound for anything a child should do promptly: start, answer, exit.
pub const LIMIT: Duration = Duration::from_secs(10);

/// Pause between readiness probes; the only sleep here, and it never decides an outcome.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// One connection attempt. A listener that stopped accepting but is still open lets
/// connects hang once its backlog is full; bounding each keeps the deadline honest.
const CONNECT_LIMIT: Duration = Duration::from_millis(500);

/// `Some(result)` of one connection attempt, `None` if it hung past [`CONNECT_LIMIT`].
async fn try_connect(addr: SocketAddr) -> Option<std::io::Result<TcpStream>> {
    tokio::time::timeout(CONNECT_LIMIT, TcpStream::connect(addr))
        .await
        .ok()
}

/// A command for the binary, isolated from the caller's `IDEMGATE_CONFIG` and `RUST_LOG`.
pub fn idemgate() -> Command {
    isolated(Command::new(BIN))
}

/// The binary, started by a shell that ignores `SIGXFSZ` first (an ignored signal stays
/// ignored across `exec`): a write past a file-size limit (`prlimit --fsize`) then
/// fails with `EFBIG` instead of killing the process, as a write to a full disk fails.
pub fn idemgate_ignoring_sigxfsz() -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "trap '' XFSZ; exec \"$0\" \"$@\"", BIN]);
    isolated(cmd)
}

fn isolated(mut cmd: Command) -> Command {
    cmd.env_remove("IDEMGATE_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// How a run to completion ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Runs `cmd` to completion. A child still running after [`LIMIT`] (say, a `--check`
/// that started serving) fails the test and is killed.
/// `idemgate WORDS --admin http://ADMIN ARGS...`, the admin CLI (docs/behaviour.md §18,
/// §24) against a running proxy's admin listener, with `token` as
/// `IDEMGATE_ADMIN_TOKEN` (none at all when `None`).
pub async fn admin_cli(
    words: &[&str],
    admin: SocketAddr,
    token: Option<&str>,
    args: &[&str],
) -> Finished {
    let mut cmd = idemgate();
    cmd.env_remove("IDEMGATE_ADMIN_TOKEN");
    if let Some(token) = token {
        cmd.env("IDEMGATE_ADMIN_TOKEN", token);
    }
    run(cmd
        .args(words)
        .arg("--admin")
        .arg(format!("http://{admin}"))
        .args(args))
    .await
}

pub async fn run(cmd: &mut Command) -> Finished {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idemgate");
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("idemgate still running after {LIMIT:?}"))
        .expect("wait for idemgate");
    Finished {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A YAML file under the temp dir, removed on drop.
#[derive(Debug)]
pub struct TempConfig {
    pub path: PathBuf,
}

impl TempConfig {
    pub fn new(yaml: &str) -> TempConfig {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "idemgate-test-{}-{}.yaml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, yaml).expect("write the temp config");
        TempConfig { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A port that was free a moment ago. Someone may take it before the child binds it,
/// which [`Running::start`] detects and retries.
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A serving `idemgate` child.
#[derive(Debug)]
pub struct Running {
    pub addr: SocketAddr,
    child: Child,
    stderr: Arc<Mutex<Vec<u8>>>,
    drain: Option<JoinHandle<()>>,
}

impl Running {
    /// Starts `idemgate ARGS --listen 127.0.0.1:PORT` on a free port and returns once it
    /// accepts connections. If the port was taken in the meantime, tries another.
    pub async fn start(args: &[&str]) -> Running {
        Self::start_with_env(args, &[]).await
    }

    /// [`Running::start`] with extra environment variables (e.g. a crash point).
    pub async fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Running {
        Self::start_command(idemgate, args, env).await
    }

    /// [`Running::start_with_env`], the binary started by `command` (e.g.
    /// [`idemgate_ignoring_sigxfsz`]).
    pub async fn start_command(
        command: fn() -> Command,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Running {
        const ATTEMPTS: usize = 5;
        for _ in 0..ATTEMPTS {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let mut cmd = command();
            cmd.envs(env.iter().copied())
                .args(args)
                .arg("--listen")
                .arg(addr.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = cmd.spawn().expect("spawn idemgate");
            // Drained all along, so a chatty child never blocks on a full pipe.
            let stderr = Arc::new(Mutex::new(Vec::new()));
            let mut pipe = child.stderr.take().expect("stderr is piped");
            let sink = Arc::clone(&stderr);
            let drain = tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                    sink.lock().expect("lock").extend_from_slice(&buf[..n]);
                }
            });
            let mut running = Running {
                addr,
                child,
                stderr,
                drain: Some(drain),
            };
            match running.wait_accepting().await {
                Ok(()) => return running,
                Err(status) => {
                    let log = running.stderr_to_end().await;
                    assert!(
                        log.contains("cannot listen on"),
                        "idemgate exited ({status}) before accepting connections:\n{log}"
                    );
                }
            }
        }
        panic!("no free port for idemgate after {ATTEMPTS} attempts");
    }

    /// Polls until the listener accepts a connection (`Ok`) or the child exits (`Err`).
    async fn wait_accepting(&mut self) -> Result<(), ExitStatus> {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Err(status);
            }
            if let Some(Ok(_)) = try_connect(self.addr).await {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "idemgate not accepting on {} after {LIMIT:?}:\n{}",
                self.addr,
                self.stderr()
            );
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// Polls until connections to the listener are refused: the sign that a shutdown
    /// signal was handled, since the listener closes at once (docs/behaviour.md §8,
    /// Shutdown).
    pub async fn wait_refusing(&self) {
        let deadline = Instant::now() + LIMIT;
        loop {
            match try_connect(self.addr).await {
                Some(Err(err)) if err.kind() == std::io::ErrorKind::ConnectionRefused => return,
                // Accepted into the backlog just as the listener closed: look again.
                Some(Err(err)) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
                Some(Err(err)) => panic!("connecting to {}: {err}", self.addr),
                Some(Ok(_)) | None => {}
            }
            assert!(
                Instant::now() < deadline,
                "idemgate still accepting on {} {LIMIT:?} after the signal:\n{}",
                self.addr,
                self.stderr()
            );
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// Sends SIGTERM, as an orchestrator stopping the container would.
    pub async fn terminate(&mut self) {
        // Only signal a child we have not reaped, so its pid cannot have been reused.
        assert!(
            self.child.try_wait().expect("try_wait").is_none(),
            "idemgate exited before SIGTERM:\n{}",
            self.stderr()
        );
        let pid = self.child.id().expect("a running child has a pid");
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid} failed: {status}");
    }

    /// Sends a signal (`HUP`, ...) to the running child.
    pub async fn signal(&mut self, name: &str) {
        assert!(
            self.child.try_wait().expect("try_wait").is_none(),
            "idemgate exited before SIG{name}:\n{}",
            self.stderr()
        );
        let pid = self.child.id().expect("a running child has a pid");
        let status = Command::new("kill")
            .args([&format!("-{name}"), &pid.to_string()])
            .status()
            .await
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid} failed: {status}");
    }

    /// Waits (at most [`LIMIT`]) for the child to exit, then for the rest of its stderr:
    /// its last lines may still be in the pipe when it has been reaped.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let status = match tokio::time::timeout(LIMIT, self.child.wait()).await {
            Ok(status) => status.expect("wait for idemgate"),
            Err(_) => panic!(
                "idemgate still running {LIMIT:?} after the signal:\n{}",
                self.stderr()
            ),
        };
        self.stderr_to_end().await;
        status
    }

    /// SIGKILL: a crash, nothing is finished or recorded.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("a running child has a pid")
    }

    pub fn has_exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    /// What the child wrote to stderr so far (its logs).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("lock")).into_owned()
    }

    /// All of stderr, once the child has exited and the pipe has closed.
    async fn stderr_to_end(&mut self) -> String {
        if let Some(drain) = self.drain.take() {
            let _ = tokio::time::timeout(LIMIT, drain).await;
        }
        self.stderr()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // SIGKILL: a test that got here early has failed, and nothing is left to observe.
        let _ = self.child.start_kill();
        if let Some(drain) = self.drain.take() {
            drain.abort();
        }
    }
}
