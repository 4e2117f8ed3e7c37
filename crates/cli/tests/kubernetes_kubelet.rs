//! The manifests as a kubelet runs them (issue 14, item 4): every DaemonSet and Deployment pod
//! spec of `deploy/kubernetes/` runs with its command, args, environment (downward API,
//! `configMapKeyRef`, `envFrom`, resource fields), volumes (hostPath and emptyDir mapped into
//! each node's own root filesystem, ConfigMaps, Secrets, the projected `istio-ca` token) and
//! security context, from the image `scripts/image --rootfs` assembles, on two nodes with
//! their own filesystem and PID namespace, against the fake API server (TLS, real JSON). See
//! `support/kubelet.rs` for what is and is not modelled.
//!
//! It shows, for our manifests and again for upstream's charts with our overlays
//! (`fixtures/upstream-charts.yaml`, ambit control standing in for istiod):
//! - the installer puts `istio-cni` into the node's `/opt/cni/bin` and chains itself into the
//!   node's network list in `/etc/cni/net.d`;
//! - a pod created through that list (the plugins executed from the node's bin dir, as a
//!   container runtime does) is captured and reaches a pod on the other node over HBONE
//!   (the destination ztunnel reports the client's SPIFFE identity);
//! - deleting the DaemonSets uninstalls cleanly: the network list, the bin dir, the agent's
//!   run dir and the node's rules are as they were before, and a new pod starts with the
//!   primary network only.
//!
//! Needs root, debootstrap (the image; `scripts/test` installs it) and the machine's
//! containernetworking-plugins (`ptp`, `host-local`, `loopback`); with `CI=true` anything
//! missing is a failure.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#[path = "support/kubelet.rs"]
mod kubelet;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ambit_testkit::eventually_blocking_explained;
use base64::Engine as _;
use kubelet::pod::Image;
use kubelet::{Cluster, PODS, connect_from, counter, exchange, http_get};
use serde_json::{Value, json};

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");
const SECS: Duration = Duration::from_secs(60);
const APP_PORT: u16 = 8080;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ready_or_skip() -> bool {
    if !ambit_netns::testing::netns_capable_or_skip("kubelet-style manifests test") {
        return false;
    }
    let have = |tool: &str| {
        Command::new("sh")
            .args([
                "-c",
                &format!("command -v {tool} || test -x /usr/sbin/{tool}"),
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut missing: Vec<String> = ["debootstrap", "iptables-save", "nft"]
        .into_iter()
        .filter(|t| !have(t))
        .map(str::to_string)
        .collect();
    for plugin in kubelet::cni::PRIMARY_PLUGINS {
        let path = Path::new(kubelet::cni::PRIMARY_PLUGIN_DIR).join(plugin);
        if !path.exists() {
            missing.push(path.display().to_string());
        }
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: the kubelet-style test cannot run, missing: {missing:?}"
    );
    eprintln!("skipped: missing {missing:?}");
    false
}

/// The image as `scripts/image --rootfs` assembles it around this test's binary.
fn image(dir: &Path) -> Image {
    let out = Command::new(repo().join("scripts/image"))
        .args(["--binary", AMBIT, "--rootfs"])
        .arg(dir)
        .output()
        .expect("run scripts/image");
    assert!(
        out.status.success(),
        "scripts/image --rootfs failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config.json"))
            .expect("image config");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    Image {
        rootfs: dir.join("rootfs"),
        entrypoint: strings(&config["Entrypoint"]),
        workdir: config["WorkingDir"].as_str().unwrap_or("/").to_string(),
        env: strings(&config["Env"])
            .iter()
            .filter_map(|e| {
                e.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect(),
    }
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read manifest");
    serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// Every object of `deploy/kubernetes/*.yaml`.
fn our_manifests() -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/kubernetes"))
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files.iter().flat_map(|f| documents(f)).collect()
}

/// Ours with upstream's CNI ConfigMap and both DaemonSets instead (the images those of the
/// overlays), plus a Service `istiod` for ambit control, which serves as istiod.
fn upstream_charts() -> Vec<Value> {
    let fixture = documents(&repo().join("crates/cli/tests/fixtures/upstream-charts.yaml"));
    for (overlay, ds) in [
        ("cni-values.yaml", "istio-cni-node"),
        ("ztunnel-values.yaml", "ztunnel"),
    ] {
        let values = documents(&repo().join("deploy/helm").join(overlay));
        let image = &values[0]["image"];
        let rendered = fixture
            .iter()
            .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == ds)
            .expect("fixture DaemonSet");
        assert_eq!(
            &rendered["spec"]["template"]["spec"]["containers"][0]["image"], image,
            "{ds}: the fixture's image is not the overlay's"
        );
    }
    let replaced = |o: &Value| {
        fixture
            .iter()
            .any(|f| f["kind"] == o["kind"] && f["metadata"]["name"] == o["metadata"]["name"])
    };
    let mut objects: Vec<Value> = our_manifests()
        .into_iter()
        .filter(|o| !replaced(o))
        .collect();
    objects.extend(fixture);
    objects.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "istiod", "namespace": "istio-system"},
        "spec": {"selector": {"app": "ambit-control"},
                 "ports": [{"name": "grpc-xds", "port": 15012, "targetPort": 15012}]}
    }));
    objects
}

