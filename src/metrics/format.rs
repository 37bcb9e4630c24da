//! The two text formats `/metrics` speaks: OpenMetrics, which prometheus-client writes,
//! and the Prometheus text format 0.0.4, made from it.

/// The text formats `/metrics` speaks. Prometheus asks for OpenMetrics; curl, `promtool
/// check metrics` and older agents read the Prometheus text format 0.0.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/openmetrics-text; version=1.0.0`
    OpenMetrics,
    /// `text/plain; version=0.0.4`
    PrometheusText,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The Prometheus text format 0.0.4 of an OpenMetrics exposition. The samples are the
/// same; what differs is the family name of a counter, which OpenMetrics writes without
/// its `_total` suffix in `# HELP` and `# TYPE` (0.0.4 readers then see samples with no
/// help or type), and the `# UNIT` and `# EOF` lines, which 0.0.4 does not have.
pub(super) fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let family = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            Some((prefix, name, tail))
        });
        match family {
            Some((prefix, name, tail)) if counters.contains(name) => {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str("_total ");
                out.push_str(tail);
            }
            // 0.0.4 calls OpenMetrics' `unknown` type `untyped`.
            Some((prefix, name, "unknown")) if *prefix == "# TYPE " => {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str(" untyped");
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}
