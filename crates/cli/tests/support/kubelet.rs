//! A small Kubernetes for tests: the fake API server (real JSON over TLS, inside the
//! topology's bridge namespace where nodes and pods reach it), nodes with an operating system
//! of their own ([`node::NodeHost`]), a container runtime with the real CNI path
//! ([`cni`]: loopback, then the node's network list with the machine's `ptp`/`host-local`
//! as the primary network) and a kubelet ([`pod`]) that runs pod specs from the image
//! `scripts/image --rootfs` assembles. Controllers are reduced to what the manifests need: a
//! DaemonSet gets one pod per node its node selector matches, a Deployment its replicas on
//! the first node; a Service's name resolves (hosts files, the test's cluster DNS) to the
//! first running pod it selects, in place of kube-proxy.
//!
//! Not modelled: RBAC (the fake API server answers every request; `kubernetes_rbac.rs`
//! compares the requests with the manifests' rules), the scheduler's other predicates,
//! probes other than `httpGet` readiness, restarts.

#![allow(dead_code)]

#[path = "kubelet/cni.rs"]
pub mod cni;
#[path = "kubelet/node.rs"]
pub mod node;
#[path = "kubelet/pod.rs"]
pub mod pod;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use ambit_kubeapi::testing::{FakeApiServer, TokenIdentity};
use ambit_netns::{NetnsFd, NetnsSocketFactory, SocketFactory, SocketOptions};
use ambit_testkit::eventually_blocking_explained;
use ambit_topology::Topology;
use serde_json::{Value, json};

use node::NodeHost;
use pod::{ContainerRun, Image, PodContext};

pub const PODS: &str = "/api/v1/pods";
/// How long the kubelet retries a pod sandbox whose CNI ADD failed, and how often.
const SANDBOX_RETRY: Duration = Duration::from_secs(20);
const SANDBOX_BACKOFF: Duration = Duration::from_millis(500);
/// The audience of tokens without one (the API server's own).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// The API collection of a kind, for the kinds the test cluster serves.
pub fn collection(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "Namespace" => "/api/v1/namespaces",
        "Node" => "/api/v1/nodes",
        "ServiceAccount" => "/api/v1/serviceaccounts",
        "ConfigMap" => "/api/v1/configmaps",
        "Secret" => "/api/v1/secrets",
        "Service" => "/api/v1/services",
        "Pod" => PODS,
        "DaemonSet" => "/apis/apps/v1/daemonsets",
        "Deployment" => "/apis/apps/v1/deployments",
        "AuthorizationPolicy" => "/apis/security.istio.io/v1/authorizationpolicies",
        "PeerAuthentication" => "/apis/security.istio.io/v1/peerauthentications",
        _ => return None,
    })
}

/// A pod the kubelet runs.
pub struct PodRun {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Index into [`Cluster::nodes`].
    pub node: usize,
    pub ip: Ipv4Addr,
    pub netns: NetnsFd,
    /// `DaemonSet/NAME` or `Deployment/NAME` of the controller that made it.
    pub owner: Option<String>,
    /// The pod object as the kubelet last stored it.
    pub object: Value,
    pub containers: Vec<ContainerRun>,
}

