//! Results: the metric catalogue, medians over rounds, ratios to the baseline, the table
//! for people and the JSON for machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// Which direction is better, for the reader of a ratio.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Throughput, rates.
    Higher,
    /// Latency, memory, CPU.
    Lower,
}

/// One metric: its JSON key, how it is shown, whether only proxied scenarios have it.
#[derive(Clone, Debug, Serialize)]
pub struct MetricDef {
    /// JSON key (stable).
    pub key: String,
    /// Table label.
    pub label: String,
    /// Unit of the stored value.
    pub unit: &'static str,
    /// Which direction is better.
    pub better: Better,
    /// Only scenarios with proxies have it (memory and CPU of the proxies).
    pub proxy_only: bool,
    /// Divide the stored value by this for the table.
    #[serde(skip)]
    pub display_div: f64,
    /// Unit shown in the table.
    #[serde(skip)]
    pub display_unit: &'static str,
}

fn def(
    key: impl Into<String>,
    label: impl Into<String>,
    unit: &'static str,
    better: Better,
) -> MetricDef {
    MetricDef {
        key: key.into(),
        label: label.into(),
        unit,
        better,
        proxy_only: false,
        display_div: 1.0,
        display_unit: unit,
    }
}

/// The latency percentiles reported, as (key suffix, label, quantile).
pub const PERCENTILES: [(&str, &str, f64); 4] = [
    ("p50", "p50", 0.50),
    ("p90", "p90", 0.90),
    ("p99", "p99", 0.99),
    ("p999", "p99.9", 0.999),
];

/// JSON key of a latency percentile at `rate`.
pub fn latency_key(rate: u32, suffix: &str) -> String {
    format!("latency_{rate}rps_{suffix}_us")
}

/// JSON key of the achieved rate of the latency run at `rate`.
pub fn achieved_key(rate: u32) -> String {
    format!("latency_{rate}rps_achieved_rps")
}

/// Throughput keys by stream count.
pub fn throughput_key(streams: usize) -> String {
    format!("throughput_{streams}_streams_bps")
}

/// Connection rate key.
pub const CONN_RATE: &str = "connection_rate_cps";
/// Proxy RSS of freshly started proxies after one echo (sum over proxies).
pub const RSS_IDLE: &str = "proxy_rss_idle_kib";
/// Proxy RSS with the idle connections open (sum over proxies).
pub const RSS_CONNS: &str = "proxy_rss_with_idle_conns_kib";
/// Extra proxy memory per idle connection.
pub const PER_CONN: &str = "proxy_bytes_per_idle_conn";
/// RSS of the server node's ztunnel serving its one pod (fresh in-pod scenario).
pub const ENROL_RSS_BEFORE: &str = "ztunnel_rss_one_pod_kib";
/// The same after the extra pods were enrolled.
pub const ENROL_RSS_AFTER: &str = "ztunnel_rss_enrolled_pods_kib";
/// Extra ztunnel memory per enrolled pod.
pub const PER_POD: &str = "ztunnel_bytes_per_enrolled_pod";
/// Wall time of one CNI ADD (plugin → agent → rules → ztunnel ack), enrolling one pod after
/// another.
pub const ENROL_MS: &str = "cni_add_ms_per_pod";
/// Proxy CPU per GB moved (throughput runs).
pub const CPU_PER_GB: &str = "proxy_cpu_seconds_per_gb";

