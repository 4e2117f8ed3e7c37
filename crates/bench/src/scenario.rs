//! Scenarios: what sits between the client pod (node 1) and the server pod (node 2).
//!
//! Every scenario gets its own topology (its own namespaces, so scenarios never share
//! sockets, conntrack or sysctls) with the same servers, so the load generators see only
//! a different path:
//!
//! - [`ScenarioKind::Baseline`]: no proxy, no rules: the kernel path between two pods.
//! - [`ScenarioKind::InPod`] (the default mesh): what a cluster node runs. Per node, the
//!   node agent (`cni-agent`, pods from manifest files) and one ztunnel in shared mode
//!   (`PROXY_MODE=shared`, ZDS over `INPOD_UDS`) as processes in the node namespace; pods
//!   enrolled by running the CNI plugin executable (`cni-plugin`, CNI_* environment, network
//!   configuration with a prevResult on stdin) as a container runtime does, so the agent
//!   applies the in-pod rules and hands the pod's netns to ztunnel, which binds its
//!   listeners inside it.
//! - [`ScenarioKind::Dedicated`]: one ztunnel per pod in dedicated mode (inside the pod's
//!   namespace, in-pod redirection rules applied by the harness).
//!
//! Both mesh scenarios configure ztunnel exactly like upstream ztunnel: upstream environment
//! variables, a `LOCAL_XDS_PATH` file with the workloads, certificates from a CA gRPC server
//! in node 1 (in-process, the same service `ambit control` runs), a token and a root
//! certificate at upstream's default relative paths under the working directory. Any
//! ztunnel binary honouring those runs here.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use ambit_control::ca::{CaService, Caller, StaticAuthorizer};
use ambit_model::SpiffeId;
use ambit_netns::{NetnsSocketFactory, SocketFactory, SocketOptions};
use ambit_proto::ca::istio_certificate_service_server::IstioCertificateServiceServer;
use ambit_redirect::{Backend, InPod, IpNetnsExec, PodRedirectConfig};
use ambit_tls::LocalCa;
use ambit_topology::Topology;
use anyhow::{Context, Result, bail};
use tokio::task::JoinSet;

use crate::{inpod, load};

const TRUST_DOMAIN: &str = "cluster.local";
/// The name the CA's server certificate carries (`ALT_CA_HOSTNAME`).
const CA_HOSTNAME: &str = "ca.bench";
const CLIENT: &str = "client";
const SERVER: &str = "server";
const CLIENT_NODE: &str = "node1";
/// The ZDS socket in each node's directory.
const ZDS_SOCKET: &str = "ztunnel.sock";
const SERVER_NODE: &str = "node2";
/// ztunnel's admin server in its own namespace (`/config_dump`).
const ADMIN: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 15000);
/// The agent's health endpoint in its node namespace.
const AGENT_HEALTH: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8000);
/// The workload file (`LOCAL_XDS_PATH`) in the scenario's directory.
const LOCAL_CONFIG: &str = "local.yaml";
/// How long a proxy may take to become ready and carry the first echo.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a ztunnel: `program args...`, configured through the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZtunnelCmd {
    /// Which implementation it is, for descriptions ("ambit", "upstream").
    pub label: String,
    /// The executable.
    pub program: PathBuf,
    /// Arguments before any environment (`["ztunnel"]` for `ambit`, none for upstream).
    pub args: Vec<String>,
}

/// A kind of scenario, before it is started.
#[derive(Clone, Debug)]
pub enum ScenarioKind {
    /// Pods talk directly.
    Baseline,
    /// A dedicated-mode ztunnel in each pod.
    Dedicated {
        /// Scenario name in the reports.
        name: String,
        /// What to run.
        ztunnel: ZtunnelCmd,
        /// `ZTUNNEL_WORKER_THREADS`.
        workers: usize,
    },
    /// Node agent + shared-mode ztunnel per node; pods enrolled through the CNI plugin.
    InPod {
        /// Scenario name in the reports.
        name: String,
        /// The ztunnel of the client's node and of the server's node (different ones make
        /// a mixed fleet: the traffic crosses from one implementation to the other).
        ztunnels: [ZtunnelCmd; 2],
        /// The program whose `cni-agent` and `cni-plugin` subcommands are the agent and
        /// the plugin (`ambit`, or this binary).
        ambit: PathBuf,
        /// `ZTUNNEL_WORKER_THREADS`.
        workers: usize,
    },
}

