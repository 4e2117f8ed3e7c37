//! The command lines upstream's charts and images use reach the right role: `ztunnel proxy
//! ztunnel` (the ztunnel chart's args, under the `ztunnel` name), `ambit proxy ztunnel` (the
//! same args with the image's `ambit` entry point), `install-cni FLAGS` (the istio-cni chart's
//! command). Each case is run as a process under the name it is called by (a link to the
//! built binary); no root needed: the roles stop at their configuration check.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

use std::path::Path;
use std::process::Command;

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");

struct Case {
    name: &'static str,
    /// The name the binary is started under.
    argv0: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    code: i32,
    /// Text that must appear in stdout or stderr.
    says: &'static str,
}

fn run(dir: &Path, case: &Case) {
    let exe = dir.join(case.argv0);
    if !exe.exists() {
        std::os::unix::fs::symlink(AMBIT, &exe).expect("link");
    }
    let out = Command::new(&exe)
        .args(case.args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .envs(case.env.iter().copied())
        .output()
        .expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(case.code), "{}: {text}", case.name);
    assert!(
        text.contains(case.says),
        "{}: {:?} not in {text}",
        case.name,
        case.says
    );
}

#[test]
fn upstream_command_lines_reach_their_roles() {
    // A variable ztunnel refuses: reaching the configuration check proves the proxy ran.
    const BAD_ZTUNNEL: &[(&str, &str)] = &[("PROXY_MODE", "sideways")];
    let cases = [
        Case {
            name: "ztunnel chart args, upstream binary name",
            argv0: "ztunnel",
            args: &["proxy", "ztunnel"],
            env: BAD_ZTUNNEL,
            code: 2,
            says: "PROXY_MODE",
        },
        Case {
            name: "ztunnel chart args with the ambit entry point",
            argv0: "ambit",
            args: &["proxy", "ztunnel"],
            env: BAD_ZTUNNEL,
            code: 2,
            says: "PROXY_MODE",
        },
        Case {
            name: "ambit ztunnel proxy ztunnel",
            argv0: "ambit",
            args: &["ztunnel", "proxy", "ztunnel"],
            env: BAD_ZTUNNEL,
            code: 2,
            says: "PROXY_MODE",
        },
        Case {
            name: "bare ztunnel",
            argv0: "ztunnel",
            args: &[],
            env: BAD_ZTUNNEL,
            code: 2,
            says: "PROXY_MODE",
        },
        Case {
            name: "ztunnel help",
            argv0: "ztunnel",
            args: &["proxy", "ztunnel", "--help"],
            env: &[],
            code: 0,
            says: "proxy [ztunnel]",
        },
        Case {
            name: "ztunnel version",
            argv0: "ztunnel",
            args: &["version"],
            env: &[],
            code: 0,
            says: "ambit ",
        },
        Case {
            name: "an unknown ztunnel word is refused",
            argv0: "ztunnel",
            args: &["proxy", "router"],
            env: &[],
            code: 2,
            says: "expected `proxy` or `proxy ztunnel`",
        },
        Case {
            name: "install-cni: unknown flags are named",
            argv0: "install-cni",
            args: &["--log_output_level=info", "--frobnicate=1"],
            env: &[],
            code: 2,
            says: "unknown flag --frobnicate",
        },
        Case {
            name: "install-cni: the chart's flags and environment reach the agent's checks",
            argv0: "install-cni",
            args: &["--log_output_level=info", "--log_as_json"],
            env: &[("AMBIENT_IPV6", "perhaps"), ("CHAINED_CNI_PLUGIN", "true")],
            code: 2,
            says: "AMBIENT_IPV6",
        },
        Case {
            name: "install-cni version",
            argv0: "install-cni",
            args: &["version"],
            env: &[],
            code: 0,
            says: "ambit ",
        },
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for case in &cases {
        run(dir.path(), case);
    }
}
