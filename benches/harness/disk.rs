//! The disk mode (issue 12, item 4): whether the file store's directory stays flat under
//! a steady load of fresh keys with a short `ttl`.
//!
//! idemgate (file store, `fsync` as asked, `idempotency.ttl` short, admin listener on a
//! free port) driven by the `miss` scenario (a fresh key per request) for the whole
//! run. Every second the harness reads the size of the store's directory (the sum of
//! its files' allocated blocks, as `du` counts them) and `idemgate_store_entries`,
//! `idemgate_store_disk_bytes` and `idemgate_store_expired_total` from `/metrics`. Once
//! three ttls have passed, expiry keeps pace with the load; from then on the directory
//! should not grow.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::procs::{self, Store, TempDir, Tuning};
use crate::{BoxError, load, report, servers};

/// Growth of the directory's peak from the first half of the steady period to the
/// second within this fraction: flat. Peaks, not end points: a store that compacts (the
/// journal) saws up and down, and its size at one instant says little.
const FLAT: f64 = 0.10;

#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) ttl: Duration,
    pub(crate) duration: Duration,
    pub(crate) concurrency: usize,
    pub(crate) fsync: bool,
    pub(crate) log_level: String,
    pub(crate) smoke: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    t: f64,
    dir_bytes: u64,
    file_bytes: u64,
    entries: u64,
    expired: u64,
    keys: u64,
}

