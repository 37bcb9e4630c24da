//! The processes the harness starts (the baseline proxy, idemgate, redis-server, nginx,
//! PostgreSQL),
//! each behind a guard that stops it when dropped — on success, on error and on panic —
//! and the temp dir that holds their configs and logs.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::BoxError;

/// How long a started server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a server gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Attempts with a new port when the chosen one was taken in the meantime.
const PORT_ATTEMPTS: usize = 5;

/// A directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new() -> Result<Self, BoxError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("idemgate-bench-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&path)?;
        Ok(Self(path))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A child process: SIGTERM, then SIGKILL after [`STOP_GRACE`], and reaped, on drop.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) name: String,
    child: Child,
    log: PathBuf,
    /// Held open so that a child watching its stdin exits when the harness is gone.
    _stdin: Option<ChildStdin>,
    /// What `kill` sends first on drop: `-TERM` unless [`Proc::stopped_by`] said.
    stop_signal: &'static str,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stopped with `signal` (as `kill` spells it: `-QUIT`) instead of SIGTERM: a
    /// postmaster's SIGTERM waits for its clients to leave.
    pub(crate) fn stopped_by(mut self, signal: &'static str) -> Self {
        self.stop_signal = signal;
        self
    }

    /// How the process ended, if it has.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The end of the child's stdout and stderr, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // Graceful first: nginx's workers outlive a SIGKILLed master.
            let _ = Command::new("kill")
                .args([self.stop_signal, &self.child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port on 127.0.0.1 that nobody listens on right now.
pub(crate) fn free_port() -> Result<u16, BoxError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts a server on a free port and waits until it accepts connections. `command`
/// builds the command line for a port (writing any config file it needs); a start that
/// fails because the port was taken meanwhile is retried on another port.
pub(crate) async fn spawn_server(
    name: &str,
    dir: &Path,
    watch_stdin: bool,
    mut command: impl FnMut(u16) -> Result<Command, BoxError>,
) -> Result<(Proc, SocketAddr), BoxError> {
    let log = dir.join(format!("{name}.log"));
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut cmd = command(port)?;
        let out = File::create(&log)?;
        cmd.stdout(out.try_clone()?)
            .stderr(out)
            .stdin(if watch_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        let stdin = child.stdin.take();
        let mut proc = Proc {
            name: name.to_owned(),
            child,
            log: log.clone(),
            _stdin: stdin,
            stop_signal: "-TERM",
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = proc.child.try_wait() {
                let tail = proc.log_tail();
                if tail.contains("in use") {
                    break; // the port was taken; try another
                }
                return Err(format!("{name} exited with {status}:\n{tail}").into());
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok((proc, addr));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{name} did not accept connections within {READY_TIMEOUT:?}:\n{}",
                    proc.log_tail()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Err(format!("{name}: no free port after {PORT_ATTEMPTS} attempts").into())
}

/// The path of `program` when it is on `PATH`.
pub(crate) fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// valkey-server: on `PATH`, else the one scripts/test.sh installs in this worktree's
/// tools venv (`target/tools-venv/bin`).
pub(crate) fn valkey_server() -> Option<PathBuf> {
    on_path("valkey-server").or_else(|| {
        let venv =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools-venv/bin/valkey-server");
        venv.is_file().then_some(venv)
    })
}

/// The first line a command prints (stdout or stderr), e.g. a version.
pub(crate) fn first_line(program: &Path, args: &[&str]) -> String {
    match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        }
        Err(err) => format!("({err})"),
    }
}

/// The idemgate binary: `IDEMGATE_BIN` if set, else the one cargo built for this bench.
/// Cargo builds a package's binaries before its benchmarks, with the same profile, and
/// tells the bench where through `CARGO_BIN_EXE_<name>`, so `cargo bench` always runs
/// the current source, wherever the target dir is (`CARGO_TARGET_DIR`, `--target`).
pub(crate) fn idemgate_bin() -> Result<PathBuf, BoxError> {
    let path = std::env::var_os("IDEMGATE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_idemgate")),
        PathBuf::from,
    );
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("idemgate binary not found at {}", path.display()).into())
    }
}

/// Which store an idemgate target uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    Memory,
    /// The port of the harness's redis-server.
    Redis(u16),
    /// The port of a redis-server with a replica: `store.min_replicas: 1`.
    RedisReplicated(u16),
    /// The file store, in a directory of the harness's temp dir.
    File {
        fsync: bool,
        /// Another binary's store (`IDEMGATE_OTHER_BIN`): a directory of its own.
        other: bool,
    },
    /// A database of the harness's PostgreSQL cluster (docs/behaviour.md §22).
    Postgres {
        port: u16,
        database: &'static str,
    },
}