impl ScenarioKind {
    /// The name in the reports.
    pub fn name(&self) -> &str {
        match self {
            Self::Baseline => "baseline",
            Self::Dedicated { name, .. } | Self::InPod { name, .. } => name,
        }
    }

    /// Whether the scenario runs node agents (in-pod mode).
    pub fn is_in_pod(&self) -> bool {
        matches!(self, Self::InPod { .. })
    }

    /// Whether the two nodes run different ztunnels (a mixed fleet): only the traffic
    /// measurements apply, the proxies' memory is not one implementation's.
    pub fn is_mixed(&self) -> bool {
        matches!(self, Self::InPod { ztunnels: [a, b], .. } if a != b)
    }

    /// A printable description (what runs, how).
    pub fn describe(&self) -> String {
        match self {
            Self::Baseline => "no proxy, no redirection".into(),
            Self::Dedicated {
                ztunnel, workers, ..
            } => format!(
                "dedicated-mode ztunnel per pod: {} {} (ZTUNNEL_WORKER_THREADS={workers})",
                ztunnel.program.display(),
                ztunnel.args.join(" ")
            ),
            Self::InPod {
                ztunnels: [client, server],
                ambit,
                workers,
                ..
            } => {
                let cmd = |z: &ZtunnelCmd| {
                    format!("{} ({} {})", z.label, z.program.display(), z.args.join(" "))
                        .replace(" )", ")")
                };
                let proxies = if client == server {
                    format!("shared-mode ztunnel {}", cmd(client))
                } else {
                    format!(
                        "shared-mode ztunnel {} on the client's node, {} on the server's",
                        cmd(client),
                        cmd(server)
                    )
                };
                format!(
                    "in-pod mode, per node: {} cni-agent + {proxies} (ZTUNNEL_WORKER_THREADS={workers}); pods enrolled via {} cni-plugin",
                    ambit.display(),
                    ambit.display(),
                )
            }
        }
    }
}

