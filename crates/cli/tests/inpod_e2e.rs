//! End to end in shared (in-pod) mode, as in a cluster: per node an `ambit cni-agent` and an
//! `ambit ztunnel` (PROXY_MODE=shared) in the node namespace, `ambit control` for xDS and
//! certificates, and pods created through the CNI plugin executable exactly as a container
//! runtime would run it. Then a ztunnel restart hand-off under a steady stream of new
//! connections. Needs root.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

#[path = "support/mesh.rs"]
mod mesh;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ambit_testkit::eventually_blocking_every;

use ambit_netns::{SocketFactory, SocketOptions};
use ambit_topology::Topology;
use mesh::{APP_PORT, Proc, connect_from, eventually_blocking, exchange};

const SECS: Duration = Duration::from_secs(30);
const SELECTORS: &str = "- podSelector: {matchLabels: {istio.io/dataplane-mode: ambient}}\n- podSelector: {matchExpressions: [{key: istio.io/dataplane-mode, operator: NotIn, values: [none]}]}\n  namespaceSelector: {matchLabels: {istio.io/dataplane-mode: ambient}}\n";

struct Cluster {
    topo: Topology,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    procs: Vec<(String, Proc)>,
}

fn node_token(node: &str) -> String {
    format!("{node}-node-token-0123456789")
}

impl Cluster {
    fn path(&self, p: &str) -> std::path::PathBuf {
        self.dir.path().join(p)
    }

