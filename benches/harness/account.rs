//! The account of a request (`--account`, issue 29): in each measured window, the
//! syscalls of the target process by kind, counted by `perf stat` on the
//! `syscalls:sys_enter_*` tracepoints, and its allocations and allocated bytes, read from
//! the counters of a build with the feature `alloc-stats` before and after; all per
//! request. Then the tables: the account of each (target, scenario), and what each
//! idemgate row makes beyond the plain proxy's row of the same scenario.
//!
//! Counting costs the target CPU (a tracepoint on every syscall, an atomic add on every
//! allocation, and idemgate then allocates from glibc instead of mimalloc): an account
//! run's CPU and rates are for reading next to its counts, not against the targets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::report::{Row, base};
use crate::{BoxError, TargetKind, load, procs};

/// Every syscall's entry tracepoint (about 360 on x86-64).
const SYSCALL_EVENTS: &str = "syscalls:sys_enter_*";

/// The counters of a build with `alloc-stats`, in idemgate's `/metrics` and in the plain
/// proxy's answer to [`crate::servers::ALLOC_STATS_PATH`].
const ALLOC_CALLS: &str = "idemgate_alloc_calls_total";
const ALLOC_BYTES: &str = "idemgate_alloc_bytes_total";

/// What to do without the allocation counters.
pub(crate) const BUILD_HINT: &str = "build with `cargo bench --features alloc-stats --bench harness -- --account ...` to count allocations";

/// How long perf may take to start counting, or to print its counts once done.
const PERF_TIMEOUT: Duration = Duration::from_secs(30);

/// What an account run counts syscalls with: perf, and the holder that keeps its
/// tracepoints registered for the whole run.
#[derive(Debug)]
pub(crate) struct Counting {
    /// perf's path, or why syscalls are not counted.
    perf: Result<PathBuf, String>,
    _holder: Option<Holder>,
}

/// `perf stat` on every syscall tracepoint, counting a `cat` that reads a pipe of the
/// harness, for as long as the harness runs. The kernel registers a tracepoint when the
/// first perf event on it opens, and unregisters it when the last one closes, after an
/// RCU grace period: about 30 ms a tracepoint, 11 s for all of them, in which perf sits
/// idle before it exits. With this holder open, no window's perf is the last on any
/// tracepoint, and it exits within a quarter of a second of its window.
#[derive(Debug)]
struct Holder {
    /// Dropped, it closes `cat`'s stdin: `cat`, and then perf, end. They are not waited
    /// for (tokio reaps them in the background): perf takes those 11 s to close.
    _stdin: ChildStdin,
    _child: Child,
}

impl Counting {
    /// Finds perf and starts the holder; on failure syscalls are not counted, and
    /// [`Counting::note`] says why.
    pub(crate) async fn start(dir: &Path) -> Self {
        let Some(perf) = procs::on_path("perf") else {
            return Self {
                perf: Err("perf is not on PATH".to_owned()),
                _holder: None,
            };
        };
        match Holder::start(&perf, dir).await {
            Ok(holder) => Self {
                perf: Ok(perf),
                _holder: Some(holder),
            },
            Err(err) => Self {
                perf: Err(format!("perf stat -e '{SYSCALL_EVENTS}' failed: {err}")),
                _holder: None,
            },
        }
    }

    /// perf, if syscalls can be counted.
    pub(crate) fn perf(&self) -> Option<&Path> {
        self.perf.as_deref().ok()
    }

    /// A line for the report's notes when syscalls are not counted.
    pub(crate) fn note(&self) -> Option<String> {
        self.perf
            .as_ref()
            .err()
            .map(|why| format!("--account: syscalls not counted: {why}"))
    }
}