/// Every metric of a run, in report order.
pub fn catalogue(rates: &[u32], idle_conns: usize, enrolled_pods: usize) -> Vec<MetricDef> {
    let mut v = Vec::new();
    for streams in [1, 4] {
        v.push(MetricDef {
            display_div: 1e6,
            display_unit: "MB/s",
            ..def(
                throughput_key(streams),
                format!(
                    "throughput, {streams} stream{}",
                    if streams == 1 { "" } else { "s" }
                ),
                "B/s",
                Better::Higher,
            )
        });
    }
    for &rate in rates {
        for (suffix, label, _) in PERCENTILES {
            v.push(def(
                latency_key(rate, suffix),
                format!("latency {label} @ {rate} req/s"),
                "us",
                Better::Lower,
            ));
        }
        v.push(def(
            achieved_key(rate),
            format!("achieved rate @ {rate} req/s"),
            "req/s",
            Better::Higher,
        ));
    }
    v.push(def(CONN_RATE, "connection rate", "conn/s", Better::Higher));
    let proxy = |d: MetricDef| MetricDef {
        proxy_only: true,
        ..d
    };
    v.push(proxy(MetricDef {
        display_div: 1024.0,
        display_unit: "MiB",
        ..def(
            RSS_IDLE,
            "proxy RSS fresh, idle (sum)",
            "KiB",
            Better::Lower,
        )
    }));
    v.push(proxy(MetricDef {
        display_div: 1024.0,
        display_unit: "MiB",
        ..def(
            RSS_CONNS,
            format!("proxy RSS, {idle_conns} idle conns"),
            "KiB",
            Better::Lower,
        )
    }));
    v.push(proxy(def(
        PER_CONN,
        "proxy memory per idle conn",
        "B",
        Better::Lower,
    )));
    v.push(proxy(MetricDef {
        display_div: 1024.0,
        display_unit: "MiB",
        ..def(
            ENROL_RSS_BEFORE,
            "server node ztunnel RSS, 1 pod",
            "KiB",
            Better::Lower,
        )
    }));
    v.push(proxy(MetricDef {
        display_div: 1024.0,
        display_unit: "MiB",
        ..def(
            ENROL_RSS_AFTER,
            format!("server node ztunnel RSS, +{enrolled_pods} pods"),
            "KiB",
            Better::Lower,
        )
    }));
    v.push(proxy(def(
        PER_POD,
        "ztunnel memory per enrolled pod",
        "B",
        Better::Lower,
    )));
    v.push(proxy(def(
        ENROL_MS,
        "CNI ADD time per pod",
        "ms",
        Better::Lower,
    )));
    v.push(proxy(def(
        CPU_PER_GB,
        "proxy CPU per GB moved",
        "s/GB",
        Better::Lower,
    )));
    v
}

/// Samples of one scenario: metric key → one value per round.
pub type Samples = BTreeMap<String, Vec<f64>>;

/// Median (mean of the middle two for an even count); `None` for no samples.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 0 {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// The JSON report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Always "ambit-bench".
    pub tool: &'static str,
    /// UTC time the run started, RFC 3339.
    pub date: String,
    /// `git rev-parse --short HEAD` of the working directory, if any.
    pub commit: String,
    /// "smoke" or "full".
    pub mode: &'static str,
    /// Rounds per measurement (A B A B interleaved).
    pub rounds: usize,
    /// Machine facts that affect the figures.
    pub machine: Machine,
    /// The run's parameters.
    pub params: serde_json::Value,
    /// Metric definitions.
    pub metrics: Vec<MetricDef>,
    /// Results per scenario, in run order.
    pub scenarios: Vec<ScenarioReport>,
}

/// Machine facts.
#[derive(Debug, Serialize)]
pub struct Machine {
    /// CPUs available to this process.
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// `/proc/loadavg` at the start (other work on the machine shows here).
    pub loadavg_start: String,
    /// `/proc/loadavg` at the end.
    pub loadavg_end: String,
}

/// One scenario's results.
#[derive(Debug, Serialize)]
pub struct ScenarioReport {
    /// Name ("baseline", "ambit", ...).
    pub name: String,
    /// What ran.
    pub description: String,
    /// Metric key → result.
    pub metrics: BTreeMap<String, MetricResult>,
}

