//! The mesh config of a running `ambit control` (`--mesh-config FILE`), observed through real
//! TLS delta ADS streams and the monitoring port: a `rootNamespace` change makes that
//! namespace's selector-less policies mesh-wide without a restart; a bad version and a
//! `trustDomain` change are refused, counted, and the last good config stays.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/tls_channel.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ambit_control::mesh_config::watch::MeshSource;
use ambit_control::server::{CallerAuth, ControlConfig, ObjectSource};
use ambit_control::translate::ClusterConfig;
use ambit_proto::core::Node;
use ambit_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ambit_proto::prost::{Message, Name};
use ambit_proto::security::{Authorization, Scope};
use ambit_proto::workload;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const DEADLINE: Duration = Duration::from_secs(20);
const NODE_TOKEN: &str = "node-token-0123456789abcdef";

/// A namespace that becomes the root namespace, with a selector-less DENY policy, and a pod.
const MANIFESTS: &str = "apiVersion: v1
kind: Namespace
metadata: {name: mesh-root}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-all, namespace: mesh-root}
spec:
  action: DENY
  rules: [{}]
---
apiVersion: v1
kind: Pod
metadata: {name: app, namespace: apps, uid: uid-app, labels: {app: app}}
spec:
  nodeName: node1
  containers: [{name: c, image: i}]
status: {phase: Running, podIP: 10.0.0.5, podIPs: [{ip: 10.0.0.5}]}
";

struct Control {
    addr: SocketAddr,
    monitoring: SocketAddr,
    root: String,
    mesh_file: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// A free local port for the monitoring listener (its address is not reported back).
fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

impl Control {
    async fn start(mesh: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ambit-meshcfg-")
            .tempdir()
            .unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        std::fs::write(manifests.join("objects.yaml"), MANIFESTS).unwrap();
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(
            &tokens,
            format!("tokens:\n- {{token: {NODE_TOKEN}, node: node1}}\n"),
        )
        .unwrap();
        let mesh_file = dir.path().join("mesh.yaml");
        std::fs::write(&mesh_file, mesh).unwrap();
        let state = dir.path().join("state");
        let monitoring = free_port();
        let cfg = ControlConfig {
            source: ObjectSource::Directory(manifests),
            listen: "127.0.0.1:0".parse().unwrap(),
            state_dir: state.clone(),
            auth: CallerAuth::Tokens(tokens),
            monitoring: Some(monitoring),
            hostnames: vec!["localhost".into()],
            cluster: ClusterConfig::default(),
            mesh_config: MeshSource::File(mesh_file.clone()),
            autoregistration: Default::default(),
        };
        let (bound_tx, bound) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            ambit_control::server::run(cfg, shutdown, Some(bound_tx))
                .await
                .expect("control plane runs");
        });
        let addr = tokio::time::timeout(DEADLINE, bound)
            .await
            .expect("control plane binds in time")
            .expect("bound address");
        let root = std::fs::read_to_string(state.join("root-cert.pem")).unwrap();
        Self {
            addr,
            monitoring,
            root,
            mesh_file,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    /// Replaces the mesh config file (a write to a new file renamed over the old one, as
    /// kubelet updates a mounted ConfigMap).
    fn write_mesh(&self, text: &str) {
        let tmp = self.mesh_file.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.mesh_file).unwrap();
    }

    /// The monitoring port's `/metrics`, as `name → value` for the unlabelled samples.
    async fn metrics(&self) -> BTreeMap<String, u64> {
        let mut tcp = tokio::net::TcpStream::connect(self.monitoring)
            .await
            .unwrap();
        tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        tcp.read_to_string(&mut text).await.unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect()
    }

    /// Polls `/metrics` until `metric` is `value`; panics at the deadline.
    async fn wait_metric(&self, metric: &str, value: u64) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let got = self.metrics().await.get(metric).copied();
            if got == Some(value) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{metric} is {got:?}, not {value}, after {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A node proxy's delta ADS stream for `type_url`.
    async fn stream(&self, type_url: String) -> Stream {
        let (tx, rx) = mpsc::channel(16);
        tx.send(DeltaDiscoveryRequest {
            node: Some(Node {
                id: "ztunnel~10.0.0.1~ztunnel.istio-system~istio-system.svc.cluster.local".into(),
                ..Default::default()
            }),
            type_url,
            ..Default::default()
        })
        .await
        .unwrap();
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {NODE_TOKEN}").parse().unwrap(),
        );
        let channel = support::channel(&self.root, self.addr);
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let responses = tokio::time::timeout(DEADLINE, client.delta_aggregated_resources(request))
            .await
            .expect("stream opens in time")
            .expect("stream accepted")
            .into_inner();
        Stream {
            tx,
            responses,
            resources: BTreeMap::new(),
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DEADLINE, &mut self.task)
            .await
            .expect("control plane stops in time")
            .unwrap();
    }
}

