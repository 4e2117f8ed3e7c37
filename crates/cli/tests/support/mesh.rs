//! A small mesh for end-to-end tests: a topology of network namespaces, a real CA gRPC server
//! in a node namespace, in-pod redirection rules, and real `ambit ztunnel` processes in
//! dedicated mode inside pod namespaces, configured by a local-config file the test edits.
//!
//! Helpers talk to things *inside* namespaces by creating sockets there (the root namespace
//! has no links to the topology at all).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_control::ca::{CaService, Caller, StaticAuthorizer};
use ambit_model::SpiffeId;
use ambit_netns::{SocketFactory, SocketOptions};
use ambit_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use ambit_redirect::{Backend, InPod, IpNetnsExec, PodRedirectConfig};
pub use ambit_testkit::eventually_blocking;
use ambit_tls::LocalCa;
use ambit_topology::{Namespace, Topology};

pub const TRUST_DOMAIN: &str = "cluster.local";
pub const APP_PORT: u16 = 8080;
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// A process killed on drop.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Mesh {
    pub topo: Topology,
    pub dir: tempfile::TempDir,
    pub ca: Arc<LocalCa>,
    pub rt: tokio::runtime::Runtime,
    pub ztunnels: HashMap<String, Proc>,
    pub config: PathBuf,
    /// DNS capture rules + the DNS proxy on, forwarding to `resolv.conf` in `dir`.
    pub dns: bool,
    /// Extra environment for every ztunnel.
    pub env: Vec<(String, String)>,
    /// Whether the CA answers `CreateCertificate` (false: every call hangs, a stalled CA).
    pub ca_answers: Arc<tokio::sync::watch::Sender<bool>>,
}

/// The test CA: [`CaService`], unless told to hang every call (a CA that never answers).
struct GatedCa {
    inner: CaService,
    answers: tokio::sync::watch::Receiver<bool>,
}

#[tonic::async_trait]
impl IstioCertificateService for GatedCa {
    async fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, tonic::Status> {
        if !*self.answers.borrow() {
            // Hang until the caller gives up (the call is dropped with it).
            std::future::pending::<()>().await;
        }
        self.inner.create_certificate(request).await
    }
}

pub fn id(sa: &str) -> SpiffeId {
    SpiffeId::new(TRUST_DOMAIN, "default", sa).unwrap()
}

/// A socket factory for `ns` that does NOT mark (so traffic is captured like an app's).
pub fn app_factory(ns: &Namespace) -> ambit_netns::NetnsSocketFactory {
    ns.socket_factory(None).unwrap()
}

