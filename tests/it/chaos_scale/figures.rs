//! What a scale run measured, from the upstream's own ledger of executions and what the
//! clients saw: the table it prints, and its JSON line.

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::chaos::Execution;

use super::Settings;
use super::load::{Answer, KeyLog, key_name};
use super::topology::Kind;

/// One failover: when the master was killed, when the new one was seen, and when the
/// old node replicated again.
#[derive(Debug, Clone)]
pub(super) struct Failover {
    pub(super) what: String,
    pub(super) killed: Instant,
    pub(super) promoted: Instant,
    pub(super) rejoined: Instant,
}

#[derive(Debug)]
pub(super) struct Figures {
    pub(super) keys: usize,
    pub(super) executions: usize,
    pub(super) executed_twice: usize,
    /// Keys the first pass left without a first execution or a replay.
    pub(super) no_answer: usize,
    /// Of those, keys answered `outcome-unknown` (the rest ran out of time).
    pub(super) outcome_unknown: usize,
    /// Keys settled by a first execution or a replay that the upstream executed again
    /// afterwards: their record was lost.
    pub(super) records_lost: usize,
    /// Keys answered 2xx that the upstream never executed.
    pub(super) answered_unexecuted: usize,
    pub(super) unexpected: u32,
    pub(super) retried: u64,
    pub(super) failovers: usize,
    /// Per failover: from the kill to the last answer of a key that was waiting at the
    /// kill or sent before the new master was seen.
    pub(super) windows: Vec<Duration>,
    pub(super) latency_outside: (Duration, Duration),
    pub(super) latency_during: (Duration, Duration),
    /// Examples of keys gone wrong, for failure messages.
    pub(super) findings: Vec<String>,
}

impl Figures {
    pub(super) fn window(&self) -> Duration {
        self.windows.iter().copied().max().unwrap_or_default()
    }
}

pub(super) fn measure(
    first: &[KeyLog],
    second: &[KeyLog],
    ledger: &[Execution],
    failovers: &[Failover],
) -> Figures {
    let mut executions: HashMap<&str, Vec<Instant>> = HashMap::new();
    for e in ledger {
        executions.entry(e.key.as_str()).or_default().push(e.at);
    }
    let mut findings = Vec::new();
    let (mut records_lost, mut answered_unexecuted) = (0, 0);
    for (n, key) in first.iter().enumerate() {
        let name = key_name(n);
        let ran = executions.get(name.as_str()).map_or(&[][..], Vec::as_slice);
        if let Some(at) = key.definitive() {
            if ran.is_empty() {
                answered_unexecuted += 1;
                findings.push(format!("{name}: answered, never executed: {key:?}"));
            }
            if ran.iter().any(|e| *e > at) {
                records_lost += 1;
                findings.push(format!("{name}: executed again after its answer: {key:?}"));
            }
        }
        if ran.len() > 1 {
            findings.push(format!(
                "{name}: executed {} times; first pass {key:?}, second {:?}",
                ran.len(),
                second.get(n)
            ));
        }
    }
    let during = |sent: Instant, done: Instant| {
        failovers
            .iter()
            .any(|f| sent <= f.rejoined && done >= f.killed)
    };
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for k in first {
        if let (Some(sent), Some(done)) = (k.first_sent, k.definitive()) {
            if during(sent, done) {
                inside.push(done - sent);
            } else {
                outside.push(done - sent);
            }
        }
    }
    let windows = failovers
        .iter()
        .map(|f| {
            first
                .iter()
                .filter_map(|k| Some((k.first_sent?, k.answered?.0)))
                .filter(|(sent, done)| *sent <= f.promoted && *done >= f.killed)
                .map(|(sent, done)| done - sent.max(f.killed))
                .max()
                .unwrap_or_default()
        })
        .collect();
    findings.truncate(20);
    Figures {
        keys: first.len(),
        executions: ledger.len(),
        executed_twice: executions.values().filter(|e| e.len() > 1).count(),
        no_answer: first.iter().filter(|k| k.definitive().is_none()).count(),
        outcome_unknown: first
            .iter()
            .filter(|k| matches!(k.answered, Some((_, Answer::OutcomeUnknown))))
            .count(),
        records_lost,
        answered_unexecuted,
        unexpected: first.iter().chain(second).map(|k| k.unexpected).sum(),
        retried: first.iter().map(|k| u64::from(k.retried)).sum(),
        failovers: failovers.len(),
        windows,
        latency_outside: percentiles(&mut outside),
        latency_during: percentiles(&mut inside),
        findings,
    }
}

/// p50 and p99.
fn percentiles(all: &mut [Duration]) -> (Duration, Duration) {
    if all.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    all.sort();
    let at = |p: usize| all[(all.len() * p / 100).min(all.len() - 1)];
    (at(50), at(99))
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// The table, one `name | value` row per figure, then the JSON line.
pub(super) fn render(settings: &Settings, f: &Figures, wall: Duration) -> (String, String) {
    let windows: Vec<String> = f
        .windows
        .iter()
        .map(|w| format!("{:.2}", w.as_secs_f64()))
        .collect();
    let rows = [
        ("topology", settings.describe()),
        ("keys", f.keys.to_string()),
        ("executions", f.executions.to_string()),
        ("keys executed twice or more", f.executed_twice.to_string()),
        ("keys without a definitive answer", f.no_answer.to_string()),
        ("  of which outcome-unknown", f.outcome_unknown.to_string()),
        ("records lost", f.records_lost.to_string()),
        (
            "answered but never executed",
            f.answered_unexecuted.to_string(),
        ),
        ("unexpected answers", f.unexpected.to_string()),
        ("attempts retried", f.retried.to_string()),
        ("failovers", f.failovers.to_string()),
        ("window per failover (s)", windows.join(", ")),
        (
            "p50 / p99 outside failovers (ms)",
            format!("{} / {}", ms(f.latency_outside.0), ms(f.latency_outside.1)),
        ),
        (
            "p50 / p99 during failovers (ms)",
            format!("{} / {}", ms(f.latency_during.0), ms(f.latency_during.1)),
        ),
        ("wall time (s)", format!("{:.1}", wall.as_secs_f64())),
    ];
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let table = rows
        .iter()
        .map(|(name, value)| format!("{name:<width$} | {value}"))
        .collect::<Vec<_>>()
        .join("\n");
    let json = serde_json::json!({
        "topology": settings.kind.name(),
        "min_replicas": (settings.kind != Kind::Postgres).then_some(settings.min_replicas),
        "async_standby": settings.async_standby,
        "keys": f.keys,
        "executions": f.executions,
        "executed_twice": f.executed_twice,
        "no_answer": f.no_answer,
        "outcome_unknown": f.outcome_unknown,
        "records_lost": f.records_lost,
        "answered_unexecuted": f.answered_unexecuted,
        "unexpected": f.unexpected,
        "failovers": f.failovers,
        "window_s": f.window().as_secs_f64(),
        "windows_s": f.windows.iter().map(Duration::as_secs_f64).collect::<Vec<_>>(),
        "p50_ms_outside": f.latency_outside.0.as_secs_f64() * 1000.0,
        "p99_ms_outside": f.latency_outside.1.as_secs_f64() * 1000.0,
        "p50_ms_during": f.latency_during.0.as_secs_f64() * 1000.0,
        "p99_ms_during": f.latency_during.1.as_secs_f64() * 1000.0,
        "wall_s": wall.as_secs_f64(),
    });
    (table, json.to_string())
}
