//! End to end for a VM (`docs/vm.md`): `ambit control` in a node namespace, pods each with an
//! `ambit ztunnel` fed only by xDS, and a VM network namespace bootstrapped ONLY from the
//! bundle `ambit vm configure` writes, brought up with `ambit vm up DIR` and taken down with
//! `ambit vm down`. Asserts: pod → VM service over HBONE with the VM's SPIFFE identity in the
//! pod ztunnel's access log; VM → pod service over HBONE; an AuthorizationPolicy on the VM's
//! workload denies one pod's identity and allows another's; port 22 in the VM answers in
//! plaintext before, during and after `vm up` and after a failed start; `vm down` leaves the
//! VM namespace's iptables and nftables rulesets as they were before. Needs root.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

#[path = "support/mesh.rs"]
mod mesh;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ambit_topology::Topology;
use mesh::{APP_PORT, Proc, connect_from, eventually_blocking, exchange};

const SECS: Duration = Duration::from_secs(30);
const SSH_PORT: u16 = 22;
/// The service the VM's workload backs, and the one the server pod backs.
const VM_VIP: [u8; 4] = [10, 96, 0, 20];
const POD_VIP: [u8; 4] = [10, 96, 0, 10];
const VM_ID: &str = "spiffe://cluster.local/ns/default/sa/vm-sa";
/// Pods with their own ztunnel; `denied` is refused by the VM's policy.
const PODS: [&str; 3] = ["client", "denied", "server"];

fn token(name: &str) -> String {
    format!("{name}-token-0123456789abcdef")
}

struct VmMesh {
    topo: Topology,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    procs: Vec<Proc>,
    /// The running `ambit vm up`, stopped with `vm down` on drop (also on panic) so that its
    /// ztunnel goes with it.
    vm_up: Option<Proc>,
}

impl Drop for VmMesh {
    fn drop(&mut self) {
        if self.vm_up.is_some() {
            let _ = self
                .vm_cmd(&["vm", "down", "--run-dir", &self.run_dir()])
                .output();
        }
        self.vm_up = None;
    }
}

impl VmMesh {
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn run_dir(&self) -> String {
        self.path("vm-run").display().to_string()
    }

