//! The Prometheus alerts (`deploy/prometheus/`) and the Grafana dashboard
//! (`deploy/grafana/`) of issue 15, against the real binary: promtool checks and
//! unit-tests the rules, a running idemgate's `/metrics` passes `promtool check metrics`,
//! and every metric name and label value the rules and the dashboard query is one that a
//! running idemgate exports.

use crate::support;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::TestClient;
use support::bin::{LIMIT, Running, TempConfig, free_port};
use tokio::io::AsyncWriteExt;

fn path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// What a running `idemgate` (the real binary, memory store, admin listener on a free
/// port) answers on `/metrics` to a client that sends `accept`, or none. The process is
/// stopped with SIGTERM before this returns.
async fn scrape(accept: Option<&str>) -> String {
    scrape_with("", accept).await
}

/// [`scrape`], with `extra` (top-level YAML, such as a `store` section) in its config.
async fn scrape_with(extra: &str, accept: Option<&str>) -> String {
    const ATTEMPTS: usize = 5;
    for _ in 0..ATTEMPTS {
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let file = TempConfig::new(&format!(
            "upstream:\n  url: http://127.0.0.1:9\nadmin:\n  listen: {admin}\n{extra}"
        ));
        let config = file.path().to_str().expect("utf-8 path");
        let mut running = Running::start(&["--config", config]).await;
        // The proxy port accepts first; the admin listener is bound right after it.
        let deadline = Instant::now() + LIMIT;
        let bound = loop {
            if tokio::net::TcpStream::connect(admin).await.is_ok() {
                break true;
            }
            if running.stderr().contains("admin listener not started") {
                break false; // someone took the port in the meantime: try another
            }
            assert!(
                Instant::now() < deadline,
                "admin never listened:\n{}",
                running.stderr()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        if !bound {
            running.kill().await;
            continue;
        }
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let resp = TestClient::new(admin)
            .send("GET", "/metrics", &headers, "")
            .await;
        running.terminate().await;
        assert!(running.wait_exit().await.success(), "{}", running.stderr());
        assert_eq!(resp.status, 200);
        return resp.text();
    }
    panic!("no free admin port after {ATTEMPTS} attempts");
}

/// Sample names and, per label, the values seen, of an exposition.
#[derive(Debug, Default)]
struct Exported {
    names: BTreeSet<String>,
    labels: HashMap<String, BTreeSet<String>>,
}

impl Exported {
    fn parse(text: &str) -> Exported {
        let mut out = Exported::default();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let end = line.find(['{', ' ']).expect("a sample line");
            out.names.insert(line[..end].to_owned());
            if let Some(labels) = line[end..].strip_prefix('{') {
                let labels = &labels[..labels.find('}').expect("closing brace")];
                for pair in labels.split(',') {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    out.labels
                        .entry(k.to_owned())
                        .or_default()
                        .insert(v.trim_matches('"').to_owned());
                }
            }
        }
        out
    }
}

/// The `idemgate_*` names a PromQL expression uses.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            if word.starts_with("idemgate_") {
                names.push(std::mem::take(&mut word));
            }
            word.clear();
        }
    }
    names
}

/// The values an expression matches `label` against (`label="a"`, `label=~"a|b"`).
fn matched_values(expr: &str, label: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in expr.match_indices(label) {
        let before = expr[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = expr[at + label.len()..].trim_start();
        let Some(rest) = rest.strip_prefix("=~").or_else(|| rest.strip_prefix('=')) else {
            continue;
        };
        let Some(quoted) = rest.trim_start().strip_prefix('"') else {
            continue;
        };
        let value = &quoted[..quoted.find('"').expect("closing quote")];
        out.extend(value.split('|').map(str::to_owned));
    }
    out
}

/// Checks that everything `exprs` query is exported.
fn assert_exported(what: &str, exprs: &[String], exported: &Exported) {
    assert!(!exprs.is_empty(), "{what}: no queries found");
    for expr in exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what}: no idemgate metric in {expr}");
        for name in names {
            assert!(
                exported.names.contains(&name),
                "{what} queries {name}, which idemgate does not export: {expr}"
            );
        }
        for label in ["outcome", "op"] {
            for value in matched_values(expr, label) {
                assert!(
                    exported
                        .labels
                        .get(label)
                        .is_some_and(|v| v.contains(&value)),
                    "{what} matches {label}=\"{value}\", which idemgate never exports: {expr}"
                );
            }
        }
    }
}

fn alert_rules() -> Vec<Value> {
    let rules: Value =
        serde_saphyr::from_str(&read("deploy/prometheus/alerts.yaml")).expect("YAML");
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .collect()
}

/// Every `expr` anywhere in the dashboard (panels, their targets, variables).
fn dashboard_queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

async fn promtool(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    let mut child = tokio::process::Command::new("promtool")
        .args(args)
        .current_dir(path("deploy/prometheus"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool: {e}; scripts/test.sh installs it (Debian package prometheus)")
        });
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input.as_bytes())
            .await
            .expect("write to promtool");
    }
    tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .expect("promtool finished")
        .expect("promtool output")
}

