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

/// Connection rate key by parallel client loops.
pub fn conn_rate_key(clients: usize) -> String {
    format!("connection_rate_{clients}_clients_cps")
}
/// Connection rate of the sustained run (a fresh copy of the scenario, longer than TCP's
/// TIME-WAIT), over its whole length.
pub const SUSTAINED_RATE: &str = "connection_rate_sustained_cps";
/// The same in its slowest step.
pub const SUSTAINED_SLOWEST: &str = "connection_rate_sustained_slowest_step_cps";
/// The 99th percentile of the sustained run's connection times (connect to echo).
pub const SUSTAINED_CONN_P99: &str = "connection_time_sustained_p99_us";
/// Failed iterations of the sustained run (only reported when there were any).
pub const SUSTAINED_ERRORS: &str = "connection_errors_sustained";
/// Proxy CPU per completed connection (connection-rate runs).
pub const CPU_PER_CONN: &str = "proxy_cpu_us_per_conn";
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
/// CPU of the server node's agent with every extra pod enrolled, own plus waited-for
/// children, in % of one core.
pub const AGENT_CPU: &str = "agent_cpu_pct_enrolled_pods";
/// The children's part of it (rule tools started by the agent).
pub const AGENT_CHILD_CPU: &str = "agent_children_cpu_pct_enrolled_pods";
/// Proxy CPU per GB moved (throughput runs).
pub const CPU_PER_GB: &str = "proxy_cpu_seconds_per_gb";

/// The sustained connection-rate run of a report: its client loops, length and step.
#[derive(Clone, Copy, Debug)]
pub struct SustainedShape {
    /// Parallel client loops.
    pub clients: usize,
    /// Connections per second they offer together (0: as fast as they go).
    pub rate: u32,
    /// Length of the run, seconds.
    pub secs: f64,
    /// Length of a step, seconds.
    pub step_secs: f64,
}

