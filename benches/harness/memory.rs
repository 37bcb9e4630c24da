//! The memory mode (issue 6, item 4): the memory store's footprint at `max_entries` with
//! 1 KiB responses, and whether idemgate's RSS stays flat once the store is full.
//!
//! idemgate (memory store, `store.max_entries: N`, admin listener on a free port) in
//! front of an upstream that answers `POST /charges` with a 1024-byte body, driven by
//! the `miss` scenario (a fresh key per request) until about 3×N keys were written.
//! Every [`Plan::period`] the harness reads idemgate's `VmRSS` from `/proc/PID/status`
//! and `idemgate_store_entries`, `idemgate_store_bytes` and
//! `idemgate_store_evictions_total` (summed over its `reason`s) from its `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::procs::{self, Proc, Store, TempDir, Tuning};
use crate::{BoxError, load, report, servers};

/// The upstream's response body: 1 KiB of JSON.
pub(crate) const BODY_LEN: usize = 1024;
/// Without `--duration`, the run writes this many times `max_entries` keys (a smoke run:
/// [`SMOKE_ROUNDS`], the fill and as many evictions again)...
const ROUNDS: u64 = 3;
const SMOKE_ROUNDS: u64 = 2;
/// ...or stops after this long, whichever comes first.
const CAP: Duration = Duration::from_secs(60);
const SMOKE_CAP: Duration = Duration::from_secs(5);
/// RSS at the end within this fraction of RSS at full: "flat".
const FLAT: f64 = 0.10;
/// RSS growing by more than this fraction after the fill: a leak, the run fails.
const LEAK: f64 = 0.25;
/// The fixed part of an encoded record (`IN_FLIGHT_LEN` in `src/idempotency/record.rs`),
/// which idemgate counts in `idemgate_store_bytes` next to the body and the headers.
const RECORD_HEAD: usize = 58;
/// The fill counts as reached at this fraction of `max_entries`: above 16 Ki entries the
/// store is 16 shards of `max_entries / 16` (rounded down) each, and the in-flight
/// markers come and go.
const FULL_PERMILLE: usize = 999;

/// One memory run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// `store.max_entries`.
    pub(crate) entries: usize,
    /// Run for exactly this long; `None`: until [`ROUNDS`]×`entries` keys, at most
    /// [`CAP`] (a smoke run: [`SMOKE_ROUNDS`], [`SMOKE_CAP`]).
    pub(crate) duration: Option<Duration>,
    pub(crate) concurrency: usize,
    pub(crate) log_level: String,
    /// Short and small: checks that it runs and that the numbers are sane, no verdict.
    pub(crate) smoke: bool,
}

impl Plan {
    fn cap(&self) -> Duration {
        self.duration
            .unwrap_or(if self.smoke { SMOKE_CAP } else { CAP })
    }

    /// Answers after which the load stops (0: none, the duration decides).
    fn key_limit(&self) -> u64 {
        if self.duration.is_some() {
            0
        } else {
            self.rounds() * self.entries as u64
        }
    }

    fn rounds(&self) -> u64 {
        if self.smoke { SMOKE_ROUNDS } else { ROUNDS }
    }

    /// How often RSS and the store's gauges are read.
    fn period(&self) -> Duration {
        Duration::from_millis(if self.smoke { 100 } else { 500 })
    }

    /// Pass-through load before the fill: connections, buffers and the allocator's
    /// per-thread pages are in place, the store still empty.
    fn warmup(&self) -> Duration {
        Duration::from_millis(if self.smoke { 100 } else { 1000 })
    }

    /// Entries at which the store counts as full.
    fn full_at(&self) -> u64 {
        (self.entries * FULL_PERMILLE / 1000).max(1) as u64
    }
}

/// idemgate's state at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    /// Seconds since the `miss` load started.
    t: f64,
    rss_kib: u64,
    entries: u64,
    /// `idemgate_store_bytes`: idemgate's own count of the records' bytes.
    bytes: u64,
    evictions: u64,
    /// Requests answered so far by the `miss` load.
    keys: u64,
}

impl Sample {
    fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    fn line(&self) -> String {
        format!(
            "  {:>6.1} s  RSS {:>7.1} MiB  entries {:>8}  idemgate_store_bytes {:>7.1} MiB  evictions {:>8}  keys {:>8}",
            self.t,
            self.rss_mib(),
            self.entries,
            self.bytes as f64 / (1024.0 * 1024.0),
            self.evictions,
            self.keys,
        )
    }
}