fn report(out: &std::process::Output) -> String {
    format!(
        "{}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn promtool_accepts_the_alert_rules_and_their_unit_tests_pass() {
    let check = promtool(&["check", "rules", "alerts.yaml"], None).await;
    assert!(
        check.status.success(),
        "promtool check rules: {}",
        report(&check)
    );
    let test = promtool(&["test", "rules", "alerts.test.yaml"], None).await;
    assert!(
        test.status.success(),
        "promtool test rules: {}",
        report(&test)
    );

    // Every alert has a unit test in which it fires.
    let tests: Value =
        serde_saphyr::from_str(&read("deploy/prometheus/alerts.test.yaml")).expect("YAML");
    let firing: BTreeSet<&str> = tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().expect("alert_rule_test"))
        .filter(|t| t["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|t| t["alertname"].as_str())
        .collect();
    for rule in alert_rules() {
        let name = rule["alert"].as_str().expect("alert name");
        assert!(
            firing.contains(name),
            "{name} has no unit test in which it fires"
        );
    }
}

#[tokio::test]
async fn the_metrics_of_a_running_idemgate_pass_promtool_check_metrics() {
    let text = scrape(None).await;
    let out = promtool(&["check", "metrics"], Some(&text)).await;
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}\n{text}",
        report(&out)
    );
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_query_is_exported() {
    // What Prometheus scrapes: it asks for OpenMetrics. (The samples are the same in the
    // text format 0.0.4; the unit tests of metrics.rs check that.)
    let exported = Exported::parse(&scrape(Some("application/openmetrics-text")).await);
    assert!(
        exported.names.contains("idemgate_requests_total"),
        "{exported:?}"
    );

    let alerts: Vec<String> = alert_rules()
        .iter()
        .map(|r| r["expr"].as_str().expect("expr").to_owned())
        .collect();
    assert_exported("deploy/prometheus/alerts.yaml", &alerts, &exported);

    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/idemgate.json")).expect("dashboard JSON");
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    assert_exported("deploy/grafana/idemgate.json", &queries, &exported);

    // The panels the issue asks for are there.
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for wanted in [
        "outcome",
        "Replay ratio",
        "Store latency",
        "Upstream latency",
        "In flight",
        "Evictions",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(wanted)),
            "no panel for {wanted}: {titles:?}"
        );
    }
}

#[test]
fn the_query_readers_find_names_and_label_values() {
    let expr = r#"sum(rate(idemgate_requests_total{job=~"$job", outcome=~"a|b"}[5m])) / rate(x_total{op="claim"}[1m])"#;
    assert_eq!(metric_names(expr), ["idemgate_requests_total"]);
    assert_eq!(matched_values(expr, "outcome"), ["a", "b"]);
    assert_eq!(matched_values(expr, "op"), ["claim"]);
    assert!(matched_values("sum by (outcome) (x)", "outcome").is_empty());
}

/// The metric families of an exposition in the text format 0.0.4, as (name, type):
/// counters under their `_total` name.
fn families(text: &str) -> BTreeSet<(String, String)> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.trim().to_owned()))
        .collect()
}

/// The code spans of a Markdown table cell or list item, in order.
fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// docs/metrics.md is the reference of `/metrics`: its table lists every family a running
/// idemgate exports (memory, file and postgres store), with its type, and nothing else;
/// its "Values of `outcome`" lists every value of `outcome`, and its table every value
/// of `op` and of `state`, that idemgate exports. The postgres store exports its
/// families whether or not its database answers, so none is started: its URL names a
/// port where nothing listens.
#[tokio::test]
async fn docs_metrics_lists_every_exported_family_and_label_value() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file_store = format!(
        "store:\n  kind: file\n  path: {}\n",
        dir.path().join("store").display()
    );
    let postgres_store = "store:\n  kind: postgres\n  url: postgres://idemgate@127.0.0.1:9/app\n";
    let memory = scrape(None).await;
    let file = scrape_with(&file_store, None).await;
    let postgres = scrape_with(postgres_store, None).await;
    let exported: BTreeSet<(String, String)> = [&memory, &file, &postgres]
        .into_iter()
        .flat_map(|text| families(text))
        .collect();
    let labels = Exported::parse(&format!("{memory}\n{file}\n{postgres}")).labels;

    let doc = read("docs/metrics.md");
    let mut documented = BTreeSet::new();
    let mut ops = Vec::new();
    let mut states = Vec::new();
    for line in doc.lines().filter(|line| line.starts_with("| `idemgate_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let names = code_spans(cells[1]);
        let kinds: Vec<&str> = cells[2].split(", ").collect();
        assert_eq!(names.len(), kinds.len(), "docs/metrics.md: {line}");
        for (name, kind) in names.into_iter().zip(kinds) {
            documented.insert((name, kind.to_owned()));
        }
        if let Some(values) = cells[3].strip_prefix("`op` = ") {
            ops = code_spans(values);
        }
        if let Some(values) = cells[3].strip_prefix("`state` = ") {
            states = code_spans(values);
        }
    }
    assert_eq!(
        documented.difference(&exported).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "docs/metrics.md lists families idemgate does not export (or with another type)"
    );
    assert_eq!(
        exported.difference(&documented).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "idemgate exports families docs/metrics.md does not list"
    );
    let op_values: BTreeSet<String> = ops.into_iter().collect();
    assert_eq!(
        Some(&op_values),
        labels.get("op"),
        "docs/metrics.md: the values of `op`"
    );
    let state_values: BTreeSet<String> = states.into_iter().collect();
    assert_eq!(
        Some(&state_values),
        labels.get("state"),
        "docs/metrics.md: the values of `state`"
    );

    // Each bullet of "Values of `outcome`" names values before its first "`:".
    let start = doc
        .find("Values of `outcome`")
        .expect("a list of outcome values");
    let end = doc[start..]
        .find("\n## ")
        .map_or(doc.len(), |end| start + end);
    let mut outcomes = BTreeSet::new();
    for item in doc[start..end].split("\n- ").skip(1) {
        let head = &item[..item.find("`:").map_or(0, |at| at + 1)];
        outcomes.extend(code_spans(head));
    }
    assert_eq!(
        Some(&outcomes),
        labels.get("outcome"),
        "docs/metrics.md: the values of `outcome`"
    );
}
