//! WorkloadEntry auto-registration through `ambit control` itself: real TLS, real gRPC delta
//! ADS streams. A VM stream announces its WorkloadGroup in its node metadata; an observer (a
//! node proxy's stream) watches the Address resources every ztunnel gets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/tls_channel.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use ambit_control::autoregister::AutoRegistrationConfig;
use ambit_control::server::{CallerAuth, ControlConfig, ObjectSource};
use ambit_control::translate::ClusterConfig;
use ambit_proto::core::Node;
use ambit_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ambit_proto::prost::{Message, Name};
use ambit_proto::workload::{self, address::Type};
use prost_types::value::Kind;
use prost_types::{Struct, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(20);
const VM_TOKEN: &str = "vm-token-0123456789abcdef";
const OTHER_SA_TOKEN: &str = "other-sa-token-0123456789";
const OTHER_NS_TOKEN: &str = "other-ns-token-0123456789";
const NODE_TOKEN: &str = "node-token-0123456789abcdef";

const MANIFESTS: &str = "apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: vm, namespace: bar}
spec:
  metadata:
    labels: {app: foo}
  template:
    serviceAccount: vm-sa
---
apiVersion: v1
kind: Service
metadata: {name: foo, namespace: bar}
spec:
  selector: {app: foo}
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
";

struct Control {
    addr: SocketAddr,
    root: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Control {
    async fn start(grace: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        std::fs::write(manifests.join("vm.yaml"), MANIFESTS).unwrap();
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(
            &tokens,
            format!(
                "tokens:\n\
                 - {{token: {VM_TOKEN}, identity: spiffe://cluster.local/ns/bar/sa/vm-sa}}\n\
                 - {{token: {OTHER_SA_TOKEN}, identity: spiffe://cluster.local/ns/bar/sa/other}}\n\
                 - {{token: {OTHER_NS_TOKEN}, identity: spiffe://cluster.local/ns/baz/sa/vm-sa}}\n\
                 - {{token: {NODE_TOKEN}, node: node1}}\n"
            ),
        )
        .unwrap();
        let state = dir.path().join("state");
        let cfg = ControlConfig {
            source: ObjectSource::Directory(manifests),
            listen: "127.0.0.1:0".parse().unwrap(),
            state_dir: state.clone(),
            auth: CallerAuth::Tokens(tokens),
            monitoring: None,
            hostnames: vec!["localhost".into()],
            cluster: ClusterConfig::default(),
            mesh_config: ambit_control::mesh_config::watch::MeshSource::None,
            autoregistration: AutoRegistrationConfig {
                grace_period: grace,
                ..Default::default()
            },
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
            root,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    fn channel(&self) -> Channel {
        support::channel(&self.root, self.addr)
    }

    /// Opens a delta ADS stream for Address resources with `token` and `node`.
    async fn stream(&self, token: &str, node: Node) -> Stream {
        let (tx, rx) = mpsc::channel(16);
        tx.send(DeltaDiscoveryRequest {
            node: Some(node),
            type_url: workload::Address::type_url(),
            ..Default::default()
        })
        .await
        .unwrap();
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let mut client = AggregatedDiscoveryServiceClient::new(self.channel());
        let responses = tokio::time::timeout(DEADLINE, client.delta_aggregated_resources(request))
            .await
            .expect("stream opens in time")
            .expect("stream accepted")
            .into_inner();
        Stream {
            tx,
            responses,
            addresses: BTreeMap::new(),
            removed: Vec::new(),
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

/// One ADS stream and what it has been told.
struct Stream {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
    addresses: BTreeMap<String, workload::Address>,
    /// Every removal seen, in order.
    removed: Vec<String>,
}

impl Stream {
    /// Applies the next response and ACKs it.
    async fn next(&mut self) -> Result<(), tonic::Status> {
        let resp = self
            .responses
            .message()
            .await?
            .ok_or_else(|| tonic::Status::aborted("stream ended"))?;
        for r in &resp.resources {
            let any = r.resource.as_ref().unwrap();
            let address = workload::Address::decode(any.value.as_slice()).unwrap();
            self.addresses.insert(r.name.clone(), address);
        }
        for name in &resp.removed_resources {
            self.addresses.remove(name);
            self.removed.push(name.clone());
        }
        let ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        };
        self.tx
            .send(ack)
            .await
            .map_err(|_| tonic::Status::aborted("request stream closed"))
    }

    /// Reads responses until `pred` holds; panics at the deadline.
    async fn wait_for(&mut self, what: &str, pred: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        while !pred(self) {
            match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(Ok(())) => {}
                Ok(Err(status)) => panic!("waiting for {what}: stream failed: {status}"),
                Err(_) => panic!(
                    "timed out after {DEADLINE:?} waiting for {what}; have {:?}",
                    self.addresses.keys().collect::<Vec<_>>()
                ),
            }
        }
    }

    fn workload(&self, uid: &str) -> Option<&workload::Workload> {
        match self.addresses.get(uid)?.r#type.as_ref()? {
            Type::Workload(w) => Some(w),
            Type::Service(_) => None,
        }
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

/// The node a VM's ztunnel sends (as `ambit vm up` configures it).
fn vm_node(ip: &str, group: &str) -> Node {
    let labels = Struct {
        fields: [
            ("service.istio.io/canonical-name", "foo-vm"),
            ("service.istio.io/canonical-revision", "v7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), string(v)))
        .collect(),
    };
    let mut fields: BTreeMap<String, Value> = [
        ("AUTO_REGISTER_GROUP", group),
        ("NAMESPACE", "bar"),
        ("NAME", "vm"),
        ("INSTANCE_IPS", ip),
        ("CLUSTER_ID", "Kubernetes"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), string(v)))
    .collect();
    fields.insert(
        "LABELS".into(),
        Value {
            kind: Some(Kind::StructValue(labels)),
        },
    );
    Node {
        id: format!("ztunnel~{ip}~vm.bar~bar.svc.cluster.local"),
        metadata: Some(Struct { fields }),
        ..Default::default()
    }
}

fn observer_node() -> Node {
    Node {
        id: "ztunnel~10.0.0.1~ztunnel.istio-system~istio-system.svc.cluster.local".into(),
        ..Default::default()
    }
}

fn uid(ip: &str) -> String {
    format!("Kubernetes/networking.istio.io/WorkloadEntry/bar/vm-{ip}")
}

const SERVICE: &str = "bar/foo.bar.svc.cluster.local";

#[tokio::test]
async fn a_connecting_vm_is_served_and_removed_after_the_grace_period() {
    let grace = Duration::from_millis(800);
    let cp = Control::start(grace).await;
    let mut observer = cp.stream(NODE_TOKEN, observer_node()).await;
    observer
        .wait_for("the Service", |s| s.addresses.contains_key(SERVICE))
        .await;

    let mut vm = cp.stream(VM_TOKEN, vm_node("10.1.0.5", "vm")).await;
    let id = uid("10.1.0.5");
    observer
        .wait_for("the VM's workload", |s| s.workload(&id).is_some())
        .await;
    let w = observer.workload(&id).unwrap();
    assert_eq!(w.addresses, vec![vec![10, 1, 0, 5]], "INSTANCE_IPS");
    assert_eq!(
        (
            w.trust_domain.as_str(),
            w.namespace.as_str(),
            w.service_account.as_str()
        ),
        ("cluster.local", "bar", "vm-sa"),
        "the VM's identity"
    );
    assert_eq!(
        (w.canonical_name.as_str(), w.canonical_revision.as_str()),
        ("foo-vm", "v7"),
        "labels from the node's LABELS"
    );
    assert_eq!(w.workload_name, "vm", "the group names the workload");
    assert_eq!(
        w.tunnel_protocol,
        workload::TunnelProtocol::Hbone as i32,
        "a VM running ztunnel takes HBONE"
    );
    let ports = w
        .services
        .get(SERVICE)
        .expect("selected by the group's label app=foo");
    assert_eq!(
        ports
            .ports
            .iter()
            .map(|p| (p.service_port, p.target_port))
            .collect::<Vec<_>>(),
        [(80, 8080)]
    );
    // The VM's own stream gets its workload too.
    vm.wait_for("its own workload", |s| s.workload(&id).is_some())
        .await;

    drop(vm);
    let gone_from = Instant::now();
    observer
        .wait_for("the VM's removal", |s| s.workload(&id).is_none())
        .await;
    let after = gone_from.elapsed();
    assert!(
        after >= grace,
        "removed {after:?} after the disconnect, before the {grace:?} grace period"
    );
    assert!(
        observer.addresses.contains_key(SERVICE),
        "the Service stays"
    );
    cp.stop().await;
}

#[tokio::test]
async fn a_reconnect_within_the_grace_period_keeps_the_entry() {
    let grace = Duration::from_secs(2);
    let cp = Control::start(grace).await;
    let mut observer = cp.stream(NODE_TOKEN, observer_node()).await;
    let id = uid("10.1.0.6");
    let vm = cp.stream(VM_TOKEN, vm_node("10.1.0.6", "vm")).await;
    observer
        .wait_for("the VM's workload", |s| s.workload(&id).is_some())
        .await;
    drop(vm);
    let disconnected = Instant::now();
    let mut vm = cp.stream(VM_TOKEN, vm_node("10.1.0.6", "vm")).await;
    vm.wait_for("its own workload again", |s| s.workload(&id).is_some())
        .await;
    // The removal would come `grace` after the disconnect: watch the observer until well
    // past that point in time; nothing may be removed.
    let past = disconnected + grace * 2;
    while Instant::now() < past {
        match tokio::time::timeout_at(past, observer.next()).await {
            Ok(r) => r.expect("observer stream"),
            Err(_) => break,
        }
    }
    assert!(
        observer.removed.is_empty(),
        "removed although the VM came back within the grace period: {:?}",
        observer.removed
    );
    assert!(observer.workload(&id).is_some());
    drop(vm);
    observer
        .wait_for("the removal after the second disconnect", |s| {
            s.workload(&id).is_none()
        })
        .await;
    cp.stop().await;
}

#[tokio::test]
async fn a_stream_that_may_not_register_is_refused_and_registers_nothing() {
    let cp = Control::start(Duration::from_secs(10)).await;
    let mut observer = cp.stream(NODE_TOKEN, observer_node()).await;
    let cases: &[(&str, &str, &str, tonic::Code)] = &[
        (
            "wrong service account",
            OTHER_SA_TOKEN,
            "10.1.0.7",
            tonic::Code::PermissionDenied,
        ),
        (
            "wrong namespace",
            OTHER_NS_TOKEN,
            "10.1.0.8",
            tonic::Code::PermissionDenied,
        ),
        (
            "a node proxy's token",
            NODE_TOKEN,
            "10.1.0.9",
            tonic::Code::PermissionDenied,
        ),
    ];
    for (what, token, ip, code) in cases {
        let mut refused = cp.stream(token, vm_node(ip, "vm")).await;
        let status = tokio::time::timeout(DEADLINE, refused.next())
            .await
            .expect("answered in time")
            .expect_err(what);
        assert_eq!(status.code(), *code, "{what}: {status}");
        assert!(
            status.message().contains("auto-registration refused"),
            "{what}: {status}"
        );
    }
    let mut missing = cp.stream(VM_TOKEN, vm_node("10.1.0.10", "nope")).await;
    let status = missing
        .next()
        .await
        .expect_err("a missing group is refused");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status}");

    // A VM that may register, after the refused ones: once it is served, the refused ones
    // would have been too (registration happens in order, before any answer).
    let _vm = cp.stream(VM_TOKEN, vm_node("10.1.0.11", "vm")).await;
    let id = uid("10.1.0.11");
    observer
        .wait_for("the allowed VM", |s| s.workload(&id).is_some())
        .await;
    let entries: Vec<&String> = observer
        .addresses
        .keys()
        .filter(|k| k.contains("WorkloadEntry"))
        .collect();
    assert_eq!(entries, [&id], "only the allowed VM is registered");
    cp.stop().await;
}
