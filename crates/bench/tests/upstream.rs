//! Interop with upstream ztunnel's release binary (`AMBIT_UPSTREAM_ZTUNNEL`, or
//! `../shared/reference/upstream-ztunnel/ztunnel` beside the workspace): a smoke run of the
//! harness with upstream in every place it can take. Upstream must load the local-config
//! file the harness writes (each proxy's `/config_dump` is checked against it before any
//! measurement), run in-pod on our node agent, CNI plugin and CA, in dedicated mode, and in
//! both mixed fleets (ambit on one node, upstream on the other), carrying every measurement's
//! traffic with no error. Skipped, with a message, only when the binary is absent; needs
//! root (fails under CI=true without it).

use std::process::Command;

use serde_json::Value;

#[path = "support/leftovers.rs"]
mod leftovers;
use leftovers::assert_nothing_left;

/// Scenario → metrics it must report (positive), beyond the traffic ones every scenario has.
const SCENARIOS: &[(&str, &[&str])] = &[
    ("baseline", &[]),
    (
        "ambit",
        &[
            "proxy_bytes_per_idle_conn",
            "ztunnel_bytes_per_enrolled_pod",
        ],
    ),
    (
        "upstream",
        &[
            "proxy_bytes_per_idle_conn",
            "ztunnel_bytes_per_enrolled_pod",
        ],
    ),
    ("upstream-dedicated", &["proxy_bytes_per_idle_conn"]),
    ("ambit-to-upstream", &["proxy_cpu_seconds_per_gb"]),
    ("upstream-to-ambit", &["proxy_cpu_seconds_per_gb"]),
];
const TRAFFIC: &[&str] = &[
    "throughput_1_streams_bps",
    "throughput_4_streams_bps",
    "connection_rate_1_clients_cps",
    "connection_rate_4_clients_cps",
    "connection_rate_sustained_cps",
    "connection_rate_sustained_slowest_step_cps",
    "connection_time_sustained_p99_us",
];

#[test]
fn upstream_ztunnel_runs_every_scenario_on_our_files_agent_and_ca() {
    let test = "upstream_ztunnel_runs_every_scenario_on_our_files_agent_and_ca";
    let Some(upstream) = ambit_netns::testing::upstream_ztunnel_or_skip(test) else {
        return;
    };
    if !ambit_netns::testing::netns_capable_or_skip(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let names: Vec<&str> = SCENARIOS.iter().map(|(n, _)| *n).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_ambit-bench"))
        .current_dir(dir.path())
        .env("TMPDIR", dir.path())
        .arg("--smoke")
        .arg("--ztunnel-bin")
        .arg(&upstream)
        .arg("--scenarios")
        .arg(names.join(","))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("running ambit-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ambit-bench with upstream failed\n{stdout}\n{stderr}"
    );
    // The six scenarios plus fresh copies for the sustained connection rate (6), memory (3)
    // and enrolled pods (2).
    assert_nothing_left(&stderr, dir.path(), 17);

    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["upstream"], "upstream");
    let scenarios = report["scenarios"].as_array().unwrap();
    let got: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(got, names);
    for (s, (name, extra)) in scenarios.iter().zip(SCENARIOS) {
        assert!(
            s["description"].as_str().unwrap().contains("upstream") || !name.contains("upstream"),
            "{name}: {}",
            s["description"]
        );
        for key in TRAFFIC.iter().chain(*extra) {
            let m = &s["metrics"][key];
            assert!(
                m["median"].as_f64().is_some_and(|v| v > 0.0),
                "{name}: {key} = {m}\n{stderr}"
            );
            // Every figure of a meshed scenario other than upstream's own is also given
            // as a ratio to upstream's.
            if !["baseline", "upstream"].contains(name) {
                assert!(
                    m["ratio_to_upstream"].as_f64().is_some(),
                    "{name}: {key} has no ratio to upstream"
                );
            }
        }
    }
    // Every aim is judged (met or not) on this run; a ratio of *added* latencies only
    // when upstream added some (a smoke run's tail can fall below the baseline's).
    let aims = report["aims"].as_array().unwrap();
    assert!(aims.len() >= 6, "{aims:?}");
    for a in aims {
        if a["ratio"] == "added_ratio_to_upstream" && a["measured"].is_null() {
            continue;
        }
        assert!(a["measured"].as_f64().is_some(), "aim not measured: {a}");
        assert!(a["met"].is_boolean(), "{a}");
    }
    assert!(stdout.contains("aims (ambit / upstream"), "{stdout}");
}
