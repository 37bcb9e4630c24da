//! Running the programs the test servers need (redis-cli, initdb, psql, pg_ctl, ...):
//! bounded in time, and off the async runtime.

use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Runs a command to completion, SIGKILLing it after `timeout`.
pub fn run_bounded(mut cmd: Command, timeout: Duration, shown: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {shown} ({cmd:?}): {e}"));
    let pid = child.id().to_string();
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let expired = matches!(
            finished.recv_timeout(timeout),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        if expired {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        expired
    });
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait {shown}: {e}"));
    let _ = done.send(());
    let expired = watchdog.join().unwrap_or(false);
    assert!(
        !expired,
        "{shown}: no answer within {timeout:?}, killed\nstdout so far: {}\nstderr so far: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs blocking setup off the async runtime and re-raises its panic with the original
/// message.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(value) => value,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("test server setup task: {e}"),
    }
}
