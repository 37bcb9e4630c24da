//! A real server of another make (Flask, Jetty) as a child process on a free port of
//! 127.0.0.1: started, polled until it accepts connections, its output kept for the test
//! to read, and killed and reaped when the handle is dropped.

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::bin::free_port;

/// Upper bound for a server to start accepting connections (a JVM on a busy machine).
pub const START_LIMIT: Duration = Duration::from_secs(30);

/// Upper bound for a line the test expects to appear in the server's output.
pub const LINE_LIMIT: Duration = Duration::from_secs(10);

/// Pause between readiness probes; it never decides an outcome.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// What the child wrote, and a wake-up for every new chunk.
#[derive(Default)]
struct Output {
    stdout: Mutex<Vec<u8>>,
    stderr: Mutex<Vec<u8>>,
    grew: Notify,
}

/// A running server process.
pub struct RealProcess {
    pub addr: SocketAddr,
    name: &'static str,
    child: Child,
    output: Arc<Output>,
    drains: Vec<JoinHandle<()>>,
}

impl RealProcess {
    /// Runs `command(port)` on free ports until one start accepts connections. A start
    /// that exits first because its port was taken meanwhile (its output says `in use`)
    /// tries another port; any other exit fails the test with the child's output.
    pub async fn start(name: &'static str, command: impl Fn(u16) -> Command) -> RealProcess {
        const ATTEMPTS: usize = 5;
        for _ in 0..ATTEMPTS {
            let port = free_port();
            let mut cmd = command(port);
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {name} ({cmd:?}): {e}"));
            let output = Arc::new(Output::default());
            let drains = vec![
                drain(child.stdout.take().expect("piped"), &output, |o| &o.stdout),
                drain(child.stderr.take().expect("piped"), &output, |o| &o.stderr),
            ];
            let mut process = RealProcess {
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                name,
                child,
                output,
                drains,
            };
            match process.wait_accepting().await {
                Ok(()) => return process,
                Err(status) => {
                    let log = process.reaped_output();
                    assert!(
                        log.contains("in use"),
                        "{name} exited ({status}) before accepting connections:\n{log}"
                    );
                }
            }
        }
        panic!("no free port for {name} after {ATTEMPTS} attempts");
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything the child wrote to stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout.lock().expect("lock")).into_owned()
    }

    /// stdout and stderr so far, for failure messages.
    pub fn output(&self) -> String {
        format!(
            "--- {} stdout ---\n{}\n--- stderr ---\n{}",
            self.name,
            self.stdout(),
            String::from_utf8_lossy(&self.output.stderr.lock().expect("lock"))
        )
    }

    /// Resolves once `done(stdout)` holds; fails the test after [`LINE_LIMIT`].
    pub async fn wait_stdout(&self, what: &str, done: impl Fn(&str) -> bool) {
        let waiting = async {
            loop {
                let grew = self.output.grew.notified();
                tokio::pin!(grew);
                grew.as_mut().enable();
                if done(&self.stdout()) {
                    return;
                }
                grew.await;
            }
        };
        if tokio::time::timeout(LINE_LIMIT, waiting).await.is_err() {
            panic!(
                "{}: {what} not within {LINE_LIMIT:?}\n{}",
                self.name,
                self.output()
            );
        }
    }

    /// Polls until the port accepts a connection (`Ok`) or the child exits (`Err`).
    async fn wait_accepting(&mut self) -> Result<(), std::process::ExitStatus> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Err(status);
            }
            let connect = tokio::time::timeout(PROBE_EVERY * 10, TcpStream::connect(self.addr));
            if let Ok(Ok(_)) = connect.await {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "{} not accepting on {} after {START_LIMIT:?}:\n{}",
                self.name,
                self.addr,
                self.output()
            );
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// The whole output of a child that has exited: its pipes close, the drains end.
    fn reaped_output(&mut self) -> String {
        for drain in self.drains.drain(..) {
            let _ = drain.join();
        }
        self.output()
    }
}

impl Drop for RealProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Dead, so its pipes are at their end: the drains finish.
        for drain in self.drains.drain(..) {
            let _ = drain.join();
        }
    }
}

/// Copies `pipe` into the buffer `which` picks, waking waiters at every chunk.
fn drain(
    mut pipe: impl Read + Send + 'static,
    output: &Arc<Output>,
    which: fn(&Output) -> &Mutex<Vec<u8>>,
) -> JoinHandle<()> {
    let output = Arc::clone(output);
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut chunk) {
            which(&output)
                .lock()
                .expect("lock")
                .extend_from_slice(&chunk[..n]);
            output.grew.notify_waiters();
        }
    })
}
