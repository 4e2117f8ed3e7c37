//! The embedded mesh driven as a user would: `ambit up examples/basic` as a child process,
//! `ambit status -o json`, traffic with `ambit exec` (allowed, denied by policy, plaintext
//! refused under STRICT), `ambit apply`/`delete` on the running mesh (a policy change, a new
//! pod, a live label change un-enrolling and re-enrolling it, a bad manifest leaving the mesh
//! untouched), `ambit down` leaving no namespace, process or socket behind — also after `up`
//! was SIGKILLed or interrupted with Ctrl-C while starting — and bad manifests refused
//! (naming file and document) without creating anything; components that die are restarted
//! (`a_killed_component_is_restarted`). Needs root (network namespaces).

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ambit_testkit::eventually_blocking_every;

#[path = "support/embedded.rs"]
mod embedded;
use embedded::*;
#[path = "support/pipe.rs"]
mod pipe;
use pipe::run_into_closed_pipe;

#[test]
fn up_status_exec_down() {
    if !ambit_netns::testing::netns_capable_or_skip("up_status_exec_down") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start(&example(), &run);
    up.wait_ready();
    let (prefix, pids) = recorded(&up.state());
    assert!(!ambit_topology::leftovers(&prefix).unwrap().is_empty());

    let out = ambit(&run, &["status", "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
    assert_eq!(status["phase"], "ready");
    for node in status["nodes"].as_array().unwrap() {
        assert_eq!(node["agent"]["ready"], true, "{node}");
        assert_eq!(node["ztunnel"]["ready"], true, "{node}");
        assert_eq!(node["unprotected_pods"], 0, "{node}");
    }
    let pods = status["pods"].as_array().unwrap();
    let pod = |name: &str| {
        pods.iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("pod {name} in {status}"))
    };
    for (name, enrolled) in [
        ("server", true),
        ("client", true),
        ("intruder", true),
        ("outsider", false),
    ] {
        assert_eq!(pod(name)["enrolled"], enrolled, "{name}");
        // The agent's own record (its annotation) agrees.
        let redirection = if enrolled {
            "enabled".into()
        } else {
            serde_json::Value::Null
        };
        assert_eq!(pod(name)["redirection"], redirection, "{name}");
        assert_eq!(pod(name)["running"], true, "{name}");
    }
    assert_example_traffic(&run, pod("server")["ip"].as_str().unwrap());

    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    let status = wait_exit(
        &mut up.child,
        Duration::from_secs(30),
        "ambit up did not exit after down",
    );
    assert!(status.success(), "up exit status {status}");
    let left = leftovers(&prefix, &pids, &run);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The example's traffic outcomes: allowed by IP, service VIP and service name (DNS proxy)
/// from `client`; denied by the AuthorizationPolicy from `intruder`; plaintext from outside
/// the mesh refused by STRICT.
fn assert_example_traffic(run: &Path, server_ip: &str) {
    let direct = format!("http://{server_ip}:8080/");
    let cases = [
        ("client", direct.as_str(), true),
        ("client", "http://10.96.0.20/", true),
        ("client", "http://server.demo.svc.cluster.local/", true),
        ("intruder", direct.as_str(), false),
        ("outsider", direct.as_str(), false),
    ];
    for (pod, url, allowed) in cases {
        eventually_get(run, pod, url, allowed);
    }
}

/// Upstream ztunnel's release binary as every node's ztunnel (`ambit up --ztunnel-bin`): it
/// takes what `ambit up` generates for a ztunnel (environment, node token, root certificate,
/// `ambit control`'s xDS and CA) and carries the example's traffic in-pod through our agent
/// and plugin, with the same policy outcomes. Skipped only when the binary is absent.
#[test]
fn upstream_ztunnel_serves_the_embedded_mesh() {
    let test = "upstream_ztunnel_serves_the_embedded_mesh";
    let Some(upstream) = ambit_netns::testing::upstream_ztunnel_or_skip(test) else {
        return;
    };
    if !ambit_netns::testing::netns_capable_or_skip(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start_with(
        &example(),
        &run,
        &["--ztunnel-bin".as_ref(), upstream.as_os_str()],
    );
    up.wait_ready();
    let (prefix, pids) = recorded(&up.state());
    // Both nodes' ztunnels are upstream's.
    let state = up.state();
    let ztunnels: Vec<&serde_json::Value> = state["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "ztunnel")
        .collect();
    assert_eq!(ztunnels.len(), 2, "{ztunnels:?}");
    let program = upstream.canonicalize().unwrap();
    for z in &ztunnels {
        assert_eq!(
            z["command"]["program"].as_str().map(Path::new),
            Some(program.as_path()),
            "{z}"
        );
    }
    let status = status_json(&run);
    for node in status["nodes"].as_array().unwrap() {
        assert_eq!(node["ztunnel"]["ready"], true, "{node}");
        assert_eq!(node["unprotected_pods"], 0, "{node}");
    }
    let server = status["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "server")
        .expect("server pod");
    assert_example_traffic(&run, server["ip"].as_str().unwrap());

    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    let status = wait_exit(
        &mut up.child,
        Duration::from_secs(30),
        "ambit up did not exit after down",
    );
    assert!(status.success(), "up exit status {status}");
    let left = leftovers(&prefix, &pids, &run);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn down_after_sigkill() {
    if !ambit_netns::testing::netns_capable_or_skip("down_after_sigkill") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start(&example(), &run);
    up.wait_ready();
    let (prefix, pids) = recorded(&up.state());
    up.child.kill().unwrap();
    up.child.wait().unwrap();
    // Everything but the orchestrator still runs.
    assert!(!ambit_topology::leftovers(&prefix).unwrap().is_empty());

    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    let left = leftovers(&prefix, &pids, &run);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn up_cleans_a_stale_run_first() {
    if !ambit_netns::testing::netns_capable_or_skip("up_cleans_a_stale_run_first") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut first = Up::start(&example(), &run);
    first.wait_ready();
    let (old_prefix, old_pids) = recorded(&first.state());
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    first.down_on_drop = false;

    let mut second = Up::start(&example(), &run);
    second.wait_ready();
    let (prefix, pids) = recorded(&second.state());
    assert_ne!(prefix, old_prefix);
    let old: Vec<String> = leftovers(&old_prefix, &old_pids, Path::new("/nonexistent"));
    assert!(old.is_empty(), "previous run left: {old:#?}");
    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    let _ = second.child.wait();
    let left = leftovers(&prefix, &pids, &run);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn bad_manifests_are_refused_before_anything_is_created() {
    let good = std::fs::read_to_string(example().join("workloads.yaml")).unwrap();
    let pod = |extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: extra, namespace: demo}}\nspec:\n{extra}  containers: [{{name: c, command: [sleep, infinity]}}]\n"
        )
    };
    let cases: Vec<(&str, String, &[&str])> = vec![
        (
            "unknown kind",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: demo}\n".into(),
            &["document 1", "ConfigMap"],
        ),
        ("missing node", pod(""), &["document 1", "nodeName"]),
        (
            "duplicate name",
            pod("  nodeName: node1\n").replace("name: extra", "name: client"),
            &["document 1", "duplicate", "workloads.yaml"],
        ),
        (
            "malformed YAML",
            format!("{}---\nkind: [unclosed\n", pod("  nodeName: node1\n")),
            &["document 2"],
        ),
    ];
    for (name, text, needles) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("manifests");
        std::fs::create_dir(&dir).unwrap();
        for f in ["namespaces.yaml", "policies.yaml"] {
            std::fs::copy(example().join(f), dir.join(f)).unwrap();
        }
        std::fs::write(dir.join("workloads.yaml"), &good).unwrap();
        std::fs::write(dir.join("zz-bad.yaml"), text).unwrap();
        let run = tmp.path().join("run");
        let out = Command::new(AMBIT)
            .arg("up")
            .arg(&dir)
            .arg("--run-dir")
            .arg(&run)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: accepted");
        assert!(err.contains("zz-bad.yaml"), "{name}: {err}");
        for n in needles {
            assert!(err.contains(n), "{name}: {n:?} not in {err}");
        }
        assert!(!run.join("state.json").exists(), "{name}: state written");
    }
}

const NEWCOMER: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: newcomer\n  namespace: demo\n  labels: {app: newcomer, istio.io/dataplane-mode: LABEL}\nspec:\n  nodeName: node1\n  serviceAccountName: newcomer\n  containers:\n  - name: http\n    command: [python3, -m, http.server, \"8080\", --bind, 0.0.0.0]\n";

#[test]
fn apply_and_delete_on_a_running_mesh() {
    if !ambit_netns::testing::netns_capable_or_skip("apply_and_delete_on_a_running_mesh") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start(&example(), &run);
    up.wait_ready();
    let (prefix, mut pids) = recorded(&up.state());
    let server_ip = pod_status(&run, "server").unwrap()["ip"]
        .as_str()
        .unwrap()
        .to_owned();
    let server = format!("http://{server_ip}:8080/");
    eventually_get(&run, "intruder", &server, false);

    // Bad changes are refused, naming file and document, and change nothing.
    let before = (
        std::fs::read(run.join("state.json")).unwrap(),
        std::fs::read(run.join("manifests/mesh.yaml")).unwrap(),
    );
    let bad: Vec<(&str, String, &[&str])> = vec![
        (
            "unknown kind",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: demo}\n".into(),
            &["<stdin>", "document 1", "ConfigMap"],
        ),
        (
            "malformed",
            format!(
                "{}---\nkind: [unclosed\n",
                NEWCOMER.replace("LABEL", "ambient")
            ),
            &["<stdin>", "document 2"],
        ),
        (
            "unknown node",
            NEWCOMER
                .replace("LABEL", "ambient")
                .replace("node1", "node9"),
            &["<stdin>", "document 1", "node9"],
        ),
        (
            "changed command",
            std::fs::read_to_string(example().join("workloads.yaml"))
                .unwrap()
                .replace("[sleep, infinity]", "[sleep, \"3600\"]"),
            &["command", "delete the pod"],
        ),
    ];
    for (name, text, needles) in bad {
        let out = apply(&run, "apply", &text);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: accepted: {out:?}");
        for n in needles {
            assert!(err.contains(n), "{name}: {n:?} not in {err}");
        }
    }
    let out = apply(&run, "delete", NEWCOMER);
    assert!(!out.status.success(), "delete of a missing pod: {out:?}");
    let after = (
        std::fs::read(run.join("state.json")).unwrap(),
        std::fs::read(run.join("manifests/mesh.yaml")).unwrap(),
    );
    assert!(before == after, "a refused change modified the mesh");
    eventually_get(&run, "client", &server, true);

    // A policy change: intruder is allowed too.
    let policy = std::fs::read_to_string(example().join("policies.yaml"))
        .unwrap()
        .replace(
            "principals: [cluster.local/ns/demo/sa/client]",
            "principals: [cluster.local/ns/demo/sa/client, cluster.local/ns/demo/sa/intruder]",
        );
    let out = apply(&run, "apply", &policy);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("AuthorizationPolicy demo/server-allow-client configured"),
        "{text}"
    );
    eventually_get(&run, "intruder", &server, true);

    // A new ambient pod, created through the CNI path: captured, STRICT applies to it.
    let out = apply(&run, "apply", &NEWCOMER.replace("LABEL", "ambient"));
    assert!(out.status.success(), "{out:?}\n{}", logs(&run));
    let pod = pod_status(&run, "newcomer").expect("newcomer in status");
    assert_eq!(pod["enrolled"], true, "{pod}");
    assert_eq!(pod["running"], true, "{pod}");
    let netns = up.state()["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "newcomer")
        .map(|p| PathBuf::from(p["netns"].as_str().unwrap()))
        .expect("newcomer in state.json");
    assert!(netns.exists(), "{}", netns.display());
    let newcomer = format!("http://{}:8080/", pod["ip"].as_str().unwrap());
    eventually_get(&run, "client", &newcomer, true);
    eventually_get(&run, "outsider", &newcomer, false);

    // Live label change: out of the mesh (plaintext reaches it), then back in.
    for (label, enrolled) in [("none", false), ("ambient", true)] {
        let out = apply(&run, "apply", &NEWCOMER.replace("LABEL", label));
        assert!(out.status.success(), "{label}: {out:?}\n{}", logs(&run));
        let pod = pod_status(&run, "newcomer").unwrap();
        assert_eq!(pod["enrolled"], enrolled, "{label}: {pod}");
        assert_eq!(
            pod["redirection"].as_str() == Some("enabled"),
            enrolled,
            "{pod}"
        );
        eventually_get(&run, "outsider", &newcomer, !enrolled);
        eventually_get(&run, "client", &newcomer, true);
    }

    // Deleted: process stopped, namespace gone, no longer in status.
    let state = up.state();
    pids.extend(recorded(&state).1);
    let out = apply(&run, "delete", &NEWCOMER.replace("LABEL", "ambient"));
    assert!(out.status.success(), "{out:?}");
    assert!(pod_status(&run, "newcomer").is_none());
    assert!(!netns.exists(), "{} still exists", netns.display());
    eventually_get(&run, "client", &server, true);

    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    let _ = up.child.wait();
    let left = leftovers(&prefix, &pids, &run);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn ctrl_c_while_starting_removes_everything() {
    if !ambit_netns::testing::netns_capable_or_skip("ctrl_c_while_starting_removes_everything") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start(&example(), &run);
    // Interrupt once the nodes' components are being started (namespaces exist).
    let deadline = Instant::now() + UP_TIMEOUT;
    loop {
        let line = up
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("progress line");
        let starting = line.contains("starting cni-agent");
        up.seen.push(line);
        if starting {
            break;
        }
    }
    let (prefix, pids) = recorded(&up.state());
    assert!(!ambit_topology::leftovers(&prefix).unwrap().is_empty());
    let kill = Command::new("kill")
        .args(["-INT", &up.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = wait_exit(
        &mut up.child,
        Duration::from_secs(60),
        "ambit up ignored Ctrl-C",
    );
    assert!(
        !status.success(),
        "an interrupted start is a failure: {status}"
    );
    up.down_on_drop = false;
    let left = leftovers(&prefix, &pids, &run);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// `ambit up` supervises its components as a kubelet does (`restartPolicy: Always`): a
/// SIGKILLed ztunnel is started again by itself and its node's pods are reachable again,
/// `ambit status` counts the restart (table and JSON) and the orchestrator logs it; `ambit
/// status` into a closed pipe exits quietly; and `ambit down` right after a crash never
/// leaves the restarted component behind.
#[test]
fn a_killed_component_is_restarted() {
    if !ambit_netns::testing::netns_capable_or_skip("a_killed_component_is_restarted") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start(&example(), &run);
    up.wait_ready();
    let server_ip = pod_status(&run, "server").unwrap()["ip"]
        .as_str()
        .unwrap()
        .to_owned();
    let server = format!("http://{server_ip}:8080/");
    eventually_get(&run, "client", &server, true);

    // `ambit status | head -1`: stdout closed early.
    let (code, stderr) =
        run_into_closed_pipe(&["status".as_ref(), "--run-dir".as_ref(), run.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");

    // The server's node loses its ztunnel; the supervisor starts it again.
    let node2 = |status: &serde_json::Value| {
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "node2")
            .cloned()
            .expect("node2 in status")
    };
    assert_eq!(node2(&status_json(&run))["ztunnel"]["restarts"], 0);
    let killed = component_pid(&run, "ztunnel", "node2");
    kill9(killed);
    up.wait_line("ztunnel/node2 exited", Duration::from_secs(10));
    let line = up.wait_line("ztunnel/node2 restarted", Duration::from_secs(10));
    assert!(line.contains("restart 1"), "{line}");
    let n = eventually_blocking_every(
        "ztunnel/node2 back, ready",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || format!("{}\n{}", node2(&status_json(&run)), logs(&run)),
        || {
            let n = node2(&status_json(&run));
            (n["ztunnel"]["ready"] == true && n["ztunnel"]["running"] == true).then_some(n)
        },
    );
    assert_eq!(n["ztunnel"]["restarts"], 1, "{n}");
    assert_eq!(n["agent"]["restarts"], 0, "{n}");
    assert_ne!(component_pid(&run, "ztunnel", "node2"), killed);
    assert!(!alive(killed));
    eventually_get(&run, "client", &server, true);
    eventually_get(&run, "intruder", &server, false);
    eventually_get(&run, "outsider", &server, false);
    let table = stdout(&ambit(&run, &["status"]));
    let row = table
        .lines()
        .find(|l| l.starts_with("node2"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(table.contains("RESTARTS (agent/ztunnel)"), "{table}");
    assert!(row.contains(" 0/1 "), "{row}");

    // A crash right before `ambit down`: whatever the supervisor starts is stopped too.
    let state = up.state();
    let (prefix, pids) = recorded(&state);
    kill9(component_pid(&run, "agent", "node1"));
    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    let status = wait_exit(
        &mut up.child,
        Duration::from_secs(30),
        "ambit up did not exit after down",
    );
    assert!(status.success(), "up exit status {status}");
    let left = leftovers(&prefix, &pids, &run);
    assert!(left.is_empty(), "left behind: {left:#?}");
    let procs = processes_mentioning(&run);
    assert!(procs.is_empty(), "processes left behind: {procs:#?}");
}

/// `examples/vm` end to end (`docs/vm.md`, "VMs in `ambit up`"): a VM beside the cluster,
/// bootstrapped by `ambit up` from the bundle `ambit vm configure` would write and brought in
/// by `ambit vm up` (host rules, dedicated ztunnel, auto-registered). A pod calls the VM by
/// service name and its ztunnel proves the VM's SPIFFE identity; the VM calls a pod by
/// service name (its DNS answered by its own ztunnel) and the pod's ztunnel sees the VM's
/// identity; the identity the policy denies is refused by the VM's ztunnel; `ambit down`
/// leaves no namespace, process (the VM's ztunnel included) or file.
#[test]
fn vm_example_pod_and_vm_call_each_other() {
    if !ambit_netns::testing::netns_capable_or_skip("vm_example_pod_and_vm_call_each_other") {
        return;
    }
    const VM_ID: &str = "spiffe://cluster.local/ns/demo/sa/billing";
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/vm");
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start(&example, &run);
    up.wait_ready();
    let (prefix, pids) = recorded(&up.state());

    let status = status_json(&run);
    let vm = &status["vms"][0];
    assert_eq!(vm["name"], "billing-vm", "{status}");
    assert_eq!(vm["identity"], VM_ID, "{status}");
    assert_eq!(vm["ztunnel"]["ready"], true, "{status}");
    assert_eq!(vm["running"], true, "{status}");
    let log_has = |file: &str, needles: &[&str]| {
        std::fs::read_to_string(run.join("logs").join(file))
            .unwrap_or_default()
            .lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
    };
    let wait_log = |file: &str, needles: &[&str]| {
        eventually_blocking_every(
            &format!("a line of {file} holding {needles:?}"),
            Duration::from_secs(20),
            Duration::from_millis(100),
            || logs(&run),
            || log_has(file, needles),
        )
    };

    // Pod → VM by service name, over HBONE to the VM's own ztunnel.
    eventually_get(
        &run,
        "client",
        "http://billing.demo.svc.cluster.local/",
        true,
    );
    wait_log(
        "ztunnel-node1.log",
        &["outbound", "dst.identity", VM_ID, "sa/client"],
    );
    // VM → pod by service name: the VM's DNS and TCP are captured by its host rules.
    eventually_get(
        &run,
        "billing-vm",
        "http://server.demo.svc.cluster.local/",
        true,
    );
    wait_log("ztunnel-node2.log", &["inbound", "src.identity", VM_ID]);
    // The identity the VM's policy denies is refused at the VM.
    eventually_get(
        &run,
        "intruder",
        "http://billing.demo.svc.cluster.local/",
        false,
    );
    wait_log(
        "vm-demo-billing-vm.log",
        &[
            "explicitly denied by: demo/billing-deny-intruder",
            "sa/intruder",
        ],
    );
    assert_eq!(
        get(&run, "client", "http://billing.demo.svc.cluster.local/"),
        "200",
        "client still allowed"
    );

    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    wait_exit(
        &mut up.child,
        Duration::from_secs(30),
        "ambit up did not exit after down",
    );
    let mut left = leftovers(&prefix, &pids, &run);
    left.extend(
        processes_mentioning(&run)
            .into_iter()
            .map(|(pid, cmd)| format!("process {pid}: {cmd}")),
    );
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// A `kind: MeshConfig` document in the manifests: its trust domain names every identity (the
/// example's policy, rewritten to `example.org` principals, still admits `client`), a
/// `rootNamespace` applied to the running mesh makes that namespace's selector-less DENY
/// policy mesh-wide without a restart, and a trust domain change is refused.
#[test]
fn a_mesh_config_document_sets_trust_domain_and_root_namespace() {
    if !ambit_netns::testing::netns_capable_or_skip(
        "a_mesh_config_document_sets_trust_domain_and_root_namespace",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    for entry in std::fs::read_dir(example()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(
                manifests.join(path.file_name().unwrap()),
                text.replace("cluster.local/ns/", "example.org/ns/"),
            )
            .unwrap();
        }
    }
    const MESH: &str = "apiVersion: install.istio.io/v1alpha1\nkind: MeshConfig\n\
                        trustDomain: example.org\naccessLogFile: /dev/stdout\n";
    std::fs::write(
        manifests.join("mesh-config.yaml"),
        format!(
            "{MESH}---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: meshroot}}\n---\n\
             apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
             metadata: {{name: deny-client, namespace: meshroot}}\n\
             spec:\n  action: DENY\n  rules:\n  - from:\n    - source:\n        \
             principals: [example.org/ns/demo/sa/client]\n"
        ),
    )
    .unwrap();
    let run = tmp.path().join("run");
    let mut up = Up::start(&manifests, &run);
    up.wait_ready();
    let (prefix, pids) = recorded(&up.state());
    let server_ip = pod_status(&run, "server").unwrap()["ip"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_example_traffic(&run, &server_ip);

    // meshroot becomes the root namespace: its DENY policy now covers the server too.
    let out = apply(&run, "apply", &format!("{MESH}rootNamespace: meshroot\n"));
    assert!(out.status.success(), "{out:?}");
    let direct = format!("http://{server_ip}:8080/");
    eventually_get(&run, "client", &direct, false);

    // Another trust domain is refused, and the mesh keeps running as it was.
    let out = apply(
        &run,
        "apply",
        "kind: MeshConfig\ntrustDomain: other.example\nrootNamespace: meshroot\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {out:?}");
    assert!(err.contains("trust domain"), "{err}");
    // Back to the default root namespace: the client is allowed again.
    let out = apply(&run, "apply", MESH);
    assert!(out.status.success(), "{out:?}");
    eventually_get(&run, "client", &direct, true);

    let out = ambit(&run, &["down"]);
    assert!(out.status.success(), "{out:?}");
    wait_exit(
        &mut up.child,
        Duration::from_secs(30),
        "ambit up did not exit after down",
    );
    let left = leftovers(&prefix, &pids, &run);
    assert!(left.is_empty(), "left behind: {left:#?}");
}
