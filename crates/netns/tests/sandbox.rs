//! [`ambit_netns::sandbox`]: a process in its own mount namespace with a pivoted root, its own
//! PID namespace, a bounded capability set and another user; the caller's mounts never change.
//! Needs root (`netns_capable_or_skip`).

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};

use ambit_netns::sandbox::{Bind, PidNamespace, Sandbox, spawn};
use ambit_netns::testing::netns_capable_or_skip;

/// A root made of a tmpfs holding `/usr` (read-only, from the host), the merged-usr links,
/// `/proc` and a marker file written by the test through the host side of a bind.
fn rooted(dir: &Path) -> Sandbox {
    let root = dir.join("root");
    for d in ["usr", "proc", "data"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(target, root.join(link)).unwrap();
    }
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/marker"), "inside\n").unwrap();
    Sandbox::new()
        .unshare_mount()
        .bind(&root, &root, Bind::default())
        .bind(
            Path::new("/usr"),
            &root.join("usr"),
            Bind {
                recursive: true,
                readonly: true,
                ..Bind::default()
            },
        )
        .bind(&dir.join("data"), &root.join("data"), Bind::default())
        .pivot_root(&root)
        .mount("proc", Path::new("/proc"), "", false)
}

fn run(mut cmd: Command, sandbox: Sandbox, pid: PidNamespace<'_>) -> (bool, String) {
    sandbox.apply(&mut cmd).expect("sandbox");
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = spawn(&mut cmd, pid).expect("spawn");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap()
}

#[test]
fn a_pivoted_root_a_pid_namespace_capabilities_and_a_user() {
    if !netns_capable_or_skip("sandbox") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let before = mountinfo();
    // (what, script, sandbox extras, new PID namespace, expected output)
    type Extra = fn(Sandbox) -> Sandbox;
    let cases: [(&str, &str, Extra, bool, &str); 5] = [
        (
            "the pivoted root",
            "cat /data/marker; test -e /etc/passwd || echo no-host-etc",
            |s| s,
            false,
            "inside\nno-host-etc\n",
        ),
        (
            "PID 1 of a new namespace, /proc shows it",
            "echo $$; ls /proc | grep -c '^[0-9]'",
            |s| s,
            true,
            "1\n",
        ),
        (
            "only the kept capabilities",
            "grep CapBnd /proc/self/status",
            |s| s.capabilities(&["NET_ADMIN", "NET_RAW"]),
            false,
            // NET_ADMIN (12) and NET_RAW (13).
            "CapBnd:\t0000000000003000\n",
        ),
        (
            "another user, no capabilities, no new privileges",
            "id -u; id -g; grep -E 'CapEff|NoNewPrivs' /proc/self/status",
            |s| s.user(1337, 1337, &[1337]).no_new_privs(),
            false,
            "1337\n1337\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\n",
        ),
        (
            "a working directory after the pivot",
            "pwd",
            |s| s.cwd(Path::new("/data")),
            false,
            "/data\n",
        ),
    ];
    for (what, script, extra, new_pid, want) in cases {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script]).env_clear().env("PATH", "/bin");
        let pid = if new_pid {
            PidNamespace::New
        } else {
            PidNamespace::Inherit
        };
        let (ok, text) = run(cmd, extra(rooted(dir.path())), pid);
        assert!(ok, "{what}: {text}");
        assert!(
            text.starts_with(want),
            "{what}: want {want:?}, got {text:?}"
        );
        // A second case reuses the directories: clear the links made by `rooted`.
        for link in ["bin", "lib", "lib64"] {
            std::fs::remove_file(dir.path().join("root").join(link)).unwrap();
        }
    }
    assert_eq!(mountinfo(), before, "the caller's mounts changed");
}

#[test]
fn a_joined_pid_namespace_sees_its_init_as_pid_1() {
    if !netns_capable_or_skip("sandbox") {
        return;
    }
    let mut init = Command::new("sleep");
    init.arg("60");
    let mut init = spawn(&mut init, PidNamespace::New).expect("init");
    let pidns: OwnedFd = std::fs::File::open(format!("/proc/{}/ns/pid", init.id()))
        .expect("pid ns")
        .into();
    // A procfs mounted by a process that joined the namespace lists the init as PID 1.
    let dir = tempfile::tempdir().unwrap();
    let proc_dir = dir.path().join("proc");
    std::fs::create_dir_all(&proc_dir).unwrap();
    let mut show = Command::new("/bin/sh");
    show.args(["-c", &format!("cat {}/1/comm", proc_dir.display())]);
    let sandbox = Sandbox::new()
        .unshare_mount()
        .mount("proc", &proc_dir, "", false);
    let (ok, text) = run(show, sandbox, PidNamespace::Join(&pidns));
    let _ = init.kill();
    let _ = init.wait();
    assert!(ok, "{text}");
    assert_eq!(text, "sleep\n");
}