    /// `enrolled`: carry the agent-written redirection annotation (what the control plane sees).
    fn pod_manifest(&self, name: &str, enrolled: bool) -> String {
        let pod = self.topo.pod(name);
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  uid: uid-{name}\n  labels: {{app: {name}}}\n  annotations: {{{redirection}ambit.io/netns: {netns}}}\nspec:\n  nodeName: {node}\n  serviceAccountName: {name}\n  containers: [{{name: app, image: x}}]\nstatus:\n  podIP: {ip}\n",
            node = pod.node(),
            ip = pod.ip(),
            netns = pod.netns_path().display(),
            redirection = if enrolled {
                "ambient.istio.io/redirection: enabled, "
            } else {
                ""
            },
        )
    }

    fn spawn(&mut self, name: &str, ns: &str, args: &[&str], env: &[(&str, String)]) {
        let log = self.path(&format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd: Command = self.topo.command(ns, env!("CARGO_BIN_EXE_ambit")).unwrap();
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.procs.push((
            name.to_string(),
            Proc {
                child: cmd.spawn().unwrap(),
                log,
            },
        ));
    }

    fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|(n, p)| format!("== {n}\n{}\n", p.log_text()))
            .collect()
    }

    fn ready(&self, ns: &str, port: u16, path: &str) -> bool {
        let ns = self.topo.netns(ns).unwrap();
        matches!(
            mesh::http_get(ns, SocketAddr::from(([127, 0, 0, 1], port)), path),
            Some((200, _))
        )
    }

    fn wait_ready(&self, what: &str, ns: &str, port: u16, path: &str) {
        eventually_blocking_every(
            &format!("{what} ready"),
            SECS,
            Duration::from_millis(50),
            || self.logs(),
            || self.ready(ns, port, path),
        );
    }

    fn ztunnel_env(&self, node: &str) -> Vec<(&'static str, String)> {
        let control = format!("https://{}:15012", self.topo.node("node1").ip());
        let root = self.path("state/root-cert.pem").display().to_string();
        vec![
            ("PROXY_MODE", "shared".into()),
            (
                "INPOD_UDS",
                self.path(&format!("{node}/ztunnel.sock"))
                    .display()
                    .to_string(),
            ),
            ("NODE_NAME", node.into()),
            ("XDS_ADDRESS", control.clone()),
            ("XDS_ROOT_CA", root.clone()),
            ("ALT_XDS_HOSTNAME", "control.test".into()),
            ("CA_ADDRESS", control),
            ("CA_ROOT_CA", root),
            ("ALT_CA_HOSTNAME", "control.test".into()),
            ("AUTH_TOKEN", node_token(node)),
            ("IPV6_ENABLED", "false".into()),
            ("ISTIO_META_DNS_CAPTURE", "false".into()),
            ("CONNECTION_TERMINATION_DEADLINE", "3s".into()),
        ]
    }

    fn start(nftables: bool) -> Cluster {
        let topo = Topology::builder()
            .pod("node1", "client")
            .pod("node1", "late")
            .pod("node2", "server")
            .node("zt2")
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut c = Cluster {
            topo,
            dir,
            rt,
            procs: Vec::new(),
        };
        for d in [
            "manifests",
            "node1/pods",
            "node2/pods",
            "node1/cni",
            "node2/cni",
        ] {
            std::fs::create_dir_all(c.path(d)).unwrap();
        }
        let ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  labels: {istio.io/dataplane-mode: ambient}\n";
        let all = format!(
            "{ns}{}{}",
            c.pod_manifest("client", true),
            c.pod_manifest("server", true)
        );
        std::fs::write(c.path("manifests/mesh.yaml"), &all).unwrap();
        for (node, pods) in [
            ("node1", &["client", "late"][..]),
            ("node2", &["server"][..]),
        ] {
            let manifests: String = pods.iter().map(|p| c.pod_manifest(p, false)).collect();
            std::fs::write(
                c.path(&format!("{node}/pods/pods.yaml")),
                format!("{ns}{manifests}"),
            )
            .unwrap();
        }
        std::fs::write(
            c.path("tokens.yaml"),
            format!(
                "tokens:\n- token: {}\n  node: node1\n- token: {}\n  node: node2\n",
                node_token("node1"),
                node_token("node2")
            ),
        )
        .unwrap();
        let listen = format!("{}:15012", c.topo.node("node1").ip());
        let manifests = c.path("manifests").display().to_string();
        let state = c.path("state").display().to_string();
        let tokens = c.path("tokens.yaml").display().to_string();
        c.spawn(
            "control",
            "node1",
            &[
                "control",
                "--manifests",
                &manifests,
                "--listen",
                &listen,
                "--state-dir",
                &state,
                "--tokens",
                &tokens,
                "--hostname",
                "control.test",
            ],
            &[],
        );
        let root = c.path("state/root-cert.pem");
        eventually_blocking("control CA root", SECS, || root.exists().then_some(()));
        for node in ["node1", "node2"] {
            let pods = c.path(&format!("{node}/pods")).display().to_string();
            let env = vec![
                ("NODE_NAME", node.to_string()),
                ("AMBIENT_ENABLED", "true".to_string()),
                ("AMBIENT_ENABLEMENT_SELECTOR", SELECTORS.to_string()),
                (
                    "ZTUNNEL_UDS_ADDRESS",
                    c.path(&format!("{node}/ztunnel.sock"))
                        .display()
                        .to_string(),
                ),
                (
                    "CNI_AGENT_RUN_DIR",
                    c.path(&format!("{node}/cni")).display().to_string(),
                ),
                ("AMBIT_HEALTH_ADDR", "127.0.0.1:8000".to_string()),
                ("AMBIT_METRICS_ADDR", "127.0.0.1:15014".to_string()),
                ("NATIVE_NFTABLES", nftables.to_string()),
            ];
            c.spawn(
                &format!("agent-{node}"),
                node,
                &["cni-agent", "--pods", &pods],
                &env,
            );
            let zenv = c.ztunnel_env(node);
            c.spawn(&format!("ztunnel-{node}"), node, &["ztunnel"], &zenv);
        }
        for node in ["node1", "node2"] {
            c.wait_ready(&format!("agent on {node}"), node, 8000, "/healthz");
            c.wait_ready(&format!("ztunnel on {node}"), node, 15021, "/healthz/ready");
        }
        c
    }

    /// Runs the CNI plugin for `pod` like a container runtime: env + network config on stdin.
    fn cni_add(&self, pod: &str) -> std::process::Output {
        let p = self.topo.pod(pod);
        let run_dir = self
            .path(&format!("{}/cni", p.node()))
            .display()
            .to_string();
        let config = format!(
            r#"{{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"istio-cni","cni_agent_run_dir":"{run_dir}","ambient_enabled":true,"exclude_namespaces":["kube-system"],"pod_namespace":"istio-system","plugin_log_level":"info","prevResult":{{"cniVersion":"1.0.0","interfaces":[{{"name":"eth0","sandbox":"{netns}"}}],"ips":[{{"address":"{ip}/32","interface":0}}]}}}}"#,
            netns = p.netns_path().display(),
            ip = p.ip(),
        );
        let mut cmd = self
            .topo
            .command(p.node(), env!("CARGO_BIN_EXE_ambit"))
            .unwrap();
        cmd.arg("cni-plugin")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", format!("sandbox-{pod}"))
            .env("CNI_NETNS", p.netns_path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/opt/cni/bin")
            .env(
                "CNI_ARGS",
                format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod};K8S_POD_INFRA_CONTAINER_ID=sandbox-{pod}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(config.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    fn start_app(&self) {
        let ns = self.topo.pod("server").netns();
        mesh::spawn_app(&self.rt, ns, SocketAddr::from(([0, 0, 0, 0], APP_PORT)));
    }

    fn ztunnel_listeners(&self, pod: &str) -> String {
        let out = self.topo.exec(pod, &["ss", "-tlnHe"]).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn pods_enrolled_through_cni_and_ztunnel_hand_off_iptables() {
    if ambit_netns::testing::netns_capable_or_skip("enrolled_iptables") {
        enrolled_through_cni_and_hand_off(false);
    }
}

#[test]
fn pods_enrolled_through_cni_and_ztunnel_hand_off_nftables() {
    if ambit_netns::testing::netns_capable_or_skip("enrolled_nftables") {
        enrolled_through_cni_and_hand_off(true);
    }
}

/// The whole scenario, with the agent's iptables or nftables backend.
fn enrolled_through_cni_and_hand_off(nftables: bool) {
    let mut c = Cluster::start(nftables);
    for pod in ["client", "server"] {
        let out = c.cni_add(pod);
        assert!(
            out.status.success(),
            "CNI ADD {pod}: {}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            c.logs()
        );
        let listeners = c.ztunnel_listeners(pod);
        for port in [15001, 15006, 15008] {
            assert!(
                listeners
                    .lines()
                    .any(|l| l.contains(&format!(":{port} ")) && l.contains("fwmark:0x539")),
                "{pod}: no marked listener on {port}:\n{listeners}"
            );
        }
    }
    c.start_app();
    let server = SocketAddr::from((c.topo.pod("server").ip(), APP_PORT));
    let client_ip = c.topo.pod("client").ip();
    let reply = eventually_blocking(
        "client → server through the in-pod listeners",
        SECS,
        || {
            let mut s = connect_from(c.topo.pod("client").netns(), server).ok()?;
            exchange(&mut s, "in-pod").ok()
        },
    );
    assert!(
        reply.starts_with(&format!("hello {client_ip}\n")),
        "{reply:?}"
    );
    let metrics = mesh::http_get(
        c.topo.node("node2").netns(),
        SocketAddr::from(([127, 0, 0, 1], 15020)),
        "/metrics",
    )
    .map(|(_, b)| b)
    .unwrap_or_default();
    assert!(
        mesh::counter(
            &metrics,
            "istio_tcp_connections_opened_total",
            &[
                "reporter=\"destination\"",
                "source_principal=\"spiffe://cluster.local/ns/default/sa/client\""
            ]
        ) >= 1.0,
        "{metrics}"
    );

    // Agent restart with live pods: the data path keeps working, and the new agent rebuilds
    // its snapshot for the connected ztunnel.
    let agent = c
        .procs
        .iter()
        .position(|(n, _)| n == "agent-node2")
        .unwrap();
    let pid = c.procs[agent].1.child.id();
    Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    eventually_blocking("agent exits", SECS, || {
        c.procs[agent].1.child.try_wait().ok().flatten()
    });
    // What the API server would hold by now: the annotation the agent wrote at enrolment.
    std::fs::write(
        c.path("node2/pods/pods.yaml"),
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  labels: {{istio.io/dataplane-mode: ambient}}\n{}",
            c.pod_manifest("server", true)
        ),
    )
    .unwrap();
    let mut during = connect_from(c.topo.pod("client").netns(), server).unwrap();
    exchange(&mut during, "agent-down").unwrap();
    let pods = c.path("node2/pods").display().to_string();
    let env = vec![
        ("NODE_NAME", "node2".to_string()),
        ("AMBIENT_ENABLED", "true".to_string()),
        ("AMBIENT_ENABLEMENT_SELECTOR", SELECTORS.to_string()),
        (
            "ZTUNNEL_UDS_ADDRESS",
            c.path("node2/ztunnel.sock").display().to_string(),
        ),
        (
            "CNI_AGENT_RUN_DIR",
            c.path("node2/cni").display().to_string(),
        ),
        ("AMBIT_HEALTH_ADDR", "127.0.0.1:8000".to_string()),
        ("AMBIT_METRICS_ADDR", "127.0.0.1:15014".to_string()),
        ("NATIVE_NFTABLES", nftables.to_string()),
    ];
    c.spawn(
        "agent-node2-restarted",
        "node2",
        &["cni-agent", "--pods", &pods],
        &env,
    );
    c.wait_ready("restarted agent", "node2", 8000, "/readyz");
    c.wait_ready(
        "ztunnel after the agent restart",
        "node2",
        15021,
        "/healthz/ready",
    );
    assert!(
        c.ztunnel_listeners("server").contains("fwmark:0x539"),
        "the pod's proxy survived the agent restart"
    );
    eventually_blocking("traffic after the agent restart", SECS, || {
        let mut s = connect_from(c.topo.pod("client").netns(), server).ok()?;
        exchange(&mut s, "agent-back").ok()
    });

    // A "kubelet probe" from the node reaches the app through the host SNAT path, as
    // 169.254.7.127, not through ztunnel.
    let reply = eventually_blocking("probe from the node", SECS, || {
        let mut s = connect_from(c.topo.node("node2").netns(), server).ok()?;
        exchange(&mut s, "probe").ok()
    });
    assert!(
        reply.starts_with("hello 169.254.7.127\n"),
        "probe source: {reply:?}"
    );

    // Hand-off: a new ztunnel for node2 (in its own namespace, like a new pod) connects to the
    // same agent, gets the snapshot and binds beside the old one; then the old one drains.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client_ns = c.topo.pod("client").netns().path();
    let load = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        std::thread::spawn(move || {
            let fd = ambit_netns::NetnsFd::open(&client_ns).unwrap();
            let factory = ambit_netns::NetnsSocketFactory::new(fd, None);
            // Bounded: at most 20,000 connections or until told to stop.
            for i in 0..20_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let result = (|| -> std::io::Result<String> {
                    let sock = factory
                        .new_tcp_stream_socket(server, None, &SocketOptions::default())
                        .map_err(std::io::Error::other)?;
                    sock.set_nonblocking(false)?;
                    sock.connect_timeout(&server.into(), Duration::from_secs(5))?;
                    let mut s: std::net::TcpStream = sock.into();
                    s.set_read_timeout(Some(Duration::from_secs(10)))?;
                    exchange(&mut s, &format!("n{i}"))
                })();
                match result {
                    Ok(r) if r.contains(&format!("n{i}")) => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    eventually_blocking("steady traffic", SECS, || {
        (ok.load(Ordering::Relaxed) > 20).then_some(())
    });
    let env = c.ztunnel_env("node2");
    c.spawn("ztunnel-node2-new", "zt2", &["ztunnel"], &env);
    c.wait_ready("new ztunnel", "zt2", 15021, "/healthz/ready");
    let before = ok.load(Ordering::Relaxed);
    let old = c
        .procs
        .iter()
        .position(|(n, _)| n == "ztunnel-node2")
        .unwrap();
    let pid = c.procs[old].1.child.id();
    Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    let exited = eventually_blocking("old ztunnel exits", SECS, || {
        c.procs[old].1.child.try_wait().ok().flatten()
    });
    assert!(exited.success(), "old ztunnel exit {exited:?}");
    eventually_blocking("traffic continues on the new ztunnel", SECS, || {
        (ok.load(Ordering::Relaxed) > before + 100).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("hand-off: {ok} connections succeeded, {failed} failed");
    assert_eq!(
        failed,
        0,
        "connections failed during the hand-off ({ok} succeeded)\n{}",
        c.logs()
    );
    assert!(
        c.ztunnel_listeners("server").contains("fwmark:0x539"),
        "new ztunnel serves the pod"
    );

    // Fail closed: with node1's ztunnel gone, a new pod's CNI ADD fails, and its traffic is
    // captured into ports nobody listens on instead of leaving in plaintext.
    let z1 = c
        .procs
        .iter()
        .position(|(n, _)| n == "ztunnel-node1")
        .unwrap();
    let _ = c.procs[z1].1.child.kill();
    let _ = c.procs[z1].1.child.wait();
    let out = c.cni_add("late");
    assert!(!out.status.success(), "CNI ADD succeeded without a ztunnel");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("\"code\"") && stdout.contains("\"msg\""),
        "CNI error JSON: {stdout}"
    );
    let late =
        connect_from(c.topo.pod("late").netns(), server).and_then(|mut s| exchange(&mut s, "leak"));
    assert!(
        late.is_err(),
        "an un-acked pod reached the server: {late:?}"
    );
}