    fn manifests(&self, extra: &str) -> String {
        let mut y = String::from(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  labels: {istio.io/dataplane-mode: ambient}\n",
        );
        // The VM is not declared: its ztunnel auto-registers it from this group.
        y += &format!("---\n{}", workload_group());
        for (name, sa, app) in PODS.iter().map(|p| (*p, *p, *p)) {
            let pod = self.topo.pod(name);
            y += &format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{app: {app}}}\n  annotations: {{ambient.istio.io/redirection: enabled}}\nspec:\n  nodeName: {node}\n  serviceAccountName: {sa}\n  containers: [{{name: app, image: x, ports: [{{name: http, containerPort: {APP_PORT}}}]}}]\nstatus:\n  podIP: {ip}\n",
                node = pod.node(),
                ip = pod.ip(),
            );
        }
        for (svc, app, vip) in [("echo", "server", POD_VIP), ("vm-echo", "vm", VM_VIP)] {
            let vip = std::net::Ipv4Addr::from(vip);
            y += &format!(
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: default}}\nspec:\n  selector: {{app: {app}}}\n  clusterIP: {vip}\n  ports: [{{name: http, port: 80, targetPort: http}}]\n"
            );
        }
        y += extra;
        y
    }

    fn write(&self, extra: &str) {
        let tmp = self.path("mesh.yaml.tmp");
        std::fs::write(&tmp, self.manifests(extra)).unwrap();
        std::fs::rename(&tmp, self.path("manifests/mesh.yaml")).unwrap();
    }

    fn control_addr(&self) -> SocketAddr {
        SocketAddr::from((self.topo.node("node1").ip(), 15012))
    }

    fn spawn_control(&mut self) {
        let args = [
            "control".to_string(),
            "--manifests".into(),
            self.path("manifests").display().to_string(),
            "--listen".into(),
            self.control_addr().to_string(),
            "--state-dir".into(),
            self.path("state").display().to_string(),
            "--tokens".into(),
            self.path("tokens.yaml").display().to_string(),
            "--hostname".into(),
            "control.test".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proc = self.spawn("control", "node1", &args, &[]);
        self.procs.push(proc);
    }

    fn start() -> VmMesh {
        let topo = Topology::builder()
            .pod("node1", "client")
            .pod("node1", "denied")
            .pod("node2", "server")
            .pod("node2", "vm")
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("manifests")).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut m = VmMesh {
            topo,
            dir,
            rt,
            procs: Vec::new(),
            vm_up: None,
        };
        m.write("");
        let tokens = PODS
            .iter()
            .map(|p| {
                format!(
                    "- token: {}\n  identity: spiffe://cluster.local/ns/default/sa/{p}\n",
                    token(p)
                )
            })
            .collect::<String>();
        std::fs::write(m.path("tokens.yaml"), format!("tokens:\n{tokens}")).unwrap();

        // The control plane creates its CA at the first start; the bundle needs its root and
        // the token file gains the VM's token, read at start: so start, configure, restart.
        m.spawn_control();
        let root = m.path("state/root-cert.pem");
        eventually_blocking("control plane CA root", SECS, || {
            root.exists().then_some(())
        });
        m.procs.clear();
        m.configure();
        m.spawn_control();
        let addr = m.control_addr();
        eventually_blocking("control plane listening again", SECS, || {
            connect_from(m.topo.node("node1").netns(), addr)
                .ok()
                .map(|_| ())
        });

        for pod in PODS {
            m.start_pod_ztunnel(pod);
        }
        for pod in PODS {
            let ns = m.topo.pod(pod).netns();
            let ready = SocketAddr::from(([127, 0, 0, 1], 15021));
            eventually_blocking(&format!("{pod} ztunnel ready"), SECS, || {
                matches!(mesh::http_get(ns, ready, "/healthz/ready"), Some((200, _))).then_some(())
            });
        }
        let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
        mesh::spawn_app(&m.rt, m.topo.pod("server").netns(), any(APP_PORT));
        mesh::spawn_app(&m.rt, m.topo.pod("vm").netns(), any(APP_PORT));
        // "SSH": a plain TCP listener, never behind the mesh.
        mesh::spawn_app(&m.rt, m.topo.pod("vm").netns(), any(SSH_PORT));
        m
    }

    /// `ambit vm configure` for the VM's WorkloadGroup into `bundle/`.
    fn configure(&self) {
        let wg = self.path("workloadgroup.yaml");
        std::fs::write(&wg, workload_group()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
            .args(["vm", "configure", "-f"])
            .arg(&wg)
            .arg("-o")
            .arg(self.path("bundle"))
            .args(["--ca-address", "control.test:15012", "--ingress-ip"])
            .arg(self.topo.node("node1").ip().to_string())
            .arg("--internal-ip")
            .arg(self.topo.pod("vm").ip().to_string())
            .arg("--root-cert")
            .arg(self.path("state/root-cert.pem"))
            .arg("--tokens")
            .arg(self.path("tokens.yaml"))
            .arg("--autoregister")
            // The test's VM does not capture DNS (no resolver inside the namespace).
            .arg("--capture-dns=false")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "vm configure: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start_pod_ztunnel(&mut self, pod: &str) {
        let cfg = ambit_redirect::PodRedirectConfig {
            ipv6: false,
            dns_capture: false,
            ..Default::default()
        };
        let runner = ambit_redirect::IpNetnsExec {
            name: self.topo.pod(pod).netns_name().to_string(),
        };
        ambit_redirect::InPod::new(ambit_redirect::Backend::Iptables, cfg)
            .apply(&runner)
            .unwrap();
        let address = format!("https://{}", self.control_addr());
        let info = format!("default/{pod}/{pod}");
        let token = token(pod);
        let root = self.path("state/root-cert.pem").display().to_string();
        let proc = self.spawn(
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
        self.procs.push(proc);
    }

    fn spawn(&self, name: &str, ns: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
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
        Proc {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    /// `ambit ARGS` inside the VM's namespace.
    fn vm_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = self
            .topo
            .command("vm", env!("CARGO_BIN_EXE_ambit"))
            .unwrap();
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null());
        cmd
    }

    fn vm_up(&mut self, bundle: &Path, log: &str) -> Proc {
        let bundle = bundle.display().to_string();
        let run_dir = self.run_dir();
        self.spawn(
            log,
            "vm",
            &[
                "vm",
                "up",
                &bundle,
                "--run-dir",
                &run_dir,
                "--ready-timeout",
                "30",
            ],
            &[],
        )
    }

    /// The VM namespace's rules and non-builtin chains and tables, from iptables-save,
    /// ip6tables-save and `nft list ruleset`. The empty builtin chains (and their tables)
    /// iptables-nft leaves behind once it has been used are not rules and are left out.
    fn rulesets(&self) -> String {
        const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "FORWARD"];
        let ns = self.topo.pod("vm").netns_name().to_string();
        let mut all = String::new();
        for cmd in [
            &["iptables-save"][..],
            &["ip6tables-save"][..],
            &["nft", "list", "ruleset"][..],
        ] {
            let out = Command::new("ip")
                .args(["netns", "exec", &ns])
                .args(cmd)
                .output()
                .unwrap();
            assert!(out.status.success(), "{cmd:?} in the VM namespace failed");
            let kept = |l: &str| {
                let l = l.trim();
                let word = |i| l.split_whitespace().nth(i).unwrap_or("");
                let builtin_chain = |c: &str| BUILTIN.contains(&c);
                if cmd[0] == "nft" {
                    !(l.is_empty()
                        || l == "}"
                        || (word(0) == "table"
                            && matches!(word(1), "ip" | "ip6")
                            && matches!(word(2), "nat" | "raw" | "filter" | "mangle"))
                        || (word(0) == "chain" && builtin_chain(word(1)))
                        || (word(0) == "type" && l.contains(" hook ")))
                } else {
                    l.starts_with("-A")
                        || (l.starts_with(':')
                            && !builtin_chain(l[1..].split(' ').next().unwrap_or("")))
                }
            };
            let text = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| kept(l))
                .collect::<Vec<_>>()
                .join("\n");
            all += &format!("== {cmd:?}\n{text}\n");
        }
        all
    }

    fn reachable(&self, from: &str, dst: SocketAddr) -> bool {
        connect_from(self.topo.pod(from).netns(), dst)
            .and_then(|mut s| exchange(&mut s, "ping"))
            .is_ok()
    }

    /// Port 22 of the VM from the other node's namespace, in plaintext.
    fn ssh_answers(&self) -> bool {
        let dst = SocketAddr::from((self.topo.pod("vm").ip(), SSH_PORT));
        connect_from(self.topo.node("node1").netns(), dst)
            .and_then(|mut s| exchange(&mut s, "ssh"))
            .is_ok()
    }

    /// Polls `f` until it holds, for [`SECS`]; on timeout panics with every process's log.
    fn wait(&self, what: &str, f: impl Fn() -> bool) {
        ambit_testkit::eventually_blocking_every(
            what,
            SECS,
            Duration::from_millis(50),
            || self.logs(),
            f,
        );
    }

    /// Whether a line of `name`'s log holds every needle.
    fn log_line(&self, name: &str, needles: &[&str]) -> bool {
        std::fs::read_to_string(self.path(&format!("{name}.log")))
            .unwrap_or_default()
            .lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
    }

    fn logs(&self) -> String {
        self.procs
            .iter()
            .chain(self.vm_up.iter())
            .map(|p| format!("== {}\n{}", p.log.display(), p.log_text()))
            .collect()
    }
}

