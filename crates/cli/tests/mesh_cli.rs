#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Operating a running embedded mesh as a user would: `ambit logs`, `ambit ztunnel-config`
//! (tables and `-o json`), `ambit completions`, and `ambit restart ztunnel` with traffic
//! still flowing through the new ztunnel, then `ambit down` leaving no process behind.
//! Needs root (network namespaces).

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

use ambit_testkit::eventually_blocking;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/embedded.rs"]
mod embedded;
use embedded::*;
#[path = "support/istioctl_types.rs"]
mod istioctl_types;

/// The harness waits for `ready`, so traffic is expected to work.
fn eventually_ok(run: &std::path::Path, pod: &str, url: &str) {
    eventually_get(run, pod, url, true);
}

fn up_state(run: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("state.json")).expect("state.json"))
        .expect("state json")
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
        "stop",
    ] {
        let out = Command::new(AMBIT).args([cmd, "--help"]).output().unwrap();
        assert!(
            stdout(&out).contains("Example"),
            "{cmd} --help lacks examples"
        );
    }
}

/// `ambit stop`'s arguments are checked before any mesh is asked (no run directory here).
#[test]
fn stop_arguments_are_checked() {
    let run = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["control", "--for", "86401"], "86401"),
        (
            &["control", "--for", "18446744073709551615"],
            "18446744073709551615",
        ),
        (
            &["control", "node1", "--for", "5"],
            "`control` takes no node",
        ),
        (&["ztunnel", "--for", "5"], "need one"),
    ];
    for (args, want) in cases {
        let out = Command::new(AMBIT)
            .arg("stop")
            .args(args)
            .arg("--run-dir")
            .arg(run.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "ambit stop {args:?} succeeded");
        assert!(stderr.contains(want), "ambit stop {args:?}: {stderr}");
        assert!(
            !stderr.contains("panicked"),
            "ambit stop {args:?}: {stderr}"
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
    let mut up = Up::start(&example(), &run);
    up.wait_ready();
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
    // `log`: a real ztunnel's /logging, read, changed with istioctl's names, reset.
    // (arguments, answer)
    let cases: [(&[&str], &str); 3] = [
        (
            &["--level", "access:warning"],
            "node1:\ncurrent log level is info,access=warn",
        ),
        (&[], "node1:\ncurrent log level is info,access=warn"),
        (&["-r"], "node1:\ncurrent log level is info"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["ztunnel-config", "log", "--node", "node1"];
        args.extend_from_slice(extra);
        let text = stdout(&ambit(&run, &args));
        assert_eq!(text.trim_end(), want, "{args:?}");
    }
    // `-o yaml` of the whole dump is what istioctl's types accept; times are RFC 3339.
    let out = ambit(
        &run,
        &["ztunnel-config", "all", "--node", "node1", "-o", "yaml"],
    );
    assert!(out.status.success(), "{out:?}");
    let dump = istioctl_types::parse_dump_yaml(&stdout(&out)).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        dump.workloads
            .iter()
            .flatten()
            .any(|w| w.name == "client" && w.namespace == "demo"),
        "{dump:?}"
    );
    assert!(
        !dump.services.is_empty() && !dump.policies.is_empty(),
        "{dump:?}"
    );
    let cert = dump
        .certificates
        .iter()
        .flatten()
        .flat_map(|c| c.cert_chain.iter().flatten())
        .next()
        .expect("a certificate");
    for t in [&cert.valid_from, &cert.expiration_time] {
        let b = t.as_bytes();
        assert!(
            b.len() == 20 && b[4] == b'-' && b[10] == b'T' && b[19] == b'Z',
            "not RFC 3339: {t}"
        );
    }
    let table = stdout(&ambit(&run, &["ztunnel-config", "all", "--node", "node1"]));
    assert!(
        table.contains("POD-NAME") && table.contains("spiffe://"),
        "{table}"
    );

    // restart ztunnel on the server's node with an overlap, while the client opens
    // connections back to back: none fails, and traffic keeps working through the new one.
    let old = ztunnel_pids(&run, "node2");
    let stop = tmp.path().join("stop");
    let script = "import os, sys, socket\nok = fail = 0\nwhile not os.path.exists(sys.argv[2]) and ok + fail < 20000:\n    try:\n        s = socket.create_connection((sys.argv[1], 8080), timeout=5)\n        s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n        got = s.recv(12).startswith(b'HTTP/1.0 200')\n        s.close()\n        if got and ok == 0:\n            print('ready', flush=True)\n        ok += got\n    except OSError as e:\n        fail += 1\n        print('error', e, flush=True)\nprint('ok', ok, 'fail', fail)";
    let server_ip = up_state(&run)["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "server")
        .map(|p| p["ip"].as_str().unwrap().to_owned())
        .unwrap();
    let mut load = Command::new(AMBIT)
        .args(["exec", "--run-dir"])
        .arg(&run)
        .args(["client", "--", "python3", "-c", script, &server_ip])
        .arg(&stop)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The hand-off starts only once the load runs (its first connection succeeded): on a
    // loaded machine the interpreter can take longer to start than the whole restart.
    let lines = {
        let (tx, rx) = std::sync::mpsc::channel();
        let out = std::io::BufReader::new(load.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(out).map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
    };
    let mut summary = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line == "ready" => break,
            Ok(line) => summary.push_str(&format!("{line}\n")),
            Err(e) => panic!("the load never connected ({e}): {summary}"),
        }
    }
    let out = ambit(&run, &["restart", "ztunnel", "node2"]);
    std::fs::write(&stop, b"").unwrap();
    assert!(load.wait().unwrap().success());
    summary.extend(lines.iter().map(|l| format!("{l}\n")));
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("overlapping hand-off"), "{out:?}");
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
    eventually_blocking(
        "the restarted ztunnel to exit",
        Duration::from_secs(10),
        || !alive(new),
    );
    assert!(!alive(new), "restarted ztunnel left running");
}
