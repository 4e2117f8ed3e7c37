//! Scenarios: what sits between the client pod (node 1) and the server pod (node 2).
//!
//! Every scenario gets its own topology (its own namespaces, so scenarios never share
//! sockets, conntrack or sysctls) with the same servers, so the load generators see only
//! a different path:
//!
//! - [`ScenarioKind::Baseline`]: no proxy, no rules: the kernel path between two pods.
//! - [`ScenarioKind::Dedicated`]: one ztunnel per pod in dedicated mode (inside the pod's
//!   namespace, in-pod redirection rules applied), configured exactly like upstream
//!   ztunnel: upstream environment variables, a `LOCAL_XDS_PATH` file, certificates from
//!   a CA gRPC server in node 1, a token and a root certificate at upstream's default
//!   relative paths under the working directory. Any binary honouring those runs here.
//!
//! Planned (see BENCHMARKS.md): in-pod (shared) mode with the node agent.

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

use crate::load;

const TRUST_DOMAIN: &str = "cluster.local";
const CA_PORT: u16 = 15012;
const CLIENT: &str = "client";
const SERVER: &str = "server";
/// How long a proxy may take to become ready and carry the first echo.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a ztunnel: `program args...`, configured through the environment.
#[derive(Clone, Debug)]
pub struct ZtunnelCmd {
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
}

impl ScenarioKind {
    /// The name in the reports.
    pub fn name(&self) -> &str {
        match self {
            Self::Baseline => "baseline",
            Self::Dedicated { name, .. } => name,
        }
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
        }
    }
}

/// A process killed (and reaped) on drop.
#[derive(Debug)]
struct Proxy {
    pod: &'static str,
    child: Child,
    log: PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Already exited is fine; wait() reaps either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A started scenario: topology, servers, proxies. Dropping it stops everything and
/// deletes every namespace; fields drop in order (proxies, tasks, topology, files).
#[derive(Debug)]
pub struct Scenario {
    kind: ScenarioKind,
    proxies: Vec<Proxy>,
    tasks: JoinSet<()>,
    /// Bytes received by the discard server.
    pub received: Arc<AtomicU64>,
    client: Arc<NetnsSocketFactory>,
    server_ip: IpAddr,
    topo: Topology,
    dir: tempfile::TempDir,
}

impl Scenario {
    /// Builds the topology, starts servers (and proxies), and waits until an echo crosses
    /// the whole path.
    pub fn start(kind: ScenarioKind, rt: &tokio::runtime::Handle) -> Result<Self> {
        let topo = Topology::builder()
            .pod("node1", CLIENT)
            .pod("node2", SERVER)
            .build()
            .context("building the topology")?;
        for pod in [CLIENT, SERVER] {
            tune_pod(&topo, pod)?;
        }
        let client = Arc::new(topo.pod(CLIENT).netns().socket_factory(None)?);
        let server_ip = IpAddr::V4(topo.pod(SERVER).ip());
        let mut s = Scenario {
            kind: kind.clone(),
            proxies: Vec::new(),
            tasks: JoinSet::new(),
            received: Arc::new(AtomicU64::new(0)),
            client,
            server_ip,
            topo,
            dir: tempfile::Builder::new().prefix("ambit-bench").tempdir()?,
        };
        let server = s.topo.pod(SERVER).netns().socket_factory(None)?;
        load::start_servers(&server, rt, &mut s.tasks, s.received.clone())?;
        if let ScenarioKind::Dedicated {
            ztunnel, workers, ..
        } = &kind
        {
            s.start_mesh(rt, ztunnel, *workers)?;
        }
        let echo = s.echo_addr();
        let waited = rt.block_on(load::wait_path(&s.client, echo, READY_TIMEOUT));
        if let Err(e) = waited {
            return Err(e.context(s.log_tails()));
        }
        Ok(s)
    }

    fn start_mesh(
        &mut self,
        rt: &tokio::runtime::Handle,
        ztunnel: &ZtunnelCmd,
        workers: usize,
    ) -> Result<()> {
        let ca = Arc::new(LocalCa::generate(TRUST_DOMAIN)?);
        let ca_addr = self.start_ca(rt, &ca)?;
        let config = self.dir.path().join("local.yaml");
        std::fs::write(&config, self.local_config())?;
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
            let proxy =
                self.spawn_ztunnel(pod, ztunnel, workers, ca.root_pem(), ca_addr, &config)?;
            self.proxies.push(proxy);
        }
        for pod in [CLIENT, SERVER] {
            self.wait_ready(pod)?;
        }
        Ok(())
    }