/// What the memory mode changes in idemgate's config; the scenarios use the default.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tuning {
    /// `store.max_entries` (idemgate's default, 100000, when `None`).
    pub(crate) max_entries: Option<usize>,
    /// The admin listener's port on 127.0.0.1 (`admin.listen: null` when `None`).
    pub(crate) admin_port: Option<u16>,
    /// `idempotency.ttl` (and a lease no longer than it), for the disk mode.
    pub(crate) ttl: Option<Duration>,
    /// The `/orders` route of the json-key scenario (a key source in the body), written
    /// only when that scenario runs, so that an idemgate from before key sources can be
    /// measured (`IDEMGATE_BIN`) on the others.
    pub(crate) json_key_route: bool,
    /// The `/documents` route of the upload scenario (`stream_request_body: true`,
    /// docs/behaviour.md §19), written only when that scenario runs, as `/orders` is.
    pub(crate) upload_route: bool,
    /// `store.encryption.keys: [{id: bench, key: ENCRYPTION_KEY}]`
    /// (docs/behaviour.md §17): every completed record is sealed with AES-256-GCM.
    pub(crate) encryption: bool,
    /// `store.key_prefix`, so that two targets on one redis-server keep apart records.
    pub(crate) key_prefix: Option<&'static str>,
    /// The file name, in the harness's temp dir, of a JWK set: the default policy then
    /// has `scope_principal: {jwt: {jwks_file: ...}}` (docs/behaviour.md §17).
    pub(crate) jwks_file: Option<&'static str>,
    /// `telemetry.otlp` to this address over `http/protobuf`, and its `sample_ratio`
    /// (docs/behaviour.md §20).
    pub(crate) otlp: Option<(SocketAddr, f64)>,
    /// `replay_authorization: {path: /auth/check}` in the default policy
    /// (docs/behaviour.md §24): the harness's upstream answers it `204`.
    pub(crate) replay_authorization: bool,
}

/// The encryption key of the `-enc` targets: 32 bytes (`bench-only-key-not-a-secret-32b!`)
/// in base64, fixed so that a run's configs can be read back; it guards nothing.
const ENCRYPTION_KEY: &str = "YmVuY2gtb25seS1rZXktbm90LWEtc2VjcmV0LTMyYiE=";

/// Where an idemgate target of the harness keeps its file store, inside `dir`.
pub(crate) fn file_store_dir(dir: &Path, fsync: bool) -> PathBuf {
    dir.join(if fsync {
        "file-store-fsync"
    } else {
        "file-store-nosync"
    })
}

/// The other binary of `--targets other-file,...`: `IDEMGATE_OTHER_BIN`.
pub(crate) fn other_bin() -> Result<PathBuf, BoxError> {
    let path = std::env::var_os("IDEMGATE_OTHER_BIN")
        .map(PathBuf::from)
        .ok_or("the other-file targets need IDEMGATE_OTHER_BIN: the binary to compare")?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("IDEMGATE_OTHER_BIN: no binary at {}", path.display()).into())
    }
}

/// The path of the `memory-authz` target's check, which the harness's upstream answers
/// `204` with no body.
pub(crate) const AUTH_CHECK: &str = "/auth/check";

