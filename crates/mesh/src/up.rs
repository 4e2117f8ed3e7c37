//! `ambit up`: from a checked manifest directory to a running mesh, step by step, each
//! component a real process talking its production protocol:
//!
//! 1. the topology (bridge, one namespace per node and per pod);
//! 2. `ambit control` in the bridge namespace (the nodes' underlay), watching the generated
//!    manifests (the user's objects + pod IPs + redirection annotations);
//! 3. per node, in the node namespace: `ambit cni-agent` (pods of the node from files, ZDS
//!    server, plugin socket) and `ambit ztunnel` in shared mode (ZDS client, xDS, CA);
//! 4. per pod, as a container runtime would: `ambit cni-plugin` ADD with the pod's netns and
//!    a prevResult holding its IP, then the pod's command as a process inside its netns.
//!
//! [`Mesh`] owns all of it; [`Mesh::shutdown`] (or dropping it) stops the processes in
//! reverse order, deletes the namespaces and the generated files.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ambit_contract::ports;
use ambit_netns::{NetnsFd, set_command_netns};
use ambit_topology::Topology;
use rand::Rng;
use serde_json::json;

use crate::manifests::{ManifestError, Manifests, PodStatus};
use crate::process::{self, ProcessError};
use crate::state::{
    MeshState, NodeState, Phase, PodState, ProcessRecord, Role, RunDir, StateError, ZtunnelPod,
    write_atomic,
};

/// The DNS name the control plane's certificate carries and ztunnels verify.
pub const CONTROL_HOSTNAME: &str = "istiod.istio-system.svc";
/// The node's primary CNI configuration (what the agent's installer chains `istio-cni` into).
pub const PRIMARY_CONFLIST: &str = "10-ambit-mesh.conflist";

/// How to bring a mesh up.
#[derive(Debug, Clone)]
pub struct UpConfig {
    /// The user's manifests.
    pub manifests: PathBuf,
    pub run_dir: PathBuf,
    /// The `ambit` executable every role is started from.
    pub ambit_exe: PathBuf,
    /// Another ztunnel for every node instead of `ambit ztunnel` (upstream's binary, for
    /// interop): started with no arguments and the same upstream environment variables.
    pub ztunnel_exe: Option<PathBuf>,
    /// Environment every child starts with (PATH, HOME, …); the library reads none itself.
    pub base_env: Vec<(String, String)>,
    /// How long each readiness wait may take.
    pub timeout: Duration,
    /// `RUST_LOG` for the components.
    pub log_level: String,
    /// DNS capture in the pods (agent rules + ztunnel DNS proxy).
    pub dns_capture: bool,
    /// The workload certificate lifetime the ztunnels ask for (their `SECRET_TTL`; `None`:
    /// ztunnel's default of 24 h). Short lifetimes rehearse renewals (the control plane
    /// issues no less than 60 s).
    pub cert_ttl: Option<Duration>,
    /// Set (e.g. by a signal handler) to abandon the start; everything created is removed.
    pub cancel: Arc<AtomicBool>,
}