impl Holder {
    async fn start(perf: &Path, dir: &Path) -> Result<Self, BoxError> {
        let log = std::fs::File::create(dir.join("perf-holder.log"))?;
        let mut child = Command::new(perf)
            .args(["stat", "-x,", "-e", SYSCALL_EVENTS, "-o", "/dev/null", "--"])
            .args(["sh", "-c", "echo ready; exec cat >/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()?;
        let stdin = child.stdin.take().ok_or("perf: no stdin")?;
        let stdout = child.stdout.take().ok_or("perf: no stdout")?;
        // The workload runs once every event is open.
        let mut lines = BufReader::new(stdout).lines();
        match tokio::time::timeout(PERF_TIMEOUT, lines.next_line()).await {
            Ok(Ok(Some(line))) if line == "ready" => Ok(Self {
                _stdin: stdin,
                _child: child,
            }),
            Ok(_) => {
                let _ = child.wait().await;
                let log = std::fs::read_to_string(dir.join("perf-holder.log"))?;
                Err(log.lines().next().unwrap_or("exited").to_owned().into())
            }
            Err(_) => Err(format!("not counting after {PERF_TIMEOUT:?}").into()),
        }
    }
}

/// Where a target's allocation totals are read: idemgate's admin `/metrics`, or the
/// plain proxy's own [`crate::servers::ALLOC_STATS_PATH`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllocSource {
    pub(crate) port: u16,
    pub(crate) path: &'static str,
}

/// Allocation calls (and reallocations) and bytes since the process started.
pub(crate) async fn alloc_totals(source: AllocSource) -> Result<(u64, u64), String> {
    // Without the feature the plain proxy forwards the path like any other.
    if source.path == crate::servers::ALLOC_STATS_PATH && !cfg!(feature = "alloc-stats") {
        return Err(format!(
            "the harness was built without the feature alloc-stats: {BUILD_HINT}"
        ));
    }
    let read = async {
        let text = procs::get(source.port, source.path).await?;
        Ok::<_, BoxError>((
            procs::metric(&text, ALLOC_CALLS)?,
            procs::metric(&text, ALLOC_BYTES)?,
        ))
    };
    read.await.map_err(|err| format!("{err}: {BUILD_HINT}"))
}

/// What one (target, scenario) did per request in its measured window.
#[derive(Debug, Clone)]
pub(crate) struct Account {
    /// Syscalls by name (`sendto`), per request; or why they were not counted.
    pub(crate) syscalls: Result<BTreeMap<String, f64>, String>,
    /// Allocations and bytes, per request; or why they were not counted.
    pub(crate) allocs: Result<Allocs, String>,
}

/// Allocations per request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Allocs {
    /// Allocations and reallocations.
    pub(crate) calls: f64,
    /// Bytes allocated, reallocations' growth included.
    pub(crate) bytes: f64,
}

impl Allocs {
    /// Per request between two totals.
    pub(crate) fn between(before: (u64, u64), after: (u64, u64), requests: u64) -> Self {
        let n = requests.max(1) as f64;
        Self {
            calls: after.0.saturating_sub(before.0) as f64 / n,
            bytes: after.1.saturating_sub(before.1) as f64 / n,
        }
    }
}