/// One metric of one scenario.
#[derive(Debug, Serialize)]
pub struct MetricResult {
    /// Median over rounds.
    pub median: f64,
    /// Every round's value, in order.
    pub samples: Vec<f64>,
    /// `median / baseline median` when a baseline ran and has the metric.
    pub ratio_to_baseline: Option<f64>,
}

/// Builds per-scenario results with medians and ratios; the scenario named "baseline" (if
/// any) is the reference.
pub fn summarize(names: &[(String, String)], samples: &[Samples]) -> Vec<ScenarioReport> {
    let baseline = names
        .iter()
        .position(|(n, _)| n == "baseline")
        .map(|i| &samples[i]);
    names
        .iter()
        .zip(samples)
        .map(|((name, description), s)| {
            let metrics = s
                .iter()
                .filter_map(|(key, values)| {
                    let median = median(values)?;
                    let reference = baseline.and_then(|b| median_of(b, key));
                    Some((
                        key.clone(),
                        MetricResult {
                            median,
                            samples: values.clone(),
                            ratio_to_baseline: reference
                                .filter(|r| *r != 0.0 && name != "baseline")
                                .map(|r| median / r),
                        },
                    ))
                })
                .collect();
            ScenarioReport {
                name: name.clone(),
                description: description.clone(),
                metrics,
            }
        })
        .collect()
}

fn median_of(samples: &Samples, key: &str) -> Option<f64> {
    samples.get(key).and_then(|v| median(v))
}

/// The table for people: one row per metric, one column per scenario (median, and the
/// ratio to the baseline; for latency also the added microseconds).
pub fn table(report: &Report) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["metric".to_string()];
    header.extend(report.scenarios.iter().map(|s| s.name.clone()));
    rows.push(header);
    let baseline = report.scenarios.iter().find(|s| s.name == "baseline");
    for m in &report.metrics {
        if report
            .scenarios
            .iter()
            .all(|s| !s.metrics.contains_key(&m.key))
        {
            continue;
        }
        let mut row = vec![format!("{} ({})", m.label, m.display_unit)];
        for s in &report.scenarios {
            let cell = match s.metrics.get(&m.key) {
                None => "-".to_string(),
                Some(r) => {
                    let mut c = fmt_value(r.median / m.display_div);
                    if let Some(ratio) = r.ratio_to_baseline {
                        let _ = write!(c, "  x{ratio:.2}");
                    }
                    let base = baseline.and_then(|b| b.metrics.get(&m.key));
                    if let (Some(b), "us", true) = (base, m.unit, s.name != "baseline") {
                        let _ = write!(c, " ({:+.0}us)", r.median - b.median);
                    }
                    c
                }
            };
            row.push(cell);
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (n, row) in rows.iter().enumerate() {
        for (i, cell) in row.iter().enumerate() {
            if i == 0 {
                let _ = write!(out, "{cell:<w$}", w = widths[i]);
            } else {
                let _ = write!(out, "  {cell:>w$}", w = widths[i]);
            }
        }
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
            out.push('\n');
        }
    }
    out
}

/// Three significant-ish digits without scientific notation.
pub fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The current UTC time as RFC 3339 (no clock crate needed for a timestamp).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn ratios_against_baseline() {
        let names = vec![
            ("baseline".to_string(), String::new()),
            ("ambit".to_string(), String::new()),
        ];
        let mut b = Samples::new();
        b.insert(CONN_RATE.into(), vec![100.0, 300.0, 200.0]);
        let mut a = Samples::new();
        a.insert(CONN_RATE.into(), vec![50.0]);
        a.insert(RSS_IDLE.into(), vec![1000.0]);
        let r = summarize(&names, &[b, a]);
        assert_eq!(r[0].metrics[CONN_RATE].median, 200.0);
        assert_eq!(r[0].metrics[CONN_RATE].ratio_to_baseline, None);
        assert_eq!(r[1].metrics[CONN_RATE].ratio_to_baseline, Some(0.25));
        assert_eq!(r[1].metrics[RSS_IDLE].ratio_to_baseline, None);
    }
}