/// The CA Secret and root ConfigMap docs/kubernetes.md has the user create, plus the
/// enrolled namespace and its service accounts.
fn cluster_objects(ca_dir: &Path) -> Vec<Value> {
    let ca = ambit_tls::LocalCa::generate("cluster.local").expect("CA");
    ca.save(ca_dir).expect("save CA");
    let b64 = |name: &str| {
        base64::engine::general_purpose::STANDARD
            .encode(std::fs::read(ca_dir.join(name)).expect("CA file"))
    };
    vec![
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "ambit-ca", "namespace": "istio-system"},
               "data": {"ca-cert.pem": b64("ca-cert.pem"), "ca-key.pem": b64("ca-key.pem"),
                        "root-cert.pem": b64("root-cert.pem")}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "istio-ca-root-cert", "namespace": "istio-system"},
               "data": {"root-cert.pem": ca.root_pem()}}),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "demo", "labels": {"istio.io/dataplane-mode": "ambient"}}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "client", "namespace": "demo"}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "server", "namespace": "demo"}}),
    ]
}

/// An application pod of the test: the sandbox only; its "containers" are the test's
/// listener and connections inside the pod's network namespace.
fn app_pod(name: &str, node: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "demo", "uid": format!("uid-demo-{name}"),
                     "labels": {"app": name}},
        "spec": {"nodeName": node, "serviceAccountName": name, "containers": []},
        "status": {"phase": "Pending"},
    })
}

/// What a clean uninstall must restore on a node.
#[derive(Debug, PartialEq, Eq)]
struct NodeState {
    /// File name → parsed content (an installer may rewrite a file with other whitespace).
    cni_conf: BTreeMap<String, Value>,
    cni_bin: Vec<String>,
    agent_run_dir: Vec<String>,
    /// Firewall and routing rules, without counters, handles and empty built-in tables.
    rules: String,
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `iptables-save` without comments, counters and tables that hold nothing but built-in
/// chains with policy ACCEPT (iptables-nft leaves those behind once a rule was added and
/// deleted; they filter nothing).
fn iptables_state(save: &str) -> String {
    let mut out = String::new();
    let mut table: Vec<String> = Vec::new();
    for line in save.lines().filter(|l| !l.starts_with('#')) {
        // Packet counters change with traffic; they are not state.
        let line = match line.find(" [") {
            Some(i) if line.starts_with(':') => line[..i].to_string(),
            _ => line.to_string(),
        };
        let done = line == "COMMIT";
        table.push(line);
        if done {
            let empty = table[1..table.len() - 1]
                .iter()
                .all(|l| l.starts_with(':') && l.ends_with(" ACCEPT"));
            if !empty {
                out.push_str(&table.join("\n"));
                out.push('\n');
            }
            table.clear();
        }
    }
    out
}

/// `nft -j list ruleset` as one line per object, without handles and counters, and without
/// tables that hold only base chains with policy accept (see [`iptables_state`]).
fn nft_state(json_text: &str) -> String {
    fn scrub(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("handle");
                m.remove("packets");
                m.remove("bytes");
                m.values_mut().for_each(scrub);
            }
            Value::Array(a) => a.iter_mut().for_each(scrub),
            _ => {}
        }
    }
    let parsed: Value = serde_json::from_str(json_text).unwrap_or(Value::Null);
    let items: Vec<Value> = parsed["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i.get("metainfo").is_none())
        .cloned()
        .collect();
    let table_of = |body: &Value| (body["family"].clone(), body["table"].clone());
    let meaningful = |i: &Value| match i.as_object().and_then(|o| o.iter().next()) {
        Some((kind, _)) if kind == "table" => false,
        Some((kind, body)) if kind == "chain" => {
            body.get("hook").is_none() || body["policy"] != "accept"
        }
        _ => true,
    };
    let kept: Vec<(Value, Value)> = items
        .iter()
        .filter(|i| meaningful(i))
        .filter_map(|i| i.as_object()?.values().next().map(table_of))
        .collect();
    let mut out = String::new();
    for mut i in items {
        let Some((kind, body)) = i.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        let key = if kind == "table" {
            (body["family"].clone(), body["name"].clone())
        } else {
            table_of(body)
        };
        if !kept.contains(&key) {
            continue;
        }
        scrub(&mut i);
        out.push_str(&i.to_string());
        out.push('\n');
    }
    out
}