/// A process killed (and reaped) on drop.
#[derive(Debug)]
struct Proc {
    /// What it is, for messages ("ztunnel in client", "agent on node2").
    what: String,
    child: Child,
    log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Already exited is fine; wait() reaps either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Per node of an in-pod scenario: where its agent and ztunnel meet.
#[derive(Debug)]
struct InPodNode {
    name: &'static str,
    /// `CNI_AGENT_RUN_DIR` (the plugin's socket).
    agent_run_dir: PathBuf,
}

/// How to start one pod's or one node's ztunnel.
struct ZtunnelSpec<'a> {
    /// Where it runs (a pod namespace in dedicated mode, a node namespace in in-pod mode).
    netns: &'a str,
    /// Name for logs and messages.
    what: String,
    /// Working directory (upstream's relative secret paths live under it).
    cwd: PathBuf,
    /// Bearer token for the CA.
    token: String,
    /// Mode-specific environment.
    env: Vec<(&'static str, String)>,
}

/// A started scenario: topology, servers, proxies. Dropping it stops everything and
/// deletes every namespace; fields drop in order (ztunnels, agents, tasks, topology, files).
#[derive(Debug)]
pub struct Scenario {
    kind: ScenarioKind,
    proxies: Vec<Proc>,
    agents: Vec<Proc>,
    tasks: JoinSet<()>,
    /// Bytes received by the discard server.
    pub received: Arc<AtomicU64>,
    client: Arc<NetnsSocketFactory>,
    server_ip: IpAddr,
    nodes: Vec<InPodNode>,
    extra: Vec<inpod::PodInfo>,
    /// What the local config file says (checked against every proxy's `/config_dump`).
    workloads: Vec<inpod::LocalWorkload>,
    topo: Topology,
    dir: tempfile::TempDir,
}

impl Scenario {
    /// Builds the topology, starts servers (and proxies), and waits until an echo crosses
    /// the whole path. `extra_pods` (in-pod scenarios only) prepares that many more pods on
    /// the server's node, known to its agent and ztunnel but not enrolled until
    /// [`Scenario::enrol_extra_pods`].
    pub fn start(
        kind: ScenarioKind,
        rt: &tokio::runtime::Handle,
        extra_pods: usize,
        sysctls: PodSysctls,
    ) -> Result<Self> {
        let topo = Topology::builder()
            .pod(CLIENT_NODE, CLIENT)
            .pod(SERVER_NODE, SERVER)
            .build()
            .context("building the topology")?;
        if sysctls == PodSysctls::Tuned {
            for pod in [CLIENT, SERVER] {
                tune_pod(&topo, pod)?;
            }
        }
        let effective = pod_sysctls(&topo, SERVER)?;
        let client = Arc::new(topo.pod(CLIENT).netns().socket_factory(None)?);
        let server_ip = IpAddr::V4(topo.pod(SERVER).ip());
        let mut s = Scenario {
            kind: kind.clone(),
            proxies: Vec::new(),
            agents: Vec::new(),
            tasks: JoinSet::new(),
            received: Arc::new(AtomicU64::new(0)),
            client,
            server_ip,
            nodes: Vec::new(),
            extra: Vec::new(),
            workloads: Vec::new(),
            topo,
            dir: tempfile::Builder::new().prefix("ambit-bench").tempdir()?,
        };
        eprintln!(
            "  {} namespaces: {}~*, files: {}",
            kind.name(),
            s.topo.prefix(),
            s.dir.path().display()
        );
        eprintln!("  {} pod sysctls: {effective}", kind.name());
        let server = s.topo.pod(SERVER).netns().socket_factory(None)?;
        load::start_servers(&server, rt, &mut s.tasks, s.received.clone())?;
        match &kind {
            ScenarioKind::Baseline => {}
            ScenarioKind::Dedicated {
                ztunnel, workers, ..
            } => s.start_dedicated(rt, ztunnel, *workers)?,
            ScenarioKind::InPod {
                ztunnels,
                ambit,
                workers,
                ..
            } => s.start_in_pod(rt, ztunnels, ambit, *workers, extra_pods)?,
        }
        let echo = s.echo_addr();
        let waited = rt.block_on(load::wait_path(&s.client, echo, READY_TIMEOUT));
        if let Err(e) = waited.and_then(|()| s.check_config_loaded()) {
            return Err(e.context(s.log_tails()));
        }
        Ok(s)
    }

    /// The two pods of the topology as the mesh knows them.
    fn topology_pods(&self) -> Vec<inpod::PodInfo> {
        self.topo
            .pods()
            .map(|p| inpod::PodInfo {
                name: p.name().to_string(),
                node: p.node().to_string(),
                ip: p.ip(),
                netns: p.netns_path(),
            })
            .collect()
    }

    fn start_dedicated(
        &mut self,
        rt: &tokio::runtime::Handle,
        ztunnel: &ZtunnelCmd,
        workers: usize,
    ) -> Result<()> {
        let pods = self.topology_pods();
        let tokens: HashMap<String, Caller> = [CLIENT, SERVER]
            .into_iter()
            .map(|p| Ok((token(p), Caller::Workload(spiffe_id(p)?))))
            .collect::<Result<_>>()?;
        let (ca, ca_addr) = self.start_ca(rt, tokens, HashMap::new())?;
        let config = self.write_local_config(&pods)?;
        for pod in [CLIENT, SERVER] {
            let runner = IpNetnsExec {
                name: self.topo.pod(pod).netns_name().to_string(),
            };
            let cfg = PodRedirectConfig {
                ipv6: false,
                ..Default::default()
            };
            InPod::new(Backend::Iptables, cfg)
                .apply(&runner)
                .with_context(|| format!("in-pod rules for {pod}"))?;
            let spec = ZtunnelSpec {
                netns: pod,
                what: format!("ztunnel in {pod}"),
                cwd: self.dir.path().join(pod),
                token: token(pod),
                env: vec![
                    ("PROXY_MODE", "dedicated".into()),
                    (
                        "PROXY_WORKLOAD_INFO",
                        format!("{}/{pod}/{pod}", inpod::NAMESPACE),
                    ),
                ],
            };
            let proxy =
                self.spawn_ztunnel(spec, ztunnel, workers, ca.root_pem(), ca_addr, &config)?;
            self.proxies.push(proxy);
        }
        for i in 0..self.proxies.len() {
            self.wait_ready(Role::Ztunnel, i)?;
        }
        Ok(())
    }

