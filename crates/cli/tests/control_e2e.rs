//! End to end with the control plane: `ambit control` (CA + xDS from a manifest directory) in
//! a node namespace, `ambit ztunnel` processes in pod namespaces fed only by xDS. Policy and
//! PeerAuthentication edits to the manifest files must be enforced within 2 s while traffic
//! flows. Needs root (network namespaces).

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

#[path = "support/mesh.rs"]
mod mesh;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ambit_testkit::eventually_blocking_every;

use ambit_topology::Topology;
use mesh::{APP_PORT, Proc, connect_from, eventually_blocking, exchange};

const SECS: Duration = Duration::from_secs(30);
/// The bound for "edit a file → enforced".
const ENFORCED_WITHIN: Duration = Duration::from_secs(2);

struct ControlMesh {
    topo: Topology,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    procs: Vec<Proc>,
}

fn token(name: &str) -> String {
    format!("{name}-token-0123456789abcdef")
}

impl ControlMesh {
    fn pods_yaml(&self, extra: &str) -> String {
        let mut y = String::from(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  labels: {istio.io/dataplane-mode: ambient}\n",
        );
        for (name, mesh) in [("client", true), ("server", true), ("plain", false)] {
            let pod = self.topo.pod(name);
            let annotations = if mesh {
                "  annotations: {ambient.istio.io/redirection: enabled}\n"
            } else {
                ""
            };
            y += &format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{app: {name}}}\n{annotations}spec:\n  nodeName: {node}\n  serviceAccountName: {name}\n  containers: [{{name: app, image: x, ports: [{{name: http, containerPort: {APP_PORT}}}]}}]\nstatus:\n  podIP: {ip}\n",
                node = pod.node(),
                ip = pod.ip(),
            );
        }
        y += "---\napiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: default}\nspec:\n  selector: {app: server}\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80, targetPort: http}]\n";
        y += extra;
        y
    }

    fn write(&self, extra: &str) {
        let path = self.dir.path().join("manifests/mesh.yaml");
        let tmp = self.dir.path().join("mesh.yaml.tmp");
        std::fs::write(&tmp, self.pods_yaml(extra)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    fn start() -> ControlMesh {
        let topo = Topology::builder()
            .pod("node1", "client")
            .pod("node2", "server")
            .pod("node1", "plain")
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("manifests")).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut m = ControlMesh {
            topo,
            dir,
            rt,
            procs: Vec::new(),
        };
        m.write("");
        let tokens = ["client", "server", "plain"]
            .iter()
            .map(|p| {
                format!(
                    "- token: {}\n  identity: spiffe://cluster.local/ns/default/sa/{p}\n",
                    token(p)
                )
            })
            .collect::<String>();
        std::fs::write(
            m.dir.path().join("tokens.yaml"),
            format!("tokens:\n{tokens}"),
        )
        .unwrap();
        let node1 = m.topo.node("node1").ip();
        let listen = SocketAddr::from((node1, 15012));
        m.spawn(
            "control",
            "node1",
            &[
                "control",
                "--manifests",
                &m.dir.path().join("manifests").display().to_string(),
                "--listen",
                &listen.to_string(),
                "--state-dir",
                &m.dir.path().join("state").display().to_string(),
                "--tokens",
                &m.dir.path().join("tokens.yaml").display().to_string(),
                "--hostname",
                "control.test",
            ],
            &[],
        );
        let root = m.dir.path().join("state/root-cert.pem");
        eventually_blocking("control plane CA root", SECS, || {
            root.exists().then_some(())
        });
        for pod in ["client", "server"] {
            let cfg = ambit_redirect::PodRedirectConfig {
                ipv6: false,
                dns_capture: false,
                ..Default::default()
            };
            let runner = ambit_redirect::IpNetnsExec {
                name: m.topo.pod(pod).netns_name().to_string(),
            };
            ambit_redirect::InPod::new(ambit_redirect::Backend::Iptables, cfg)
                .apply(&runner)
                .unwrap();
            let address = format!("https://{listen}");
            let info = format!("default/{pod}/{pod}");
            let token = token(pod);
            let root = root.display().to_string();
            m.spawn(
                &format!("ztunnel-{pod}"),
                pod,
                &["ztunnel"],
                &[
                    ("PROXY_MODE", "dedicated"),
                    ("PROXY_WORKLOAD_INFO", &info),
                    ("XDS_ADDRESS", &address),
                    ("XDS_ROOT_CA", &root),
                    ("ALT_XDS_HOSTNAME", "control.test"),
                    ("CA_ADDRESS", &address),
                    ("CA_ROOT_CA", &root),
                    ("ALT_CA_HOSTNAME", "control.test"),
                    ("AUTH_TOKEN", &token),
                    ("PACKET_MARK", "1337"),
                    ("IPV6_ENABLED", "false"),
                    ("ISTIO_META_DNS_CAPTURE", "false"),
                ],
            );
        }
        for pod in ["client", "server"] {
            let ns = m.topo.pod(pod).netns();
            eventually_blocking_every(
                &format!("{pod}'s ztunnel ready"),
                SECS,
                Duration::from_millis(50),
                || m.logs(),
                || {
                    matches!(
                        mesh::http_get(
                            ns,
                            SocketAddr::from(([127, 0, 0, 1], 15021)),
                            "/healthz/ready",
                        ),
                        Some((200, _))
                    )
                },
            );
        }
        m.start_app();
        m
    }

    fn spawn(&mut self, name: &str, ns: &str, args: &[&str], env: &[(&str, &str)]) {
        let log = self.dir.path().join(format!("{name}.log"));
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
        self.procs.push(Proc {
            child: cmd.spawn().unwrap(),
            log,
        });
    }

    fn start_app(&self) {
        let ns = self.topo.pod("server").netns();
        mesh::spawn_app(&self.rt, ns, SocketAddr::from(([0, 0, 0, 0], APP_PORT)));
    }

    fn reachable(&self, from: &str, dst: SocketAddr) -> bool {
        connect_from(self.topo.pod(from).netns(), dst)
            .and_then(|mut s| exchange(&mut s, "ping"))
            .is_ok()
    }

    fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("== {}\n{}", p.log.display(), p.log_text()))
            .collect()
    }
}