/// Every metric of a run, in report order.
pub fn catalogue(
    rates: &[u32],
    conn_clients: &[usize],
    sustained: Option<SustainedShape>,
    idle_conns: usize,
    enrolled_pods: usize,
) -> Vec<MetricDef> {
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
    for &n in conn_clients {
        v.push(def(
            conn_rate_key(n),
            format!(
                "connection rate, {n} client{}",
                if n == 1 { "" } else { "s" }
            ),
            "conn/s",
            Better::Higher,
        ));
    }
    if let Some(SustainedShape {
        clients,
        rate,
        secs,
        step_secs,
    }) = sustained
    {
        let secs = fmt_value(secs);
        let step = fmt_value(step_secs);
        let offered = if rate > 0 {
            format!(" offering {rate}/s")
        } else {
            String::new()
        };
        v.push(def(
            SUSTAINED_RATE,
            format!("connection rate, {clients} clients{offered}, sustained {secs} s"),
            "conn/s",
            Better::Higher,
        ));
        v.push(def(
            SUSTAINED_SLOWEST,
            format!("  its slowest {step} s"),
            "conn/s",
            Better::Higher,
        ));
        v.push(def(
            SUSTAINED_CONN_P99,
            "  its connection time p99",
            "us",
            Better::Lower,
        ));
        v.push(def(
            SUSTAINED_ERRORS,
            "  its failed connections",
            "conns",
            Better::Lower,
        ));
    }
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
        AGENT_CPU,
        format!("agent CPU, {enrolled_pods} pods (% of a core)"),
        "%",
        Better::Lower,
    )));
    v.push(proxy(def(
        AGENT_CHILD_CPU,
        "of which its child processes",
        "%",
        Better::Lower,
    )));
    v.push(proxy(def(
        CPU_PER_GB,
        "proxy CPU per GB moved",
        "s/GB",
        Better::Lower,
    )));
    v.push(proxy(def(
        CPU_PER_CONN,
        "proxy CPU per new connection",
        "us",
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
    Some(if v.len().is_multiple_of(2) {
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
    /// Rounds per measurement (A B C A B C interleaved).
    pub rounds: usize,
    /// Machine facts that affect the figures.
    pub machine: Machine,
    /// The run's parameters.
    pub params: serde_json::Value,
    /// The scenario every `ratio_to_upstream` divides by (upstream ztunnel in in-pod mode),
    /// when it ran.
    pub upstream: Option<String>,
    /// Metric definitions.
    pub metrics: Vec<MetricDef>,
    /// Results per scenario, in run order.
    pub scenarios: Vec<ScenarioReport>,
    /// The aims of ambit against upstream (issue 15), judged on this run's medians.
    pub aims: Vec<AimResult>,
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
    /// How idle CPUs wait (cpuidle driver, governor, states, guest halt polling): it moves
    /// the latency-bound figures of every scenario, the baseline's too.
    pub cpuidle: String,
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
    /// `median / upstream median` when the upstream scenario ran and has the metric.
    pub ratio_to_upstream: Option<f64>,
    /// Latency only: `median - baseline median`, the latency the mesh adds.
    pub added_us: Option<f64>,
    /// Latency only: this scenario's added latency divided by upstream's.
    pub added_ratio_to_upstream: Option<f64>,
}

/// Whether `key` is a latency percentile (the mesh *adds* to the baseline's figure).
pub fn is_latency(key: &str) -> bool {
    key.starts_with("latency_") && key.ends_with("_us")
}

/// Builds per-scenario results with medians and ratios; the scenario named "baseline" (if
/// any) and the one named `upstream` (if given and present) are the references.
pub fn summarize(
    names: &[(String, String)],
    samples: &[Samples],
    upstream: Option<&str>,
) -> Vec<ScenarioReport> {
    let find = |want: &str| {
        names
            .iter()
            .position(|(n, _)| n == want)
            .map(|i| &samples[i])
    };
    let baseline = find("baseline");
    let reference = upstream.and_then(find);
    names
        .iter()
        .zip(samples)
        .map(|((name, description), s)| {
            let metrics = s
                .iter()
                .filter_map(|(key, values)| {
                    let median = median(values)?;
                    let base = baseline.and_then(|b| median_of(b, key));
                    let up = reference.and_then(|u| median_of(u, key));
                    let ratio = |r: Option<f64>, own: bool| {
                        r.filter(|r| *r != 0.0 && !own).map(|r| median / r)
                    };
                    let added = base.filter(|_| is_latency(key)).map(|b| median - b);
                    let up_added = up.zip(base).map(|(u, b)| u - b);
                    Some((
                        key.clone(),
                        MetricResult {
                            median,
                            samples: values.clone(),
                            ratio_to_baseline: ratio(base, name == "baseline"),
                            ratio_to_upstream: ratio(
                                up,
                                name == "baseline" || Some(name.as_str()) == upstream,
                            ),
                            added_us: added.filter(|_| name != "baseline"),
                            // Only when both added latency: a tail below the baseline's is
                            // noise, and a ratio of it would read as a win.
                            added_ratio_to_upstream: added
                                .zip(up_added)
                                .filter(|(a, u)| *a > 0.0 && *u > 0.0)
                                .filter(|_| name != "baseline" && Some(name.as_str()) != upstream)
                                .map(|(a, u)| a / u),
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

/// One aim: a metric of the `ambit` scenario against the upstream scenario.
#[derive(Debug, Serialize)]
pub struct AimResult {
    /// What is aimed at, as written in the issue.
    pub aim: String,
    /// The metric compared.
    pub metric: String,
    /// Which ratio: `ratio_to_upstream` or `added_ratio_to_upstream`.
    pub ratio: &'static str,
    /// The bound on the ratio.
    pub target: f64,
    /// The ratio measured (none when a scenario or metric is missing).
    pub measured: Option<f64>,
    /// Whether the ratio is on the right side of the bound.
    pub met: Option<bool>,
}

/// The aims of issue 15, judged on the medians of the scenario `ambit` against upstream's.
pub fn aims(scenarios: &[ScenarioReport], rates: &[u32], conn_clients: &[usize]) -> Vec<AimResult> {
    let Some(ambit) = scenarios.iter().find(|s| s.name == "ambit") else {
        return Vec::new();
    };
    let mut list: Vec<(String, String, bool, Better, f64)> = vec![
        (
            "proxy CPU per GB <= 0.7x upstream".into(),
            CPU_PER_GB.into(),
            false,
            Better::Lower,
            0.7,
        ),
        (
            "1-stream throughput >= 1.3x upstream".into(),
            throughput_key(1),
            false,
            Better::Higher,
            1.3,
        ),
        (
            "4-stream throughput >= 1.5x upstream".into(),
            throughput_key(4),
            false,
            Better::Higher,
            1.5,
        ),
    ];
    for &n in conn_clients {
        list.push((
            format!("new connections/s, {n} client(s) >= 1.5x upstream"),
            conn_rate_key(n),
            false,
            Better::Higher,
            1.5,
        ));
    }
    if rates.contains(&1_000) {
        list.push((
            "added p99 latency @ 1000 req/s <= 0.7x upstream".into(),
            latency_key(1_000, "p99"),
            true,
            Better::Lower,
            0.7,
        ));
    }
    list.push((
        "memory per idle connection <= 0.5x upstream".into(),
        PER_CONN.into(),
        false,
        Better::Lower,
        0.5,
    ));
    list.into_iter()
        .map(|(aim, metric, added, better, target)| {
            let r = ambit.metrics.get(&metric);
            let measured = r.and_then(|r| {
                if added {
                    r.added_ratio_to_upstream
                } else {
                    r.ratio_to_upstream
                }
            });
            AimResult {
                aim,
                metric,
                ratio: if added {
                    "added_ratio_to_upstream"
                } else {
                    "ratio_to_upstream"
                },
                target,
                measured,
                met: measured.map(|m| match better {
                    Better::Higher => m >= target,
                    Better::Lower => m <= target,
                }),
            }
        })
        .collect()
}

/// The rows of the table for people: a header, then one row per metric, one column per
/// scenario (median, the ratio to the baseline `/b` and to upstream `/u`; for latency the
/// added microseconds instead, and the added latency's ratio to upstream's).
pub fn table_rows(report: &Report) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["metric".to_string()];
    header.extend(report.scenarios.iter().map(|s| s.name.clone()));
    rows.push(header);
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
                    match r.added_us {
                        Some(added) => {
                            let _ = write!(c, " ({added:+.0}us)");
                            if let Some(u) = r.added_ratio_to_upstream {
                                let _ = write!(c, " {u:.2}/u");
                            }
                        }
                        None => {
                            for (ratio, tag) in
                                [(r.ratio_to_baseline, "b"), (r.ratio_to_upstream, "u")]
                            {
                                if let Some(x) = ratio {
                                    let _ = write!(c, " {x:.2}/{tag}");
                                }
                            }
                        }
                    }
                    c
                }
            };
            row.push(cell);
        }
        rows.push(row);
    }
    rows
}

/// The table for people ([`table_rows`], aligned), then the aims.
pub fn table(report: &Report) -> String {
    let rows = table_rows(report);
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
    if !report.aims.is_empty() {
        out.push_str("\naims (ambit / upstream, medians):\n");
        for a in &report.aims {
            let verdict = match a.met {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "not measured",
            };
            let measured = a.measured.map_or("-".into(), |m| format!("{m:.2}"));
            let _ = writeln!(out, "  {:<52} {measured:>6}  {verdict}", a.aim);
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
    fn ratios_against_baseline_and_upstream() {
        let names: Vec<(String, String)> = ["baseline", "ambit", "upstream"]
            .iter()
            .map(|n| (n.to_string(), String::new()))
            .collect();
        let conn = conn_rate_key(1);
        let p99 = latency_key(1_000, "p99");
        let sample = |pairs: &[(&str, &[f64])]| -> Samples {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect()
        };
        let b = sample(&[(&conn, &[100.0, 300.0, 200.0]), (&p99, &[100.0])]);
        let a = sample(&[(&conn, &[50.0]), (&p99, &[130.0]), (RSS_IDLE, &[1000.0])]);
        let u = sample(&[(&conn, &[25.0]), (&p99, &[200.0]), (RSS_IDLE, &[4000.0])]);
        let r = summarize(&names, &[b, a, u], Some("upstream"));
        // (scenario, key, ratio to baseline, ratio to upstream, added, added ratio)
        type Row<'a> = (
            usize,
            &'a str,
            Option<f64>,
            Option<f64>,
            Option<f64>,
            Option<f64>,
        );
        let cases: [Row; 7] = [
            (0, &conn, None, None, None, None),
            (1, &conn, Some(0.25), Some(2.0), None, None),
            (2, &conn, Some(0.125), None, None, None),
            (1, RSS_IDLE, None, Some(0.25), None, None),
            (2, RSS_IDLE, None, None, None, None),
            (1, &p99, Some(1.3), Some(0.65), Some(30.0), Some(0.3)),
            (2, &p99, Some(2.0), None, Some(100.0), None),
        ];
        for (i, key, base, up, added, added_up) in cases {
            let m = &r[i].metrics[key];
            let what = format!("{} {key}", r[i].name);
            assert_eq!(m.ratio_to_baseline, base, "{what}");
            assert_eq!(m.ratio_to_upstream, up, "{what}");
            assert_eq!(m.added_us, added, "{what}");
            assert_eq!(
                m.added_ratio_to_upstream
                    .map(|x| (x * 100.0).round() / 100.0),
                added_up,
                "{what}"
            );
        }
        let judged = aims(&r, &[1_000], &[1]);
        let verdict = |metric: &str| {
            judged
                .iter()
                .find(|a| a.metric == metric)
                .and_then(|a| a.met)
        };
        assert_eq!(verdict(&conn), Some(true));
        assert_eq!(verdict(&p99), Some(true));
        assert_eq!(verdict(CPU_PER_GB), None);
        // A tail below the baseline's is noise: no ratio of added latencies.
        let lat = |v: f64| sample(&[(&p99, &[v])]);
        let r = summarize(
            &names,
            &[lat(100.0), lat(90.0), lat(200.0)],
            Some("upstream"),
        );
        assert_eq!(r[1].metrics[&p99].added_ratio_to_upstream, None);
        // Without an upstream scenario nothing is judged against it.
        let r = summarize(
            &names[..2],
            &[sample(&[]), sample(&[(&conn, &[1.0])])],
            None,
        );
        assert!(aims(&r, &[1_000], &[1]).iter().all(|a| a.met.is_none()));
    }
}