pub(crate) async fn run(plan: &Plan) -> Result<bool, BoxError> {
    let dir = TempDir::new()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let upstream = listener.local_addr()?;
    let upstream_task = tokio::spawn(servers::upstream(
        listener,
        bytes::Bytes::from_static(servers::RESPONSE_BODY.as_bytes()),
    ));
    let idemgate = procs::idemgate_bin()?;
    let config = dir.path().join("idemgate-file.yaml");
    let mut admin_port = 0;
    let (mut proc, addr) = procs::spawn_server("idemgate-file", dir.path(), false, |port| {
        admin_port = loop {
            let admin = procs::free_port()?;
            if admin != port {
                break admin;
            }
        };
        let tuning = Tuning {
            admin_port: Some(admin_port),
            ttl: Some(plan.ttl),
            ..Tuning::default()
        };
        let store = Store::File {
            fsync: plan.fsync,
            other: false,
        };
        std::fs::write(
            &config,
            procs::idemgate_yaml(port, upstream, store, &plan.log_level, tuning, dir.path()),
        )?;
        let mut cmd = std::process::Command::new(&idemgate);
        cmd.arg("--config").arg(&config);
        Ok(cmd)
    })
    .await?;
    let store_dir = procs::file_store_dir(dir.path(), plan.fsync);
    if !plan.smoke {
        report::machine(&idemgate, None, None, None, None);
    }
    println!(
        "disk: idemgate on the file store (fsync {}), idempotency.ttl {:.1} s; load: miss (a fresh key each), {} keep-alive connections, {:.0} s; directory size and /metrics every second",
        plan.fsync,
        plan.ttl.as_secs_f64(),
        plan.concurrency,
        plan.duration.as_secs_f64(),
    );
    let ready_by = Instant::now() + Duration::from_secs(5);
    while let Err(err) = procs::scrape(admin_port).await {
        if Instant::now() > ready_by {
            return Err(format!("/metrics on 127.0.0.1:{admin_port}: {err}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let progress = Arc::new(load::Progress::with_limit(0));
    let nonce = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    );
    let miss = Arc::new(load::Plan {
        addr,
        path: "/charges",
        keys: load::Keys::Fresh(format!("disk-{nonce}")),
        authorization: load::AUTHORIZATION,
        expect_replayed: false,
        delay_ms: None,
        body: bytes::Bytes::from_static(load::REQUEST_BODY.as_bytes()),
        concurrency: plan.concurrency,
        warmup: Duration::ZERO,
        duration: plan.duration,
        progress: Some(Arc::clone(&progress)),
    });
    let started = Instant::now();
    let run = tokio::spawn(load::run(miss));
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut samples = Vec::new();
    let stride = (plan.duration.as_secs() / 40).max(1) as usize;
    println!();
    loop {
        ticker.tick().await;
        let done = run.is_finished();
        crate::alive(std::slice::from_mut(&mut proc))?;
        let metrics = procs::scrape(admin_port).await?;
        let sample = Sample {
            t: started.elapsed().as_secs_f64(),
            dir_bytes: dir_size(&store_dir),
            file_bytes: procs::metric(&metrics, "idemgate_store_disk_bytes")?,
            entries: procs::metric(&metrics, "idemgate_store_entries")?,
            expired: procs::metric(&metrics, "idemgate_store_expired_total")?,
            keys: progress.completed(),
        };
        if samples.len().is_multiple_of(stride) || done {
            println!(
                "  {:>6.1} s  directory {:>8.2} MiB  file {:>8.2} MiB  entries {:>7}  expired {:>8}  keys {:>8}",
                sample.t,
                mib(sample.dir_bytes),
                mib(sample.file_bytes),
                sample.entries,
                sample.expired,
                sample.keys,
            );
        }
        samples.push(sample);
        if done {
            break;
        }
    }
    let outcome = run.await?;
    upstream_task.abort();

    let mut problems = Vec::new();
    if outcome.failures() > 0 {
        problems.push(format!(
            "{} failed requests; first: {}",
            outcome.failures(),
            outcome.first_problem.as_deref().unwrap_or("?")
        ));
    }
    let steady_at = 3.0 * plan.ttl.as_secs_f64() + 2.0;
    let end = samples.last().copied().unwrap_or_default();
    let Some(steady) = samples.iter().copied().find(|s| s.t >= steady_at) else {
        println!("the run ended before the steady point ({steady_at:.0} s): no verdict");
        return Ok(problems.is_empty() && report_problems(&problems));
    };
    let peak = samples.iter().map(|s| s.dir_bytes).max().unwrap_or(0);
    let middle = (steady.t + end.t) / 2.0;
    let peak_in = |from: f64, to: f64| {
        samples
            .iter()
            .filter(|s| s.t >= from && s.t < to)
            .map(|s| s.dir_bytes)
            .max()
            .unwrap_or(0)
    };
    let (first, second) = (peak_in(steady.t, middle), peak_in(middle, f64::INFINITY));
    let growth = second as f64 / first.max(1) as f64 - 1.0;
    let rate = outcome.completed as f64 / plan.duration.as_secs_f64().max(1e-9);
    println!();
    println!(
        "load: {} miss requests in {:.0} s ({rate:.0} req/s), {} failed; about {:.0} live keys at a time (rate × ttl)",
        outcome.completed,
        plan.duration.as_secs_f64(),
        outcome.failures(),
        rate * plan.ttl.as_secs_f64(),
    );
    println!(
        "directory at {:.0} s (3 ttls): {:.2} MiB, {} entries; at the end ({:.0} s): {:.2} MiB, {} entries; highest {:.2} MiB",
        steady.t,
        mib(steady.dir_bytes),
        steady.entries,
        end.t,
        mib(end.dir_bytes),
        end.entries,
        mib(peak),
    );
    println!(
        "highest from {:.0} s to {middle:.0} s: {:.2} MiB; from {middle:.0} s to the end: {:.2} MiB",
        steady.t,
        mib(first),
        mib(second),
    );
    println!(
        "growth of the highest after the steady point: {:+.1} % while {} more keys were written ({} expired in all)",
        growth * 100.0,
        end.keys.saturating_sub(steady.keys),
        end.expired,
    );
    let flat = growth <= FLAT;
    println!(
        "verdict: {}{}",
        if flat { "flat" } else { "grew" },
        if plan.smoke {
            " (not judged at smoke size)"
        } else {
            ""
        }
    );
    if !flat && !plan.smoke {
        problems.push(format!(
            "the directory's highest grew {:+.1} % after the steady point",
            growth * 100.0
        ));
    }
    Ok(report_problems(&problems))
}

fn report_problems(problems: &[String]) -> bool {
    for problem in problems {
        eprintln!("PROBLEM disk: {problem}");
    }
    problems.is_empty()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The blocks allocated to the files of `dir`, in bytes (what `du` reports).
fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}