/// The test cluster; everything goes when it drops (containers, nodes, the API server, the
/// namespaces, the files).
pub struct Cluster {
    pub pods: Vec<PodRun>,
    pub nodes: Vec<NodeHost>,
    pub api: FakeApiServer,
    pub rt: tokio::runtime::Runtime,
    pub topo: Topology,
    pub image: Image,
    pub api_addr: SocketAddr,
    pub api_ca: String,
    /// Cluster DNS: names → the pod that answers for them.
    dns: BTreeMap<String, Ipv4Addr>,
    next_service_ip: u8,
    next_token: u32,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Two nodes (`node1`, `node2`), each with the primary CNI installed, and the API server
    /// holding them.
    pub fn start(image: &Image) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let topo = Topology::builder()
            .node("node1")
            .node("node2")
            .build()
            .expect("topology");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let api_ip = topo.addressing().bridge_ip();
        let api_addr = SocketAddr::from((api_ip, 443));
        let cluster_ca = ambit_tls::LocalCa::generate("cluster.local").expect("cluster CA");
        let cert = cluster_ca
            .server_cert_for_hostnames(&[
                &api_ip.to_string(),
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ])
            .expect("API server certificate");
        let listener = topo
            .bridge()
            .socket_factory(None)
            .expect("bridge factory")
            .new_tcp_listener(api_addr, &SocketOptions::default())
            .expect("API server listener");
        let api = rt
            .block_on(FakeApiServer::start_tls_on(listener, &cert))
            .expect("fake API server");
        for (path, kind, version) in [
            ("/api/v1/configmaps", "ConfigMap", "v1"),
            ("/api/v1/secrets", "Secret", "v1"),
            ("/api/v1/serviceaccounts", "ServiceAccount", "v1"),
            ("/apis/apps/v1/deployments", "Deployment", "apps/v1"),
        ] {
            api.add_collection(path, kind, version, true);
        }
        let mut nodes = Vec::new();
        for n in topo.nodes() {
            let host = NodeHost::boot(n, &dir.path().join("nodes").join(n.name()), &image.rootfs);
            for plugin in cni::PRIMARY_PLUGINS {
                let to = host.path(cni::CNI_BIN).join(plugin);
                std::fs::copy(Path::new(cni::PRIMARY_PLUGIN_DIR).join(plugin), &to)
                    .unwrap_or_else(|e| panic!("installing the primary CNI plugin {plugin}: {e}"));
            }
            let conflist = cni::primary_conflist(&host.pod_cidr);
            std::fs::write(
                host.path(cni::CNI_CONF).join("10-kindnet.conflist"),
                serde_json::to_vec_pretty(&conflist).expect("json"),
            )
            .expect("primary conflist");
            api.apply(
                "/api/v1/nodes",
                json!({
                    "metadata": {"name": n.name(), "labels": {
                        "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                        "kubernetes.io/hostname": n.name()}},
                    "status": {"addresses": [{"type": "InternalIP", "address": n.ip().to_string()}],
                               "allocatable": {"cpu": "2", "memory": "4Gi"}}
                }),
            );
            nodes.push(host);
        }
        Cluster {
            pods: Vec::new(),
            nodes,
            api,
            rt,
            topo,
            image: image.clone(),
            api_addr,
            api_ca: cluster_ca.root_pem().to_string(),
            dns: BTreeMap::new(),
            next_service_ip: 10,
            next_token: 0,
            dir,
        }
    }

    pub fn node(&self, name: &str) -> &NodeHost {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Stores objects of the kinds the cluster serves (others, e.g. RBAC and monitoring, are
    /// skipped); Services get a cluster IP.
    pub fn apply(&mut self, objects: &[Value]) {
        for o in objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            let Some(path) = collection(kind) else {
                continue;
            };
            let mut o = o.clone();
            if kind == "Service" && o["spec"]["clusterIP"].is_null() {
                o["spec"]["clusterIP"] = json!(format!("10.96.0.{}", self.next_service_ip));
                self.next_service_ip += 1;
            }
            self.api.apply(path, o);
        }
    }

    /// The pods a controller makes: one per matching node for a DaemonSet, `replicas` on the
    /// first node for a Deployment.
    pub fn schedule(&self, kind: &str, namespace: &str, name: &str) -> Vec<(usize, Value)> {
        let path = collection(kind).expect("controller kind");
        let owner = self
            .api
            .object(path, namespace, name)
            .unwrap_or_else(|| panic!("{kind} {namespace}/{name} is not in the API server"));
        let template = &owner["spec"]["template"];
        let selector = template["spec"]["nodeSelector"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let matches = |node: &NodeHost| {
            let labels = self
                .api
                .object("/api/v1/nodes", "", &node.name)
                .map(|n| n["metadata"]["labels"].clone())
                .unwrap_or_default();
            selector.iter().all(|(k, v)| &labels[k] == v)
        };
        let placements: Vec<(usize, String)> = match kind {
            "DaemonSet" => self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| matches(n))
                .map(|(i, n)| (i, format!("{name}-{}", n.name)))
                .collect(),
            _ => (0..owner["spec"]["replicas"].as_u64().unwrap_or(1))
                .map(|r| (0, format!("{name}-{r}")))
                .collect(),
        };
        placements
            .into_iter()
            .map(|(node, pod_name)| {
                let mut spec = template["spec"].clone();
                spec["nodeName"] = json!(self.nodes[node].name);
                if spec["serviceAccountName"].is_null() {
                    spec["serviceAccountName"] = json!("default");
                }
                let pod = json!({
                    "metadata": {
                        "name": pod_name, "namespace": namespace,
                        "uid": format!("uid-{namespace}-{pod_name}"),
                        "labels": template["metadata"]["labels"],
                        "annotations": template["metadata"]["annotations"],
                        "ownerReferences": [{"kind": kind, "name": name, "controller": true}],
                    },
                    "spec": spec,
                    "status": {"phase": "Pending"},
                });
                (node, pod)
            })
            .collect()
    }

    /// A token of `namespace/account` bound to a pod, registered for TokenReview.
    fn token(&mut self, pod: &Value, audience: Option<&str>) -> String {
        self.next_token += 1;
        let token = format!(
            "token-{}-{}",
            self.next_token,
            pod["metadata"]["uid"].as_str().unwrap_or("")
        );
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let sa = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default");
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        self.api.add_token(
            &token,
            TokenIdentity::pod_bound(
                ns,
                sa,
                (name, uid),
                node,
                &[audience.unwrap_or(API_AUDIENCE)],
            ),
        );
        token
    }

    fn hosts_file(&self, ip: Ipv4Addr, name: &str) -> String {
        let mut out = format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n{ip}\t{name}\n");
        for (host, addr) in &self.dns {
            out.push_str(&format!("{addr}\t{host}\n"));
        }
        out
    }

    /// Runs a pod on `node`: stored Pending, sandbox through CNI, status, volumes,
    /// containers. `Err` when the sandbox's CNI ADD fails (nothing else is started).
    pub fn run_pod(&mut self, node: usize, pod: Value) -> Result<usize, String> {
        let stored = self.api.apply(PODS, pod);
        let ns = stored["metadata"]["namespace"]
            .as_str()
            .expect("ns")
            .to_string();
        let name = stored["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let uid = stored["metadata"]["uid"].as_str().expect("uid").to_string();
        let host = &self.nodes[node];
        let netns_name = format!("cni-{uid}");
        let netns = host.create_netns(&netns_name);
        // As containerd and CRI-O pass it.
        let netns_path = format!("/var/run/netns/{netns_name}");
        let container_id = uid.replace('-', "");
        let pod_ref = cni::PodRef {
            namespace: &ns,
            name: &name,
            uid: &uid,
            container_id: &container_id,
            netns: &netns_path,
        };
        // A failed sandbox is cleaned up (DEL) and retried, as the kubelet's pod sync does:
        // the CNI agent may not have seen the pod's watch event yet on a loaded machine.
        let deadline = Instant::now() + SANDBOX_RETRY;
        let ip = loop {
            match cni::add(host, &pod_ref) {
                Ok((ip, _)) => break ip,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("kubelet: sandbox of {ns}/{name} failed, retrying: {e}");
                    cni::del(host, &pod_ref)?;
                    std::thread::sleep(SANDBOX_BACKOFF);
                }
                Err(e) => return Err(e),
            }
        };
        let host_ip = host.ip.to_string();
        let object = self
            .api
            .modify(PODS, &ns, &name, |o| {
                o["status"] = json!({
                    "phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
                    "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
                });
            })
            .expect("pod stored");
        // Tokens first: the context borrows the cluster.
        let mut tokens: BTreeMap<Option<String>, String> = BTreeMap::new();
        let projected: Vec<Option<String>> = object["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|v| {
                v["projected"]["sources"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|s| s.get("serviceAccountToken").cloned())
            .map(|t| t["audience"].as_str().map(str::to_string))
            .chain([None])
            .collect();
        for aud in projected {
            let t = self.token(&object, aud.as_deref());
            tokens.insert(aud, t);
        }
        let services: Vec<Value> = self
            .api
            .objects("/api/v1/services")
            .into_iter()
            .filter(|s| s["metadata"]["namespace"] == ns)
            .collect();
        let api = &self.api;
        let lookup = |c: &str, n: &str, o: &str| api.object(c, n, o);
        let token = |_sa: &str, aud: Option<&str>| {
            tokens
                .get(&aud.map(str::to_string))
                .cloned()
                .expect("token prepared")
        };
        let hosts = self.hosts_file(ip, &name);
        let containers = {
            let ctx = PodContext {
                node: &self.nodes[node],
                image: &self.image,
                pod: &object,
                lookup: &lookup,
                services,
                api: (
                    self.api_addr.ip().to_string(),
                    self.api_addr.port(),
                    self.api_ca.clone(),
                ),
                token: &token,
                allocatable: (2, 4 << 30),
            };
            let volumes = pod::volumes(&ctx);
            object["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| pod::start_container(&ctx, &netns, c, &volumes, &hosts))
                .collect()
        };
        let owner = object["metadata"]["ownerReferences"][0]
            .as_object()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or(""),
                    o["name"].as_str().unwrap_or("")
                )
            });
        // Services selecting this pod now resolve to it.
        let labels = object["metadata"]["labels"].clone();
        for svc in self.api.objects("/api/v1/services") {
            let selector = svc["spec"]["selector"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let selects = !selector.is_empty()
                && svc["metadata"]["namespace"] == ns
                && selector.iter().all(|(k, v)| &labels[k] == v);
            if selects {
                let svc_name = svc["metadata"]["name"].as_str().unwrap_or_default();
                for host in [
                    format!("{svc_name}.{ns}.svc"),
                    format!("{svc_name}.{ns}.svc.cluster.local"),
                ] {
                    self.dns.entry(host).or_insert(ip);
                }
            }
        }
        self.pods.push(PodRun {
            namespace: ns,
            name,
            uid,
            node,
            ip,
            netns,
            owner,
            object,
            containers,
        });
        Ok(self.pods.len() - 1)
    }

    /// Runs every pod of a controller and waits until each is ready (its containers'
    /// `httpGet` readiness probes answer 2xx/3xx from the node, as the kubelet probes).
    pub fn run_controller(&mut self, kind: &str, namespace: &str, name: &str) -> Vec<usize> {
        let mut started = Vec::new();
        for (node, pod) in self.schedule(kind, namespace, name) {
            let i = self
                .run_pod(node, pod)
                .unwrap_or_else(|e| panic!("{kind} {name}: {e}\n{}", self.logs()));
            started.push(i);
        }
        for &i in &started {
            self.wait_ready(i);
        }
        started
    }

    /// Waits for a pod's readiness probes.
    pub fn wait_ready(&self, i: usize) {
        let pod = &self.pods[i];
        let node = self.nodes[pod.node].netns();
        for c in pod.object["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let probe = &c["readinessProbe"]["httpGet"];
            let Some(port) = probe["port"].as_u64().and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let path = probe["path"].as_str().unwrap_or("/");
            let addr = SocketAddr::from((pod.ip, port));
            eventually_blocking_explained(
                &format!("{}/{} ready ({path} on {port})", pod.namespace, pod.name),
                Duration::from_secs(60),
                || self.logs(),
                || {
                    self.assert_running(i);
                    http_get(node, addr, path).filter(|(s, _)| (200..400).contains(s))
                },
            );
        }
    }

    /// Panics (with the logs) when a container of pod `i` exited.
    fn assert_running(&self, i: usize) {
        for c in &self.pods[i].containers {
            // Never reaped before the pod is terminated: an exited container is a zombie.
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", c.child.id())).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if state.is_none_or(|s| s == 'Z') {
                panic!(
                    "container {} of {}/{} exited:\n{}",
                    c.name,
                    self.pods[i].namespace,
                    self.pods[i].name,
                    c.log_text()
                );
            }
        }
    }

    /// Deletes a controller and terminates its pods as the kubelet does (SIGTERM, then
    /// SIGKILL after the grace period); their exit statuses.
    pub fn delete_controller(
        &mut self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Vec<(String, ExitStatus)> {
        self.api
            .delete(collection(kind).expect("kind"), namespace, name)
            .unwrap_or_else(|| panic!("{kind} {namespace}/{name} not found"));
        let owner = format!("{kind}/{name}");
        let mut out = Vec::new();
        let mut keep = Vec::new();
        for mut pod in std::mem::take(&mut self.pods) {
            if pod.owner.as_deref() != Some(owner.as_str()) {
                keep.push(pod);
                continue;
            }
            let grace = Duration::from_secs(
                pod.object["spec"]["terminationGracePeriodSeconds"]
                    .as_u64()
                    .unwrap_or(30),
            );
            for c in &mut pod.containers {
                // A little slack over the grace period for a loaded machine.
                let status = c.terminate(grace + Duration::from_secs(5));
                out.push((format!("{}/{}", pod.name, c.name), status));
            }
            self.api.delete(PODS, &pod.namespace, &pod.name);
        }
        self.pods = keep;
        out
    }

    /// Every container's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for p in &self.pods {
            for c in &p.containers {
                let text = c.log_text();
                let tail: Vec<&str> = text.lines().rev().take(60).collect();
                out.push_str(&format!("--- {}/{} {}\n", p.namespace, p.name, c.name));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
    }

    pub fn pod(&self, namespace: &str, name: &str) -> &PodRun {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
            .unwrap_or_else(|| panic!("no pod {namespace}/{name}"))
    }

    /// A TCP echo app in pod `i`'s network namespace on `port`: it greets with
    /// `hello CLIENT-IP` and echoes each line.
    pub fn serve_echo(&self, i: usize, port: u16) {
        let listener = NetnsSocketFactory::new(self.pods[i].netns.try_clone().expect("dup"), None)
            .new_tcp_listener(
                SocketAddr::from(([0, 0, 0, 0], port)),
                &SocketOptions::default(),
            )
            .expect("app listener");
        self.rt.spawn(async move {
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
            listener.set_nonblocking(true).expect("nonblocking");
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
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
}

/// Connects from inside `netns` (as an application there: no mark, so it is captured).
pub fn connect_from(netns: &NetnsFd, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let sock = NetnsSocketFactory::new(netns.try_clone().map_err(std::io::Error::other)?, None)
        .new_tcp_stream_socket(addr, None, &SocketOptions::default())
        .map_err(std::io::Error::other)?;
    sock.set_nonblocking(false)?;
    sock.connect_timeout(&addr.into(), Duration::from_secs(5))?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// `GET path` over HTTP/1.0 from inside `netns`; (status, body).
pub fn http_get(netns: &NetnsFd, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = connect_from(netns, addr).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let status = resp.split_whitespace().nth(1)?.parse().ok()?;
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Sends a line and reads the greeting and the echo.
pub fn exchange(s: &mut TcpStream, line: &str) -> std::io::Result<String> {
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    let mut newlines = 0;
    while newlines < 2 {
        if s.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed",
            ));
        }
        out.push(byte[0]);
        newlines += usize::from(byte[0] == b'\n');
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The sum of a Prometheus counter's samples whose labels contain every needle.
pub fn counter(metrics: &str, name: &str, needles: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
