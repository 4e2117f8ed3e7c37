//! Every entry point that talks to the Kubernetes API (`cni-agent`, `control --kubernetes`,
//! `ztunnel-config --kubernetes`) finds its configuration by the same rule
//! (`ambit_kubeapi::KubeConfig::from_environment`): the `KUBECONFIG` list merged as kubectl
//! merges it. Shown without a network: each case's merged configuration is refused for a
//! reason only the merge can produce (a reader of the first file alone would fail
//! differently), and every entry point must refuse it with that reason. No root needed.

// Unix only: the entry points it runs are Linux roles (not in the Windows binary).
#![cfg(unix)]

use std::path::Path;
use std::process::Command;

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write kubeconfig");
    path.display().to_string()
}

#[test]
fn every_entry_point_merges_the_kubeconfig_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let state = d.join("state");
    let state = state.to_str().expect("utf-8 path");
    let missing = d.join("missing").display().to_string();
    // current-context here, its context in the next file, cluster and user in the last.
    let ctx = write(d, "ctx", "current-context: main\n");
    let other_ctx = write(d, "other-ctx", "current-context: other\n");
    let context = write(
        d,
        "context",
        "contexts: [{name: main, context: {cluster: k, user: u}}]\n",
    );
    let user_with = |name: &str, user: &str| {
        write(
            d,
            name,
            &format!(
                "clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:1'}}}}]\n\
                 users: [{{name: u, user: {user}}}]\n"
            ),
        )
    };
    let provider = user_with("provider", "{auth-provider: {name: gcp}}");
    // A later file's definition of the same user does not replace the first one.
    let shadowed = user_with("shadowed", "{token: t}");

    let entry_points: [(&str, &[&str]); 3] = [
        ("cni-agent", &["cni-agent"]),
        (
            "control",
            &[
                "control",
                "--kubernetes",
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                state,
            ],
        ),
        ("ztunnel-config", &["ztunnel-config", "all", "--kubernetes"]),
    ];
    // (case, KUBECONFIG, what the error must say)
    let cases = [
        (
            "merged across three files, one missing",
            [missing.as_str(), &ctx, &context, &provider, &shadowed].join(":"),
            "auth-provider plugins is not supported".to_string(),
        ),
        (
            "the error names the file that defined the user",
            [ctx.as_str(), &context, &provider].join(":"),
            format!("kubeconfig {provider}:"),
        ),
        (
            "no file of the list exists",
            [missing.as_str(), &format!("{missing}2")].join(":"),
            "names no existing file".to_string(),
        ),
        (
            "the first file to set current-context wins",
            [other_ctx.as_str(), &ctx, &context, &provider].join(":"),
            "context \"other\" not found".to_string(),
        ),
    ];
    for (entry, args) in entry_points {
        for (case, kubeconfig, needle) in &cases {
            let out = Command::new(AMBIT)
                .args(args)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("HOME", d)
                .env("NODE_NAME", "node1")
                .env("KUBECONFIG", kubeconfig)
                .output()
                .expect("run ambit");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{entry}, {case}: succeeded");
            assert!(
                err.contains(needle.as_str()),
                "{entry}, {case}: {needle:?} not in {err}"
            );
        }
    }
}
