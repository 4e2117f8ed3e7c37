//! Runs the whole harness in smoke mode (a few hundred milliseconds per measurement) so it
//! cannot rot: both scenarios must start, every measurement must complete, and every metric
//! in the JSON must be positive. Needs root (network namespaces); fails under CI=true
//! without it.

use std::process::Command;

use serde_json::Value;

/// Metrics every scenario has, and those only proxied scenarios have.
const COMMON: &[&str] = &[
    "throughput_1_streams_bps",
    "throughput_4_streams_bps",
    "latency_1000rps_p50_us",
    "latency_1000rps_p90_us",
    "latency_1000rps_p99_us",
    "latency_1000rps_p999_us",
    "latency_1000rps_achieved_rps",
    "latency_10000rps_p50_us",
    "latency_10000rps_p999_us",
    "latency_10000rps_achieved_rps",
    "connection_rate_cps",
];
const PROXY: &[&str] = &[
    "proxy_rss_idle_kib",
    "proxy_rss_with_idle_conns_kib",
    "proxy_bytes_per_idle_conn",
    "proxy_cpu_seconds_per_gb",
];

#[test]
fn smoke_run_reports_every_metric_for_both_scenarios() {
    if !ambit_netns::testing::netns_capable_or_skip(
        "smoke_run_reports_every_metric_for_both_scenarios",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let svg = dir.path().join("bench.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_ambit-bench"))
        .arg("--smoke")
        .arg("--json")
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .expect("running ambit-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ambit-bench failed\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("connection rate"), "no table:\n{stdout}");

    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["mode"], "smoke");
    let scenarios = report["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["baseline", "ambit"]);
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        let metrics = s["metrics"].as_object().unwrap();
        let expected: Vec<&str> = match name {
            "baseline" => COMMON.to_vec(),
            _ => COMMON.iter().chain(PROXY).copied().collect(),
        };
        for key in expected {
            let median = metrics
                .get(key)
                .and_then(|m| m["median"].as_f64())
                .unwrap_or_else(|| panic!("{name}: no {key}\n{stderr}"));
            assert!(median > 0.0, "{name}: {key} = {median}\n{stderr}");
        }
        for (key, m) in metrics {
            assert!(
                m["median"].as_f64().is_some_and(|v| v > 0.0),
                "{name}: {key} = {m}"
            );
            if name != "baseline" && !PROXY.contains(&key.as_str()) {
                assert!(
                    m["ratio_to_baseline"].as_f64().is_some(),
                    "{name}: {key} has no ratio"
                );
            }
        }
        if name == "baseline" {
            for key in PROXY {
                assert!(
                    !metrics.contains_key(*key),
                    "baseline has proxy metric {key}"
                );
            }
        }
    }
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
    assert!(chart.contains("baseline") && chart.contains("ambit"));
}