/// The VM's WorkloadGroup: `vm configure` reads it, and `ambit control` registers the VM from
/// it when the VM's ztunnel connects.
fn workload_group() -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {{name: vm, namespace: default}}\nspec:\n  metadata: {{labels: {{app: vm}}}}\n  template: {{serviceAccount: vm-sa, ports: {{http: {APP_PORT}}}}}\n"
    )
}

const DENY_AT_VM: &str = "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: vm-deny, namespace: default}\nspec:\n  selector: {matchLabels: {app: vm}}\n  action: DENY\n  rules: [{from: [{source: {principals: [cluster.local/ns/default/sa/denied]}}]}]\n";

#[test]
fn vm_from_its_bundle_joins_the_mesh() {
    if !ambit_netns::testing::netns_capable_or_skip("vm_from_its_bundle_joins_the_mesh") {
        return;
    }
    let mut m = VmMesh::start();
    let vm_svc = SocketAddr::from((VM_VIP, 80));
    let pod_svc = SocketAddr::from((POD_VIP, 80));
    let before = m.rulesets();
    assert!(m.ssh_answers(), "port 22 before vm up\n{}", m.logs());

    // A failed start (the control plane's name points nowhere): no rule, SSH still answers.
    let broken = m.path("bundle-broken");
    std::fs::create_dir(&broken).unwrap();
    for f in std::fs::read_dir(m.path("bundle")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), broken.join(f.file_name())).unwrap();
    }
    std::fs::write(broken.join("hosts"), "127.0.0.1 control.test\n").unwrap();
    let mut failed = m.vm_up(&broken, "vm-up-broken");
    let status = failed.child.wait().unwrap();
    assert!(
        !status.success(),
        "vm up with an unreachable control plane succeeded"
    );
    assert!(
        failed.log_text().contains("unreachable"),
        "the failure names the cause: {}",
        failed.log_text()
    );
    assert_eq!(m.rulesets(), before, "a failed start left rules");
    assert!(m.ssh_answers(), "port 22 after a failed start");

    // `vm up` from the bundle only.
    let bundle = m.path("bundle");
    m.vm_up = Some(m.vm_up(&bundle, "vm-up"));
    m.wait("vm up wrote its rules", || {
        m.rulesets().contains("ISTIO_VM")
    });
    assert!(m.ssh_answers(), "port 22 during vm up\n{}", m.logs());

    m.wait("client → VM service over HBONE", || {
        m.reachable("client", vm_svc)
    });
    // The pod's ztunnel verified the VM's certificate: its access log names the identity.
    m.wait("the client's ztunnel logged the VM's identity", || {
        m.log_line(
            "ztunnel-client",
            &[
                "direction=outbound",
                "dst.workload=vm",
                &format!("dst.identity={VM_ID}"),
            ],
        )
    });
    m.wait("VM → pod service over HBONE", || {
        m.reachable("vm", pod_svc)
    });
    m.wait("the server's ztunnel logged the VM's identity", || {
        m.log_line(
            "ztunnel-server",
            &["direction=inbound", &format!("src.identity={VM_ID}")],
        )
    });

    // The VM enforces policy on its own workload.
    m.write(DENY_AT_VM);
    m.wait("the VM refuses `denied`", || !m.reachable("denied", vm_svc));
    assert!(
        m.reachable("client", vm_svc),
        "client still allowed\n{}",
        m.logs()
    );
    m.write("");
    m.wait("`denied` allowed again", || m.reachable("denied", vm_svc));

    // A SIGKILLed `vm up` takes its ztunnel with it, and a new `vm up` recovers: the stale
    // rules are replaced, not duplicated.
    let ready = SocketAddr::from(([127, 0, 0, 1], 15021));
    let vm_ns = m.topo.pod("vm").netns();
    assert!(mesh::http_get(vm_ns, ready, "/healthz/ready").is_some());
    let mut killed = m.vm_up.take().unwrap();
    killed.child.kill().unwrap();
    killed.child.wait().unwrap();
    m.wait("the killed vm up's ztunnel exited", || {
        mesh::http_get(vm_ns, ready, "/healthz/ready").is_none()
    });
    let rules_after_kill = m.rulesets();
    m.vm_up = Some(m.vm_up(&bundle, "vm-up-again"));
    m.wait("client → VM service after the restart", || {
        m.reachable("client", vm_svc)
    });
    m.wait("the restarted vm up wrote its rules", || {
        m.rulesets().contains("-A OUTPUT -j ISTIO_VM_OUTPUT")
    });
    let again = m.rulesets();
    assert_eq!(
        // Once per family (iptables and ip6tables).
        again.matches("-A PREROUTING -j ISTIO_VM_PRERT").count(),
        2,
        "rules duplicated by the restart:\n{again}\n(after the kill:\n{rules_after_kill})"
    );

    // `vm down` leaves the namespace as it was.
    let out = m
        .vm_cmd(&["vm", "down", "--run-dir", &m.run_dir()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vm down: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut up = m.vm_up.take().unwrap();
    eventually_blocking("vm up exited", SECS, || {
        up.child.try_wait().unwrap().map(|_| ())
    });
    assert_eq!(m.rulesets(), before, "vm down left rules");
    assert!(m.ssh_answers(), "port 22 after vm down");
    assert!(
        !m.reachable("client", vm_svc),
        "VM service still served after vm down"
    );
}
