//! The container image: `scripts/image` builds it without a registry (debootstrap root
//! filesystem + this test's `ambit` binary, imported into podman) and it runs under podman
//! with upstream's entry points. Needs root, podman and debootstrap (`scripts/test` installs
//! them); with `CI=true` anything missing is a failure.
//!
//! The first run downloads Debian packages (cached in ~/.cache/ambit/image); later runs only
//! assemble and import.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

use std::path::Path;
use std::process::{Command, Output};

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args([
            "-c",
            &format!("command -v {tool} || test -x /usr/sbin/{tool}"),
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn ready_or_skip() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let missing: Vec<&str> = ["podman", "debootstrap"]
        .into_iter()
        .filter(|t| !have(t))
        .collect();
    if root && missing.is_empty() {
        return true;
    }
    let why = format!("root: {root}, missing tools: {missing:?}");
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: the image test cannot run ({why})"
    );
    eprintln!("skipped: {why}");
    false
}

/// Removes the test image, also when the test panics.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
    }
}

/// `podman run` with what this kind of machine needs: no network, rlimits no higher than
/// the caller's (no CAP_SYS_RESOURCE here), and runc where crun refuses hybrid cgroups.
fn podman_run(image: &str, entrypoint: Option<&str>, args: &[&str], env: &[&str]) -> Output {
    let mut cmd = Command::new("podman");
    cmd.args(["run", "--rm", "--network", "none"]).args([
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
    ]);
    if have("runc") {
        cmd.args(["--runtime", "runc"]);
    }
    if let Some(e) = entrypoint {
        cmd.args(["--entrypoint", e]);
    }
    for e in env {
        cmd.args(["-e", e]);
    }
    cmd.arg(image).args(args);
    cmd.output().expect("run podman")
}

#[test]
fn image_builds_and_runs_under_podman() {
    if !ready_or_skip() {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let image = Image(format!("localhost/ambit-test:{}", std::process::id()));
    let built = Command::new(repo.join("scripts/image"))
        .args(["--binary", AMBIT, "--tag", &image.0])
        .output()
        .expect("run scripts/image");
    assert!(
        built.status.success(),
        "scripts/image failed:\n{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    // (what, entry point override, args, env, exit code, text in the output)
    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        &'a [&'a str],
        &'a [&'a str],
        i32,
        &'a str,
    );
    let cases: [Case; 7] = [
        ("ambit version", None, &["version"], &[], 0, "ambit "),
        (
            "ztunnel proxy ztunnel --help",
            Some("ztunnel"),
            &["proxy", "ztunnel", "--help"],
            &[],
            0,
            "proxy [ztunnel]",
        ),
        (
            "the ztunnel chart: image entry point, args proxy ztunnel",
            None,
            &["proxy", "ztunnel"],
            &["PROXY_MODE=sideways"],
            2,
            "PROXY_MODE",
        ),
        (
            "the istio-cni chart's command",
            Some("install-cni"),
            &["--log_output_level=info", "--no-such-flag"],
            &[],
            2,
            "unknown flag --no-such-flag",
        ),
        (
            "the plugin where upstream's image keeps it",
            Some("/opt/cni/bin/istio-cni"),
            &[],
            &["CNI_COMMAND=VERSION"],
            0,
            "cniVersion",
        ),
        (
            "redirection tools",
            Some("sh"),
            &[
                "-c",
                "for t in iptables-restore ip6tables-restore nft ip ipset; do command -v $t || exit 1; done",
            ],
            &[],
            0,
            "ipset",
        ),
        (
            "entry point links",
            Some("sh"),
            &[
                "-c",
                "readlink /usr/local/bin/ztunnel /usr/local/bin/install-cni /usr/local/bin/istio-cni",
            ],
            &[],
            0,
            "ambit\nambit\nambit",
        ),
    ];
    for (what, entrypoint, args, env, code, says) in cases {
        let out = podman_run(&image.0, entrypoint, args, env);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(code), "{what}: {text}");
        assert!(text.contains(says), "{what}: {says:?} not in {text}");
    }
}
