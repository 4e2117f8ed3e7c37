#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Operating a running embedded mesh as a user would: `ambit logs`, `ambit ztunnel-config`
//! (tables and `-o json`), `ambit completions`, and `ambit restart ztunnel` with traffic
//! still flowing through the new ztunnel, then `ambit down` leaving no process behind.
//! Needs root (network namespaces).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/basic")
}

fn ambit(run: &Path, args: &[&str]) -> Output {
    Command::new(AMBIT)
        .args(args)
        .arg("--run-dir")
        .arg(run)
        .output()
        .expect("run ambit")
}

fn up_state(run: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("state.json")).expect("state.json"))
        .expect("state json")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ambit up` in the background; killed and the mesh removed on drop.
struct Up {
    child: Child,
    run: PathBuf,
    /// Kept so `up`'s stdout stays open (it must not die of a broken pipe).
    _lines: mpsc::Receiver<String>,
}

impl Up {
    fn start(run: &Path) -> Up {
        let mut child = Command::new(AMBIT)
            .arg("up")
            .arg(example())
            .arg("--run-dir")
            .arg(run)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ambit up");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(l) if l == "ready" => {
                    return Up {
                        child,
                        run: run.to_path_buf(),
                        _lines: rx,
                    };
                }
                Ok(l) => seen.push(l),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("ambit up exited:\n{}", seen.join("\n"))
                }
            }
            assert!(Instant::now() < deadline, "not ready:\n{}", seen.join("\n"));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = ambit(&self.run, &["down"]);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP GET from a pod: "200" or an error text.
fn get(run: &Path, pod: &str, url: &str) -> String {
    let script = "import sys, urllib.request\ntry:\n    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\nexcept Exception as e:\n    print('ERR', e)";
    let out = Command::new(AMBIT)
        .args(["exec", "--run-dir"])
        .arg(run)
        .args([pod, "--", "python3", "-c", script, url])
        .output()
        .expect("ambit exec");
    stdout(&out).trim().to_owned()
}

fn eventually_ok(run: &Path, pod: &str, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = get(run, pod, url);
        if got == "200" {
            return;
        }
        assert!(Instant::now() < deadline, "{pod} → {url}: {got}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn alive(pid: u64) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next())
        .unwrap_or("");
    !stat.is_empty() && state != "Z" && state != "X"
}

fn ztunnel_pids(run: &Path, node: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(run.join("state.json")).expect("state.json");
    let state: serde_json::Value = serde_json::from_str(&text).unwrap();
    state["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "ztunnel" && p["node"] == node)
        .filter_map(|p| p["pid"].as_u64())
        .collect()
}

#[test]
fn completions_for_every_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(AMBIT)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let text = stdout(&out);
        assert!(text.contains("ztunnel-config"), "{shell}: {text}");
    }
    for cmd in [
        "up",
        "down",
        "status",
        "exec",
        "logs",
        "ztunnel-config",
        "restart",
    ] {
        let out = Command::new(AMBIT).args([cmd, "--help"]).output().unwrap();
        assert!(
            stdout(&out).contains("Example"),
            "{cmd} --help lacks examples"
        );
    }
}

#[test]
fn logs_ztunnel_config_restart() {
    if !ambit_netns::testing::netns_capable_or_skip("logs_ztunnel_config_restart") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start(&run);
    // Enrolment reaches the ztunnels through xDS shortly after `ready`.
    let url = "http://server.demo.svc.cluster.local/";
    eventually_ok(&run, "client", url);

    // logs
    let out = ambit(&run, &["logs", "ztunnel-node1"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("ztunnel"), "{out:?}");
    assert!(ambit(&run, &["logs", "control"]).status.success());
    assert!(ambit(&run, &["logs", "agent-node2"]).status.success());
    assert!(ambit(&run, &["logs", "demo/client"]).status.success());
    let out = ambit(&run, &["logs", "nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nope") && err.contains("ztunnel-node2") && err.contains("demo/server"),
        "{err}"
    );

    // ztunnel-config
    let out = ambit(&run, &["ztunnel-config", "workloads", "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    for node in ["node1", "node2"] {
        let w = v[node]
            .as_array()
            .unwrap_or_else(|| panic!("{node} in {v}"));
        assert!(
            w.iter()
                .any(|w| w["name"] == "client" && w["namespace"] == "demo"),
            "{v}"
        );
    }
    let out = ambit(&run, &["ztunnel-config", "workloads", "--node", "node1"]);
    let text = stdout(&out);
    assert!(text.starts_with("ZTUNNEL  NAMESPACE  POD-NAME"), "{text}");
    assert!(text.contains("client") && text.contains("HBONE"), "{text}");
    let text = stdout(&ambit(&run, &["ztunnel-config", "services"]));
    assert!(text.contains("10.96.0.20"), "{text}");
    let text = stdout(&ambit(&run, &["ztunnel-config", "policies"]));
    assert!(text.contains("server-allow-client"), "{text}");
    let text = stdout(&ambit(
        &run,
        &["ztunnel-config", "certificates", "--node", "node2"],
    ));
    assert!(
        text.contains("spiffe://cluster.local/ns/demo/sa/server"),
        "{text}"
    );
    let text = stdout(&ambit(
        &run,
        &["ztunnel-config", "connections", "--node", "node1"],
    ));
    assert!(text.contains("client") && text.contains("Up"), "{text}");
    assert!(
        !ambit(&run, &["ztunnel-config", "workloads", "--node", "node9"])
            .status
            .success()
    );

    // restart ztunnel on the server's node with an overlap, while the client opens
    // connections back to back: none fails, and traffic keeps working through the new one.
    let old = ztunnel_pids(&run, "node2");
    let stop = tmp.path().join("stop");
    let script = "import os, sys, socket\nok = fail = 0\nwhile not os.path.exists(sys.argv[2]) and ok + fail < 20000:\n    try:\n        s = socket.create_connection((sys.argv[1], 8080), timeout=5)\n        s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n        ok += s.recv(12).startswith(b'HTTP/1.0 200')\n        s.close()\n    except OSError as e:\n        fail += 1\n        print('error', e, flush=True)\nprint('ok', ok, 'fail', fail)";
    let server_ip = up_state(&run)["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "server")
        .map(|p| p["ip"].as_str().unwrap().to_owned())
        .unwrap();
    let load = Command::new(AMBIT)
        .args(["exec", "--run-dir"])
        .arg(&run)
        .args(["client", "--", "python3", "-c", script, &server_ip])
        .arg(&stop)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = ambit(&run, &["restart", "ztunnel", "node2"]);
    std::fs::write(&stop, b"").unwrap();
    let load = load.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("overlapping hand-off"), "{out:?}");
    let summary = stdout(&load);
    eprintln!("during the hand-off: {summary}");
    assert!(
        summary.contains(" fail 0"),
        "connections failed during the hand-off: {summary}"
    );
    assert!(
        !summary.contains("ok 0 "),
        "no connection during the hand-off: {summary}"
    );
    assert_eq!(up_state(&run)["nodes"][1]["ztunnel"]["generation"], 2);
    let pids = ztunnel_pids(&run, "node2");
    let new = *pids.last().unwrap();
    assert!(!old.contains(&new), "{old:?} {pids:?}");
    assert!(alive(new));
    assert!(old.iter().all(|p| !alive(*p)), "old ztunnel still running");
    eventually_ok(&run, "client", url);
    eventually_ok(&run, "client", "http://10.96.0.20/");

    // restart the agent of the client's node: enrolled pods keep their proxies (the agent
    // rebuilds its ZDS snapshot from the persisted annotations) and traffic keeps flowing.
    let out = ambit(&run, &["restart", "agent", "node1"]);
    assert!(out.status.success(), "{out:?}");
    eventually_ok(&run, "client", url);
    eventually_ok(&run, "client", "http://10.96.0.20/");

    // down stops the restarted ztunnel too.
    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    let _ = up.child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(new) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(new), "restarted ztunnel left running");
}