const STRICT: &str = "---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: istio-system}\nspec:\n  mtls: {mode: STRICT}\n";
const DENY_CLIENT: &str = "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny-client, namespace: default}\nspec:\n  action: DENY\n  rules: [{from: [{source: {principals: [cluster.local/ns/default/sa/client]}}]}]\n";

#[test]
fn manifest_edits_are_enforced_within_two_seconds() {
    if !ambit_netns::testing::netns_capable_or_skip(
        "manifest_edits_are_enforced_within_two_seconds",
    ) {
        return;
    }
    let m = ControlMesh::start();
    let server = SocketAddr::from((m.topo.pod("server").ip(), APP_PORT));
    let vip = SocketAddr::from(([10, 96, 0, 10], 80));
    eventually_blocking("client → server over HBONE", SECS, || {
        m.reachable("client", server).then_some(())
    });
    eventually_blocking("client → service VIP", SECS, || {
        m.reachable("client", vip).then_some(())
    });
    assert!(
        m.reachable("plain", server),
        "plaintext allowed without PeerAuthentication"
    );

    // (manifest addition, client allowed, plaintext allowed)
    let cases = [
        (STRICT.to_string(), true, false),
        (DENY_CLIENT.to_string(), false, true),
        (format!("{STRICT}{DENY_CLIENT}"), false, false),
        (String::new(), true, true),
    ];
    for (extra, client_ok, plain_ok) in cases {
        let written = Instant::now();
        m.write(&extra);
        let deadline = written + ENFORCED_WITHIN;
        loop {
            let client = m.reachable("client", server);
            let plain = m.reachable("plain", server);
            if client == client_ok && plain == plain_ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not enforced within {ENFORCED_WITHIN:?} (client={client}, plain={plain}) for:\n{extra}\n{}",
                m.logs()
            );
        }
    }
}