    fn start_in_pod(
        &mut self,
        rt: &tokio::runtime::Handle,
        ztunnels: &[ZtunnelCmd; 2],
        ambit: &Path,
        workers: usize,
        extra_pods: usize,
    ) -> Result<()> {
        let pods = self.topology_pods();
        self.extra = inpod::extra_pods(
            self.topo.prefix(),
            self.topo.addressing().pod_net.network(),
            SERVER_NODE,
            extra_pods,
        )?;
        inpod::create_netns(&self.extra)?;
        let all: Vec<inpod::PodInfo> = pods.iter().chain(&self.extra).cloned().collect();
        // Node proxies may obtain the identities of their node's pods, no others.
        let tokens: HashMap<String, Caller> = [CLIENT_NODE, SERVER_NODE]
            .into_iter()
            .map(|n| {
                (
                    token(n),
                    Caller::NodeProxy {
                        node: n.to_string(),
                    },
                )
            })
            .collect();
        let on_node: HashMap<String, String> = all
            .iter()
            .map(|p| Ok((spiffe_id(&p.name)?.to_string(), p.node.clone())))
            .collect::<Result<_>>()?;
        let (ca, ca_addr) = self.start_ca(rt, tokens, on_node)?;
        let config = self.write_local_config(&all)?;
        for (node, ztunnel) in [CLIENT_NODE, SERVER_NODE].into_iter().zip(ztunnels) {
            let dir = self.dir.path().join(node);
            let (pods_dir, run_dir) = (dir.join("pods"), dir.join("cni"));
            for d in [&pods_dir, &run_dir] {
                std::fs::create_dir_all(d)?;
            }
            let manifests: String = std::iter::once(inpod::namespace_manifest())
                .chain(
                    all.iter()
                        .filter(|p| p.node == node)
                        .map(inpod::pod_manifest),
                )
                .collect();
            std::fs::write(pods_dir.join("pods.yaml"), manifests)?;
            let zds = dir.join(ZDS_SOCKET);
            let agent = self.spawn_agent(node, ambit, &dir)?;
            self.agents.push(agent);
            let spec = ZtunnelSpec {
                netns: node,
                what: format!("ztunnel on {node}"),
                cwd: dir.join("ztunnel"),
                token: token(node),
                env: vec![
                    ("PROXY_MODE", "shared".into()),
                    ("INPOD_UDS", zds.display().to_string()),
                    ("NODE_NAME", node.into()),
                    ("POD_NAME", format!("ztunnel-{node}")),
                    ("POD_NAMESPACE", "istio-system".into()),
                ],
            };
            let proxy =
                self.spawn_ztunnel(spec, ztunnel, workers, ca.root_pem(), ca_addr, &config)?;
            self.proxies.push(proxy);
            self.nodes.push(InPodNode {
                name: node,
                agent_run_dir: run_dir,
            });
        }
        for i in 0..self.agents.len() {
            self.wait_ready(Role::Agent, i)?;
        }
        // Ready only once connected to its agent and past the (empty) ZDS snapshot.
        for i in 0..self.proxies.len() {
            self.wait_ready(Role::Ztunnel, i)?;
        }
        for p in &pods {
            self.cni_add(ambit, p)?;
        }
        Ok(())
    }

    /// Enrols the extra pods prepared by [`Scenario::start`], one CNI ADD after another as
    /// a node's runtime would start them; returns the time it took.
    pub fn enrol_extra_pods(&self) -> Result<Duration> {
        let ScenarioKind::InPod { ambit, .. } = &self.kind else {
            bail!("only in-pod scenarios enrol pods");
        };
        let start = Instant::now();
        for p in &self.extra {
            if load::STOP.load(std::sync::atomic::Ordering::Relaxed) {
                bail!("interrupted");
            }
            self.cni_add(ambit, p)?;
        }
        Ok(start.elapsed())
    }