/// The store's gauges from `/metrics`.
#[derive(Debug, Clone, Copy)]
struct StoreGauges {
    entries: u64,
    bytes: u64,
    evictions: u64,
}

/// Runs the memory mode. `Ok(false)`: it ran, but a check failed.
pub(crate) async fn run(plan: &Plan) -> Result<bool, BoxError> {
    // Dropped last: idemgate writes its log into it until it stops.
    let dir = TempDir::new()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let upstream = listener.local_addr()?;
    let body = servers::padded_body(BODY_LEN);
    if body.len() != BODY_LEN {
        return Err(format!("the upstream body is {} bytes, not {BODY_LEN}", body.len()).into());
    }
    let upstream_task = tokio::spawn(servers::upstream(listener, body));

    let idemgate = procs::idemgate_bin()?;
    let config = dir.path().join("idemgate-memory.yaml");
    let mut admin_port = 0;
    let (mut proc, addr) = procs::spawn_server("idemgate-memory", dir.path(), false, |port| {
        admin_port = loop {
            let admin = procs::free_port()?;
            if admin != port {
                break admin;
            }
        };
        let tuning = Tuning {
            max_entries: Some(plan.entries),
            admin_port: Some(admin_port),
            ..Tuning::default()
        };
        std::fs::write(
            &config,
            procs::idemgate_yaml(
                port,
                upstream,
                Store::Memory,
                &plan.log_level,
                tuning,
                dir.path(),
            ),
        )?;
        let mut cmd = std::process::Command::new(&idemgate);
        cmd.arg("--config").arg(&config);
        Ok(cmd)
    })
    .await?;
    let pid = proc.pid();

    if !plan.smoke {
        report::machine(&idemgate, None, None, None, None);
    }
    println!(
        "memory: idemgate on the memory store, store.max_entries {}, log.level {}; upstream {upstream} answers 201 with a {BODY_LEN}-byte JSON body",
        plan.entries, plan.log_level,
    );
    let limit = plan.key_limit();
    println!(
        "load: miss (POST /charges, a fresh Idempotency-Key each), {} keep-alive connections, {}; VmRSS and /metrics every {:.1} s",
        plan.concurrency,
        if limit > 0 {
            format!(
                "until {limit} keys ({}×max_entries) or {:.0} s",
                plan.rounds(),
                plan.cap().as_secs_f64()
            )
        } else {
            format!("for {:.1} s", plan.cap().as_secs_f64())
        },
        plan.period().as_secs_f64(),
    );
    println!("started: idemgate-memory pid {pid}, admin 127.0.0.1:{admin_port}");

    // The admin listener starts next to the proxy's; give it a moment.
    let ready_by = Instant::now() + Duration::from_secs(5);
    let gauges = loop {
        match store_gauges(admin_port).await {
            Ok(gauges) => break gauges,
            Err(err) if Instant::now() > ready_by => {
                return Err(format!(
                    "idemgate's /metrics on 127.0.0.1:{admin_port}: {err}\n{}",
                    proc.log_tail()
                )
                .into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let idle = rss_kib(pid)?;

    // Pass-through load: the store stays empty.
    let warm_plan = Arc::new(load::Plan {
        addr,
        path: "/unguarded",
        keys: load::Keys::None,
        authorization: load::AUTHORIZATION,
        expect_replayed: false,
        delay_ms: None,
        body: bytes::Bytes::from_static(load::REQUEST_BODY.as_bytes()),
        concurrency: plan.concurrency,
        warmup: Duration::ZERO,
        duration: plan.warmup(),
        progress: None,
    });
    let warm_outcome = load::run(warm_plan).await;
    alive(&mut proc)?;
    let warm = rss_kib(pid)?;
    let warm_gauges = store_gauges(admin_port).await?;

    // The fill and beyond.
    let nonce = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    );
    let progress = Arc::new(load::Progress::with_limit(limit));
    let miss_plan = Arc::new(load::Plan {
        addr,
        path: "/charges",
        keys: load::Keys::Fresh(format!("mem-{nonce}")),
        authorization: load::AUTHORIZATION,
        expect_replayed: false,
        delay_ms: None,
        body: bytes::Bytes::from_static(load::REQUEST_BODY.as_bytes()),
        concurrency: plan.concurrency,
        warmup: Duration::ZERO,
        duration: plan.cap(),
        progress: Some(Arc::clone(&progress)),
    });
    let started = Instant::now();
    let run = tokio::spawn(async move {
        let outcome = load::run(miss_plan).await;
        (outcome, started.elapsed())
    });
    // Without `--duration` the run is short; with it, print at most ~60 lines.
    let stride = (plan.cap().as_secs_f64() / plan.period().as_secs_f64() / 60.0).ceil() as usize;
    let stride = stride.max(1);
    let mut ticker = tokio::time::interval(plan.period());
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut samples: Vec<Sample> = Vec::new();
    let mut full: Option<usize> = None;
    let mut last_loaded: Option<usize> = None;
    println!();
    loop {
        ticker.tick().await;
        let done = run.is_finished();
        alive(&mut proc)?;
        let gauges = store_gauges(admin_port).await?;
        let sample = Sample {
            t: started.elapsed().as_secs_f64(),
            rss_kib: rss_kib(pid)?,
            entries: gauges.entries,
            bytes: gauges.bytes,
            evictions: gauges.evictions,
            keys: progress.completed(),
        };
        let index = samples.len();
        samples.push(sample);
        let first_full = full.is_none() && sample.entries >= plan.full_at();
        if first_full {
            full = Some(index);
        }
        if index.is_multiple_of(stride) || first_full || done {
            println!(
                "{}{}",
                sample.line(),
                if first_full {
                    "  <- full"
                } else if done {
                    "  (load stopped)"
                } else {
                    ""
                }
            );
        }
        if done {
            break;
        }
        last_loaded = Some(index);
    }
    let (outcome, load_took) = run.await?;
    let peak_kib = status_kib(pid, "VmHWM").unwrap_or(0);
    upstream_task.abort();

    let mut problems = Vec::new();
    if outcome.failures() > 0 || warm_outcome.failures() > 0 {
        problems.push(format!(
            "{} failed requests ({} non-2xx, {} transport errors, {} replays); first: {}",
            outcome.failures() + warm_outcome.failures(),
            outcome.non_2xx + warm_outcome.non_2xx,
            outcome.transport_errors + warm_outcome.transport_errors,
            outcome.replay_mismatches + warm_outcome.replay_mismatches,
            outcome
                .first_problem
                .as_deref()
                .or(warm_outcome.first_problem.as_deref())
                .unwrap_or("?"),
        ));
    }
    if gauges.entries != 0 || warm_gauges.entries != 0 {
        problems.push(format!(
            "the store held {} entries before the fill (want 0: /unguarded is not guarded)",
            warm_gauges.entries.max(gauges.entries)
        ));
    }
    let after = samples.last().copied().unwrap_or_default();
    let end = last_loaded.map_or(after, |i| samples[i]);
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    println!("RSS before load:          {:>7.1} MiB (idle)", mib(idle));
    println!(
        "RSS after pass-through:   {:>7.1} MiB ({:.1} s of /unguarded, {} requests; store empty)",
        mib(warm),
        plan.warmup().as_secs_f64(),
        warm_outcome.completed,
    );
    let Some(full) = full.map(|i| samples[i]) else {
        problems.push(format!(
            "the store never reached {} entries (max {}) within {:.1} s: {} keys written",
            plan.full_at(),
            samples.iter().map(|s| s.entries).max().unwrap_or(0),
            load_took.as_secs_f64(),
            outcome.completed,
        ));
        return Ok(finish(&problems));
    };
    println!(
        "RSS at full:              {:>7.1} MiB at {:.1} s: {} entries after {} keys",
        full.rss_mib(),
        full.t,
        full.entries,
        full.keys,
    );
    let growth = end.rss_kib as f64 / full.rss_kib.max(1) as f64 - 1.0;
    let peak_after_fill = samples
        .iter()
        .filter(|s| s.t >= full.t && s.t <= end.t)
        .map(|s| s.rss_kib)
        .max()
        .unwrap_or(end.rss_kib);
    println!(
        "RSS at the end:           {:>7.1} MiB at {:.1} s, last sample under load: {} keys ({:.1}×N), {} evictions; {:+.1} % since full (highest after the fill {:.1} MiB, VmHWM {:.1} MiB)",
        end.rss_mib(),
        end.t,
        end.keys,
        end.keys as f64 / plan.entries as f64,
        end.evictions,
        growth * 100.0,
        mib(peak_after_fill),
        mib(peak_kib),
    );
    println!(
        "RSS after the load:       {:>7.1} MiB, idle, {} entries",
        after.rss_mib(),
        after.entries,
    );
    let per_entry = |from_kib: u64| {
        (full.rss_kib as f64 - from_kib as f64) * 1024.0 / full.entries.max(1) as f64
    };
    let payload = after.bytes as f64 / after.entries.max(1) as f64;
    println!(
        "footprint per entry:      {:>7.0} B = (RSS at full − RSS before) / {} entries ({:.0} B from the pass-through RSS)",
        per_entry(idle),
        full.entries,
        per_entry(warm),
    );
    println!(
        "payload per entry:        {payload:>7.0} B = idemgate_store_bytes / entries: the {BODY_LEN}-byte body, the stored headers, a {} B record head; plus the 32-byte key. Footprint / payload: {:.2}×",
        RECORD_HEAD,
        per_entry(idle) / payload.max(1.0),
    );
    println!(
        "load: {} miss requests in {:.1} s ({:.0} req/s), {} failed",
        outcome.completed,
        load_took.as_secs_f64(),
        outcome.completed as f64 / load_took.as_secs_f64().max(1e-9),
        outcome.failures(),
    );
    let verdict = if growth.abs() <= FLAT {
        "flat"
    } else if growth > 0.0 {
        "grew"
    } else {
        "shrank"
    };
    if plan.smoke {
        println!(
            "verdict: {verdict} ({:+.1} % after the fill; not judged at smoke size)",
            growth * 100.0
        );
        // Sane numbers: RSS read, the 1 KiB body stored once per entry.
        if idle == 0 || full.rss_kib == 0 || end.rss_kib == 0 {
            problems.push("VmRSS read as 0".to_owned());
        }
        if !(BODY_LEN as f64..BODY_LEN as f64 + 512.0).contains(&payload) {
            problems.push(format!(
                "{payload:.0} B of payload per entry, want the {BODY_LEN}-byte body plus a little"
            ));
        }
    } else {
        println!(
            "verdict: {verdict} (the end RSS is {:+.1} % from the RSS at full; flat: within ±{:.0} %; above +{:.0} % fails)",
            growth * 100.0,
            FLAT * 100.0,
            LEAK * 100.0,
        );
        if growth > LEAK {
            problems.push(format!(
                "RSS grew {:.1} % after the fill ({:.1} → {:.1} MiB): a leak?",
                growth * 100.0,
                full.rss_mib(),
                end.rss_mib()
            ));
        }
        if limit > 0 && outcome.completed < limit {
            println!(
                "note: the {:.0} s cap ended the run before {limit} keys",
                plan.cap().as_secs_f64()
            );
        }
    }
    Ok(finish(&problems))
}

/// Prints every problem; `true` when there is none.
fn finish(problems: &[String]) -> bool {
    for problem in problems {
        eprintln!("PROBLEM memory: {problem}");
    }
    problems.is_empty()
}

fn alive(proc: &mut Proc) -> Result<(), BoxError> {
    crate::alive(std::slice::from_mut(proc)).map_err(BoxError::from)
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> Result<u64, BoxError> {
    status_kib(pid, "VmRSS").ok_or_else(|| format!("no VmRSS in /proc/{pid}/status").into())
}

/// A `kB` field of `/proc/PID/status`.
pub(crate) fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix(field)?
            .strip_prefix(':')?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })
}

/// The memory store's gauges, from idemgate's admin `/metrics`.
async fn store_gauges(admin_port: u16) -> Result<StoreGauges, BoxError> {
    let metrics = procs::scrape(admin_port).await?;
    Ok(StoreGauges {
        entries: procs::metric(&metrics, "idemgate_store_entries")?,
        bytes: procs::metric(&metrics, "idemgate_store_bytes")?,
        // Counted by `reason` since store.max_entries_per_scope (docs/behaviour.md §17):
        // `full` and `scope_quota`, summed; this mode sets no quota.
        evictions: procs::metric_sum(&metrics, "idemgate_store_evictions_total"),
    })
}