/// idemgate's config: `/charges` guarded (key required), `/orders` guarded with the key
/// in the JSON body and a canonical-JSON fingerprint, `/documents` guarded with its
/// bodies streamed, `/unguarded` passed through,
/// no admin listener unless `tuning` asks for one, `log.level` as given (`warn` by
/// default: the per-request access line is at info). The level was checked to hold no
/// quote or line break.
pub(crate) fn idemgate_yaml(
    listen: u16,
    upstream: SocketAddr,
    store: Store,
    log_level: &str,
    tuning: Tuning,
    dir: &Path,
) -> String {
    let mut store = match store {
        Store::Memory => "  kind: memory\n".to_owned(),
        Store::Redis(port) => format!("  kind: redis\n  url: redis://127.0.0.1:{port}/0\n"),
        Store::RedisReplicated(port) => {
            format!("  kind: redis\n  url: redis://127.0.0.1:{port}/0\n  min_replicas: 1\n")
        }
        Store::File { fsync, other } => {
            let path = file_store_dir(dir, fsync);
            let path = if other {
                path.with_extension("other")
            } else {
                path
            };
            format!(
                "  kind: file\n  path: {}\n  fsync: {fsync}\n",
                path.display()
            )
        }
        // The cluster trusts every local connection; it has no TLS.
        // `IDEMGATE_BENCH_PG_POOL` sets `pool_size` (the store's default, 16, without it),
        // to measure what more commits in flight do.
        Store::Postgres { port, database } => {
            let pool = std::env::var("IDEMGATE_BENCH_PG_POOL")
                .ok()
                .and_then(|n| n.parse::<usize>().ok())
                .map_or(String::new(), |n| format!("  pool_size: {n}\n"));
            format!(
                "  kind: postgres\n  url: postgres://postgres@127.0.0.1:{port}/{database}?sslmode=disable\n{pool}"
            )
        }
    };
    let mut policy = tuning.ttl.map_or_else(String::new, |ttl| {
        let ms = ttl.as_millis().max(1);
        // idemgate refuses a lease under 100ms.
        let lease = ms.max(100);
        format!("  ttl: {ms}ms\n  lease: {lease}ms\n")
    });
    // In the default policy, so that every guarded route (`/charges`, `/orders`) scopes
    // by the token's `iss` and `sub` instead of the raw Authorization value.
    if let Some(jwks) = tuning.jwks_file {
        policy.push_str(&format!(
            "  scope_principal:\n    jwt:\n      jwks_file: \"{}\"\n",
            dir.join(jwks).display()
        ));
    }
    if tuning.replay_authorization {
        policy.push_str(&format!("  replay_authorization: {{path: {AUTH_CHECK}}}\n"));
    }
    let idempotency = if policy.is_empty() {
        policy
    } else {
        format!("idempotency:\n{policy}")
    };
    if let Some(n) = tuning.max_entries {
        store.push_str(&format!("  max_entries: {n}\n"));
    }
    if let Some(prefix) = tuning.key_prefix {
        store.push_str(&format!("  key_prefix: \"{prefix}\"\n"));
    }
    if tuning.encryption {
        store.push_str(&format!(
            "  encryption:\n    keys:\n      - {{id: bench, key: \"{ENCRYPTION_KEY}\"}}\n"
        ));
    }
    let admin = tuning
        .admin_port
        .map_or_else(|| "null".to_owned(), |port| format!("127.0.0.1:{port}"));
    let telemetry = tuning.otlp.map_or_else(String::new, |(sink, ratio)| {
        format!(
            "telemetry:\n  otlp:\n    endpoint: http://{sink}\n    protocol: http/protobuf\n    \
             sample_ratio: {ratio:?}\n"
        )
    });
    let orders = if tuning.json_key_route {
        "  - path: /orders\n    methods: [POST]\n    required: true\n\
         \x20   key_from: [{json: /metadata/order_id}]\n    fingerprint_body: json\n"
    } else {
        ""
    };
    let documents = if tuning.upload_route {
        "  - path: /documents\n    methods: [POST]\n    required: true\n\
         \x20   stream_request_body: true\n"
    } else {
        ""
    };
    format!(
        "listen: 127.0.0.1:{listen}\n\
         upstream:\n  url: http://{upstream}\n\
         store:\n{store}\
         {idempotency}\
         routes:\n\
         \x20 - path: /charges\n    methods: [POST]\n    required: true\n\
         {orders}\
         {documents}\
         \x20 - path: /unguarded\n    enabled: false\n\
         admin:\n  listen: {admin}\n\
         log:\n  level: \"{log_level}\"\n\
         {telemetry}"
    )
}

/// nginx as a plain keep-alive `proxy_pass`, one worker per CPU, everything in `dir`.
pub(crate) fn nginx_conf(listen: u16, upstream: SocketAddr, dir: &Path) -> String {
    let d = dir.display();
    format!(
        "worker_processes auto;\n\
         daemon off;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 access_log off;\n\
         \x20 client_body_temp_path {d}/nginx-body;\n\
         \x20 proxy_temp_path {d}/nginx-proxy;\n\
         \x20 fastcgi_temp_path {d}/nginx-fastcgi;\n\
         \x20 uwsgi_temp_path {d}/nginx-uwsgi;\n\
         \x20 scgi_temp_path {d}/nginx-scgi;\n\
         \x20 upstream app {{ server {upstream}; keepalive 64; }}\n\
         \x20 server {{\n\
         \x20   listen 127.0.0.1:{listen};\n\
         \x20   location / {{\n\
         \x20     proxy_pass http://app;\n\
         \x20     proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n\
         \x20     proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
         \x20     proxy_set_header X-Forwarded-Proto http;\n\
         \x20   }}\n\
         \x20 }}\n\
         }}\n"
    )
}

