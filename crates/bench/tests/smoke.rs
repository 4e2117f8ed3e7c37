//! Runs the whole harness in smoke mode (a few hundred milliseconds per measurement) so it
//! cannot rot: the baseline, the in-pod mesh (node agents, shared ztunnels, pods enrolled
//! through the CNI plugin) and the dedicated mesh must start, every measurement must
//! complete, every metric in the JSON must be positive, and nothing the run created (network
//! namespaces, files, processes) may survive it. Needs root (network namespaces); fails
//! under CI=true without it.

use std::process::Command;

use serde_json::Value;

#[path = "support/leftovers.rs"]
mod leftovers;
use leftovers::assert_nothing_left;

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
    "connection_rate_1_clients_cps",
    "connection_rate_4_clients_cps",
    "connection_rate_sustained_cps",
    "connection_rate_sustained_slowest_step_cps",
    "connection_time_sustained_p99_us",
];
const PROXY: &[&str] = &[
    "proxy_rss_idle_kib",
    "proxy_rss_with_idle_conns_kib",
    "proxy_bytes_per_idle_conn",
    "proxy_cpu_seconds_per_gb",
    "proxy_cpu_us_per_conn",
];
/// Only in-pod scenarios (pods enrolled through the node agent).
const IN_POD: &[&str] = &[
    "ztunnel_rss_one_pod_kib",
    "ztunnel_rss_enrolled_pods_kib",
    "ztunnel_bytes_per_enrolled_pod",
    "cni_add_ms_per_pod",
];
/// In-pod metrics that may be zero in a short window: CPU is counted in 10 ms ticks, and an
/// agent that starts no process has no child CPU at all.
const IN_POD_MAY_BE_ZERO: &[&str] = &[
    "agent_cpu_pct_enrolled_pods",
    "agent_children_cpu_pct_enrolled_pods",
];

#[test]
fn smoke_run_reports_every_metric_and_leaves_nothing_behind() {
    if !ambit_netns::testing::netns_capable_or_skip(
        "smoke_run_reports_every_metric_and_leaves_nothing_behind",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let svg = dir.path().join("bench.svg");
    // Every file and working directory of the run is under `dir`, which tells its processes
    // apart from anyone else's.
    let out = Command::new(env!("CARGO_BIN_EXE_ambit-bench"))
        .current_dir(dir.path())
        .env("TMPDIR", dir.path())
        .arg("--smoke")
        .arg("--scenarios")
        .arg("baseline,ambit,ambit-dedicated")
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
    // baseline, ambit, ambit-dedicated, plus the fresh copies for the sustained connection
    // rate (3) and the memory measurements (3).
    assert_nothing_left(&stderr, dir.path(), 9);

    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["mode"], "smoke");
    let scenarios = report["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["baseline", "ambit", "ambit-dedicated"]);
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        let metrics = s["metrics"].as_object().unwrap();
        let expected: Vec<&str> = match name {
            "baseline" => COMMON.to_vec(),
            "ambit" => COMMON.iter().chain(PROXY).chain(IN_POD).copied().collect(),
            _ => COMMON.iter().chain(PROXY).copied().collect(),
        };
        if name == "ambit" {
            for key in IN_POD_MAY_BE_ZERO {
                assert!(metrics.contains_key(*key), "{name}: no {key}\n{stderr}");
            }
        }
        if name == "ambit-dedicated" {
            for key in IN_POD.iter().chain(IN_POD_MAY_BE_ZERO) {
                assert!(!metrics.contains_key(*key), "{name} has {key}");
            }
        }
        for key in expected {
            let median = metrics
                .get(key)
                .and_then(|m| m["median"].as_f64())
                .unwrap_or_else(|| panic!("{name}: no {key}\n{stderr}"));
            assert!(median > 0.0, "{name}: {key} = {median}\n{stderr}");
        }
        for (key, m) in metrics {
            let may_be_zero = IN_POD_MAY_BE_ZERO.contains(&key.as_str());
            assert!(
                m["median"]
                    .as_f64()
                    .is_some_and(|v| v > 0.0 || (may_be_zero && v == 0.0)),
                "{name}: {key} = {m}"
            );
            let proxy_only =
                PROXY.contains(&key.as_str()) || IN_POD.contains(&key.as_str()) || may_be_zero;
            if name != "baseline" && !proxy_only {
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

/// `--pod-sysctls default` leaves the pods at a new namespace's sysctls (a pod's, unless
/// its spec sets them), and `--sustained-rate` paces the sustained run's clients: the run
/// completes no more connections than it offered.
#[test]
fn paced_sustained_run_with_kernel_default_pod_sysctls() {
    let test = "paced_sustained_run_with_kernel_default_pod_sysctls";
    if !ambit_netns::testing::netns_capable_or_skip(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let offered = 200.0;
    let out = Command::new(env!("CARGO_BIN_EXE_ambit-bench"))
        .current_dir(dir.path())
        .env("TMPDIR", dir.path())
        .args([
            "--smoke",
            "--scenarios",
            "baseline,ambit",
            "--enrolled-pods",
            "0",
        ])
        .args(["--pod-sysctls", "default", "--sustained-rate", "200"])
        .args(["--sustained-secs", "1", "--idle-conns", "20"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("running ambit-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ambit-bench failed\n{stderr}");
    // baseline and ambit, their fresh copies for the sustained run and ambit's for memory.
    assert_nothing_left(&stderr, dir.path(), 5);
    let sysctls: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split_once(" pod sysctls: ").map(|(_, v)| v))
        .collect();
    assert_eq!(sysctls.len(), 5, "{stderr}");
    for v in sysctls {
        assert_eq!(
            v, "ip_local_port_range 32768 60999, tcp_tw_reuse 2",
            "{stderr}"
        );
    }
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["params"]["pod_sysctls"], "default");
    assert_eq!(report["params"]["sustained_rate"], 200);
    for s in report["scenarios"].as_array().unwrap() {
        let name = s["name"].as_str().unwrap();
        let m = &s["metrics"];
        let rate = m["connection_rate_sustained_cps"]["median"]
            .as_f64()
            .unwrap();
        // 1 s of 5 steps, 4 loops at 50/s each: a tick's connection that is still in
        // flight at the end counts in no step, so a little under 200.
        assert!(
            rate > offered * 0.5 && rate <= offered * 1.02,
            "{name}: {rate} conn/s offering {offered}\n{stderr}"
        );
        let p99 = m["connection_time_sustained_p99_us"]["median"]
            .as_f64()
            .unwrap();
        assert!(p99 > 0.0, "{name}: connection time p99 {p99}");
    }
}