fn node_state(c: &Cluster, node: &str) -> NodeState {
    let n = c.node(node);
    let conf_dir = n.path("/etc/cni/net.d");
    let cni_conf = listing(&conf_dir)
        .into_iter()
        .map(|f| {
            let text = std::fs::read(conf_dir.join(&f)).unwrap_or_default();
            let value = serde_json::from_slice(&text)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&text).into_owned()));
            (f, value)
        })
        .collect();
    let out = |program: &str, args: &[&str]| {
        String::from_utf8_lossy(&n.run(program, args).stdout).into_owned()
    };
    let rules = format!(
        "== iptables-save\n{}== ip6tables-save\n{}== nft\n{}== ipset\n{}== ip rule\n{}",
        iptables_state(&out("iptables-save", &[])),
        iptables_state(&out("ip6tables-save", &[])),
        nft_state(&out("nft", &["-j", "list", "ruleset"])),
        out("ipset", &["list", "-n"]),
        out("ip", &["rule"]),
    );
    NodeState {
        cni_conf,
        cni_bin: listing(&n.path("/opt/cni/bin")),
        agent_run_dir: listing(&n.path("/var/run/istio-cni")),
        rules,
    }
}

fn scenario(name: &str, objects: Vec<Value>, image: &Image) {
    let mut c = Cluster::start(image);
    let ca_dir = c.dir.path().join("ca");
    c.apply(&objects);
    c.apply(&cluster_objects(&ca_dir));
    let before: Vec<NodeState> = ["node1", "node2"]
        .iter()
        .map(|n| node_state(&c, n))
        .collect();

    // The control plane first: its Service name is what the ztunnels dial.
    c.run_controller("Deployment", "istio-system", "ambit-control");

    // The CNI agents install the plugin and chain it into the node's network list.
    c.run_controller("DaemonSet", "istio-system", "istio-cni-node");
    for node in ["node1", "node2"] {
        let n = c.node(node);
        let installed = n.path("/opt/cni/bin/istio-cni");
        eventually_blocking_explained(
            &format!("{name}: istio-cni on {node}"),
            SECS,
            || c.logs(),
            || {
                let len = std::fs::metadata(&installed).ok()?.len();
                (len == std::fs::metadata(AMBIT).ok()?.len()).then_some(())
            },
        );
        let (file, list) = kubelet::cni::network_config(n);
        assert_eq!(file, "10-kindnet.conflist", "{name}: {node}");
        let plugins = list["plugins"].as_array().expect("plugins");
        let types: Vec<&str> = plugins.iter().filter_map(|p| p["type"].as_str()).collect();
        assert_eq!(types, ["ptp", "istio-cni"], "{name}: {node}: {list}");
        let entry = &plugins[1];
        assert_eq!(
            entry["cni_agent_run_dir"], "/var/run/istio-cni",
            "{name}: {entry}"
        );
        assert!(
            n.path("/var/run/istio-cni/istio-cni-kubeconfig").exists(),
            "{name}: {node}: the plugin's kubeconfig"
        );
    }

    // ztunnel pods start through the chained list (not enrolled: the plugin lets them be).
    c.run_controller("DaemonSet", "istio-system", "ztunnel");

    // Application pods through the installed list: captured, and over HBONE to node2.
    let server = c
        .run_pod(1, app_pod("server", "node2"))
        .unwrap_or_else(|e| panic!("{name}: server sandbox: {e}\n{}", c.logs()));
    let client = c
        .run_pod(0, app_pod("client", "node1"))
        .unwrap_or_else(|e| panic!("{name}: client sandbox: {e}\n{}", c.logs()));
    for pod in ["server", "client"] {
        eventually_blocking_explained(
            &format!("{name}: {pod} enrolled"),
            SECS,
            || c.logs(),
            || {
                let o = c.api.object(PODS, "demo", pod)?;
                (o["metadata"]["annotations"]["ambient.istio.io/redirection"] == "enabled")
                    .then_some(())
            },
        );
    }
    c.serve_echo(server, APP_PORT);
    let server_addr = SocketAddr::from((c.pods[server].ip, APP_PORT));
    let client_ip = c.pods[client].ip;
    let reply = eventually_blocking_explained(
        &format!("{name}: client → server"),
        SECS,
        || c.logs(),
        || {
            let mut s = connect_from(&c.pods[client].netns, server_addr).ok()?;
            exchange(&mut s, "over hbone").ok()
        },
    );
    assert_eq!(reply, format!("hello {client_ip}\nover hbone\n"), "{name}");
    let ztunnel2 = c.pod("istio-system", "ztunnel-node2");
    let metrics = http_get(
        c.node("node2").netns(),
        SocketAddr::from((ztunnel2.ip, 15020)),
        "/metrics",
    )
    .map(|(_, body)| body)
    .unwrap_or_default();
    assert!(
        counter(
            &metrics,
            "istio_tcp_connections_opened_total",
            &[
                "reporter=\"destination\"",
                "source_principal=\"spiffe://cluster.local/ns/demo/sa/client\"",
            ],
        ) >= 1.0,
        "{name}: node2's ztunnel did not see the client's identity:\n{metrics}"
    );

    // Uninstall: the DaemonSets go, the agents see theirs gone and clean up.
    for ds in ["istio-cni-node", "ztunnel"] {
        for (container, status) in c.delete_controller("DaemonSet", "istio-system", ds) {
            assert!(
                status.success(),
                "{name}: {container} exited with {status}\n{}",
                c.logs()
            );
        }
    }
    for (node, was) in ["node1", "node2"].iter().zip(&before) {
        assert_eq!(
            &node_state(&c, node),
            was,
            "{name}: {node} after the uninstall"
        );
    }
    let late = c.run_pod(0, app_pod("late", "node1"));
    assert!(late.is_ok(), "{name}: a pod after the uninstall: {late:?}");
}