/// Counts the syscalls of `pid` until `end` fires (or is dropped), per request answered
/// meanwhile. Spawned a little before the measured window (perf takes a few tens of ms
/// to open its events, more on a busy machine), with `end` sent as the window closes:
/// perf's workload, `sh -c 'echo start; read _; echo end'`, says when the counting
/// starts (perf enables its events as it starts the workload) and waits for a line
/// from the harness to end it, so the counting lies inside the load whatever perf's
/// start-up took. The requests of that very window are `progress`'s count between the
/// two lines.
pub(crate) async fn syscalls(
    perf: PathBuf,
    pid: u32,
    end: tokio::sync::oneshot::Receiver<()>,
    progress: Arc<load::Progress>,
) -> Result<BTreeMap<String, f64>, String> {
    let mut child = Command::new(&perf)
        .args(["stat", "-x,", "-e", SYSCALL_EVENTS, "-p", &pid.to_string()])
        .args(["--", "sh", "-c", "echo start; read _; echo end"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| format!("cannot start perf: {err}"))?;
    let mut stdin = child.stdin.take().ok_or("perf: no stdin")?;
    let stdout = child.stdout.take().ok_or("perf: no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut window = [0u64; 2];
    let mut end = Some(end);
    for (i, want) in [(0, "start"), (1, "end")] {
        if i == 1
            && let Some(end) = end.take()
        {
            // Sent, or the measure gave up: either way the window ends now.
            let _ = end.await;
            let _ = stdin.write_all(b"\n").await;
        }
        match tokio::time::timeout(PERF_TIMEOUT, lines.next_line()).await {
            Ok(Ok(Some(line))) if line == want => window[i] = progress.completed(),
            Ok(_) => {
                // perf ended (or failed) before its workload said so: its stderr says why.
                drop(stdin);
                let out = tokio::time::timeout(PERF_TIMEOUT, child.wait_with_output())
                    .await
                    .map_err(|_| "perf did not exit".to_owned())?
                    .map_err(|err| format!("perf: {err}"))?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                return Err(format!(
                    "perf stat exited with {}: {}",
                    out.status,
                    stderr.lines().next().unwrap_or("no message")
                ));
            }
            Err(_) => return Err(format!("perf's workload did not say {want} in time")),
        }
    }
    drop(stdin);
    let out = tokio::time::timeout(PERF_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| format!("perf did not print its counts within {PERF_TIMEOUT:?}"))?
        .map_err(|err| format!("perf: {err}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "perf stat exited with {}: {}",
            out.status,
            stderr.lines().next().unwrap_or("no message")
        ));
    }
    let requests = window[1].saturating_sub(window[0]);
    if requests == 0 {
        return Err(
            "no request answered in perf's window (perf took longer to start than the measured window lasted)"
                .to_owned(),
        );
    }
    let counts = parse_perf_csv(&stderr);
    if counts.is_empty() {
        return Err(format!(
            "no syscall counted (perf said: {})",
            stderr.lines().next().unwrap_or("nothing")
        ));
    }
    Ok(counts
        .into_iter()
        .map(|(name, count)| (name, count as f64 / requests as f64))
        .collect())
}

/// `count,,syscalls:sys_enter_NAME,...` lines (`perf stat -x,`): counts by NAME, without
/// those `<not counted>` or zero.
fn parse_perf_csv(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(',');
            let count: u64 = fields.next()?.trim().parse().ok()?;
            let name = fields.nth(1)?.strip_prefix("syscalls:sys_enter_")?;
            (count > 0).then(|| (name.to_owned(), count))
        })
        .collect()
}

/// The kinds of `by_kind` worth a column: at least 0.01 per request (in absolute value),
/// largest first.
fn notable(by_kind: &BTreeMap<String, f64>) -> Vec<(&str, f64)> {
    let mut kinds: Vec<(&str, f64)> = by_kind
        .iter()
        .map(|(name, n)| (name.as_str(), *n))
        .filter(|(_, n)| n.abs() >= 0.01)
        .collect();
    kinds.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()).then(a.0.cmp(b.0)));
    kinds
}