/// Commands that only idemgate's Lua scripts run, inside EVALSHA. Redis counts them in
/// `INFO commandstats` too, but they cost no round trip. `set` is both: the claim is a
/// top-level `SET ... NX GET`, and scripts write with `SET` too; see `command_delta`.
const INSIDE_SCRIPTS: [&str; 6] = ["get", "time", "publish", "del", "pttl", "pexpire"];

/// Commands idemgate pipelines behind another, in the same round trip: the `GETRANGE`
/// that proves the native claim's `SET ... NX GET` wrote (src/store/redis/claim.rs).
const PIPELINED: [&str; 1] = ["getrange"];

/// `WAIT` (`store.min_replicas`) is a round trip, but one shared by the requests whose
/// writes it covers (src/store/redis/replicas.rs): it is shown among the commands and
/// left out of the round-trip count (docs/behaviour.md §5), which is about the claim
/// and the record.
const SHARED: [&str; 1] = ["wait"];

/// Round trips among top-level commands: every one but those pipelined behind another
/// and the shared `WAIT`s.
pub(crate) fn round_trips(top: &BTreeMap<String, u64>) -> u64 {
    top.iter()
        .filter(|(name, _)| !PIPELINED.contains(&name.as_str()) && !SHARED.contains(&name.as_str()))
        .map(|(_, calls)| calls)
        .sum()
}

/// Calls per command from `INFO commandstats`, over a raw RESP connection.
pub(crate) async fn command_stats(port: u16) -> Result<BTreeMap<String, u64>, BoxError> {
    let info = info(port, "commandstats").await?;
    let mut stats = BTreeMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line
            .trim()
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if let Some(calls) = fields.split(',').find_map(|f| f.strip_prefix("calls=")) {
            stats.insert(name.to_ascii_lowercase(), calls.parse()?);
        }
    }
    Ok(stats)
}

/// Waits until the replica of the redis-server on `master` acknowledges a write (Redis 7
/// streams to a new replica only after its first acknowledgement, up to 1 s after the
/// sync), so that `WAIT` counts it from the first measured request.
pub(crate) async fn wait_replica(master: u16) -> Result<(), BoxError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        // A write moves the replication offset, which the replica then acknowledges.
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", master)).await?;
        conn.write_all(b"*3\r\n$3\r\nSET\r\n$22\r\nidemgate-harness:probe\r\n$1\r\n1\r\n")
            .await?;
        let mut ok = [0u8; 5];
        conn.read_exact(&mut ok).await?;
        let replication = info(master, "replication").await?;
        let field = |name: &str| {
            replication
                .lines()
                .find_map(|l| l.trim().strip_prefix(name))
                .map(str::to_owned)
        };
        let offset: Option<u64> = field("master_repl_offset:").and_then(|v| v.parse().ok());
        let acked: Option<u64> = field("slave0:").and_then(|line| {
            let online = line.contains("state=online");
            let acked = line
                .split(',')
                .find_map(|f| f.strip_prefix("offset="))?
                .parse()
                .ok()?;
            online.then_some(acked)
        });
        if let (Some(offset), Some(acked)) = (offset, acked)
            && offset > 0
            && acked > 0
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the replica did not acknowledge within {READY_TIMEOUT:?}:\n{replication}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `INFO section` over a raw RESP connection.
async fn info(port: u16, section: &str) -> Result<String, BoxError> {
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        conn.write_all(
            format!("*2\r\n$4\r\nINFO\r\n${}\r\n{section}\r\n", section.len()).as_bytes(),
        )
        .await?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Err::<String, BoxError>("redis closed the connection".into());
            }
            buf.extend_from_slice(&chunk[..n]);
            // `$LEN\r\n` then LEN bytes then `\r\n`.
            let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
                continue;
            };
            let header = std::str::from_utf8(&buf[..eol])?;
            let len: usize = header
                .strip_prefix('$')
                .ok_or_else(|| format!("INFO answered {header}"))?
                .parse()?;
            if buf.len() >= eol + 2 + len {
                return Ok(String::from_utf8_lossy(&buf[eol + 2..eol + 2 + len]).into_owned());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .map_err(|_| format!("INFO {section}: no answer within 5s"))?
}