    fn start_ca(&mut self, rt: &tokio::runtime::Handle, ca: &Arc<LocalCa>) -> Result<SocketAddr> {
        let node = self.topo.node("node1");
        let addr = SocketAddr::new(IpAddr::V4(node.ip()), CA_PORT);
        let listener = node
            .netns()
            .socket_factory(None)?
            .new_tcp_listener(addr, &SocketOptions::default())?;
        let tokens: HashMap<String, Caller> = [CLIENT, SERVER]
            .into_iter()
            .map(|p| Ok((token(p), Caller::Workload(spiffe_id(p)?))))
            .collect::<Result<_>>()?;
        let svc = CaService::new(
            ca.clone(),
            Arc::new(StaticAuthorizer::new(tokens, |_, _| false)),
        );
        let server_cert = ca.server_cert_for_hostnames(&["ca.bench"])?;
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
        Ok(addr)
    }

    /// Upstream's local-config format: both pods as HBONE workloads, no services, no
    /// policies.
    fn local_config(&self) -> String {
        let mut y = String::from("workloads:\n");
        for p in self.topo.pods() {
            y += &format!(
                "- uid: cluster1//v1/Pod/default/{name}\n  name: {name}\n  namespace: default\n  serviceAccount: {name}\n  trustDomain: {TRUST_DOMAIN}\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: {node}\n  canonicalName: {name}\n  canonicalRevision: v1\n  workloadName: {name}\n  workloadType: deployment\n",
                name = p.name(),
                ip = p.ip(),
                node = p.node(),
            );
        }
        y + "services: []\npolicies: []\n"
    }

    fn spawn_ztunnel(
        &self,
        pod: &'static str,
        ztunnel: &ZtunnelCmd,
        workers: usize,
        root_pem: &str,
        ca_addr: SocketAddr,
        config: &Path,
    ) -> Result<Proxy> {
        // Upstream reads its token and root certificate from these paths relative to the
        // working directory; ambit is also told explicitly.
        let cwd = self.dir.path().join(pod);
        let token_path = cwd.join("var/run/secrets/tokens/istio-token");
        let root_path = cwd.join("var/run/secrets/istio/root-cert.pem");
        for (path, content) in [
            (&token_path, token(pod)),
            (&root_path, root_pem.to_string()),
        ] {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, content)?;
        }
        let log = self.dir.path().join(format!("ztunnel-{pod}.log"));
        let out = std::fs::File::create(&log)?;
        let mut cmd: Command = self.topo.command(pod, &ztunnel.program)?;
        cmd.args(&ztunnel.args)
            .current_dir(&cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PROXY_MODE", "dedicated")
            .env("PROXY_WORKLOAD_INFO", format!("default/{pod}/{pod}"))
            .env("XDS_ADDRESS", "")
            .env("CA_ADDRESS", format!("https://{ca_addr}"))
            .env("CA_ROOT_CA", &root_path)
            .env("ALT_CA_HOSTNAME", "ca.bench")
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
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", ztunnel.program.display()))?;
        Ok(Proxy { pod, child, log })
    }

    fn wait_ready(&mut self, pod: &str) -> Result<()> {
        let factory = self.topo.pod(pod).netns().socket_factory(None)?;
        let addr = SocketAddr::from(([127, 0, 0, 1], 15021));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if ready(&factory, addr) {
                return Ok(());
            }
            let exited = self
                .proxies
                .iter_mut()
                .find(|p| p.pod == pod)
                .and_then(|p| p.child.try_wait().ok().flatten());
            if let Some(status) = exited {
                bail!("ztunnel in {pod} exited ({status})\n{}", self.log_tails());
            }
            if Instant::now() >= deadline || load::STOP.load(std::sync::atomic::Ordering::Relaxed) {
                bail!("ztunnel in {pod} not ready\n{}", self.log_tails());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of every proxy log, for error messages.
    pub fn log_tails(&self) -> String {
        self.proxies
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- ztunnel in {} ---\n{}", p.pod, tail.join("\n"))
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

    /// A socket factory of the client pod.
    pub fn client(&self) -> &Arc<NetnsSocketFactory> {
        &self.client
    }

    /// The discard server.
    pub fn discard_addr(&self) -> SocketAddr {
        SocketAddr::new(self.server_ip, load::DISCARD_PORT)
    }

    /// The echo server.
    pub fn echo_addr(&self) -> SocketAddr {
        SocketAddr::new(self.server_ip, load::ECHO_PORT)
    }

    /// Fails if a proxy died (a crash mid-run must not pass as a slow measurement).
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.proxies {
            if let Ok(Some(status)) = p.child.try_wait() {
                bail!("ztunnel in {} exited ({status})", p.pod);
            }
        }
        Ok(())
    }
}

fn token(pod: &str) -> String {
    format!("{pod}-bench-token")
}

fn spiffe_id(pod: &str) -> Result<SpiffeId> {
    Ok(SpiffeId::new(TRUST_DOMAIN, "default", pod)?)
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

/// GET /healthz/ready answered 200.
fn ready(factory: &NetnsSocketFactory, addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = load::connect_blocking(factory, addr) else {
        return false;
    };
    if s.write_all(b"GET /healthz/ready HTTP/1.0\r\nHost: x\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.split_whitespace().nth(1) == Some("200")
}