/// One ADS stream and the resources it holds (encoded, by name).
struct Stream {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
    resources: BTreeMap<String, Vec<u8>>,
}

impl Stream {
    /// Applies the next response and ACKs it.
    async fn next(&mut self) {
        let resp = self
            .responses
            .message()
            .await
            .expect("stream")
            .expect("stream open");
        for r in &resp.resources {
            let any = r.resource.as_ref().unwrap();
            self.resources.insert(r.name.clone(), any.value.clone());
        }
        for name in &resp.removed_resources {
            self.resources.remove(name);
        }
        let ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        };
        self.tx.send(ack).await.unwrap();
    }

    fn policy(&self, name: &str) -> Option<Authorization> {
        self.resources
            .values()
            .map(|b| Authorization::decode(b.as_slice()).unwrap())
            .find(|a| a.name == name)
    }

    fn scope(&self, name: &str) -> Option<Scope> {
        self.policy(name).map(|p| p.scope())
    }

    /// Reads responses until the policy `name` has `scope`; panics at the deadline.
    async fn wait_scope(&mut self, name: &str, scope: Scope) {
        let deadline = Instant::now() + DEADLINE;
        while self.scope(name) != Some(scope) {
            if tokio::time::timeout_at(deadline, self.next())
                .await
                .is_err()
            {
                panic!(
                    "timed out after {DEADLINE:?} waiting for {name} to be {scope:?}; it is {:?}",
                    self.scope(name)
                );
            }
        }
    }

    /// Asserts no response arrives within `quiet` (nothing was pushed).
    async fn assert_quiet(&mut self, quiet: Duration, why: &str) {
        if let Ok(resp) = tokio::time::timeout(quiet, self.responses.message()).await {
            panic!("{why}: a push arrived: {resp:?}");
        }
    }
}

#[tokio::test]
async fn mesh_config_changes_apply_without_restart_and_bad_ones_are_refused() {
    let cp = Control::start("# the defaults: root namespace istio-system\n").await;
    let mut policies = cp.stream(Authorization::type_url()).await;
    policies.wait_scope("deny-all", Scope::Namespace).await;
    cp.wait_metric("ambit_control_mesh_config_in_sync", 1).await;

    // mesh-root becomes the root namespace: its selector-less policy is mesh-wide.
    cp.write_mesh(
        "accessLogFile: /dev/stdout\nrootNamespace: mesh-root\ndefaultConfig:\n  proxyMetadata: {A: b}\n",
    );
    policies.wait_scope("deny-all", Scope::Global).await;

    // A bad version and a trust domain change: refused, counted, the last good one stays.
    let refused = [
        ("a bad type", "rootNamespace: 42\n"),
        (
            "a trust domain change",
            "trustDomain: other.example\nrootNamespace: istio-system\n",
        ),
    ];
    for (n, (what, text)) in refused.iter().enumerate() {
        cp.write_mesh(text);
        cp.wait_metric("ambit_control_mesh_config_rejected_total", n as u64 + 1)
            .await;
        let m = cp.metrics().await;
        assert_eq!(
            m.get("ambit_control_mesh_config_in_sync"),
            Some(&0),
            "{what}"
        );
        policies
            .assert_quiet(Duration::from_millis(700), what)
            .await;
        assert_eq!(policies.scope("deny-all"), Some(Scope::Global), "{what}");
    }

    // The workloads keep the trust domain of the start.
    let mut addresses = cp.stream(workload::Address::type_url()).await;
    let deadline = Instant::now() + DEADLINE;
    let pod_trust_domain = loop {
        let found = addresses.resources.values().find_map(|b| {
            match workload::Address::decode(b.as_slice()).unwrap().r#type? {
                workload::address::Type::Workload(w) if w.name == "app" => Some(w.trust_domain),
                _ => None,
            }
        });
        if let Some(td) = found {
            break td;
        }
        tokio::time::timeout_at(deadline, addresses.next())
            .await
            .expect("the pod's workload in time");
    };
    assert_eq!(pod_trust_domain, "cluster.local");

    // A good version again: applied, back in sync.
    cp.write_mesh("rootNamespace: istio-system\n");
    policies.wait_scope("deny-all", Scope::Namespace).await;
    cp.wait_metric("ambit_control_mesh_config_in_sync", 1).await;
    cp.stop().await;
}