/// Why `up` failed (everything it created is removed again before this is returned).
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error(transparent)]
    Manifests(#[from] ManifestError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(
        "a mesh is already running from {run_dir} (orchestrator pid {pid}); run `ambit down` first"
    )]
    Running { run_dir: PathBuf, pid: u32 },
    #[error("cleaning the previous run in {run_dir}: {source}")]
    Stale {
        run_dir: PathBuf,
        #[source]
        source: Box<crate::down::DownError>,
    },
    #[error("creating {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building the topology: {0}")]
    Topology(#[from] ambit_topology::TopologyError),
    #[error("entering a namespace: {0}")]
    Netns(#[from] ambit_netns::NetnsError),
    #[error("timed out after {timeout:?} waiting for {what} (see {log})")]
    Timeout {
        what: String,
        timeout: Duration,
        log: PathBuf,
    },
    #[error("{role} exited during start ({status}); see {log}")]
    Exited {
        role: Role,
        status: std::process::ExitStatus,
        log: PathBuf,
    },
    #[error("CNI {command} for pod {pod} failed ({status}): {output}")]
    CniAdd {
        pod: String,
        command: String,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("running the CNI plugin for pod {pod}: {source}")]
    CniExec {
        pod: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the node's CNI configuration {path}: {reason}")]
    CniConfig { path: PathBuf, reason: String },
    #[error("interrupted")]
    Cancelled,
    #[error("{role} cannot be started again: its command or namespace is not recorded")]
    NotRestartable { role: Role },
    #[error("{role} is not running")]
    NotRunning { role: Role },
    #[error("{role} (pid {pid}) did not stop")]
    Stuck { role: Role, pid: u32 },
    #[error(transparent)]
    Vm(#[from] crate::vm::VmError),
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> UpError + '_ {
    move |source| UpError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A running mesh. Dropping it tears everything down.
#[derive(Debug)]
pub struct Mesh {
    pub(crate) cfg: UpConfig,
    pub(crate) run: RunDir,
    pub(crate) manifests: Manifests,
    pub(crate) state: MeshState,
    pub(crate) pod_status: BTreeMap<String, PodStatus>,
    pub(crate) children: Vec<(ProcessRecord, Child)>,
    pub(crate) topology: Option<Topology>,
    pub(crate) supervisor: crate::supervise::Supervisor,
    done: bool,
}

impl Mesh {
    /// Checks the manifests (refusing bad ones before anything exists), cleans a stale run
    /// in the run directory, then brings the mesh up. `progress` gets one line per step.
    pub fn up(cfg: UpConfig, progress: &dyn Fn(&str)) -> Result<Mesh, UpError> {
        let manifests = Manifests::load_dir(&cfg.manifests)?;
        let run = RunDir::new(&cfg.run_dir);
        std::fs::create_dir_all(run.root()).map_err(io_err(run.root()))?;
        if let Some(old) = run.load()? {
            if let Some(o) = old
                .processes
                .iter()
                .find(|p| p.role == Role::Orchestrator && process::is_alive(p))
            {
                return Err(UpError::Running {
                    run_dir: run.root().to_path_buf(),
                    pid: o.pid,
                });
            }
            progress(&format!(
                "cleaning up the previous run (prefix {})",
                old.prefix
            ));
        }
        crate::down::sweep(&run, Duration::from_secs(5)).map_err(|e| UpError::Stale {
            run_dir: run.root().to_path_buf(),
            source: Box::new(e),
        })?;
        // Fresh logs for a fresh run.
        let _ = std::fs::remove_dir_all(run.logs());
        for dir in [run.logs(), run.manifests(), run.control()] {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        let prefix = ambit_topology::random_prefix();
        let state = MeshState {
            prefix: prefix.clone(),
            phase: Phase::Starting,
            source: cfg.manifests.clone(),
            control_address: None,
            root_cert: run.control().join("root-cert.pem"),
            nodes: Vec::new(),
            pods: Vec::new(),
            vms: Vec::new(),
            processes: vec![process::current(Role::Orchestrator)],
            restarts: Vec::new(),
        };
        // Record the prefix before the first namespace exists.
        run.save(&state)?;
        let mut mesh = Mesh {
            cfg,
            run,
            manifests,
            state,
            pod_status: BTreeMap::new(),
            children: Vec::new(),
            topology: None,
            supervisor: Default::default(),
            done: false,
        };
        match mesh.start(progress) {
            Ok(()) => Ok(mesh),
            Err(e) => {
                progress(&format!("start failed: {e}; removing what was created"));
                if let Err(te) = mesh.teardown() {
                    progress(&format!("teardown: {te}"));
                }
                Err(e)
            }
        }
    }

    pub(crate) fn check_cancel(&self) -> Result<(), UpError> {
        if self.cfg.cancel.load(Ordering::Relaxed) {
            Err(UpError::Cancelled)
        } else {
            Ok(())
        }
    }

    fn start(&mut self, progress: &dyn Fn(&str)) -> Result<(), UpError> {
        let nodes = self.manifests.nodes();
        progress(&format!(
            "creating topology {}: {} node(s), {} pod(s)",
            self.state.prefix,
            nodes.len(),
            self.manifests.pods().len()
        ));
        let mut b = Topology::builder().prefix(self.state.prefix.clone());
        for n in &nodes {
            b = b.node(n.clone());
        }
        for p in self.manifests.pods() {
            b = b.pod(p.node.clone(), p.topology_name.clone());
        }
        // After the user's pods, so their addresses do not depend on the ztunnel pods.
        for n in &nodes {
            b = b.pod(n.clone(), ztunnel_pod_name(n, 1));
        }
        // VMs are namespaces on the node network, after the nodes (whose addresses they
        // leave alone), with no agent or ztunnel of a node.
        for vm in self.manifests.vms() {
            b = b.node(vm.topology_name.clone());
        }
        let topo = b.build()?;
        for n in topo.nodes().filter(|n| nodes.iter().any(|m| m == n.name())) {
            let dir = self.run.node(n.name());
            std::fs::create_dir_all(dir.join("cni")).map_err(io_err(&dir))?;
            std::fs::create_dir_all(dir.join("pods")).map_err(io_err(&dir))?;
            self.state.nodes.push(NodeState {
                name: n.name().to_owned(),
                ip: n.ip(),
                netns: n.netns().path(),
                zds_socket: dir.join("ztunnel.sock"),
                agent_run_dir: dir.join("cni"),
                agent_health: SocketAddr::from(([127, 0, 0, 1], ports::AGENT_HEALTH)),
                agent_metrics: SocketAddr::from(([127, 0, 0, 1], ports::AGENT_METRICS)),
                ztunnel: topo
                    .get_pod(&ztunnel_pod_name(n.name(), 1))
                    .map(|z| ZtunnelPod {
                        name: z.name().to_owned(),
                        netns: z.netns_path(),
                        ip: z.ip(),
                        generation: 1,
                    }),
            });
        }
        for plan in self.manifests.pods() {
            let Some(tp) = topo.get_pod(&plan.topology_name) else {
                continue;
            };
            let workdir = self.run.pod(&plan.topology_name);
            std::fs::create_dir_all(&workdir).map_err(io_err(&workdir))?;
            self.pod_status.insert(
                plan.key(),
                PodStatus {
                    ip: Some(tp.ip()),
                    enrolled: false,
                    netns: Some(tp.netns_path().display().to_string()),
                },
            );
            self.state.pods.push(PodState {
                namespace: plan.namespace.clone(),
                name: plan.name.clone(),
                node: plan.node.clone(),
                ip: tp.ip(),
                netns: tp.netns_path(),
                ambient: plan.ambient,
                enrolled: false,
                created: false,
                argv: plan.argv.clone(),
                env: plan.env.clone(),
                workdir,
            });
        }
        self.plan_vms(&topo)?;
        let bridge_ip = topo.addressing().bridge_ip();
        let bridge_netns = topo.bridge().path();
        self.topology = Some(topo);
        let control_addr = SocketAddr::from((bridge_ip, ports::CONTROL_PLANE));
        self.state.control_address = Some(control_addr);
        self.run.save(&self.state)?;
        self.check_cancel()?;

        // Configuration files.
        self.write_manifests()?;
        let mut tokens = String::from("tokens:\n");
        let mut node_tokens = BTreeMap::new();
        for n in &nodes {
            let token = random_token();
            tokens += &format!("- token: \"{token}\"\n  node: \"{n}\"\n");
            node_tokens.insert(n.clone(), token);
        }
        let vm_tokens = self.vm_tokens(&mut tokens);
        write_atomic(&self.run.tokens(), tokens.as_bytes()).map_err(io_err(&self.run.tokens()))?;
        for n in &nodes {
            let path = self.run.node(n).join("pods/pods.yaml");
            let text = self.manifests.render(&self.pod_status, Some(n));
            write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
        }

        // Control plane.
        progress(&format!("starting control plane on {control_addr}"));
        let mut cmd = self.role_command(&bridge_netns)?;
        cmd.arg("control")
            .arg("--manifests")
            .arg(self.run.manifests())
            .arg("--listen")
            .arg(control_addr.to_string())
            .arg("--state-dir")
            .arg(self.run.control())
            .arg("--tokens")
            .arg(self.run.tokens())
            .arg("--mesh-config")
            .arg(self.run.mesh_config())
            .arg("--hostname")
            .arg(CONTROL_HOSTNAME);
        self.spawn(cmd, Role::Control, "control.log")?;
        let root = self.state.root_cert.clone();
        self.wait_for("control plane", &Role::Control, || {
            root.exists()
                && crate::probe::connect_in(&bridge_netns, control_addr, Duration::from_secs(1))
                    .is_ok()
        })?;
        progress("control plane ready");

        // Node components.
        for node in self.state.nodes.clone() {
            progress(&format!(
                "starting cni-agent and ztunnel on node {}",
                node.name
            ));
            // The primary network's config, as a node has one before istio-cni is installed
            // (the topology plays the primary plugin: veth + host-local address).
            let path = self.run.node(&node.name).join("cni").join(PRIMARY_CONFLIST);
            let cidr = self
                .topology
                .as_ref()
                .and_then(|t| t.get_node(&node.name))
                .map(|n| n.pod_cidr().to_string())
                .unwrap_or_default();
            let primary = json!({
                "cniVersion": "1.0.0",
                "name": "k8s-pod-network",
                "plugins": [{"type": "ptp", "ipam": {"type": "host-local", "ranges": [[{"subnet": cidr}]]}}]
            });
            write_atomic(&path, primary.to_string().as_bytes()).map_err(io_err(&path))?;
            let mut cmd = self.role_command(&node.netns)?;
            cmd.arg("cni-agent")
                .arg("--pods")
                .arg(self.run.node(&node.name).join("pods"))
                .arg("--pod-status")
                .arg(self.run.pod_status(&node.name))
                .env("NODE_NAME", &node.name)
                .env("ZTUNNEL_UDS_ADDRESS", &node.zds_socket)
                .env("CNI_AGENT_RUN_DIR", &node.agent_run_dir)
                .env("MOUNTED_CNI_NET_DIR", self.run.node(&node.name).join("cni"))
                .env("AMBIENT_ENABLED", "true")
                .env("AMBIENT_DNS_CAPTURE", bool_str(self.cfg.dns_capture))
                .env("AMBIENT_IPV6", "false")
                .env("AMBIT_HEALTH_ADDR", node.agent_health.to_string())
                .env("AMBIT_METRICS_ADDR", node.agent_metrics.to_string());
            self.spawn(
                cmd,
                Role::Agent {
                    node: node.name.clone(),
                },
                &format!("cni-agent-{}.log", node.name),
            )?;
            let address = format!("https://{control_addr}");
            let mut cmd = self.ztunnel_command(node.ztunnel_netns())?;
            cmd.env("PROXY_MODE", "shared")
                .env("INPOD_UDS", &node.zds_socket)
                .env("NODE_NAME", &node.name)
                .env("POD_NAME", format!("ztunnel-{}", node.name))
                .env("POD_NAMESPACE", "istio-system")
                .env("XDS_ADDRESS", &address)
                .env("CA_ADDRESS", &address)
                .env("XDS_ROOT_CA", &self.state.root_cert)
                .env("CA_ROOT_CA", &self.state.root_cert)
                .env("ALT_XDS_HOSTNAME", CONTROL_HOSTNAME)
                .env("ALT_CA_HOSTNAME", CONTROL_HOSTNAME)
                .env(
                    "AUTH_TOKEN",
                    node_tokens.get(&node.name).cloned().unwrap_or_default(),
                )
                .env("IPV6_ENABLED", "false")
                .env("ISTIO_META_DNS_CAPTURE", bool_str(self.cfg.dns_capture));
            if let Some(ttl) = self.cfg.cert_ttl {
                cmd.env("SECRET_TTL", format!("{}s", ttl.as_secs()));
            }
            self.spawn(
                cmd,
                Role::Ztunnel {
                    node: node.name.clone(),
                },
                &format!("ztunnel-{}.log", node.name),
            )?;
        }
        for node in self.state.nodes.clone() {
            let netns = node.netns.clone();
            let ztunnel_netns = node.ztunnel_netns().to_path_buf();
            self.wait_for(
                &format!("cni-agent on {}", node.name),
                &Role::Agent {
                    node: node.name.clone(),
                },
                || crate::probe::ok(&netns, node.agent_health, "/readyz"),
            )?;
            let ready = SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_READINESS));
            self.wait_for(
                &format!("ztunnel on {}", node.name),
                &Role::Ztunnel {
                    node: node.name.clone(),
                },
                || crate::probe::ok(&ztunnel_netns, ready, "/healthz/ready"),
            )?;
            progress(&format!("node {} ready", node.name));
        }

        // Pods, through the CNI plugin as a runtime would create them.
        for i in 0..self.state.pods.len() {
            self.check_cancel()?;
            self.create_pod(i, progress)?;
        }
        // VMs: their bundle, `ambit vm up`, then their command.
        for i in 0..self.state.vms.len() {
            self.check_cancel()?;
            self.start_vm(i, &vm_tokens, progress)?;
        }
        self.state.phase = Phase::Ready;
        self.run.save(&self.state)?;
        Ok(())
    }

    pub(crate) fn create_pod(&mut self, i: usize, progress: &dyn Fn(&str)) -> Result<(), UpError> {
        let pod = self.state.pods[i].clone();
        let key = format!("{}/{}", pod.namespace, pod.name);
        // A runtime retries a failed sandbox creation; so do we, within a bound: the agent
        // may not have read a just-written pod yet, or fails closed until ztunnel is back.
        let deadline = Instant::now() + self.cfg.timeout.min(Duration::from_secs(15));
        loop {
            match self.cni(&pod, "ADD") {
                Ok(()) => break,
                Err(e @ UpError::CniAdd { .. }) if Instant::now() < deadline => {
                    tracing::debug!(pod = %key, error = %e, "CNI ADD failed; retrying");
                    self.check_cancel()?;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
        self.state.pods[i].created = true;
        if pod.ambient {
            // What the agent writes in Kubernetes; here the control plane reads it from file.
            self.state.pods[i].enrolled = true;
            if let Some(st) = self.pod_status.get_mut(&key) {
                st.enrolled = true;
            }
            self.write_manifests()?;
        }
        self.run.save(&self.state)?;
        let mut cmd = Command::new(&pod.argv[0]);
        set_command_netns(&mut cmd, &NetnsFd::open(&pod.netns)?)?;
        cmd.args(&pod.argv[1..])
            .env_clear()
            .envs(self.cfg.base_env.iter().cloned())
            .env("HOSTNAME", &pod.name)
            .envs(pod.env.iter().cloned())
            .current_dir(&pod.workdir);
        self.spawn(
            cmd,
            Role::Pod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            },
            &format!("pod-{}-{}.log", pod.namespace, pod.name),
        )?;
        progress(&format!(
            "pod {key} on {} at {}: {}",
            pod.node,
            pod.ip,
            if pod.ambient {
                "enrolled in the mesh"
            } else {
                "not in the mesh"
            }
        ));
        Ok(())
    }

    /// Runs the CNI plugin executable for `pod` (`ADD` or `DEL`) as a runtime would: in
    /// the node's namespace, CNI_* environment, the network config on stdin with a
    /// prevResult holding the pod's address.
    pub(crate) fn cni(&self, pod: &PodState, command: &str) -> Result<(), UpError> {
        let key = format!("{}/{}", pod.namespace, pod.name);
        let Some(node) = self.state.nodes.iter().find(|n| n.name == pod.node) else {
            return Ok(());
        };
        let gateway = self
            .topology
            .as_ref()
            .and_then(|t| t.get_pod(&format!("{}.{}", pod.name, pod.namespace)))
            .map(|p| p.gateway().to_string())
            .unwrap_or_default();
        let uid = self
            .manifests
            .pods()
            .iter()
            .find(|p| p.key() == key)
            .map(|p| p.uid.clone())
            .unwrap_or_default();
        let netns = pod.netns.display().to_string();
        // As a runtime does: the node's chained config list, which the agent's installer
        // extended with its `istio-cni` entry; the primary plugin's work (veth, address) is
        // the topology's, so its result is the prevResult.
        let conflist = self.run.node(&node.name).join("cni").join(PRIMARY_CONFLIST);
        let list: serde_json::Value = std::fs::read(&conflist)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let Some(mut conf) = list["plugins"]
            .as_array()
            .and_then(|p| p.iter().find(|e| e["type"] == "istio-cni"))
            .cloned()
        else {
            return Err(UpError::CniConfig {
                path: conflist,
                reason: "no istio-cni entry (the agent's installer adds it)".into(),
            });
        };
        conf["cniVersion"] = list["cniVersion"].clone();
        conf["name"] = list["name"].clone();
        conf["prevResult"] = json!({
            "cniVersion": list["cniVersion"],
            "interfaces": [{"name": "eth0", "sandbox": netns}],
            "ips": [{"address": format!("{}/32", pod.ip), "gateway": gateway, "interface": 0}],
            "dns": {}
        });
        let container_id = format!("{}-{}", self.state.prefix, uid.replace('-', ""));
        let mut cmd = self.role_command(&node.netns)?;
        cmd.arg("cni-plugin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &container_id)
            .env("CNI_NETNS", &netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", self.cfg.ambit_exe.parent().unwrap_or(Path::new("/")))
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={uid}",
                    pod.namespace, pod.name
                ),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let cni_err = |source| UpError::CniExec {
            pod: key.clone(),
            source,
        };
        let mut child = cmd.spawn().map_err(cni_err)?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(conf.to_string().as_bytes())
                .map_err(cni_err)?;
        }
        let out = child.wait_with_output().map_err(cni_err)?;
        if !out.status.success() {
            return Err(UpError::CniAdd {
                pod: key,
                command: command.to_owned(),
                status: out.status,
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout).trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(())
    }

    /// A command for an `ambit` role inside `netns` with only the base environment.
    pub(crate) fn role_command(&self, netns: &Path) -> Result<Command, UpError> {
        self.command(&self.cfg.ambit_exe, netns)
    }

    /// A node's ztunnel inside `netns`: `ambit ztunnel`, or the configured ztunnel binary
    /// (which, like upstream's, takes its whole configuration from the environment).
    pub(crate) fn ztunnel_command(&self, netns: &Path) -> Result<Command, UpError> {
        match &self.cfg.ztunnel_exe {
            Some(exe) => self.command(exe, netns),
            None => {
                let mut cmd = self.role_command(netns)?;
                cmd.arg("ztunnel");
                Ok(cmd)
            }
        }
    }

    /// `program` inside `netns` with only the base environment.
    pub(crate) fn command(&self, program: &Path, netns: &Path) -> Result<Command, UpError> {
        let mut cmd = Command::new(program);
        set_command_netns(&mut cmd, &NetnsFd::open(netns)?)?;
        cmd.env_clear()
            .envs(self.cfg.base_env.iter().cloned())
            .env("RUST_LOG", &self.cfg.log_level);
        Ok(cmd)
    }

    pub(crate) fn spawn(&mut self, cmd: Command, role: Role, log: &str) -> Result<(), UpError> {
        let log = self.run.logs().join(log);
        let (child, record) = process::spawn(cmd, role, &log)?;
        self.state.processes.push(record.clone());
        self.track(record, child);
        self.run.save(&self.state)?;
        Ok(())
    }

    /// Polls `ready` until it holds, failing early if `role`'s process exits.
    pub(crate) fn wait_for(
        &mut self,
        what: &str,
        role: &Role,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), UpError> {
        let deadline = Instant::now() + self.cfg.timeout;
        let log = self
            .children
            .iter()
            .find(|(r, _)| &r.role == role)
            .and_then(|(r, _)| r.log.clone())
            .unwrap_or_default();
        loop {
            if ready() {
                return Ok(());
            }
            self.check_cancel()?;
            if let Some((r, c)) = self.children.iter_mut().find(|(r, _)| &r.role == role)
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(UpError::Exited {
                    role: r.role.clone(),
                    status,
                    log,
                });
            }
            if Instant::now() >= deadline {
                return Err(UpError::Timeout {
                    what: what.to_owned(),
                    timeout: self.cfg.timeout,
                    log,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Rewrites what the control plane and the agents read: like the API server, the files
    /// keep the enrolment annotation, so a restarted agent rebuilds its snapshot from them.
    pub(crate) fn write_manifests(&self) -> Result<(), UpError> {
        // Always written, so a MeshConfig applied later reaches the running control plane.
        let path = self.run.mesh_config();
        let text = match self.manifests.mesh_config() {
            Some(doc) => doc.text.clone(),
            None => "# no kind: MeshConfig in the manifests: the control plane's defaults\n".into(),
        };
        write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
        let path = self.run.manifests().join("mesh.yaml");
        let text = self.manifests.render(&self.pod_status, None);
        write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
        for n in &self.state.nodes {
            let path = self.run.node(&n.name).join("pods/pods.yaml");
            let text = self.manifests.render(&self.pod_status, Some(&n.name));
            write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
        }
        Ok(())
    }

    /// The current state (what `state.json` holds).
    pub fn state(&self) -> &MeshState {
        &self.state
    }

    /// The run directory.
    pub fn run_dir(&self) -> &RunDir {
        &self.run
    }

    /// Stops everything and removes the namespaces and generated files.
    pub fn shutdown(mut self) -> Result<(), crate::down::DownError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), crate::down::DownError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        self.state.phase = Phase::Stopping;
        // Processes `ambit restart` started (recorded on disk, not our children) go too.
        let mut adopted = Vec::new();
        if let Ok(Some(disk)) = self.run.load() {
            for p in disk.processes {
                if !self.state.processes.contains(&p) {
                    self.state.processes.push(p.clone());
                    adopted.push(p);
                }
            }
        }
        let _ = self.run.save(&self.state);
        // Pods first, then ztunnels, agents and the control plane (reverse start order).
        let records: Vec<ProcessRecord> = adopted
            .into_iter()
            .chain(self.children.iter().rev().map(|(r, _)| r.clone()))
            .collect();
        let children = &mut self.children;
        let left = process::stop_all(&records, Duration::from_secs(5), || {
            for (_, c) in children.iter_mut() {
                let _ = c.try_wait();
            }
        });
        self.children.clear();
        // Close our namespace descriptors, then delete the namespaces.
        self.topology = None;
        crate::down::finish(&self.run, &self.state.prefix, left)
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!(error = %e, "mesh teardown incomplete");
        }
    }
}

pub(crate) fn random_token() -> String {
    let mut rng = rand::rng();
    (0..32)
        .map(|_| char::from(b"0123456789abcdef"[rng.random_range(0..16)]))
        .collect()
}

/// The topology name of a node's ztunnel pod (no `.`: never a user pod's `name.namespace`).
pub(crate) fn ztunnel_pod_name(node: &str, generation: u32) -> String {
    format!("ztunnel-{node}-{generation}")
}

fn bool_str(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}