#[test]
fn manifests_install_capture_over_hbone_and_uninstall() {
    if !ready_or_skip() {
        return;
    }
    let image_dir = tempfile::tempdir().expect("image dir");
    let image = image(image_dir.path());
    // (scenario, objects)
    let scenarios: [(&str, Vec<Value>); 2] = [
        ("our manifests", our_manifests()),
        ("upstream charts with our overlays", upstream_charts()),
    ];
    for (name, objects) in scenarios {
        scenario(name, objects, &image);
    }
}

#[test]
fn rule_state_ignores_only_empty_builtin_tables() {
    let empty =
        "# Generated\n*nat\n:PREROUTING ACCEPT [3:180]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n";
    let ruled = "*nat\n:POSTROUTING ACCEPT [1:2]\n:ISTIO_POSTRT - [0:0]\n-A POSTROUTING -j ISTIO_POSTRT\nCOMMIT\n";
    let dropping = "*filter\n:INPUT DROP [0:0]\nCOMMIT\n";
    // (iptables-save output, kept)
    let cases = [
        (empty, ""),
        (
            ruled,
            "*nat\n:POSTROUTING ACCEPT\n:ISTIO_POSTRT -\n-A POSTROUTING -j ISTIO_POSTRT\nCOMMIT\n",
        ),
        (dropping, "*filter\n:INPUT DROP\nCOMMIT\n"),
    ];
    for (save, want) in cases {
        assert_eq!(iptables_state(save), want, "{save}");
    }
    let base = |policy: &str| {
        json!({"chain": {"family": "ip", "table": "nat", "name": "POSTROUTING", "handle": 1,
                         "type": "nat", "hook": "postrouting", "prio": 100, "policy": policy}})
    };
    let table = json!({"table": {"family": "ip", "name": "nat", "handle": 3}});
    let rule = json!({"rule": {"family": "ip", "table": "nat", "chain": "POSTROUTING",
                               "handle": 4, "expr": [{"counter": {"packets": 9, "bytes": 99}}]}});
    // (objects, lines kept)
    let cases = [
        (vec![table.clone(), base("accept")], 0),
        (vec![table.clone(), base("drop")], 2),
        (vec![table.clone(), base("accept"), rule], 3),
    ];
    for (objects, want) in cases {
        let text = json!({"nftables": objects}).to_string();
        let state = nft_state(&text);
        assert_eq!(state.lines().count(), want, "{text} → {state}");
        assert!(
            !state.contains("handle") && !state.contains("packets"),
            "{state}"
        );
    }
}