/// Commands sent between two snapshots: `(top-level by name, inside scripts)`.
/// Top-level is every command but those the scripts run and the harness's own `INFO`.
pub(crate) fn command_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> (BTreeMap<String, u64>, u64) {
    let mut top = BTreeMap::new();
    let mut inside = 0;
    let delta_of = |name: &str| {
        after
            .get(name)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.get(name).copied().unwrap_or(0))
    };
    for (name, calls) in after {
        let delta = calls.saturating_sub(before.get(name).copied().unwrap_or(0));
        let base = name.split('|').next().unwrap_or(name);
        // The harness's own INFO, and the acknowledgements a replica sends its master.
        if base == "info" || base == "replconf" {
            continue;
        }
        if base == "set" {
            // Every script idemgate runs starts with one GET (which idemgate never sends
            // itself), and the scripts on this path (complete) write one SET each: so
            // script SETs = script GETs, and the rest were claims sent as commands.
            let in_scripts = delta.min(delta_of("get"));
            inside += in_scripts;
            if delta > in_scripts {
                top.insert(name.clone(), delta - in_scripts);
            }
        } else if INSIDE_SCRIPTS.contains(&base) {
            inside += delta;
        } else if delta > 0 {
            top.insert(name.clone(), delta);
        }
    }
    (top, inside)
}

/// idemgate's admin `/metrics` on 127.0.0.1:`admin_port`, as text.
pub(crate) async fn scrape(admin_port: u16) -> Result<String, BoxError> {
    get(admin_port, "/metrics").await
}

/// `GET path` on 127.0.0.1:`port`, on a connection of its own: the answer (head and
/// body) as text, if it is a `200`.
pub(crate) async fn get(port: u16, path: &str) -> Result<String, BoxError> {
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        conn.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut text = Vec::new();
        conn.read_to_end(&mut text).await?;
        Ok::<_, BoxError>(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .map_err(|_| format!("GET {path}: no answer within 2 s"))??;
    let text = String::from_utf8_lossy(&text).into_owned();
    if !text.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "GET {path} answered {}",
            text.lines().next().unwrap_or("nothing")
        )
        .into());
    }
    Ok(text)
}

/// The median Redis round trip, in µs, at one connection: `PING` then `+PONG` over and
/// over on one raw connection to the redis-server on `port` for `duration` (issue 29:
/// the unit a `miss`'s added latency is counted in). Nothing else runs meanwhile.
pub(crate) async fn redis_rtt(port: u16, duration: Duration) -> Result<f64, BoxError> {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    conn.set_nodelay(true)?;
    let mut latencies = crate::load::Histogram::default();
    let mut pong = [0u8; 7];
    let end = Instant::now() + duration;
    let mut pings = 0u64;
    // At least a few, whatever the duration.
    while Instant::now() < end || pings < 10 {
        let sent = Instant::now();
        let exchange = async {
            conn.write_all(b"PING\r\n").await?;
            conn.read_exact(&mut pong).await?;
            Ok::<_, std::io::Error>(())
        };
        tokio::time::timeout(Duration::from_secs(2), exchange)
            .await
            .map_err(|_| "PING: no answer within 2 s")??;
        latencies.record(sent.elapsed());
        if &pong != b"+PONG\r\n" {
            return Err(format!("PING answered {:?}", String::from_utf8_lossy(&pong)).into());
        }
        pings += 1;
    }
    Ok(latencies.quantile(0.50).as_secs_f64() * 1e6)
}

/// The value of one unlabelled metric in a `/metrics` text, as a whole number.
pub(crate) fn metric(text: &str, name: &str) -> Result<u64, BoxError> {
    text.lines()
        .find_map(|line| {
            let (metric, value) = line.split_once(' ')?;
            (metric == name).then(|| value.trim().parse::<f64>().ok())?
        })
        .map(|v| v.max(0.0) as u64)
        .ok_or_else(|| format!("/metrics has no {name}").into())
}

/// The sum of every series of a labelled counter in a `/metrics` text, whatever its
/// labels, as a whole number: 0 when it has none yet (a labelled family prints no
/// series until one of its label sets is counted).
pub(crate) fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let labels = series.strip_prefix(name)?;
            (labels.is_empty() || labels.starts_with('{'))
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum::<f64>()
        .max(0.0) as u64
}