#[tokio::test]
async fn a_broken_mesh_config_stops_the_start() {
    let cases = [
        ("rootNamespace: [a]\n", "rootNamespace"),
        ("trustDomain: Bad/Domain\n", "trustDomain"),
        (
            "defaultConfig:\n  proxyMetadata:\n    X: 1\n",
            "defaultConfig.proxyMetadata.X",
        ),
    ];
    for (text, field) in cases {
        let dir = tempfile::Builder::new()
            .prefix("ambit-meshcfg-")
            .tempdir()
            .unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(
            &tokens,
            format!("tokens:\n- {{token: {NODE_TOKEN}, node: n}}\n"),
        )
        .unwrap();
        let mesh = dir.path().join("mesh.yaml");
        std::fs::write(&mesh, text).unwrap();
        let cfg = ControlConfig {
            source: ObjectSource::Directory(manifests),
            listen: "127.0.0.1:0".parse().unwrap(),
            state_dir: dir.path().join("state"),
            auth: CallerAuth::Tokens(tokens),
            monitoring: None,
            hostnames: vec!["localhost".into()],
            cluster: ClusterConfig::default(),
            mesh_config: MeshSource::File(mesh.clone()),
            autoregistration: Default::default(),
        };
        let err = tokio::time::timeout(
            DEADLINE,
            ambit_control::server::run(cfg, std::future::pending(), None),
        )
        .await
        .expect("fails in time")
        .expect_err(text);
        let msg = err.to_string();
        assert!(
            msg.contains(&mesh.display().to_string()) && msg.contains(field),
            "{text:?}: {msg}"
        );
        assert!(
            !dir.path().join("state").exists(),
            "{text:?}: no CA made before the mesh config was read"
        );
    }
}

/// The `istio` ConfigMap on the API server, followed by a watch: absent is the defaults, a
/// good `mesh` key applies, a trust domain change and a ConfigMap without the key are
/// refused (the last good settings stay), a deletion is the defaults again.
#[tokio::test]
async fn the_istio_config_map_is_followed() {
    use ambit_control::mesh_config::watch::MeshWatch;
    use ambit_kubeapi::serde_json::{self, json};
    use ambit_kubeapi::testing::FakeApiServer;

    let server = FakeApiServer::start().await.unwrap();
    server.add_collection("/api/v1/configmaps", "ConfigMap", "v1", true);
    // Another ConfigMap of the namespace is none of the control plane's business.
    server.apply(
        "/api/v1/configmaps",
        json!({"metadata": {"name": "other", "namespace": "istio-system"},
               "data": {"mesh": "rootNamespace: [not, ours]\n"}}),
    );
    let client = ambit_kubeapi::Client::new(server.config()).unwrap();
    let metrics = std::sync::Arc::new(ambit_control::monitoring::Metrics::default());
    let watch = MeshWatch::start(
        MeshSource::ConfigMap {
            namespace: "istio-system".into(),
            name: "istio".into(),
        },
        ClusterConfig::default(),
        Some(client),
        metrics.clone(),
    )
    .await
    .expect("a missing ConfigMap is the defaults");
    assert_eq!(watch.current().root_namespace, "istio-system");

    let config_map = |data: serde_json::Value| json!({"metadata": {"name": "istio", "namespace": "istio-system"}, "data": data});
    let rejected = |m: &ambit_control::monitoring::Metrics| {
        m.render()
            .lines()
            .find_map(|l| l.strip_prefix("ambit_control_mesh_config_rejected_total "))
            .and_then(|v| v.parse::<u64>().ok())
    };
    // (what, the ConfigMap's data or None to delete it, the root namespace then, refusals so far)
    let steps: [(&str, Option<serde_json::Value>, &str, u64); 5] = [
        (
            "a good mesh key",
            Some(
                json!({"mesh": "rootNamespace: mesh-root\ndefaultConfig: {proxyMetadata: {A: b}}\n"}),
            ),
            "mesh-root",
            0,
        ),
        (
            "a trust domain change",
            Some(json!({"mesh": "trustDomain: other.example\nrootNamespace: third\n"})),
            "mesh-root",
            1,
        ),
        (
            "no mesh key",
            Some(json!({"meshNetworks": "networks: {}\n"})),
            "mesh-root",
            2,
        ),
        (
            "the same trust domain, spelled out",
            Some(json!({"mesh": "trustDomain: cluster.local\nrootNamespace: third\n"})),
            "third",
            2,
        ),
        ("deleted", None, "istio-system", 2),
    ];
    for (what, data, root_namespace, refusals) in steps {
        match data {
            Some(data) => {
                server.apply("/api/v1/configmaps", config_map(data));
            }
            None => {
                server.delete("/api/v1/configmaps", "istio-system", "istio");
            }
        }
        let deadline = Instant::now() + DEADLINE;
        loop {
            let got = (watch.current().root_namespace.clone(), rejected(&metrics));
            if got == (root_namespace.to_string(), Some(refusals)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: (root namespace, refusals) is {got:?}, not ({root_namespace}, {refusals})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(watch.current().trust_domain, "cluster.local", "{what}");
    }
    assert!(
        watch.current().proxy_metadata.is_empty(),
        "the deletion cleared the proxyMetadata"
    );
}