/// Connects from inside `ns` (blocking).
pub fn connect_from(ns: &Namespace, dst: SocketAddr) -> std::io::Result<TcpStream> {
    let f = app_factory(ns);
    let sock = f
        .new_tcp_stream_socket(dst, None, &SocketOptions::default())
        .map_err(std::io::Error::other)?;
    sock.set_nonblocking(false)?;
    sock.connect_timeout(&dst.into(), Duration::from_secs(5))?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// `GET path` over HTTP/1.0 from inside `ns`; returns (status, body).
pub fn http_get(ns: &Namespace, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = connect_from(ns, addr).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let status = resp.split_whitespace().nth(1)?.parse().ok()?;
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Sends `line` and reads one greeting line + the echo (the test app protocol).
pub fn exchange(s: &mut TcpStream, line: &str) -> std::io::Result<String> {
    s.write_all(line.as_bytes())?;
    s.write_all(b"\n")?;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    let mut newlines = 0;
    while newlines < 2 {
        let n = s.read(&mut byte)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed",
            ));
        }
        buf.push(byte[0]);
        if byte[0] == b'\n' {
            newlines += 1;
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Whether `s` gets closed (EOF or reset) within `timeout`. Data that arrives first (a TLS
/// alert, say) is skipped.
pub fn closed_within(s: &mut TcpStream, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut b = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let _ = s.set_read_timeout(Some(left));
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            // A timeout is not a close; a reset is.
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

impl Mesh {
    /// `pods` = (node, pod, captured: runs ztunnel + rules).
    pub fn start(pods: &[(&str, &str, bool)]) -> Mesh {
        Self::start_opts(pods, false)
    }

    /// Like [`Mesh::start`]; `dns` turns on DNS capture and the DNS proxy, whose upstream is
    /// whatever `nameserver` the test writes to [`Mesh::resolv_conf`] before starting.
    pub fn start_opts(pods: &[(&str, &str, bool)], dns: bool) -> Mesh {
        Self::start_full(pods, dns, &[])
    }

    /// The general constructor: `env` is added to every ztunnel's environment.
    pub fn start_full(pods: &[(&str, &str, bool)], dns: bool, env: &[(&str, &str)]) -> Mesh {
        Self::start_with_ca(pods, dns, env, true)
    }

    /// [`Mesh::start_full`] with a CA that answers or (`ca_answers` false) hangs every call
    /// until [`Mesh::ca_answers`] is set.
    pub fn start_with_ca(
        pods: &[(&str, &str, bool)],
        dns: bool,
        env: &[(&str, &str)],
        ca_answers: bool,
    ) -> Mesh {
        let mut b = Topology::builder();
        for (node, pod, _) in pods {
            b = b.pod(*node, *pod);
        }
        let topo = b.build().expect("topology");
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let ca = Arc::new(LocalCa::generate(TRUST_DOMAIN).unwrap());
        std::fs::write(dir.path().join("root-cert.pem"), ca.root_pem()).unwrap();

        let mut mesh = Mesh {
            topo,
            config: dir.path().join("local.yaml"),
            dir,
            ca,
            rt,
            ztunnels: HashMap::new(),
            dns,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ca_answers: Arc::new(tokio::sync::watch::channel(ca_answers).0),
        };
        if dns {
            let node = mesh.topo.nodes().last().expect("a node");
            std::fs::write(mesh.resolv_conf(), format!("nameserver {}\n", node.ip())).unwrap();
        }
        mesh.start_ca();
        for (_, pod, captured) in pods {
            if *captured {
                mesh.capture(pod);
            }
        }
        mesh.write_config(&[]);
        for (_, pod, captured) in pods {
            if *captured {
                mesh.start_ztunnel(pod, &[]);
            }
        }
        for (_, pod, captured) in pods {
            if *captured {
                mesh.wait_ready(pod);
            }
        }
        mesh
    }

    pub fn ca_addr(&self) -> SocketAddr {
        let node = self.topo.nodes().next().expect("a node");
        SocketAddr::new(IpAddr::V4(node.ip()), ambit_contract::ports::CONTROL_PLANE)
    }

    fn start_ca(&self) {
        let node = self.topo.nodes().next().expect("a node");
        let addr = self.ca_addr();
        let listener = node
            .netns()
            .socket_factory(None)
            .unwrap()
            .new_tcp_listener(addr, &SocketOptions::default())
            .unwrap();
        let tokens: HashMap<String, Caller> = self
            .topo
            .pods()
            .map(|p| {
                (
                    format!("{}-token", p.name()),
                    Caller::Workload(id(p.name())),
                )
            })
            .collect();
        // Short-lived certificates are allowed so tests can watch rotation.
        let svc = CaService::new(
            self.ca.clone(),
            Arc::new(StaticAuthorizer::new(tokens, |_, _| false)),
        )
        .with_min_ttl(Duration::from_secs(1));
        let server_cert = self.ca.server_cert_for_hostnames(&["ca.test"]).unwrap();
        let tls = Arc::new(ambit_tls::server_config_plain(&server_cert).unwrap());
        let svc = GatedCa {
            inner: svc,
            answers: self.ca_answers.subscribe(),
        };
        let routes = tonic::service::Routes::new(IstioCertificateServiceServer::new(svc));
        self.rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let _ =
                ambit_control::grpc::serve_tls(listener, tls, routes, std::future::pending()).await;
        });
    }

    /// Writes the local config: every pod is an HBONE workload with service account = its
    /// name, `server` backs service `echo` (VIP 10.96.0.10:80 → 8080); `policies` is raw YAML.
    pub fn write_config(&self, policies: &[&str]) {
        self.write_config_with(policies, &ConfigExtras::default());
    }

    /// [`Mesh::write_config`] plus `extras`.
    pub fn write_config_with(&self, policies: &[&str], extras: &ConfigExtras<'_>) {
        let mut y = String::from("workloads:\n");
        for p in self.topo.pods() {
            let captured = self.captured(p.name());
            y += &format!(
                "- uid: cluster1//v1/Pod/default/{name}\n  name: {name}\n  namespace: default\n  serviceAccount: {name}\n  trustDomain: {TRUST_DOMAIN}\n  workloadIps: [\"{ip}\"]\n  protocol: {proto}\n  node: {node}\n  canonicalName: {name}-app\n  canonicalRevision: v1\n  workloadName: {name}-deploy\n  workloadType: deployment\n",
                name = p.name(),
                ip = p.ip(),
                proto = if captured { "HBONE" } else { "TCP" },
                node = p.node(),
            );
            if p.name() == "server" {
                y += &format!(
                    "  services:\n    \"default/echo.default.svc.cluster.local\": {{80: {APP_PORT}}}\n"
                );
                if !extras.server_policies.is_empty() {
                    y += &format!(
                        "  authorizationPolicies: [{}]\n",
                        extras.server_policies.join(", ")
                    );
                }
            }
        }
        y += extras.workloads;
        y += &format!(
            "services:\n- name: echo\n  namespace: default\n  hostname: echo.default.svc.cluster.local\n  vips: [\"/{VIP}\"]\n  ports: {{80: {APP_PORT}}}\n"
        );
        y += "policies:\n";
        for p in policies {
            y += p;
        }
        if policies.is_empty() {
            y = y.replace("policies:\n", "policies: []\n");
        }
        // Write atomically so a watching ztunnel never reads half a file.
        let tmp = self.config.with_extension("tmp");
        std::fs::write(&tmp, y).unwrap();
        std::fs::rename(&tmp, &self.config).unwrap();
    }

    /// [`Mesh::write_config_with`], then waits until every running ztunnel serves the new
    /// file (a marker policy that applies to no workload shows in its `/config_dump`).
    pub fn apply_config(&self, policies: &[&str], extras: &ConfigExtras<'_>) {
        static GENERATION: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("config-generation-{generation}");
        let marker = format!(
            "- name: {name}\n  namespace: no-such-namespace\n  scope: Namespace\n  action: Deny\n  rules: [[[ {{destinationPorts: [1]}} ]]]\n"
        );
        let mut all: Vec<&str> = policies.to_vec();
        all.push(&marker);
        self.write_config_with(&all, extras);
        let admin = SocketAddr::from(([127, 0, 0, 1], 15000));
        for pod in self.ztunnels.keys() {
            eventually_blocking(
                &format!("ztunnel in {pod} loaded {name}"),
                Duration::from_secs(20),
                || {
                    let (_, body) = http_get(self.pod_ns(pod), admin, "/config_dump")?;
                    body.contains(&name).then_some(())
                },
            );
        }
    }

    fn captured(&self, pod: &str) -> bool {
        self.dir.path().join(format!("{pod}.captured")).exists()
    }

    /// Applies the in-pod redirection rules (IPv4; DNS capture when the mesh has DNS on).
    pub fn capture(&self, pod: &str) {
        std::fs::write(self.dir.path().join(format!("{pod}.captured")), "").unwrap();
        let cfg = PodRedirectConfig {
            ipv6: false,
            dns_capture: self.dns,
            ..Default::default()
        };
        let runner = IpNetnsExec {
            name: self.topo.pod(pod).netns_name().to_string(),
        };
        InPod::new(Backend::Iptables, cfg)
            .apply(&runner)
            .expect("in-pod rules");
    }

    pub fn start_ztunnel(&mut self, pod: &str, extra_env: &[(&str, &str)]) {
        let log = self.dir.path().join(format!("ztunnel-{pod}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let mut cmd: Command = self.topo.command(pod, env!("CARGO_BIN_EXE_ambit")).unwrap();
        cmd.arg("ztunnel")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PROXY_MODE", "dedicated")
            .env("PROXY_WORKLOAD_INFO", format!("default/{pod}/{pod}"))
            .env("XDS_ADDRESS", "")
            .env("CA_ADDRESS", format!("https://{}", self.ca_addr()))
            .env("CA_ROOT_CA", self.dir.path().join("root-cert.pem"))
            .env("ALT_CA_HOSTNAME", "ca.test")
            .env("AUTH_TOKEN", format!("{pod}-token"))
            .env("LOCAL_XDS_PATH", &self.config)
            .env("PACKET_MARK", "1337")
            .env("IPV6_ENABLED", "false")
            .env(
                "ISTIO_META_DNS_CAPTURE",
                if self.dns { "true" } else { "false" },
            )
            .env("AMBIT_DNS_RESOLV_CONF", self.resolv_conf())
            .env("CONNECTION_TERMINATION_DEADLINE", "2s")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn ztunnel");
        self.ztunnels.insert(pod.to_string(), Proc { child, log });
    }

    pub fn pod_ns(&self, pod: &str) -> &Namespace {
        self.topo.pod(pod).netns()
    }

    pub fn pod_addr(&self, pod: &str, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.topo.pod(pod).ip()), port)
    }

    pub fn wait_ready(&self, pod: &str) {
        let ns = self.pod_ns(pod);
        let addr = SocketAddr::from(([127, 0, 0, 1], 15021));
        let proc = &self.ztunnels[pod];
        eventually_blocking(
            &format!("ztunnel in {pod} ready"),
            Duration::from_secs(30),
            || match http_get(ns, addr, "/healthz/ready") {
                Some((200, _)) => Some(()),
                _ => None,
            },
        );
        let _ = proc;
    }

    /// The ztunnel's Prometheus text.
    pub fn metrics(&self, pod: &str) -> String {
        let addr = SocketAddr::from(([127, 0, 0, 1], 15020));
        http_get(self.pod_ns(pod), addr, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    /// Starts the test app in `pod` on `port`: greets with the peer address it sees, then echoes
    /// each line.
    pub fn start_app(&self, pod: &str, port: u16) {
        let ns = self.pod_ns(pod);
        self.start_app_in(ns, SocketAddr::from(([0, 0, 0, 0], port)));
    }

    pub fn start_app_in(&self, ns: &Namespace, addr: SocketAddr) {
        spawn_app(&self.rt, ns, addr);
    }

    pub fn ztunnel_log(&self, pod: &str) -> String {
        self.ztunnels
            .get(pod)
            .map(Proc::log_text)
            .unwrap_or_default()
    }

    /// The resolv.conf the ztunnels forward unanswered DNS queries to.
    pub fn resolv_conf(&self) -> PathBuf {
        self.dir.path().join("resolv.conf")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// One CONNECT (or `method`) to `to`'s 15008 from inside `from` (an uncaptured pod),
    /// presenting the identity of service account `sa` and expecting `to`'s; the response
    /// status and `baggage` header.
    pub fn hbone_request(
        &self,
        from: &str,
        sa: &str,
        to: &str,
        method: &str,
        uri: &str,
    ) -> Result<(u16, String), String> {
        let hbone = self.pod_addr(to, 15008);
        let cert = self
            .ca
            .issue(&id(sa), Duration::from_secs(3600))
            .map_err(|e| e.to_string())?;
        let config =
            Arc::new(ambit_tls::client_config(&cert, vec![id(to)]).map_err(|e| e.to_string())?);
        let sock = app_factory(self.pod_ns(from))
            .new_tcp_stream_socket(hbone, None, &SocketOptions::default())
            .map_err(|e| e.to_string())?;
        self.rt.block_on(hbone_status(
            tokio::net::TcpSocket::from_std_stream(sock.into()),
            hbone,
            config,
            method,
            uri,
        ))
    }
}

/// One request on an HBONE connection to `dst` (a ztunnel's 15008) with `config`; the
/// response status and `baggage` header.
pub async fn hbone_status(
    sock: tokio::net::TcpSocket,
    dst: SocketAddr,
    config: Arc<ambit_tls::rustls::ClientConfig>,
    method: &str,
    uri: &str,
) -> Result<(u16, String), String> {
    let tcp = sock.connect(dst).await.map_err(|e| e.to_string())?;
    let tls = ambit_tls::tokio_rustls::TlsConnector::from(config)
        .connect(ambit_tls::hbone_server_name(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut client, conn) = h2::client::handshake(tls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(())
        .unwrap();
    let (resp, _send) = client.send_request(req, false).map_err(|e| e.to_string())?;
    let resp = resp.await.map_err(|e| e.to_string())?;
    let baggage = resp
        .headers()
        .get("baggage")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    Ok((resp.status().as_u16(), baggage))
}

/// What [`Mesh::write_config_with`] adds to the generated local config.
#[derive(Debug, Default)]
pub struct ConfigExtras<'a> {
    /// Policy keys (`namespace/name`) listed in the `server` record's `authorizationPolicies`.
    pub server_policies: &'a [&'a str],
    /// Raw YAML items appended to the `workloads:` list.
    pub workloads: &'a str,
}

/// The test app in `ns` on `addr`: greets with the peer address it sees, then echoes each
/// line. Served on `rt`.
pub fn spawn_app(rt: &tokio::runtime::Runtime, ns: &Namespace, addr: SocketAddr) {
    let listener = app_factory(ns)
        .new_tcp_listener(addr, &SocketOptions::default())
        .unwrap();
    rt.spawn(async move {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        while let Ok((stream, peer)) = listener.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                if w.write_all(format!("hello {}\n", peer.ip()).as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if w.write_all(format!("{line}\n").as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// Sum of a counter over the series whose label text contains every `needle`.
pub fn counter(metrics: &str, name: &str, needles: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn file_contains(path: &Path, needle: &[u8]) -> bool {
    std::fs::read(path)
        .map(|b| b.windows(needle.len()).any(|w| w == needle))
        .unwrap_or(false)
}