/// Prints the account of one round of one pass: per (target, scenario), then each
/// idemgate row against the plain proxy's row of the same scenario; then why anything
/// was not counted.
pub(crate) fn report(rows: &[Row]) {
    println!(
        "account (--account), per request in the measured window. The counting inflates CPU (perf on every syscall, an atomic add per allocation, glibc's malloc in idemgate instead of mimalloc): these CPU figures and rates are not for the timing targets."
    );
    println!();
    println!(
        "| target | scenario | CPU µs/req | syscalls/req | syscalls by kind, per request (>= 0.01) | allocs/req | KiB allocated/req |"
    );
    println!("|---|---|---:|---:|---|---:|---:|");
    let dash = || "-".to_owned();
    for row in rows {
        let Some(account) = &row.account else {
            continue;
        };
        let syscalls = account.syscalls.as_ref().ok();
        let allocs = account.allocs.as_ref().ok();
        println!(
            "| {} | {} | {:.1} | {} | {} | {} | {} |",
            row.target().name(),
            row.scenario().name(),
            row.cpu_us(),
            syscalls.map_or_else(dash, |s| format!("{:.2}", s.values().sum::<f64>())),
            syscalls.map_or_else(dash, |s| kinds(&notable(s), false)),
            allocs.map_or_else(dash, |a| format!("{:.1}", a.calls)),
            allocs.map_or_else(dash, |a| format!("{:.2}", a.bytes / 1024.0)),
        );
    }
    println!();
    println!(
        "| target | scenario | syscalls/req beyond the plain proxy's | by kind (+/-, >= 0.01) | allocs/req beyond | KiB/req beyond |"
    );
    println!("|---|---|---:|---|---:|---:|");
    for row in rows {
        let (Some(account), Some(b)) = (&row.account, base(rows, row.scenario())) else {
            continue;
        };
        let Some(b_account) = b.account.as_ref().filter(|_| row.target().is_idemgate()) else {
            continue;
        };
        let syscalls = match (&account.syscalls, &b_account.syscalls) {
            (Ok(mine), Ok(theirs)) => {
                let names: BTreeSet<&String> = mine.keys().chain(theirs.keys()).collect();
                let diff: BTreeMap<String, f64> = names
                    .into_iter()
                    .map(|name| {
                        let of = |m: &BTreeMap<String, f64>| m.get(name).copied().unwrap_or(0.0);
                        (name.clone(), of(mine) - of(theirs))
                    })
                    .collect();
                Some((diff.values().sum::<f64>(), kinds(&notable(&diff), true)))
            }
            _ => None,
        };
        let allocs = match (&account.allocs, &b_account.allocs) {
            (Ok(mine), Ok(theirs)) => Some((mine.calls - theirs.calls, mine.bytes - theirs.bytes)),
            _ => None,
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            row.target().name(),
            row.scenario().name(),
            syscalls
                .as_ref()
                .map_or_else(dash, |s| format!("{:+.2}", s.0)),
            syscalls.map_or_else(dash, |s| s.1),
            allocs.map_or_else(dash, |a| format!("{:+.1}", a.0)),
            allocs.map_or_else(dash, |a| format!("{:+.2}", a.1 / 1024.0)),
        );
    }
    println!();
    // Why something was not counted, once per reason.
    let mut why: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for row in rows {
        let Some(account) = &row.account else {
            continue;
        };
        let what = || format!("{} {}", row.target().name(), row.scenario().name());
        if let Err(err) = &account.syscalls {
            why.entry(err).or_default().push(what());
        }
        if let Err(err) = &account.allocs {
            why.entry(err).or_default().push(what());
        }
    }
    for (reason, rows) in why {
        println!("note: not counted for {}: {reason}", rows.join(", "));
    }
}

/// `sendto 1.00, recvfrom 2.01`; signed: `+1.00 sendto, -0.40 epoll_wait`.
fn kinds(kinds: &[(&str, f64)], signed: bool) -> String {
    if kinds.is_empty() {
        return "none".to_owned();
    }
    kinds
        .iter()
        .map(|(name, n)| {
            if signed {
                format!("{n:+.2} {name}")
            } else {
                format!("{name} {n:.2}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a target's allocation counts are readable, for the notes at start.
pub(crate) async fn probe(kind: TargetKind, source: Option<AllocSource>) -> Option<String> {
    let source = source?;
    alloc_totals(source)
        .await
        .err()
        .map(|err| format!("--account: {}: allocations not counted: {err}", kind.name()))
}

/// Checks the parsing of perf's output; `--smoke` runs it so that it cannot rot.
pub(crate) fn self_check() -> Result<(), String> {
    let text = "<not counted>,,syscalls:sys_enter_fork,0,100.00,,\n\
                12,,syscalls:sys_enter_sendto,1234,100.00,,\n\
                0,,syscalls:sys_enter_read,1234,100.00,,\n\
                \n\
                3,,syscalls:sys_enter_epoll_wait,1234,100.00,,\n";
    let counts = parse_perf_csv(text);
    let want: BTreeMap<String, u64> =
        [("epoll_wait".to_owned(), 3), ("sendto".to_owned(), 12)].into();
    if counts != want {
        return Err(format!("perf stat's CSV: {counts:?}, want {want:?}"));
    }
    Ok(())
}