    fn cni_add(&self, ambit: &Path, p: &inpod::PodInfo) -> Result<()> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.name == p.node)
            .with_context(|| format!("no node {}", p.node))?;
        let mut cmd = self.topo.command(&p.node, ambit)?;
        cmd.arg("cni-plugin").current_dir(self.dir.path());
        die_with_parent(&mut cmd);
        inpod::cni_add(cmd, &node.agent_run_dir, p).map_err(|e| e.context(self.log_tails()))
    }

    fn spawn_agent(&self, node: &'static str, ambit: &Path, dir: &Path) -> Result<Proc> {
        let (pods_dir, run_dir, zds) = (dir.join("pods"), dir.join("cni"), dir.join(ZDS_SOCKET));
        let log = self.dir.path().join(format!("agent-{node}.log"));
        let out = std::fs::File::create(&log)?;
        let mut cmd: Command = self.topo.command(node, ambit)?;
        cmd.arg("cni-agent")
            .arg("--pods")
            .arg(&pods_dir)
            .current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("NODE_NAME", node)
            .env("AMBIENT_ENABLED", "true")
            .env("AMBIENT_DNS_CAPTURE", "false")
            .env("AMBIENT_IPV6", "false")
            .env("ZTUNNEL_UDS_ADDRESS", &zds)
            .env("CNI_AGENT_RUN_DIR", &run_dir)
            // No MOUNTED_CNI_NET_DIR and no AMBIT_HOST_PREFIX: the CNI installer has
            // nothing to write to (the plugin is run directly), and never the host's files.
            .env("AMBIT_HEALTH_ADDR", AGENT_HEALTH.to_string())
            .env("AMBIT_METRICS_ADDR", "127.0.0.1:15014")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} cni-agent", ambit.display()))?;
        Ok(Proc {
            what: format!("agent on {node}"),
            child,
            log,
        })
    }

    /// The in-process CA (the service `ambit control` runs) in node 1. `on_node` maps
    /// SPIFFE ids to the node whose proxy may obtain them.
    fn start_ca(
        &mut self,
        rt: &tokio::runtime::Handle,
        tokens: HashMap<String, Caller>,
        on_node: HashMap<String, String>,
    ) -> Result<(Arc<LocalCa>, SocketAddr)> {
        let ca = Arc::new(LocalCa::generate(TRUST_DOMAIN)?);
        let node = self.topo.node(CLIENT_NODE);
        let addr = SocketAddr::new(IpAddr::V4(node.ip()), ambit_contract::ports::CONTROL_PLANE);
        let listener = node
            .netns()
            .socket_factory(None)?
            .new_tcp_listener(addr, &SocketOptions::default())?;
        let authorizer = StaticAuthorizer::new(tokens, move |node, id| {
            on_node.get(&id.to_string()).is_some_and(|n| n == node)
        });
        let svc = CaService::new(ca.clone(), Arc::new(authorizer));
        let server_cert = ca.server_cert_for_hostnames(&[CA_HOSTNAME])?;
        let tls = Arc::new(ambit_tls::server_config_plain(&server_cert)?);
        let routes = tonic::service::Routes::new(IstioCertificateServiceServer::new(svc));
        self.tasks.spawn_on(
            async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let shutdown = std::future::pending();
                let _ = ambit_control::grpc::serve_tls(listener, tls, routes, shutdown).await;
            },
            rt,
        );
        Ok((ca, addr))
    }

    /// Upstream's local-config format: the pods as HBONE workloads, no services, no
    /// policies.
    fn write_local_config(&mut self, pods: &[inpod::PodInfo]) -> Result<PathBuf> {
        self.workloads = inpod::local_workloads(pods, TRUST_DOMAIN);
        let path = self.dir.path().join(LOCAL_CONFIG);
        std::fs::write(&path, inpod::local_config(&self.workloads)?)?;
        Ok(path)
    }

    /// Every proxy lists every workload of the local config, as written, in its
    /// `/config_dump`: a ztunnel that misreads the file fails here, not in a figure.
    fn check_config_loaded(&self) -> Result<()> {
        for (i, p) in self.proxies.iter().enumerate() {
            let factory = self.topo.netns(self.proxy_netns(i))?.socket_factory(None)?;
            let dump = http_get(&factory, ADMIN, "/config_dump")
                .with_context(|| format!("{}: GET /config_dump", p.what))?;
            inpod::check_loaded(&dump, &self.workloads)
                .with_context(|| format!("{} loaded {LOCAL_CONFIG} wrongly", p.what))?;
        }
        Ok(())
    }

    /// The namespace proxy `i` runs in (and serves its admin and readiness ports in).
    fn proxy_netns(&self, i: usize) -> &'static str {
        match self.kind {
            ScenarioKind::InPod { .. } => self.nodes[i].name,
            _ => [CLIENT, SERVER][i],
        }
    }

    fn spawn_ztunnel(
        &self,
        spec: ZtunnelSpec<'_>,
        ztunnel: &ZtunnelCmd,
        workers: usize,
        root_pem: &str,
        ca_addr: SocketAddr,
        config: &Path,
    ) -> Result<Proc> {
        // Upstream reads its token and root certificate from these paths relative to the
        // working directory; ambit is also told explicitly.
        let token_path = spec.cwd.join("var/run/secrets/tokens/istio-token");
        let root_path = spec.cwd.join("var/run/secrets/istio/root-cert.pem");
        for (path, content) in [(&token_path, spec.token.as_str()), (&root_path, root_pem)] {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, content)?;
        }
        let log = self
            .dir
            .path()
            .join(format!("{}.log", spec.what.replace(' ', "-")));
        let out = std::fs::File::create(&log)?;
        let mut cmd: Command = self.topo.command(spec.netns, &ztunnel.program)?;
        cmd.args(&ztunnel.args)
            .current_dir(&spec.cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(spec.env)
            .env("XDS_ADDRESS", "")
            .env("CA_ADDRESS", format!("https://{ca_addr}"))
            .env("CA_ROOT_CA", &root_path)
            .env("ALT_CA_HOSTNAME", CA_HOSTNAME)
            .env("AUTH_TOKEN", &token_path)
            .env("LOCAL_XDS_PATH", config)
            .env("PACKET_MARK", "1337")
            .env("IPV6_ENABLED", "false")
            .env("ISTIO_META_DNS_CAPTURE", "false")
            .env("ZTUNNEL_WORKER_THREADS", workers.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", ztunnel.program.display()))?;
        Ok(Proc {
            what: spec.what,
            child,
            log,
        })
    }

    /// Waits until process `i` of `role` answers its readiness probe.
    fn wait_ready(&mut self, role: Role, i: usize) -> Result<()> {
        let (netns, addr, path) = match role {
            Role::Ztunnel => (
                self.proxy_netns(i),
                SocketAddr::from(([127, 0, 0, 1], 15021)),
                "/healthz/ready",
            ),
            Role::Agent => (self.nodes[i].name, AGENT_HEALTH, "/readyz"),
        };
        let factory = self.topo.netns(netns)?.socket_factory(None)?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if ready(&factory, addr, path) {
                return Ok(());
            }
            let procs = match role {
                Role::Ztunnel => &mut self.proxies,
                Role::Agent => &mut self.agents,
            };
            let p = &mut procs[i];
            if let Ok(Some(status)) = p.child.try_wait() {
                let what = p.what.clone();
                bail!("{what} exited ({status})\n{}", self.log_tails());
            }
            if Instant::now() >= deadline || load::STOP.load(std::sync::atomic::Ordering::Relaxed) {
                let what = p.what.clone();
                bail!("{what} not ready\n{}", self.log_tails());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of every process log, for error messages.
    pub fn log_tails(&self) -> String {
        self.proxies
            .iter()
            .chain(&self.agents)
            .map(|p| {
                let text = std::fs::read_to_string(&p.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {} ---\n{}", p.what, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The scenario's kind.
    pub fn kind(&self) -> &ScenarioKind {
        &self.kind
    }

    /// Whether proxies run (proxy metrics apply).
    pub fn has_proxies(&self) -> bool {
        !self.proxies.is_empty()
    }

    /// Process ids of the proxies.
    pub fn proxy_pids(&self) -> Vec<u32> {
        self.proxies.iter().map(|p| p.child.id()).collect()
    }

    /// Process id of the ztunnel serving the server pod (in-pod: the server node's).
    pub fn server_proxy_pid(&self) -> Option<u32> {
        self.proxies.get(1).map(|p| p.child.id())
    }

    /// Process id of the server node's agent (in-pod scenarios).
    pub fn server_agent_pid(&self) -> Option<u32> {
        self.agents.get(1).map(|p| p.child.id())
    }

    /// A socket factory of the client pod.
    pub fn client(&self) -> &Arc<NetnsSocketFactory> {
        &self.client
    }

    /// A command started inside the client pod's namespace (in the scenario's directory,
    /// killed if this process dies).
    pub fn client_command(&self, program: &Path) -> Result<Command> {
        let mut cmd = self.topo.command(CLIENT, program)?;
        cmd.current_dir(self.dir.path());
        die_with_parent(&mut cmd);
        Ok(cmd)
    }

    /// The discard server.
    pub fn discard_addr(&self) -> SocketAddr {
        SocketAddr::new(self.server_ip, load::DISCARD_PORT)
    }

    /// The echo server.
    pub fn echo_addr(&self) -> SocketAddr {
        SocketAddr::new(self.server_ip, load::ECHO_PORT)
    }

    /// Fails if a proxy or agent died (a crash mid-run must not pass as a slow
    /// measurement).
    pub fn check_alive(&mut self) -> Result<()> {
        for p in self.proxies.iter_mut().chain(&mut self.agents) {
            if let Ok(Some(status)) = p.child.try_wait() {
                bail!("{} exited ({status})", p.what);
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Role {
    Ztunnel,
    Agent,
}

fn token(owner: &str) -> String {
    format!("{owner}-bench-token")
}

fn spiffe_id(sa: &str) -> Result<SpiffeId> {
    Ok(SpiffeId::new(TRUST_DOMAIN, inpod::NAMESPACE, sa)?)
}

/// The client's and the server's pod sysctls, the same for every scenario of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodSysctls {
    /// A wide ephemeral port range (1024–65000) and `tcp_tw_reuse=1`, so the connection
    /// rates are not bounded by the client's own ports ([`tune_pod`]).
    Tuned,
    /// What a new network namespace gets, as a Kubernetes pod does unless its spec says
    /// otherwise: ports 32768–60999 and `tcp_tw_reuse=2` (loopback only). TIME-WAIT then
    /// bounds one client address to one server port at ~470 connections/s for every data
    /// plane and for none.
    Default,
}

/// Per-pod sysctls so the connection-rate test is not limited by ephemeral ports: a wide
/// port range and reuse of TIME_WAIT ports for outgoing connections. Written inside the
/// pod's namespace (the `net` sysctls are per namespace); the same for every scenario.
fn tune_pod(topo: &Topology, pod: &str) -> Result<()> {
    let ns = topo.pod(pod).netns();
    ns.run(|| {
        std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "1024 65000")?;
        std::fs::write("/proc/sys/net/ipv4/tcp_tw_reuse", "1")
    })?
    .with_context(|| format!("sysctls in {pod}"))
}

/// The sysctls [`tune_pod`] sets, as `pod`'s namespace has them (for the run's log).
fn pod_sysctls(topo: &Topology, pod: &str) -> Result<String> {
    let read = |name: &str| -> std::io::Result<String> {
        let v = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))?;
        Ok(format!(
            "{name} {}",
            v.split_whitespace().collect::<Vec<_>>().join(" ")
        ))
    };
    let ns = topo.pod(pod).netns();
    ns.run(|| {
        Ok::<_, std::io::Error>(format!(
            "{}, {}",
            read("ip_local_port_range")?,
            read("tcp_tw_reuse")?
        ))
    })?
    .with_context(|| format!("reading the sysctls of {pod}"))
}

/// Makes the process `cmd` starts get SIGKILL when this process dies, so a bench killed
/// with SIGKILL (no destructors run) leaves no proxy or agent behind. Children are started
/// from the main thread, which lives as long as the process (the signal follows the
/// spawning *thread*).
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe, with integer arguments.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// GET `path` answered 200.
fn ready(factory: &NetnsSocketFactory, addr: SocketAddr, path: &str) -> bool {
    http_get(factory, addr, path).is_ok()
}

/// The body of `GET path` (HTTP/1.0, so the server closes after the body), if the answer
/// is 200. Bounded: the connection has the load generators' step timeouts, the body 16 MiB.
fn http_get(factory: &NetnsSocketFactory, addr: SocketAddr, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut s = load::connect_blocking(factory, addr)?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())?;
    let mut resp = String::new();
    s.take(16 << 20).read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    match head.split_whitespace().nth(1) {
        Some("200") => Ok(body.to_string()),
        status => bail!("GET {path}: status {status:?}"),
    }
}
