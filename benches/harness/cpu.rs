//! CPU accounting from `/proc`: what the measured proxy spent per request (CPU time and
//! context switches), and how much of the machine something outside the harness took
//! meanwhile (a parallel build on a 2-core box moves requests/s by tens of percent; the
//! "other load" column makes that visible); and its resident memory (`VmRSS`, `VmHWM`).
//! A server of several processes (nginx, a PostgreSQL cluster) is counted as its whole
//! tree: every process whose parent chain leads to it, and those that ended and it
//! reaped.

use std::collections::HashMap;
use std::time::Instant;

/// Ticks per second of `/proc` CPU times (`USER_HZ`, 100 on every Linux architecture).
const TICKS_PER_SEC: f64 = 100.0;

/// A process whose CPU time is taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watched {
    pub(crate) pid: u32,
    /// Add its descendants, alive or reaped by it (nginx's workers; a PostgreSQL
    /// postmaster's backends, walwriter, checkpointer and autovacuum workers); not for
    /// the harness, whose children are the other targets.
    pub(crate) tree: bool,
}

/// What a process has used so far.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    /// utime + stime.
    ticks: u64,
    /// Voluntary and involuntary context switches over all its threads.
    switches: u64,
}

impl Counters {
    fn of(pid: u32) -> Self {
        Self {
            ticks: stat(pid).map_or(0, |s| s.ticks),
            switches: switches(pid),
        }
    }

    /// The root of a tree: its own counters, and the CPU time of the children it has
    /// reaped (a backend that ended during the window keeps counting).
    fn of_root(pid: u32) -> Self {
        Self {
            ticks: stat(pid).map_or(0, |s| s.ticks + s.reaped_ticks),
            switches: switches(pid),
        }
    }

    fn add(self, other: Self) -> Self {
        Self {
            ticks: self.ticks + other.ticks,
            switches: self.switches + other.switches,
        }
    }
}

/// The counters at one instant.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    at: Instant,
    /// Machine-wide non-idle ticks, all CPUs, steal excluded.
    busy: u64,
    steal: u64,
    /// Each watched process (with its tree if asked), in the order given.
    procs: Vec<Counters>,
}

/// Takes a snapshot of the machine and of `watched`.
pub(crate) fn snapshot(watched: &[Watched]) -> Snapshot {
    let (busy, steal) = machine().unwrap_or((0, 0));
    let parents = if watched.iter().any(|w| w.tree) {
        every_process()
    } else {
        HashMap::new()
    };
    let procs = watched
        .iter()
        .map(|w| {
            if !w.tree {
                return Counters::of(w.pid);
            }
            parents
                .keys()
                .filter(|&&pid| descends_from(pid, w.pid, &parents))
                .map(|&pid| Counters::of(pid))
                .fold(Counters::of_root(w.pid), Counters::add)
        })
        .collect();
    Snapshot {
        at: Instant::now(),
        busy,
        steal,
        procs,
    }
}

/// The machine between two snapshots.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    /// CPUs the machine used outside the watched processes (other work, other users).
    pub(crate) other_cpus: f64,
    /// CPUs the hypervisor took.
    pub(crate) steal_cpus: f64,
}

impl Usage {
    pub(crate) fn between(a: &Snapshot, b: &Snapshot) -> Self {
        let seconds = (b.at - a.at).as_secs_f64().max(1e-9);
        let ours: u64 = a
            .procs
            .iter()
            .zip(&b.procs)
            .map(|(x, y)| y.ticks.saturating_sub(x.ticks))
            .sum();
        let busy = b.busy.saturating_sub(a.busy);
        Self {
            other_cpus: busy.saturating_sub(ours) as f64 / TICKS_PER_SEC / seconds,
            steal_cpus: b.steal.saturating_sub(a.steal) as f64 / TICKS_PER_SEC / seconds,
        }
    }
}

/// One watched process between two snapshots, per request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerRequest {
    pub(crate) cpu_us: f64,
    pub(crate) switches: f64,
}

/// Process number `index` of the snapshots, per request.
pub(crate) fn per_request(a: &Snapshot, b: &Snapshot, index: usize, requests: u64) -> PerRequest {
    let (x, y) = (a.procs[index], b.procs[index]);
    let n = requests.max(1) as f64;
    PerRequest {
        cpu_us: y.ticks.saturating_sub(x.ticks) as f64 / TICKS_PER_SEC * 1e6 / n,
        switches: y.switches.saturating_sub(x.switches) as f64 / n,
    }
}

/// `(busy, steal)` ticks from the `cpu` line of `/proc/stat`.
fn machine() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    let steal = *v.get(7)?;
    Some((total - idle - steal, steal))
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy)]
struct Stat {
    ppid: u32,
    /// utime + stime.
    ticks: u64,
    /// cutime + cstime: its children that ended and that it waited for.
    reaped_ticks: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the fields follow the last `)`.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |i: usize| rest.get(i)?.parse::<u64>().ok();
    Some(Stat {
        ppid: rest.get(1)?.parse().ok()?,
        ticks: field(11)? + field(12)?,
        reaped_ticks: field(13)? + field(14)?,
    })
}

/// Context switches of every thread of a process (threads that ended are not counted;
/// tokio's workers live as long as the process).
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// pid -> ppid of every process, to add a server's tree to its root.
fn every_process() -> HashMap<u32, u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?.ppid)))
        .collect()
}

/// Whether `root` is among the ancestors of `pid` (not `pid` itself).
fn descends_from(pid: u32, root: u32, parents: &HashMap<u32, u32>) -> bool {
    let mut at = pid;
    // A chain longer than this is a loop in a snapshot torn by exits and forks.
    for _ in 0..64 {
        match parents.get(&at) {
            Some(&ppid) if ppid == root => return true,
            Some(&ppid) if ppid > 1 => at = ppid,
            _ => return false,
        }
    }
    false
}

/// A process's resident memory, from `/proc/<pid>/status`, in KiB.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rss {
    /// `VmRSS`: resident now.
    pub(crate) now_kib: u64,
    /// `VmHWM`: the most it has been resident since it started.
    pub(crate) peak_kib: u64,
}

impl Rss {
    /// The memory of `pid` (its main process only: not nginx's workers); `None` when it is
    /// gone or `/proc` is unreadable.
    pub(crate) fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        };
        Some(Self {
            now_kib: field("VmRSS:")?,
            peak_kib: field("VmHWM:")?,
        })
    }
}
