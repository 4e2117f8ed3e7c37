//! `ambit cni-agent` without `--pods` takes its pods from the Kubernetes API; with no usable
//! API configuration it must refuse to start with a clear error (never run with no pods and
//! report ready). No root needed: it fails before touching the network.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

use std::process::Command;

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");

#[test]
fn without_pods_dir_or_api_config_the_agent_refuses_to_start() {
    let home = tempfile::tempdir().expect("tempdir");
    let missing = home.path().join("nope.kubeconfig");
    // (case, extra environment, what the error must say)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 2] = [
        ("nothing configured", vec![], "Kubernetes pod source"),
        (
            "KUBECONFIG names no file",
            vec![("KUBECONFIG", missing.to_str().expect("utf-8 path"))],
            "nope.kubeconfig",
        ),
    ];
    for (name, env, needle) in cases {
        let out = Command::new(AMBIT)
            .arg("cni-agent")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("NODE_NAME", "node1")
            .envs(env)
            .output()
            .expect("run ambit cni-agent");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(needle), "{name}: {needle:?} not in {err}");
    }
}
